"""floom's MCP server: one set of tools served over stdio (`floom mcp`) and Streamable HTTP
(`/mcp` on the floom server)."""
