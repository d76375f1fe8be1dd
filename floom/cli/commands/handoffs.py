"""`floom handoffs`: thin clients of the handoff REST API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from floom import jsonvalues
from floom.cli.common import HandoffSession, JsonOpt
from floom.cli.output import fail, new_table, note, out, print_json, say, value_text, when
from floom.schemas.handoffs import JobPublic, JobQuery, JobRequest

handoffs_app = typer.Typer(help="Handoff jobs: publish, claim, finish and review work by role.")

JOB_STYLES = {
    "pending": "dim",
    "published": "blue",
    "in_progress": "cyan",
    "blocked": "yellow",
    "completed": "green",
    "failed": "red",
    "cancelled": "yellow",
}


def register(app: typer.Typer) -> None:
    """Add `floom handoffs` to the floom command."""
    app.add_typer(handoffs_app, name="handoffs", no_args_is_help=True)


def _json_arg(value: str | None, *, what: str) -> Any:
    """JSON given inline, or as @path to a file."""
    if value is None:
        return None
    try:
        text = Path(value[1:]).read_text() if value.startswith("@") else value
    except OSError as exc:
        fail(f"cannot read {what} from {value[1:]}: {exc.strerror}", "check the path")
    parsed, breach = jsonvalues.parse(text, where=f"the {what}")
    if breach is not None:
        fail(breach.message, 'e.g. \'{"key": "value"}\' or @file.json')
    return parsed


def _artifacts(pairs: list[str]) -> list[dict[str, Any]]:
    found = []
    for pair in pairs:
        kind, sep, uri = pair.partition("=")
        if not sep or not kind or not uri:
            fail(f"'{pair}' is not TYPE=URI", "e.g. --artifact file=s3://bucket/report.md")
        found.append({"type": kind, "uri": uri})
    return found


def _print_job_line(job: JobPublic, verb: str) -> None:
    note(f"{verb} job {job.id} ({job.status}, {job.role}): {value_text(job.summary)}")


def _show(job: JobPublic) -> None:
    # Every text an agent or a worker wrote (constraints, reasons, artifacts, a run's error
    # quoted in a reason) is said on one line: a newline in it would print a line of its own
    # that reads as one of these rows ("  status          completed").
    say(f"{job.id}  {value_text(job.summary)}", style="bold")
    rows = [
        ("status", job.status),
        ("role", job.role),
        ("priority", job.priority),
        ("source", job.source_agent.label if job.source_agent else "-"),
        ("assignee", job.assignee.label if job.assignee else "-"),
        ("attempt", str(job.attempt)),
        ("created", when(job.created_at)),
        ("lease until", when(job.lease_expires_at)),
    ]
    if job.blocked_by:
        rows.append(("blocked by", ", ".join(job.blocked_by)))
    if job.constraints:
        rows.append(("constraints", ", ".join(value_text(c) for c in job.constraints)))
    if job.follow_on_of:
        rows.append(("follow-on of", job.follow_on_of))
    if job.retry_of:
        rows.append(("retry of", job.retry_of))
    if job.superseded_by:
        rows.append(("rejected; retry", job.superseded_by))
    if job.rejection:
        rows.append(("rejection", job.rejection.reason))
    if job.reason:
        rows.append(("reason", job.reason))
    for label, value in rows:
        say(f"  {label:<16}{value_text(value)}")
    if job.context:
        say(f"  {'context':<16}{value_text(job.context)}")
    for artifact in job.artifacts:
        kind, uri = value_text(artifact["type"]), value_text(artifact["uri"])
        say(f"  {'artifact':<16}{kind}: {uri}")
    if job.result:
        say(f"  {'result':<16}{value_text(job.result)}")
    if job.events:
        say("events:", style="bold")
        for e in job.events:
            move = f"{e.from_status or '-'} -> {e.to_status}"
            extra = f"  {value_text(e.payload)}" if e.payload else ""
            say(f"  {when(e.ts)}  {e.type:<16} {move:<26} {value_text(e.actor or '')}{extra}")


# -- jobs ------------------------------------------------------------------------------------


@handoffs_app.command("list")
def handoffs_list(
    status: Annotated[str | None, typer.Option(help="e.g. published or pending,blocked")] = None,
    role: Annotated[str | None, typer.Option(help="only this role's jobs")] = None,
    mine: Annotated[bool, typer.Option("--mine", help="only jobs I hold")] = False,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    cursor: Annotated[str | None, typer.Option(help="continue after this page")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the jobs you can see, newest first."""
    with HandoffSession() as api:
        query = JobQuery(
            status=status.split(",") if status else None,
            role=role,
            assignee="me" if mine else None,
            limit=limit,
            cursor=cursor,
        )
        page = api.list_jobs(query)
    if as_json:
        print_json(page)
        return
    table = new_table("JOB", "STATUS", "ROLE", "PRIORITY", "ASSIGNEE", "CREATED", "SUMMARY")
    for j in page.items:
        assignee = j.assignee.label if j.assignee else ""
        status_text = Text(j.status, style=JOB_STYLES.get(j.status, ""))
        row = (j.id, status_text, j.role, j.priority, assignee)
        table.add_row(*row, when(j.created_at), j.summary[:60])
    out.print(table if table.row_count else "no jobs match")
    if page.next_cursor:
        say(f"more: floom handoffs list --cursor {page.next_cursor}", style="dim")


@handoffs_app.command("show")
def handoffs_show(
    job_id: Annotated[str, typer.Argument(help="job id")], as_json: JsonOpt = False
) -> None:
    """Show a job with its audit events."""
    with HandoffSession() as api:
        job = api.get_job(job_id, events=True)
    print_json(job) if as_json else _show(job)


@handoffs_app.command("create")
def handoffs_create(
    summary: Annotated[str, typer.Argument(help="one line: what is to be done")],
    role: Annotated[str, typer.Option("--role", help="the role that should do it")],
    context: Annotated[str | None, typer.Option(help="JSON object, or @file.json")] = None,
    constraint: Annotated[list[str] | None, typer.Option(help="repeat for several")] = None,
    artifact: Annotated[list[str] | None, typer.Option(help="TYPE=URI; repeatable")] = None,
    priority: Annotated[str, typer.Option(help="low, normal, high, urgent")] = "normal",
    blocked_by: Annotated[list[str] | None, typer.Option(help="job id to wait for")] = None,
    route: Annotated[
        list[str] | None, typer.Option(help="publish a follow-on job for ROLE on completion")
    ] = None,
    routing: Annotated[str | None, typer.Option(help="routing rules as JSON, or @file")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="a retry returns the same job")] = (
        None
    ),
    as_json: JsonOpt = False,
) -> None:
    """Publish a job for a role; its id is printed on stdout."""
    rules = _json_arg(routing, what="routing") or []
    rules += [{"role": r} for r in route or []]
    with HandoffSession() as api:
        spec = JobRequest(
            summary=summary,
            role=role,
            context=_json_arg(context, what="context") or {},
            constraints=constraint or [],
            artifacts=_artifacts(artifact or []),
            priority=priority,
            blocked_by=blocked_by or [],
            routing=rules,
            idempotency_key=idempotency_key,
        )
        job = api.create_job(spec)
    if as_json:
        print_json(job)
        return
    _print_job_line(job, "existing" if job.replayed else "published")
    say(job.id)


@handoffs_app.command("claim")
def handoffs_claim(
    job_id: Annotated[str, typer.Argument(help="job id")], as_json: JsonOpt = False
) -> None:
    """Claim a published job."""
    with HandoffSession() as api:
        job = api.claim(job_id)
    print_json(job) if as_json else _show(job)


@handoffs_app.command("claim-next")
def handoffs_claim_next(
    role: Annotated[str | None, typer.Option(help="only this one of your roles")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Claim the most urgent, then oldest, published job for your roles."""
    with HandoffSession() as api:
        job = api.claim_next(role=role).job
    if as_json:
        print_json(job)
    elif job is None:
        say("no published job for your roles")
    else:
        _show(job)


@handoffs_app.command("heartbeat")
def handoffs_heartbeat(job_id: Annotated[str, typer.Argument(help="job id")]) -> None:
    """Extend your lease on a job you hold."""
    with HandoffSession() as api:
        lease = api.heartbeat(job_id)
    say(f"job {job_id} is yours until {when(lease.lease_expires_at)}")


@handoffs_app.command("status")
def handoffs_status(
    job_id: Annotated[str, typer.Argument(help="job id")],
    status: Annotated[str, typer.Argument(help="blocked, in_progress, published, failed, ...")],
    reason: Annotated[str | None, typer.Option(help="why")] = None,
) -> None:
    """Move a job to another status, as the transition table allows you."""
    with HandoffSession() as api:
        job = api.set_status(job_id, status, reason=reason)
    say(f"job {job.id} is {job.status}")


@handoffs_app.command("update")
def handoffs_update(
    job_id: Annotated[str, typer.Argument(help="job id")],
    context: Annotated[str | None, typer.Option(help="the new context: JSON or @file")] = None,
    constraint: Annotated[list[str] | None, typer.Option(help="the new constraints")] = None,
) -> None:
    """Replace a job's context and/or constraints (its publisher, before completion)."""
    with HandoffSession() as api:
        job = api.update_job(
            job_id, context=_json_arg(context, what="context"), constraints=constraint
        )
    say(f"updated job {job.id}")


@handoffs_app.command("complete")
def handoffs_complete(
    job_id: Annotated[str, typer.Argument(help="job id")],
    summary: Annotated[str, typer.Option(help="what was done")] = "",
    data: Annotated[str | None, typer.Option(help="result data: JSON object or @file")] = None,
    artifact: Annotated[list[str] | None, typer.Option(help="TYPE=URI; repeatable")] = None,
) -> None:
    """Complete a job you hold, with a result."""
    with HandoffSession() as api:
        job = api.complete(
            job_id,
            summary=summary,
            data=_json_arg(data, what="data"),
            artifacts=_artifacts(artifact or []),
        )
    say(f"job {job.id} is {job.status}")


@handoffs_app.command("reject")
def handoffs_reject(
    job_id: Annotated[str, typer.Argument(help="the completed job's id")],
    reason: Annotated[str, typer.Option(help="what must change")],
    role: Annotated[str | None, typer.Option(help="send the retry to another role")] = None,
) -> None:
    """Reject completed work; a linked retry job is published and its id printed."""
    with HandoffSession() as api:
        retry = api.reject(job_id, reason=reason, role=role)
    note(f"rejected job {job_id}; retry attempt {retry.attempt} published")
    say(retry.id)


@handoffs_app.command("reopen")
def handoffs_reopen(
    job_id: Annotated[str, typer.Argument(help="a retry job's id")], as_json: JsonOpt = False
) -> None:
    """The focused context of a retry: original summary, constraints, every rejection."""
    with HandoffSession() as api:
        body = api.reopen_context(job_id)
    if as_json:
        print_json(body)
        return
    say(f"{body.job_id} (attempt {body.attempt}, {body.status}): {value_text(body.summary)}")
    for c in body.constraints:
        say(f"  constraint: {value_text(c)}")
    for r in body.rejections:
        reviewer, reason = value_text(r.reviewer or "-"), value_text(r.reason or "")
        say(f"  attempt {r.attempt} rejected by {reviewer}: {reason}")


@handoffs_app.command("me")
def handoffs_me() -> None:
    """Which agent your key speaks for, and the roles it holds now."""
    with HandoffSession() as api:
        me = api.whoami()
    who = me.agent.label if me.agent else "an admin key without an agent"
    roles = ", ".join(me.roles) or "no roles"
    say(f"{who}{' (admin)' if me.admin else ''}: {roles}")
