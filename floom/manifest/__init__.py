"""worker.yml: its schema (schema.py), reading it (load.py), the checks of its sections (checks.py,
agent.py, replay.py, triggers.py) and of run values against the fields it declares (fields.py)."""
