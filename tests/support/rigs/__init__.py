"""Domain rigs: agent and model stand-ins, E2B wiring, sandboxes, warm pools, and seeded
alerts, handoffs, queues and state."""
