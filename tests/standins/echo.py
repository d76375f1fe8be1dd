"""A local HTTP service for agent tests: records every request and answers with what it saw
(including its Authorization header), or a redirect for /redirect?to=URL[&status=307]."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.standins.http import STOP_POLL_SECONDS, JSONHandler


@contextmanager
def echo_service() -> Iterator[dict[str, Any]]:
    """Yields {"port", "requests": [{"method", "path", "headers", "body"}]}."""
    state: dict[str, Any] = {"requests": []}

    class Handler(JSONHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            seen = {
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body,
            }
            state["requests"].append(seen)
            parsed = urlparse(self.path)
            if parsed.path == "/redirect":
                query = parse_qs(parsed.query)
                self.send_response(int(query.get("status", ["302"])[0]))
                self.send_header("Location", query["to"][0])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = json.dumps({"ok": True, "seen": seen}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _handle  # http.server's naming

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(STOP_POLL_SECONDS,), daemon=True)
    thread.start()
    state["port"] = server.server_address[1]
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
