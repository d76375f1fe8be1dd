"""Runs: creating, reading and cancelling them (lifecycle.py), the state machine (rules.py over
statuses.py), waiting for their end, their records, logs, lineage, approvals and agent records, and
the secrets scan of their artifacts."""
