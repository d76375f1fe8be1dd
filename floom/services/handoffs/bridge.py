"""The bridge from handoff jobs to workers: a worker declaring `handoff: {role: reviewer}`
has floom claim that role's jobs, run the worker with the job's context as inputs, and
complete or fail the job with the run's outputs and artifacts.

Each worker acts as its own agent, labelled "worker:<name>". All state lives in the
database (the job's run_id), so any node can finish what another started, and a node that
dies mid-way loses nothing: the job's lease runs out and it is published again. A crash
between starting the run and recording it can run a job twice (at least once, never lost).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, func, select

from floom import jsonvalues
from floom.cut import cut
from floom.errors import FloomError, InvalidRequest, StoreUnavailable
from floom.services.access import principal
from floom.services.handoffs import flow, rules
from floom.services.handoffs.agents import WORKER_PREFIX, Actor
from floom.services.handoffs.jobs import record
from floom.services.runs import lifecycle as runs
from floom.services.runs import rules as run_rules
from floom.services.workers import versions as workers
from floom.store.db import session_scope
from floom.store.handoffs import Agent, AgentRole, Job, Role
from floom.store.models import Worker, new_id
from floom.store.triggers import Trigger
from floom.vocabulary import RunTrigger, TriggerKind

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.handoffs")

TOOL_FAMILY = "floom-worker"


@dataclass(frozen=True)
class Bridge:
    worker: str
    roles: list[str]
    concurrency: int


def agent_label(worker: str) -> str:
    return f"{WORKER_PREFIX}{worker}"


def _bridges(s: Session) -> list[Bridge]:
    """Workers with live handoff triggers (not removed, not paused, worker not paused)."""
    q = (
        select(Trigger, Worker)
        .join(Worker, col(Worker.name) == col(Trigger.worker_name))
        .where(
            Trigger.kind == TriggerKind.HANDOFF,
            col(Trigger.removed_at).is_(None),
            col(Trigger.paused).is_(False),
            col(Worker.paused).is_(False),
            col(Worker.active_version_id).is_not(None),
        )
        .order_by(col(Trigger.worker_name), col(Trigger.position))
    )
    found: dict[str, list[str]] = {}
    for trigger, _ in s.exec(q).all():
        role = jsonvalues.stored(trigger.config_json, expect=dict).get("role")
        if isinstance(role, str) and role:
            found.setdefault(trigger.worker_name, []).append(role)
    return [Bridge(worker=w, roles=r, concurrency=1) for w, r in found.items()]


def _actor(ctx: Context, bridge: Bridge) -> Actor:
    """The worker's agent, created on first use, holding exactly its triggers' roles."""
    label = agent_label(bridge.worker)
    with session_scope(ctx.engine) as s:
        agent, roles, held = _agent_state(s, label, bridge.roles)
    if agent is None or held != {r.id for r in roles}:
        # Written only on a change, so an idle bridge does not take the write lock each pass.
        with session_scope(ctx.engine, write=True) as s:
            agent, roles, held = _agent_state(s, label, bridge.roles)
            if agent is None:
                agent = Agent(id=new_id("agt"), label=label, tool_family=TOOL_FAMILY)
                s.add(agent)
                s.flush()
            wanted = {r.id for r in roles}
            for link in s.exec(select(AgentRole).where(AgentRole.agent_id == agent.id)).all():
                if link.role_id not in wanted:
                    s.delete(link)
            for role_id in wanted - held:
                s.add(AgentRole(agent_id=agent.id, role_id=role_id))
    return Actor(
        key_id=None,
        agent_id=agent.id,
        label=label,
        admin=False,
        roles={r.id: r.name for r in roles},
    )


def _agent_state(
    s: Session, label: str, names: list[str]
) -> tuple[Agent | None, list[Role], set[str]]:
    agent = s.exec(select(Agent).where(Agent.label == label)).first()
    roles = list(
        s.exec(select(Role).where(col(Role.name).in_(names), col(Role.retired_at).is_(None))).all()
    )
    held: set[str] = set()
    if agent is not None:
        held = set(s.exec(select(AgentRole.role_id).where(AgentRole.agent_id == agent.id)).all())
    return agent, roles, held


def _in_flight(ctx: Context, agent_id: str) -> int:
    with session_scope(ctx.engine) as s:
        q = (
            select(func.count())
            .select_from(Job)
            .where(Job.assignee_agent_id == agent_id, Job.status == rules.IN_PROGRESS)
        )
        return int(s.exec(q).one())


def _inputs_for(ctx: Context, worker: str, context: dict[str, Any]) -> dict[str, Any]:
    """The job's context as the worker's inputs: keys the worker does not declare stay out."""
    found = workers.get_worker(ctx, name=worker, caller=principal.SYSTEM)
    version = workers.get_version(
        ctx, version_id=found.active_version_id or "", caller=principal.SYSTEM
    )
    declared = workers.manifest_of(version).inputs
    return {k: v for k, v in context.items() if k in declared}


def _under_claim(actor: Actor, job: Job) -> Actor:
    """`actor` acting under the claim of `job` as it was read: refused once the job has been
    claimed again (a pass of this worker's on another node, after this one's lease ran out)."""
    return replace(actor, claim=job.claimed_at)


def _start(ctx: Context, bridge: Bridge, actor: Actor, job: Job) -> None:
    actor = _under_claim(actor, job)
    try:
        inputs = _inputs_for(ctx, bridge.worker, jsonvalues.stored(job.context_json, expect=dict))
        run = runs.create_run(
            ctx,
            worker_name=bridge.worker,
            inputs=inputs,
            trigger=RunTrigger.HANDOFF,
            caller=principal.system(agent_id=actor.agent_id),
        )
    except StoreUnavailable:
        raise  # not the job's fault, nor lasting: the bridge's next pass tries it again
    except FloomError as exc:
        # The hint says how to let it start (resume it, deploy a version), as a floom command
        # that each caller is told in its own terms (views.handoffs.job_public).
        hint = f"; {exc.hint}" if exc.hint else ""
        reason = f"worker {bridge.worker} could not start: {exc.message}{hint}"
        reason = cut(reason, rules.MAX_REASON_CHARS)
        flow.set_status(ctx, actor=actor, job_id=job.id, status=rules.FAILED, reason=reason)
        return
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(Job, job.id, with_for_update=True)
        lost = (
            row is None
            or row.assignee_agent_id != actor.agent_id
            or row.claimed_at != job.claimed_at
        )
        if row is not None and not lost:
            row.run_id = run.id
            s.add(row)
            record(
                s,
                row,
                type="run_started",
                actor=actor,
                before=row.status,
                payload={"run_id": run.id, "worker": bridge.worker},
            )
    if lost:
        # Claimed again meanwhile (this pass stalled past its lease, and another node's pass
        # started the job's run), or gone: this run would do the job a second time, unlinked.
        log.warning(
            "handoff job %s was claimed again while run %s of %s was being started for it; "
            "the run is cancelled",
            job.id,
            run.id,
            bridge.worker,
        )
        runs.cancel_run(ctx, run_id=run.id, caller=principal.SYSTEM)


def _finish(ctx: Context, actor: Actor, job: Job) -> None:
    """Complete or fail a bridged job whose run ended; extend the lease while it runs. Under
    the claim `job` was read with: a job claimed again since is left to its newer claim."""
    actor = _under_claim(actor, job)
    run = runs.get_run(ctx, run_id=job.run_id or "", caller=principal.SYSTEM)
    if run.status not in run_rules.FINISHED:
        flow.heartbeat(ctx, actor=actor, job_id=job.id)
        return
    if run.status == run_rules.SUCCEEDED:
        artifacts = [
            {
                "type": "floom-artifact",
                "uri": f"/api/v1/runs/{a.run_id}/artifacts/{a.name}",
                "checksum": f"sha256:{a.digest}",
                "metadata": {"name": a.name, "size": a.size, "content_type": a.content_type},
            }
            for a in runs.list_artifacts(ctx, run_id=run.id, caller=principal.SYSTEM)
        ]
        outputs = jsonvalues.stored(run.outputs_json, expect=dict) if run.outputs_json else {}
        try:
            flow.complete(
                ctx,
                actor=actor,
                job_id=job.id,
                summary=f"run {run.id} of {run.worker_name} succeeded",
                data={"run_id": run.id, "outputs": outputs},
                artifacts=artifacts,
            )
        except InvalidRequest as exc:
            # The run's result is over what a job's holds (its outputs' size, its number of
            # artifacts): that never changes, so the job fails saying so. Left in progress, it
            # would be published again at its lease's end and run again, for ever.
            reason = (
                f"run {run.id} of {run.worker_name} succeeded, but its result cannot be the "
                f"job's: {exc.message}; its outputs and artifacts stay with the run"
            )
            reason = cut(reason, rules.MAX_REASON_CHARS)
            flow.set_status(ctx, actor=actor, job_id=job.id, status=rules.FAILED, reason=reason)
        return
    reason = f"run {run.id} of {run.worker_name} {run.status}"
    if run.error_message:
        reason += f": {run.error_message}"
    # A run's error is the worker's to write: cut to what a reason holds.
    reason = cut(reason, rules.MAX_REASON_CHARS)
    flow.set_status(ctx, actor=actor, job_id=job.id, status=rules.FAILED, reason=reason)


def tick(ctx: Context) -> int:
    """One pass: finish the jobs whose runs ended, then claim work for idle workers.
    Returns how many jobs were claimed. Safe to run on several nodes at once."""
    return bridge_pass(ctx).claimed


@dataclass(frozen=True)
class BridgePass:
    """What one pass found: jobs claimed, and whether any worker bridges roles or any bridged
    job is in progress (when neither, the next pass can wait)."""

    claimed: int
    busy: bool


def bridge_pass(ctx: Context) -> BridgePass:
    """tick, also saying whether there was anything to bridge."""
    with session_scope(ctx.engine) as s:
        bridges = _bridges(s)
        running = list(
            s.exec(
                select(Job, Agent)
                .join(Agent, col(Agent.id) == col(Job.assignee_agent_id))
                .where(
                    Job.status == rules.IN_PROGRESS,
                    col(Job.run_id).is_not(None),
                    Agent.tool_family == TOOL_FAMILY,
                )
            ).all()
        )
    actors: dict[str, Actor] = {}
    for bridge in bridges:
        try:
            actors[bridge.worker] = _actor(ctx, bridge)
        except IntegrityError:
            continue  # another node created the agent at this moment; next pass uses it
    for job, agent in running:
        worker = agent.label.removeprefix(WORKER_PREFIX)
        actor = actors.get(worker) or Actor(
            key_id=None, agent_id=agent.id, label=agent.label, admin=False, roles={}
        )
        try:
            _finish(ctx, actor, job)
        except FloomError as exc:  # another node finished it, or its lease was lost
            log.debug("bridged job %s not finished here: %s", job.id, exc.message)
        except Exception:
            # One job's trouble must not hold back the rest of the pass: the other jobs'
            # ends and every worker's next claims (its lease runs out if it lasts).
            log.exception("bridged job %s could not be finished; trying again", job.id)
    claimed = 0
    for bridge in bridges:
        worker_actor = actors.get(bridge.worker)
        if worker_actor is None or not worker_actor.roles:
            continue
        while _in_flight(ctx, worker_actor.agent_id or "") < bridge.concurrency:
            taken = flow.claim_next(ctx, actor=worker_actor)
            if taken is None:
                break
            claimed += 1
            _start(ctx, bridge, worker_actor, taken.row)
    return BridgePass(claimed=claimed, busy=bool(bridges or running))
