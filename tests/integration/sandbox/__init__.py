"""The sandbox contract and its backends: bubblewrap, E2B through its wire stand-in, the network
fence, the lease watchdog."""
