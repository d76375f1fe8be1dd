"""floom: a self-hosted runtime for background AI workers."""

__version__ = "0.1.0"
