"""The public shapes of floom's answers: one typed model per entity, each built from its store
row by its `of` classmethod (floom/views fills them from the services for a caller). The REST
routes, the `/mcp` backend, the client and the OpenAPI document all use these, so a body is
defined once; nothing here imports FastAPI."""
