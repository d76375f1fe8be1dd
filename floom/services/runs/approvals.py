"""Approvals: durable pauses a person decides (approve, approve with edits, reject).

A run pauses in one transaction that writes the approval and moves the run to
`awaiting_approval`, freeing its executor slot. A decision requeues the run (phase "apply"
after a run-level approval, "resume" after a tool-call decision), so whichever executor
claims it next, in any process, continues from the stored state. A run-level rejection
ends the run as `rejected`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlmodel import Session, col, select

from floom import jsonvalues
from floom.errors import Conflict, Forbidden, InvalidRequest, NotFound, RunErrorCode, quoted
from floom.hints import KeyWith, act, told
from floom.hints import cli as cli_hints
from floom.services import paging
from floom.services.access.principal import Principal
from floom.services.runs.agent import replace_artifacts, stage_artifacts
from floom.services.runs.logs import system_event
from floom.services.runs.rules import (
    AWAITING_APPROVAL,
    CALLER,
    EXECUTOR,
    QUEUED,
    REJECTED,
    RUNNING,
    transition,
)
from floom.services.workers import versions as workers
from floom.store import signals
from floom.store.agents import Approval, ToolCall
from floom.store.db import session_scope
from floom.store.models import Run, Version, new_id, utcnow
from floom.vocabulary import ApprovalKind, ApprovalStatus, Decision, ToolCallStatus

if TYPE_CHECKING:
    from floom.services.context import Context

PENDING = ApprovalStatus.PENDING
APPROVED = ApprovalStatus.APPROVED
REJECTED_DECISION = ApprovalStatus.REJECTED
# A pending approval whose run was cancelled before anyone decided.
WITHDRAWN = ApprovalStatus.CANCELLED
APPROVAL_STATUSES: tuple[ApprovalStatus, ...] = tuple(ApprovalStatus)
KINDS: tuple[ApprovalKind, ...] = tuple(ApprovalKind)
DECISIONS: tuple[Decision, ...] = tuple(Decision)
PHASE_APPLY = "apply"
PHASE_RESUME = "resume"
MAX_COMMENT_CHARS = 4000
"""A decision's comment is kept on the approval, in the run's log and (a rejection's) its
error, is handed to the apply phase in decision.json and to the agent with every later
turn: a few paragraphs, as a handoff's reason."""


def new_approval(
    *,
    run: Run,
    kind: ApprovalKind,
    proposed: dict[str, Any],
    tool: str | None = None,
    tool_call_id: str | None = None,
    approval_id: str | None = None,
) -> Approval:
    """An unsaved pending approval for `pause_run` to store."""
    return Approval(
        id=approval_id or new_id("apr"),
        run_id=run.id,
        worker_name=run.worker_name,
        kind=kind,
        tool=tool,
        tool_call_id=tool_call_id,
        proposed_json=jsonvalues.dumps(proposed, where="proposed"),
    )


def pause_run(
    ctx: Context,
    *,
    run: Run,
    approval: Approval,
    proposed_outputs: dict[str, Any] | None = None,
    artifacts: Sequence[tuple[str, bytes, str]] | None = None,
    sandbox_seconds: float = 0.0,
) -> bool:
    """Store `approval` and move the running run to awaiting_approval, releasing its lease.

    Returns False, writing nothing, when this node no longer holds the run or a cancel was
    requested meanwhile; the caller then ends the attempt as it otherwise would.
    """
    # Outside the transaction: an object store's upload may take a while.
    staged = stage_artifacts(ctx, artifacts) if artifacts is not None else None
    with session_scope(ctx.engine, write=True) as s:
        current = s.get(Run, run.id, with_for_update=True)
        if (
            current is None
            or current.status != RUNNING
            or current.lease_owner != ctx.node_id
            or current.lease_epoch != run.lease_epoch  # fenced: another node took the run
            or current.cancel_requested
        ):
            return False
        s.add(approval)
        if staged is not None:
            replace_artifacts(s, run_id=run.id, artifacts=staged)
        if proposed_outputs is not None:
            current.outputs_json = jsonvalues.dumps(proposed_outputs, where="outputs")
        transition(current, AWAITING_APPROVAL, by=EXECUTOR)
        current.sandbox_seconds += sandbox_seconds
        s.add(current)
        what = (
            f"tool call {approval.tool}"
            if approval.kind == ApprovalKind.TOOL_CALL
            else "its outputs"
        )
        system_event(
            s,
            run_id=run.id,
            attempt=current.attempt,
            # Stored as the CLI writes it; each surface reads it back in its terms.
            message=cli_hints.written(
                told(
                    f"awaiting approval {approval.id} of {what}: decide with ",
                    act("approve", approval_id=approval.id),
                    " or ",
                    act("reject", approval_id=approval.id, comment="WHY"),
                )
            ),
        )
    return True


def list_approvals(
    ctx: Context,
    *,
    status: str | None = PENDING,
    run_id: str | None = None,
    worker: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
    caller: Principal,
) -> tuple[list[Approval], str | None]:
    """Oldest first; `status` None (or "all") lists every status; `run_id` and `worker` keep
    one run's or one worker's; `cursor` is the last id seen. Needs the read scope."""
    caller.require("read")
    if status == "all":
        status = None
    if status is not None and status not in APPROVAL_STATUSES:
        raise InvalidRequest(
            f"unknown approval status '{quoted(status)}'",
            hint=f"one of {', '.join(APPROVAL_STATUSES)}, or all",
        )
    paging.check_limit(limit)
    q = select(Approval).order_by(col(Approval.id)).limit(limit + 1)
    if status is not None:
        q = q.where(Approval.status == status)
    if run_id:
        q = q.where(Approval.run_id == run_id)
    if worker:
        q = q.where(Approval.worker_name == worker)
    if cursor := paging.id_cursor(cursor, prefix="apr"):
        q = q.where(Approval.id > cursor)
    with session_scope(ctx.engine) as s:
        rows = list(s.exec(q).all())
    next_cursor = rows[limit - 1].id if len(rows) > limit else None
    return rows[:limit], next_cursor


def approvals_of_run(ctx: Context, *, run_id: str, caller: Principal) -> list[Approval]:
    """A run's approvals, oldest first. Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        return list(
            s.exec(
                select(Approval).where(Approval.run_id == run_id).order_by(col(Approval.id))
            ).all()
        )


def get_approval(ctx: Context, *, approval_id: str, caller: Principal) -> Approval:
    """One approval; NotFound when there is none. Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        return _get(s, approval_id)


def _get(s: Session, approval_id: str, *, lock: bool = False) -> Approval:
    approval = s.get(Approval, approval_id, with_for_update=lock)
    if approval is None:
        raise NotFound(
            f"no approval {quoted(approval_id)}",
            hint=told(act("approvals"), " lists the pending ones"),
        )
    return approval


def _require_edit_scope(s: Session, caller: Principal, approval: Approval) -> None:
    """Edited arguments choose what a tool does (a command, a request and the secrets its
    placeholders fill in), as a deploy chooses what a worker does: they need the deploy
    scope, where approving a call as proposed or rejecting it needs only run."""
    if not caller.can("deploy"):
        raise Forbidden(
            f"editing the arguments of a tool call ({approval.tool}) needs the 'deploy' scope: "
            "the edits choose what the tool does; nothing was decided",
            hint=told(
                "approve it as proposed, or reject it with a comment saying what to change; "
                "or use ",
                KeyWith("deploy"),
            ),
            details={"scope_needed": "deploy"},
        )
    caller.require_in(s, "deploy")


def decide_approval(
    ctx: Context,
    *,
    approval_id: str,
    decision: str,
    edited: dict[str, Any] | None = None,
    comment: str | None = None,
    caller: Principal,
) -> Approval:
    """Approve (optionally replacing proposed values key by key with `edited`) or reject.

    Approving a run's outputs queues its apply phase; rejecting them ends the run as
    rejected. A tool-call decision queues the run to resume, where an approved call runs
    (with the edited arguments) and a rejected one reaches the model as a refusal carrying
    the comment. Deciding twice, or an approval whose run moved on, is a Conflict. Needs
    the run scope; editing a tool call's arguments needs the deploy scope.
    """
    caller.require("run")
    actor = caller.actor
    if decision not in DECISIONS:
        raise InvalidRequest(f"unknown decision '{quoted(decision)}'", hint="approve or reject")
    if edited is not None and not isinstance(edited, dict):
        raise InvalidRequest(
            "edited must be a JSON object of the values to change",
            hint='e.g. {"title": "a better title"}',
        )
    if edited is not None:
        jsonvalues.check(edited, where="edited", max_bytes=ctx.settings.max_result_bytes)
    comment = (comment or "").strip() or None
    if comment is not None and len(comment) > MAX_COMMENT_CHARS:
        raise InvalidRequest(
            f"the comment is {len(comment)} characters; at most {MAX_COMMENT_CHARS}",
            hint="say it in short; nothing was decided",
        )
    if decision == Decision.REJECT:
        if edited:
            raise InvalidRequest("edits come with an approval, not a rejection", hint="drop edited")
        if not comment:
            raise InvalidRequest(
                "a rejection needs a comment saying why",
                hint="the agent (or the worker's owner) reads it: `--comment 'reason'`",
            )
    with session_scope(ctx.engine, write=True) as s:
        approval = _get(s, approval_id, lock=True)
        if edited and approval.kind == ApprovalKind.TOOL_CALL:
            _require_edit_scope(s, caller, approval)
        if approval.status != PENDING:
            by = f" by {approval.decided_by}" if approval.decided_by else ""
            raise Conflict(
                f"approval {approval_id} is already {approval.status}{by}",
                hint=told(act("approvals"), " lists the pending ones"),
            )
        run = s.get(Run, approval.run_id, with_for_update=True)
        if run is None or run.status != AWAITING_APPROVAL:
            state = run.status if run else "gone"
            raise Conflict(
                f"run {approval.run_id} is {state}, not awaiting this approval",
                hint=told(act("show", run_id=approval.run_id), " shows what happened"),
            )
        final = {**jsonvalues.stored(approval.proposed_json, expect=dict), **(edited or {})}
        if approval.kind == ApprovalKind.RUN and decision == Decision.APPROVE:
            version = s.get(Version, run.version_id)
            if version is not None:
                problems = workers.manifest_of(version).check_outputs(final)
                if problems:
                    raise InvalidRequest(
                        "the edited outputs do not match worker.yml: "
                        + "; ".join(f"{p.path}: {p.message}" for p in problems),
                        hint="fix the edited values; nothing was decided",
                        details=[p.to_dict() for p in problems],
                    )
        now = utcnow()
        approval.status = APPROVED if decision == Decision.APPROVE else REJECTED_DECISION
        approval.edited_json = jsonvalues.dumps(edited, where="edited") if edited else None
        approval.comment = comment
        approval.decided_by = actor
        approval.decided_at = now
        s.add(approval)
        _apply_decision(s, run=run, approval=approval, final=final, actor=actor)
        if run.status == QUEUED:
            signals.publish(s, signals.RUN_QUEUED)
    ctx.node.run_queued()
    return approval


def _apply_decision(
    s: Session, *, run: Run, approval: Approval, final: dict[str, Any], actor: str | None
) -> None:
    who = f" by {actor}" if actor else ""
    note = f": {approval.comment}" if approval.comment else ""
    approved = approval.status == APPROVED
    if approval.kind == ApprovalKind.RUN and not approved:
        transition(
            run,
            REJECTED,
            by=CALLER,
            now=approval.decided_at,
            error_code=RunErrorCode.REJECTED,
            error_message=f"outputs rejected{who}{note}",
        )
        run.outputs_json = None
        message = f"rejected{who}{note}"
    else:
        transition(run, QUEUED, by=CALLER)
        if approval.kind == ApprovalKind.RUN:
            run.outputs_json = jsonvalues.dumps(final, where="outputs")
            run.phase = PHASE_APPLY
            edits = " with edits" if approval.edited_json else ""
            message = f"outputs approved{who}{edits}{note}; apply phase queued"
        else:
            # A tool call gated inside the apply phase resumes in the apply phase.
            run.phase = PHASE_APPLY if run.phase == PHASE_APPLY else PHASE_RESUME
            verb = "approved" if approved else "rejected"
            message = f"tool call {approval.tool} {verb}{who}{note}; resuming"
    s.add(run)
    system_event(s, run_id=run.id, attempt=run.attempt, message=message)


def withdraw_pending(s: Session, *, run_id: str, actor: str | None = None) -> None:
    """Mark a cancelled run's pending approvals as cancelled, inside the caller's session."""
    now = utcnow()
    for approval in s.exec(
        select(Approval).where(Approval.run_id == run_id, Approval.status == PENDING)
    ).all():
        approval.status = WITHDRAWN
        approval.decided_by = actor
        approval.decided_at = now
        approval.comment = "the run was cancelled"
        s.add(approval)
        if approval.tool_call_id:
            call = s.get(ToolCall, approval.tool_call_id)
            if call is not None and call.status == ToolCallStatus.AWAITING_APPROVAL:
                call.status = ToolCallStatus.CANCELLED
                s.add(call)
