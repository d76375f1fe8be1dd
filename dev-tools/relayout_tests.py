#!/usr/bin/env python3
"""Sorts floom's tests by what they cost (issue 31, item 4), on whatever tree it runs in.

    cd <a clean checkout> && /work/main/.venv/bin/python dev-tools/relayout_tests.py

- tests/unit/: no server, database or sandbox; the whole folder runs in seconds.
- tests/integration/: both stores, the sandbox contract, the engine, the agent loop.
- tests/e2e/: servers on loopback, the CLI, MCP clients, the browser, clusters, compose.
- tests/support/: the helpers tests share; tests/standins/ stays (the cloud stand-ins).

The helpers that tests/conftest.py used to hold beside its fixtures (a live server, waits,
worker folders) move to tests/support/harness.py; conftest.py keeps the fixtures and
imports what they need from there. Every `from tests.conftest import ...` becomes an
import from the harness.

It reuses dev-tools/relayout.py's machinery (git mv, rewriting dotted names and paths in
code, docs and build files, ruff format), so the same rules hold: a clean tree only,
deterministic and idempotent, and a test file it does not know fails the run, naming the
file (add it to CATEGORY). Run it once more after every branch is merged.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import relayout

# Helpers shared by tests: old path -> new path.
SUPPORT = {
    "tests/agent_helpers.py": "tests/support/agents.py",
    "tests/cluster_support.py": "tests/support/cluster.py",
    "tests/compose_support.py": "tests/support/compose.py",
    "tests/e2b_support.py": "tests/support/e2b.py",
    "tests/fake_provider.py": "tests/support/fake_provider.py",
    "tests/handoff_support.py": "tests/support/handoffs.py",
    "tests/mcp_support.py": "tests/support/mcp_clients.py",
    "tests/netns_support.py": "tests/support/netns.py",
    "tests/openapi_support.py": "tests/support/openapi.py",
    "tests/pg_databases.py": "tests/support/pg_databases.py",
    "tests/ports.py": "tests/support/ports.py",
    "tests/queue_support.py": "tests/support/queues.py",
    "tests/sandbox_support.py": "tests/support/sandboxes.py",
    "tests/scheduler_node.py": "tests/support/scheduler_node.py",
    "tests/server_process.py": "tests/support/server_process.py",
    "tests/tcp_proxy.py": "tests/support/tcp_proxy.py",
    "tests/web_support.py": "tests/support/web.py",
}

# Each test module's folder, by what its tests need (the heaviest test of the file decides).
CATEGORY: dict[str, str] = {}


def _place(folder: str, names: str) -> None:
    for name in names.split():
        CATEGORY[f"test_{name}.py"] = folder


# Rules, parsers and pure functions: no server, database or sandbox.
_place(
    "unit",
    "agent_manifest env_names handoff_rules layout manifest mcp_declarations run_ends "
    "run_rules safefiles triggers_cron docs",
)
# The agent loop against the model stand-in, on both stores.
_place(
    "integration/agent",
    "agent_approvals agent_bounds agent_e2b agent_limits agent_loop agent_loop_fake "
    "agent_streaming agent_tools",
)
# Sandboxes: bubblewrap, E2B through its wire stand-in, the network fence, the watchdog.
_place(
    "integration/sandbox",
    "e2b_lease e2b_standin egress lease_watchdog ns_mount sandbox_contract sandbox_e2b "
    "sandbox_launch sandbox_local sandbox_standby sandbox_uids",
)
# The store and the engine on SQLite and PostgreSQL: the queue, leases, fences, handoffs.
_place(
    "integration/store",
    "claim_on_queue engine_fake fencing handoff_concurrency handoffs idle_wakeups "
    "lease_keeping migrations pg_databases queue run_log_flush start_ahead store_pool "
    "triggers_schedule trusted_row",
)
# A server on loopback and its REST API.
_place(
    "e2e/api",
    "api approvals artifact_secrets authorization body_limit boundary edge_requests errors "
    "evals example_repo_triage examples fairness handoff_api hooks_anonymous hostile_rows "
    "isolation json_bounds limit_ceilings limits_parsers model_provider openapi_contract "
    "openapi_fuzz replays revocation run_redaction runs sandbox_limits sandbox_network "
    "secrets_and_keys start_wait triggers_composio triggers_webhooks waits workdir_layer "
    "worker_deletion cleanup e2b_server api_reference_pages",
)
# The floom command against a live server.
_place("e2e/cli", "cli cli_approvals cli_index cli_init cli_quick cli_visible triggers_cli")
# MCP clients (the SDK's own) over stdio and HTTP, and what each surface says.
_place(
    "e2e/mcp",
    "mcp_agent_session mcp_artifacts mcp_exposed_approval mcp_handoffs mcp_http mcp_stdio "
    "hints_by_surface stored_notices_by_surface handoff_bridge expose",
)
# The web UI: pages over HTTP and in headless Chromium.
_place(
    "e2e/web",
    "web_handoffs web_handoffs_ui web_ops web_ops_browser web_pages web_ui web_worker_deletion",
)
# Nodes as processes: clusters, restarts, shutdown, compose, operations.
_place(
    "e2e/nodes",
    "cluster_fencing cluster_limits cluster_revocation cluster_scheduler cluster_wakeups "
    "compose_cluster compose_file docker_files node_roles node_start nodes recovery shutdown "
    "work_root_lock heap_release idle_footprint admin_key_restart ops_backup ops_doctor "
    "ops_metrics ops_migrate_store ops_retention no_executor",
)

PACKAGES = {
    "tests/support": "What tests share: a live server and its waits (harness.py), worker rigs, "
    "MCP clients, sandboxes, databases, ports and the nodes tests start as processes.",
    "tests/unit": "Rules, parsers and pure functions: no server, database or sandbox "
    "(`./dev test unit` runs these in seconds).",
    "tests/integration": "floom's parts against real ones: both stores, bubblewrap, the E2B "
    "and model stand-ins, the engine.",
    "tests/integration/agent": "The agent loop against the model provider's stand-in.",
    "tests/integration/sandbox": "The sandbox contract and its backends: bubblewrap, E2B "
    "through its wire stand-in, the network fence, the lease watchdog.",
    "tests/integration/store": "The store and the engine on SQLite and PostgreSQL: the "
    "queue, claims, leases, fences, handoffs, migrations.",
    "tests/e2e": "floom as its users meet it: servers on loopback, the CLI, MCP clients, the "
    "browser, nodes as processes.",
    "tests/e2e/api": "The REST API of a live server.",
    "tests/e2e/cli": "The floom command against a live server.",
    "tests/e2e/mcp": "MCP clients over stdio and HTTP, and what each surface tells its user.",
    "tests/e2e/web": "The web UI over HTTP and in headless Chromium.",
    "tests/e2e/nodes": "Nodes as processes: clusters, restarts, shutdown, compose, operations.",
}

# tests/unit/conftest.py: the folder's promise, checked when its tests are collected.
UNIT_CONFTEST = '''"""Unit tests need no server, database or sandbox: a test here that asks for a
fixture that starts one fails at collection, naming it (move it to integration/ or e2e/)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
# The shared fixtures that open a database, start a server or need one.
HEAVY = {
    "api",
    "ctx",
    "database_url",
    "empty_database_url",
    "pg_available",
    "pg_databases",
    "pg_template",
    "server",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        heavy = sorted(HEAVY & set(getattr(item, "fixturenames", ())))
        if heavy and item.path.is_relative_to(HERE):
            raise pytest.UsageError(
                f"{item.nodeid} is a unit test but uses {', '.join(heavy)}: "
                "move it to tests/integration/ or tests/e2e/"
            )
'''

HARNESS = "tests/support/harness.py"
# conftest.py's top-level names that are helpers rather than fixtures.
HARNESS_NAMES = (
    "REPO EXAMPLES PG_ADMIN_URL fast_settings plain_client LiveServer start_server "
    "live_server wait_until wait_for_run make_worker deploy_folder"
).split()

# Text the general rewrite cannot infer, each (file, old, new), applied after the moves.
PATCHES = [
    (
        "tests/e2e/nodes/test_cluster_scheduler.py",
        'REPO / "tests" / "scheduler_node.py"',
        'REPO / "tests" / "support" / "scheduler_node.py"',
    ),
]


def moves() -> dict[str, str]:
    found = dict(SUPPORT)
    for path in sorted(Path("tests").glob("test_*.py")):
        folder = CATEGORY.get(path.name)
        if folder is None:
            raise relayout.Refused(
                f"{path}: not placed; add it to CATEGORY in dev-tools/relayout_tests.py "
                "(unit: no server, database or sandbox; integration: stores, sandboxes, "
                "engine; e2e: servers, CLI, MCP clients, browser, nodes)"
            )
        found[str(path)] = f"tests/{folder}/{path.name}"
    return found


_UP_TWO = re.compile(r"Path\(__file__\)\.resolve\(\)\.parent\.parent")


def fix_depths(moved: dict[str, str]) -> None:
    """A moved test that finds the checkout from its own path: from its new depth."""
    for new in moved.values():
        path = Path(new)
        if not path.is_file():
            continue
        depth = len(Path(new).parts) - 1
        text = path.read_text()
        fixed = _UP_TWO.sub(f"Path(__file__).resolve().parents[{depth}]", text)
        if fixed != text:
            path.write_text(fixed)


def split_harness() -> None:
    """conftest.py's helpers -> tests/support/harness.py; conftest keeps its fixtures."""
    conftest = Path("tests/conftest.py")
    text = conftest.read_text()
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    imports, moved, keep = [], [], []
    previous = 0
    for node in tree.body:
        # A node's text with the comments above it (blank lines dropped).
        chunk = "".join(lines[previous : node.end_lineno]).lstrip("\n")
        previous = node.end_lineno or previous
        names = _defined(node)
        if isinstance(node, ast.Import | ast.ImportFrom):
            imports.append(chunk)
            keep.append(chunk)
        elif names and set(names) <= set(HARNESS_NAMES):
            moved.append(chunk)
        else:
            keep.append(chunk)
    if not moved:
        return
    doc = (
        '"""What tests share beside the fixtures: a live floom server on loopback and the\n'
        'settings that make it quick, waits with deadlines, worker folders and their deploy."""\n\n'
    )
    harness = doc + "".join(imports) + "\n"
    for chunk in moved:  # constants one after another; a blank pair before a definition
        definition = chunk.startswith(("def ", "class ", "@"))
        harness += ("\n\n" if definition else "") + chunk + ("\n" if definition else "")
    harness = harness.replace(
        "Path(__file__).resolve().parent.parent", "Path(__file__).resolve().parents[2]"
    )
    Path(HARNESS).write_text(harness)
    present = [n for n in HARNESS_NAMES if n in harness]
    head = keep[0] if keep and keep[0].startswith('"""') else ""
    body = keep[1:] if head else keep
    conftest.write_text(
        head
        + "".join(c for c in body if c.startswith(("from", "import")))
        + f"from tests.support.harness import {', '.join(present)}\n\n\n"
        + "\n\n".join(c for c in body if not c.startswith(("from", "import")))
    )


def _defined(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def rewrite_conftest_imports() -> list[str]:
    touched = []
    for path in sorted(Path(".").glob("tests/**/*.py")) + sorted(Path("bench").glob("*.py")):
        text = path.read_text()
        new = text.replace("from tests.conftest import", "from tests.support.harness import")
        if new != text:
            path.write_text(new)
            touched.append(str(path))
    return touched


def run() -> int:
    moved = moves()
    relayout.MOVES = moved
    relayout.STAY = {"tests/conftest.py": "pytest's fixtures", "tests/__init__.py": "the package"}
    relayout.PACKAGES = PACKAGES
    relayout.PATCHES = []
    relayout.RELATIVE_NAMES = {
        k.replace("tests/", f"tests/{CATEGORY.get(Path(k).name, '')}/").replace("//", "/"): v
        for k, v in relayout.RELATIVE_NAMES.items()
    }
    relayout.SELF = "dev-tools/relayout_tests.py"
    relayout.file_depth_problems = lambda moves: []  # fixed below, by fix_depths
    code = relayout.run()
    fix_depths(moved)
    split_harness()
    touched = rewrite_conftest_imports()
    unit = Path("tests/unit/conftest.py")
    if not unit.exists():
        unit.write_text(UNIT_CONFTEST)
        touched.append(str(unit))
    for file, old, new in PATCHES:
        path = Path(file)
        if path.is_file() and old in (text := path.read_text()):
            path.write_text(text.replace(old, new))
            touched.append(file)
    python = sorted({*touched, "tests/conftest.py", HARNESS, *moved.values()})
    python = [p for p in python if Path(p).is_file()]
    ruff = [sys.executable, "-m", "ruff"]
    subprocess.run([*ruff, "check", "--fix", "--quiet", *python], check=False)
    subprocess.run([*ruff, "format", "--quiet", *python], check=True)
    subprocess.run(["git", "add", "-A", "tests", "bench"], check=True)
    return code


def main() -> int:
    try:
        return run()
    except (relayout.Refused, subprocess.CalledProcessError, OSError) as exc:
        print(f"relayout_tests: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
