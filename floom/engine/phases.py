"""Attempts that are more than one sandbox run: agent workers, and script workers behind a
run-level approval (propose, wait for a person, then apply)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlmodel import col, select

from floom import jsonvalues
from floom.engine.attempt import Attempt, cancelled_outcome
from floom.engine.queue import Outcome, worker_has_room
from floom.engine.safefiles import write_regular
from floom.services.runs.approvals import PHASE_APPLY, new_approval, pause_run
from floom.services.runs.logs import system_event
from floom.services.runs.rules import (
    AWAITING_APPROVAL,
    QUEUED,
    SUCCEEDED,
    mark_claimed,
    started_message,
)
from floom.store.agents import Approval
from floom.store.db import database_clock, session_scope
from floom.store.models import Run
from floom.vocabulary import ApprovalKind, ApprovalStatus

if TYPE_CHECKING:
    from floom.manifest.schema import Manifest
    from floom.services.context import Context


#: Runs one attempt of an agent worker (floom.agent.runner.run_agent). The engine receives it
#: from whoever builds the executor, so that the engine does not import the agent package,
#: which itself builds on the engine.
AgentRunner = Callable[[Attempt], Outcome]


def is_phased(manifest: Manifest) -> bool:
    return manifest.kind == "agent" or bool(manifest.approvals.get("required"))


def execute_phased(attempt: Attempt, *, run_agent: AgentRunner) -> Outcome:
    """One attempt of an agent run or of an approval-gated script run."""
    if attempt.manifest.kind == "agent":
        return run_agent(attempt)
    return _gated_script(attempt)


def approved_decision(ctx: Context, *, run: Run) -> dict[str, Any]:
    """What decision.json holds in the apply phase: the approved outputs and who decided."""
    with session_scope(ctx.engine) as s:
        approval = s.exec(
            select(Approval)
            .where(
                Approval.run_id == run.id,
                Approval.kind == ApprovalKind.RUN,
                Approval.status == ApprovalStatus.APPROVED,
            )
            .order_by(col(Approval.id).desc())
        ).first()
    return {
        "decision": "approved",
        "outputs": jsonvalues.stored(run.outputs_json or "{}", expect=dict),
        "comment": approval.comment if approval else None,
        "decided_by": approval.decided_by if approval else None,
        "approval_id": approval.id if approval else None,
    }


def _gated_script(attempt: Attempt) -> Outcome:
    ctx, run, manifest = attempt.ctx, attempt.run, attempt.manifest
    apply = run.phase == PHASE_APPLY
    ended = attempt.resolve_secrets([*manifest.secrets, *(manifest.apply_secrets if apply else [])])
    if ended is not None:
        return ended
    with attempt.workspace(layered=True):
        decision: dict[str, Any] | None = None
        if apply:
            attempt.restore_artifacts()
            decision = approved_decision(ctx, run=run)
            write_regular(attempt.workdir, "decision.json", json.dumps(decision).encode())
        result = attempt.run_sandbox(attempt.spec(phase="apply" if apply else "propose"))
        # In the apply phase the run's outputs are the approved ones, whatever the script
        # says; its `error` and `retryable` still count.
        outcome = attempt.judge(
            result, pinned_outputs=decision["outputs"] if decision is not None else None
        )
        if apply or outcome.status != SUCCEEDED:
            return outcome
        proposed = outcome.outputs or {}
        approval = new_approval(run=run, kind=ApprovalKind.RUN, proposed=proposed)
        # The propose phase's lines are stored before the pause: whoever sees the run
        # awaiting approval sees all that led to it.
        attempt.run_log.flush(ctx)
        paused = pause_run(
            ctx,
            run=run,
            approval=approval,
            proposed_outputs=proposed,
            artifacts=outcome.artifacts,
            sandbox_seconds=attempt.sandbox_seconds,
        )
        if paused:
            return Outcome(status=AWAITING_APPROVAL, sandbox_seconds=attempt.sandbox_seconds)
        return cancelled_outcome()


def claim_run(ctx: Context, *, run_id: str) -> Run | None:
    """Claim one particular queued run for this node (an agent running the child run it just
    started), as claim_next_run would; None when another executor got it first, or when
    its worker is at its `concurrency` limit (then an executor starts it when room is made,
    and the agent waits for it like for any other run)."""
    now = database_clock(ctx.engine).now()  # the lease on the database's clock
    with session_scope(ctx.engine, write=True) as s:
        run = s.get(Run, run_id, with_for_update=True)
        if run is None or run.status != QUEUED or not worker_has_room(s, run):
            return None
        mark_claimed(run, node_id=ctx.node_id, lease_seconds=ctx.settings.lease_seconds, now=now)
        s.add(run)
        system_event(
            s,
            run_id=run.id,
            attempt=run.attempt,
            message=f"{started_message(run, node_id=ctx.node_id)} (called by {run.parent_run_id})",
        )
    return run
