"""The eval gate on deploy: a new version of a worker that declares `replay.gate` becomes
active only once a what-if eval over the worker's recent runs passes, unless the deployer
overrides the gate explicitly."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from floom.errors import EvalGateFailed
from floom.hints import act, told
from floom.manifest.replay import EvalGate, replay_rules
from floom.services.access.principal import Principal
from floom.services.replays import evals
from floom.services.workers import versions as workers

if TYPE_CHECKING:
    from floom.services.context import Context
    from floom.services.workers.versions import DeployResult

GATE_TIMEOUT_SECONDS = 600.0
POLL_SECONDS = 0.2


def deploy_gated(
    ctx: Context, *, archive: bytes, caller: Principal, skip_gate: bool = False
) -> DeployResult:
    """Deploy; a version whose manifest declares an eval gate is activated only after the
    eval passes. A failed gate raises EvalGateFailed and leaves the version stored but not
    active (the eval's id is in the details); `skip_gate` activates it without an eval."""
    result = workers.deploy(ctx, archive=archive, caller=caller, activate=False)
    worker, version = result.worker, result.version
    if worker.active_version_id == version.id:
        return result
    gate = replay_rules(workers.manifest_of(version)).gate if version.kind == "agent" else None
    if gate is not None and not skip_gate:
        outcome = run_gate(
            ctx, worker_name=worker.name, version_id=version.id, gate=gate, caller=caller
        )
        if outcome is not None and not outcome["passed"]:
            totals = outcome["totals"]
            raise EvalGateFailed(
                f"version {version.id} of '{worker.name}' is stored but not active: "
                f"{totals['outputs_different']} of {totals['runs']} replayed runs gave other "
                f"outputs (the gate allows {gate.max_different})"
                + ("" if outcome["finished"] else "; the eval did not finish in time"),
                hint=told(
                    "see ",
                    act("eval", worker=worker.name, version=version.id),
                    "; to activate it anyway, deploy again with ",
                    act("deploy", folder="FOLDER", skip_eval_gate=True),
                ),
                details={"eval_id": outcome["id"], "version_id": version.id, "totals": totals},
            )
    workers.rollback(ctx, name=worker.name, version_id=version.id, caller=caller)
    active = workers.get_worker(ctx, name=worker.name, caller=caller)
    return replace(result, worker=active, activated=True)


def run_gate(
    ctx: Context,
    *,
    worker_name: str,
    version_id: str,
    gate: EvalGate,
    caller: Principal,
    timeout: float = GATE_TIMEOUT_SECONDS,
) -> dict[str, Any] | None:
    """The gate's eval report with "passed", or None when there is no recorded run to
    replay yet (a gate cannot judge a worker that never ran). Needs the run scope (it starts
    an eval)."""
    caller.require("run")
    selector = f"last:{gate.runs}"
    if not evals.select_runs(ctx, worker_name=worker_name, selector=selector, caller=caller):
        return None
    row = evals.start_eval(
        ctx, worker_name=worker_name, selector=selector, version_id=version_id, caller=caller
    )
    deadline = time.monotonic() + timeout
    report = evals.eval_report(ctx, eval_id=row.id, caller=caller)
    while not report["finished"] and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        report = evals.eval_report(ctx, eval_id=row.id, caller=caller)
    different = report["totals"]["outputs_different"]
    report["passed"] = report["finished"] and different <= gate.max_different
    return report
