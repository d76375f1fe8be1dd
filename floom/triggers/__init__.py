"""Triggers: cron schedules, signed webhooks and Composio events that start runs."""
