"""The store and the engine on SQLite and PostgreSQL: the queue, claims, leases, fences, handoffs,
migrations."""
