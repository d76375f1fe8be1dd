"""What a script worker's attempt gets in its sandbox, and how its outcome is cleaned."""

from __future__ import annotations

from pathlib import Path

from floom.engine.queue import Outcome
from floom.manifest.schema import Manifest
from floom.sandbox.base import SandboxSpec
from floom.sandbox.fence import fence_key
from floom.services.access.secrets import Redactor
from floom.services.runs.rules import previous_attempt
from floom.store.models import Run

# In the work dir of a worker with `state:`: the state its run starts from (JSON).
STATE_FILE = "state.json"


def script_spec(
    run: Run,
    manifest: Manifest,
    *,
    workdir: Path,
    output_dir: Path,
    secrets: dict[str, str],
    phase: str | None = None,
    command: list[str] | None = None,
    timeout_seconds: float | None = None,
    node_id: str = "",
    files: Path | None = None,
) -> SandboxSpec:
    """The sandbox spec of a script worker's attempt: declared secrets and floom's values.

    An agent's `run_command` passes its own command and the time it has left; everything
    else (environment, network, limits) is the worker's, as for a script. The metadata names
    the run and the node (`node_id`), for a remote backend's labels and orphan reaping."""
    env = {
        **secrets,
        "FLOOM_RUN_ID": run.id,
        "FLOOM_ATTEMPT": str(run.attempt),
        "FLOOM_WORKER": run.worker_name,
        "FLOOM_VERSION_ID": run.version_id,
    }
    if phase:
        env["FLOOM_PHASE"] = phase
    previous = previous_attempt(run)
    if previous:
        env["FLOOM_PREVIOUS_ATTEMPT"] = previous
    metadata = {
        "floom_run_id": run.id,
        "floom_attempt": str(run.attempt),
        "floom_worker": run.worker_name,
        "floom_version": run.version_id,
        **({"floom_node": node_id} if node_id else {}),
    }
    return SandboxSpec(
        run_id=run.id,
        command=command if command is not None else manifest.command(),
        workdir=workdir,
        output_dir=output_dir,
        env=env,
        network=manifest.network == "full",
        network_allow=tuple(manifest.network_allow),
        timeout_seconds=float(
            timeout_seconds if timeout_seconds is not None else manifest.limits.timeout_seconds
        ),
        memory_mb=manifest.limits.memory_mb,
        processes=manifest.limits.processes,
        cpu=manifest.limits.cpu,
        disk_mb=manifest.limits.disk_mb,
        metadata=metadata,
        template=manifest.sandbox.template or "",
        files=files,
        fence=fence_key(run.id, run.lease_epoch),
        warm=run.version_id if manifest.warm else "",
        # The state the run starts from is floom's to give, not the run's to change.
        read_only=(STATE_FILE,) if manifest.state.enabled else (),
    )


def redact_outcome(outcome: Outcome, redactor: Redactor) -> Outcome:
    if outcome.outputs is not None:
        outcome.outputs = redactor.value(outcome.outputs)
    if outcome.error_message:
        outcome.error_message = redactor.text(outcome.error_message)
    return outcome
