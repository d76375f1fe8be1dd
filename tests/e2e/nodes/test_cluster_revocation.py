"""A key revoked on one node stays revoked on a node that was cut off from the database or
paused when it happened: privileged writes read the caller's key again in their own
transaction, and a node's key cache is not used once its signal listener has not been
heard from within its bound (floom/services/access/auth_cache.py HEARD_WITHIN_SECONDS)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psycopg
import pytest

from floom.engine.runtime import NodeRuntime, listening
from floom.services.access.auth_cache import HEARD_WITHIN_SECONDS
from floom.services.context import Context
from floom.store.signals import APPLICATION_NAME
from tests.support.harness import (
    PG_ADMIN_URL,
    LiveServer,
    fast_settings,
    free_port,
    live_server,
    wait_until,
)
from tests.support.processes.cluster import NodeProcess
from tests.support.processes.tcp_proxy import TcpProxy
from tests.support.stops import stop

pytestmark = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)

HEIR = "heir"  # the name of every key the revoked key tries to mint


def listeners(database_url: str) -> int:
    database = database_url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (database, APPLICATION_NAME),
        ).fetchone()
    return int(row[0]) if row else 0


def active_heirs(database_url: str) -> list[str]:
    """Keys the revoked key minted that are still valid (there must be none)."""
    database = database_url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{database}") as conn:
        rows = conn.execute(
            "SELECT id FROM api_keys WHERE name LIKE %s AND revoked_at IS NULL", (f"{HEIR}%",)
        ).fetchall()
    return [r[0] for r in rows]


class RawRequest:
    """One HTTP request written to a node's socket at once; its answer is read later. Sent
    this way, a request is known to be in the node's hands (even while the node is stopped)
    before the test goes on."""

    def __init__(self, port: int, method: str, path: str, key: str, body: object = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
        )
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(head.encode() + data)
        self.status: int | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        self.sock.settimeout(90)
        received = b""
        try:
            while b"\r\n" not in received:
                chunk = self.sock.recv(4096)
                if not chunk:
                    break
                received += chunk
        except OSError:
            pass
        finally:
            self.sock.close()
        parts = received.split(b" ", 2)
        self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1

    @property
    def answered(self) -> bool:
        return self.status is not None

    def answer(self, timeout: float = 90) -> int | None:
        self._thread.join(timeout)
        return self.status


def mint(node: NodeProcess, key: str, name: str) -> RawRequest:
    return RawRequest(node.port, "POST", "/api/v1/keys", key, {"scopes": ["admin"], "name": name})


def read(node: NodeProcess, key: str) -> RawRequest:
    return RawRequest(node.port, "GET", "/api/v1/workers", key)


@contextmanager
def two_nodes(
    tmp_path: Path, database_url: str, *, b_url: str | None = None
) -> Iterator[tuple[LiveServer, NodeProcess]]:
    """Node A in this process, node B a process of its own (on `b_url`), both api nodes."""
    node_b = NodeProcess(tmp_path / "b", b_url or database_url, node_id="b", roles="api")
    with live_server(tmp_path / "a", database_url, roles="api") as node_a:
        node_b.start()
        try:
            node_b.wait_healthy()
            wait_until(lambda: listeners(database_url) == 2, timeout=30)
            yield node_a, node_b
        finally:
            assert node_b.proc is not None
            os.killpg(node_b.proc.pid, signal.SIGCONT)
            node_b.stop()


def doomed_key_cached_on_b(node_a: LiveServer, node_b: NodeProcess) -> tuple[str, str]:
    """An admin key made on A and used on B (so B's cache holds it): (id, plaintext)."""
    with node_a.client() as admin_a:
        made = admin_a.post("/api/v1/keys", json={"scopes": ["admin"], "name": "doomed"}).json()
    # B's listener is connected and has heard a heartbeat, so B now caches the key.
    wait_until(lambda: read(node_b, made["key"]).answer() == 200)
    return made["id"], made["key"]


def revoke_on_a(node_a: LiveServer, key_id: str) -> float:
    with node_a.client() as admin_a:
        assert admin_a.delete(f"/api/v1/keys/{key_id}").status_code == 200
    return time.monotonic()


def past(moment: float) -> Callable[[], bool]:
    return lambda: time.monotonic() > moment


def test_a_key_revoked_while_a_node_is_cut_off_mints_nothing_there_during_or_after(
    tmp_path: Path, database_url: str
) -> None:
    with ExitStack() as stack:
        proxy = TcpProxy(target=("127.0.0.1", 5432), port=free_port())
        stack.callback(proxy.close)
        b_url = database_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
        node_a, node_b = stack.enter_context(two_nodes(tmp_path, database_url, b_url=b_url))
        stack.callback(proxy.thaw)  # before B stops, whatever happens
        key_id, key = doomed_key_cached_on_b(node_a, node_b)
        proxy.freeze()  # B's connections stay open; no byte passes
        revoked_at = revoke_on_a(node_a, key_id)
        # Past the bound, B must not answer from its cache: it has not heard from its
        # listener since the freeze.
        wait_until(past(revoked_at + HEARD_WITHIN_SECONDS + 0.2), timeout=10)
        held = proxy.held()
        during = [mint(node_b, key, f"{HEIR} while cut off"), read(node_b, key)]
        # Both reached B's database connections (or answered, which is the finding).
        wait_until(lambda: proxy.held() > held or any(r.answered for r in during), timeout=10)
        answered_while_cut_off = [r.status for r in during if r.answered]
        proxy.thaw()
        statuses = [r.answer() for r in during]
        after = mint(node_b, key, f"{HEIR} after reconnecting").answer()
        read_after = read(node_b, key).answer()
    assert answered_while_cut_off == []
    assert statuses == [401, 401]
    assert (after, read_after) == (401, 401)
    assert active_heirs(database_url) == []


def test_a_key_revoked_while_a_node_is_paused_is_refused_there_as_it_resumes(
    tmp_path: Path, database_url: str
) -> None:
    with two_nodes(tmp_path, database_url) as (node_a, node_b):
        key_id, key = doomed_key_cached_on_b(node_a, node_b)
        assert node_b.proc is not None
        stop(node_b.proc.pid, group=True)
        revoked_at = revoke_on_a(node_a, key_id)
        wait_until(past(revoked_at + HEARD_WITHIN_SECONDS + 0.2), timeout=10)
        # Requests waiting in B's sockets as it resumes, and more right after.
        queued = [read(node_b, key) for _ in range(8)]
        queued += [mint(node_b, key, f"{HEIR} queued {i}") for i in range(8)]
        os.killpg(node_b.proc.pid, signal.SIGCONT)
        resumed = [mint(node_b, key, f"{HEIR} resumed {i}") for i in range(4)]
        statuses = [r.answer() for r in queued + resumed]
    assert statuses == [401] * len(statuses)
    assert active_heirs(database_url) == []


def test_a_node_whose_signal_connection_freezes_stops_trusting_its_key_cache_within_the_bound(
    tmp_path: Path, database_url: str
) -> None:
    with ExitStack() as stack:
        proxy = TcpProxy(target=("127.0.0.1", 5432), port=free_port())
        stack.callback(proxy.close)
        url = database_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
        ctx = Context.open(fast_settings(tmp_path / "data", url))
        stack.callback(ctx.engine.dispose)
        listener = stack.enter_context(listening(ctx, NodeRuntime.of(ctx)))
        assert listener is not None
        stack.callback(proxy.thaw)
        wait_until(lambda: ctx.node.auth_cache.trusted, timeout=10)
        frozen_at = time.monotonic()
        proxy.freeze()  # the connection stays open: nothing says it is lost
        wait_until(lambda: not ctx.node.auth_cache.trusted, timeout=HEARD_WITHIN_SECONDS + 2)
        assert time.monotonic() - frozen_at <= HEARD_WITHIN_SECONDS + 0.5
        proxy.thaw()
        wait_until(lambda: ctx.node.auth_cache.trusted, timeout=10)  # caught up again
