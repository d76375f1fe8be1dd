"""Tool results: structured content plus a short text a person (or a model) reads at a glance."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from mcp_types import CallToolResult, TextContent

from floom.cut import cut
from floom.hints import Told
from floom.hints.surface import render as render_told
from floom.invisible import CONTROLS, UNSHOWN, escapes
from floom.manifest.schema import EXPOSE_TARGETS
from floom.schemas.runs import (
    ApprovalPublic,
    ArtifactPublic,
    RunDetail,
    RunEventPublic,
    RunPublic,
)
from floom.schemas.triggers import TriggerPublic
from floom.schemas.workers import ValidationResult, VersionPublic, WorkerPublic
from floom.services import paging
from floom.services.runs.rules import ACTIVE as ACTIVE_STATUSES
from floom.services.runs.rules import FAILED, LIMIT_EXCEEDED, TIMED_OUT, WAITING
from floom.vocabulary import ApprovalStatus

MAX_TEXT_ITEMS = 30
T = TypeVar("T")

# What a worker or a caller wrote (a log line, an error, a title, a summary) is said on one
# line: line breaks and control characters as Python escapes (newline -> `\n`, ESC ->
# `\x1b`), and what reorders, breaks or hides text without showing (floom/invisible.py)
# as `\uXXXX`. So no text of theirs starts a line of its own in a reply, where it could pose
# as floom's ("floom: run succeeded"), or reorders or hides what an agent reads.
_ONE_LINE: dict[int, str] = escapes([*(c for c in CONTROLS if chr(c) != "\t"), *UNSHOWN])
_ONE_LINE.update({ord("\n"): "\\n", ord("\r"): "\\r"})


def said(text: str | None) -> str:
    """`text` a worker or a caller controls, as a reply shows it: on one line (see _ONE_LINE)."""
    return (text or "").translate(_ONE_LINE)


def quoted_lines(text: str) -> str:
    """A file or a text of many lines a worker wrote, as a reply shows it: each of its lines
    said (see _ONE_LINE) after "| ", so none starts a line of the reply as floom's would."""
    lines = text.split("\n")
    if len(lines) > 1 and not lines[-1]:
        lines.pop()  # the file's last newline ends its last line; it starts no empty one
    return "\n".join(f"| {said(line)}" for line in lines)


@dataclass(frozen=True)
class Reply:
    text: str
    data: dict[str, Any]

    def to_result(self) -> CallToolResult:
        # The data once, as structured content; the text is the short summary a person (or a
        # model shown only the content blocks) reads, naming ids and next steps.
        return CallToolResult(
            content=[TextContent(type="text", text=self.text)], structured_content=self.data
        )


def short(value: Any, limit: int = 300) -> str:
    return cut(said(json.dumps(value, default=str, ensure_ascii=False)), limit)


def _more(items: list[Any], total_hint: str | None) -> str:
    extra = len(items) - MAX_TEXT_ITEMS
    lines = f"\n  ... and {extra} more" if extra > 0 else ""
    return lines + (f"\n(next page: cursor={total_hint})" if total_hint else "")


def worker_summary(worker: WorkerPublic) -> dict[str, Any]:
    manifest = worker.manifest or {}
    return {
        "name": worker.name,
        "title": worker.title,
        "description": worker.description,
        "kind": worker.kind,
        "active_version_id": worker.active_version_id,
        "paused": worker.paused,
        "inputs": {k: v.get("type") for k, v in (manifest.get("inputs") or {}).items()},
        # The surfaces that may start it: all of them when worker.yml names none.
        "expose": manifest.get("expose") or list(EXPOSE_TARGETS),
        "updated_at": worker.updated_at.isoformat(),
    }


def workers_text(items: list[dict[str, Any]], next_cursor: str | None) -> str:
    """The summaries of worker_summary, one a line."""
    if not items:
        return "no workers deployed yet; deploy a folder with deploy_worker"
    lines = [f"{len(items)} worker(s):"]
    for w in items[:MAX_TEXT_ITEMS]:
        title = f" - {said(w['title'])}" if w.get("title") and w["title"] != w["name"] else ""
        paused = " [paused]" if w.get("paused") else ""
        lines.append(
            f"  {w['name']} ({w.get('kind')}, {w.get('active_version_id')}){paused}{title}"
        )
    return "\n".join(lines) + _more(items, next_cursor)


def run_line(run: RunPublic) -> str:
    error = run.error
    why = f" ({error.code}: {said(error.message)})" if error else ""
    created = run.created_at.isoformat()
    return f"{run.id}  {run.worker}  {run.status}{why}  trigger={run.trigger}  created={created}"


def runs_text(items: list[RunPublic], next_cursor: str | None) -> str:
    if not items:
        return "no runs match"
    lines = [f"{len(items)} run(s), newest first:"]
    lines += [f"  {run_line(r)}" for r in items[:MAX_TEXT_ITEMS]]
    return "\n".join(lines) + _more(items, next_cursor)


def run_text(run: RunPublic) -> str:
    lines = [f"run {run.id} of {run.worker} (version {run.version_id}): "]
    status = run.status
    lines[0] += status
    if run.error:
        lines.append(f"error {run.error.code}: {said(run.error.message)}")
    if run.outputs is not None:
        lines.append(f"outputs: {short(run.outputs, 1000)}")
    if run.inputs:
        lines.append(f"inputs: {short(run.inputs)}")
    if run.artifacts:
        lines.append(artifacts_text(run.id, run.artifacts))
    if run.replay_of:
        lines.append(f"replay of {run.replay_of}")
    if run.retry_of:
        lines.append(f"retry of {run.retry_of}")
    if run.cannot_start:
        lines.append(f"not started: {said(run.cannot_start)}")
    if status in ACTIVE_STATUSES:
        lines.append(f"still {status}; follow it with watch_run(run_id='{run.id}')")
    elif status in WAITING:
        lines.append(waiting_text(run))
    elif status in _WENT_WRONG:
        lines.append(went_wrong_text(run))
    return "\n".join(lines)


# Ends an agent looks into: the logs say why, and a replay tries the same inputs again.
_WENT_WRONG = frozenset({FAILED, TIMED_OUT, LIMIT_EXCEEDED})


def went_wrong_text(run: RunPublic) -> str:
    """What to do about a run that went wrong: read why, then run its inputs again."""
    run_id = run.id
    return (
        f"read why with get_run_logs(run_id='{run_id}', tail=50); after a fix, "
        f"replay_run(run_id='{run_id}', latest=True) runs the same inputs on the active "
        "version (rollback_worker makes an earlier version active)"
    )


def artifacts_text(run_id: str, artifacts: list[ArtifactPublic]) -> str:
    listed = ", ".join(
        f"{said(a.name)} ({said(a.content_type)}, {a.size} bytes)"
        for a in artifacts[:MAX_TEXT_ITEMS]
    )
    more = f" and {len(artifacts) - MAX_TEXT_ITEMS} more" if len(artifacts) > MAX_TEXT_ITEMS else ""
    # The name as a Python literal (repr): a quote in it cannot end the argument early.
    first = said(artifacts[0].name)
    return (
        f"artifacts: {listed}{more}; read one with get_artifact(run_id='{run_id}', name={first!r})"
    )


def pending_approval_id(run: RunPublic) -> str | None:
    """The id of the approval a waiting run waits for, when the run record lists it."""
    listed = run.approvals if isinstance(run, RunDetail) else []
    pending = [a for a in listed if a.status == ApprovalStatus.PENDING]
    return pending[-1].id if pending else None


def waiting_text(run: RunPublic) -> str:
    """How to decide a run that waits for a person, naming its pending approval if known."""
    approval_id = pending_approval_id(run)
    if approval_id is None:
        return (
            f"waits for a person: list_approvals(worker='{run.worker}') shows the "
            "approval, decide_approval decides it"
        )
    return (
        f"waits for a person to decide approval {approval_id}: "
        f"decide_approval(approval_id='{approval_id}', decision='approve') or "
        "decision='reject' with a comment; then watch_run(run_id="
        f"'{run.id}') follows it to its end"
    )


def page_of(items: list[T], cursor: str | None, limit: int) -> tuple[list[T], str | None]:
    """One page of a list the backend returns whole; the cursor is the next item's index."""
    start = paging.number_cursor(cursor, most=10**6) or 0
    end = start + limit
    return items[start:end], str(end) if end < len(items) else None


def trigger_line(t: TriggerPublic) -> str:
    """One trigger, whole: kind, id, what fires it, state, next fires, where to send."""
    what = ", ".join(f"{k}={v}" for k, v in t.config.items() if k != "inputs")
    state = "paused" if t.paused else ("active" if t.active else "inactive")
    line = f"{t.kind} {t.id} ({what}) {state}"
    if t.timezone:
        line += f" tz={t.timezone}"
    if t.next_fires:
        line += " next: " + ", ".join(t.next_fires)
    if t.url:
        line += f" url={t.url}"
        if t.secret_set is False:
            line += " (signing secret not set)"
    return line


# A log line's most characters in a tool's text (a stored line holds up to 16 KiB: a hundred
# of them, get_run_logs' default, flooded a model's context with 1.6 MB of the worker's text).
MAX_LOG_LINE_TEXT = 2000


def log_lines_text(events: Sequence[RunEventPublic]) -> str:
    # floom's own notices come told for MCP already (floom/hints/surface.py): tools, not commands.
    return "\n".join(f"[{e.seq}] {e.stream}: {_log_line(e.line)}" for e in events)


def _log_line(line: str) -> str:
    if len(line) <= MAX_LOG_LINE_TEXT:
        return said(line)
    more = len(line) - MAX_LOG_LINE_TEXT
    return f"{said(line[:MAX_LOG_LINE_TEXT])} [{more} more characters in the structured content]"


def versions_text(name: str, items: list[VersionPublic]) -> str:
    lines = [f"{len(items)} version(s) of {name}, newest first:"]
    for v in items[:MAX_TEXT_ITEMS]:
        active = "  (active)" if v.active else ""
        created = v.created_at.isoformat()
        lines.append(f"  {v.id}  {created}  {v.file_count} files{active}")
    return "\n".join(lines)


def approvals_text(items: list[ApprovalPublic], next_cursor: str | None) -> str:
    if not items:
        return "no approvals match" + _more(items, next_cursor)
    lines = [f"{len(items)} approval(s), oldest first:"]
    for a in items[:MAX_TEXT_ITEMS]:
        what = f"tool {a.tool}" if a.tool else a.kind
        line = f"  {a.id}  {a.worker}  run {a.run_id}  {what}  {a.status}"
        if a.proposed is not None:
            line += f"  proposes {short(a.proposed, 200)}"
        lines.append(line)
    if any(a.status == ApprovalStatus.PENDING for a in items):
        lines.append("decide one with decide_approval(approval_id=..., decision='approve')")
    return "\n".join(lines) + _more(items, next_cursor)


def names_text(what: str, names: list[str]) -> str:
    if not names:
        return f"no {what}"
    return f"{len(names)} {what}: " + ", ".join(said(n) for n in names[:MAX_TEXT_ITEMS])


def problems_text(result: ValidationResult) -> str:
    if result.valid:
        manifest = result.manifest or {}
        return f"valid: {manifest.get('name')} (entry {manifest.get('entry')})"
    lines = [f"{len(result.problems)} problem(s):"]
    for p in result.problems:
        where = f"{p.path}: " if p.path else ""
        hint = f" (hint: {p.hint})" if p.hint else ""
        lines.append(f"  {said(where + p.message + hint)}")
    return "\n".join(lines)


def left_out_text(left_out: Sequence[Told], said: Sequence[str] = ()) -> str:
    """What of a worker was not shipped, one line each (as `floom deploy` prints it): what
    packing its folder here left out, then what floom said it left out of the upload."""
    lines = [render_told(why, surface="mcp") for why in left_out] + list(said)
    return "".join(f"\nleft out {line}" for line in lines)
