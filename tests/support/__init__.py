"""What tests share: a live server and its waits (harness.py), worker rigs, MCP clients, sandboxes,
databases, ports and the nodes tests start as processes."""
