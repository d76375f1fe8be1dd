"""What an MCP tool calls: the interface (base.py), floom's services inside the server (local.py)
and a server's REST API for `floom mcp` (rest.py)."""
