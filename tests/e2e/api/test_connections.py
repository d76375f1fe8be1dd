"""What a connection may hold of a node before its request reaches the app
(floom/api/edge/connections.py): its headers' time and size, and the connections held at once."""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.harness import LiveServer, live_server

# Only so that a server that still holds a connection fails a test instead of hanging it.
HELD = 20.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with live_server(
        tmp_path / "data",
        f"sqlite:///{tmp_path / 'floom.db'}",
        request_header_seconds=0.5,
        max_header_bytes=16 * 1024,
    ) as srv:
        yield srv


def connect(server: LiveServer) -> socket.socket:
    url = httpx.URL(server.base_url)
    conn = socket.create_connection((url.host, url.port))
    conn.settimeout(HELD)
    return conn


def answer_of(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    answer = b""
    while got := conn.recv(65536):
        answer += got
    return answer


def error_of(answer: bytes) -> tuple[bytes, dict[str, str]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0], json.loads(body)["error"]


def test_headers_dribbled_slower_than_their_deadline_are_answered_408_and_closed(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    # uvicorn has no deadline on a request's head: a client that sent a header byte every
    # few seconds held its connection (and its memory) for good, and many such held the
    # node's connections. The head now has FLOOM_REQUEST_HEADER_SECONDS.
    with connect(server) as conn, caplog.at_level(logging.WARNING, logger="floom"):
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: floom\r\nX-Slow: ")
        answer = b""
        give_up = time.monotonic() + HELD
        while time.monotonic() < give_up:
            conn.sendall(b"a")
            readable, _, _ = select.select([conn], [], [], 0.1)
            if readable:
                answer = answer_of(conn)
                break
            # Meanwhile the node serves everyone else.
            with httpx.Client(base_url=server.base_url, timeout=10) as other:
                assert other.get("/healthz").status_code == 200
    status, error = error_of(answer)
    assert status == b"HTTP/1.1 408 Request Timeout"
    assert error["code"] == "request_timeout"
    assert "FLOOM_REQUEST_HEADER_SECONDS" in caplog.text


def test_a_connection_that_sends_nothing_is_closed_at_the_header_deadline(
    server: LiveServer,
) -> None:
    with connect(server) as conn:
        assert answer_of(conn) == b""  # closed without a word: no request had come
    # One whose request was answered waits for its next as long, no longer.
    with connect(server) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: floom\r\n\r\n")
        assert answer_of(conn).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\r\nHost: floom\r\nX-Big: " + b"a" * (1024 * 1024),
        b"GET /" + b"a" * (1024 * 1024),
        b"GET /healthz HTTP/1.1\r\nHost: floom\r\n" + b"X-Many: 1\r\n" * 300 + b"\r\n",
    ],
    ids=["one endless header", "an endless request line", "too many header fields"],
)
def test_a_head_over_its_limit_is_answered_431_and_closed(server: LiveServer, head: bytes) -> None:
    # httptools keeps every byte of a head it is sent, without a limit of its own.
    with connect(server) as conn:
        # The server may answer and close before the rest is sent.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(head)
        status, error = error_of(answer_of(conn))
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert error["code"] == "headers_too_large"
    with httpx.Client(base_url=server.base_url, timeout=10) as other:
        assert other.get("/healthz", headers={"X-Fine": "b" * 8000}).status_code == 200


def test_a_chunked_body_with_endless_trailers_is_cut(server: LiveServer) -> None:
    # A chunked body's trailers are headers after the body, held by httptools without a
    # limit and outside the body's flow control: 200 MiB of one trailer took the server from
    # 97 to 340 MiB resident. Bytes in a row that carry no body are bounded as a head is.
    with connect(server) as conn:
        conn.sendall(
            b"POST /api/v1/keys HTTP/1.1\r\nHost: floom\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\n\r\n2\r\n{}\r\n0\r\nX-Trailer: "
        )
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(b"a" * (1024 * 1024))
        with contextlib.suppress(ConnectionResetError):
            assert answer_of(conn) == b""
    # A body of many small chunks is no trailer: it reaches its route.
    chunks = b"".join(b"1\r\n%s\r\n" % bytes([c]) for c in b'{"name": "' + b"k" * 4000)
    with connect(server) as conn:
        conn.sendall(
            b"POST /api/v1/keys HTTP/1.1\r\nHost: floom\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\nConnection: close\r\n"
            b"Authorization: Bearer "
            + server.admin_key.encode()
            + b"\r\n\r\n"
            + chunks
            + b'2\r\n"}\r\n0\r\n\r\n'
        )
        status = answer_of(conn).split(b"\r\n", 1)[0]
        # The route read the body whole: its 4,000-character name is its own refusal.
        assert status == b"HTTP/1.1 422 Unprocessable Entity", status


def test_pipelined_requests_are_all_answered(server: LiveServer) -> None:
    with connect(server) as conn:
        conn.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: floom\r\n\r\n" * 2
            + b"GET /healthz HTTP/1.1\r\nHost: floom\r\nConnection: close\r\n\r\n"
        )
        assert answer_of(conn).count(b"HTTP/1.1 200 OK") == 3


def test_idle_connections_past_the_cap_make_room_for_requests(tmp_path: Path) -> None:
    # A node accepted connections until it ran out of file descriptors, after which it served
    # no one. It now holds FLOOM_MAX_CONNECTIONS: one more closes the longest idle.
    with live_server(
        tmp_path / "data", f"sqlite:///{tmp_path / 'floom.db'}", max_connections=8
    ) as server:
        idle = [connect(server) for _ in range(20)]
        try:
            with httpx.Client(base_url=server.base_url, timeout=10) as real:
                assert real.get("/healthz").status_code == 200
            closed = 0
            for conn in idle:
                readable, _, _ = select.select([conn], [], [], 0)
                if readable and conn.recv(1) == b"":
                    closed += 1
            # The 12 opened past the cap and the one the request took made room.
            assert closed >= 12
        finally:
            for conn in idle:
                conn.close()
