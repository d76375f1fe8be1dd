"""A client that opens a stream and then reads nothing does not hold its connection and its
stream's place for as long as the run lasts: a write that makes no progress for
FLOOM_RESPONSE_SEND_SECONDS closes the connection (floom/api/edge/connections.py); a client
that reads, however slowly, keeps its stream."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs.logs import append_events
from floom.store.db import session_scope
from tests.e2e.api.test_waits import NOOP, deploy, start
from tests.support.harness import LiveServer, live_server, wait_until

SEND_SECONDS = 1.0
# Only so that a server that still holds a connection fails a test instead of hanging it.
HELD = 20.0
# Far more of a log than a small receive buffer takes: the server's writes wait on the reader.
LINE = "x" * 4000


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    # API role only: the run stays queued, so its stream stays open until the client leaves.
    with live_server(
        tmp_path / "data",
        f"sqlite:///{tmp_path / 'floom.db'}",
        roles="api",
        max_streams_per_key=1,
        response_send_seconds=SEND_SECONDS,
    ) as srv:
        yield srv


def queued_run_with_log(server: LiveServer, tmp_path: Path, lines: int) -> str:
    with server.client() as api:
        deploy(api, tmp_path, "idle", NOOP)
        run_id = start(api, "idle")
    append_lines(server.ctx, run_id, lines)
    return run_id


def append_lines(ctx: Context, run_id: str, lines: int) -> None:
    with session_scope(ctx.engine, write=True) as s:
        append_events(
            s,
            run_id=run_id,
            attempt=1,
            lines=[("stdout", f"{i} {LINE}", None) for i in range(lines)],
        )


def open_stream(server: LiveServer, token: str, run_id: str) -> socket.socket:
    """A raw connection with a small receive buffer that asks for the run's log stream and
    reads its answer's head."""
    url = httpx.URL(server.base_url)
    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.settimeout(HELD)
    conn.connect((url.host, url.port))
    conn.sendall(
        f"GET /api/v1/runs/{run_id}/logs/stream HTTP/1.1\r\nHost: floom\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        got = conn.recv(1)
        assert got, head
        head += got
    assert head.startswith(b"HTTP/1.1 200"), head
    return conn


def closed_by_server(conn: socket.socket) -> bool:
    """Reads what is left; True once the server has closed (or reset) the connection."""
    try:
        while conn.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def test_a_stream_whose_client_reads_nothing_is_closed_and_its_place_given_back(
    server: LiveServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Paced by its reader, the server waited on one that read nothing for as long as the run
    # lasted: its connection and its stream's place (FLOOM_MAX_STREAMS_PER_KEY) held for good.
    key, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="stalled")
    run_id = queued_run_with_log(server, tmp_path, lines=400)
    with (
        caplog.at_level(logging.WARNING, logger="floom"),
        open_stream(server, token, run_id) as conn,
    ):
        assert server.ctx.node.run_ends.open_holds(key.id, kind="stream") == 1
        wait_until(
            lambda: server.ctx.node.run_ends.open_holds(key.id, kind="stream") == 0, timeout=HELD
        )
        assert closed_by_server(conn)
    assert caplog.text.count("FLOOM_RESPONSE_SEND_SECONDS") == 1, caplog.text
    # The key's one place is free again: a new stream of the same key is served.
    with (
        server.client(token, timeout=HELD) as reader,
        reader.stream("GET", f"/api/v1/runs/{run_id}/logs/stream") as again,
    ):
        assert again.status_code == 200
        assert next(again.iter_lines()).startswith("id: ")


def test_a_client_that_reads_slowly_keeps_its_stream(
    server: LiveServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="slow")
    run_id = queued_run_with_log(server, tmp_path, lines=40)
    with (
        caplog.at_level(logging.WARNING, logger="floom"),
        open_stream(server, token, run_id) as conn,
    ):
        received = b""
        reads = 0
        # Each read comes half a deadline after the last, three deadlines in all: the server's
        # writes wait on the reader the whole time, yet each wait is shorter than the deadline.
        while reads < 6:
            time.sleep(SEND_SECONDS / 2)  # the reader's pace, not a wait for something
            got = conn.recv(8192)
            assert got, "the server closed a stream whose client reads"
            received += got
            reads += 1
        assert server.ctx.node.run_ends.open_holds(key.id, kind="stream") == 1
        while received.count(b"event: log") < 40 + 1:  # the run's queued notice, then the lines
            got = conn.recv(65536)
            assert got, "the server closed a stream whose client reads"
            received += got
    assert "FLOOM_RESPONSE_SEND_SECONDS" not in caplog.text
