"""Request bodies are refused at their route's limit before anything parses them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.harness import LiveServer, live_server


@pytest.fixture
def small_server(tmp_path: Path) -> Iterator[LiveServer]:
    with live_server(
        tmp_path / "data", f"sqlite:///{tmp_path / 'floom.db'}", max_request_bytes=64 * 1024
    ) as srv:
        yield srv


def test_a_declared_oversized_json_body_is_refused_with_413_before_parsing(
    small_server: LiveServer,
) -> None:
    body = b'{"inputs": {"x": "' + b"a" * (200 * 1024) + b'"}}'
    with small_server.client() as api:
        resp = api.post(
            "/api/v1/workers/none/runs", content=body, headers={"content-type": "application/json"}
        )
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "payload_too_large"
    assert "FLOOM_MAX_REQUEST_BYTES" in resp.json()["error"]["hint"]


def test_a_chunked_body_is_counted_as_it_streams(small_server: LiveServer) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"inputs": {"x": "'
        for _ in range(50):
            yield b"a" * 4096
        yield b'"}}'

    with small_server.client() as api:
        resp = api.post(
            "/api/v1/workers/none/runs",
            content=chunks(),
            headers={"content-type": "application/json"},
        )
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "payload_too_large"


def test_bodies_under_the_limit_reach_the_route(small_server: LiveServer) -> None:
    with small_server.client() as api:
        resp = api.post("/api/v1/workers/none/runs", json={"inputs": {"x": "small"}})
    assert resp.status_code == 404  # the route ran: no such worker
    with httpx.Client(base_url=small_server.base_url) as anonymous:
        assert anonymous.get("/healthz").status_code == 200
