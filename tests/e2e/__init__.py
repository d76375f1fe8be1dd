"""floom as its users meet it: servers on loopback, the CLI, MCP clients, the browser, nodes as
processes."""
