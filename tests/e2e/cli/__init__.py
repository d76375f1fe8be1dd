"""The floom command against a live server."""
