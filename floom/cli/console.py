"""The floom command's consoles and how run records and log lines print on them, with rich
alone (no typer): the quick `floom run --wait` path prints through these too.

Whatever a worker or a caller controls reaches the terminal only through these consoles, and
they show it as text: markup and emoji codes are not read (`[bold]` in a log line prints as
it is), and every segment they write passes through `visible` (control characters shown,
unless `--raw`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook
from rich.segment import Segment
from rich.text import Text

from floom.cli.visible import is_raw, visible
from floom.vocabulary import RunStatus


class _Visible:
    """A renderable as its own segments, with their text through `visible`: the one place
    where the command's output is made safe, below every printer, table and line."""

    def __init__(self, renderable: ConsoleRenderable) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        for segment in console.render(self.renderable, options):
            if segment.control or not segment.text:
                yield segment  # rich's own (cursor, bell): never a worker's text
            else:
                yield Segment(visible(segment.text), segment.style)


class _ShowControls(RenderHook):
    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        if is_raw():
            return renderables
        return [_Visible(r) for r in renderables]


def _console(*, stderr: bool = False) -> Console:
    console = Console(stderr=stderr, highlight=False, soft_wrap=True, markup=False, emoji=False)
    if not console.is_terminal:
        # Piped output is read by scripts and tests: don't fold ids at 80 columns.
        console.width = max(console.width, 200)
    console.push_render_hook(_ShowControls())
    return console


out = _console()
err = _console(stderr=True)

# Every run status's colour (a test checks none is missing).
STATUS_STYLES: dict[str, str] = {
    RunStatus.SUCCEEDED: "green",
    RunStatus.FAILED: "red",
    RunStatus.TIMED_OUT: "red",
    RunStatus.CANCELLED: "yellow",
    RunStatus.RUNNING: "cyan",
    RunStatus.QUEUED: "blue",
    RunStatus.AWAITING_APPROVAL: "yellow",
    RunStatus.REJECTED: "red",
    RunStatus.LIMIT_EXCEEDED: "red",
    RunStatus.SKIPPED: "dim",
}
STREAM_STYLES = {"stderr": "red", "system": "dim"}


def print_json(value: Any) -> None:
    """Print a value (a public model as the REST API sends it) as indented JSON on stdout
    (what --json prints)."""
    as_json = getattr(value, "to_json", None)  # a public model, without importing pydantic
    if callable(as_json):
        value = as_json()
    out.print(Text(json.dumps(value, indent=2, default=str)))


def _parse_time(value: datetime | str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)  # floom stores UTC
    return parsed.astimezone()


def when(value: datetime | str | None) -> str:
    """A stored timestamp (UTC) in local time, or "-"."""
    parsed = _parse_time(value)
    return parsed.strftime("%Y-%m-%d %H:%M:%S") if parsed else "-"


def duration(run: dict[str, Any]) -> str:
    """How long a run (its JSON) took, or has been running so far."""
    return took(run.get("started_at"), run.get("finished_at"))


def took(started: datetime | str | None, finished: datetime | str | None) -> str:
    """How long from `started` to `finished` (or now), or "-" before the start."""
    start, end = _parse_time(started), _parse_time(finished)
    if not start:
        return "-"
    seconds = ((end or datetime.now(UTC)) - start).total_seconds()
    if seconds < 1:  # a warm run takes a few ms: "0.0s" would say it took no time
        return f"{max(seconds, 0) * 1000:.0f}ms"
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}m"


def human_size(n: int | None) -> str:
    """A byte count in B, KiB or MiB."""
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1024 * 1024):.1f} MiB"


def status_text(status: str) -> Text:
    """A run status in its colour."""
    return Text(status, style=STATUS_STYLES.get(status, ""))


# A line break in a value a worker or a caller wrote, as a value's one line shows it: kept,
# it would start a line that reads as the command's own ("status    succeeded").
_ONE_LINE = {ord("\n"): "\\n", ord("\r"): "\\r"}


def one_line(text: str) -> str:
    """`text` on one line, its line breaks shown as `\\n` and `\\r` (visible() shows the
    other control characters)."""
    return text.translate(_ONE_LINE)


def value_text(value: Any) -> str:
    """An input or output value on one line: text as it is, anything else as JSON."""
    return one_line(value) if isinstance(value, str) else json.dumps(value, default=str)


def run_heading(run: dict[str, Any]) -> Text:
    """The first line of a followed run: its id, worker and version."""
    return Text(f"run {run['id']} of {run['worker']} ({run['version_id']})", style="dim")


def log_line(event: dict[str, Any]) -> Text:
    """A log event as a line: time, stream, text."""
    parsed = _parse_time(event.get("ts"))
    stream = str(event.get("stream", ""))
    line = Text(parsed.strftime("%H:%M:%S") if parsed else "--:--:--", style="dim")
    line.append(f" {stream:<6} ", style="dim")
    line.append(str(event.get("line", "")), style=STREAM_STYLES.get(stream, ""))
    return line


def print_result(run: dict[str, Any]) -> None:
    """The end of a followed run: its status, duration and outcome."""
    line = Text(f"run {run['id']} ")
    line.append_text(status_text(run["status"]))
    line.append(f" in {duration(run)}")
    out.print(line)
    print_outcome(run)
    if run.get("artifacts"):
        out.print(
            Text(f"  download with `floom artifacts {run['id']} --download NAME`", style="dim")
        )


def print_outcome(r: dict[str, Any]) -> None:
    """A run's error, outputs and artifacts, where it has them."""
    if r.get("error"):
        out.print(
            Text(
                f"error: {r['error'].get('code')}: {one_line(str(r['error'].get('message')))}",
                style="red",
            )
        )
    if r.get("outputs"):
        out.print("outputs:")
        for name, value in r["outputs"].items():
            out.print(Text(f"  {name}: {value_text(value)}"))
    if r.get("artifacts"):
        out.print("artifacts:")
        for a in r["artifacts"]:
            out.print(
                Text(f"  {a['name']}  {human_size(a.get('size'))}  {a.get('content_type', '')}")
            )
