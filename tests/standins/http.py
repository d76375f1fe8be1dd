"""What every local stand-in server shares: a quiet JSON handler and a loopback server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STOP_POLL_SECONDS = 0.02
"""How often a stand-in's serve_forever looks whether it should stop: its default of 0.5 s
made each stop (server.shutdown()) wait 0.25 s on average, at the end of every test with a
stand-in."""


class JSONHandler(BaseHTTPRequestHandler):
    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler], *, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve `handler` on a free port of `host` (loopback by default); yields the base URL."""
    server = ThreadingHTTPServer((host, 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(STOP_POLL_SECONDS,), daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
