"""Rules, parsers and pure functions: no server, database or sandbox (`./dev test unit` runs these
in seconds)."""
