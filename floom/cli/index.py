"""The floom command's index: every command's name, the module that defines it and its one-line
help, in `floom --help` order; and the entry point.

`floom` and `floom --help` print the index, and `--version` the version, without
importing typer, rich, httpx or a command module (~0.3 s of start-up on a 2-core machine);
`floom run` goes through the stdlib-only quick
path (quick.py) when it can, and `floom serve` with its own options starts the server without
typer (serving.py); any other invocation loads typer and only the module of the command it
names. tests/e2e/cli/test_cli_index.py checks this index against the
commands' own docstrings.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

from floom import __version__

USAGE = "Usage: floom [OPTIONS] COMMAND [ARGS]..."
DESCRIPTION = "Deploy, run and inspect background AI workers on a floom server."
HELP_FLAGS = ("--help", "-h")
VERSION_FLAGS = ("--version",)


class Entry(NamedTuple):
    """One command of `floom`: its module under floom.cli, the function of that module that
    adds it to a typer app, and its one-line help (the first line of its docstring)."""

    module: str
    register: str
    summary: str


COMMANDS: dict[str, Entry] = {
    "serve": Entry(
        "serve", "register", "Run the floom server: API, scheduler and executor in one process."
    ),
    "init": Entry(
        "scaffold",
        "register",
        "Create a worker folder (worker.yml, run.py or SKILL.md, README.md) that deploys as is.",
    ),
    "validate": Entry(
        "commands.workers", "register", "Check a worker folder locally (no server needed)."
    ),
    "deploy": Entry(
        "commands.workers",
        "register",
        "Validate a worker folder, then upload it as a new version and make it active.",
    ),
    "versions": Entry(
        "commands.workers",
        "register",
        "List a worker's versions, newest first; * marks the active one.",
    ),
    "rollback": Entry("commands.workers", "register", "Make an earlier version active again."),
    "run": Entry(
        "commands.runs",
        "register",
        "Start a run; with --wait, follow its log and exit 0 only if it succeeded.",
    ),
    "replay": Entry(
        "commands.runs", "register", "Run a run's inputs again, as a new run linked to it."
    ),
    "eval": Entry(
        "commands.replay",
        "register",
        "Replay a worker's recorded runs against a version or model and report the differences.",
    ),
    "runs": Entry("commands.runs", "register", "List runs, newest first."),
    "show": Entry(
        "commands.runs", "register", "Show one run: status, inputs, outputs, error, artifacts."
    ),
    "logs": Entry(
        "commands.runs",
        "register",
        "Print a run's log lines in order, timestamped, with their stream.",
    ),
    "cancel": Entry("commands.runs", "register", "Cancel a queued or running run."),
    "artifacts": Entry("commands.runs", "register", "List a run's artifacts, or download one."),
    "mcp": Entry(
        "commands.mcp",
        "register",
        "Serve MCP over stdio for Claude Code, Codex, Gemini CLI, Cursor or VS Code.",
    ),
    "approvals": Entry(
        "commands.approvals",
        "register",
        "List approvals, oldest first (pending ones unless --status).",
    ),
    "approve": Entry(
        "commands.approvals",
        "register",
        "Approve a pending tool call or run outputs, optionally with edits; the run goes on.",
    ),
    "reject": Entry(
        "commands.approvals",
        "register",
        "Reject: a tool call goes back to the agent as a refusal; run outputs end the run.",
    ),
    "triggers": Entry(
        "commands.triggers",
        "register",
        "List a worker's triggers; schedules with their next three fire times in their timezone.",
    ),
    "pause": Entry(
        "commands.triggers",
        "register",
        "Pause a worker (or one trigger): its ticks and webhooks are recorded, not run.",
    ),
    "resume": Entry(
        "commands.triggers",
        "register",
        "Resume a worker (or one trigger); ticks skipped meanwhile are not run.",
    ),
    "deliveries": Entry(
        "commands.triggers",
        "register",
        "List a worker's webhook and Composio deliveries, newest first.",
    ),
    "replay-delivery": Entry(
        "commands.triggers", "register", "Run a stored delivery again, as a new run."
    ),
    "secrets": Entry(
        "commands.admin", "register", "Secrets that workers can declare (values are never shown)."
    ),
    "keys": Entry("commands.admin", "register", "API keys: create, list, revoke."),
    "agents": Entry(
        "commands.agents",
        "register",
        "Handoff agents: identities with roles and their own API keys.",
    ),
    "roles": Entry(
        "commands.agents",
        "register",
        "Handoff roles: the kinds of work agents take on (admins manage).",
    ),
    "handoffs": Entry(
        "commands.handoffs",
        "register",
        "Handoff jobs: publish, claim, finish and review work by role.",
    ),
    "nodes": Entry(
        "commands.monitoring",
        "register",
        "List the cluster's nodes: state, roles, version, slots in use, last heartbeat.",
    ),
    "alerts": Entry(
        "commands.monitoring",
        "register",
        "Alerts: channels (webhook, Slack, email), rules, deliveries; a test send.",
    ),
    "state": Entry(
        "commands.workers",
        "register_state",
        "A worker's state: get it, set it (or restore a version), list its history.",
    ),
    "workers": Entry(
        "commands.workers",
        "register_group",
        "List the deployed workers (no subcommand), or delete one.",
    ),
    "backup": Entry(
        "commands.ops",
        "register",
        "Back up this node's SQLite database and data dir while floom keeps serving.",
    ),
    "restore": Entry(
        "commands.ops",
        "register",
        "Restore a backup into this node's data dir (FLOOM_DATA_DIR), which must be empty.",
    ),
    "migrate-store": Entry(
        "commands.ops",
        "register",
        "Copy this node's whole store into an empty PostgreSQL database (stop floom first).",
    ),
    "doctor": Entry(
        "commands.doctor",
        "register",
        "Check this node: sandbox, database, secret key, disk; exit 1 when something fails.",
    ),
    "retention": Entry(
        "commands.ops", "register", "Delete old runs' logs and artifacts (FLOOM_RETENTION_DAYS)."
    ),
    "blobs": Entry(
        "commands.ops",
        "register",
        "Move blobs between the database and object storage, check every one, and see to "
        "held-back run logs.",
    ),
}


def help_text() -> str:
    """`floom --help`: usage, description, options and the command index."""
    width = max(len(name) for name in COMMANDS) + 2
    lines = [USAGE, "", f"  {DESCRIPTION}", "", "Options:"]
    lines.append("  --version".ljust(width + 2) + "Show floom's version and exit.")
    lines.append("  --help".ljust(width + 2) + "Show this message and exit.")
    lines += ["", "Commands:"]
    lines += [f"  {name.ljust(width)}{entry.summary}" for name, entry in COMMANDS.items()]
    lines += ["", "Run `floom COMMAND --help` for a command's options."]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Entry point: the index for `floom` and `floom --help`, the version for --version,
    else the typer app."""
    args = sys.argv[1:]
    if not args or (len(args) == 1 and args[0] in HELP_FLAGS):
        sys.stdout.write(help_text())
        return
    if len(args) == 1 and args[0] in VERSION_FLAGS:
        sys.stdout.write(f"floom {__version__}\n")
        return
    if args[0] == "run":
        # Imported here: the stdlib-only `floom run` path, which returns when typer should
        # read this command line.
        from floom.cli import quick

        quick.run(args[1:])
    if args[0] == "serve":
        # Imported here: `floom serve` without typer, which returns when typer should read
        # this command line.
        from floom.cli import serving

        serving.run(args[1:])
    # Imported here, not at the top: typer and the command modules cost ~0.3 s that
    # `floom --help` does not need.
    from floom.cli.command import main as run_command

    run_command()
