"""The agent loop against the model provider's stand-in."""
