"""The package layout stays acyclic and shows its plan: floom's packages and its top-level
modules import one another without a cycle and only downwards through the layers of LAYERS,
surfaces read the store's tables but never its engine, a floom import inside a function is
allowed only where it saves start-up time or memory, each listed here with its reason, no
module uses another module's underscore names, and no folder holds more than MAX_MODULES
modules or three modules sharing a prefix (a prefix is a folder waiting to be made).

The graph is read from the source with ast: imports at module level count (including those
under a module-level `if` or `try`), imports under `if TYPE_CHECKING:` do not."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

from floom.services.context import Context

FLOOM = Path(__file__).resolve().parents[2] / "floom"

# Every function-local floom import that may stay, as (file, imported module): the one reason
# is start-up time or memory paid by everyone for something few use.
DELIBERATE_LOCAL_IMPORTS = {
    # The MCP SDK costs ~50 MB; a server nobody reaches over MCP does not load it.
    ("floom/api/mcp_mount.py", "floom.mcp.http"),
    # `floom serve` alone needs the server app and the sandbox (~0.75 s of every CLI start-up).
    ("floom/cli/serving.py", "floom.api.app"),
    ("floom/cli/serving.py", "floom.api.draining"),
    ("floom/cli/serving.py", "floom.api.edge.connections"),
    ("floom/cli/serving.py", "floom.node"),
    ("floom/cli/serving.py", "floom.sandbox"),
    ("floom/cli/serving.py", "floom.sandbox.base"),
    # `floom serve` without typer (about 1.3 MiB resident that a server holds for days): the
    # plain command line is read by serving.py; typer and rich are loaded for an error line.
    ("floom/cli/index.py", "floom.cli.serving"),
    ("floom/cli/serving.py", "floom.cli.command"),
    # `floom` and `floom --help` print the command index without typer and the command
    # modules: 0.09 s instead of 0.25 s on a quiet 2-core machine (bench/bench_cli.py).
    ("floom/cli/index.py", "floom.cli.command"),
    # The REST client's models (pydantic and floom/schemas: 0.18 s -> 0.08 s to import the
    # client on a 2-core machine) only at the first answer read or request built.
    ("floom/client/rest.py", "floom.client.models"),
    # The e2b SDK (~1 s of CPU to import) only on a node that runs scripts in E2B.
    ("floom/sandbox/__init__.py", "floom.sandbox.e2b.backend"),
    # `floom mcp` alone needs the MCP SDK (~0.4 s of every CLI start-up).
    ("floom/cli/commands/mcp.py", "floom.mcp.stdio"),
    # Only validate and deploy check a folder locally: the manifest schema costs ~27 ms.
    ("floom/cli/commands/workers.py", "floom.manifest.schema"),
    ("floom/cli/commands/workers.py", "floom.manifest.load"),
    # Only deploy archives a folder (tarfile, lzma: ~4 ms).
    ("floom/cli/commands/workers.py", "floom.bundle"),
    # The agent package with httpx (~5 MiB resident) only on a node's first agent run.
    ("floom/node.py", "floom.agent.runner"),
    # The web UI (jinja2, the pages' modules and routes: ~5 MiB resident) only at the first
    # request no API route answers.
    ("floom/api/ui_mount.py", "floom.ui.app"),
    # prometheus-client (~1 MiB resident) only at the first scrape of /metrics.
    ("floom/api/metrics.py", "floom.services.ops.metrics"),
    # rich only for error lines, which `floom serve` (running for days) need not hold.
    ("floom/cli/command.py", "floom.cli.output"),
    # `floom run`'s stdlib-only path: typer, rich and httpx are loaded only when it hands
    # the command line over (an error, or a run outlasting the start's wait).
    ("floom/cli/index.py", "floom.cli.quick"),
    ("floom/cli/quick.py", "floom.cli.command"),
    ("floom/cli/quick.py", "floom.cli.common"),
    ("floom/cli/quick.py", "floom.cli.commands.runs"),
    # `floom init` alone checks a name against the manifest schema (~27 ms of CLI start-up).
    ("floom/cli/scaffold.py", "floom.manifest.schema"),
    # rich (about 50 ms) only when `floom run --wait` shows log lines; --json prints without it.
    ("floom/cli/quick.py", "floom.cli.console"),
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in FLOOM.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = list(path.relative_to(FLOOM.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node):
                yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _module_level(block)
            for handler in node.handlers:
                yield from _module_level(handler.body)


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The floom modules an import statement loads (a package for `from pkg import name`
    unless name is itself a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "floom"]
    base = node.module or ""
    if node.level:
        package = module.split(".")
        if MODULES[module].name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    if base.split(".")[0] != "floom":
        return []
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _group(module: str) -> str:
    """The unit the layout is judged by: a package (floom.services.context -> services) or a
    top-level module (floom.config -> config)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "floom"


def _package_graph() -> dict[str, dict[str, list[str]]]:
    """group -> imported group -> the module imports that make the edge."""
    graph: dict[str, dict[str, list[str]]] = {}
    for module, path in MODULES.items():
        for node in _module_level(ast.parse(path.read_text()).body):
            for target in _targets(module, node):
                source, dest = _group(module), _group(target)
                if source != dest and dest != "floom":  # floom/__init__ holds only the version
                    graph.setdefault(source, {}).setdefault(dest, []).append(
                        f"{module} -> {target}"
                    )
    return graph


def _cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _local_floom_imports() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    rel = path.relative_to(FLOOM.parent).as_posix()
                    found.update((rel, t) for t in _targets(module, node))
    return found


def test_no_import_cycle_between_floom_packages_and_top_level_modules() -> None:
    graph = _package_graph()
    cycles = _cycles(graph)
    explained = [
        f"{' <-> '.join(cycle)}: "
        + "; ".join(edge for a in cycle for b in cycle for edge in graph.get(a, {}).get(b, [])[:2])
        for cycle in cycles
    ]
    assert not cycles, "import cycles between packages:\n" + "\n".join(explained)


def test_the_graph_sees_the_edges_the_layout_relies_on() -> None:
    graph = _package_graph()
    assert "services" in graph["api"]
    assert "manifest" in graph["services"] or "manifest_load" in graph["services"]
    assert "engine" in graph["agent"]
    assert "agent" not in graph.get("engine", {})


# The layers, bottom up: a group (a package, or a top-level module) imports only groups of its
# own layer or of layers below it.
LAYERS: list[tuple[str, set[str]]] = [
    # Values and rules with no floom dependency beyond errors; hints are text and actions,
    # which each surface renders.
    (
        "leaves",
        {
            "errors",
            "vocabulary",
            "hints",
            "client_env",
            "net",
            "jsonvalues",
            "invisible",
            "cut",
            "bundle",
            "triggers",
        },
    ),
    ("settings", {"config"}),
    ("resources", {"store", "sandbox"}),
    ("worker.yml", {"manifest"}),
    # The domain.
    ("domain", {"services"}),
    ("public models", {"schemas"}),
    # The answers: public models filled from the services, for what the caller may see.
    ("answers", {"views"}),
    # The node: the run pipeline, its loops, and the agent loop that runs inside an attempt.
    ("node", {"engine", "agent"}),
    # A node's roles composed and started in order (floom/node.py).
    ("roles", {"node"}),
    ("client", {"client"}),
    ("surfaces", {"api", "ui", "mcp", "cli"}),
]
SURFACES = {"api", "ui", "mcp", "cli"}
# The store's modules that hold tables (rows, their types and helpers): what a surface may read.
STORE_TABLES = {
    f"floom.store.{name}"
    for name in ("models", "agents", "audit", "handoffs", "nodes", "replays", "triggers")
} | {"floom.store.web_sessions"}
# Today's exceptions, each a module import.
SURFACE_EXCEPTIONS = {
    # The one mapping of errors to answers knows the store's "unavailable" error.
    ("floom.api.errors", "floom.store.db"),
    # Whether an artifact is shown inline: the engine's text test, shared with collection.
    ("floom.mcp", "floom.engine.collect"),
}
MAX_MODULES = 12


def _module_edges() -> list[tuple[str, str]]:
    edges = []
    for module, path in MODULES.items():
        for node in _module_level(ast.parse(path.read_text()).body):
            edges += [(module, target) for target in _targets(module, node)]
    return edges


def _excepted(module: str, target: str) -> bool:
    return any(
        (module == a or module.startswith(a + ".")) and (target == b or target.startswith(b + "."))
        for a, b in SURFACE_EXCEPTIONS
    )


def test_every_group_is_in_one_layer() -> None:
    groups = {_group(module) for module in MODULES} - {"floom"}
    placed = [group for _, members in LAYERS for group in members]
    assert len(placed) == len(set(placed))
    assert sorted(groups - set(placed)) == [], "give each new package or module a layer"


def test_groups_import_only_their_own_layer_or_lower_ones() -> None:
    rank = {group: i for i, (_, members) in enumerate(LAYERS) for group in members}
    upwards = [
        f"{edge} ({LAYERS[rank[a]][0]} -> {LAYERS[rank[b]][0]})"
        for a, targets in _package_graph().items()
        for b, edges in targets.items()
        for edge in edges
        if rank.get(b, 0) > rank.get(a, 0) and not _excepted(*edge.split(" -> "))
    ]
    assert upwards == []


def test_services_never_import_the_engine_or_the_agent() -> None:
    graph = _package_graph()
    assert "engine" not in graph["services"]
    assert "agent" not in graph["services"]


# What a Context carries (floom/services/context.py): the node's runtime is not among them,
# only the one seam to it, NodeHooks.
CONTEXT_FIELDS = ["settings", "engine", "secret_box", "node_id", "node"]


def _hooks_members() -> set[str]:
    """NodeHooks' public methods and attributes, read from its class in the source."""
    tree = ast.parse((FLOOM / "services" / "context.py").read_text())
    (hooks,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "NodeHooks"]
    members = {n.name for n in hooks.body if isinstance(n, ast.FunctionDef)}
    members |= {
        n.attr
        for n in ast.walk(hooks)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
    }
    return {m for m in members if not m.startswith("_")}


def test_a_context_carries_no_node_runtime() -> None:
    assert [f.name for f in fields(Context)] == CONTEXT_FIELDS


def test_services_reach_the_node_through_its_hooks_only() -> None:
    # No call of services reaches the engine: not by import (above), nor by an engine object
    # left on the Context. A service reads the Context's fields, and of the node only what
    # NodeHooks declares (the engine's NodeRuntime implements them).
    hooks = _hooks_members()
    reached = []
    for module, path in MODULES.items():
        if _group(module) != "services":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or not isinstance(node.value, ast.Name):
                continue
            if node.value.id == "ctx" and node.attr not in CONTEXT_FIELDS:
                reached.append(f"{module}:{node.lineno} ctx.{node.attr}")
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "node"
                and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "ctx"
                and node.attr not in hooks
            ):
                reached.append(f"{module}:{node.lineno} ctx.node.{node.attr}")
    assert reached == []
    assert {"run_queued", "run_cancelled", "run_ended", "slot_for"} <= hooks


def test_surfaces_read_the_stores_tables_only() -> None:
    reaching = [
        f"{module} -> {target}"
        for module, target in _module_edges()
        if _group(module) in SURFACES
        and (
            (_group(target) == "store" and target not in STORE_TABLES) or _group(target) == "engine"
        )
        and not _excepted(module, target)
    ]
    assert reaching == [], "a surface calls the services; the store's engine is theirs"


def test_no_folder_holds_more_than_twelve_modules_or_three_sharing_a_prefix() -> None:
    crowded = []
    support = FLOOM.parent / "tests" / "support"
    shared = {support, *(p for p in support.iterdir() if (p / "__init__.py").is_file())}
    for folder in sorted({path.parent for path in MODULES.values()} | shared):
        modules = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("__"))
        rel = folder.relative_to(FLOOM.parent).as_posix()
        if len(modules) > MAX_MODULES:
            crowded.append(f"{rel}/ holds {len(modules)} modules")
        prefixes = Counter(module.split("_")[0] for module in modules)
        crowded += [f"{rel}/: {n} modules start with {p}_" for p, n in prefixes.items() if n > 2]
    assert crowded == [], "give the concern a folder of its own"


def test_function_local_floom_imports_are_only_the_deliberate_ones() -> None:
    local = _local_floom_imports()
    unexplained = sorted(local - DELIBERATE_LOCAL_IMPORTS)
    assert not unexplained, (
        "a floom import inside a function dodges a cycle; give the shared thing its own module "
        f"(or, for a measured start-up cost, list it here with the reason): {unexplained}"
    )
    assert len(local) <= len(DELIBERATE_LOCAL_IMPORTS)


def test_every_deliberate_local_import_says_why_in_its_file() -> None:
    for file, _ in DELIBERATE_LOCAL_IMPORTS:
        text = (FLOOM.parent / file).read_text()
        assert "Imported here, not at the top" in text or "Imported on first use" in text, file


# Underscore names of other libraries that floom uses knowingly: SQLAlchemy's Row._mapping is
# its documented public accessor; the mapper's class manager tells a table model; the MCP SDK
# offers no setting for the list-change capabilities its low-level server announces.
FOREIGN_PRIVATE_NAMES = {
    "_mapping",
    "_sa_class_manager",
    "_lowlevel_server",
    # A warm run ends as the interpreter would, minus tearing down the objects it shares with
    # its warm process (floom/sandbox/local/warm/inside.py): CPython's own exit steps.
    "_shutdown",
    "_run_exitfuncs",
    # The E2B SDK's FileStreamReader keeps its httpx response there and offers no raw read:
    # floom decodes a download's body itself, bounded (floom/sandbox/e2b/transfer.py).
    "_response",
}


def _names_bound_in(tree: ast.Module) -> set[str]:
    """Every name a file defines or binds: its functions, classes, variables, attributes it
    assigns, parameters and import aliases."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.id if isinstance(node, ast.Name) else node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return names


def test_no_module_uses_another_modules_underscore_names() -> None:
    reached = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        own = _names_bound_in(tree) | FOREIGN_PRIVATE_NAMES
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("floom"):
                reached += [
                    f"{module}:{node.lineno} imports {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
            elif (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and node.attr not in own
            ):
                reached.append(f"{module}:{node.lineno} uses {ast.unparse(node)}")
    assert not reached, (
        "a name two modules need is a concept: give it a public name (or a module of its own) "
        "instead of reaching into another module's underscore names:\n" + "\n".join(reached)
    )


def test_the_public_models_load_no_store_or_services_runtime() -> None:
    # The client returns the public models: the CLI loads them, so they know rows by type only.
    modules = sorted(m for m in MODULES if m.startswith("floom.schemas."))
    probe = (
        f"import sys, importlib\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'sqlmodel')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert loaded.stdout.strip() == "[]"


def test_the_rest_client_loads_its_models_at_their_first_use() -> None:
    # pydantic and the models cost about 0.1 s at import (floom.client.models); a command that
    # never reads an answer does not pay it. mypy reads the models' types all the same. The
    # handoff client too: the CLI's shared module (floom.cli.common) imports it.
    for client, model in (("rest", "RunQuery"), ("handoffs", "JobQuery")):
        loaded_now = "print('pydantic' in sys.modules, 'floom.schemas' in sys.modules)\n"
        probe = (
            f"import sys\nimport floom.client.{client} as client\nimport floom.cli.common\n"
            f"{loaded_now}client.models.{model}\n{loaded_now}"
        )
        loaded = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
        )
        assert loaded.stdout.split() == ["False", "False", "True", "True"], client
