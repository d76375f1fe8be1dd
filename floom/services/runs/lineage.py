"""A run's family: the runs that replay or retry it, and the runs it started (child runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlmodel import col, or_, select

from floom.services.access.principal import Principal
from floom.store.db import session_scope
from floom.store.models import Run

if TYPE_CHECKING:
    from floom.services.context import Context

MAX_CHILDREN = 100


def child_runs(ctx: Context, *, run_id: str, caller: Principal) -> list[Run]:
    """Runs started from this one (replays, retries, runs it called), oldest first. Needs the
    read scope."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        return list(
            s.exec(
                select(Run)
                .where(
                    or_(
                        col(Run.replay_of) == run_id,
                        col(Run.retry_of) == run_id,
                        col(Run.parent_run_id) == run_id,
                    )
                )
                .order_by(col(Run.id))
                .limit(MAX_CHILDREN)
            ).all()
        )


def last_runs(ctx: Context, *, worker_names: list[str], caller: Principal) -> dict[str, Run]:
    """The newest run of each named worker that has run at all. Needs the read scope."""
    caller.require("read")
    found: dict[str, Run] = {}
    with session_scope(ctx.engine) as s:
        for name in worker_names:
            row = s.exec(
                select(Run).where(Run.worker_name == name).order_by(col(Run.id).desc()).limit(1)
            ).first()
            if row is not None:
                found[name] = row
    return found
