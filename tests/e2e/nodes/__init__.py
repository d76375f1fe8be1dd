"""Nodes as processes: clusters, restarts, shutdown, compose, operations."""
