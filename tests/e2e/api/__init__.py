"""The REST API of a live server."""
