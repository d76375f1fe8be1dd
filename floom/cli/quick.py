"""`floom run` without typer or httpx, for the command lines agents, scripts and people call
all the time: `floom run WORKER [-i K=V ...] [--input-json JSON] [--force] [--json]`, the same
with `--wait --json` (one round trip: the start request waits for the end), and with `--wait`
alone (the run's log lines as they are written, then its result, printed by rich as the typer
command prints them).

Loading typer and httpx costs more than the run itself on a small machine. This path reads
the command line with the same meaning as the typer command in runs.py, sends the same
requests through LiteClient and prints the same bytes. It handles only well-formed command
lines whose answer it can print itself: anything else (help, a usage error, an option it does
not know, `--wait --timeout` without `--json`, a run that outlasts the wait, a log stream
that breaks off, an HTTPS server or a proxy) goes to the typer command, so behaviour is the
typer command's by construction. Errors are printed by the typer command's own error lines
(loaded only then).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

from floom.client.lite import LiteClient
from floom.client.wire import WAIT_CALL_SECONDS, StartRequest, start_body
from floom.errors import FloomError
from floom.services.runs.statuses import FINISHED
from floom.vocabulary import RunStatus

FLAGS = {"--wait": "wait", "--json": "as_json", "--force": "force"}
VALUED = {"-i": "input", "--input": "input", "--input-json": "input_json", "--timeout": "timeout"}
TIMEOUT_TEXT = re.compile(r"\d+(\.\d*)?|\.\d+")


class RunLine(NamedTuple):
    """A `floom run` command line this path can serve."""

    worker: str
    inputs: dict[str, Any]
    coerce_strings: bool
    wait: bool
    as_json: bool
    force: bool
    timeout: float | None


def parse(args: list[str]) -> RunLine | None:
    """The command line `floom run ARGS`, or None when the typer command should read it."""
    worker: str | None = None
    pairs: list[str] = []
    seen: dict[str, str] = {}
    flags = set()
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        name, sep, attached = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in FLAGS and not sep:
            flags.add(FLAGS[name])
        elif name in VALUED:
            if sep:
                value = attached
            elif i < len(args) and not args[i].startswith("-"):
                value, i = args[i], i + 1
            else:
                return None
            key = VALUED[name]
            if key == "input":
                pairs.append(value)
            elif key in seen:
                return None
            else:
                seen[key] = value
        elif arg.startswith("-") or worker is not None or not arg:
            return None
        else:
            worker = arg
    if worker is None:
        return None
    inputs = _inputs(pairs, seen.get("input_json"))
    timeout = _timeout(seen.get("timeout"))
    if inputs is None or timeout is False:
        return None
    waits = "wait" in flags or timeout is not None
    if timeout is not None and "as_json" not in flags:
        return None  # a deadline on live log lines: the typer command keeps that one
    return RunLine(
        worker=worker,
        inputs=inputs[0],
        coerce_strings=inputs[1],
        wait=waits,
        as_json="as_json" in flags,
        force="force" in flags,
        timeout=timeout,
    )


def _inputs(pairs: list[str], raw_json: str | None) -> tuple[dict[str, Any], bool] | None:
    """As runs._parse_inputs reads them, or None where it would refuse them."""
    if pairs and raw_json is not None:
        return None
    if raw_json is not None:
        text = raw_json
        if raw_json.startswith("@"):
            try:
                text = Path(raw_json[1:]).read_text()
            except OSError:
                return None
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):  # the full command says what is wrong
            return None
        return (parsed, False) if isinstance(parsed, dict) else None
    inputs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            return None
        inputs[key.strip()] = value
    return inputs, True


def _timeout(text: str | None) -> float | bool | None:
    """--timeout's seconds, None when not given, False for any text but plain digits (the
    typer command refuses or reads the rest)."""
    if text is None:
        return None
    return float(text) if TIMEOUT_TEXT.fullmatch(text) else False


def run(args: list[str]) -> None:
    """Serve `floom run ARGS` and exit with the command's exit code; return (having done
    nothing) when the typer command should serve it."""
    line = parse(args)
    client = LiteClient.from_env(surface="cli") if line else None
    if line is None or client is None:
        return
    try:
        code = _serve(line, client)
    except KeyboardInterrupt:
        sys.exit(130)  # as typer ends a command interrupted before it printed anything
    except Exception as exc:  # the command's boundary: its own error lines say what failed
        from floom.cli.command import exit_on_error  # typer, rich: errors only

        exit_on_error(exc)
    sys.exit(code)


def _serve(line: RunLine, client: LiteClient) -> int:
    if line.wait and not line.as_json:
        return _follow(line, client)
    wait = 0.0
    if line.wait:
        wait = min(line.timeout, WAIT_CALL_SECONDS) if line.timeout else WAIT_CALL_SECONDS
    body = start_body(line.inputs, coerce_strings=line.coerce_strings, force=line.force)
    request = StartRequest(line.worker, body, wait=wait)
    asked = time.monotonic()
    started = client.start_run(request)
    _say_if_stuck(started)
    if not line.wait:
        _write(json.dumps(started, indent=2, default=str) if line.as_json else started["id"])
        return 0
    if started["status"] not in FINISHED:
        _watch(started, line.timeout, asked)
        return 0
    _write(json.dumps(started, indent=2, default=str))
    return 0 if started["status"] == RunStatus.SUCCEEDED else 1


def _follow(line: RunLine, client: LiteClient) -> int:
    """`--wait` without `--json`: start the run, print its heading, its log lines as the
    stream brings them and its result, as runs.watch_run does.
    Imported here, not at the top: rich (about 50 ms) only for the lines a person reads."""
    from floom.cli.console import log_line, out, print_result, run_heading

    body = start_body(line.inputs, coerce_strings=line.coerce_strings, force=line.force)
    request = StartRequest(line.worker, body)
    started = client.start_run(request)
    _say_if_stuck(started)
    shown = 0
    try:
        out.print(run_heading(started))
        try:
            for kind, data in client.follow_log(started["id"]):
                if kind == "log":
                    out.print(log_line(data))
                    shown = max(shown, int(data.get("seq", shown)))
        except FloomError:
            # The stream broke off or is not offered here: the typer command's follow,
            # which reconnects or polls, goes on from the last line shown.
            _watch(started, None, time.monotonic(), shown=shown)
        final = client.get_run(started["id"])
        print_result(final)
    except KeyboardInterrupt:
        _stopped_waiting(started["id"])
    return 0 if final["status"] == RunStatus.SUCCEEDED else 1


def _watch(
    started: dict[str, Any], timeout: float | None, asked: float, *, shown: int | None = None
) -> NoReturn:
    """The run outlasted the start's wait (or, with `shown`, its log stream broke off): the
    typer command's own wait takes over and ends the process.
    Imported here, not at the top: typer, rich and httpx only for this, or an error."""
    from floom.cli.command import guarded  # a long wait: start-up cost is moot
    from floom.cli.commands.runs import watch_started
    from floom.cli.common import open_client

    if timeout is not None:
        timeout = max(0.001, timeout - (time.monotonic() - asked))

    def watch() -> None:
        with open_client() as client:
            watch_started(client, started, as_json=shown is None, timeout=timeout, shown=shown)

    guarded(watch)
    sys.exit(0)


def _stopped_waiting(run_id: str) -> NoReturn:
    """Ctrl-C while following: the typer command's "stopped waiting" lines and exit code."""
    from floom.cli.command import guarded  # typer, rich: this line only
    from floom.cli.commands.runs import stopped_waiting

    guarded(lambda: stopped_waiting(run_id))
    sys.exit(1)


def _say_if_stuck(run: dict[str, Any]) -> None:
    """What runs.say_if_stuck prints, without loading rich for it."""
    if run.get("cannot_start"):
        sys.stderr.write(f"warning: run {run['id']} is queued, but {run['cannot_start']}\n")
        sys.stderr.flush()


def _write(text: str) -> None:
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        sys.stdout = None  # nothing more can reach a closed pipe
        sys.exit(1)
