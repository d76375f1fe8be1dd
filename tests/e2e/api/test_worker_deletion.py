"""Deleting a worker: triggers stop at once, unfinished runs end, runs are kept or purged with
what they left behind (shared blobs stay), a redeploy starts fresh, and every deletion is
audited. Through the services, REST, the CLI and MCP."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlmodel import col, select
from standardwebhooks.webhooks import Webhook

from floom.errors import Conflict, NotFound
from floom.schemas.audit import AuditEventPublic
from floom.services.access import audit, keys
from floom.services.access.principal import SYSTEM, Principal
from floom.services.context import Context
from floom.services.handoffs import agents as handoff_agents
from floom.services.handoffs import bridge as handoff_bridge
from floom.services.handoffs import jobs as handoffs
from floom.services.runs import agent as agent_runs
from floom.services.runs import lifecycle as runs
from floom.services.runs import rules as run_rules
from floom.services.triggers import composio as composio_events
from floom.services.triggers import registry as triggers
from floom.services.triggers import schedules
from floom.services.workers import versions as workers
from floom.services.workers.deletion import delete_worker
from floom.store.agents import Approval, MemoryEntry, ToolCall, Transcript
from floom.store.audit import AuditEvent
from floom.store.db import session_scope
from floom.store.handoffs import Agent, AgentRole
from floom.store.models import Artifact, Blob, Run, RunEvent, Version
from floom.store.triggers import Trigger
from floom.triggers.signatures import sign_floom
from floom.vocabulary import ApprovalKind, ApprovalStatus, ToolCallStatus
from tests.support.cli import cli
from tests.support.harness import (
    REPO,
    LiveServer,
    deploy_folder,
    deploy_in_store,
    fast_settings,
    make_worker,
    wait_for_run,
    wait_until,
)
from tests.support.mcp_clients import call, call_error, http_client, stdio_client
from tests.support.web import csrf_of, signed_in_client

MONDAY = datetime(2025, 1, 6, 8, 0, tzinfo=UTC)


def admin(ctx: Context) -> Principal:
    """A real admin key's caller: deletion reads the caller's key again in its transaction."""
    key, _ = keys.create_key(ctx, scopes=["admin"], name="test admin", caller=SYSTEM)
    return Principal.of_key(key)


PLAIN = "print('hello')\n"
SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(120)\n"
WITH_ARTIFACT = """\
import json, os
from pathlib import Path
Path(os.environ["FLOOM_OUTPUT_DIR"], "report.txt").write_text("report of the doomed worker")
Path("result.json").write_text(json.dumps({"outputs": {}}))
"""
HOOK_SECRET = "hook-secret-for-deletion-tests"


def deploy(ctx: Context, folder: Path, manifest: str, script: str = PLAIN) -> str:
    return deploy_in_store(ctx, make_worker(folder, manifest, {"run.py": script})).version.id


def blob_exists(ctx: Context, digest: str) -> bool:
    with session_scope(ctx.engine) as s:
        return s.get(Blob, digest) is not None


def rows(ctx: Context, model: Any, *where: Any) -> list[Any]:
    with session_scope(ctx.engine) as s:
        return list(s.exec(select(model).where(*where)).all())


def finish_with(ctx: Context, run: Run, *, artifacts: list[tuple[str, bytes]]) -> None:
    """Stand for an executor: end the run with these artifacts, a tool call, an approval
    and an agent transcript with a stored workspace."""
    workspace = agent_runs.put_blob(ctx, f"workspace of {run.id}".encode())
    staged = agent_runs.stage_artifacts(ctx, [(n, d, "text/plain") for n, d in artifacts])
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(Run, run.id)
        assert row is not None
        row.status = run_rules.SUCCEEDED
        s.add(row)
        agent_runs.replace_artifacts(s, run_id=run.id, artifacts=staged)
        s.add(
            ToolCall(
                id=f"tc_{run.id[-12:]}", run_id=run.id, seq=1, tool="echo", status=ToolCallStatus.OK
            )
        )
        s.add(
            Approval(
                id=f"apr_{run.id[-12:]}",
                run_id=run.id,
                worker_name=run.worker_name,
                kind=ApprovalKind.RUN,
                status=ApprovalStatus.APPROVED,
            )
        )
        s.add(
            Transcript(
                run_id=run.id, worker_name=run.worker_name, model="m", workspace_digest=workspace
            )
        )
        s.add(MemoryEntry(worker_name=run.worker_name, key="k", value_json="1", run_id=run.id))


# -- the service, on SQLite and PostgreSQL -------------------------------------------------------


def test_deleting_keeps_runs_readable_and_stops_what_was_unfinished(
    ctx: Context, tmp_path: Path
) -> None:
    version = deploy(ctx, tmp_path / "doomed", "name: doomed\n")
    done = runs.create_run(ctx, caller=SYSTEM, worker_name="doomed")
    finish_with(ctx, done, artifacts=[("report.txt", b"kept report")])
    queued = runs.create_run(ctx, caller=SYSTEM, worker_name="doomed")
    paused = runs.create_run(ctx, caller=SYSTEM, worker_name="doomed")
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(Run, paused.id)
        assert row is not None
        row.status = run_rules.AWAITING_APPROVAL
        s.add(row)
        s.add(
            Approval(
                id="apr_pending", run_id=paused.id, worker_name="doomed", kind=ApprovalKind.RUN
            )
        )

    result = delete_worker(ctx, name="doomed", purge_runs=False, caller=admin(ctx))

    assert (result.runs_kept, result.runs_purged, result.runs_cancelled) == (3, 0, 2)
    assert result.approvals_closed == 1
    assert result.versions == [version]
    with pytest.raises(NotFound):
        workers.get_worker(ctx, caller=SYSTEM, name="doomed")
    assert runs.get_run(ctx, caller=SYSTEM, run_id=queued.id).status == run_rules.CANCELLED
    assert runs.get_run(ctx, caller=SYSTEM, run_id=paused.id).status == run_rules.CANCELLED
    assert rows(ctx, Approval, Approval.id == "apr_pending")[0].status == "cancelled"
    kept, _ = runs.list_runs(ctx, caller=SYSTEM, worker="doomed")
    assert {r.id for r in kept} == {done.id, queued.id, paused.id}
    art, data = runs.read_artifact(ctx, caller=SYSTEM, run_id=done.id, name="report.txt")
    assert data == b"kept report"
    assert runs.version_of_run(ctx, caller=SYSTEM, run=done).id == version
    assert blob_exists(ctx, art.digest)
    with pytest.raises(NotFound):
        runs.create_run(ctx, caller=SYSTEM, worker_name="doomed")


def test_purging_removes_runs_and_their_blobs_but_keeps_blobs_others_refer_to(
    ctx: Context, tmp_path: Path
) -> None:
    deploy(ctx, tmp_path / "doomed", "name: doomed\n")
    deploy(ctx, tmp_path / "other", "name: other\n")
    other_version = workers.get_version(
        ctx,
        caller=SYSTEM,
        version_id=workers.get_worker(ctx, caller=SYSTEM, name="other").active_version_id or "",
    )
    doomed_version = workers.get_version(
        ctx,
        caller=SYSTEM,
        version_id=workers.get_worker(ctx, caller=SYSTEM, name="doomed").active_version_id or "",
    )
    doomed_run = runs.create_run(ctx, caller=SYSTEM, worker_name="doomed")
    finish_with(
        ctx,
        doomed_run,
        artifacts=[
            ("unique.txt", b"only the doomed worker wrote this"),
            ("shared.txt", b"both workers wrote this"),
        ],
    )
    with session_scope(ctx.engine, write=True) as s:
        # Blobs are content-addressed: an artifact may be the very blob of another's version.
        s.add(
            Artifact(
                run_id=doomed_run.id,
                name="archive.tgz",
                size=1,
                digest=other_version.digest,
                content_type="application/gzip",
            )
        )
    other_run = runs.create_run(ctx, caller=SYSTEM, worker_name="other")
    finish_with(ctx, other_run, artifacts=[("shared.txt", b"both workers wrote this")])
    digests = {a.name: a.digest for a in rows(ctx, Artifact, Artifact.run_id == doomed_run.id)}
    workspace = rows(ctx, Transcript, Transcript.run_id == doomed_run.id)[0].workspace_digest

    result = delete_worker(ctx, name="doomed", purge_runs=True, caller=admin(ctx))

    assert (result.runs_purged, result.runs_kept) == (1, 0)
    with pytest.raises(NotFound):
        runs.get_run(ctx, caller=SYSTEM, run_id=doomed_run.id)
    for model in (RunEvent, Artifact, ToolCall, Approval, Transcript):
        assert rows(ctx, model, model.run_id == doomed_run.id) == [], model
    assert rows(ctx, Version, Version.worker_name == "doomed") == []
    assert rows(ctx, Version, Version.id == doomed_version.id) == []
    assert rows(ctx, MemoryEntry, MemoryEntry.worker_name == "doomed") == []
    assert not blob_exists(ctx, digests["unique.txt"])
    assert not blob_exists(ctx, doomed_version.digest)
    assert not blob_exists(ctx, workspace or "")
    assert result.blobs_deleted == 3
    # Still referred to by the other worker's run and version.
    assert blob_exists(ctx, digests["shared.txt"])
    assert blob_exists(ctx, digests["archive.tgz"])
    assert runs.read_artifact(ctx, caller=SYSTEM, run_id=other_run.id, name="shared.txt")[1] == (
        b"both workers wrote this"
    )
    assert workers.load_bundle(ctx, version=other_version).digest == other_version.digest
    assert [r.id for r in runs.list_runs(ctx, caller=SYSTEM, worker="other")[0]] == [other_run.id]


def test_a_deleted_workers_schedule_never_fires_again(ctx: Context, tmp_path: Path) -> None:
    manifest = 'name: ticker\ntriggers:\n  - schedule: {cron: "*/15 * * * *", overlap: allow}\n'
    deploy(ctx, tmp_path / "ticker", manifest)
    with session_scope(ctx.engine, write=True) as s:
        for t in s.exec(select(Trigger).where(Trigger.worker_name == "ticker")).all():
            t.last_fire_at = MONDAY
            s.add(t)
    schedules.fire_due(ctx, now=MONDAY + timedelta(minutes=15, seconds=1))
    assert len(runs.list_runs(ctx, caller=SYSTEM, worker="ticker", trigger="schedule")[0]) == 1

    result = delete_worker(ctx, name="ticker", purge_runs=False, caller=admin(ctx))

    assert result.triggers_removed == 1
    assert rows(ctx, Trigger, Trigger.worker_name == "ticker") == []
    upcoming = schedules.fire_due(ctx, now=MONDAY + timedelta(days=2))
    assert upcoming is None  # nothing left to schedule
    assert len(runs.list_runs(ctx, caller=SYSTEM, worker="ticker", trigger="schedule")[0]) == 1


def test_a_redeploy_of_the_name_starts_at_its_first_version_without_old_triggers(
    ctx: Context, tmp_path: Path
) -> None:
    schedule = '  - schedule: {cron: "0 3 * * *"}\n'
    first = deploy(ctx, tmp_path / "a", f"name: phoenix\ntriggers:\n{schedule}")
    second = deploy(ctx, tmp_path / "b", f"name: phoenix\ndescription: v2\ntriggers:\n{schedule}")
    old_run = runs.create_run(ctx, caller=SYSTEM, worker_name="phoenix")
    old_triggers = {
        t.id for t in triggers.list_triggers(ctx, caller=SYSTEM, worker_name="phoenix")[1]
    }
    runs.cancel_run(ctx, caller=SYSTEM, run_id=old_run.id)

    delete_worker(ctx, name="phoenix", purge_runs=False, caller=admin(ctx))
    again = deploy(ctx, tmp_path / "a", f"name: phoenix\ntriggers:\n{schedule}")

    assert again == first
    assert [v.id for v in workers.list_versions(ctx, caller=SYSTEM, name="phoenix")] == [first]
    new_triggers = {
        t.id for t in triggers.list_triggers(ctx, caller=SYSTEM, worker_name="phoenix")[1]
    }
    assert len(new_triggers) == 1
    assert not new_triggers & old_triggers
    with pytest.raises(NotFound):  # the old incarnation's other version is gone from the name
        workers.rollback(ctx, caller=SYSTEM, name="phoenix", version_id=second)
    with pytest.raises(NotFound):
        runs.create_run(ctx, caller=SYSTEM, worker_name="phoenix", version_id=second)
    assert (
        runs.version_of_run(ctx, caller=SYSTEM, run=old_run).id == second
    )  # the kept run still reads it
    fresh = runs.create_run(ctx, caller=SYSTEM, worker_name="phoenix")
    assert fresh.version_id == first


def test_every_deletion_is_audited_with_its_actor_and_counts(ctx: Context, tmp_path: Path) -> None:
    version = deploy(ctx, tmp_path / "doomed", "name: doomed\n")
    runs.create_run(ctx, caller=SYSTEM, worker_name="doomed")

    caller = admin(ctx)
    result = delete_worker(ctx, name="doomed", purge_runs=True, caller=caller)

    events, _ = audit.list_events(
        ctx, caller=SYSTEM, type=audit.WORKER_DELETED, subject="worker:doomed"
    )
    assert [e.id for e in events] == [result.deletion_id]
    body = AuditEventPublic.of(events[0]).model_dump()
    assert body["actor"] == {"key_id": caller.key_id, "label": "test admin"}
    assert body["payload"]["versions"] == [version]
    assert body["payload"]["runs_purged"] == 1
    assert body["payload"]["purge_runs"] is True


def test_deleting_an_unknown_worker_is_not_found_and_records_nothing(ctx: Context) -> None:
    with pytest.raises(NotFound) as caught:
        delete_worker(ctx, name="ghost", purge_runs=True, caller=admin(ctx))
    assert caught.value.hint
    assert rows(ctx, AuditEvent, col(AuditEvent.id).is_not(None)) == []


# -- REST, CLI and MCP against a live server ---------------------------------------------------


def test_over_rest_a_running_run_ends_cancelled_and_kept_runs_stay_listed(
    server: LiveServer, tmp_path: Path
) -> None:
    api = server.client()
    deploy_folder(api, make_worker(tmp_path / "slow", "name: slow\n", {"run.py": SLEEPER}))
    run_id = api.post("/api/v1/workers/slow/runs", json={}).json()["id"]
    wait_until(lambda: api.get(f"/api/v1/runs/{run_id}").json()["status"] == "running")

    resp = api.delete("/api/v1/workers/slow")

    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["deleted"] is True
    assert body["runs_kept"] == 1
    assert (body["runs_stopping"], body["runs_cancelled"]) == (1, 0)
    assert wait_for_run(api, run_id)["status"] == "cancelled"
    assert api.get("/api/v1/workers/slow").status_code == 404
    listed = api.get("/api/v1/runs", params={"worker": "slow"}).json()["items"]
    assert [r["id"] for r in listed] == [run_id]
    assert api.get(f"/api/v1/runs/{run_id}/logs").status_code == 200
    page = signed_in_client(server, server.admin_key).get(f"/runs/{run_id}")
    assert page.status_code == 200
    assert "(deleted)" in page.text
    assert "Replay" not in page.text


def test_over_rest_a_purge_waits_for_a_running_run_to_stop_then_removes_it(
    server: LiveServer, tmp_path: Path
) -> None:
    api = server.client()
    deploy_folder(api, make_worker(tmp_path / "slow", "name: slow\n", {"run.py": SLEEPER}))
    run_id = api.post("/api/v1/workers/slow/runs", json={}).json()["id"]
    wait_until(lambda: api.get(f"/api/v1/runs/{run_id}").json()["status"] == "running")

    resp = api.delete("/api/v1/workers/slow", params={"purge_runs": "true"})

    assert resp.status_code == 200, resp.text
    assert resp.json()["runs_purged"] == 1
    assert api.get(f"/api/v1/runs/{run_id}").status_code == 404
    assert api.get("/api/v1/runs", params={"worker": "slow"}).json()["items"] == []


def test_a_deleted_workers_webhook_answers_as_no_webhook_does(
    server: LiveServer, tmp_path: Path
) -> None:
    api = server.client()
    api.put("/api/v1/secrets/DOOMED_HOOK", json={"value": HOOK_SECRET})
    manifest = (
        "name: hooked\ninputs: {event: object}\n"
        "triggers:\n  - webhook: {signature: hmac-sha256, secret: DOOMED_HOOK}\n"
    )
    deploy_folder(api, make_worker(tmp_path / "hooked", manifest, {"run.py": PLAIN}))

    def post() -> int:
        body = b"{}"
        headers = sign_floom(secret=HOOK_SECRET, body=body, timestamp=int(time.time()))
        headers["Content-Type"] = "application/json"
        with server.client(key="") as anonymous:
            return anonymous.post("/hooks/hooked", content=body, headers=headers).status_code

    assert post() in (200, 202)
    assert api.delete("/api/v1/workers/hooked").status_code == 200
    # The one answer of /hooks to a request no webhook verifies (test_hook_boundaries.py).
    assert post() == 401
    assert api.get("/api/v1/secrets").json()["items"]  # secrets are global: they stay


def test_read_and_run_keys_may_not_delete_and_only_admins_read_the_audit(
    server: LiveServer, tmp_path: Path
) -> None:
    api = server.client()
    deploy_folder(api, make_worker(tmp_path / "w", "name: keepme\n", {"run.py": PLAIN}))
    for scope in ("read", "run"):
        _, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=[scope], name=f"{scope} key")
        with server.client(key=token) as client:
            resp = client.delete("/api/v1/workers/keepme")
            assert resp.status_code == 403
            assert resp.json()["error"]["code"] == "forbidden"
    assert api.get("/api/v1/workers/keepme").status_code == 200
    deployer, token = keys.create_key(
        server.ctx, caller=SYSTEM, scopes=["deploy"], name="ci deployer"
    )
    with server.client(key=token) as client:
        assert client.delete("/api/v1/workers/keepme").status_code == 200
        assert client.get("/api/v1/audit").status_code == 403
    events = api.get("/api/v1/audit", params={"type": "worker.deleted"}).json()["items"]
    assert events[0]["actor"] == {"key_id": deployer.id, "label": "ci deployer"}
    assert events[0]["subject"] == "worker:keepme"
    missing = api.delete("/api/v1/workers/keepme")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    assert missing.json()["error"]["hint"]


def test_the_cli_asks_before_deleting_and_deletes_with_yes(
    server: LiveServer, tmp_path: Path
) -> None:
    api = server.client()
    deploy_folder(api, make_worker(tmp_path / "w", "name: clidel\n", {"run.py": WITH_ARTIFACT}))
    run_id = api.post("/api/v1/workers/clidel/runs", json={}).json()["id"]
    assert wait_for_run(api, run_id)["status"] == "succeeded"

    declined = cli(server, "workers", "delete", "clidel", stdin="n\n")
    assert declined.returncode == 1
    assert "not deleted" in declined.stderr
    assert api.get("/api/v1/workers/clidel").status_code == 200

    listed = cli(server, "workers")
    assert listed.returncode == 0
    assert "clidel" in listed.stdout
    done = cli(server, "workers", "delete", "clidel", "--purge-runs", "--yes")
    assert done.returncode == 0, done.stderr
    assert "deleted worker clidel" in done.stdout
    assert "1 run(s) purged" in done.stdout
    assert api.get(f"/api/v1/runs/{run_id}").status_code == 404

    unknown = cli(server, "workers", "delete", "clidel", "--yes")
    assert unknown.returncode == 1
    assert "no worker named 'clidel'" in unknown.stderr
    assert "hint:" in unknown.stderr


def test_the_mcp_tool_needs_confirm_and_the_deploy_scope(
    server: LiveServer, tmp_path: Path
) -> None:
    api = server.client()
    deploy_folder(api, make_worker(tmp_path / "w", "name: mcpdel\n", {"run.py": PLAIN}))
    _, reader = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="reader")

    async def session() -> None:
        async with http_client(server, key=reader) as mcp:
            refused = await call_error(mcp, "delete_worker", worker="mcpdel", confirm=True)
            assert refused["code"] == "forbidden"
        async with http_client(server) as mcp:
            unconfirmed = await call_error(mcp, "delete_worker", worker="mcpdel")
            assert unconfirmed["code"] == "invalid_request"
            assert "confirm" in unconfirmed["hint"]
            assert api.get("/api/v1/workers/mcpdel").status_code == 200
            deleted = await call(mcp, "delete_worker", worker="mcpdel", confirm=True)
            assert deleted["deleted"] is True
            assert deleted["runs_kept"] == 0
            missing = await call_error(mcp, "delete_worker", worker="mcpdel", confirm=True)
            assert missing["code"] == "not_found"

    anyio.run(session)
    assert api.get("/api/v1/workers/mcpdel").status_code == 404


def test_the_stdio_mcp_server_deletes_through_the_rest_api(
    server: LiveServer, tmp_path: Path
) -> None:
    api = server.client()
    deploy_folder(api, make_worker(tmp_path / "w", "name: stdiodel\n", {"run.py": PLAIN}))
    run_id = api.post("/api/v1/workers/stdiodel/runs", json={}).json()["id"]
    wait_for_run(api, run_id)

    async def session() -> None:
        async with stdio_client(server) as mcp:
            unconfirmed = await call_error(mcp, "delete_worker", worker="stdiodel")
            assert unconfirmed["code"] == "invalid_request"
            deleted = await call(
                mcp, "delete_worker", worker="stdiodel", purge_runs=True, confirm=True
            )
            assert deleted["runs_purged"] == 1
            assert deleted["purge_runs"] is True

    anyio.run(session)
    assert api.get(f"/api/v1/runs/{run_id}").status_code == 404


def test_a_schedule_tick_racing_the_deletion_leaves_no_run_behind(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = 'name: racer\ntriggers:\n  - schedule: {cron: "*/15 * * * *", overlap: allow}\n'
    deploy(ctx, tmp_path / "racer", manifest)
    with session_scope(ctx.engine, write=True) as s:
        for t in s.exec(select(Trigger).where(Trigger.worker_name == "racer")).all():
            t.last_fire_at = MONDAY
            s.add(t)
    read_version = workers.get_version

    def deleted_meanwhile(*args: Any, **kwargs: Any) -> Version:
        # The tick has read the worker; the deletion commits before the run is inserted.
        monkeypatch.setattr(workers, "get_version", read_version)
        delete_worker(ctx, name="racer", purge_runs=False, caller=admin(ctx))
        return read_version(*args, **kwargs)

    monkeypatch.setattr(workers, "get_version", deleted_meanwhile)
    schedules.fire_due(ctx, now=MONDAY + timedelta(minutes=15, seconds=1))

    assert rows(ctx, Run, Run.worker_name == "racer") == []
    with pytest.raises(NotFound):
        workers.get_worker(ctx, caller=SYSTEM, name="racer")


def test_the_worker_page_deletes_only_with_csrf_the_typed_name_and_the_deploy_scope(
    server: LiveServer, tmp_path: Path
) -> None:
    api = server.client()
    deploy_folder(api, make_worker(tmp_path / "w", "name: uidel\n", {"run.py": PLAIN}))
    _, runner = keys.create_key(server.ctx, caller=SYSTEM, scopes=["run"], name="runner")
    limited = signed_in_client(server, runner)
    page = limited.get("/workers/uidel")
    assert "Delete this worker" not in page.text
    refused = limited.post(
        "/workers/uidel/delete", data={"csrf": csrf_of(page.text), "confirm_name": "uidel"}
    )
    assert refused.status_code == 403
    # The scope is decided before the typed name is looked at: a run key learns nothing.
    mistyped_by_runner = limited.post(
        "/workers/uidel/delete", data={"csrf": csrf_of(page.text), "confirm_name": "nope"}
    )
    assert mistyped_by_runner.status_code == 403

    browser = signed_in_client(server, server.admin_key)
    page = browser.get("/workers/uidel")
    assert "Delete this worker" in page.text
    forged = browser.post("/workers/uidel/delete", data={"confirm_name": "uidel"})
    assert forged.status_code == 403
    mistyped = browser.post(
        "/workers/uidel/delete", data={"csrf": csrf_of(page.text), "confirm_name": "uidle"}
    )
    assert mistyped.status_code == 400
    assert "type uidel" in mistyped.text
    assert api.get("/api/v1/workers/uidel").status_code == 200

    done = browser.post(
        "/workers/uidel/delete",
        data={"csrf": csrf_of(page.text), "confirm_name": "uidel", "purge_runs": "on"},
    )
    assert done.status_code == 303
    assert done.headers["location"] == "/?notice=purged"
    assert "Deleted" in browser.get(done.headers["location"]).text
    assert api.get("/api/v1/workers/uidel").status_code == 404
    events = api.get("/api/v1/audit", params={"subject": "worker:uidel"}).json()["items"]
    assert events[0]["payload"]["purge_runs"] is True


COMPOSIO_SECRET = "whsec_" + "ZGVsZXRpb24tdGVzdC1jb21wb3Npby1zZWNyZXQtMDE="


def test_a_deleted_workers_composio_and_handoff_triggers_take_nothing_more(
    tmp_path: Path, database_url: str
) -> None:
    ctx = Context.open(
        fast_settings(tmp_path / "data", database_url, composio_webhook_secret=COMPOSIO_SECRET)
    )
    try:
        handoff_agents.create_role(ctx, caller=SYSTEM, name="reviewer")
        manifest = (
            "name: listener\ninputs: {event: object}\ntriggers:\n"
            "  - composio: {event: GITHUB_COMMIT_EVENT}\n  - handoff: {role: reviewer}\n"
        )
        deploy(ctx, tmp_path / "listener", manifest)
        handoff_bridge.tick(ctx)  # the worker's agent now holds the role
        label = handoff_bridge.agent_label("listener")
        (agent,) = rows(ctx, Agent, Agent.label == label)
        assert rows(ctx, AgentRole, AgentRole.agent_id == agent.id)

        result = delete_worker(ctx, name="listener", purge_runs=False, caller=admin(ctx))

        assert result.triggers_removed == 2
        assert rows(ctx, AgentRole, AgentRole.agent_id == agent.id) == []
        _, admin_token = keys.create_key(ctx, caller=SYSTEM, scopes=["admin"], name="publisher")
        admin_key = Principal.of_key(keys.authenticate(ctx, admin_token))
        job = handoffs.create_job(ctx, actor=admin_key, summary="review this", role="reviewer")
        assert handoff_bridge.tick(ctx) == 0
        assert handoffs.get_job(ctx, actor=admin_key, job_id=job.row.id).row.status == "published"

        body = json.dumps(
            {
                "id": "msg_1",
                "type": "composio.trigger.message",
                "metadata": {"trigger_slug": "GITHUB_COMMIT_EVENT", "connected_account_id": "ca"},
                "data": {"sha": "abc"},
            }
        )
        now = datetime.now(UTC)
        headers = {
            "webhook-id": "msg_1",
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": Webhook(COMPOSIO_SECRET).sign("msg_1", now, body),
        }
        (received,) = composio_events.receive_composio(ctx, headers=headers, body=body.encode())
        assert received.delivery.outcome == "unmatched"
        assert rows(ctx, Run, Run.worker_name == "listener") == []
    finally:
        ctx.engine.dispose()


def test_a_deletion_failing_midway_leaves_everything_in_place(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = 'name: sturdy\ntriggers:\n  - schedule: {cron: "0 3 * * *"}\n'
    version = deploy(ctx, tmp_path / "sturdy", manifest)
    done = runs.create_run(ctx, caller=SYSTEM, worker_name="sturdy")
    finish_with(ctx, done, artifacts=[("a.txt", b"still here")])

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the audit trail is unavailable")

    monkeypatch.setattr(audit, "record", broken)
    with pytest.raises(RuntimeError):
        delete_worker(ctx, name="sturdy", purge_runs=True, caller=admin(ctx))

    assert workers.get_worker(ctx, caller=SYSTEM, name="sturdy").active_version_id == version
    assert len(triggers.list_triggers(ctx, caller=SYSTEM, worker_name="sturdy")[1]) == 1
    assert runs.read_artifact(ctx, caller=SYSTEM, run_id=done.id, name="a.txt")[1] == b"still here"
    assert [v.id for v in workers.list_versions(ctx, caller=SYSTEM, name="sturdy")] == [version]
    assert rows(ctx, ToolCall, ToolCall.run_id == done.id)


def test_a_purge_refuses_while_a_run_will_not_stop_and_deletes_nothing(
    ctx: Context, tmp_path: Path
) -> None:
    deploy(ctx, tmp_path / "stuck", "name: stuck\n")
    run = runs.create_run(ctx, caller=SYSTEM, worker_name="stuck")
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(Run, run.id)
        assert row is not None
        row.status = run_rules.RUNNING  # held by an executor that does not answer
        s.add(row)

    with pytest.raises(Conflict) as caught:
        delete_worker(ctx, name="stuck", purge_runs=True, caller=admin(ctx), stop_wait_seconds=0.3)

    assert caught.value.details == {"running": [run.id]}
    assert workers.get_worker(ctx, caller=SYSTEM, name="stuck")
    assert runs.get_run(
        ctx, caller=SYSTEM, run_id=run.id
    ).cancel_requested  # asked to stop all the same
    assert rows(ctx, AuditEvent, col(AuditEvent.id).is_not(None)) == []
    kept = delete_worker(ctx, name="stuck", purge_runs=False, caller=admin(ctx))
    assert (kept.runs_kept, kept.runs_stopping) == (1, 1)


OTHER_NODE = """\
import sys
from floom.errors import FloomError
from floom.services.runs import lifecycle as runs
from floom.services.workers import versions as workers
from floom.services.context import Context
from floom.services.access.principal import SYSTEM
from tests.support.harness import fast_settings

ctx = Context.open(fast_settings(sys.argv[1], sys.argv[2]))
workers.get_version(ctx, version_id=sys.argv[3], worker_name="twin", caller=SYSTEM)
print("cached", flush=True)
sys.stdin.readline()
try:
    runs.create_run(ctx, worker_name="twin", version_id=sys.argv[3], caller=SYSTEM)
    print("created", flush=True)
except FloomError as exc:
    print(exc.code, flush=True)
"""


def test_another_node_cannot_run_a_version_retired_by_a_deletion_it_had_cached(
    ctx: Context, tmp_path: Path, database_url: str
) -> None:
    old = deploy(ctx, tmp_path / "a", "name: twin\n")
    deploy(ctx, tmp_path / "b", "name: twin\ndescription: second\n")
    node = subprocess.Popen(
        [sys.executable, "-c", OTHER_NODE, str(tmp_path / "node2"), database_url, old],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert node.stdout is not None
        assert node.stdin is not None
        assert node.stdout.readline().strip() == "cached"
        delete_worker(ctx, name="twin", purge_runs=False, caller=admin(ctx))
        deploy(ctx, tmp_path / "b", "name: twin\ndescription: second\n")
        node.stdin.write("go\n")
        node.stdin.flush()
        assert node.stdout.readline().strip() == "not_found"
    finally:
        node.kill()
        node.communicate(timeout=30)  # closes its pipes too
    assert rows(ctx, Run, Run.worker_name == "twin") == []


def test_on_postgresql_a_deletion_waits_for_a_run_being_created_then_cancels_it(
    ctx: Context, tmp_path: Path
) -> None:
    if ctx.engine.dialect.name != "postgresql":
        pytest.skip("SQLite's write transactions are serial: there is no overlap to order")
    deploy(ctx, tmp_path / "contended", "name: contended\n")
    inside, release = threading.Event(), threading.Event()
    created: list[Run] = []
    deleted: list[Any] = []

    def hold(s: Any, run: Run) -> None:
        inside.set()
        assert release.wait(timeout=30)

    creator = threading.Thread(
        target=lambda: created.append(
            runs.create_run(ctx, caller=SYSTEM, worker_name="contended", in_transaction=hold)
        )
    )
    deleter = threading.Thread(
        target=lambda: deleted.append(
            delete_worker(ctx, name="contended", purge_runs=False, caller=admin(ctx))
        )
    )
    creator.start()
    assert inside.wait(timeout=30)
    deleter.start()

    def deletion_waits_on_a_lock() -> bool:
        with ctx.engine.connect() as conn:
            waiting = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ).scalar()
        return bool(waiting)

    try:
        wait_until(deletion_waits_on_a_lock, timeout=10)
    finally:
        release.set()
        creator.join(timeout=30)
        deleter.join(timeout=60)
    (run,) = created
    (result,) = deleted
    assert runs.get_run(ctx, caller=SYSTEM, run_id=run.id).status == run_rules.CANCELLED
    assert result.runs_cancelled == 1
    assert result.runs_kept == 1
    with pytest.raises(NotFound):
        workers.get_worker(ctx, caller=SYSTEM, name="contended")
