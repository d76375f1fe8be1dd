"""Waiting for a run's end (`GET /runs/{id}?wait=`): waiters hold no thread, so other calls go
on; each key's concurrent waits are capped; a wait answers as soon as the run ends, also when
another node ended it; the client waits through one long request instead of polling."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from floom.client.rest import FloomClient
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs import lifecycle as runs
from floom.services.runs import waits as run_waits
from floom.triggers.signatures import sign_floom
from tests.support.harness import (
    LiveServer,
    deploy_folder,
    live_server,
    make_worker,
    wait_until,
)

SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n"
NOOP = "import json\njson.dump({'outputs': {}}, open('result.json', 'w'))\n"


@pytest.fixture
def make_server(tmp_path: Path, database_url: str) -> Iterator[Callable[..., LiveServer]]:
    """Start a live server with setting overrides (one per test)."""
    with_stack: list[Any] = []

    def make(**overrides: Any) -> LiveServer:
        cm = live_server(tmp_path / "data", database_url, **overrides)
        with_stack.append(cm)
        return cm.__enter__()

    yield make
    for cm in reversed(with_stack):
        cm.__exit__(None, None, None)


def read_key(server: LiveServer) -> tuple[str, str]:
    key, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="waiter")
    return key.id, token


def deploy(api: httpx.Client, tmp_path: Path, name: str, script: str) -> None:
    manifest = f"name: {name}\nlimits: {{timeout_seconds: 900}}\n"
    deploy_folder(api, make_worker(tmp_path / name, manifest, {"run.py": script}))


def start(api: httpx.Client, worker: str) -> str:
    resp = api.post(f"/api/v1/workers/{worker}/runs", json={})
    assert resp.status_code == 202, resp.text
    run_id: str = resp.json()["id"]
    return run_id


def waiters(
    pool: ThreadPoolExecutor, client: httpx.Client, run_id: str, count: int, seconds: float
) -> list[Future[httpx.Response]]:
    path = f"/api/v1/runs/{run_id}"
    return [
        pool.submit(client.get, path, params={"wait": seconds}, timeout=seconds + 30)
        for _ in range(count)
    ]


def test_sixty_waiting_requests_do_not_delay_another_authenticated_call(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = make_server(max_waits_per_key=100)
    key_id, token = read_key(server)
    with server.client() as api:
        deploy(api, tmp_path, "sleeper", SLEEPER)
        run_id = start(api, "sleeper")
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        headers = {"Authorization": f"Bearer {token}"}
        with (
            httpx.Client(base_url=server.base_url, headers=headers, limits=limits) as reader,
            ThreadPoolExecutor(max_workers=60) as pool,
        ):
            pending = waiters(pool, reader, run_id, 60, 20)
            # Most of them are enough to fill a thread pool of 40, as sync waits used to.
            wait_until(lambda: server.ctx.node.run_ends.open_waits(key_id) >= 35, timeout=20)

            with httpx.Client(base_url=server.base_url, headers=headers, timeout=5) as other:
                began = time.monotonic()
                try:
                    listing = other.get("/api/v1/workers")
                except httpx.TimeoutException:
                    pytest.fail("GET /workers got no answer within 5 s behind 60 waiters")
                took = time.monotonic() - began
            assert listing.status_code == 200, listing.text
            assert took < 1.0, f"GET /workers took {took:.2f}s behind 60 waiters"
            wait_until(lambda: server.ctx.node.run_ends.open_waits(key_id) == 60, timeout=20)
            assert not any(f.done() for f in pending), "the waiters should still be waiting"

            cancelled = time.monotonic()
            assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200
            answers = [f.result(timeout=20) for f in pending]
            answered_in = time.monotonic() - cancelled
    assert {(a.status_code, a.json()["status"]) for a in answers} == {(200, "cancelled")}
    assert answered_in < 10, f"the waiters answered {answered_in:.1f}s after the cancel"
    assert server.ctx.node.run_ends.open_waits(key_id) == 0


def test_a_key_over_its_wait_cap_gets_429_too_many_waits_while_other_keys_still_wait(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    # API role only: no executor, so a run stays queued until it is cancelled.
    server = make_server(roles="api")
    cap = server.ctx.settings.max_waits_per_key
    assert cap == 8
    key_id, token = read_key(server)
    with server.client() as api, ThreadPoolExecutor(max_workers=cap) as pool:
        deploy(api, tmp_path, "idle", NOOP)
        run_id = start(api, "idle")
        reader = server.client(token)
        pending = waiters(pool, reader, run_id, cap, 30)
        wait_until(lambda: server.ctx.node.run_ends.open_waits(key_id) == cap, timeout=20)

        refused = reader.get(f"/api/v1/runs/{run_id}", params={"wait": 30})
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["code"] == "too_many_waits"
        assert error["hint"]
        # A read without waiting, and another key's wait, are not capped by this key's waits.
        assert reader.get(f"/api/v1/runs/{run_id}").json()["status"] == "queued"
        other = api.get(f"/api/v1/runs/{run_id}", params={"wait": 0.3})
        assert (other.status_code, other.json()["status"]) == (200, "queued")

        cancelled = time.monotonic()
        assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200
        answers = [f.result(timeout=10) for f in pending]
        answered_in = time.monotonic() - cancelled
        reader.close()
    assert {a.json()["status"] for a in answers} == {"cancelled"}
    assert answered_in < 2, f"the waiters answered {answered_in:.1f}s after the cancel"
    assert server.ctx.node.run_ends.open_waits(key_id) == 0


def test_a_wait_answers_as_soon_as_the_run_ends(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = make_server()
    with server.client() as api:
        deploy(api, tmp_path, "quick", NOOP)
        run_id = start(api, "quick")
        began = time.monotonic()
        resp = api.get(f"/api/v1/runs/{run_id}", params={"wait": 30})
        took = time.monotonic() - began
    assert (resp.status_code, resp.json()["status"]) == (200, "succeeded"), resp.text
    assert took < 15, f"the wait answered after {took:.1f}s"


def test_a_wait_sees_an_end_that_another_node_recorded(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = make_server(roles="api")
    other_node = Context.open(server.ctx.settings.model_copy(update={"node_id": "node-b"}))
    try:
        with server.client() as api, ThreadPoolExecutor(max_workers=1) as pool:
            deploy(api, tmp_path, "idle", NOOP)
            run_id = start(api, "idle")
            (pending,) = waiters(pool, api, run_id, 1, 30)
            ends = server.ctx.node.run_ends
            wait_until(lambda: ends.open_waits(keys_of(server)) == 1, timeout=10)

            # The other node's end notice stays in its own process: only the store tells.
            runs.cancel_run(other_node, caller=SYSTEM, run_id=run_id)
            cancelled = time.monotonic()
            answer = pending.result(timeout=10)
            answered_in = time.monotonic() - cancelled
    finally:
        other_node.engine.dispose()
    assert answer.json()["status"] == "cancelled"
    assert answered_in < 3, f"the waiter answered {answered_in:.1f}s after the other node's end"


def keys_of(server: LiveServer) -> str:
    (admin,) = [k for k in keys.list_keys(server.ctx, caller=SYSTEM) if k.name == "test admin"]
    return admin.id


class CountingTransport(httpx.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return super().handle_request(request)


def test_the_client_waits_through_one_long_request_instead_of_polling(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = make_server(roles="api")
    with server.client() as api, ThreadPoolExecutor(max_workers=1) as pool:
        deploy(api, tmp_path, "idle", NOOP)
        run_id = start(api, "idle")
        transport = CountingTransport()
        client = FloomClient(server.base_url, server.admin_key, transport=transport)
        with client:
            waited = pool.submit(client.wait, run_id, deadline=time.monotonic() + 30)
            ends = server.ctx.node.run_ends
            wait_until(lambda: ends.open_waits(keys_of(server)) == 1, timeout=10)
            runs.cancel_run(server.ctx, caller=SYSTEM, run_id=run_id)
            run = waited.result(timeout=10)
    assert run.status == "cancelled"
    (request,) = transport.requests
    assert (request.method, request.url.path) == ("GET", f"/api/v1/runs/{run_id}")
    assert 25 < float(request.url.params["wait"]) <= 30


def test_a_webhook_over_its_wait_cap_is_answered_202_at_once_with_its_run_started(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = make_server(roles="api", max_waits_per_key=1)
    secret = "hook-secret-for-wait-tests"
    with server.client() as api, ThreadPoolExecutor(max_workers=1) as pool:
        api.put("/api/v1/secrets/WAIT_HOOK_SECRET", json={"value": secret})
        manifest = (
            "name: hooked\ninputs: {event: object}\ntriggers:\n"
            "  - webhook: {signature: hmac-sha256, secret: WAIT_HOOK_SECRET}\n"
        )
        deploy_folder(api, make_worker(tmp_path / "hooked", manifest, {"run.py": NOOP}))

        def deliver(n: int, client: httpx.Client) -> httpx.Response:
            body = f'{{"n": {n}}}'.encode()
            headers = sign_floom(secret=secret, body=body, timestamp=int(time.time()))
            headers["Content-Type"] = "application/json"
            return client.post("/hooks/hooked", params={"wait": 30}, content=body, headers=headers)

        with httpx.Client(base_url=server.base_url, timeout=60) as sender:
            first = pool.submit(deliver, 1, sender)
            wait_until(lambda: server.ctx.node.run_ends.open_waits("hook:hooked") == 1, timeout=10)
            with httpx.Client(base_url=server.base_url, timeout=5) as second_sender:
                second = deliver(2, second_sender)
            assert second.status_code == 202, second.text
            assert second.json()["run_id"]

            first_run = api.get("/api/v1/runs", params={"worker": "hooked"}).json()["items"]
            for run in first_run:
                api.post(f"/api/v1/runs/{run['id']}/cancel")
            answered = first.result(timeout=10)
    assert (answered.status_code, answered.json()["status"]) == (200, "cancelled")


def test_the_blocking_wait_answers_a_worker_thread_when_the_run_ends(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = make_server(roles="api")
    with server.client() as api, ThreadPoolExecutor(max_workers=1) as pool:
        deploy(api, tmp_path, "idle", NOOP)
        run_id = start(api, "idle")
        waited = pool.submit(
            run_waits.wait_for_end_blocking, server.ctx, run_id=run_id, timeout=30, caller=SYSTEM
        )
        queued = run_waits.wait_for_end_blocking(
            server.ctx, caller=SYSTEM, run_id=run_id, timeout=0.2
        )
        assert queued.status == "queued"
        assert not waited.done()
        cancelled = time.monotonic()
        runs.cancel_run(server.ctx, caller=SYSTEM, run_id=run_id)
        ended = waited.result(timeout=5)
        answered_in = time.monotonic() - cancelled
    assert ended.status == "cancelled"
    assert answered_in < 1, f"the blocking wait answered {answered_in:.1f}s after the cancel"


def test_a_client_that_gives_up_gives_its_wait_back_at_once(
    make_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = make_server(roles="api")
    key_id, token = read_key(server)
    with server.client() as api:
        deploy(api, tmp_path, "idle", NOOP)
        run_id = start(api, "idle")
    with server.client(token) as impatient, pytest.raises(httpx.ReadTimeout):
        impatient.get(f"/api/v1/runs/{run_id}", params={"wait": 30}, timeout=1.0)
    # The connection is closed; the server stops waiting instead of holding the key's wait
    # until the 30 s run out (waited for up to 20 s of them: a loaded machine is slow to
    # notice a closed connection, and the 30 s are still not what ended it).
    wait_until(lambda: server.ctx.node.run_ends.open_waits(key_id) == 0, timeout=20)
