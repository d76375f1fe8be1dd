"""The web UI's server-rendered pages (templates in web/), loaded by floom/api/ui_mount.py at the
first page asked for."""
