"""`floom approvals`, `floom approve`, `floom reject`, and the agent part of `floom show`:
thin clients of the approvals REST API."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.text import Text

from floom.cli.common import JsonOpt, json_object_option, open_client
from floom.cli.output import new_table, out, print_json, status_text, when
from floom.cut import cut
from floom.schemas.runs import ApprovalDecided, ApprovalPublic, ApprovalQuery, RunDetail
from floom.vocabulary import ApprovalKind, ApprovalStatus, ToolCallStatus

APPROVAL_STYLES: dict[str, str] = {
    ApprovalStatus.PENDING: "yellow",
    ApprovalStatus.APPROVED: "green",
    ApprovalStatus.REJECTED: "red",
    ApprovalStatus.CANCELLED: "dim",
}
TOOL_STYLES: dict[str, str] = {
    ToolCallStatus.OK: "green",
    ToolCallStatus.ERROR: "red",
    ToolCallStatus.REFUSED: "red",
    ToolCallStatus.REJECTED: "red",
    ToolCallStatus.AWAITING_APPROVAL: "yellow",
    ToolCallStatus.CANCELLED: "dim",
}


def register(app: typer.Typer) -> None:
    """Add `floom approvals`, `floom approve` and `floom reject` to the floom command."""
    app.command("approvals")(list_approvals)
    app.command("approve")(approve)
    app.command("reject")(reject)


def _short(value: Any, width: int = 70) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return cut(" ".join(text.split()), width)


def _what(a: ApprovalPublic) -> str:
    return f"tool {a.tool}" if a.kind == ApprovalKind.TOOL_CALL else "run outputs"


def list_approvals(
    status: Annotated[
        str, typer.Option(help="pending, approved, rejected, cancelled or all")
    ] = "pending",
    run: Annotated[str | None, typer.Option("--run", help="only this run's approvals")] = None,
    worker: Annotated[
        str | None, typer.Option("--worker", help="only this worker's approvals")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="approvals per page")] = 50,
    cursor: Annotated[str | None, typer.Option(help="continue after this page")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List approvals, oldest first (pending ones unless --status)."""
    with open_client() as client:
        query = ApprovalQuery(status=status, run_id=run, worker=worker, cursor=cursor, limit=limit)
        page = client.list_approvals(query)
    if as_json:
        print_json(page)
        return
    table = new_table("APPROVAL", "RUN", "WORKER", "WHAT", "STATUS", "CREATED", "PROPOSED")
    for a in page.items:
        table.add_row(
            a.id,
            a.run_id,
            a.worker,
            _what(a),
            Text(a.status, style=APPROVAL_STYLES.get(a.status, "")),
            when(a.created_at),
            _short(a.proposed),
        )
    if table.row_count:
        out.print(table)
        if status == ApprovalStatus.PENDING:
            out.print(
                Text(
                    "decide with `floom approve ID [--edit JSON] [--comment TEXT]` or "
                    "`floom reject ID --comment TEXT`",
                    style="dim",
                )
            )
    else:
        out.print(
            "no approvals match" if status != ApprovalStatus.PENDING else "nothing awaits approval"
        )
    if page.next_cursor:
        out.print(
            Text(
                f"more: floom approvals --status {status} --cursor {page.next_cursor}",
                style="dim",
            )
        )


def _parse_edit(value: str | None) -> dict[str, Any] | None:
    if value is None:
        return None
    return json_object_option(value, option="--edit", example='{"title": "..."}')


def _print_decision(body: ApprovalDecided, verb: str) -> None:
    line = Text(f"{verb} {body.id} ({_what(body)}); run {body.run_id} is now ")
    line.append_text(status_text(body.run_status))
    out.print(line)


def approve(
    approval_id: Annotated[str, typer.Argument(help="approval id")],
    edit: Annotated[
        str | None,
        typer.Option(
            "--edit",
            metavar="JSON",
            help="values replacing the proposed ones, key by key (or @file)",
        ),
    ] = None,
    comment: Annotated[str | None, typer.Option(help="a note kept with the decision")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Approve a pending tool call or run outputs, optionally with edits; the run goes on."""
    edited = _parse_edit(edit)
    with open_client() as client:
        body = client.approve(approval_id, edited=edited, comment=comment)
    if as_json:
        print_json(body)
    else:
        _print_decision(body, "approved")


def reject(
    approval_id: Annotated[str, typer.Argument(help="approval id")],
    comment: Annotated[str, typer.Option(help="why: the agent or the worker's owner reads it")],
    as_json: JsonOpt = False,
) -> None:
    """Reject: a tool call goes back to the agent as a refusal; run outputs end the run."""
    with open_client() as client:
        body = client.reject(approval_id, comment=comment)
    if as_json:
        print_json(body)
    else:
        _print_decision(body, "rejected")


def print_agent_details(r: RunDetail) -> None:
    """The tool calls, approvals and model usage of a run, for `floom show`."""
    usage = r.model_usage
    if usage:
        out.print(
            Text(
                f"model: {usage.model}, {usage.iterations} turn"
                f"{'' if usage.iterations == 1 else 's'}, "
                f"{usage.input_tokens} in + {usage.output_tokens} out tokens, "
                f"~${usage.cost_usd:.4f}"
            )
        )
    if r.tool_calls:
        out.print("tool calls:")
        table = new_table("  #", "TOOL", "STATUS", "MS", "ARGUMENTS", "RESULT")
        for c in r.tool_calls:
            result = c.error or c.result or ""
            table.add_row(
                f"  {c.seq}",
                c.tool,
                Text(c.status, style=TOOL_STYLES.get(c.status, "")),
                str(c.duration_ms),
                _short(c.arguments, 50),
                _short(result, 50),
            )
        out.print(table)
    for a in r.approvals:
        line = Text(f"approval {a.id} ({_what(a)}): ")
        line.append(a.status, style=APPROVAL_STYLES.get(a.status, ""))
        if a.decided_by:
            line.append(f" by {a.decided_by}")
        if a.comment:
            line.append(f": {a.comment}")
        out.print(line)
