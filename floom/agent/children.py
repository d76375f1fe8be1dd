"""invoke_worker: an agent starts a run of another worker, linked to its own, and waits."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from floom.agent.tools import ToolError
from floom.engine.phases import claim_run
from floom.errors import FloomError
from floom.schemas.runs import RunPublic
from floom.services.access import principal
from floom.services.runs import lifecycle as runs
from floom.services.runs import rules as run_rules
from floom.store.db import session_scope
from floom.store.models import Run
from floom.vocabulary import RunTrigger

if TYPE_CHECKING:
    from floom.agent.builtin import AgentEnv
    from floom.services.context import Context

WAIT_POLL_SECONDS = 0.2


def call_depth(ctx: Context, run: Run) -> int:
    """How many agent runs started this one (0 for a run nobody's agent started)."""
    depth, parent = 0, run.parent_run_id
    with session_scope(ctx.engine) as s:
        while parent and depth < 100:
            depth += 1
            row = s.get(Run, parent)
            parent = row.parent_run_id if row else None
    return depth


def invoke_child(env: AgentEnv, *, worker: str, inputs: dict[str, Any]) -> dict[str, Any]:
    ctx = env.ctx
    if worker not in env.manifest.calls:
        allowed = ", ".join(env.manifest.calls) or "none"
        raise ToolError(f"refused: '{worker}' is not in this worker's calls: ({allowed})")
    limit = ctx.settings.agent_max_depth
    if call_depth(ctx, env.run) + 1 > limit:
        raise ToolError(
            f"refused: runs may call workers only {limit} levels deep (FLOOM_AGENT_MAX_DEPTH)"
        )
    try:
        child = runs.create_run(
            ctx,
            worker_name=worker,
            inputs=inputs,
            trigger=RunTrigger.AGENT,
            # The parent run's own tool allowed this child; floom starts it for that run.
            caller=principal.system(env.run.id),
            parent_run_id=env.run.id,
        )
    except FloomError as exc:
        hint = f" ({exc.hint})" if exc.hint else ""
        raise ToolError(f"{exc.message}{hint}") from exc
    env.run_log.add("system", f"started run {child.id} of {worker}")
    claimed = claim_run(ctx, run_id=child.id)
    if claimed is not None:
        env.host.run_claimed_inline(claimed)
    while True:
        current = runs.get_run(ctx, run_id=child.id, caller=principal.SYSTEM)
        if current.status in run_rules.FINISHED or current.status in run_rules.WAITING:
            break
        if env.cancelled():
            raise ToolError(f"cancelled while waiting for run {child.id}")
        if env.remaining() <= 0:
            raise ToolError(f"out of time waiting for run {child.id}; it goes on without you")
        time.sleep(WAIT_POLL_SECONDS)
    body = RunPublic.of(current)
    return {
        "run_id": current.id,
        "worker": worker,
        "status": current.status,
        "outputs": body.outputs,
        "error": body.error.model_dump() if body.error else None,
    }
