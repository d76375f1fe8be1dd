"""floom's parts against real ones: both stores, bubblewrap, the E2B and model stand-ins, the
engine."""
