"""`floom migrate-store`: a SQLite node's whole store moves to a fresh PostgreSQL database,
and a PostgreSQL node started on it serves the same workers, runs, logs, artifacts, secrets,
keys and triggers; a target holding floom data is refused untouched."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlmodel import SQLModel

from floom.errors import Conflict, InvalidRequest
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.access.secrets import set_secret
from floom.services.context import Context
from floom.services.ops.store_copy import copy_store
from floom.store.db import make_engine
from floom.store.models import Secret
from tests.support.harness import (
    deploy_folder,
    fast_settings,
    live_server,
    make_worker,
    wait_for_run,
)

MANIFEST_YML = """\
name: mover
inputs:
  word: {type: string, required: true}
secrets: [MOVER_TOKEN]
triggers:
  - schedule: {cron: "0 3 * * *", inputs: {word: night}}
"""
RUN_PY = """\
import json, os
from pathlib import Path
print("moving", json.load(open("inputs.json"))["word"], flush=True)
Path(os.environ["FLOOM_OUTPUT_DIR"], "box.txt").write_text(os.environ["MOVER_TOKEN"][:3])
"""


# A fresh PostgreSQL database without any table is the target.
on_fresh_postgres = pytest.mark.parametrize("empty_database_url", ["postgres"], indirect=True)


@on_fresh_postgres
def test_a_sqlite_store_moves_to_a_fresh_postgresql_database_whole(
    tmp_path: Path, empty_database_url: str
) -> None:
    sqlite_url = f"sqlite:///{tmp_path / 'a' / 'floom.db'}"
    with live_server(tmp_path / "a", sqlite_url) as node, node.client() as api:
        api.put("/api/v1/secrets/MOVER_TOKEN", json={"value": "tok-5678"}).raise_for_status()
        deploy_folder(api, make_worker(tmp_path / "w", MANIFEST_YML, {"run.py": RUN_PY}))
        run = api.post("/api/v1/workers/mover/runs", json={"inputs": {"word": "box"}}).json()
        wait_for_run(api, run["id"])
        logs = api.get(f"/api/v1/runs/{run['id']}/logs").json()["items"]
        triggers = api.get("/api/v1/workers/mover/triggers").json()["items"]
        key_names = {k["name"] for k in api.get("/api/v1/keys").json()["items"]}

    copied = copy_store(source_url=sqlite_url, target_url=empty_database_url)
    assert copied.counts["runs"] == 1
    assert copied.counts["secrets"] == 1
    assert copied.counts["run_events"] == len(logs)
    assert copied.counts["triggers"] == 1

    engine = make_engine(empty_database_url)
    with engine.connect() as conn:
        for table in SQLModel.metadata.sorted_tables:
            n = conn.execute(select(func.count()).select_from(table)).scalar_one()
            assert n == copied.counts[table.name], table.name
    engine.dispose()

    with live_server(tmp_path / "b", empty_database_url) as node, node.client() as api:
        moved = api.get(f"/api/v1/runs/{run['id']}").json()
        assert moved["status"] == "succeeded"
        assert api.get(f"/api/v1/runs/{run['id']}/logs").json()["items"] == logs
        assert api.get(f"/api/v1/runs/{run['id']}/artifacts/box.txt").content == b"tok"
        assert api.get("/api/v1/workers/mover/triggers").json()["items"] == triggers
        assert key_names <= {k["name"] for k in api.get("/api/v1/keys").json()["items"]}
        # New rows get new integer ids after the copied ones, and the secret still decrypts.
        again = api.post("/api/v1/workers/mover/runs", json={"inputs": {"word": "two"}}).json()
        assert wait_for_run(api, again["id"])["status"] == "succeeded"
        assert api.get(f"/api/v1/runs/{again['id']}/artifacts/box.txt").content == b"tok"


@on_fresh_postgres
def test_a_target_holding_floom_data_is_refused_and_left_as_it_was(
    tmp_path: Path, empty_database_url: str
) -> None:
    sqlite_url = f"sqlite:///{tmp_path / 'a' / 'floom.db'}"
    Context.open(fast_settings(tmp_path / "a", sqlite_url)).engine.dispose()
    target = Context.open(fast_settings(tmp_path / "b", empty_database_url))
    keys.create_key(target, caller=SYSTEM, scopes=["read"], name="already here")
    with pytest.raises(Conflict) as refused:
        copy_store(source_url=sqlite_url, target_url=empty_database_url)
    assert "empty" in (refused.value.hint or "")
    assert [k.name for k in keys.list_keys(target, caller=SYSTEM)] == ["already here"]
    target.engine.dispose()
    with pytest.raises(InvalidRequest):
        copy_store(source_url=sqlite_url, target_url=sqlite_url)


def test_a_store_a_running_node_serves_is_not_copied_and_the_refusal_names_the_node(
    tmp_path: Path,
) -> None:
    sqlite_url = f"sqlite:///{tmp_path / 'a' / 'floom.db'}"
    target_url = f"sqlite:///{tmp_path / 'b' / 'floom.db'}"
    (tmp_path / "b").mkdir()
    with live_server(tmp_path / "a", sqlite_url, roles="api") as node:
        with pytest.raises(Conflict) as refused:
            copy_store(source_url=sqlite_url, target_url=target_url)
        assert node.ctx.node_id in refused.value.message
        assert "stop floom on the source first" in (refused.value.hint or "")
        assert not (tmp_path / "b" / "floom.db").exists()  # the target was not touched
    # Stopped cleanly, the node no longer holds the store.
    copied = copy_store(source_url=sqlite_url, target_url=target_url)
    assert copied.counts["nodes"] == 1


def test_the_copy_is_one_snapshot_of_the_source_even_while_it_is_written(
    tmp_path: Path, database_url: str
) -> None:
    # A row committed in the source while the copy runs (after it read an earlier table,
    # before a later one) is not copied: every table is read in one snapshot, so the copy
    # never holds half of a change. PostgreSQL's default READ COMMITTED gives each
    # statement a snapshot of its own.
    source = Context.open(fast_settings(tmp_path / "a", database_url))
    try:
        keys.create_key(source, caller=SYSTEM, scopes=["read"], name="before")  # api_keys
        set_secret(source, name="BEFORE_TOKEN", value="value-1", caller=SYSTEM)  # secrets
        written: list[str] = []

        def write_meanwhile(table: str, _rows: int) -> None:
            if table == "api_keys" and not written:
                set_secret(source, name="LATE_TOKEN", value="value-2", caller=SYSTEM)
                written.append(table)

        target_url = f"sqlite:///{tmp_path / 'b.db'}"
        copied = copy_store(
            source_url=database_url, target_url=target_url, progress=write_meanwhile
        )
    finally:
        source.engine.dispose()
    assert written
    assert copied.counts["secrets"] == 1
    engine = make_engine(target_url)
    try:
        with engine.connect() as conn:
            names = conn.execute(select(Secret.name)).scalars().all()  # type: ignore[call-overload]
    finally:
        engine.dispose()
    assert names == ["BEFORE_TOKEN"]
