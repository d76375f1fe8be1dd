"""The local backend: a script worker under bubblewrap on this host, with its namespaces, cgroups,
seccomp filter, network, disk, host uid, launchers started ahead and the supervisor that watches
it."""
