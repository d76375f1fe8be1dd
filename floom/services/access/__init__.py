"""Who may do what: API keys, the caller (principal.py), secrets, browser sessions, the audit trail
and the cache of recently authenticated keys."""
