"""The MCP server both transports serve: floom's tools, a tool per exposed worker, the worker
manifests and run logs as resources, and list-changed notifications when deploys change them."""

from __future__ import annotations

import inspect
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.session import ServerSession
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ResourcesListChanged,
    ToolsListChanged,
)
from mcp.shared.uri_template import UriTemplate
from mcp_types import CallToolResult, InputRequiredResult
from mcp_types import Resource as MCPResource
from mcp_types import Tool as MCPTool
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import AnyUrl

from floom import __version__
from floom.errors import FloomError
from floom.mcp.backends.base import Backend
from floom.mcp.catalog import Catalog, CatalogWorker, ExposedWorker
from floom.mcp.errors import (
    bad_arguments,
    resource_error,
    scoped_hints,
    tool_error,
    unknown_tool,
)
from floom.mcp.toolkit import RUNS, backend_of, off
from floom.mcp.tools import core as tools
from floom.mcp.tools.artifacts import ARTIFACT_URI, artifact_contents
from floom.schemas.runs import RunEventPublic
from floom.services.access.principal import Principal

log = logging.getLogger("floom.mcp")

# The tools the instructions recommend, in the order of a typical session, each with what is
# said after its name; a key is recommended only those its scope lets it call.
_SESSION_TOOLS = (
    ("validate_worker", ""),
    ("deploy_worker", ""),
    ("run_worker", " (with wait_seconds for short runs)"),
    ("watch_run", ""),
    ("get_run_logs", ""),
    ("list_runs", " to find failures"),
    ("replay_run", ""),
    ("rollback_worker", ""),
)
_HANDOFF_TOOLS = (
    "handoff_my_roles",
    "handoff_claim_next_job",
    "handoff_complete_job",
    "handoff_reject_job",
    "handoff_reopen_context",
)


def scoped_instructions(can_call: Callable[[str], bool] = lambda _tool: True) -> str:
    """What the server tells a client floom is, naming only the tools `can_call` allows."""
    session = ", ".join(f"{n}{said}" for n, said in _SESSION_TOOLS if can_call(n))
    handoffs = ", ".join(n for n in _HANDOFF_TOOLS if can_call(n))
    parts = [
        "floom runs background AI workers. A worker is a folder with worker.yml and a script "
        "(run.py, run.sh, ...) or SKILL.md."
    ]
    if session:
        parts.append(f"Typical session: {session}.")
    if handoffs:
        parts.append(
            f"Agents hand work to each other by role with the handoff_* tools: {handoffs}."
        )
    parts.append("Errors carry a code and a hint saying how to fix them.")
    if not all(can_call(n) for n, _ in _SESSION_TOOLS):
        parts.append(
            "This API key's scope leaves some tools out (tools/list shows those it may call); "
            "a hint naming one it may not says which scope that tool needs."
        )
    return " ".join(parts)


INSTRUCTIONS = scoped_instructions()
MANIFEST_URI = "floom://workers/{name}/manifest"
LOGS_URI = "floom://runs/{run_id}/logs"
ARTIFACT = UriTemplate.parse(ARTIFACT_URI)
MAX_LEGACY_SESSIONS = 256

BackendFactory = Callable[[Context], Backend]


class FloomMCPServer(MCPServer[Any]):
    """`backend_for` gives each call its Backend (one for stdio; per API key over HTTP).
    `reads_local_folders` says whether the server runs on the caller's machine (stdio), where
    tools offer a `folder` to pack; inside the floom server they take the files as content.
    `load_workers` lists every worker body for the catalog, reloaded when a list is asked
    for, after deploys and rollbacks through MCP, and every `poll_seconds` in the background
    so that deploys made elsewhere (CLI, REST, UI) also reach listening clients.
    `instructions` tell the client what floom is (the stdio server adds which key it acts as)."""

    def __init__(
        self,
        *,
        backend_for: BackendFactory,
        load_workers: Callable[[], list[CatalogWorker]],
        poll_seconds: float = 5.0,
        instructions: str = INSTRUCTIONS,
        reads_local_folders: bool = False,
    ) -> None:
        self.reads_local_folders = reads_local_folders
        self._bus = InMemorySubscriptionBus()
        # Handshake-era clients hear of list changes on their connection, not on the bus.
        self._legacy_sessions: OrderedDict[str, ServerSession] = OrderedDict()
        self._poll_seconds = poll_seconds
        self.backend_for = backend_for
        self.catalog = Catalog(load_workers)
        super().__init__(
            "floom",
            title="floom",
            version=__version__,
            instructions=instructions,
            log_level="WARNING",
            subscriptions=self._bus,
            middleware=[
                self._remember_legacy_session,
                self._scoped_tool_list,
                self._instructions_by_scope,
            ],
            lifespan=_poll_catalog,
        )
        self._advertise_list_changes()
        for tool in tools.TOOLS:
            self.add_tool(
                tool.fn,
                description=inspect.cleandoc(tool.fn.__doc__ or ""),
                annotations=tool.annotations,
                structured_output=False,
            )
        self.resource(MANIFEST_URI, name="manifest", mime_type="application/yaml")(_read_manifest)
        self.resource(LOGS_URI, name="run logs", mime_type="text/plain")(_read_logs)
        self.resource(
            ARTIFACT_URI,
            name="run artifact",
            description="a file a run left: text up to 64 KiB as itself; a binary or larger "
            "file as a link (application/vnd.floom.artifact-link+json: type, size, URL)",
        )(_read_artifact)

    def _advertise_list_changes(self) -> None:
        # Handshake-era clients only listen for list changes that the initialize result
        # advertises, and MCPServer offers no setting for it; modern clients use the bus.
        lowlevel = self._lowlevel_server
        default = lowlevel.create_initialization_options
        options = NotificationOptions(tools_changed=True, resources_changed=True)

        def with_list_changes(notification_options: Any = None, **kwargs: Any) -> Any:
            return default(notification_options or options, **kwargs)

        setattr(lowlevel, "create_initialization_options", with_list_changes)  # noqa: B010

    async def _remember_legacy_session(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            headers = getattr(ctx.request, "headers", None)
            # stdio has one connection; over HTTP the session id names it (none yet while
            # initializing, and the requests after that carry it).
            key = "stdio" if headers is None else headers.get("mcp-session-id", "")
            if key:
                self._legacy_sessions[key] = ctx.session
                self._legacy_sessions.move_to_end(key)
                while len(self._legacy_sessions) > MAX_LEGACY_SESSIONS:
                    self._legacy_sessions.popitem(last=False)
        return await call_next(ctx)

    async def _scoped_tool_list(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """A key sees in tools/list only the tools its scope allows (each tool declares its
        scope in floom.mcp.tools.core); calling another still answers forbidden, naming the
        scope."""
        result = await call_next(ctx)
        if ctx.method != "tools/list" or not isinstance(result, dict):
            return result  # the chain hands results on as wire dicts
        caller = self._caller(Context(request_context=ctx, mcp_server=self))
        if caller is None:
            return result
        listed = result.get("tools") or []
        allowed = [t for t in listed if caller.can(tools.scope_of(str(t.get("name"))))]
        return {**result, "tools": allowed}

    async def _instructions_by_scope(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """The instructions recommend a key only the tools it may call."""
        result = await call_next(ctx)
        if ctx.method not in ("initialize", "server/discover") or not isinstance(result, dict):
            return result
        said = result.get("instructions")
        if not isinstance(said, str) or INSTRUCTIONS not in said:
            return result
        caller = await anyio.to_thread.run_sync(
            self._caller, Context(request_context=ctx, mcp_server=self)
        )
        if caller is None:
            return result
        scoped = scoped_instructions(lambda tool: caller.can(tools.scope_of(tool)))
        return {**result, "instructions": said.replace(INSTRUCTIONS, scoped)}

    def _caller(self, ctx: Context[Any, Any]) -> Principal | None:
        try:
            return self.backend_for(ctx).caller()
        except FloomError:
            return None  # no key: the HTTP guard has refused such requests already

    async def refresh_catalog(self) -> None:
        """Reload the worker catalog; tell every listening client when it changed."""
        if not await self.catalog.refresh():
            return
        await self._bus.publish(ToolsListChanged())
        await self._bus.publish(ResourcesListChanged())
        for key, session in list(self._legacy_sessions.items()):
            try:
                await session.send_tool_list_changed()
                await session.send_resource_list_changed()
            except Exception:  # fan-out boundary: a closed session must not stop the others
                self._legacy_sessions.pop(key, None)

    # -- the dynamic part of the lists ---------------------------------------------------------

    async def list_tools(self) -> list[MCPTool]:
        await self.refresh_catalog()
        fixed = await super().list_tools()
        if not self.reads_local_folders:
            fixed = [_without(t, tools.LOCAL_ARGUMENTS.get(t.name, ())) for t in fixed]
        exposed = [
            MCPTool(
                name=w.name,
                title=w.title,
                description=w.description,
                input_schema=w.input_schema,
                annotations=RUNS,
            )
            for w in self.catalog.snapshot.exposed
            if w.name not in tools.TOOL_NAMES
        ]
        return fixed + exposed

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        worker = None
        if name not in tools.TOOL_NAMES:
            worker = self.catalog.exposed(name)
            if worker is None:
                await self.refresh_catalog()
                worker = self.catalog.exposed(name)
            if worker is None or context is None:
                return tool_error(unknown_tool(name))
        caller = self._caller(context) if context is not None else None
        if caller is None:
            return await self._call(name, arguments, context, worker)
        # A hint naming a tool this caller's key may not call says which scope it needs.
        with scoped_hints(lambda tool: _scope_lacked(caller, tool)):
            # Refused before the arguments are read, as REST refuses before reading a body.
            try:
                caller.require(tools.scope_of(name))
            except FloomError as exc:
                return tool_error(exc)
            return await self._call(name, arguments, context, worker)

    async def _call(
        self,
        name: str,
        arguments: dict[str, Any],
        context: Context[Any, Any] | None,
        worker: ExposedWorker | None,
    ) -> CallToolResult | InputRequiredResult:
        if worker is not None and context is not None:
            return await tools.run_exposed(context, worker, dict(arguments))
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            # Tool bodies return their own errors; what reaches here is the SDK refusing the
            # arguments before the body ran.
            return tool_error(bad_arguments(name, exc))

    async def read_resource(
        self, uri: AnyUrl | str, context: Context[Any, Any] | None = None
    ) -> Iterable[ReadResourceContents] | InputRequiredResult:
        # An artifact answers with its own media type (or the link's), which a template's
        # fixed mime_type cannot say; the template above lists it.
        found = ARTIFACT.match(str(uri)) if context is not None else None
        if found is None or context is None:
            return await super().read_resource(uri, context)
        return [await _artifact(str(found["run_id"]), str(found["name"]), context)]

    async def list_resources(self) -> list[MCPResource]:
        await self.refresh_catalog()
        fixed = await super().list_resources()
        return fixed + [
            MCPResource(
                uri=MANIFEST_URI.format(name=name),
                name=f"{name} manifest",
                description=f"worker.yml of the active version of {name}",
                mime_type="application/yaml",
            )
            for name in self.catalog.snapshot.workers
        ]


def _scope_lacked(caller: Principal, tool: str) -> str | None:
    """The scope `tool` needs when `caller` lacks it; None for a tool it may call, or a name
    that is no tool."""
    if tool not in tools.TOOL_NAMES:
        return None
    scope = tools.scope_of(tool)
    return None if caller.can(scope) else scope


def _without(tool: MCPTool, arguments: tuple[str, ...]) -> MCPTool:
    """The tool as listed without `arguments` (a body still refuses them with a hint)."""
    if not arguments:
        return tool
    schema = dict(tool.input_schema)
    schema["properties"] = {
        k: v for k, v in (schema.get("properties") or {}).items() if k not in arguments
    }
    if "required" in schema:
        schema["required"] = [k for k in schema["required"] if k not in arguments]
    return tool.model_copy(update={"input_schema": schema})


@asynccontextmanager
async def _poll_catalog(server: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
    assert isinstance(server, FloomMCPServer)
    floom = server

    async def poll() -> None:
        while True:
            await anyio.sleep(floom._poll_seconds)
            try:
                await floom.refresh_catalog()
            except Exception:  # a background loop: log and keep polling
                log.exception("refreshing the MCP worker catalog failed")

    async with anyio.create_task_group() as tg:
        tg.start_soon(poll)
        try:
            yield {}
        finally:
            tg.cancel_scope.cancel()


async def _read_manifest(name: str, ctx: Context) -> str:
    try:
        return await off(backend_of(ctx).get_manifest_yaml, name)
    except Exception as exc:  # the boundary of a resource read: errors become resource errors
        raise resource_error(exc) from exc


async def _read_logs(run_id: str, ctx: Context) -> str:
    try:
        backend = backend_of(ctx)
        events: list[RunEventPublic] = []
        after = 0
        # Pages until the end, bounded so a runaway log cannot exhaust the client.
        for _ in range(20):
            page = await off(backend.get_logs, run_id, after=after, limit=1000)
            events.extend(page.items)
            if not page.items or page.complete:
                break
            after = page.last_seq
    except Exception as exc:  # the boundary of a resource read: errors become resource errors
        raise resource_error(exc) from exc
    return "\n".join(f"{e.ts.isoformat()} {e.stream}: {e.line}" for e in events) + "\n"


async def _artifact(run_id: str, name: str, ctx: Context) -> ReadResourceContents:
    try:
        return await artifact_contents(ctx, run_id, name)
    except Exception as exc:  # the boundary of a resource read: errors become resource errors
        raise resource_error(exc) from exc


async def _read_artifact(run_id: str, name: str, ctx: Context) -> str | bytes:
    return (await _artifact(run_id, name, ctx)).content
