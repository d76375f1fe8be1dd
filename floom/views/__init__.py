"""The answers of floom's surfaces, filled from the services: each builder reads what the
caller may see and returns a public model of floom/schemas (which knows rows, not services).
The REST routes, the `/mcp` backend and the web UI use these, so a body is assembled once."""
