"""Loopback ports for the servers that tests start, stop and start again.

A port from the kernel (`bind(("127.0.0.1", 0))`, then close) is free only at that moment:
a subprocess server takes a second or more to bind it, and in that window the other xdist
worker could be handed the same port and start its own server there. The test then talks to
the wrong server (CI saw a fresh `floom serve` answer 401 to its own bootstrap key). So each
xdist worker takes ports from a range of its own, below the kernel's ephemeral range
(32768-60999 here, which neither `bind(0)` nor outgoing connections leave), in turn, and
skips a port something else holds.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import socket

FIRST_PORT = 12_000
PORTS_PER_WORKER = 4_000
WORKER_RANGES = 5  # 12000-31999: below the ephemeral range


def _worker_index() -> int:
    """0 for `gw0` (and without xdist), 1 for `gw1`, ..."""
    found = re.search(r"\d+", os.environ.get("PYTEST_XDIST_WORKER", ""))
    return int(found.group()) % WORKER_RANGES if found else 0


_FIRST = FIRST_PORT + _worker_index() * PORTS_PER_WORKER
# A random start, so that a subprocess of a worker that also asks for ports does not walk
# the same sequence as its parent.
_turn = itertools.count(random.randrange(PORTS_PER_WORKER))


def free_port() -> int:
    """A loopback port nothing holds now, that no other test process is handed, and that
    this process is not handed again for the next few thousand calls."""
    for _ in range(PORTS_PER_WORKER):
        port = _FIRST + next(_turn) % PORTS_PER_WORKER
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free loopback port in {_FIRST}-{_FIRST + PORTS_PER_WORKER - 1}")
