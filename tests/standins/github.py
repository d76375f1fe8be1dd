"""A local stand-in for the parts of the GitHub REST API that github-digest reads."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

from tests.standins.http import JSONHandler, serve

COMMITS = [
    {"sha": "a1b2c3d4e5f6", "commit": {"message": "Fix the parser\n\nLong body"}},
    {"sha": "0f9e8d7c6b5a", "commit": {"message": "Add a test"}},
]
ISSUES = [
    {"number": 1, "created_at": "2999-01-01T00:00:00Z", "title": "Bug"},
    {"number": 2, "created_at": "2999-01-01T00:00:00Z", "title": "PR", "pull_request": {}},
]


@contextmanager
def github_standin(
    token: str, *, host: str = "127.0.0.1", echo: bool = False
) -> Iterator[dict[str, Any]]:
    """Serve /repos/{owner}/{name}/commits and /issues on `host`; yields url and seen headers
    (with `echo`, each request is also printed as a JSON line)."""
    state: dict[str, Any] = {"requests": []}

    class Handler(JSONHandler):
        def do_GET(self) -> None:  # http.server's naming
            state["requests"].append((self.path, self.headers.get("Authorization")))
            if echo:
                print(json.dumps([self.path, self.headers.get("Authorization")]), flush=True)
            if self.headers.get("Authorization") != f"Bearer {token}":
                self._send(401, {"message": "Bad credentials"})
                return
            path = urlparse(self.path).path
            if path.endswith("/commits"):
                self._send(200, COMMITS)
            elif path.endswith("/issues"):
                self._send(200, ISSUES)
            else:
                self._send(404, {"message": "Not Found"})

    with serve(Handler, host=host) as url:
        state["url"] = url
        yield state


if __name__ == "__main__":
    # python -m tests.standins.github TOKEN HOST: serve until killed, for a test host in a
    # network namespace of its own; prints its URL, then each request as a JSON line.
    with github_standin(sys.argv[1], host=sys.argv[2], echo=True) as served:
        print(served["url"], flush=True)
        threading.Event().wait()
