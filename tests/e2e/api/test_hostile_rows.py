"""Every view survives any row the store may hold: JSON columns written straight into the
store (deep nesting, a 5,000-digit integer, NaN, text that is not JSON, the wrong type) are
shown bounded or marked on every REST read, every MCP read tool, the CLI and the web UI, and
the worker that holds them can still be purged."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from itertools import product
from pathlib import Path

import anyio
import pytest
from sqlmodel import Session

from floom.engine.collect import read_result
from floom.errors import RunErrorCode, StateInvalid
from floom.services.alerts.rules import routes_for
from floom.services.alerts.watch import watch_schedules
from floom.services.triggers.schedules import fire_due
from floom.services.workers import state as worker_state
from floom.services.workers.versions import forget_versions
from floom.store.agents import Approval, MemoryEntry, ToolCall, Transcript
from floom.store.audit import AuditEvent
from floom.store.db import session_scope
from floom.store.handoffs import Job, JobEvent, Role
from floom.store.models import (
    AlertChannel,
    AlertRule,
    Delivery,
    Run,
    RunEvent,
    Version,
    Worker,
    WorkerState,
    utcnow,
)
from floom.store.replays import Replay
from floom.store.triggers import Trigger, WebhookDelivery
from floom.ui import admin as ui_admin
from floom.ui import app as ui
from floom.ui import approvals as ui_approvals
from floom.ui import handoffs as ui_handoffs
from floom.ui import monitoring as ui_monitoring
from floom.ui import ops as ui_ops
from floom.ui import replays as ui_replays
from floom.ui import runs as ui_runs
from floom.vocabulary import (
    ApprovalKind,
    ChannelKind,
    DeliveryPurpose,
    DeliveryStatus,
    JobStatus,
    RunStatus,
    ToolCallStatus,
    TriggerKind,
)
from tests.support.harness import LiveServer, deploy_folder, make_worker
from tests.support.mcp_clients import call_raw, http_client, text_of
from tests.support.web import signed_in_client

DEEP = "[" * 300 + "]" * 300
HOSTILE = {
    "deep": DEEP,
    "deep_in_object": '{"a": ' + DEEP + "}",
    "deeper_than_the_parser": "[" * 5000 + "]" * 5000,
    "not_finite": '{"x": NaN, "y": Infinity, "z": -Infinity, "w": 1e400}',
    "huge_integer": '{"x": ' + "9" * 5000 + "}",
    "not_json": '{"x": ',
    "a_string": '"just text"',
    "a_number": "5",
    "null": "null",
    "a_list": "[1, 2]",
}
WORKER = """\
name: hostile
description: Holds rows nobody should have written.
outputs:
  x: object
"""
# CLI commands run at once in the CLI walk: two, the cores CI has; more would take cores
# from the other xdist worker's timing-sensitive sandbox tests (see ./dev test).
CLI_AT_ONCE = 2
# Streams hold their connection until the run ends; they have no JSON body to walk.
STREAMS = re.compile(r"/stream$")


# Workers whose active version's stored worker.yml floom cannot read back, by how.
UNREADABLE_MANIFESTS = {
    "hostile-not-json": '{"name": ',
    "hostile-deep": DEEP,
    "hostile-shape": '{"name": 5, "kind": ["script"]}',
}


def _seed(server: LiveServer, tmp: Path) -> dict[str, list[str]]:
    with server.client() as api:
        version = deploy_folder(api, make_worker(tmp / "w", WORKER, {"run.py": "print(1)\n"}))
        unreadable = {
            name: deploy_folder(
                api, make_worker(tmp / name, f"name: {name}\n", {"run.py": "print(1)\n"})
            )["version"]["id"]
            for name in UNREADABLE_MANIFESTS
        }
    version_id = version["version"]["id"]
    # A read then a write: the write lock is taken at BEGIN (a plain session's upgrade from a
    # read can meet a server's write on SQLite and fail at once as "database is locked").
    with session_scope(server.ctx.engine, write=True) as s:
        for name, text in UNREADABLE_MANIFESTS.items():
            row = s.get(Version, unreadable[name])
            assert row is not None
            row.manifest_json = text
            s.add(row)
    forget_versions(list(unreadable.values()))  # as a node started after the change reads them
    run_ids, approval_ids, job_ids, delivery_ids = [], [], [], []
    channels, alert_delivery_ids = [], []
    with Session(server.ctx.engine) as s:
        role = Role(id="rol_hostile", name="hostile-role")
        s.add(role)
        for i, (label, text) in enumerate(HOSTILE.items()):
            run_id = f"run_hostile{i:02d}"
            run_ids.append(run_id)
            s.add(
                Run(
                    id=run_id,
                    worker_name="hostile",
                    version_id=version_id,
                    status=RunStatus.SUCCEEDED,
                    inputs_json=text,
                    outputs_json=text,
                    error_code=RunErrorCode.WORKER_ERROR,
                    error_message=text[:2000],
                )
            )
            s.add(RunEvent(run_id=run_id, seq=1, stream="stdout", line=f"{label}\x1b[2J"))
            s.add(
                ToolCall(
                    id=f"tc_hostile{i:02d}",
                    run_id=run_id,
                    seq=1,
                    tool="http_request",
                    status=ToolCallStatus.OK,
                    arguments_json=text,
                    result=text[:2000],
                )
            )
            approval_id = f"apr_hostile{i:02d}"
            approval_ids.append(approval_id)
            s.add(
                Approval(
                    id=approval_id,
                    run_id=run_id,
                    worker_name="hostile",
                    kind=ApprovalKind.RUN,
                    proposed_json=text,
                    edited_json=text,
                )
            )
            s.add(
                Transcript(
                    run_id=run_id,
                    worker_name="hostile",
                    model="m",
                    messages_json=text,
                    state_json=text,
                )
            )
            s.add(MemoryEntry(worker_name="hostile", key=label, value_json=text, run_id=run_id))
            s.add(
                Replay(
                    run_id=run_id, original_run_id=run_ids[0], mode="exact", divergence_json=text
                )
            )
            job_id = f"job_hostile{i:02d}"
            job_ids.append(job_id)
            s.add(
                Job(
                    id=job_id,
                    summary=label,
                    context_json=text,
                    constraints_json=text,
                    artifacts_json=text,
                    routing_json=text,
                    result_json=text,
                    target_role_id=role.id,
                    status=JobStatus.PUBLISHED,
                )
            )
            s.add(JobEvent(job_id=job_id, type="published", payload_json=text))
            s.add(
                AuditEvent(
                    id=f"aud_hostile{i:02d}",
                    type="worker.deployed",
                    subject="worker:hostile",
                    payload_json=text,
                )
            )
            delivery_id = f"dlv_hostile{i:02d}"
            delivery_ids.append(delivery_id)
            s.add(
                WebhookDelivery(
                    id=delivery_id,
                    source="webhook",
                    worker_name="hostile",
                    delivery_key=label,
                    headers_json=text,
                    body=text.encode()[:2000],
                    outcome="run",
                    run_id=run_id,
                )
            )
            # Worker state versions, alert channels, rules and deliveries, triggers.
            s.add(
                WorkerState(
                    worker_name="hostile",
                    version=len(HOSTILE) - i,  # the deep one the newest
                    state_json=text,
                    size=len(text),
                    source="run",
                    run_id=run_id,
                )
            )
            channel = f"hostile-{i:02d}"
            channels.append(channel)
            s.add(
                AlertChannel(
                    id=f"ach_hostile{i:02d}",
                    name=channel,
                    kind=ChannelKind.WEBHOOK,
                    config_json=text,
                )
            )
            s.add(
                AlertRule(
                    id=f"arl_hostile{i:02d}",
                    name=f"hostile-rule-{i:02d}",
                    worker_name="hostile",
                    events_json=text,
                    channels_json=text,
                )
            )
            alert_delivery_id = f"adl_hostile{i:02d}"
            alert_delivery_ids.append(alert_delivery_id)
            s.add(
                Delivery(
                    id=alert_delivery_id,
                    purpose=DeliveryPurpose.ALERT,
                    run_id=run_id,
                    channel_id=f"ach_hostile{i:02d}",
                    channel_name=channel,
                    body_json=text,
                    status=DeliveryStatus.FAILED,
                )
            )
            s.add(
                Trigger(
                    id=f"trg_hostile{i:02d}",
                    worker_name="hostile",
                    kind=TriggerKind.SCHEDULE,
                    key=f"hostile{i:02d}",
                    position=i,
                    config_json=text,
                )
            )
        worker = s.get(Worker, "hostile")
        assert worker is not None
        worker.state_version = len(HOSTILE)  # the current state: 300 levels deep
        s.add(worker)
        s.commit()
    return {
        "run_id": run_ids,
        "approval_id": approval_ids,
        "job_id": job_ids,
        "delivery_id": delivery_ids,
        "alert_delivery_id": alert_delivery_ids,
        "name": ["hostile", *channels, *UNREADABLE_MANIFESTS],
        "worker": ["hostile"],
        "version_id": [version_id, *unreadable.values()],
        "role": ["hostile-role"],
    }


def _fill(path: str, seeds: dict[str, list[str]]) -> list[str]:
    names = re.findall(r"{(\w+)}", path)
    if any(n not in seeds for n in names):
        return [re.sub(r"{\w+}", "none", path)]
    filled = []
    for values in product(*(seeds[n] for n in names)):
        url = path
        for n, v in zip(names, values, strict=True):
            url = url.replace("{" + n + "}", v)
        filled.append(url)
    return filled


def _walk_rest(server: LiveServer, seeds: dict[str, list[str]]) -> int:
    walked = 0
    with server.client() as api:
        doc = api.get("/openapi.json").json()
        for path, ops in doc["paths"].items():
            if "get" not in ops or STREAMS.search(path):
                continue
            for url in _fill(path, seeds):
                resp = api.get(url)
                assert resp.status_code < 500, (url, resp.status_code, resp.text[:500])
                if resp.headers.get("content-type", "").startswith("application/json"):
                    json.loads(resp.text)  # a body any client can read
                walked += 1
    return walked


async def _walk_mcp(server: LiveServer, seeds: dict[str, list[str]]) -> int:
    walked = 0
    async with http_client(server) as client:
        tools = (await client.list_tools()).tools
        for tool in tools:
            if not tool.name.startswith(("list_", "get_", "watch_")):
                continue
            schema = tool.input_schema or {}
            required = schema.get("required", [])
            if any(r not in seeds for r in required):
                continue
            for values in product(*(seeds[r] for r in required)):
                args = dict(zip(required, values, strict=True))
                if tool.name == "watch_run":
                    args["timeout_seconds"] = 0
                result = await call_raw(client, tool.name, **args)
                shown = text_of(result)
                assert "Traceback" not in shown, (tool.name, args, shown[:500])
                if result.is_error:
                    error = (result.structured_content or {}).get("error", {})
                    assert error.get("code") not in (None, "internal"), (tool.name, args, shown)
                walked += 1
    return walked


def _walk_cli(server: LiveServer, seeds: dict[str, list[str]]) -> int:
    commands = [["runs"], ["runs", "--json"], ["approvals"], ["workers"], ["versions", "hostile"]]
    commands += [["deliveries", "hostile"], ["handoffs", "list"], ["triggers", "hostile"]]
    commands += [["state", "get", "hostile"], ["state", "history", "hostile"]]
    commands += [["alerts", "channels"], ["alerts", "rules"], ["alerts", "deliveries"]]
    for run_id in seeds["run_id"]:
        commands += [["show", run_id], ["show", run_id, "--json"], ["logs", run_id]]
    for job_id in seeds["job_id"][:3]:
        commands.append(["handoffs", "show", job_id])
    env = server.cli_env()

    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "floom.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    # Each command is a process of its own that only reads: most of its time is Python's
    # start and floom's imports (~0.6 s), which run side by side instead of one by one.
    with ThreadPoolExecutor(max_workers=CLI_AT_ONCE) as pool:
        done_all = list(pool.map(run, commands))
    for args, done in zip(commands, done_all, strict=True):
        assert "Traceback" not in done.stderr, (args, done.stderr[-2000:])
        assert done.returncode in (0, 1), (args, done.returncode, done.stderr[-1000:])
        assert "internal" not in done.stderr, (args, done.stderr[-1000:])
    return len(commands)


def _walk_ui(server: LiveServer, seeds: dict[str, list[str]]) -> int:
    walked = 0
    modules = (ui, ui_admin, ui_approvals, ui_handoffs, ui_monitoring, ui_ops, ui_replays, ui_runs)
    paths = sorted(
        {
            r.path
            for m in modules
            for r in m.router.routes
            if "GET" in getattr(r, "methods", ()) and not STREAMS.search(r.path)
        }
    )
    page = signed_in_client(server, server.admin_key)
    try:
        for path in paths:
            for url in _fill(path, {**seeds, "eval_id": ["evl_none"]}):
                resp = page.get(url)
                assert resp.status_code < 500, (url, resp.status_code, resp.text[-800:])
                walked += 1
    finally:
        page.close()
    return walked


def test_every_surface_shows_hostile_stored_rows_and_the_worker_can_be_purged(
    server: LiveServer, tmp_path: Path
) -> None:
    seeds = _seed(server, tmp_path)
    assert _walk_rest(server, seeds) > 50
    assert anyio.run(_walk_mcp, server, seeds) > 20
    assert _walk_ui(server, seeds) > 20
    assert _walk_cli(server, seeds) > 20
    # floom's loops read the same rows: the scheduler, the alert watch and alert routing go
    # on past them; a run cannot start from a state floom cannot read, and says so.
    now = utcnow()
    fire_due(server.ctx, now=now)
    watch_schedules(server.ctx, now=now)
    with Session(server.ctx.engine) as s:
        assert routes_for(s, kind="run.failed", worker="hostile") == []
        run = s.get(Run, seeds["run_id"][0])
        assert run is not None
    with pytest.raises(StateInvalid, match=f"state version {len(HOSTILE)} of worker 'hostile'"):
        worker_state.base_of_run(server.ctx, run=run)
    with server.client() as api:
        shown = api.get(f"/api/v1/runs/{seeds['run_id'][0]}").json()
        assert shown["outputs"] == {"floom_unreadable": shown["outputs"]["floom_unreadable"]}
        assert "deeper" in shown["outputs"]["floom_unreadable"]
        # Each kept state version read back, and restored: shown or marked, refused to restore.
        for version in range(1, len(HOSTILE) + 1):
            kept = api.get("/api/v1/workers/hostile/state", params={"version": version})
            assert kept.status_code == 200, (version, kept.text[:300])
            restore = api.put("/api/v1/workers/hostile/state", json={"from_version": version})
            assert restore.status_code in (200, 422), (version, restore.text[:300])
        listed = {w["name"]: w for w in api.get("/api/v1/workers").json()["items"]}
        for name in UNREADABLE_MANIFESTS:
            assert "cannot read" in listed[name]["manifest"]["floom_unreadable"], listed[name]
            for read in (f"/api/v1/workers/{name}", f"/api/v1/workers/{name}/state"):
                assert api.get(read).status_code == 200, read
            refused = api.post(f"/api/v1/workers/{name}/runs", json={})
            assert refused.status_code == 409, refused.text
            assert "cannot read" in refused.json()["error"]["message"]
        for name in ("hostile", *UNREADABLE_MANIFESTS):
            gone = api.delete(f"/api/v1/workers/{name}", params={"purge_runs": "true"})
            assert gone.status_code == 200, (name, gone.text)
        assert api.get(f"/api/v1/runs/{seeds['run_id'][0]}").status_code == 404


@pytest.mark.parametrize(
    ("text", "bound"),
    [
        ("[" * 5000, "depth"),
        (json.dumps({"outputs": {"x": json.loads("[" * 70 + "]" * 70)}}), "depth"),
        ('{"outputs": {"x": NaN}}', "number"),
        ('{"outputs": {"x": ' + "9" * 5000 + "}}", "number"),
    ],
)
def test_a_result_json_over_a_bound_is_result_invalid_naming_the_bound(
    tmp_path: Path, text: str, bound: str
) -> None:
    (tmp_path / "result.json").write_text(text)
    report, problem = read_result(tmp_path, limit=1024 * 1024)
    assert report == {}
    assert problem is not None, problem
    assert f"({bound} bound)" in problem, problem
