"""Fairness under abuse: one key holds only so many open streams and waits on a node (429
with Retry-After above), and one run's log only so many lines and bytes a second (the rest
dropped, and said in the log once per window)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import MCPError
from mcp.client.subscriptions import SubscriptionLost

from floom.engine.runlog import DROP_NOTE_SECONDS, LogBudget, RunLog
from floom.sandbox.local.supervisor import LineSplitter
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.access.secrets import Redactor
from tests.e2e.api.test_waits import NOOP, deploy, start, waiters
from tests.support.cli import cli
from tests.support.harness import LiveServer, live_server, wait_for_run, wait_until
from tests.support.mcp_clients import http_client


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'floom.db'}"  # the caps live in the node, not the store


@pytest.fixture
def make_server(tmp_path: Path, database_url: str) -> Iterator[Callable[..., LiveServer]]:
    with ExitStack() as stack:
        yield lambda **overrides: stack.enter_context(
            live_server(tmp_path / "data", database_url, **overrides)
        )


def read_key(server: LiveServer, name: str = "reader") -> tuple[str, str]:
    key, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name=name)
    return key.id, token


def open_stream(stack: ExitStack, client: httpx.Client, run_id: str) -> httpx.Response:
    return stack.enter_context(client.stream("GET", f"/api/v1/runs/{run_id}/logs/stream"))


def refusal(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 429, response.status_code  # before reading: a stream lasts
    response.read()
    assert int(response.headers["Retry-After"]) >= 1
    error: dict[str, Any] = response.json()["error"]
    return error


def test_a_key_over_its_stream_cap_gets_429_too_many_streams_while_other_keys_still_stream(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    # API role only: the run stays queued, so its streams stay open until the test closes them.
    server = make_server(roles="api", max_streams_per_key=3)
    key_id, token = read_key(server)
    with server.client() as api, server.client(token) as reader, ExitStack() as streams:
        deploy(api, tmp_path, "idle", NOOP)
        run_id = start(api, "idle")
        held = [open_stream(streams, reader, run_id) for _ in range(3)]
        assert {r.status_code for r in held} == {200}
        assert server.ctx.node.run_ends.open_holds(key_id, kind="stream") == 3

        with reader.stream("GET", f"/api/v1/runs/{run_id}/logs/stream") as over:
            error = refusal(over)
        assert error["code"] == "too_many_streams"
        assert "FLOOM_MAX_STREAMS_PER_KEY" in error["hint"]
        # Reads that do not follow, and another key's stream, are not held against this key.
        assert reader.get(f"/api/v1/runs/{run_id}/logs").status_code == 200
        assert open_stream(streams, api, run_id).status_code == 200

        # A stream the client closes gives its place back.
        held[0].close()
        wait_until(lambda: server.ctx.node.run_ends.open_holds(key_id, kind="stream") == 2)
        assert open_stream(streams, reader, run_id).status_code == 200
        assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200
    wait_until(lambda: server.ctx.node.run_ends.open_holds(key_id, kind="stream") == 0)


def test_the_cli_over_its_keys_stream_cap_reads_the_log_page_by_page_instead(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = make_server(roles="api", max_streams_per_key=1)
    _, token = read_key(server)
    with server.client() as api, server.client(token) as reader, ExitStack() as streams:
        deploy(api, tmp_path, "idle", NOOP)
        run_id, other = start(api, "idle"), start(api, "idle")
        # The key's one stream, of a run that stays queued: it stays open.
        assert open_stream(streams, reader, other).status_code == 200
        assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200
        followed = cli(server, "logs", run_id, "-f", key=token)
        assert api.post(f"/api/v1/runs/{other}/cancel").status_code == 200
    assert followed.returncode == 0, followed.stderr
    assert f"run {run_id} cancelled" in followed.stdout


def test_a_stream_that_ends_with_its_run_gives_its_place_back(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = make_server(max_streams_per_key=1)
    key_id, token = read_key(server)
    with server.client() as api, server.client(token) as reader:
        deploy(api, tmp_path, "quick", NOOP)
        for _ in range(3):  # one at a time, each to its end: never over a cap of one
            run_id = start(api, "quick")
            with reader.stream("GET", f"/api/v1/runs/{run_id}/logs/stream") as followed:
                assert followed.status_code == 200
                assert "event: end" in followed.read().decode()
            wait_until(lambda: server.ctx.node.run_ends.open_holds(key_id, kind="stream") == 0)


def test_a_wait_over_the_cap_is_told_when_to_retry(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = make_server(roles="api", max_waits_per_key=1)
    key_id, token = read_key(server)
    with server.client() as api, server.client(token) as reader, ThreadPoolExecutor(1) as pool:
        deploy(api, tmp_path, "idle", NOOP)
        run_id = start(api, "idle")
        [first] = waiters(pool, reader, run_id, 1, 30)
        wait_until(lambda: server.ctx.node.run_ends.open_waits(key_id) == 1)
        over = refusal(reader.get(f"/api/v1/runs/{run_id}", params={"wait": 30}))
        assert over["code"] == "too_many_waits"
        assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200
        assert first.result(timeout=20).json()["status"] == "cancelled"


def test_the_mcp_endpoints_event_streams_count_against_the_streams_cap(
    make_server: Callable[..., LiveServer],
) -> None:
    server = make_server(roles="api", max_streams_per_key=1)
    key_id, token = read_key(server)
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }
    with httpx.Client(base_url=server.base_url, headers=headers, timeout=30) as mcp:
        sessions = []
        for _ in range(2):
            started = mcp.post("/mcp", content=json.dumps(hello))
            assert started.status_code == 200, started.text
            sessions.append(started.headers["mcp-session-id"])
        with ExitStack() as streams:
            first = streams.enter_context(
                mcp.stream("GET", "/mcp", headers={"mcp-session-id": sessions[0]})
            )
            assert first.status_code == 200
            wait_until(lambda: server.ctx.node.run_ends.open_holds(key_id, kind="stream") == 1)
            with mcp.stream("GET", "/mcp", headers={"mcp-session-id": sessions[1]}) as over:
                assert refusal(over)["code"] == "too_many_streams"


# -- the log budget -------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def budgeted_log(*, lines: float, size: float, clock: Clock) -> RunLog:
    budget = LogBudget(lines_per_second=lines, bytes_per_second=size, clock=clock)
    return RunLog(
        run_id="run_x",
        attempt=1,
        redactor=Redactor([]),
        max_lines=100_000,
        max_bytes=10_000_000,
        budget=budget,
    )


def test_a_flood_keeps_the_lines_budget_and_one_line_per_window_says_how_many_were_dropped() -> (
    None
):
    clock = Clock()
    log = budgeted_log(lines=10, size=0, clock=clock)  # holds 10 s: 100 lines at once
    for i in range(250):
        log.add("stdout", f"line {i}")
        clock.now += 0.001  # 250 lines in a quarter second: the refill adds 2
    assert not [line for stream, line, _ in log._pending if stream == "system"]

    clock.now += DROP_NOTE_SECONDS  # the window ends; the bucket refills 50 lines
    for i in range(80):
        log.add("stdout", f"later {i}")
    for i in range(5):
        log.add("system", f"floom's own {i}")  # never counted against the run
    lines = log.drain()

    kept = [line for stream, line, _ in lines if stream == "stdout"]
    notes = [line for stream, line, _ in lines if stream == "system" and "dropped" in line]
    assert len(kept) == 102 + 50
    assert kept[:3] == ["line 0", "line 1", "line 2"]
    assert kept[102] == "later 0"
    assert len(notes) == 2, notes
    assert notes[0].startswith("dropped 148 lines: this run wrote faster than its log budget")
    assert "FLOOM_LOG_LINES_PER_SECOND" in notes[0]
    assert notes[1].startswith("dropped 30 lines")  # the rest, said at the run's end
    # The first note comes before the first line kept after the drops it tells.
    order = [line for _, line, _ in lines]
    assert order.index(notes[0]) == order.index("later 0") - 1
    assert sum(line.startswith("floom's own") for line in order) == 5


def test_the_bytes_budget_drops_what_does_not_fit_and_lets_smaller_lines_through() -> None:
    clock = Clock()
    log = budgeted_log(lines=0, size=100, clock=clock)  # 1,000 bytes at once, no line limit
    log.add("stdout", "x" * 2000)
    log.add("stderr", "small")
    lines = log.drain()
    assert next((s, line) for s, line, _ in lines) == ("stderr", "small")
    assert lines[1][0] == "system"
    assert lines[1][1].startswith("dropped 1 line:")
    assert len(lines) == 2


def test_a_flooding_run_keeps_only_its_budget_and_says_so_in_its_log(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = make_server(log_lines_per_second=20, log_bytes_per_second=0)
    flood = "for i in range(20000):\n    print('flood', i)\n"
    with server.client() as api:
        deploy(api, tmp_path, "flood", flood)
        run = wait_for_run(api, start(api, "flood"), timeout=60)
        assert run["status"] == "succeeded", run
        events = api.get(f"/api/v1/runs/{run['id']}/logs", params={"limit": 10_000}).json()
    kept = sum(e["stream"] == "stdout" for e in events["items"])
    notes = [e for e in events["items"] if "log budget" in e["line"]]
    # The bucket holds 200 lines, and refills 20 a second while the run lasts.
    assert 200 <= kept < 2000, kept
    assert notes
    assert {e["stream"] for e in notes} == {"system"}
    dropped = sum(int(e["line"].split()[1]) for e in notes)
    assert kept + dropped == 20000


def test_a_reader_drops_whole_reads_over_the_budget_and_counts_every_line_once() -> None:
    clock = Clock()
    log = budgeted_log(lines=1, size=0, clock=clock)  # holds 10 lines
    splitter = LineSplitter("stdout", log)
    splitter.feed(b"".join(b"ok %d\n" % i for i in range(10)))  # fits whole: kept line by line
    splitter.feed(b"a\nb\nc-sta")  # no room: dropped unsplit, the cut line's start kept
    splitter.feed(b"rt\nd\n")  # still none: dropped, the cut line counted once
    clock.now += 2.0  # room for two lines
    splitter.feed(b"e\nf\n")
    splitter.feed(b"g")
    splitter.flush()
    lines = [(stream, line) for stream, line, _ in log.drain()]
    assert lines[:10] == [("stdout", f"ok {i}") for i in range(10)]
    assert lines[10:12] == [("stdout", "e"), ("stdout", "f")]
    assert lines[12][0] == "system"
    assert lines[12][1].startswith("dropped 5 lines:")
    assert len(lines) == 13  # "g" came with no room left: dropped, and counted


def test_a_full_log_drops_further_reads_without_reading_them_line_by_line() -> None:
    log = RunLog(run_id="run_x", attempt=1, redactor=Redactor([]), max_lines=2, max_bytes=10**6)
    splitter = LineSplitter("stdout", log)
    splitter.feed(b"one\ntwo\nthree\n")
    assert log.drops("stdout", 1000, 10**5)
    splitter.feed(b"four\n" * 1000)
    assert [line for _, line, _ in log.drain()][:2] == ["one", "two"]


def test_an_mcp_subscription_counts_against_the_streams_cap(
    make_server: Callable[..., LiveServer],
) -> None:
    """A 2026-07-28 client's `subscriptions/listen` is held open as a GET event stream is:
    one over the key's cap is refused, and its place comes back when it ends."""
    server = make_server(roles="api", max_streams_per_key=1)
    key_id, token = read_key(server)

    def holds() -> int:
        return server.ctx.node.run_ends.open_holds(key_id, kind="stream")

    async def listen_twice() -> None:
        async with http_client(server, token) as mcp:
            async with mcp.listen(tools_list_changed=True):
                assert holds() == 1
                with pytest.raises((MCPError, SubscriptionLost)):
                    async with mcp.listen(tools_list_changed=True):
                        pass
            with anyio.fail_after(20):
                while holds():
                    await anyio.sleep(0.05)
            async with mcp.listen(tools_list_changed=True):
                assert holds() == 1

    anyio.run(listen_twice)
