"""Connections floom makes on a worker's behalf: the egress guard (egress.py) and the addresses of
this host (addresses.py), which the sandbox's network fence reads too."""
