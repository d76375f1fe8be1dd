"""The URLs floom sends to can hold secrets (a Slack webhook's URL is one): the HTTP library's
request lines are never logged, even on a node whose operator turned on INFO logging."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from floom.net.egress import EgressPolicy, guarded_client
from tests.standins.http import STOP_POLL_SECONDS


class _Ok(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_guarded_request_s_url_is_not_logged_at_info_or_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, args=(STOP_POLL_SECONDS,), daemon=True).start()
    try:
        caplog.set_level(logging.DEBUG)
        url = f"http://127.0.0.1:{server.server_port}/services/T0/B0/xoxb-SECRET-token"
        with guarded_client(EgressPolicy(allow_private=True)) as client:
            assert client.post(url, content=b"{}").status_code == 200
    finally:
        server.shutdown()
        server.server_close()
    assert "xoxb-SECRET-token" not in caplog.text
