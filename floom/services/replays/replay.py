"""Replays of agent runs from their recordings: starting one (a run of its own, linked to the
original and marked as a replay), and reporting how it went against the original."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sqlmodel import Session, col, select

from floom import jsonvalues
from floom.errors import InvalidRequest, NotFound, quoted
from floom.hints import act, told
from floom.manifest.replay import NEVER_LIVE, replay_rules
from floom.manifest.schema import Manifest
from floom.services.access.principal import Principal
from floom.services.replays.diff import first_divergence, run_diff
from floom.services.replays.recordings import NOT_RECORDED, load_recording
from floom.services.runs import lifecycle as runs
from floom.services.runs import records as run_records
from floom.services.runs.rules import FINISHED
from floom.services.workers import versions as workers
from floom.store.db import session_scope
from floom.store.replays import Replay
from floom.vocabulary import ReplayMode, RunTrigger, ToolCallStatus

if TYPE_CHECKING:
    from floom.services.context import Context
    from floom.store.models import Run

EXACT = ReplayMode.EXACT
WHAT_IF = ReplayMode.WHAT_IF
MODES = tuple(ReplayMode)
MAX_MODEL_NAME = 128


def start_replay(
    ctx: Context,
    *,
    run_id: str,
    mode: str,
    version_id: str | None = None,
    model: str | None = None,
    caller: Principal,
    eval_id: str | None = None,
) -> Run:
    """Queue a replay of a finished agent run: `exact` on the run's own version (neither the
    model nor any tool is called), or `what_if` on `version_id` (default: the worker's
    active version) with its model or `model`, the recording answering the tool calls.
    Needs the run scope."""
    caller.require("run")
    if mode not in MODES:
        raise InvalidRequest(
            f"unknown replay mode '{quoted(mode)}'", hint=f"one of {', '.join(MODES)}"
        )
    if model is not None and (not model.strip() or len(model) > MAX_MODEL_NAME):
        raise InvalidRequest("model must be a model name", hint="e.g. claude-sonnet-4-5")
    if mode == EXACT and (version_id or model):
        raise InvalidRequest(
            "an exact replay runs the original's version and recorded model replies",
            hint=told(
                "use a what-if replay to change either: ",
                act("replay", run_id=run_id, version="VERSION"),
                " or ",
                act("replay", run_id=run_id, model="MODEL"),
            ),
        )
    recording = load_recording(ctx, run_id=run_id, caller=caller)
    acts = False
    if mode == EXACT:
        version_id = recording.version_id
    else:
        if version_id is None:
            worker = workers.get_worker(ctx, name=recording.worker_name, caller=caller)
            version_id = worker.active_version_id
        if version_id is not None:
            version = workers.get_version(ctx, version_id=version_id, caller=caller)
            if version.worker_name != recording.worker_name:
                raise InvalidRequest(
                    f"version {version_id} is not a version of worker '{recording.worker_name}'",
                    hint=told(act("versions", worker=recording.worker_name), " lists its versions"),
                )
            acts = calls_tools_live(workers.manifest_of(version))
    original = runs.get_run(ctx, run_id=run_id, caller=caller)

    def link(s: Session, run: Run) -> None:
        s.add(
            Replay(
                run_id=run.id,
                original_run_id=original.id,
                mode=mode,
                model=model,
                eval_id=eval_id,
            )
        )

    return runs.create_run(
        ctx,
        worker_name=original.worker_name,
        inputs=jsonvalues.stored(original.inputs_json, expect=dict),
        trigger=RunTrigger.REPLAY,
        caller=caller,
        version_id=version_id,
        replay_of=original.id,
        # A replay acts on nothing, so a paused worker may still be tested, from any surface.
        # One that may call tools live (`acts`) acts, though: its `expose` and the deploy
        # scope decide then, as for a run.
        force=True,
        from_recording=True,
        recording_acts=acts,
        in_transaction=link,
        state_base=original.state_base,
    )


def calls_tools_live(manifest: Manifest) -> bool:
    """Whether a what-if replay on a version of this manifest may call a tool live: one its
    replay.live_tools names (floom's builtins that act elsewhere never are)."""
    return bool(replay_rules(manifest).live_tools - set(NEVER_LIVE))


def replay_of_run(ctx: Context, *, run_id: str, caller: Principal) -> Replay | None:
    """The replay record of a run, or None for a run that is not a replay. Needs the read
    scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        return s.get(Replay, run_id)


def replays_of_eval(ctx: Context, *, eval_id: str, caller: Principal) -> list[Replay]:
    """The replays an eval started, by run id. Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        return list(
            s.exec(select(Replay).where(Replay.eval_id == eval_id).order_by(col(Replay.run_id)))
        )


def record_divergence(ctx: Context, *, run_id: str, divergence: dict[str, Any]) -> None:
    """Keep where an exact replay left its recording (only the first place is kept)."""
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(Replay, run_id)
        if row is not None and row.divergence_json is None:
            row.divergence_json = json.dumps(divergence, default=str)
            s.add(row)


def get_replay(ctx: Context, *, run_id: str, caller: Principal) -> Replay:
    """The replay record of a run; NotFound for a run that is not a replay. Needs the read
    scope."""
    row = replay_of_run(ctx, run_id=run_id, caller=caller)
    if row is None:
        raise NotFound(
            f"run {run_id} is not a replay",
            hint=told(
                "start one with ",
                act("replay", run_id=run_id, exact=True),
                " or ",
                act("replay", run_id=run_id, version="VERSION"),
            ),
        )
    return row


def run_record(ctx: Context, *, run: Run, caller: Principal) -> dict[str, Any]:
    """A run as the diff reads it (floom/services/replays/diff.py): its status and outputs,
    its tool calls and its model usage. Needs the read scope."""
    extras = run_records.run_extras(ctx, run=run, caller=caller)
    t = extras.transcript
    return {
        "status": run.status,
        "outputs": jsonvalues.stored(run.outputs_json, expect=dict) if run.outputs_json else None,
        "tool_calls": [
            {
                "tool": c.tool,
                "arguments": jsonvalues.stored(c.arguments_json),
                "status": c.status,
                "error": c.error,
            }
            for c in extras.tool_calls
        ],
        "model_usage": (
            None
            if t is None
            else {
                "iterations": t.iterations,
                "total_tokens": t.input_tokens + t.output_tokens,
                "cost_usd": round(t.cost_usd, 6),
            }
        ),
    }


def replay_report(ctx: Context, *, run_id: str, caller: Principal) -> dict[str, Any]:
    """The replay, its original, and (once it finished) the diff between them; an exact
    replay also says whether it reproduced the original, and if not, the first step where
    it left it. Needs the read scope."""
    row = get_replay(ctx, run_id=run_id, caller=caller)
    replay = runs.get_run(ctx, run_id=run_id, caller=caller)
    original = runs.get_run(ctx, run_id=row.original_run_id, caller=caller)
    version = runs.version_of_run(ctx, run=replay, caller=caller)
    rules = replay_rules(workers.manifest_of(version)).compare
    body: dict[str, Any] = {
        "run_id": replay.id,
        "original_run_id": original.id,
        "mode": row.mode,
        "model": row.model,
        "eval_id": row.eval_id,
        "version_id": replay.version_id,
        "original_version_id": original.version_id,
        "status": replay.status,
        "finished": replay.status in FINISHED,
        "diff": None,
        "reproduced": None,
        "divergence": None,
    }
    if replay.status not in FINISHED:
        return body
    mine = run_record(ctx, run=replay, caller=caller)
    theirs = run_record(ctx, run=original, caller=caller)
    body["diff"] = run_diff(theirs, mine, rules=rules)
    body["refused_calls"] = sum(
        1
        for c in mine["tool_calls"]
        if c["status"] == ToolCallStatus.REFUSED and (c["error"] or "").startswith(NOT_RECORDED)
    )
    if row.mode == EXACT:
        found = _divergence(row.divergence_json) if row.divergence_json else None
        body["divergence"] = found or first_divergence(theirs, mine)
        body["reproduced"] = body["divergence"] is None
    return body


def _divergence(text: str) -> dict[str, Any]:
    # Stored as {"step", "expected", "actual"} by floom; a row it did not write is shown as a
    # divergence at an unreadable step, not as a broken page.
    found = jsonvalues.stored(text, expect=dict)
    if jsonvalues.UNREADABLE in found or "step" not in found:
        why = found.get(jsonvalues.UNREADABLE, "the stored divergence has no step")
        return {"step": "unknown", "expected": jsonvalues.unreadable(str(why)), "actual": None}
    return {"expected": None, "actual": None, **found}
