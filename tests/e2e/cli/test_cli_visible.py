"""The floom command never hands a worker's bytes to the terminal raw: control characters
show as escapes and rich markup prints as written, on every printer, unless `--raw`. Each
test runs the real command in a subprocess against a live server."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from floom.store.db import session_scope
from floom.store.handoffs import Role
from tests.support.cli import cli
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run

# ESC sequences that clear the screen, retitle the terminal and write the clipboard (OSC 52),
# an 8-bit CSI, a bidi override, and rich markup and an emoji code.
HOSTILE_YML = """\
name: hostile
inputs:
  fail: {type: boolean, default: false}
outputs:
  note: {type: string}
  forged: {type: string}
limits: {timeout_seconds: 30}
"""
HOSTILE_PY = r"""
import json, os, sys
from pathlib import Path

E = "\x1b"
inputs = json.loads(Path("inputs.json").read_text())
print(E + "[2J" + E + "]0;pwned" + "\x07" + "[bold]cleared[/bold] :smile:", flush=True)
HIDDEN = "\u202eevil\u200bx\u2060y"
print(E + "]52;c;ZWNobyBoaQ==" + "\x07" + "\x9b" + "31m " + HIDDEN, file=sys.stderr, flush=True)
out = Path(os.environ["FLOOM_OUTPUT_DIR"])
(out / "art.txt").write_text(E + "[5mblink" + E + "]0;art" + "\x07\n")
# (A name holding a control character is not kept at all: test_worker_text.py.)
(out / "[bold]n[red].txt").write_text("x")
if inputs["fail"]:
    error = "bad " + E + "[31m[red]red[/red]\nstatus    succeeded"
    Path("result.json").write_text(json.dumps({"error": error}))
    sys.exit(1)
forged = "ok\r\nartifacts:\n  invoice.pdf  1.0 KiB"
outputs = {"note": E + "[41m[red]x[/red]", "forged": forged}
Path("result.json").write_text(json.dumps({"outputs": outputs}))
"""


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'floom.db'}"  # printing does not depend on the store


def _hostile_run(server: LiveServer, api: httpx.Client, tmp_path: Path, *, fail: bool) -> str:
    deploy_folder(api, make_worker(tmp_path / "hostile", HOSTILE_YML, {"run.py": HOSTILE_PY}))
    resp = api.post("/api/v1/workers/hostile/runs", json={"inputs": {"fail": fail}})
    assert resp.status_code == 202, resp.text
    run_id: str = resp.json()["id"]
    wait_for_run(api, run_id)
    return run_id


def _assert_shown_safely(text: str) -> None:
    assert "\x1b" not in text, repr(text)
    assert "\x9b" not in text, repr(text)
    assert "\x07" not in text, repr(text)
    for char in ("\u202e", "\u200b", "\u2060"):
        assert char not in text, repr(text)


def test_logs_show_control_characters_as_escapes_and_markup_as_written(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    run_id = _hostile_run(server, api, tmp_path, fail=False)
    shown = cli(server, "logs", run_id)
    assert shown.returncode == 0, shown.stderr
    _assert_shown_safely(shown.stdout)
    assert "\\x1b[2J\\x1b]0;pwned[bold]cleared[/bold] :smile:" in shown.stdout
    assert "\\x1b]52;c;ZWNobyBoaQ==\\x9b31m \\u202eevil\\u200bx\\u2060y" in shown.stdout

    raw = cli(server, "logs", run_id, "--raw")
    assert "\x1b[2J" in raw.stdout
    assert "\\x1b" not in raw.stdout


def test_show_prints_outputs_errors_and_artifact_names_visibly(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    succeeded = _hostile_run(server, api, tmp_path, fail=False)
    shown = cli(server, "show", succeeded)
    assert shown.returncode == 0, shown.stderr
    _assert_shown_safely(shown.stdout)
    assert "note: \\x1b[41m[red]x[/red]" in shown.stdout
    assert "[bold]n[red].txt" in shown.stdout
    # A value or an error is shown on one line: its line breaks cannot add lines to the run.
    assert "forged: ok\\r\\nartifacts:\\n  invoice.pdf  1.0 KiB" in shown.stdout
    assert "invoice.pdf" not in shown.stdout.replace("\\n  invoice.pdf", "")

    failed = cli(server, "show", _hostile_run(server, api, tmp_path, fail=True))
    _assert_shown_safely(failed.stdout)
    assert "bad \\x1b[31m[red]red[/red]\\nstatus    succeeded" in failed.stdout
    assert "\nstatus    succeeded" not in failed.stdout


def test_artifacts_list_visibly_and_print_to_a_terminal_visibly(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    run_id = _hostile_run(server, api, tmp_path, fail=False)
    listing = cli(server, "artifacts", run_id)
    assert listing.returncode == 0, listing.stderr
    _assert_shown_safely(listing.stdout)
    assert "[bold]n[red].txt" in listing.stdout

    # To a terminal, the downloaded text shows its escapes; to a pipe, the bytes are the file.
    on_tty = _on_a_terminal(
        "artifacts", run_id, "--download", "art.txt", "-o", "-", env=server.cli_env()
    )
    _assert_shown_safely(on_tty)
    assert "\\x1b[5mblink\\x1b]0;art" in on_tty
    piped = cli(server, "artifacts", run_id, "--download", "art.txt", "-o", "-")
    assert piped.stdout == "\x1b[5mblink\x1b]0;art\x07\n"


def test_run_wait_prints_live_lines_and_the_result_visibly(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    # The quick path (no typer) and the typer command (--timeout makes it take over) alike.
    deploy_folder(api, make_worker(tmp_path / "hostile", HOSTILE_YML, {"run.py": HOSTILE_PY}))
    for extra in ([], ["--timeout", "60", "--raw"]):
        followed = cli(server, "run", "hostile", "--wait", *extra)
        assert followed.returncode == 0, followed.stderr
        if extra:
            assert "\x1b[2J" in followed.stdout
            continue
        _assert_shown_safely(followed.stdout)
        assert "[bold]cleared[/bold] :smile:" in followed.stdout
        assert "note: \\x1b[41m[red]x[/red]" in followed.stdout

    failed = cli(server, "run", "hostile", "-i", "fail=true", "--wait")
    assert failed.returncode == 1
    _assert_shown_safely(failed.stdout + failed.stderr)
    assert "bad \\x1b[31m[red]red[/red]" in failed.stdout


def test_error_lines_from_the_server_print_visibly(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    # A worker name a caller chose comes back in the server's error message.
    result = cli(server, "show", "run_\x1b]0;pwned\x07")
    assert result.returncode == 1
    _assert_shown_safely(result.stderr)


def test_handoffs_show_and_reopen_say_each_text_an_agent_wrote_on_one_line(
    server: LiveServer, api: httpx.Client
) -> None:
    """A constraint, a reason, an artifact, a rejection: each could print a line of its own
    that read as one of the job's rows."""
    jobs = "/api/v1/handoffs/jobs"
    assert api.post("/api/v1/roles", json={"name": "coder"}).status_code == 201
    made = api.post("/api/v1/agents", json={"label": "alice", "roles": ["coder"]})
    alice = server.client(made.json()["key"])
    body = {
        "summary": "parse",
        "role": "coder",
        "constraints": ["keep it\n  status          completed"],
        "artifacts": [{"type": "pr", "uri": "x\r\n  assignee        mallory"}],
    }
    job = alice.post(jobs, json=body).json()
    assert alice.post(f"{jobs}/{job['id']}/claim", json={}).status_code == 200
    blocked = {"status": "blocked", "reason": "wait\n  priority        urgent"}
    assert alice.post(f"{jobs}/{job['id']}/status", json=blocked).status_code == 200
    shown = cli(server, "handoffs", "show", job["id"])
    assert shown.returncode == 0, shown.stderr
    rows = [line.split()[0] for line in shown.stdout.splitlines()[1:] if line.startswith("  ")]
    assert rows.count("status") == rows.count("priority") == rows.count("assignee") == 1, rows
    assert "keep it\\n  status" in shown.stdout
    assert "x\\r\\n  assignee" in shown.stdout

    assert alice.post(f"{jobs}/{job['id']}/status", json={"status": "in_progress"}).is_success
    assert alice.post(f"{jobs}/{job['id']}/complete", json={"summary": "done"}).is_success
    why = {"reason": "redo\n  attempt 9 rejected by admin: fine"}
    retry = alice.post(f"{jobs}/{job['id']}/reject", json=why).json()
    reopened = cli(server, "handoffs", "reopen", retry["id"])
    assert reopened.returncode == 0, reopened.stderr
    lines = reopened.stdout.splitlines()
    assert len(lines) == 3, lines  # the heading, the constraint, the one rejection
    assert lines[1] == "  constraint: keep it\\n  status          completed"


def test_roles_list_says_a_description_stored_before_the_check_on_one_line_escaped(
    server: LiveServer,
) -> None:
    """A role description is refused at write with a control character in it now, but one
    stored before is shown in its row: a newline as `\\n` (it printed a line of its own in
    the table, reading as another role) and an escape visibly."""
    with session_scope(server.ctx.engine, write=True) as s:
        s.add(Role(id="rol_old", name="coder", description="writes\n  admin  rol_x  \x1b[2Jok"))
    shown = cli(server, "roles", "list")
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout
    rows = [line for line in shown.stdout.splitlines() if "rol_" in line]
    assert len(rows) == 1, shown.stdout
    assert "writes\\n" in rows[0]
    assert "\\x1b[2Jok" in shown.stdout


def _on_a_terminal(*args: str, env: dict[str, str]) -> str:
    """The command's stdout when stdout is a terminal (a pseudo-terminal the test reads)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "floom.cli", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=subprocess.PIPE,
    )
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            proc.kill()
            raise AssertionError("the command printed nothing for 60 s")
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal's other end closed: the command is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return b"".join(chunks).decode("utf-8", "replace")
