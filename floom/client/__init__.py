"""The REST client the CLI and the stdio MCP server use: rest.py (httpx), lite.py (the standard
library only, for the CLI's hot path), wire.py (what every client says and reads) and handoffs.py
(the handoff layer's calls). Where a client finds its server is floom/client_env.py, which the
server's settings read too."""
