"""Triggers of workers: kept in step with the active version (registry.py), schedule fires, webhook
deliveries and Composio events."""
