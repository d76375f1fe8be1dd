"""The nodes view: nodes register and heartbeat in the store; REST, CLI and UI list them,
and a node silent past its lease is shown as lost."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from floom import __version__
from floom.engine.loops.presence import NodePresence
from floom.node import bootstrap_store
from floom.schemas.nodes import WARM_BYTES, warm_of_row, warm_row
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.store.db import session_scope
from floom.store.models import utcnow
from floom.store.nodes import Node
from tests.support.cli import cli
from tests.support.harness import EXAMPLES, LiveServer, fast_settings
from tests.support.web import signed_in_client


@pytest.fixture
def ctx(tmp_path: Path, database_url: str) -> Iterator[Context]:
    """The suite's context with a 30 s node lease: the test reads this node's state through
    three surfaces over several seconds, and under a loaded CI machine a 0.2 s heartbeat
    once went silent past the suite's 3 s lease, so the node showed as lost."""
    context = Context.open(fast_settings(tmp_path / "data", database_url, lease_seconds=30.0))
    yield context
    context.engine.dispose()


def test_nodes_lists_this_node_live_and_a_silent_one_as_lost_in_rest_cli_and_ui(
    server: LiveServer,
) -> None:
    ctx = server.ctx
    with session_scope(ctx.engine, write=True) as s:
        s.add(
            Node(
                id="gone-node",
                roles="executor",
                version="0.0.9",
                lease_seconds=3,
                slots=4,
                slots_in_use=2,
                heartbeat_at=utcnow() - timedelta(seconds=10),
            )
        )
    with server.client() as api:
        items = api.get("/api/v1/nodes").json()["items"]
        read_key = keys.create_key(ctx, caller=SYSTEM, scopes=["read"])[1]
        assert server.client(read_key).get("/api/v1/nodes").status_code == 200
    by_id = {n["id"]: n for n in items}
    me = by_id[ctx.node_id]
    assert me["state"] == "live"
    assert me["version"] == __version__
    assert me["roles"] == ["api", "scheduler", "executor"]
    assert me["slots"] == 4
    assert me["silent_seconds"] < 30
    gone = by_id["gone-node"]
    assert gone["state"] == "lost"
    assert gone["silent_seconds"] >= 10
    assert [n["id"] for n in items] == [ctx.node_id, "gone-node"]  # live ones first

    listed = cli(server, "nodes", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {n["id"]: n["state"] for n in json.loads(listed.stdout)} == {
        ctx.node_id: "live",
        "gone-node": "lost",
    }
    table = cli(server, "nodes")
    assert "gone-node" in table.stdout
    assert "lost" in table.stdout
    assert "2/4" in table.stdout

    page = signed_in_client(server, read_key).get("/nodes")
    assert page.status_code == 200
    assert ctx.node_id in page.text
    assert "badge-lost" in page.text
    assert "2 of 4" in page.text


def test_two_nodes_starting_at_once_on_an_empty_postgres_database_create_one_admin_key_and_one_set_of_examples(  # noqa: E501
    tmp_path: Path, empty_database_url: str
) -> None:
    if not empty_database_url.startswith("postgresql"):
        pytest.skip("SQLite is one process's file; the race is between PostgreSQL nodes")
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def node(name: str) -> None:
        try:
            settings = fast_settings(
                tmp_path / name, empty_database_url, deploy_examples=True, examples_dir=EXAMPLES
            )
            start.wait()
            ctx = Context.open(settings)  # creates the schema: the two race here first
            try:
                bootstrap_store(ctx)
            finally:
                ctx.engine.dispose()
        except BaseException as exc:  # reported below, with the other node's outcome
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    url = empty_database_url.replace("postgresql+psycopg", "postgresql")
    with psycopg.connect(url) as conn:
        admins = conn.execute("SELECT count(*) FROM api_keys WHERE revoked_at IS NULL").fetchone()
        per_worker = conn.execute(
            "SELECT worker_name, count(*) FROM versions GROUP BY worker_name"
        ).fetchall()
    assert admins == (1,)
    shipped = {p.name for p in EXAMPLES.iterdir() if (p / "worker.yml").is_file()}
    assert dict(per_worker) == {name: 1 for name in shipped}
    key_files = [p for p in (tmp_path / "a", tmp_path / "b") if (p / "admin.key").exists()]
    assert len(key_files) == 1


def _warm_stats(worker: str, *, pools: int = 1) -> dict[str, Any]:
    pool = {
        "version": "v-0123456789ab",
        "worker": worker,
        "ready": 2,
        "running": 1,
        "hits": 41,
        "misses": 3,
        "modules": 120,
        "warm_processes_started": 2,
        "rss_bytes": 50 * 2**20,
    }
    return {
        "enabled": True,
        "hits": 41 * pools,
        "misses": 3 * pools,
        "pools": [
            {**pool, "worker": f"{worker}-{i}" if pools > 1 else worker} for i in range(pools)
        ],
    }


def test_every_nodes_warm_pools_are_listed_from_its_heartbeat_in_rest_cli_and_ui(
    server: LiveServer,
) -> None:
    ctx = server.ctx
    with session_scope(ctx.engine, write=True) as s:
        s.add(
            Node(
                id="other-node",
                roles="executor",
                version=__version__,
                lease_seconds=60,
                slots=4,
                warm=warm_row(_warm_stats("resizer")),
            )
        )
    with server.client() as api:
        by_id = {n["id"]: n for n in api.get("/api/v1/nodes").json()["items"]}
    other = by_id["other-node"]["warm"]
    assert other["hits"] == 41
    assert [p["worker"] for p in other["pools"]] == ["resizer"]

    table = cli(server, "nodes")
    assert table.returncode == 0, table.stderr
    assert "warm starts on other-node: 1 pools, 41 hits, 3 misses" in table.stdout
    assert "resizer" in table.stdout
    listed = {n["id"]: n for n in json.loads(cli(server, "nodes", "--json").stdout)}
    assert listed["other-node"]["warm"]["pools"][0]["worker"] == "resizer"

    page = signed_in_client(server, server.admin_key).get("/nodes")
    assert page.status_code == 200
    assert "Warm pools on" in page.text
    assert "resizer" in page.text


def test_this_nodes_heartbeat_keeps_its_warm_pools_bounded_in_its_row(ctx: Context) -> None:
    def kept() -> str | None:
        with session_scope(ctx.engine) as s:
            row = s.get(Node, ctx.node_id)
            assert row is not None
            return row.warm

    stats = _warm_stats("w", pools=3)
    presence = NodePresence(ctx, slots=2, in_use=lambda: 0, warm=lambda: stats)
    presence.start()  # registers
    presence._beat()  # and beats once, with the pools
    health = warm_of_row(kept())
    assert health is not None
    assert [p.worker for p in health.pools] == ["w-0", "w-1", "w-2"]

    stats = _warm_stats("w", pools=400)  # past WARM_BYTES: the totals stay, the pools go
    presence._beat()
    text = kept()
    assert text is not None
    assert len(text) <= WARM_BYTES
    health = warm_of_row(text)
    assert health is not None
    assert health.pools == []
    assert health.hits == 41 * 400

    presence.stop()
    assert kept() is None  # a stopped node keeps no pools


def _e2b_idle(idle: str) -> str:
    e2b = '"count": 1, "budget": 1, "hits": 0, "misses": 0, "pools": []'
    return (
        '{"enabled": true, "pools": [], "hits": 0, "misses": 0, '
        f'"e2b": {{"enabled": true, "idle_seconds": {idle}, {e2b}}}}}'
    )


@pytest.mark.parametrize(
    "stored",
    [
        "{not json",
        '{"enabled": "maybe"}',
        "[]",
        '{"enabled": true, "pools": 5}',
        "x" * 40000,
        # A number JSON has not: answered as null, which `floom nodes` could not read.
        *(_e2b_idle(idle) for idle in ("NaN", "Infinity", "-Infinity", "1e999")),
        # A size past a float's range (shown in MiB, it raised in the CLI and the UI) and a
        # count below zero, in the 32 KiB a row may hold.
        json.dumps(
            {**_warm_stats("w"), "pools": [{**_warm_stats("w")["pools"][0], "rss_bytes": 10**400}]}
        ),
        json.dumps({**_warm_stats("w"), "hits": -1}),
    ],
)
def test_a_node_row_whose_warm_pools_are_not_what_a_node_writes_shows_none(
    server: LiveServer, stored: str
) -> None:
    with session_scope(server.ctx.engine, write=True) as s:
        s.add(Node(id="odd-node", roles="executor", version="1", lease_seconds=60, warm=stored))
    with server.client() as api:
        answer = api.get("/api/v1/nodes")
    assert answer.status_code == 200, answer.text
    (odd,) = [n for n in answer.json()["items"] if n["id"] == "odd-node"]
    assert odd["warm"] is None
    assert cli(server, "nodes").returncode == 0
    assert signed_in_client(server, server.admin_key).get("/nodes").status_code == 200
