"""floom's MCP tools, written once against the Backend interface; both transports serve them."""
