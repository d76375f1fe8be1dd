"""The public shapes of floom's answers: one typed model per entity, and the builders that
fill them from the services. The REST routes, the `/mcp` backend and the OpenAPI document
all use these, so a body is defined once; nothing here imports FastAPI."""
