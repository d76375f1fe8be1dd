"""Run callbacks: whoever starts a run may pass a URL; once the run has ended floom POSTs its
record there, signed as Standard Webhooks with the server's callback key and retried like an
alert delivery. The URL is checked (and the egress guard asked) when the run is started, so a
bad one refuses the start and creates nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlmodel import Session, col, select

from floom import jsonvalues
from floom.errors import InputInvalid
from floom.services.alerts import incidents
from floom.services.alerts.channels import ChannelInvalid, check_url
from floom.services.runs.rules import FINISHED
from floom.store.db import session_scope
from floom.store.models import Artifact, Run, RunCallback
from floom.vocabulary import DeliveryPurpose

if TYPE_CHECKING:
    from floom.services.context import Context

BATCH = 100


def check_callback_url(ctx: Context, url: str | None, *, field: str = "callback_url") -> str | None:
    """The URL, checked; InputInvalid naming `field` when it cannot be used."""
    if url is None:
        return None
    try:
        return check_url(ctx, url, field)
    except ChannelInvalid as exc:
        raise InputInvalid(exc.said, hint=exc.advice, details=exc.details) from exc


def recorder(
    url: str | None, then: Callable[[Session, Run], None] | None = None
) -> Callable[[Session, Run], None] | None:
    """What create_run calls in the run's queueing transaction: the callback is stored with
    the run, or neither is (`then` is another step for the same transaction)."""
    if url is None:
        return then

    def record(s: Session, run: Run) -> None:
        s.add(RunCallback(run_id=run.id, url=url))
        if then is not None:
            then(s, run)

    return record


def queue_ended(ctx: Context) -> int:
    """Queue the callbacks of runs that have ended; how many were queued."""
    with session_scope(ctx.engine, write=True) as s:
        rows = s.exec(
            select(RunCallback, Run)
            .join(Run, col(Run.id) == col(RunCallback.run_id))
            .where(col(RunCallback.delivery_id).is_(None), col(Run.status).in_(sorted(FINISHED)))
            .limit(BATCH)
            .with_for_update(skip_locked=True, of=RunCallback)
        ).all()
        for callback, run in rows:
            delivery = incidents.enqueue(
                ctx,
                s,
                purpose=DeliveryPurpose.CALLBACK,
                body=record_body(ctx, s, run),
                target=callback.url,
                run_id=run.id,
            )
            callback.delivery_id = delivery.id
            s.add(callback)
        return len(rows)


def record_body(ctx: Context, s: Session, run: Run) -> dict[str, Any]:
    """What a callback carries: the run's record as it ended (outputs as stored, redacted)."""
    artifacts = s.exec(
        select(Artifact.name, Artifact.size)
        .where(Artifact.run_id == run.id)
        .order_by(col(Artifact.name))
    ).all()
    return {
        "type": "run.ended",
        "run": {
            "id": run.id,
            "worker": run.worker_name,
            "version_id": run.version_id,
            "status": run.status,
            "trigger": run.trigger,
            "inputs": jsonvalues.stored(run.inputs_json) if run.inputs_json else {},
            "outputs": jsonvalues.stored(run.outputs_json) if run.outputs_json else None,
            "error": {"code": run.error_code, "message": run.error_message}
            if run.error_code or run.error_message
            else None,
            "attempt": run.attempt,
            "created_at": run.created_at.isoformat() if run.created_at else None,
            "started_at": run.started_at.isoformat() if run.started_at else None,
            "finished_at": run.finished_at.isoformat() if run.finished_at else None,
            "sandbox_seconds": run.sandbox_seconds,
            "artifacts": [{"name": name, "size": size} for name, size in artifacts],
            "url": incidents.run_url(ctx, run.id),
        },
    }
