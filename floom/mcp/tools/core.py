"""floom's MCP tools, written once against the Backend interface; both transports serve them."""

from __future__ import annotations

import time
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field

from floom.errors import FloomError, InvalidRequest
from floom.mcp.backends.base import Backend, NotAvailable
from floom.mcp.catalog import ExposedWorker
from floom.mcp.render import (
    Reply,
    approvals_text,
    left_out_text,
    log_lines_text,
    names_text,
    page_of,
    pending_approval_id,
    problems_text,
    run_text,
    runs_text,
    said,
    short,
    trigger_line,
    versions_text,
    waiting_text,
    worker_summary,
    workers_text,
)
from floom.mcp.toolkit import (
    DESTRUCTIVE,
    MAX_WAIT_SECONDS,
    READ,
    RUNS,
    WRITE,
    FloomTool,
    backend_of,
    floom_tool,
    off,
    pack,
    server_of,
    settle,
)
from floom.mcp.tools.alerts import ALERT_TOOLS
from floom.mcp.tools.artifacts import ARTIFACT_TOOLS, with_links
from floom.mcp.tools.handoffs import HANDOFF_TOOLS
from floom.mcp.tools.replays import REPLAY_TOOLS
from floom.mcp.tools.state import STATE_TOOLS
from floom.schemas.common import OneOf
from floom.schemas.runs import ApprovalQuery, RunPublic, RunQuery, RunRequest
from floom.services.runs.rules import ACTIVE as ACTIVE_STATUSES
from floom.services.runs.rules import SUCCEEDED, WAITING
from floom.vocabulary import ApprovalStatus, Decision, RunStatus, RunTrigger

LINEAGE_KEYS = ("replay_of", "retry_of", "parent_run_id", "handoff_id")

WorkerName = Annotated[str, Field(description="worker name, e.g. hello")]
RunId = Annotated[str, Field(description="run id, e.g. run_0123abcd...")]
# Offered only by the stdio server, which runs on the caller's machine (FloomTool's
# local_arguments): inside the floom server a path names nothing of the caller's.
Folder = Annotated[
    str | None,
    Field(description="path of the worker folder on this machine, which floom packs (or `files`)"),
]
Files = Annotated[
    dict[str, str] | None,
    Field(description="the folder's text files: relative path -> content (worker.yml, run.py...)"),
]
FilesBase64 = Annotated[
    dict[str, str] | None, Field(description="binary files: relative path -> base64 content")
]
Executable = Annotated[
    list[str] | None, Field(description="paths among `files` that are executable")
]
Force = Annotated[
    bool, Field(description="run even though the worker is paused (a deploy-scoped key)")
]
WaitSeconds = Annotated[
    float, Field(ge=0, le=MAX_WAIT_SECONDS, description="wait up to this long for the run to end")
]
# The vocabulary's words (floom/vocabulary.py), refused outside the set as a Literal would be.
RunStatusArg = Annotated[RunStatus, OneOf(RunStatus, strict=True)]
RunTriggerArg = Annotated[RunTrigger, OneOf(RunTrigger, strict=True)]
ApprovalStatusArg = Annotated[ApprovalStatus, OneOf(ApprovalStatus, strict=True)]
DecisionArg = Annotated[Decision, OneOf(Decision, strict=True)]
Cursor = Annotated[str | None, Field(description="next_cursor of a previous page")]


class RunDidNotSucceed(FloomError):
    """The worker's run did not succeed."""

    status = 409
    code = "run_failed"


# -- workers and versions ----------------------------------------------------------------------


@floom_tool
async def list_workers(
    ctx: Context,
    cursor: Annotated[str | None, Field(description="next_cursor of a previous page")] = None,
    limit: Annotated[int, Field(ge=1, le=500)] = 50,
) -> Reply:
    """List the deployed workers: name, kind, active version, inputs, whether paused."""
    page = await off(backend_of(ctx).list_workers, cursor=cursor, limit=limit)
    items = [worker_summary(w) for w in page.items]
    data = {"items": items, "next_cursor": page.next_cursor}
    return Reply(workers_text(items, page.next_cursor), data)


@floom_tool
async def get_worker(ctx: Context, worker: WorkerName) -> Reply:
    """One worker: its manifest, active version, triggers with their next fires, recent runs."""
    backend = backend_of(ctx)
    body = await off(backend.get_worker, worker)
    try:
        triggers = (await off(backend.list_triggers, worker)).items
    except NotAvailable:
        triggers = []
    recent = body.recent_runs
    text = (
        f"{body.name} ({body.kind}): active version {body.active_version_id}"
        f"{' [paused]' if body.paused else ''}; {len(triggers)} trigger(s); "
        f"{len(recent)} recent run(s)"
    )
    if body.description:
        text += f"\n{said(body.description)}"
    for name in body.secrets_missing:
        text += (
            f"\nsecret {name} is not set: its runs fail until it is; "
            f"set_secret(name='{name}', value=VALUE)"
        )
    if body.model_key_missing:
        text += (
            "\nno model provider key is set on the floom server: this agent's runs fail until "
            "its operator sets FLOOM_ANTHROPIC_API_KEY (or ANTHROPIC_API_KEY) and restarts it"
        )
    if body.secrets_missing:
        # What a fresh install pauses (the examples' schedules) until the secrets are set.
        for t in triggers:
            if t.paused:
                text += f"\nthen resume_worker(worker='{worker}', trigger='{t.id}')"
    if recent:
        text += "\n" + runs_text(recent, None)
    return Reply(text, {**body.to_json(), "triggers": [t.to_json() for t in triggers]})


@floom_tool
async def validate_worker(
    ctx: Context,
    folder: Folder = None,
    files: Files = None,
    files_base64: FilesBase64 = None,
    executable: Executable = None,
) -> Reply:
    """Check a worker (worker.yml and its entry, sent as `files`) without deploying; lists
    every problem."""
    backend = backend_of(ctx)
    archive, left_out = pack(backend, folder, files, files_base64, executable)
    result = await off(backend.validate, archive)
    return Reply(problems_text(result) + left_out_text(left_out, result.left_out), result.to_json())


@floom_tool
async def deploy_worker(
    ctx: Context,
    folder: Folder = None,
    files: Files = None,
    files_base64: FilesBase64 = None,
    executable: Executable = None,
    skip_eval_gate: Annotated[
        bool,
        Field(
            description="activate the version even though the worker's eval gate fails "
            "(replay.gate in worker.yml); the version is stored either way"
        ),
    ] = False,
) -> Reply:
    """Deploy a worker as a new immutable version and make it active (unchanged content creates
    no new version). Send its folder's files as `files` (relative path -> text), binary ones
    as `files_base64`."""
    backend = backend_of(ctx)
    archive, left_out = pack(backend, folder, files, files_base64, executable)
    result = await off(backend.deploy, archive, skip_eval_gate=skip_eval_gate)
    await server_of(ctx).refresh_catalog()
    name, version = result.worker.name, result.version.id
    if result.created:
        text = f"deployed {name} version {version} (active)"
    elif result.activated:
        text = f"{name} version {version} unchanged; it is the active version again"
    else:
        text = f"{name} version {version} unchanged (already active)"
    return Reply(text + left_out_text(left_out, result.left_out), result.to_json())


@floom_tool
async def list_versions(ctx: Context, worker: WorkerName) -> Reply:
    """A worker's versions, newest first, marking the active one."""
    page = await off(backend_of(ctx).list_versions, worker)
    return Reply(versions_text(worker, page.items), page.to_json())


@floom_tool
async def rollback_worker(
    ctx: Context,
    worker: WorkerName,
    version_id: Annotated[str | None, Field(description="version to make active")] = None,
    run_id: Annotated[str | None, Field(description="or: the version this run used")] = None,
    state_version: Annotated[
        int | None,
        Field(
            ge=1,
            description="also set this kept state version again, in the same step "
            "(list_worker_state_versions lists them)",
        ),
    ] = None,
) -> Reply:
    """Make an earlier version of a worker active again (give version_id or run_id), and
    with state_version its state as it was then."""
    result = await off(
        backend_of(ctx).rollback,
        worker,
        version_id=version_id,
        run_id=run_id,
        state_version=state_version,
    )
    await server_of(ctx).refresh_catalog()
    version = result.version.id
    if not result.changed:
        return Reply(f"{worker} already runs version {version}; nothing changed", result.to_json())
    return Reply(f"{worker} now runs version {version}", result.to_json())


@floom_tool
async def delete_worker(
    ctx: Context,
    worker: WorkerName,
    purge_runs: Annotated[
        bool,
        Field(description="also delete its runs, logs, artifacts and versions (default: keep)"),
    ] = False,
    confirm: Annotated[bool, Field(description="must be true: deleting cannot be undone")] = False,
) -> Reply:
    """Delete a worker: its schedules, webhooks and other triggers stop at once and its
    unfinished runs are cancelled; its runs stay readable unless purge_runs. Needs the deploy
    scope and confirm=true."""
    if not confirm:
        raise InvalidRequest(
            f"deleting worker '{worker}' needs confirm=true",
            hint="ask the user first; then call delete_worker again with confirm=true",
        )
    result = await off(backend_of(ctx).delete_worker, worker, purge_runs=purge_runs)
    await server_of(ctx).refresh_catalog()
    runs = (
        f"{result.runs_purged} run(s) purged"
        if result.purge_runs
        else f"{result.runs_kept} run(s) kept"
    )
    text = (
        f"deleted {worker}: {len(result.versions)} version(s), {runs}, "
        f"{result.triggers_removed} trigger(s) removed, "
        f"{result.runs_cancelled} unfinished run(s) cancelled, "
        f"{result.runs_stopping} running run(s) asked to stop"
    )
    return Reply(text, result.to_json())


# -- runs --------------------------------------------------------------------------------------


@floom_tool
async def run_worker(
    ctx: Context,
    worker: WorkerName,
    inputs: Annotated[
        dict[str, Any] | None, Field(description="input name -> value, as the manifest declares")
    ] = None,
    wait_seconds: WaitSeconds = 0,
    force: Force = False,
    callback_url: Annotated[
        str | None,
        Field(description="POST the run's record here when it ends (signed, retried)"),
    ] = None,
) -> Reply:
    """Start a run of a worker's active version. With wait_seconds, wait for it to end and
    return its outputs; otherwise (or if it is still going) return the run id."""
    backend = backend_of(ctx)
    asked = time.monotonic()
    start = RunRequest(inputs=inputs or {}, force=force, callback_url=callback_url)
    run = await off(backend.start_run, worker, start, wait_seconds=wait_seconds)
    finished = run.status not in ACTIVE_STATUSES
    left = wait_seconds - (time.monotonic() - asked)
    if wait_seconds > 0 and not finished and left > 0:
        run, finished = await settle(backend, run.id, left)
    return Reply(run_text(run), {"run": run.to_json(), "finished": finished})


@floom_tool
async def list_runs(
    ctx: Context,
    worker: Annotated[str | None, Field(description="only runs of this worker")] = None,
    status: Annotated[RunStatusArg | None, Field(description="only runs in this status")] = None,
    trigger: Annotated[RunTriggerArg | None, Field(description="only runs started so")] = None,
    cursor: Annotated[str | None, Field(description="next_cursor of a previous page")] = None,
    limit: Annotated[int, Field(ge=1, le=500)] = 20,
) -> Reply:
    """Recent runs, newest first, filtered by worker, status and trigger."""
    query = RunQuery(worker=worker, status=status, trigger=trigger, cursor=cursor, limit=limit)
    page = await off(backend_of(ctx).list_runs, query)
    return Reply(runs_text(page.items, page.next_cursor), page.to_json())


@floom_tool
async def get_run(ctx: Context, run_id: RunId) -> Reply:
    """One run: status, inputs, outputs, error, artifacts (read one with get_artifact), tool
    calls, approvals, lineage."""
    backend = backend_of(ctx)
    run = await off(backend.get_run, run_id)
    body = run.to_json()
    data = {
        **body,
        "artifacts": [with_links(backend, run_id, a) for a in run.artifacts],
        "lineage": {k: body.get(k) for k in LINEAGE_KEYS if k in body},
    }
    return Reply(run_text(run), data)


@floom_tool
async def get_run_logs(
    ctx: Context,
    run_id: RunId,
    tail: Annotated[int | None, Field(ge=1, le=10_000, description="the last N lines")] = None,
    after: Annotated[
        int | None, Field(ge=0, description="lines after this sequence number (last_seq)")
    ] = None,
    limit: Annotated[int, Field(ge=1, le=10_000)] = 500,
) -> Reply:
    """A run's ordered log lines (stdout, stderr, floom's notices): the last `tail` lines
    (default 100), or the lines after a sequence number to continue where you left off."""
    backend = backend_of(ctx)
    if after is not None:
        page = await off(backend.get_logs, run_id, after=after, limit=limit)
    else:
        page = await off(backend.get_logs, run_id, tail=tail or 100)
    head = f"run {run_id} is {page.run_status}; last_seq={page.last_seq}"
    body = log_lines_text(page.items)
    return Reply(head + ("\n" + body if body else "\n(no log lines)"), page.to_json())


@floom_tool
async def watch_run(
    ctx: Context,
    run_id: RunId,
    timeout_seconds: WaitSeconds = 60,
    log_lines: Annotated[int, Field(ge=0, le=1000)] = 20,
) -> Reply:
    """Wait until a run ends (or the timeout passes) and tell what happened, with the last
    log lines. A client that asks for progress hears the run's status and newest log line
    every few seconds while it waits."""
    backend = backend_of(ctx)
    started = time.monotonic()
    deadline = started + max(0.0, timeout_seconds)
    while True:
        left = deadline - time.monotonic()
        run, finished = await settle(backend, run_id, min(PROGRESS_EVERY_SECONDS, left))
        if finished or left <= PROGRESS_EVERY_SECONDS:
            break
        await _report_progress(
            ctx, backend, run, elapsed=time.monotonic() - started, total=timeout_seconds
        )
    waited = round(time.monotonic() - started, 2)
    logs = (await off(backend.get_logs, run_id, tail=log_lines)).items if log_lines else []
    text = run_text(run)
    if not finished:
        text = f"still {run.status} after {waited}s\n" + text
    if logs:
        text += "\nlast log lines:\n" + log_lines_text(logs)
    data = {
        "run": run.to_json(),
        "finished": finished,
        "waited_seconds": waited,
        "logs": [e.to_json() for e in logs],
    }
    return Reply(text, data)


# How often watch_run tells a client that asked for progress how the run is doing.
PROGRESS_EVERY_SECONDS = 2.0


async def _report_progress(
    ctx: Context, backend: Backend, run: RunPublic, *, elapsed: float, total: float
) -> None:
    """One progress notification: seconds waited of the timeout, the status and the newest
    log line (a no-op for a client that did not ask for progress)."""
    newest = (await off(backend.get_logs, run.id, tail=1)).items
    message = f"run {run.id} is {run.status}"
    if newest:
        message += f"; last log line: {said(newest[-1].line[:200])}"
    await ctx.report_progress(round(elapsed, 2), total, message)


@floom_tool
async def cancel_run(ctx: Context, run_id: RunId, wait_seconds: WaitSeconds = 0) -> Reply:
    """Cancel a queued, running or waiting run. A queued or waiting run ends cancelled at
    once; a running one is asked to stop (its whole process tree is killed within seconds)
    and ends cancelled. Says which happened and the run's status now. With wait_seconds,
    wait for a running run to end, as run_worker does."""
    backend = backend_of(ctx)
    run = await off(backend.cancel_run, run_id)
    finished = run.status not in ACTIVE_STATUSES
    if wait_seconds > 0 and not finished:
        run, finished = await settle(backend, run_id, wait_seconds)
    if finished:
        head = f"cancel accepted: run {run_id} is {run.status}"
    else:
        head = (
            f"cancel accepted: run {run_id} is {run.status} and was asked to stop; "
            f"watch_run(run_id='{run_id}') follows it to cancelled"
        )
    data = {**run.to_json(), "cancel_accepted": True, "finished": finished}
    return Reply(head + "\n" + run_text(run), data)


@floom_tool
async def replay_run(
    ctx: Context,
    run_id: RunId,
    latest: Annotated[
        bool, Field(description="run on the worker's active version instead of the same one")
    ] = False,
    force: Force = False,
    wait_seconds: WaitSeconds = 0,
) -> Reply:
    """Run again with the same inputs, on the same version (or the active one with latest).
    A replay on a version that is no longer active needs a deploy-scoped key; a run-scoped
    one replays with latest. With wait_seconds, wait for the new run to end, as run_worker
    does."""
    backend = backend_of(ctx)
    run = await off(backend.replay_run, run_id, latest=latest, force=force)
    finished = run.status not in ACTIVE_STATUSES
    if wait_seconds > 0:
        run, finished = await settle(backend, run.id, wait_seconds)
    text = f"replaying {run_id} as {run.id}\n" + run_text(run)
    return Reply(text, {"run": run.to_json(), "finished": finished})


# -- approvals, triggers -----------------------------------------------------------------------


@floom_tool
async def list_approvals(
    ctx: Context,
    status: Annotated[
        ApprovalStatusArg | None,
        Field(description="approvals in this status (default pending)"),
    ] = None,
    worker: Annotated[str | None, Field(description="only approvals of this worker")] = None,
    cursor: Cursor = None,
    limit: Annotated[int, Field(ge=1, le=500)] = 50,
) -> Reply:
    """Approvals waiting for (or given) a decision, oldest first: what each run proposes and
    why it waits, a page at a time (next_cursor continues)."""
    query = ApprovalQuery(status=status, worker=worker, cursor=cursor, limit=limit)
    page = await off(backend_of(ctx).list_approvals, query)
    return Reply(approvals_text(page.items, page.next_cursor), page.to_json())


@floom_tool
async def decide_approval(
    ctx: Context,
    approval_id: Annotated[str, Field(description="the approval's id")],
    decision: DecisionArg,
    edits: Annotated[
        dict[str, Any] | None, Field(description="approve with these edited values instead")
    ] = None,
    comment: Annotated[str | None, Field(description="why; the run sees it")] = None,
    wait_seconds: WaitSeconds = 0,
) -> Reply:
    """Approve (optionally with edits) or reject a pending approval; the run resumes. With
    wait_seconds, wait for the run to end (or to wait for a person again), as run_worker
    does."""
    backend = backend_of(ctx)
    result = await off(
        backend.decide_approval,
        approval_id,
        approve=decision == "approve",
        edits=edits,
        comment=comment,
    )
    head = f"approval {approval_id}: {result.status}"
    if wait_seconds <= 0:
        run_id = result.run_id
        follow = f"; watch_run(run_id='{run_id}') follows run {run_id} to its end"
        return Reply(head + follow, result.to_json())
    run, finished = await settle(backend, result.run_id, wait_seconds)
    data = {**result.to_json(), "run": run.to_json(), "finished": finished}
    return Reply(head + "\n" + run_text(run), data)


@floom_tool
async def list_triggers(
    ctx: Context,
    worker: WorkerName,
    cursor: Cursor = None,
    limit: Annotated[int, Field(ge=1, le=100)] = 20,
) -> Reply:
    """A worker's triggers (schedules, webhooks, events): each one whole, with its next fire
    times and webhook URL, a page at a time (next_cursor continues)."""
    page = await off(backend_of(ctx).list_triggers, worker)
    items, next_cursor = page_of(page.items, cursor, limit)
    lines = [f"{len(page.items)} trigger(s) of {worker}" + (" [paused]" if page.paused else "")]
    lines += [f"  {trigger_line(t)}" for t in items]
    if next_cursor:
        lines.append(f"(more: list_triggers(worker='{worker}', cursor='{next_cursor}'))")
    data = {
        **page.to_json(),
        "items": [t.to_json() for t in items],
        "next_cursor": next_cursor,
    }
    return Reply("\n".join(lines), data)


@floom_tool
async def pause_worker(
    ctx: Context,
    worker: WorkerName,
    trigger: Annotated[
        str | None, Field(description="pause only this trigger (its id, see list_triggers)")
    ] = None,
) -> Reply:
    """Pause a worker (or one trigger): scheduled and webhook runs are refused and recorded."""
    result = await off(backend_of(ctx).set_paused, worker, paused=True, trigger=trigger)
    return Reply(f"paused {worker}{f' trigger {trigger}' if trigger else ''}", result.to_json())


@floom_tool
async def resume_worker(
    ctx: Context,
    worker: WorkerName,
    trigger: Annotated[
        str | None, Field(description="resume only this trigger (its id, see list_triggers)")
    ] = None,
) -> Reply:
    """Resume a paused worker (or one trigger)."""
    result = await off(backend_of(ctx).set_paused, worker, paused=False, trigger=trigger)
    text = f"resumed {worker}{f' trigger {trigger}' if trigger else ''}"
    return Reply(text, result.to_json())


# -- secrets -----------------------------------------------------------------------------------


@floom_tool
async def list_secrets(ctx: Context) -> Reply:
    """The names of the stored secrets (values are never shown)."""
    page = await off(backend_of(ctx).list_secrets)
    return Reply(names_text("secret(s)", [s.name for s in page.items]), page.to_json())


@floom_tool
async def set_secret(
    ctx: Context,
    name: Annotated[str, Field(description="upper-case name, e.g. GITHUB_TOKEN")],
    value: Annotated[str, Field(description="the secret value; stored encrypted, never shown")],
) -> Reply:
    """Store a secret that workers declaring it receive as an environment variable."""
    result = await off(backend_of(ctx).set_secret, name, value)
    return Reply(f"secret {name} set", result.to_json())


@floom_tool
async def delete_secret(
    ctx: Context, name: Annotated[str, Field(description="secret name")]
) -> Reply:
    """Delete a stored secret."""
    result = await off(backend_of(ctx).delete_secret, name)
    return Reply(f"secret {name} deleted", result.to_json())


# -- a worker exposed as its own tool ----------------------------------------------------------


@floom_tool
async def run_exposed(ctx: Context, worker: ExposedWorker, inputs: dict[str, Any]) -> Reply:
    backend = backend_of(ctx)
    started = await off(backend.start_run, worker.name, RunRequest(inputs=inputs))
    run, finished = await settle(backend, started.id, worker.wait_seconds)
    data: dict[str, Any] = {"run_id": run.id, "status": run.status, "outputs": run.outputs}
    if not finished:
        text = f"run {run.id} is still {run.status}; follow it with watch_run"
        return Reply(text, data)
    if run.status in WAITING:
        # Not an end: the run proposed its outputs and goes on once a person decides.
        data["approval_id"] = pending_approval_id(run)
        proposed = f" proposing {short(run.outputs, 1000)}" if run.outputs else ""
        text = f"run {run.id} of {worker.name}{proposed} " + waiting_text(run)
        return Reply(text, data)
    if run.status != SUCCEEDED:
        message = run.error.message if run.error else None
        raise RunDidNotSucceed(
            f"run {run.id} of {worker.name} ended {run.status}"
            + (f": {said(message)}" if message else ""),
            hint=f"read its logs with get_run_logs(run_id='{run.id}')",
            details={"run": run.to_json()},
        )
    return Reply(short(run.outputs, 4000), data)


# Each tool's hints and the least scope a key needs for it: the one place a tool declares
# it, read by tools/list, by calls, and by the authorization test that walks every tool.
TOOLS: tuple[FloomTool, ...] = (
    FloomTool(list_workers, READ, "read"),
    FloomTool(get_worker, READ, "read"),
    FloomTool(validate_worker, READ, "read", local_arguments=("folder",)),
    FloomTool(deploy_worker, WRITE, "deploy", local_arguments=("folder",)),
    FloomTool(run_worker, RUNS, "run"),
    FloomTool(list_runs, READ, "read"),
    FloomTool(get_run, READ, "read"),
    FloomTool(get_run_logs, READ, "read"),
    *ARTIFACT_TOOLS,
    FloomTool(watch_run, READ, "read"),
    FloomTool(cancel_run, DESTRUCTIVE, "run"),
    FloomTool(replay_run, RUNS, "run"),
    FloomTool(list_versions, READ, "read"),
    FloomTool(rollback_worker, WRITE, "deploy"),
    *STATE_TOOLS,
    FloomTool(delete_worker, DESTRUCTIVE, "deploy"),
    FloomTool(list_approvals, READ, "read"),
    FloomTool(decide_approval, WRITE, "run"),
    FloomTool(list_triggers, READ, "read"),
    FloomTool(pause_worker, WRITE, "deploy"),
    FloomTool(resume_worker, WRITE, "deploy"),
    FloomTool(list_secrets, READ, "deploy"),
    FloomTool(set_secret, WRITE, "deploy"),
    FloomTool(delete_secret, DESTRUCTIVE, "deploy"),
    *HANDOFF_TOOLS,
    *REPLAY_TOOLS,
    *ALERT_TOOLS,
)
TOOL_NAMES = frozenset(t.name for t in TOOLS)
# A worker exposed as a tool starts a run of it.
EXPOSED_SCOPE = "run"
_SCOPES = {t.name: t.scope for t in TOOLS}
# What tools/list of the server inside floom leaves out, by tool.
LOCAL_ARGUMENTS = {t.name: t.local_arguments for t in TOOLS if t.local_arguments}


def scope_of(name: str) -> str:
    """The scope a tool of this name needs: its declaration, or an exposed worker's."""
    return _SCOPES.get(name, EXPOSED_SCOPE)
