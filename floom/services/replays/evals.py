"""Evals over real runs: what-if replays of a set of a worker's recorded runs against one
version (or model), reported per run and in total against the originals."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlmodel import col, select

from floom.errors import InvalidRequest, NotFound, quoted
from floom.hints import act, told
from floom.services.access.principal import Principal
from floom.services.replays import replay as replays
from floom.services.runs import lifecycle as runs
from floom.services.runs.rules import FINISHED, SKIPPED
from floom.services.workers import exposure
from floom.services.workers import versions as workers
from floom.store.db import session_scope
from floom.store.models import Run, new_id
from floom.store.replays import Eval
from floom.vocabulary import RunTrigger

if TYPE_CHECKING:
    from floom.services.context import Context

MAX_EVAL_RUNS = 100
SELECTOR_HINT = (
    "one of last:N (N up to 100), status:STATUS, since:ISO-TIME, "
    "between:ISO-TIME..ISO-TIME, ids:RUN,RUN,..."
)


def parse_selector(selector: str) -> tuple[str, str]:
    """(kind, value) of a run selector such as "last:20"; InvalidRequest for anything else."""
    kind, sep, value = selector.strip().partition(":")
    ok = bool(sep and value.strip()) and kind in ("last", "status", "since", "between", "ids")
    if ok and kind == "last":
        ok = value.isdigit() and 1 <= int(value) <= MAX_EVAL_RUNS
    if ok and kind == "status":
        ok = value in FINISHED and value != SKIPPED
    if ok and kind in ("since", "between"):
        try:
            for part in value.split(".."):
                datetime.fromisoformat(part)
        except ValueError:
            ok = False
        ok = ok and (kind == "since") == (".." not in value)
    if ok and kind == "ids":
        ok = len(value.split(",")) <= MAX_EVAL_RUNS
    if not ok or len(selector) > 400:
        raise InvalidRequest(f"cannot read the run selector {selector[:100]!r}", hint=SELECTOR_HINT)
    return kind, value.strip()


def select_runs(ctx: Context, *, worker_name: str, selector: str, caller: Principal) -> list[Run]:
    """The worker's finished runs the selector names, newest first (never replays). Needs the
    read scope."""
    caller.require("read")
    kind, value = parse_selector(selector)
    query = (
        select(Run)
        .where(Run.worker_name == worker_name, col(Run.trigger) != RunTrigger.REPLAY)
        .where(col(Run.status).in_(sorted(FINISHED - {SKIPPED})))
    )
    if kind == "status":
        query = query.where(Run.status == value)
    elif kind == "since":
        query = query.where(col(Run.created_at) >= datetime.fromisoformat(value))
    elif kind == "between":
        start, end = (datetime.fromisoformat(p) for p in value.split(".."))
        query = query.where(col(Run.created_at) >= start, col(Run.created_at) < end)
    elif kind == "ids":
        query = query.where(col(Run.id).in_([v.strip() for v in value.split(",")]))
    limit = int(value) if kind == "last" else MAX_EVAL_RUNS
    with session_scope(ctx.engine) as s:
        found = list(s.exec(query.order_by(col(Run.id).desc()).limit(limit)).all())
    agent_versions = {
        v.id
        for v in workers.list_versions(ctx, name=worker_name, caller=caller)
        if v.kind == "agent"
    }
    return [r for r in found if r.version_id in agent_versions]


def start_eval(
    ctx: Context,
    *,
    worker_name: str,
    selector: str = "last:20",
    version_id: str | None = None,
    model: str | None = None,
    caller: Principal,
) -> Eval:
    """Queue a what-if replay of each selected run against `version_id` (default: the
    worker's active version) and `model` (default: that version's). Needs the run scope."""
    caller.require("run")
    actor = caller.actor
    worker = workers.get_worker(ctx, name=worker_name, caller=caller)
    version_id = version_id or worker.active_version_id
    if version_id is None:
        raise InvalidRequest(f"worker '{worker_name}' has no version to evaluate")
    version = workers.get_version(
        ctx, version_id=version_id, worker_name=worker_name, caller=caller
    )
    if version.kind != "agent":
        raise InvalidRequest(
            f"version {version_id} is a script; evals replay agent runs from their recordings"
        )
    manifest = workers.manifest_of(version)
    if replays.calls_tools_live(manifest):
        # Each replay is refused the same, but only after the eval's row was written.
        runs.check_exposed_now(
            ctx, worker=worker, version=version, manifest=manifest, caller=caller
        )
        exposure.check_deploy_choices(
            worker, version_id=version_id, force=True, replay_of=None, caller=caller, recording=True
        )
    chosen = select_runs(ctx, worker_name=worker_name, selector=selector, caller=caller)
    if not chosen:
        raise InvalidRequest(
            f"no finished agent run of '{worker_name}' matches {selector!r}",
            hint="run the worker first, or widen the selector (" + SELECTOR_HINT + ")",
        )
    row = Eval(
        id=new_id("evl"),
        worker_name=worker_name,
        version_id=version_id,
        model=model,
        selector=selector,
        created_by=actor,
    )
    with session_scope(ctx.engine, write=True) as s:
        s.add(row)
    for run in chosen:
        replays.start_replay(
            ctx,
            run_id=run.id,
            mode=replays.WHAT_IF,
            version_id=version_id,
            model=model,
            caller=caller,
            eval_id=row.id,
        )
    return row


def get_eval(ctx: Context, *, eval_id: str, caller: Principal) -> Eval:
    """One eval; NotFound when there is none. Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        row = s.get(Eval, eval_id)
    if row is None:
        raise NotFound(
            f"no eval {quoted(eval_id)}", hint=told(act("eval", worker="WORKER"), " starts one")
        )
    return row


def eval_report(ctx: Context, *, eval_id: str, caller: Principal) -> dict[str, Any]:
    """Per run and in total: outputs equal or different (by the version's comparison rules),
    tool calls diverged, refused unmatched calls, tokens and cost against the originals.
    Needs the read scope."""
    row = get_eval(ctx, eval_id=eval_id, caller=caller)
    items = []
    for rp in replays.replays_of_eval(ctx, eval_id=eval_id, caller=caller):
        report = replays.replay_report(ctx, run_id=rp.run_id, caller=caller)
        diff = report["diff"] or {}
        items.append(
            {
                "original_run_id": report["original_run_id"],
                "replay_run_id": report["run_id"],
                "status": report["status"],
                "finished": report["finished"],
                "original_status": (diff.get("status") or {}).get("original"),
                "outputs_equal": (diff.get("outputs") or {}).get("equal"),
                "outputs_different": sorted((diff.get("outputs") or {}).get("different") or {}),
                "tool_calls_diverged": (diff.get("tool_calls") or {}).get("diverged"),
                "refused_calls": report.get("refused_calls", 0),
                "tokens": diff.get("tokens"),
                "cost_usd": diff.get("cost_usd"),
            }
        )
    done = [i for i in items if i["finished"]]

    def total(key: str, side: str) -> float:
        return round(float(sum((i[key] or {}).get(side, 0) for i in done)), 6)

    totals = {
        "runs": len(items),
        "finished": len(done),
        "outputs_equal": sum(1 for i in done if i["outputs_equal"]),
        "outputs_different": sum(1 for i in done if not i["outputs_equal"]),
        "tool_calls_diverged": sum(1 for i in done if i["tool_calls_diverged"]),
        "refused_calls": sum(i["refused_calls"] for i in done),
        "tokens": {"original": total("tokens", "original"), "replay": total("tokens", "replay")},
        "cost_usd": {
            "original": total("cost_usd", "original"),
            "replay": total("cost_usd", "replay"),
        },
    }
    return {
        "id": row.id,
        "worker": row.worker_name,
        "version_id": row.version_id,
        "model": row.model,
        "runs_selector": row.selector,
        "created_at": row.created_at,
        "finished": len(done) == len(items),
        "totals": totals,
        "items": items,
    }
