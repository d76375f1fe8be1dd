"""What tests share. Here: a live server and its waits (harness.py), the surfaces' clients
(cli, web, mcp_clients, openapi), hints, ports and the leaked-process guard. processes/: what
tests start as processes (servers, nodes, databases, the S3 server, compose, proxies, network
namespaces). rigs/: domain rigs (agents and the model stand-in, E2B, sandboxes, warm pools,
seeded alerts, handoffs, queues and state)."""
