"""MCP clients over stdio and HTTP, and what each surface tells its user."""
