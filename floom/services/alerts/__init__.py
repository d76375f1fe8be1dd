"""Alerts and run callbacks: channels, rules, the watch that sees what went wrong (and what
recovered), incidents that group it, and the durable deliveries that carry it out."""
