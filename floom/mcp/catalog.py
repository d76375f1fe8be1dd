"""What the MCP server lists besides its fixed tools: the deployed workers (each one's manifest
is a resource) and the workers that declare `expose: [mcp]` (each one is a tool of its own)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
from pydantic import ValidationError

from floom.cut import cut
from floom.manifest.schema import FieldSpec, Manifest
from floom.mcp.errors import EXPECTED_ERRORS
from floom.mcp.render import said
from floom.schemas.common import Page
from floom.schemas.workers import WorkerPublic

log = logging.getLogger("floom.mcp")

# An exposed worker's tool waits this long at most for the run to end, then returns its id.
MAX_EXPOSED_WAIT_SECONDS = 120.0
_JSON_TYPES = {"file": "string"}
# The most characters of what a worker's manifest says about itself (its description, an
# input's) in a tool's listing: tools/list carries every exposed worker's, to every session.
MAX_EXPOSED_TEXT = 1000


@dataclass(frozen=True)
class ExposedWorker:
    """A worker served as a tool named after it."""

    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    wait_seconds: float


@dataclass(frozen=True)
class CatalogWorker:
    """A deployed worker as the catalog reads it: its name, and its active version's kind (where
    the listing tells it) and parsed manifest (None without an active version)."""

    name: str
    kind: str | None
    manifest: Manifest | None


@dataclass(frozen=True)
class Snapshot:
    workers: tuple[str, ...] = ()
    exposed: tuple[ExposedWorker, ...] = ()


def input_schema(inputs: dict[str, FieldSpec]) -> dict[str, Any]:
    """A JSON Schema for a worker's declared inputs (the manifest's field specs)."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, spec in inputs.items():
        prop: dict[str, Any] = {"type": _JSON_TYPES.get(spec.type, spec.type)}
        if spec.type == "file":
            prop["description"] = "file content as text"
        if spec.description:
            prop["description"] = _theirs(spec.description)
        if spec.enum:
            prop["enum"] = spec.enum
        if spec.default is not None:
            prop["default"] = spec.default
        elif spec.required:
            required.append(name)
        properties[name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def catalog_worker(worker: WorkerPublic) -> CatalogWorker:
    """A worker as the REST API lists it; a manifest this floom cannot read (a server of
    another version) exposes no tool."""
    manifest = None
    if worker.manifest is not None:
        try:
            manifest = Manifest.model_validate(worker.manifest)
        except ValidationError as exc:
            log.debug("the manifest of worker %s is not readable here: %s", worker.name, exc)
    return CatalogWorker(worker.name, worker.kind, manifest)


def exposed_worker(worker: CatalogWorker) -> ExposedWorker | None:
    """The tool of a worker, when its manifest exposes one."""
    manifest = worker.manifest
    if manifest is None or "mcp" not in manifest.expose:
        return None
    timeout = float(manifest.limits.timeout_seconds or 0) or 600.0
    # The worker's words, on one line and bounded, so that none of them poses as the part of
    # the description floom writes (which starts a paragraph of its own after them).
    title = _theirs(manifest.title or worker.name)
    what = _theirs(manifest.description) or title
    # A run that may stop for a person (a run gate, an agent's gated tool) answers with the
    # approval to decide: the agent should expect that rather than outputs.
    gated = manifest.approvals.get("required") or worker.kind == "agent"
    waits = (
        " A run that waits for a person's approval returns what it proposes and its "
        "approval_id for decide_approval."
        if gated
        else ""
    )
    return ExposedWorker(
        name=worker.name,
        title=title,
        description=(
            f"{what}\n\nRuns the floom worker '{worker.name}' with these inputs and returns "
            f"its outputs; a run still going after the wait returns its id for watch_run.{waits}"
        ),
        input_schema=input_schema(manifest.inputs),
        wait_seconds=min(timeout + 5.0, MAX_EXPOSED_WAIT_SECONDS),
    )


def _theirs(text: str) -> str:
    return cut(said(text), MAX_EXPOSED_TEXT)


class Catalog:
    """The last loaded view of the deployed workers.

    `load` returns every worker body (with its manifest); it runs on a worker thread. When it
    fails (server unreachable, no key configured), the previous view stays.
    """

    def __init__(self, load: Callable[[], list[CatalogWorker]]) -> None:
        self._load = load
        self._loaded = False
        self._lock = anyio.Lock()
        self.snapshot = Snapshot()

    async def refresh(self) -> bool:
        """Reload; True when the workers or exposed tools changed since an earlier load (the
        first load is not a change: nobody has seen a list yet)."""
        async with self._lock:
            first, self._loaded = not self._loaded, True
            try:
                bodies = await anyio.to_thread.run_sync(self._load)
            except EXPECTED_ERRORS as exc:
                log.debug("worker list unavailable: %s", exc)
                return False
            except Exception:  # the catalog is an extra; listing floom's own tools must go on
                log.exception("loading the worker list for MCP failed")
                return False
            snapshot = Snapshot(
                workers=tuple(sorted(b.name for b in bodies)),
                exposed=tuple(e for b in bodies if (e := exposed_worker(b)) is not None),
            )
            changed = snapshot != self.snapshot
            self.snapshot = snapshot
            return changed and not first

    def exposed(self, name: str) -> ExposedWorker | None:
        return next((e for e in self.snapshot.exposed if e.name == name), None)


def all_workers(
    list_page: Callable[[str | None], Page[WorkerPublic]], *, cap: int = 1000
) -> list[CatalogWorker]:
    """Every worker, page by page, up to `cap`."""
    items: list[CatalogWorker] = []
    cursor: str | None = None
    while len(items) < cap:
        page = list_page(cursor)
        items.extend(catalog_worker(w) for w in page.items)
        cursor = page.next_cursor
        if not cursor:
            break
    return items[:cap]
