"""A node's background threads beside the run pipeline: its presence (and the C heap), the
scheduler, housekeeping and the handoff loop."""
