"""The floom command's groups, one module each, loaded on demand by the index
(floom/cli/index.py)."""
