"""A run's whole record beyond its row: artifacts, approvals, tool calls and model usage, read
with as few transactions as the run's kind allows (it is read after every wait)."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import bindparam
from sqlalchemy import select as sql_select

from floom.services.access.principal import SYSTEM, Principal
from floom.services.runs import agent as agent_runs
from floom.services.runs import approvals
from floom.services.runs import lifecycle as runs
from floom.services.workers import versions as workers
from floom.store.agents import Approval, ToolCall, Transcript
from floom.store.db import Reader, session_scope
from floom.store.models import Artifact, Run, trusted_row
from floom.store.statements import hot

if TYPE_CHECKING:
    from floom.services.context import Context


class RunRecord(NamedTuple):
    """A run with its artifacts and approvals, as read in one transaction."""

    run: Run
    artifacts: list[Artifact]
    approvals: list[Approval]


class RunExtras(NamedTuple):
    """What a run's record holds beyond its row and artifacts: its approvals, and an agent
    run's tool calls and transcript (its model usage)."""

    approvals: list[Approval]
    tool_calls: list[ToolCall]
    transcript: Transcript | None


def run_extras(
    ctx: Context, *, run: Run, run_approvals: list[Approval] | None = None, caller: Principal
) -> RunExtras:
    """The run's approvals, tool calls and transcript (`run_approvals` when the caller has
    read them already). Needs the read scope."""
    caller.require("read")
    run_id = run.id
    if run_approvals is None:
        run_approvals = (
            approvals.approvals_of_run(ctx, run_id=run_id, caller=caller)
            if may_have_approvals(ctx, run)
            else []
        )
    version = workers.get_version(ctx, version_id=run.version_id, caller=caller)
    if version.kind != "agent":  # scripts make no tool calls and keep no transcript
        return RunExtras(run_approvals, [], None)
    calls = agent_runs.list_tool_calls(ctx, run_id=run_id, caller=caller)
    # The row's usage figures only: an ended run's text is not read from object storage.
    transcript = agent_runs.load_transcript(ctx, run_id=run_id, caller=caller, text=False)
    return RunExtras(run_approvals, calls, transcript)


def may_have_approvals(ctx: Context, run: Run) -> bool:
    """Whether the run can have approvals: an agent's, or a script's behind a run-level
    approval. A version's manifest never changes, so the others never have any. (A rule of
    floom's, not a read for a client: the run was read by a caller already.)"""
    version = workers.get_version(ctx, version_id=run.version_id, caller=SYSTEM)
    return version.kind == "agent" or bool(workers.manifest_of(version).approvals.get("required"))


def run_record(ctx: Context, *, run_id: str, caller: Principal) -> RunRecord:
    """The run with its artifacts and approvals, read in one transaction (a run's whole
    record is read after every wait: one session instead of three). Needs the read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        return record_in_session(ctx, s, runs.peek_run(s, run_id))


def record_in_session(
    ctx: Context, s: Reader, run: Run, *, artifacts: list[Artifact] | None = None
) -> RunRecord:
    """`run`'s record with its artifacts (unless the caller has them, by name) and approvals
    read in the session (or plain connection) that read the run, or that has just written
    it (a rule of floom's, not a read for a client: the caller has the run already). Core
    statements only, so either kind of connection will do."""
    if artifacts is None:
        # Core rows into detached copies: the record is only looked at (~200 us less than
        # the ORM's select, on every waited run).
        artifacts = [
            trusted_row(Artifact, row) for row in ARTIFACTS_OF_RUN.rows(s, {"run_id": run.id})
        ]
    asked: list[Approval] = []
    if may_have_approvals(ctx, run):
        asked = [
            trusted_row(Approval, row._mapping)
            for row in s.execute(_approvals_of_run(), {"run_id": run.id})
        ]
    return RunRecord(run, artifacts, asked)


@lru_cache(maxsize=1)
def _approvals_of_run() -> Any:
    table = Approval.__table__  # type: ignore[attr-defined]
    return sql_select(*table.c).where(table.c.run_id == bindparam("run_id")).order_by(table.c.id)


@lru_cache(maxsize=1)
def _artifacts_of_run() -> Any:
    artifacts = Artifact.__table__  # type: ignore[attr-defined]
    return (
        sql_select(*artifacts.c)
        .where(artifacts.c.run_id == bindparam("run_id"))
        .order_by(artifacts.c.name)
    )


ARTIFACTS_OF_RUN = hot.Statement("artifacts.of_run", _artifacts_of_run)
