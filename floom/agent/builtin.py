"""The built-in tools an agent worker may be allowed: files, HTTP, commands in the sandbox,
other workers, memory, asking a person, and finishing."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from floom.agent import netguard
from floom.agent.children import invoke_child
from floom.agent.tools import Tool, ToolError, object_schema, require_str
from floom.engine.safefiles import (
    Bounds,
    Cancelled,
    Refused,
    open_regular,
    read_fd,
    said,
    walk,
    walk_below,
    write_regular,
)
from floom.errors import FloomError
from floom.manifest.agent import HTTP_METHODS, ToolSpec
from floom.net.egress import EgressPolicy, policy_of
from floom.sandbox.base import MAX_WALK_ENTRIES, SandboxUnavailable
from floom.services.runs import agent as agent_runs

if TYPE_CHECKING:
    from floom.engine.attempt import Attempt, AttemptHost
    from floom.engine.runlog import RunLog
    from floom.manifest.schema import Manifest
    from floom.services.access.secrets import Redactor
    from floom.services.context import Context
    from floom.store.models import Run

READ_CAP = 100 * 1024
LIST_CAP = 500
LIST_SECONDS = 10.0
COMMAND_OUTPUT_CAP = 16 * 1024
PLACEHOLDER = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")
_JSON_TYPES = {"file": "string"}


@dataclass
class AgentEnv:
    """What the tools of one agent attempt work with: the attempt (its work dir, redactor,
    log and sandbox runs) and the agent's own limits."""

    attempt: Attempt
    # Declared secrets (and, in the apply phase, apply_secrets): the environment of
    # run_command and the ${NAME} placeholders of http_request.
    secrets: dict[str, str]
    deadline: float
    apply: bool = False

    @property
    def ctx(self) -> Context:
        return self.attempt.ctx

    @property
    def host(self) -> AttemptHost:
        return self.attempt.host

    @property
    def run(self) -> Run:
        return self.attempt.run

    @property
    def manifest(self) -> Manifest:
        return self.attempt.manifest

    @property
    def workdir(self) -> Path:
        return self.attempt.workdir

    @property
    def output_dir(self) -> Path:
        return self.attempt.output_dir

    @property
    def redactor(self) -> Redactor:
        return self.attempt.redactor

    @property
    def run_log(self) -> RunLog:
        return self.attempt.run_log

    @property
    def sandbox_seconds(self) -> float:
        return self.attempt.sandbox_seconds

    @property
    def egress(self) -> EgressPolicy:
        """The egress guard's policy for every connection this agent's tools make."""
        return policy_of(self.ctx.settings)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def cancelled(self) -> bool:
        return self.attempt.cancelled()


def make_builtin(spec: ToolSpec, env: AgentEnv) -> Tool:
    factory = _FACTORIES[spec.builtin]
    description, schema, run = factory(spec, env)
    extra = str(spec.options.get("description") or "")
    return Tool(
        name=spec.name,
        description=f"{description} {extra}".strip(),
        input_schema=schema,
        run=run,
        gated=spec.gated or spec.builtin == "request_approval",
        builtin=spec.builtin,
    )


Factory = Callable[
    [ToolSpec, AgentEnv], tuple[str, dict[str, Any], Callable[[dict[str, Any]], str]]
]


# -- files ------------------------------------------------------------------------------------


def _resolve(
    env: AgentEnv, raw: str, *, output_only: bool = False
) -> tuple[Path, tuple[str, ...], str]:
    """The root (workspace or output/), the parts below it, and the path as the agent sees
    it. Nothing is resolved on the host: the collect functions open each part without
    following links, since a command the agent ran may have left any."""
    parts = PurePosixPath(raw.strip()).parts
    if parts and parts[0] == "/":
        parts = parts[1:]
    parts = tuple(p for p in parts if p != ".")
    if any(p == ".." for p in parts):
        raise ToolError(f"'{raw}' leaves the workspace; use paths inside it")
    if parts and parts[0] == "output":
        root, rel = env.output_dir, parts[1:]
    elif output_only:
        root, rel = env.output_dir, parts
    else:
        root, rel = env.workdir, parts
    shown = "/".join(("output", *rel)) if root == env.output_dir else "/".join(rel) or "."
    return root, rel, shown


def _bounds(env: AgentEnv, max_entries: int) -> Bounds:
    return Bounds(
        deadline=time.monotonic() + LIST_SECONDS,
        should_cancel=env.cancelled,
        max_entries=max_entries,
    )


def _read_file(spec: ToolSpec, env: AgentEnv) -> Any:
    def run(args: dict[str, Any]) -> str:
        root, rel, shown = _resolve(env, require_str(args, "path"))
        if not rel:
            raise ToolError(f"no file {shown}; list_files shows what exists")
        try:
            with open_regular(root, rel) as (fd, st):
                data = read_fd(fd, READ_CAP)
        except FileNotFoundError:
            raise ToolError(f"no file {shown}; list_files shows what exists") from None
        except Refused as exc:
            raise ToolError(f"{shown}: {exc.message}") from None
        except OSError as exc:
            raise ToolError(f"{shown} could not be read: {exc.strerror}") from None
        if b"\0" in data:  # no text has one, and the store's text columns refuse it
            return f"{shown} is a binary file ({st.st_size} bytes); read_file shows text only"
        text = data[:READ_CAP].decode("utf-8", errors="replace")
        if st.st_size > READ_CAP:
            text += f"\n[... {st.st_size - READ_CAP} more bytes not shown]"
        return text

    schema = object_schema({"path": {"type": "string"}}, ["path"])
    return (
        "Read a text file: the worker's files, or output/NAME for files you wrote.",
        schema,
        run,
    )


def _list_files(spec: ToolSpec, env: AgentEnv) -> Any:
    def run(args: dict[str, Any]) -> str:
        root, rel, shown = _resolve(env, str(args.get("path") or ""))
        if args.get("path"):
            roots = [(root, rel, "output/" if root == env.output_dir else "")]
        else:
            roots = [(env.workdir, (), ""), (env.output_dir, (), "output/")]
        lines: list[str] = []
        for top, below, prefix in roots:
            start = top.joinpath(*below)
            try:
                found = walk_below(top, below, _bounds(env, LIST_CAP * 4))
            except Cancelled:
                raise ToolError("cancelled") from None
            except FileNotFoundError:
                raise ToolError(f"no directory {shown}") from None
            except (Refused, NotADirectoryError):
                raise ToolError(f"no directory {shown}") from None
            base = "/".join(below)
            for name, size in found.files:
                full = f"{base}/{name}" if base else name
                # A name of invalid UTF-8 or with a newline, said so that the list stays one
                # name a line and can be sent to the model.
                lines.append(f"{prefix}{said(full)} ({size} bytes)")
                if len(lines) >= LIST_CAP:
                    return "\n".join([*lines, f"[more than {LIST_CAP} files; list a folder]"])
            if not found.complete:
                lines.append(f"[{start.name or '.'}: {'; '.join(found.notes[-1:])}]")
        return "\n".join(lines) or "(no files)"

    schema = object_schema({"path": {"type": "string", "description": "a folder; default all"}})
    return "List files of the workspace and of output/ (what you wrote).", schema, run


def _write_file(spec: ToolSpec, env: AgentEnv) -> Any:
    def run(args: dict[str, Any]) -> str:
        root, rel, shown = _resolve(env, require_str(args, "path"), output_only=True)
        if not rel:
            raise ToolError("'path' must name a file under output/")
        content = args.get("content")
        if not isinstance(content, str):
            raise ToolError("'content' must be a string")
        data = content.encode()
        try:
            found = walk(env.output_dir, _bounds(env, MAX_WALK_ENTRIES))
        except Cancelled:
            raise ToolError("cancelled") from None
        used = sum(size for _, size in found.files)
        limit = env.ctx.settings.max_artifact_bytes
        if used + len(data) > limit:
            raise ToolError(f"output/ would pass {limit} bytes (FLOOM_MAX_ARTIFACT_BYTES)")
        try:
            write_regular(root, rel, data)
        except Refused as exc:
            raise ToolError(f"{shown}: {exc.message}") from None
        except OSError as exc:
            raise ToolError(f"{shown} could not be written: {exc.strerror}") from None
        return f"saved {shown} ({len(data)} bytes); it becomes an artifact of the run"

    schema = object_schema(
        {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]
    )
    return "Save a file under output/; every file there becomes an artifact.", schema, run


# -- network and commands ---------------------------------------------------------------------


def fill_placeholders(text: str, secrets: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in secrets:
            raise ToolError(
                f"no secret {name} is available to this worker (declare it in secrets:)"
            )
        return secrets[name]

    return PLACEHOLDER.sub(value, text)


def _http_request(spec: ToolSpec, env: AgentEnv) -> Any:
    methods = spec.options.get("methods")
    policy = netguard.HttpPolicy(
        allow_domains=tuple(str(d) for d in spec.options.get("allow_domains") or ()),
        methods=tuple(str(m).upper() for m in methods) if methods else None,
        egress=env.egress,
    )

    def run(args: dict[str, Any]) -> str:
        url = require_str(args, "url")
        headers = args.get("headers") or {}
        if not isinstance(headers, dict):
            raise ToolError("'headers' must be an object of header names to strings")
        filled = {str(k): fill_placeholders(str(v), env.secrets) for k, v in headers.items()}
        # The parts a secret was filled into go to the first origin only (netguard.request).
        secret_headers = frozenset(
            str(k).lower() for k, v in headers.items() if PLACEHOLDER.search(str(v))
        )
        content: bytes | None = None
        text: str | None = None
        if args.get("json") is not None:
            text = json.dumps(args["json"])
            filled.setdefault("Content-Type", "application/json")
        elif args.get("body") is not None:
            text = str(args["body"])
        if text is not None:
            content = fill_placeholders(text, env.secrets).encode()
        reply = netguard.request(
            method=str(args.get("method") or "GET"),
            url=url,
            headers=filled,
            content=content,
            policy=policy,
            timeout=max(1.0, min(60.0, env.remaining())),
            secret_headers=secret_headers,
            secret_body=text is not None and PLACEHOLDER.search(text) is not None,
        )
        body: dict[str, Any] = {"status": reply.status, "headers": reply.headers}
        body["body"] = reply.body
        if reply.truncated:
            body["truncated"] = True
        return json.dumps(body)

    allowed = ", ".join(policy.allow_domains)
    schema = object_schema(
        {
            "method": {"type": "string", "enum": list(policy.methods or HTTP_METHODS)},
            "url": {"type": "string"},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "body": {"type": "string"},
            "json": {"description": "a JSON body (sets Content-Type)"},
        },
        ["url"],
    )
    secrets = ", ".join(sorted(env.secrets)) or "none"
    text = (
        f"Send an HTTP request to {allowed}. Write ${{NAME}} in headers or body where a "
        f"secret is needed (available: {secrets}); floom fills it in."
    )
    return text, schema, run


def _run_command(spec: ToolSpec, env: AgentEnv) -> Any:
    manifest = env.manifest

    def run(args: dict[str, Any]) -> str:
        command = require_str(args, "command")
        try:
            wanted = float(args.get("timeout_seconds") or manifest.limits.timeout_seconds)
        except (TypeError, ValueError, OverflowError):
            wanted = math.nan
        if math.isnan(wanted):
            raise ToolError("'timeout_seconds' must be a number of seconds, or left out")
        timeout = max(1.0, min(wanted, env.remaining()))
        lines: list[str] = []
        size = 0

        def on_line(stream: str, line: str) -> None:
            nonlocal size
            env.run_log.add(stream, line)
            line = env.run_log.clean(line)  # as stored: a secret cut by the sandbox is masked
            lines.append(line)
            size += len(line) + 1
            while size > COMMAND_OUTPUT_CAP and len(lines) > 1:
                size -= len(lines.pop(0)) + 1

        sandbox_spec = env.attempt.spec(
            secrets=env.secrets, command=["bash", "-c", command], timeout_seconds=timeout
        )
        try:
            result = env.attempt.run_sandbox(sandbox_spec, on_line=on_line)
        except SandboxUnavailable as exc:
            hint = f"; {exc.hint}" if exc.hint else ""
            raise ToolError(f"the sandbox is unavailable: {exc.message}{hint}") from exc
        output = env.redactor.text("\n".join(lines))
        if result.timed_out:
            raise ToolError(f"timed out after {timeout:.0f}s; output so far:\n{output}")
        if result.cancelled:
            raise ToolError("cancelled")
        if result.error:
            raise ToolError(result.error)
        return f"exit code {result.exit_code}\n{output}"

    schema = object_schema(
        {"command": {"type": "string"}, "timeout_seconds": {"type": "integer", "minimum": 1}},
        ["command"],
    )
    text = (
        "Run a bash command in the worker's sandbox, in the workspace (the worker's files); "
        "files in the workspace persist between commands; files written to "
        "$FLOOM_OUTPUT_DIR become artifacts. Returns exit code and output."
    )
    return text, schema, run


# -- other workers and memory -----------------------------------------------------------------


def _invoke_worker(spec: ToolSpec, env: AgentEnv) -> Any:
    def run(args: dict[str, Any]) -> str:
        worker = require_str(args, "worker")
        inputs = args.get("inputs") or {}
        if not isinstance(inputs, dict):
            raise ToolError("'inputs' must be an object")
        return json.dumps(invoke_child(env, worker=worker, inputs=inputs), default=str)

    calls = ", ".join(env.manifest.calls) or "none"
    worker: dict[str, Any] = {"type": "string"}
    if env.manifest.calls:
        worker["enum"] = list(env.manifest.calls)
    schema = object_schema({"worker": worker, "inputs": {"type": "object"}}, ["worker"])
    return (
        f"Run another floom worker and wait for its outputs. Workers you may call: {calls}.",
        schema,
        run,
    )


def _remember(spec: ToolSpec, env: AgentEnv) -> Any:
    def run(args: dict[str, Any]) -> str:
        key = require_str(args, "key")
        if len(key) > 200:
            raise ToolError("'key' is longer than 200 characters")
        value = env.redactor.value(args.get("value"))
        if len(json.dumps(value)) > agent_runs.MEMORY_VALUE_CAP:
            raise ToolError(f"the value is over {agent_runs.MEMORY_VALUE_CAP} bytes as JSON")
        try:
            agent_runs.remember(
                env.ctx,
                worker_name=env.run.worker_name,
                key=key,
                value=value,
                run_id=env.run.id,
                lease_epoch=env.run.lease_epoch,
            )
        except FloomError as exc:  # the run is being stopped, or its attempt fenced
            raise ToolError(exc.message) from exc
        return f"remembered {key}"

    schema = object_schema({"key": {"type": "string"}, "value": {}}, ["key", "value"])
    return (
        "Store a value under a key in this worker's memory; later runs can recall it.",
        schema,
        run,
    )


def _recall(spec: ToolSpec, env: AgentEnv) -> Any:
    def run(args: dict[str, Any]) -> str:
        key = args.get("key")
        if not key:
            keys = _memory(agent_runs.memory_keys, env)
            return json.dumps({"keys": keys})
        value, run_id = _memory(agent_runs.recall, env, key=str(key))
        if run_id is None:
            return json.dumps({"key": key, "found": False})
        return json.dumps({"key": key, "found": True, "value": value, "written_by_run": run_id})

    schema = object_schema({"key": {"type": "string", "description": "omit to list the keys"}})
    return "Read a value from this worker's memory (or list its keys).", schema, run


def _memory(read: Callable[..., Any], env: AgentEnv, **args: Any) -> Any:
    """A read of the worker's memory for this run; refused (a ToolError) once it is asked to
    stop or its attempt lost its lease (agent_runs._check_memory_user)."""
    try:
        return read(
            env.ctx,
            worker_name=env.run.worker_name,
            run_id=env.run.id,
            lease_epoch=env.run.lease_epoch,
            **args,
        )
    except FloomError as exc:
        raise ToolError(exc.message) from exc


# -- people and the end -----------------------------------------------------------------------


def _request_approval(spec: ToolSpec, env: AgentEnv) -> Any:
    def run(args: dict[str, Any]) -> str:
        raise FloomError("request_approval is answered by the approval, not run")

    schema = object_schema(
        {"question": {"type": "string"}, "details": {"type": "object"}}, ["question"]
    )
    return (
        "Ask a person to approve something before you go on; the run waits for the "
        "decision, which comes back with their comment.",
        schema,
        run,
    )


def finish_schema(manifest: Manifest) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for name, field in manifest.outputs.items():
        prop: dict[str, Any] = {"type": _JSON_TYPES.get(field.type, field.type)}
        if field.description:
            prop["description"] = field.description
        if field.enum:
            prop["enum"] = field.enum
        props[name] = prop
    required = [n for n, f in manifest.outputs.items() if f.required]
    outputs = object_schema(props, required)
    top: dict[str, Any] = {"outputs": outputs}
    if manifest.state.enabled:
        top["state"] = {
            "description": "the worker's new state for its next run (any JSON value); "
            "leave it out to keep the state as it is"
        }
    return object_schema(top, ["outputs"])


def state_tool(env: AgentEnv) -> Tool:
    """read_state, given to an agent whose worker.yml has `state:`."""

    def run(args: dict[str, Any]) -> str:
        base = env.attempt.state.base if env.attempt.state else 0
        return f'{{"version": {base}, "state": {env.attempt.state_read}}}'

    return Tool(
        name="read_state",
        description="Read the state this worker's last successful run left (null before the "
        "first); end the run with finish(state=...) to leave a new one.",
        input_schema=object_schema({}),
        run=run,
        builtin="read_state",
    )


def finish_tool(manifest: Manifest) -> Tool:
    def run(args: dict[str, Any]) -> str:
        raise FloomError("finish is handled by the agent loop")

    return Tool(
        name="finish",
        description="End the run with its outputs; they are checked against the worker's "
        "declared outputs and any problem comes back to you to fix.",
        input_schema=finish_schema(manifest),
        run=run,
        builtin="finish",
    )


_FACTORIES: dict[str, Factory] = {
    "read_file": _read_file,
    "list_files": _list_files,
    "write_file": _write_file,
    "http_request": _http_request,
    "run_command": _run_command,
    "invoke_worker": _invoke_worker,
    "remember": _remember,
    "recall": _recall,
    "request_approval": _request_approval,
}
