"""Attempts that are more than one sandbox run: agent workers, and script workers behind a
run-level approval (propose, wait for a person, then apply)."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlmodel import col, select

from floom.engine.cleanup import discard_later
from floom.engine.queue import Outcome
from floom.engine.script import redact_outcome, script_spec
from floom.services import secrets as secret_service
from floom.services.agent_runs import restore_artifacts
from floom.services.approvals import PHASE_APPLY, new_approval, pause_run
from floom.services.logs import system_event
from floom.services.runs import AWAITING_APPROVAL, CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED
from floom.services.secrets import Redactor
from floom.store.agents import Approval
from floom.store.db import session_scope
from floom.store.models import Run, Version, utcnow

if TYPE_CHECKING:
    from floom.engine.executor import Executor, RunLog
    from floom.manifest import Manifest
    from floom.services.context import Context


def is_phased(manifest: Manifest) -> bool:
    return manifest.kind == "agent" or bool(manifest.approvals.get("required"))


def execute_phased(
    executor: Executor, run: Run, version: Version, manifest: Manifest, run_log: RunLog
) -> Outcome:
    """One attempt of an agent run or of an approval-gated script run."""
    if manifest.kind == "agent":
        from floom.agent.runner import run_agent

        return run_agent(executor, run=run, version=version, manifest=manifest, run_log=run_log)
    return _gated_script(executor, run, version, manifest, run_log)


def missing_secret_outcome(missing: list[str]) -> Outcome:
    return Outcome(
        status=FAILED,
        error_code="secret_missing",
        error_message=f"secret {', '.join(missing)} is not set; set it with "
        f"`floom secrets set {missing[0]}`",
        retryable=False,
    )


def approved_decision(ctx: Context, *, run: Run) -> dict[str, Any]:
    """What decision.json holds in the apply phase: the approved outputs and who decided."""
    with session_scope(ctx.engine) as s:
        approval = s.exec(
            select(Approval)
            .where(Approval.run_id == run.id, Approval.kind == "run", Approval.status == "approved")
            .order_by(col(Approval.id).desc())
        ).first()
    return {
        "decision": "approved",
        "outputs": json.loads(run.outputs_json or "{}"),
        "comment": approval.comment if approval else None,
        "decided_by": approval.decided_by if approval else None,
        "approval_id": approval.id if approval else None,
    }


def _gated_script(
    executor: Executor, run: Run, version: Version, manifest: Manifest, run_log: RunLog
) -> Outcome:
    ctx = executor.ctx
    apply = run.phase == PHASE_APPLY
    names = [*manifest.secrets, *(manifest.apply_secrets if apply else [])]
    values, missing = secret_service.resolve(ctx, names)
    if missing:
        return missing_secret_outcome(missing)
    redactor = Redactor(values.values())
    run_log.redact_with(redactor)
    base = ctx.settings.work_root / f"{run.id}-{run.attempt}"
    workdir, output_dir = base / "work", base / "output"
    try:
        executor._prepare(version, workdir, output_dir, run)
        decision: dict[str, Any] | None = None
        if apply:
            restore_artifacts(ctx, run_id=run.id, output_dir=output_dir)
            decision = approved_decision(ctx, run=run)
            (workdir / "decision.json").write_text(json.dumps(decision))
        spec = script_spec(
            run,
            manifest,
            workdir=workdir,
            output_dir=output_dir,
            secrets=values,
            phase="apply" if apply else "propose",
        )
        t0 = time.monotonic()
        result = executor.sandbox.run(
            spec, on_line=run_log.add, should_cancel=lambda: executor._should_cancel(run.id)
        )
        elapsed = time.monotonic() - t0
        if decision is not None:
            _pin_outputs(workdir / "result.json", decision["outputs"])
        outcome = executor._judge(result, workdir, output_dir, manifest, run_log)
        outcome.sandbox_seconds = elapsed
        redact_outcome(outcome, redactor)
        if apply or outcome.status != SUCCEEDED:
            return outcome
        proposed = outcome.outputs or {}
        approval = new_approval(run=run, kind="run", proposed=proposed)
        paused = pause_run(
            ctx,
            run=run,
            approval=approval,
            proposed_outputs=proposed,
            artifacts=outcome.artifacts,
            sandbox_seconds=elapsed,
        )
        if paused:
            return Outcome(status=AWAITING_APPROVAL, sandbox_seconds=elapsed)
        return Outcome(
            status=CANCELLED, error_code="cancelled", error_message="cancelled", retryable=False
        )
    finally:
        discard_later(base)


def _pin_outputs(path: Path, outputs: dict[str, Any]) -> None:
    """In the apply phase the run's outputs are the approved ones, whatever the script says;
    its `error` and `retryable` still count."""
    report: Any = {}
    if path.exists():
        try:
            report = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            return  # the judge reports the broken file
    if isinstance(report, dict):
        report["outputs"] = outputs
        path.write_text(json.dumps(report))


def claim_run(ctx: Context, *, run_id: str) -> Run | None:
    """Claim one particular queued run for this node (an agent running the child run it just
    started), as claim_next_run would; None when another executor got it first."""
    now = utcnow()
    with session_scope(ctx.engine, write=True) as s:
        run = s.get(Run, run_id, with_for_update=True)
        if run is None or run.status != QUEUED:
            return None
        run.status = RUNNING
        run.lease_owner = ctx.node_id
        run.lease_expires_at = now + timedelta(seconds=ctx.settings.lease_seconds)
        run.started_at = now
        run.cancel_requested = False
        s.add(run)
        system_event(
            s,
            run_id=run.id,
            attempt=run.attempt,
            message=f"started attempt {run.attempt} of {run.max_attempts} on {ctx.node_id} "
            f"(called by {run.parent_run_id})",
        )
    return run


def run_claimed_inline(executor: Executor, run: Run) -> None:
    """Run an attempt this node just claimed in the calling thread, as a slot would: an agent
    waiting on its child run must not wait for a free slot it may itself be holding."""
    from floom.engine.executor import RunLog

    run_log = RunLog(
        run_id=run.id,
        attempt=run.attempt,
        redactor=Redactor([]),
        max_lines=executor.ctx.settings.max_log_lines_per_run,
    )
    with executor._active_lock:
        executor._active[run.id] = run_log
    executor._run_attempt(run, run_log)
