#!/usr/bin/env python3
"""Moves floom's modules into folders that name the architecture (issue 31, item 1), on
whatever tree it runs in, and rewrites every reference to a moved module.

    cd <a clean checkout> && /work/main/.venv/bin/python dev-tools/relayout.py

It works on a clean git tree only (no change, no untracked file), moves with `git mv`,
creates each new package's `__init__.py`, rewrites references in floom/, tests/, bench/, the
docs and the build files (imports, dotted names in strings such as mock targets, file paths
in docs and tests), then runs `ruff check --fix` and `ruff format` over what it touched.
It fails (exit 1, naming the file) when a folder would still hold more than MAX_MODULES
modules or three modules sharing a prefix, and then leaves the tree as it found it.

Deterministic and idempotent: a module already at its new place is left alone, so a second
run changes nothing. A reference to an old name that no longer exists at all (code merged
after the move, say `floom.services.run_rules`) is still rewritten; an old name that is now
a package (`floom.services.runs`, `floom.manifest`, ...) is ambiguous after the move and is
left as it is (mypy and the tests tell), so run this once after every branch is merged.

Moves are moves: behaviour, REST paths, CLI commands, MCP tool names, logger names and the
database schema do not change. Standard library only.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import textwrap
import tokenize
from collections import Counter
from pathlib import Path

MAX_MODULES = 12  # per folder, __init__.py not counted
MAX_SHARING_A_PREFIX = 2  # modules of one folder whose names share the part before "_"

# Old path -> new path. A module that is absent from the tree is skipped (a newcomer not
# merged yet, or one already moved).
MOVES: dict[str, str] = {
    # worker.yml: schema, loading, checks, fields. triggers/checks.py checks worker.yml's
    # triggers and imports the schema: beside it, manifest and triggers import each other in
    # one direction only.
    "floom/manifest.py": "floom/manifest/schema.py",
    "floom/manifest_agent.py": "floom/manifest/agent.py",
    "floom/manifest_checks.py": "floom/manifest/checks.py",
    "floom/manifest_load.py": "floom/manifest/load.py",
    "floom/manifest_replay.py": "floom/manifest/replay.py",
    "floom/fields.py": "floom/manifest/fields.py",
    "floom/triggers/checks.py": "floom/manifest/triggers.py",
    # The REST client. floom/client_env.py stays at the root: floom/config.py reads it, and the
    # client imports the services' run statuses, so in client/ it would make a cycle
    # config -> client -> services -> config.
    "floom/client.py": "floom/client/rest.py",
    "floom/client_lite.py": "floom/client/lite.py",
    "floom/client_wire.py": "floom/client/wire.py",
    "floom/handoff_client.py": "floom/client/handoffs.py",
    # The rules of connections floom makes for a worker, and this host's own addresses (read by
    # the egress guard and the sandbox's network fence). Not under agent/ or sandbox/: config
    # reads the egress rules, and agent and sandbox both import config.
    "floom/egress.py": "floom/net/egress.py",
    "floom/host_addresses.py": "floom/net/addresses.py",
    # The names a worker may not give its environment: the sandbox refuses them as the last
    # line (worker.yml and secrets check them first).
    "floom/env_names.py": "floom/sandbox/env_names.py",
    # services/, by concern.
    "floom/services/runs.py": "floom/services/runs/lifecycle.py",
    "floom/services/run_rules.py": "floom/services/runs/rules.py",
    "floom/services/run_statuses.py": "floom/services/runs/statuses.py",
    "floom/services/run_records.py": "floom/services/runs/records.py",
    "floom/services/run_stats.py": "floom/services/runs/stats.py",
    "floom/services/run_waits.py": "floom/services/runs/waits.py",
    "floom/services/agent_runs.py": "floom/services/runs/agent.py",
    "floom/services/approvals.py": "floom/services/runs/approvals.py",
    "floom/services/logs.py": "floom/services/runs/logs.py",
    "floom/services/lineage.py": "floom/services/runs/lineage.py",
    "floom/services/artifact_scan.py": "floom/services/runs/artifact_scan.py",
    "floom/services/workers.py": "floom/services/workers/versions.py",
    "floom/services/worker_deletion.py": "floom/services/workers/deletion.py",
    "floom/services/diffs.py": "floom/services/workers/diffs.py",
    "floom/services/examples.py": "floom/services/workers/examples.py",
    "floom/services/exposure.py": "floom/services/workers/exposure.py",
    "floom/services/limit_ceilings.py": "floom/services/workers/limit_ceilings.py",
    "floom/services/triggers.py": "floom/services/triggers/registry.py",
    "floom/services/schedules.py": "floom/services/triggers/schedules.py",
    "floom/services/webhooks.py": "floom/services/triggers/webhooks.py",
    "floom/services/composio_events.py": "floom/services/triggers/composio.py",
    "floom/services/replays.py": "floom/services/replays/replay.py",
    "floom/services/replay_diff.py": "floom/services/replays/diff.py",
    "floom/services/recordings.py": "floom/services/replays/recordings.py",
    "floom/services/evals.py": "floom/services/replays/evals.py",
    "floom/services/eval_gate.py": "floom/services/replays/gate.py",
    "floom/services/keys.py": "floom/services/access/keys.py",
    "floom/services/principal.py": "floom/services/access/principal.py",
    "floom/services/secrets.py": "floom/services/access/secrets.py",
    "floom/services/web_sessions.py": "floom/services/access/sessions.py",
    "floom/services/audit.py": "floom/services/access/audit.py",
    "floom/services/auth_cache.py": "floom/services/access/auth_cache.py",
    "floom/services/backup.py": "floom/services/ops/backup.py",
    "floom/services/retention.py": "floom/services/ops/retention.py",
    "floom/services/metrics.py": "floom/services/ops/metrics.py",
    "floom/services/store_copy.py": "floom/services/ops/store_copy.py",
    "floom/services/nodes.py": "floom/services/ops/nodes.py",
    "floom/doctor.py": "floom/services/ops/doctor.py",
    # The node's background threads, apart from the run pipeline.
    "floom/engine/handoff_loop.py": "floom/engine/loops/handoffs.py",
    "floom/engine/heap.py": "floom/engine/loops/heap.py",
    "floom/engine/housekeeping.py": "floom/engine/loops/housekeeping.py",
    "floom/engine/presence.py": "floom/engine/loops/presence.py",
    "floom/engine/scheduler.py": "floom/engine/loops/scheduler.py",
    # The sandbox backends. fence.py and watchdog.py (the lease watchdog, run by its path
    # beside fence.py) stay in sandbox/: the engine sets the fence whatever the backend.
    "floom/sandbox/local.py": "floom/sandbox/local/backend.py",
    "floom/sandbox/cgroups.py": "floom/sandbox/local/cgroups.py",
    "floom/sandbox/identity.py": "floom/sandbox/local/identity.py",
    "floom/sandbox/limits.py": "floom/sandbox/local/limits.py",
    "floom/sandbox/network.py": "floom/sandbox/local/network.py",
    "floom/sandbox/ns_mount.py": "floom/sandbox/local/ns_mount.py",
    "floom/sandbox/procfs.py": "floom/sandbox/local/procfs.py",
    "floom/sandbox/seccomp.py": "floom/sandbox/local/seccomp.py",
    "floom/sandbox/standby.py": "floom/sandbox/local/standby.py",
    "floom/sandbox/supervisor.py": "floom/sandbox/local/supervisor.py",
    "floom/sandbox/disks.py": "floom/sandbox/local/disks.py",
    "floom/sandbox/uid_pool.py": "floom/sandbox/local/uid_pool.py",
    "floom/sandbox/e2b.py": "floom/sandbox/e2b/backend.py",
    "floom/sandbox/e2b_command.py": "floom/sandbox/e2b/command.py",
    "floom/sandbox/transfer.py": "floom/sandbox/e2b/transfer.py",
    # The REST routes, and the web UI's pages beside web/ (api/ui_mount.py stays: the app
    # mounts the UI and loads it on the first page asked for).
    "floom/api/routes_admin.py": "floom/api/routes/admin.py",
    "floom/api/routes_agents.py": "floom/api/routes/agents.py",
    "floom/api/routes_approvals.py": "floom/api/routes/approvals.py",
    "floom/api/routes_audit.py": "floom/api/routes/audit.py",
    "floom/api/routes_handoffs.py": "floom/api/routes/handoffs.py",
    "floom/api/routes_hooks.py": "floom/api/routes/hooks.py",
    "floom/api/routes_nodes.py": "floom/api/routes/nodes.py",
    "floom/api/routes_replays.py": "floom/api/routes/replays.py",
    "floom/api/routes_runs.py": "floom/api/routes/runs.py",
    "floom/api/routes_triggers.py": "floom/api/routes/triggers.py",
    "floom/api/routes_workers.py": "floom/api/routes/workers.py",
    "floom/api/ui.py": "floom/ui/app.py",
    "floom/api/ui_admin.py": "floom/ui/admin.py",
    "floom/api/ui_approvals.py": "floom/ui/approvals.py",
    "floom/api/ui_chart.py": "floom/ui/chart.py",
    "floom/api/ui_features.py": "floom/ui/features.py",
    "floom/api/ui_forms.py": "floom/ui/forms.py",
    "floom/api/ui_handoffs.py": "floom/ui/handoffs.py",
    "floom/api/ui_nodes.py": "floom/ui/nodes.py",
    "floom/api/ui_ops.py": "floom/ui/ops.py",
    "floom/api/ui_replays.py": "floom/ui/replays.py",
    "floom/api/ui_runs.py": "floom/ui/runs.py",
    "floom/api/ui_support.py": "floom/ui/support.py",
    # MCP: the tools, and the two backends behind them.
    "floom/mcp/tools.py": "floom/mcp/tools/core.py",
    "floom/mcp/artifact_tools.py": "floom/mcp/tools/artifacts.py",
    "floom/mcp/handoff_tools.py": "floom/mcp/tools/handoffs.py",
    "floom/mcp/replay_tools.py": "floom/mcp/tools/replays.py",
    "floom/mcp/backend.py": "floom/mcp/backends/base.py",
    "floom/mcp/local_backend.py": "floom/mcp/backends/local.py",
    "floom/mcp/rest_backend.py": "floom/mcp/backends/rest.py",
    # The CLI: one module per command group under commands/ (the index names them); the
    # command's own machinery, `serve` and the quick `floom run` stay in cli/.
    "floom/cli/admin.py": "floom/cli/commands/admin.py",
    "floom/cli/agents.py": "floom/cli/commands/agents.py",
    "floom/cli/approvals.py": "floom/cli/commands/approvals.py",
    "floom/cli/doctor.py": "floom/cli/commands/doctor.py",
    "floom/cli/handoffs.py": "floom/cli/commands/handoffs.py",
    "floom/cli/mcp.py": "floom/cli/commands/mcp.py",
    "floom/cli/nodes.py": "floom/cli/commands/nodes.py",
    "floom/cli/ops.py": "floom/cli/commands/ops.py",
    "floom/cli/replay.py": "floom/cli/commands/replay.py",
    "floom/cli/runs.py": "floom/cli/commands/runs.py",
    "floom/cli/triggers.py": "floom/cli/commands/triggers.py",
    "floom/cli/workers.py": "floom/cli/commands/workers.py",
}

# Modules that stay where they are in a folder being split (the package root's with why);
# any other module there is listed as a newcomer the mapping does not know.
STAY = {
    "floom/__init__.py": "the version",
    "floom/bundle.py": "worker folders as archives, used by every layer",
    "floom/config.py": "settings",
    "floom/errors.py": "the exception root",
    "floom/client_env.py": "read by floom/config.py; in client/ it would close a cycle",
    "floom/jsonvalues.py": "bounds on JSON values, imported by every layer from the CLI to "
    "the services (schemas/ imports services, store/ is full)",
    **dict.fromkeys(
        f"floom/{name}.py"
        for name in (
            "api/app api/auth api/body_limit api/errors api/mcp_mount api/metrics api/openapi "
            "api/routing api/ui_mount api/address_limit api/forwarded cli/__main__ cli/command "
            "cli/common cli/console cli/index cli/output cli/quick cli/serve cli/serving "
            "cli/visible engine/attempt engine/cleanup engine/collect engine/executor "
            "engine/phases engine/queue engine/runlog engine/safefiles engine/script "
            "engine/work_root mcp/catalog mcp/errors mcp/http mcp/render mcp/server mcp/stdio "
            "mcp/toolkit sandbox/base sandbox/fake sandbox/fence sandbox/watchdog "
            "services/context services/wakeups triggers/cron triggers/signatures triggers/spec"
        ).split()
    ),
}

# Each new package's docstring.
PACKAGES: dict[str, str] = {
    "floom/manifest": "worker.yml: its schema (schema.py), reading it (load.py), the checks of "
    "its sections (checks.py, agent.py, replay.py, triggers.py) and of run values against "
    "the fields it declares (fields.py).",
    "floom/client": "The REST client the CLI and the stdio MCP server use: rest.py (httpx), "
    "lite.py (the standard library only, for the CLI's hot path), wire.py (what every "
    "client says and reads) and handoffs.py (the handoff layer's calls). Where a client finds "
    "its server is floom/client_env.py, which the server's settings read too.",
    "floom/net": "Connections floom makes on a worker's behalf: the egress guard (egress.py) "
    "and the addresses of this host (addresses.py), which the sandbox's network fence reads "
    "too.",
    "floom/services/runs": "Runs: creating, reading and cancelling them (lifecycle.py), the "
    "state machine (rules.py over statuses.py), waiting for their end, their records, logs, "
    "lineage, approvals and agent records, and the secrets scan of their artifacts.",
    "floom/services/workers": "Workers: deploying versions and rolling back (versions.py), "
    "deleting, diffs between versions, the shipped examples, which surfaces may start a "
    "worker, and a node's ceilings on worker.yml's limits.",
    "floom/services/triggers": "Triggers of workers: kept in step with the active version "
    "(registry.py), schedule fires, webhook deliveries and Composio events.",
    "floom/services/replays": "Replays of agent runs from their recordings, their diffs "
    "against the original, evals over many runs and the eval gate on deploy.",
    "floom/services/access": "Who may do what: API keys, the caller (principal.py), secrets, "
    "browser sessions, the audit trail and the cache of recently authenticated keys.",
    "floom/services/ops": "A node's operations: backup and restore, retention, /metrics, "
    "copying a store to another database, the cluster's nodes and `floom doctor`'s checks.",
    "floom/engine/loops": "A node's background threads beside the run pipeline: its presence "
    "(and the C heap), the scheduler, housekeeping and the handoff loop.",
    "floom/sandbox/local": "The local backend: a script worker under bubblewrap on this host, "
    "with its namespaces, cgroups, seccomp filter, network, disk, host uid, launchers "
    "started ahead and the supervisor that watches it.",
    "floom/sandbox/e2b": "The E2B backend: script workers in E2B microVMs through the `e2b` "
    "SDK, their commands and the transfer of their files.",
    "floom/api/routes": "The REST routes, one module per resource.",
    "floom/ui": "The web UI's server-rendered pages (templates in web/), loaded by "
    "floom/api/ui_mount.py at the first page asked for.",
    "floom/mcp/tools": "floom's MCP tools, written once against the Backend interface; both "
    "transports serve them.",
    "floom/mcp/backends": "What an MCP tool calls: the interface (base.py), floom's services "
    "inside the server (local.py) and a server's REST API for `floom mcp` (rest.py).",
    "floom/cli/commands": "The floom command's groups, one module each, loaded on demand by "
    "the index (floom/cli/index.py).",
}

# Text edits that the general rewrite cannot infer, each (file, old, new). A pair whose new
# text is present is already done; a file without either fails the run.
PATCHES: list[tuple[str, str, str]] = [
    # The UI's and the routes' routers live in subpackages now: walk them.
    (
        "tests/test_idle_footprint.py",
        "    modules = [\n"
        '        importlib.import_module(f"floom.api.{info.name}")\n'
        "        for info in pkgutil.iter_modules(floom.api.__path__)\n"
        "    ]\n",
        "    modules = [\n"
        "        importlib.import_module(info.name)\n"
        "        for package in (floom.api, floom.ui)\n"
        '        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")\n'
        "    ]\n",
    ),
    (
        "tests/test_idle_footprint.py",
        "import floom.api\n",
        "import floom.api\nimport floom.ui\n",
    ),
    # The state machine's own file, skipped when looking for status writes.
    (
        "tests/test_run_rules.py",
        'path.name == "run_rules.py"',
        'path.relative_to(FLOOM).as_posix() == "services/runs/rules.py"',
    ),
]

# Files whose string literals name modules relative to a package ("runs.get_run" for
# floom.services.runs.get_run): those names are rewritten too.
RELATIVE_NAMES = {"tests/test_authorization.py": "floom.services"}

# The CLI's index names each command's module relative to floom.cli.
CLI_INDEX = "floom/cli/index.py"

TEXT_SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".cfg", ".ini", ".txt", ".sh"}
TEXT_NAMES = {"Dockerfile", "dev", "run"}
SCOPES = ("floom", "tests", "bench", "docs", ".ci", "workers", "web")
SELF = "dev-tools/relayout.py"


class Refused(Exception):
    """What stops the run, said in one line."""


def git(*args: str, check: bool = True) -> str:
    done = subprocess.run(["git", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise Refused(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def dotted(path: str) -> str:
    parts = list(Path(path).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def exists_as_module(name: str) -> bool:
    base = Path(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def plan() -> tuple[list[tuple[str, str]], dict[str, str], dict[str, str]]:
    """The moves to make now, and the renames to apply: dotted names and paths, old -> new.

    A rename applies when its module moves now, or moved earlier and its old name no longer
    names anything (a stale reference); a name that is a package now is left alone."""
    moves: list[tuple[str, str]] = []
    names: dict[str, str] = {}
    paths: dict[str, str] = {}
    for old, new in sorted(MOVES.items()):
        old_there, new_there = Path(old).is_file(), Path(new).is_file()
        if old_there and new_there:
            raise Refused(f"{old} and {new} both exist; merge them by hand first")
        if old_there:
            moves.append((old, new))
        elif not new_there:
            continue  # a newcomer that is not in this tree
        elif exists_as_module(dotted(old)):
            paths[old] = new  # the old name is a package now: only its file path is stale
            continue
        names[dotted(old)] = dotted(new)
        paths[old] = new
    for old, new in moves:
        names[dotted(old)] = dotted(new)
        paths[old] = new
    return moves, names, paths


def tracked_text_files() -> list[Path]:
    files = []
    for line in sorted(git("ls-files").splitlines()):
        path = Path(line)
        if line == SELF or not path.is_file():
            continue
        top = path.parts[0]
        if len(path.parts) > 1 and top not in SCOPES:
            continue
        if path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES:
            files.append(path)
    return files


# ---- rewriting --------------------------------------------------------------------------


def names_pattern(names: dict[str, str]) -> re.Pattern[str] | None:
    if not names:
        return None
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=lambda n: (-len(n), n)))
    return re.compile(rf"(?<![\w.])({alternatives})(?![\w])")


def paths_pattern(
    paths: dict[str, str],
) -> tuple[re.Pattern[str] | None, dict[str, str]]:
    """Paths as written in docs and tests: floom/services/keys.py, or services/keys.py
    (relative to floom/) for a module in a subfolder."""
    forms: dict[str, str] = {}
    for old, new in paths.items():
        forms[old] = new
        rel_old, rel_new = old.removeprefix("floom/"), new.removeprefix("floom/")
        if "/" in rel_old:
            forms[rel_old] = rel_new
    if not forms:
        return None, forms
    alternatives = "|".join(re.escape(f) for f in sorted(forms, key=lambda f: (-len(f), f)))
    return re.compile(rf"(?<![\w./-])({alternatives})(?![\w/])"), forms


def bare_names(paths: dict[str, str]) -> dict[str, str]:
    """Old file names said without their folder (`run_statuses.py`) in comments and
    docstrings -> the new path, for names that were unique and change."""
    in_tree = Counter(Path(p).name for p in git("ls-files", "floom").splitlines())
    new_names = {Path(new).name for new in MOVES.values()}
    found = {}
    for old, new in paths.items():
        name = Path(old).name
        unique = in_tree[name] == (1 if Path(old).exists() else 0)
        if Path(new).name != name and unique and name not in new_names:
            found[name] = new
    return found


def rewrite_dotted(text: str, pattern: re.Pattern[str] | None, names: dict[str, str]) -> str:
    if pattern is None:
        return text
    out = []
    for line in text.splitlines(keepends=True):
        # Logger names are user-visible and stay (floom.sandbox.e2b names a logger too).
        if "getLogger(" in line or "logger=" in line:
            out.append(line)
        else:
            out.append(pattern.sub(lambda m: names[m.group(1)], line))
    return "".join(out)


def rewrite_paths(text: str, pattern: re.Pattern[str] | None, forms: dict[str, str]) -> str:
    if pattern is None:
        return text
    return pattern.sub(lambda m: forms[m.group(1)], text)


def rewrite_from_imports(text: str, names: dict[str, str], where: Path) -> str:
    """`from pkg import mod` where pkg.mod moved: `from newpkg import newmod [as mod]`."""
    if not names or "import" not in text:
        return text
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise Refused(f"{where}: does not parse ({exc})") from exc
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        if not any(f"{node.module}.{a.name}" in names for a in node.names):
            continue
        indent = " " * node.col_offset
        stay = [a for a in node.names if f"{node.module}.{a.name}" not in names]
        statements = []
        if stay:
            listed = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in stay)
            statements.append(f"{indent}from {node.module} import {listed}\n")
        for a in node.names:
            new = names.get(f"{node.module}.{a.name}")
            if new is None:
                continue
            package, module = new.rsplit(".", 1)
            local = a.asname or a.name
            alias = "" if local == module else f" as {local}"
            statements.append(f"{indent}from {package} import {module}{alias}\n")
        start, end = node.lineno - 1, (node.end_lineno or node.lineno) - 1
        first, after = lines[start], lines[end][node.end_col_offset or 0 :].strip()
        if first[: node.col_offset].strip() or (after and not after.startswith("#")):
            raise Refused(f"{where}:{node.lineno}: an import shares its line; split it first")
        if after:  # a trailing comment (a noqa) holds for each statement
            statements = [f"{s[:-1]}  {after}\n" for s in statements]
        edits.append((start, end, "".join(statements)))
    for start, end, new_text in sorted(edits, reverse=True):
        lines[start : end + 1] = [new_text]
    return "".join(lines)


_IMPORT_LINE = re.compile(r"^([ \t]*)from (floom[\w.]*) import ([\w, ]+?)[ \t]*$", re.MULTILINE)


def rewrite_import_lines(text: str, names: dict[str, str]) -> str:
    """`from pkg import mod` as a whole line of a string (a script a test runs): the same
    rewrite as for code, which the syntax tree does not see there."""

    def one(m: re.Match[str]) -> str:
        indent, package, listed = m.groups()
        aliases = [a.strip().split(" as ") for a in listed.split(",") if a.strip()]
        if not any(f"{package}.{a[0].strip()}" in names for a in aliases):
            return m.group(0)
        stay, moved = [], []
        for alias in aliases:
            name, local = alias[0].strip(), alias[-1].strip()
            new = names.get(f"{package}.{name}")
            if new is None:
                stay.append(name if local == name else f"{name} as {local}")
                continue
            parent, module = new.rsplit(".", 1)
            moved.append(
                f"{indent}from {parent} import {module}"
                + ("" if local == module else f" as {local}")
            )
        head = [f"{indent}from {package} import {', '.join(stay)}"] if stay else []
        return "\n".join(head + moved)

    return _IMPORT_LINE.sub(one, text)


def rewrite_docs_bare(text: str, bare: dict[str, str]) -> str:
    """Bare old file names in comments and docstrings of a Python file."""
    if not bare:
        return text
    alternatives = "|".join(re.escape(b) for b in sorted(bare, key=lambda b: (-len(b), b)))
    pattern = re.compile(rf"(?<![\w./-])({alternatives})(?![\w])")
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    lines = text.splitlines(keepends=True)
    edits = []
    previous = tokenize.NEWLINE
    for tok in tokens:
        is_doc = tok.type == tokenize.STRING and previous in (
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.NL,
            tokenize.ENCODING,
        )
        if tok.type == tokenize.COMMENT or is_doc:
            edits.append(tok)
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type
    for tok in reversed(edits):
        (srow, scol), (erow, ecol) = tok.start, tok.end
        chunk = "".join(lines[srow - 1 : erow])
        offset_end = len(chunk) - len(lines[erow - 1]) + ecol
        body = chunk[scol:offset_end]
        new_body = pattern.sub(lambda m: bare[m.group(1)], body)
        if new_body != body:
            chunk = chunk[:scol] + new_body + chunk[offset_end:]
            lines[srow - 1 : erow] = chunk.splitlines(keepends=True)
    return "".join(lines)


def rewrite_relative_strings(text: str, base: str, names: dict[str, str]) -> str:
    """In string literals only: `runs.get_run` (relative to base) -> `runs.lifecycle.get_run`."""
    relative = {
        old.removeprefix(base + "."): new.removeprefix(base + ".")
        for old, new in names.items()
        if old.startswith(base + ".") and new.startswith(base + ".")
    }
    if not relative:
        return text
    alternatives = "|".join(re.escape(r) for r in sorted(relative, key=lambda r: (-len(r), r)))
    pattern = re.compile(rf"(?<![\w.])({alternatives})(?=\.\w)")
    lines = text.splitlines(keepends=True)
    strings = [
        t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.STRING
    ]
    for tok in reversed(strings):
        (srow, scol), (erow, ecol) = tok.start, tok.end
        chunk = "".join(lines[srow - 1 : erow])
        offset_end = len(chunk) - len(lines[erow - 1]) + ecol
        body = chunk[scol:offset_end]
        new_body = pattern.sub(lambda m: relative[m.group(1)], body)
        if new_body != body:
            chunk = chunk[:scol] + new_body + chunk[offset_end:]
            lines[srow - 1 : erow] = chunk.splitlines(keepends=True)
    return "".join(lines)


def rewrite_cli_index(text: str, names: dict[str, str]) -> str:
    commands = {
        old.removeprefix("floom.cli."): new.removeprefix("floom.cli.")
        for old, new in names.items()
        if old.startswith("floom.cli.")
    }
    return re.sub(
        r'(Entry\(\s*")([\w.]+)(")',
        lambda m: m.group(1) + commands.get(m.group(2), m.group(2)) + m.group(3),
        text,
    )


LINE_LENGTH = 100  # pyproject.toml's ruff line-length
_COMMENT = re.compile(r"^(\s*# )(?=\S)")
_STRING_PART = re.compile(r'^(\s*)"([^"\\]*)"\n?$')


def _fill(words: list[str], first: str, rest: str) -> list[str]:
    lines, line, empty = [], first, True
    for word in words:
        if not empty and len(line) + 1 + len(word) > LINE_LENGTH:
            lines.append(line)
            line = rest + word
        else:
            line = line + ("" if empty else " ") + word
        empty = False
    lines.append(line)
    return [f"{x}\n" for x in lines]


def _paragraph(lines: list[str], at: int, same: object) -> tuple[int, int]:
    start = end = at
    while start > 0 and same(lines[start - 1]):  # type: ignore[operator]
        start -= 1
    while end + 1 < len(lines) and same(lines[end + 1]):  # type: ignore[operator]
        end += 1
    return start, end


def reflow(text: str) -> str:
    """Rewrap the comment, docstring and string-literal paragraphs that a longer name pushed
    past the line length (code lines are ruff format's)."""
    lines = text.splitlines(keepends=True)
    done: set[int] = set()
    while True:
        long = [i for i, x in enumerate(lines) if len(x.rstrip("\n")) > LINE_LENGTH]
        long = [i for i in long if i not in done]
        if not long:
            return "".join(lines)
        at = long[0]
        done.add(at)
        line = lines[at]
        in_string = {}
        for tok in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
            if tok.type == tokenize.STRING and tok.start[0] != tok.end[0]:
                for row in range(tok.start[0], tok.end[0] + 1):
                    in_string[row - 1] = (tok.start[0] - 1, tok.end[0] - 1)
        if comment := _COMMENT.match(line):
            prefix = comment.group(1)
            start, end = _paragraph(
                lines,
                at,
                lambda x, prefix=prefix: (
                    _COMMENT.match(x)
                    and x.startswith(prefix)
                    and not x[len(prefix) :].startswith(("-", "*"))
                ),
            )
            words = " ".join(x[len(prefix) :].strip() for x in lines[start : end + 1]).split()
            lines[start : end + 1] = _fill(words, prefix, prefix)
        elif at in in_string:
            first, last = in_string[at]
            indent = line[: len(line) - len(line.lstrip())]

            def same(x: str, indent: str = indent) -> bool:
                body = x.strip()
                return (
                    bool(body)
                    and x.startswith(indent)
                    and not x[len(indent)].isspace()
                    and not body.startswith(("-", "*", "|", ">>>", '"""'))
                    and body != '"""'
                )

            start, end = _paragraph(lines, at, same)
            start, end = max(start, first), min(end, last)
            if lines[start].lstrip().startswith('"""') and start != first:
                start += 1
            words = " ".join(x.strip() for x in lines[start : end + 1]).split()
            lines[start : end + 1] = _fill(words, indent, indent)
        elif (body := line.strip()).startswith('"""') and body.endswith('"""') and len(body) > 6:
            indent = line[: len(line) - len(line.lstrip())]
            lines[at : at + 1] = _fill(body.split(), indent, indent)
        elif part := _STRING_PART.match(line):
            indent = part.group(1)
            start, end = _paragraph(
                lines,
                at,
                lambda x, indent=indent: bool(_STRING_PART.match(x)) and x.startswith(indent + '"'),
            )
            whole = "".join(_STRING_PART.match(x).group(2) for x in lines[start : end + 1])  # type: ignore[union-attr]
            words = whole.split(" ")
            chunks, chunk = [], ""
            for word in words:
                if chunk and len(indent) + len(chunk) + len(word) + 3 > LINE_LENGTH:
                    chunks.append(chunk)
                    chunk = ""
                chunk += word + " "
            chunks.append(chunk[:-1])
            if "".join(chunks) == whole:
                lines[start : end + 1] = [f'{indent}"{c}"\n' for c in chunks]


def apply_patches() -> list[Path]:
    touched = []
    for file, old, new in PATCHES:
        path = Path(file)
        if not path.is_file():
            raise Refused(f"{file}: missing; update PATCHES in {SELF}")
        text = path.read_text()
        if new in text:
            continue
        if old not in text:
            raise Refused(f"{file}: neither the old nor the new text of a patch; see {SELF}")
        path.write_text(text.replace(old, new, 1))
        touched.append(path)
    return touched


# ---- checks -----------------------------------------------------------------------------


def folder_problems() -> list[str]:
    """Folders of floom/ over the limits: more than MAX_MODULES modules, or three modules whose
    names share the part before the first underscore. The same rule as tests/test_layout.py."""
    problems = []
    for folder in sorted({p.parent for p in Path("floom").rglob("*.py")}):
        if "migrations" in folder.parts:
            continue
        modules = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("__"))
        if len(modules) > MAX_MODULES:
            problems.append(f"{folder}/ holds {len(modules)} modules: {', '.join(modules)}")
        prefixes = Counter(m.split("_")[0] for m in modules)
        for prefix, count in sorted(prefixes.items()):
            if count > MAX_SHARING_A_PREFIX:
                sharing = [m for m in modules if m.split("_")[0] == prefix]
                problems.append(f"{folder}/: {count} modules share `{prefix}`: {sharing}")
    return problems


def newcomers() -> list[str]:
    """Modules of the folders being split that this script neither moves nor keeps."""
    split = {str(Path(old).parent) for old in MOVES}
    known = set(MOVES) | set(MOVES.values()) | set(STAY)
    found = []
    for folder in sorted(split):
        for path in sorted(Path(folder).glob("*.py")):
            if path.name != "__init__.py" and str(path) not in known:
                found.append(str(path))
    return found


def file_depth_problems(moves: list[tuple[str, str]]) -> list[str]:
    """A moved module that finds files by its own path at a new depth."""
    found = []
    for old, new in moves:
        text = Path(new).read_text()
        if "__file__" in text and len(Path(old).parts) != len(Path(new).parts):
            found.append(f"{new} reads __file__ and moved from depth {len(Path(old).parts)}")
    return found


def leftovers(files: list[Path], names: dict[str, str], paths: dict[str, str]) -> list[str]:
    """Old names still written somewhere (logger names aside): for the report."""
    stale = {n for n in names if not exists_as_module(n)}
    pattern = names_pattern(dict.fromkeys(stale, ""))
    found = []
    for path in files:
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "getLogger(" in line or "logger=" in line:
                continue
            hits = pattern.findall(line) if pattern else []
            hits += [p for p in paths if p in line and not Path(p).exists()]
            if hits:
                found.append(f"{path}:{number}: {', '.join(sorted(set(hits)))}")
    return found


# ---- the run ----------------------------------------------------------------------------


STARTED = False  # set once the tree is changed: only then is a failure undone


def run() -> int:  # noqa: C901 (one linear script: check, plan, move, rewrite, verify)
    global STARTED
    if not Path(".git").exists() or not Path("floom/__init__.py").is_file():
        raise Refused("run it at the top of a floom checkout")
    if git("status", "--porcelain").strip():
        raise Refused("the tree has changes or untracked files; commit or stash them first")
    has_ruff = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True)
    if has_ruff.returncode != 0:
        raise Refused(f"no ruff for {sys.executable}; run it with the project's venv python")
    moves, names, paths = plan()
    bare = bare_names(paths)
    if not moves and not names:
        extra = newcomers()
        problems = folder_problems()
        for line in extra:
            print(f"not placed: {line}")
        for line in problems:
            print(f"over the limits: {line}", file=sys.stderr)
        print("nothing to move: the tree has its layout")
        return 1 if problems else 0

    STARTED = True
    for old, new in moves:
        Path(new).parent.mkdir(parents=True, exist_ok=True)
        git("mv", old, new)

    extra = newcomers()
    problems = folder_problems() + file_depth_problems(moves)
    if problems:
        for line in extra:
            print(f"not placed (add it to MOVES or STAY): {line}", file=sys.stderr)
        raise Refused("the layout would still break its rules:\n  " + "\n  ".join(problems))

    dotted_re = names_pattern(names)
    path_re, path_forms = paths_pattern(paths)
    files = tracked_text_files()
    touched: list[Path] = []
    for path in files:
        text = path.read_text()
        new = rewrite_dotted(text, dotted_re, names)
        new = rewrite_paths(new, path_re, path_forms)
        if path.suffix == ".py":
            new = rewrite_from_imports(new, names, path)
            new = rewrite_import_lines(new, names)
            new = rewrite_docs_bare(new, bare)
            if path.as_posix() in RELATIVE_NAMES:
                new = rewrite_relative_strings(new, RELATIVE_NAMES[path.as_posix()], names)
            if path.as_posix() == CLI_INDEX:
                new = rewrite_cli_index(new, names)
        if new != text:
            path.write_text(new)
            touched.append(path)
    touched += apply_patches()
    for path in touched:
        if path.suffix == ".py":
            text = path.read_text()
            if (flowed := reflow(text)) != text:
                path.write_text(flowed)

    for package, doc in sorted(PACKAGES.items()):
        init = Path(package) / "__init__.py"
        if Path(package).is_dir() and not init.exists():
            init.write_text(textwrap.fill(f'"""{doc}"""', width=LINE_LENGTH - 1) + "\n")
            touched.append(init)

    python = sorted({str(p) for p in touched if p.suffix == ".py" and p.exists()})
    python += sorted(str(Path(p) / "__init__.py") for p in PACKAGES if Path(p).is_dir())
    python = sorted(set(python))
    if python:
        ruff = [sys.executable, "-m", "ruff"]
        subprocess.run([*ruff, "format", "--quiet", *python], check=True)
        subprocess.run([*ruff, "check", "--fix", "--quiet", *python], check=False)
        subprocess.run([*ruff, "format", "--quiet", *python], check=True)
    git("add", "-A", "--", *sorted({str(p) for p in touched}))

    for old, new in moves:
        print(f"moved {old} -> {new}")
    for line in extra:
        print(f"not placed (stays where it is): {line}")
    print(f"rewrote references in {len(set(touched))} files")
    for line in leftovers(files, names, paths):
        print(f"old name left (read it): {line}")
    return 0


def main() -> int:
    try:
        return run()
    except (Refused, subprocess.CalledProcessError, OSError) as exc:
        print(f"relayout: {exc}", file=sys.stderr)
        if not STARTED:
            return 1
        print(
            "relayout: undoing every change (git reset --hard, git clean)",
            file=sys.stderr,
        )
        git("reset", "--quiet", "--hard", "HEAD", check=False)
        git("clean", "-fdq", "--", "floom", "tests", "bench", check=False)
        return 1


if __name__ == "__main__":
    sys.exit(main())
