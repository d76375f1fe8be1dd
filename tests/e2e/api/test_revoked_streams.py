"""A log stream opened with a key (REST) or a web session (UI) ends once that key is revoked
or the session ends: a stream opened before a revocation does not go on showing a run's log
for as long as the run lasts."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack, suppress
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import SubscriptionLost

from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from tests.support.harness import EXAMPLES, LiveServer, deploy_folder, live_server
from tests.support.web import csrf_of, signed_in_client

# Without the re-check a stream of a queued run never ends: this read deadline fails it.
READ_SECONDS = 15.0


@pytest.fixture
def queued_run(tmp_path: Path, database_url: str) -> Iterator[tuple[LiveServer, str]]:
    """A server without an executor and a run of it that stays queued (its stream stays open)."""
    with live_server(tmp_path, database_url, roles="api") as node, node.client() as api:
        deploy_folder(api, EXAMPLES / "hello")
        yield node, api.post("/api/v1/workers/hello/runs", json={}).json()["id"]


def _events_until_closed(lines: Iterator[str]) -> list[tuple[str, str]]:
    """The (event, data) pairs of a stream's lines, read until the server closes it."""
    events: list[tuple[str, str]] = []
    kind = ""
    for line in lines:
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((kind, line.removeprefix("data: ")))
    return events


def _ends_refused(lines: Iterator[str]) -> None:
    events = _events_until_closed(lines)
    assert events, "the stream ended without a word"
    kind, data = events[-1]
    assert kind == "error", events[-3:]
    assert json.loads(data)["error"]["code"] == "unauthorized", data


def test_a_rest_log_stream_ends_when_its_key_is_revoked(queued_run: tuple[LiveServer, str]) -> None:
    node, run_id = queued_run
    row, token = keys.create_key(node.ctx, caller=SYSTEM, scopes=["read"], name="follower")
    reader = node.client(token, timeout=httpx.Timeout(10, read=READ_SECONDS))
    with reader.stream("GET", f"/api/v1/runs/{run_id}/logs/stream") as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        assert next(lines).startswith("id: ")  # the run's first line: the stream is open
        assert node.client().delete(f"/api/v1/keys/{row.id}").status_code == 200
        _ends_refused(lines)
    # And a new stream is refused outright.
    assert reader.get(f"/api/v1/runs/{run_id}/logs/stream").status_code == 401


def test_a_web_log_stream_ends_when_its_session_s_key_is_revoked_or_it_signs_out(
    queued_run: tuple[LiveServer, str],
) -> None:
    node, run_id = queued_run
    row, token = keys.create_key(node.ctx, caller=SYSTEM, scopes=["read"], name="browser")
    revoked = signed_in_client(node, token)
    leaving = signed_in_client(node, node.admin_key)
    timeout = httpx.Timeout(10, read=READ_SECONDS)
    path = f"/runs/{run_id}/logs/stream"
    with ExitStack() as stack:
        first = stack.enter_context(revoked.stream("GET", path, timeout=timeout))
        second = stack.enter_context(leaving.stream("GET", path, timeout=timeout))
        for stream in (first, second):
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
        assert node.client().delete(f"/api/v1/keys/{row.id}").status_code == 200
        _ends_refused(first.iter_lines())
        csrf = csrf_of(leaving.get("/").text)
        assert leaving.post("/logout", data={"csrf": csrf}).status_code == 303
        _ends_refused(second.iter_lines())


def _watching_client(
    server: LiveServer, token: str, answered: list[tuple[str, int]]
) -> httpx2.AsyncClient:
    """An HTTP client for the SDK's transport that notes each answer's method and status."""

    async def seen(response: httpx2.Response) -> None:
        answered.append((response.request.method, response.status_code))

    return httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx2.Timeout(10, read=READ_SECONDS * 2),
        event_hooks={"response": [seen]},
    )


async def _until(predicate: Callable[[], bool]) -> None:
    with anyio.fail_after(READ_SECONDS):
        while not predicate():
            await anyio.sleep(0.05)


def test_an_mcp_session_s_event_stream_ends_when_its_key_is_revoked(server: LiveServer) -> None:
    """A handshake-era client's session holds a GET event stream open for server-initiated
    messages; each POST authenticates again, the stream must too. The client opens the
    stream again when the server ends it: that GET is refused."""
    row, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="agent")
    answered: list[tuple[str, int]] = []

    async def session() -> None:
        async with _watching_client(server, token, answered) as http:
            transport = streamable_http_client(f"{server.base_url}/mcp", http_client=http)
            async with Client(transport, read_timeout_seconds=READ_SECONDS, mode="legacy") as mcp:
                await mcp.list_tools()
                await _until(lambda: ("GET", 200) in answered)
                keys.revoke_key(server.ctx, caller=SYSTEM, key_id=row.id)
                # Without the re-check the stream stays open and the client never asks again.
                await _until(lambda: ("GET", 401) in answered)

    anyio.run(session)
    gets = [status for method, status in answered if method == "GET"]
    assert gets[0] == 200
    assert set(gets[1:]) == {401}, answered


def test_an_mcp_subscription_ends_when_its_key_is_revoked(server: LiveServer) -> None:
    """A 2026-07-28 client listens for changes on a `subscriptions/listen` POST whose answer
    lasts as long as it listens: it ends once the key is revoked."""
    row, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="agent")
    answered: list[tuple[str, int]] = []
    ended = anyio.Event()

    async def session() -> None:
        async with _watching_client(server, token, answered) as http:
            transport = streamable_http_client(f"{server.base_url}/mcp", http_client=http)
            async with Client(transport, read_timeout_seconds=READ_SECONDS) as mcp:
                async with mcp.listen(tools_list_changed=True) as subscription:
                    keys.revoke_key(server.ctx, caller=SYSTEM, key_id=row.id)
                    with anyio.fail_after(READ_SECONDS), suppress(SubscriptionLost):
                        async for _ in subscription:
                            pass
                    ended.set()
                with pytest.raises(MCPError):
                    await mcp.list_tools()

    anyio.run(session)
    assert ended.is_set()
