"""Handoff jobs and their audit events as answered on each surface."""

from __future__ import annotations

from typing import Any

from floom.hints.surface import tell
from floom.schemas.common import Page
from floom.schemas.handoffs import ClaimNextResult, JobEventPublic, JobPublic
from floom.services.access.principal import Surface


def event_public(event: dict[str, Any], *, surface: Surface) -> JobEventPublic:
    """An audit event as answered on `surface`: a reason in its payload told like the job's."""
    payload = event.get("payload") or {}
    if isinstance(payload.get("reason"), str):
        payload = {**payload, "reason": tell(payload["reason"], surface=surface)}
    return JobEventPublic.model_validate({**event, "payload": payload})


def job_public(job: dict[str, Any], *, surface: Surface) -> JobPublic:
    """A job as answered on `surface`. Its reason may quote a run's stored error or a
    blocker's reason, stored in the CLI's notation: what they say to do is told in the
    caller's terms (floom.hints.surface), as a run's own error is."""
    body = {**job, "reason": tell(job.get("reason"), surface=surface)}
    if job.get("events"):
        body["events"] = [event_public(e, surface=surface) for e in job["events"]]
    return JobPublic.model_validate(body)


def job_page(
    items: list[dict[str, Any]], next_cursor: str | None, *, surface: Surface
) -> Page[JobPublic]:
    return Page[JobPublic](
        items=[job_public(j, surface=surface) for j in items], next_cursor=next_cursor
    )


def claim_next_result(job: dict[str, Any] | None, *, surface: Surface) -> ClaimNextResult:
    return ClaimNextResult(job=None if job is None else job_public(job, surface=surface))
