"""Handoff jobs and their audit events as answered on each surface."""

from __future__ import annotations

from typing import TYPE_CHECKING

from floom.hints.surface import tell
from floom.schemas.common import Page
from floom.schemas.handoffs import ClaimNextResult, JobEventPublic, JobPublic, stored_payload
from floom.services.access.principal import Surface

if TYPE_CHECKING:
    from floom.services.handoffs.jobs import JobRecord
    from floom.store.handoffs import JobEvent


def event_public(event: JobEvent, *, surface: Surface) -> JobEventPublic:
    """An audit event as answered on `surface`: a reason in its payload told like the job's."""
    payload = stored_payload(event)
    if isinstance(payload.get("reason"), str):
        payload = {**payload, "reason": tell(payload["reason"], surface=surface)}
    return JobEventPublic.of(event, payload=payload)


def job_public(found: JobRecord, *, surface: Surface) -> JobPublic:
    """A job as answered on `surface`. Its reason may quote a run's stored error or a
    blocker's reason, stored in the CLI's notation: what they say to do is told in the
    caller's terms (floom.hints.surface), as a run's own error is."""
    events = [event_public(e, surface=surface) for e in found.events]
    return JobPublic.of(found, reason=tell(found.row.reason, surface=surface), events=events)


def job_page(
    items: list[JobRecord], next_cursor: str | None, *, surface: Surface
) -> Page[JobPublic]:
    return Page[JobPublic](
        items=[job_public(j, surface=surface) for j in items], next_cursor=next_cursor
    )


def claim_next_result(found: JobRecord | None, *, surface: Surface) -> ClaimNextResult:
    return ClaimNextResult(job=None if found is None else job_public(found, surface=surface))


def stored_job(found: JobRecord) -> JobPublic:
    """A job with its reason and events as stored (the web UI tells them as it renders)."""
    events = [JobEventPublic.of(e) for e in found.events]
    return JobPublic.of(found, reason=found.row.reason, events=events)
