"""worker.yml: the manifest schema and the public ways to validate, load and describe it; the
checks themselves live in manifest_checks (the document) and fields (run values)."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from floom.errors import (
    InputInvalid,
    InvalidRequest,
    ManifestTooLarge,
    RuntimeMissing,
    quoted,
)
from floom.hints import Told
from floom.hints import cli as cli_hints
from floom.manifest.fields import (
    check_value,
    enum_error,
    enum_hint,
    kind_of,
    parse_text,
    show,
    suggest,
)
from floom.sandbox.local.network import parse_allowed_network
from floom.vocabulary import TriggerKind

ENTRY_CANDIDATES: tuple[str, ...] = ("run.py", "run.sh", "run.js", "run.ts", "SKILL.md")
FieldType = Literal["string", "integer", "number", "boolean", "object", "array", "file"]
FIELD_TYPES: tuple[str, ...] = get_args(FieldType)
TYPESCRIPT_RUNNERS: tuple[str, ...] = ("tsx", "ts-node", "deno", "bun")
TRIGGER_KINDS: tuple[TriggerKind, ...] = tuple(TriggerKind)
TOOL_SOURCES: tuple[str, ...] = ("builtin", "mcp", "composio")
EXPOSE_TARGETS: tuple[str, ...] = ("mcp", "ui", "rest")
NAME_PATTERN = r"^[a-z][a-z0-9-]{0,62}$"
FIELD_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
SECRET_NAME_PATTERN = r"^[A-Z_][A-Z0-9_]*$"
# Names that change how programs load or run (FLOOM_* among them) are refused besides:
# floom/sandbox/env_names.py.

INTERPRETERS = {".py": ["python3"], ".sh": ["bash"], ".js": ["node"]}
_TS_COMMANDS = {
    "tsx": ["tsx"],
    "ts-node": ["ts-node"],
    "deno": ["deno", "run", "-A"],
    "bun": ["bun", "run"],
}

# Parser limits for worker.yml, checked before the document is built (manifest_checks):
# a manifest is a page of settings, and these leave room for ten times any real one.
MAX_MANIFEST_BYTES = 256 * 1024
MAX_MANIFEST_DEPTH = 32
MAX_MANIFEST_NODES = 10_000
# An agent's SKILL.md is its system prompt: read whole at every run and sent to the model
# with every turn, so it is bounded on its own, not only by the bundle's size.
MAX_SKILL_BYTES = 256 * 1024

MAX_NETWORK_ALLOW = 32
NETWORK_ALLOW_WITHOUT_NETWORK = "network_allow needs network: full; without it there is no network"

SlugStr = Annotated[str, Field(pattern=NAME_PATTERN)]
SecretName = Annotated[str, Field(pattern=SECRET_NAME_PATTERN)]


def nesting_depth(value: Any, *, limit: int) -> int:
    """How many lists and mappings deep `value` nests (a scalar is 0, `[1]` is 1).

    Stops looking once past `limit` and then answers `limit + 1`, so a hostile value costs
    no more than the part within the limit; it walks without recursion for the same reason.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Iterable[Any] = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        depth += 1
        if depth > limit:
            return limit + 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest


@dataclass(frozen=True)
class Problem:
    """One thing wrong, at a path into the document ("limits.timeout_seconds", "triggers[0]";
    "" is the whole document), with a hint on how to fix it."""

    path: str
    message: str
    # Text and actions (floom.hints): each surface that shows the problem renders them.
    hint: Told | None = None

    def to_dict(self) -> dict[str, Any]:
        """As an error's details carry it: the hint rendered where the error is answered."""
        return {"path": self.path, "message": self.message, "hint": self.hint}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FieldSpec(_Frozen):
    """One declared input or output. In worker.yml it may also be a bare type name.

    A null `default` means there is none; a null value given for a field counts as absent.
    """

    type: FieldType = "string"
    required: bool = False
    default: Any = None
    enum: list[Any] | None = None
    description: str = ""


class Limits(_Frozen):
    """What one run of a script worker may use; memory, processes, CPU and disk hold for
    its whole process tree (see docs/reference/resource-limits.md)."""

    timeout_seconds: int = Field(600, ge=1, le=86400)
    memory_mb: int = Field(
        512, ge=16, le=65536, description="MiB for the whole run, tmpfs and shared memory included"
    )
    processes: int = Field(
        256, ge=8, le=65536, description="processes and threads the run may have at once"
    )
    cpu: float = Field(1.0, ge=0.05, le=256, description="CPU time in cores, e.g. 0.5 or 2")
    disk_mb: int = Field(
        1024, ge=1, le=1048576, description="MiB the run may write to its work and output dirs"
    )
    max_tool_iterations: int | None = Field(None, gt=0)
    max_total_tokens: int | None = Field(None, gt=0)
    monthly_cost_usd: float | None = Field(None, gt=0)


class Retries(_Frozen):
    """How a failed run is retried. In worker.yml a bare integer means `count`."""

    count: int = Field(0, ge=0, le=20)
    backoff_seconds: float = Field(5, ge=0)
    backoff: Literal["fixed", "exponential"] = "exponential"


class Approvals(_Frozen):
    required: bool = False


# The largest state.max_bytes worker.yml may write; the node's FLOOM_MAX_STATE_BYTES is the
# ceiling a deploy is held to (services/workers/limit_ceilings.py).
MAX_STATE_BYTES = 16 * 1024 * 1024


class StateSpec(_Frozen):
    """What a worker keeps between runs (README, "Worker state"). In worker.yml `state: true`
    means `{enabled: true}`; a mapping without `enabled` is enabled."""

    enabled: bool = True
    on_conflict: Literal["fail", "retry"] = Field(
        "fail",
        description="when another run wrote the state first: fail the run (state_conflict) "
        "or run it again from the newer state",
    )
    max_bytes: int | None = Field(
        None,
        ge=2,
        le=MAX_STATE_BYTES,
        description="largest state as JSON; default and ceiling: the server's "
        "FLOOM_MAX_STATE_BYTES",
    )


class SandboxChoice(_Frozen):
    """Where the worker's scripts (and an agent's run_command) run; unset: the server's
    default backend (FLOOM_SANDBOX) and, on E2B, its default template (FLOOM_E2B_TEMPLATE)."""

    backend: Literal["local", "e2b"] | None = Field(
        None, description="a sandbox backend the server has configured: local or e2b"
    )
    template: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
        description="the E2B template (name or id) to start from, e.g. python-data",
    )


class Manifest(_Frozen):
    """A worker's validated worker.yml. Build it with `parse_manifest` or `load_folder`
    (floom/manifest/load.py), which check everything and resolve `entry`; `model_validate` alone
    checks only the shape."""

    name: SlugStr = Field(description="worker name: a lowercase slug, e.g. my-worker")
    title: str = Field("", description="display name; defaults to name")
    description: str = ""
    entry: str = Field(description=f"entry file; detected when absent: one of {ENTRY_CANDIDATES}")
    inputs: dict[str, FieldSpec] = Field(default_factory=dict)
    outputs: dict[str, FieldSpec] = Field(default_factory=dict)
    secrets: list[SecretName] = Field(default_factory=list)
    apply_secrets: list[SecretName] = Field(
        default_factory=list,
        description="secrets given only to the apply phase, after a person approved the outputs",
    )
    network: Literal["none", "full"] = "none"
    network_allow: list[str] = Field(
        default_factory=list,
        max_length=MAX_NETWORK_ALLOW,
        description="with network: full, private IPv4 networks (CIDR) the worker may reach too",
    )
    limits: Limits = Field(default_factory=Limits)
    sandbox: SandboxChoice = Field(default_factory=SandboxChoice)
    retries: Retries = Field(default_factory=Retries)
    concurrency: int | None = Field(None, ge=1, description="most runs at once; none: unlimited")
    warm: bool = Field(
        False,
        description="start runs of a run.py worker from a warm, pre-initialised interpreter "
        "(README: Warm starts)",
    )
    retention_days: int | None = Field(
        None,
        ge=0,
        le=36500,
        description="days a finished run's logs and artifacts are kept (0: forever); "
        "default: the server's FLOOM_RETENTION_DAYS",
    )
    triggers: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    calls: list[SlugStr] = Field(default_factory=list)
    approvals: dict[str, Any] = Field(default_factory=dict)
    model: str | None = None
    expose: list[str] = Field(
        default_factory=list,
        description="the surfaces that may start the worker (ui, rest, mcp; all when left out); "
        "mcp also makes it an MCP tool of its own. Triggers start it whatever this says",
    )
    replay: dict[str, Any] = Field(
        default_factory=dict,
        description="replays and evals: live_tools, compare (per output), gate (on deploy)",
    )
    alerts: list[dict[str, Any]] = Field(
        default_factory=list,
        description="alert rules of this worker: which events (run.failed, schedule.missed, ...) "
        "go to which alert channels, e.g. [{events: [run.failed], channels: [ops]}]",
    )
    state: StateSpec = Field(
        default_factory=lambda: StateSpec(enabled=False),
        description="state kept between runs: true, or {on_conflict: fail|retry, max_bytes}",
    )

    @model_validator(mode="before")
    @classmethod
    def _bounded_depth(cls, data: Any) -> Any:
        # A manifest's defaults, enums and trigger settings ride along in every listing, MCP
        # tool and form; however the manifest was built, they stay within the YAML limit.
        if nesting_depth(data, limit=MAX_MANIFEST_DEPTH) > MAX_MANIFEST_DEPTH:
            raise ValueError(f"the manifest nests deeper than {MAX_MANIFEST_DEPTH} levels")
        return data

    @model_validator(mode="before")
    @classmethod
    def _state_shorthand(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(data.get("state"), bool):
            return {**data, "state": {"enabled": data["state"]}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _title_defaults_to_name(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and not data.get("title") and "name" in data:
            return {**data, "title": data.get("name")}
        return data

    @model_validator(mode="after")
    def _network_allow_needs_network(self) -> Manifest:
        for entry in self.network_allow:
            parse_allowed_network(entry)
        if self.network_allow and self.network != "full":
            raise PydanticCustomError("network_allow", NETWORK_ALLOW_WITHOUT_NETWORK)
        return self

    @model_validator(mode="after")
    def _warm_needs_python(self) -> Manifest:
        if self.warm and PurePosixPath(self.entry).suffix != ".py":
            raise PydanticCustomError(
                "warm", "warm: true needs a Python entry (run.py); remove it for other entries"
            )
        return self

    @property
    def kind(self) -> Literal["script", "agent"]:
        return "agent" if PurePosixPath(self.entry).name == "SKILL.md" else "script"

    def command(self) -> list[str]:
        """The command line that runs a script entry, relative to the worker folder."""
        if self.kind == "agent":
            raise InvalidRequest(
                f"worker '{self.name}' is an agent (SKILL.md) and has no command",
                hint="run it as an agent worker; only script entries have a command",
            )
        suffix = PurePosixPath(self.entry).suffix
        if suffix == ".ts":
            runner = typescript_runner()
            if runner is None:
                raise RuntimeMissing(
                    f"no TypeScript runner to run {self.entry}", hint=TYPESCRIPT_HINT
                )
            return [*_TS_COMMANDS[runner], self.entry]
        return [*INTERPRETERS[suffix], self.entry]

    def coerce_inputs(
        self, raw: Mapping[str, Any], *, from_strings: bool = False
    ) -> dict[str, Any]:
        """Check a run's inputs against the declared ones and return them with defaults filled.

        With `from_strings` the values came from a command line as text and are parsed by
        the declared type; otherwise they must already be JSON values of that type. Raises
        InputInvalid naming every bad field at once.
        """
        if not isinstance(raw, Mapping):
            raise InputInvalid(
                f"inputs must be a mapping of input name to value, got {kind_of(raw)}",
                hint=self._inputs_summary(),
            )
        problems: list[Problem] = []
        for name in raw:
            if name not in self.inputs:
                hint = suggest(str(name), self.inputs, noun="inputs")
                problems.append(
                    Problem(f"inputs.{quoted(str(name))}", "not a declared input", hint)
                )
        result: dict[str, Any] = {}
        for name, spec in self.inputs.items():
            value = raw.get(name)
            if value is None:
                if spec.default is not None:
                    result[name] = copy.deepcopy(spec.default)
                elif spec.required:
                    hint = f"pass {name} ({spec.type})"
                    problems.append(Problem(f"inputs.{name}", "required but missing", hint))
                continue
            if from_strings and isinstance(value, str):
                value, error = parse_text(spec.type, value)
            else:
                value, error = check_value(spec.type, value)
            error = error or enum_error(spec, value)
            if error:
                problems.append(Problem(f"inputs.{name}", error, enum_hint(spec)))
            else:
                result[name] = value
        if problems:
            named = [f"input '{p.path.removeprefix('inputs.')}': {p.message}" for p in problems]
            own_hint = problems[0].hint if len(problems) == 1 else None
            raise InputInvalid(
                "; ".join(named),
                hint=own_hint or self._inputs_summary(),
                details=[p.to_dict() for p in problems],
            )
        return result

    def check_outputs(self, outputs: Mapping[str, Any]) -> list[Problem]:
        """Problems with a run's outputs; undeclared ones are fine only when none are declared."""
        if not isinstance(outputs, Mapping):
            got = kind_of(outputs)
            return [Problem("outputs", f"must be a mapping of name to value, got {got}")]
        problems: list[Problem] = []
        if self.outputs:
            for name in outputs:
                if name not in self.outputs:
                    hint = suggest(str(name), self.outputs, noun="outputs")
                    problems.append(Problem(f"outputs.{name}", "undeclared output", hint))
        for name, spec in self.outputs.items():
            value = outputs.get(name)
            if value is None:
                if spec.required:
                    problems.append(Problem(f"outputs.{name}", "required output missing"))
                continue
            _, error = check_value(spec.type, value)
            error = error or enum_error(spec, value)
            if error:
                problems.append(Problem(f"outputs.{name}", error, enum_hint(spec)))
        return problems

    def _inputs_summary(self) -> str:
        if not self.inputs:
            return "this worker declares no inputs"
        parts = []
        for name, spec in self.inputs.items():
            extra = ", required" if spec.required else ""
            if spec.default is not None:
                extra = f", default {show(spec.default)}"
            parts.append(f"{name} ({spec.type}{extra})")
        return "declared inputs: " + ", ".join(parts)


TYPESCRIPT_HINT = "install one of these TypeScript runners: " + ", ".join(TYPESCRIPT_RUNNERS)


def typescript_runner() -> str | None:
    """The first TypeScript runner on PATH, in order of preference, or None."""
    return next((name for name in TYPESCRIPT_RUNNERS if shutil.which(name)), None)


# -- reporting -------------------------------------------------------------------------------


def format_problems(problems: Iterable[Problem]) -> str:
    """Human lines, one per problem: "  inputs.x.type: unknown type 'strng' (hint: ...)"."""
    lines = []
    for problem in problems:
        where = f"{problem.path}: " if problem.path else ""
        hint = f" (hint: {cli_hints.written(problem.hint)})" if problem.hint else ""
        lines.append(f"  {where}{problem.message}{hint}")
    return "\n".join(lines)


def manifest_too_large(*, limit: str, maximum: int, message: str, hint: str) -> ManifestTooLarge:
    """The refusal of a worker.yml over one of the parser limits, named in `details`."""
    detail = {"path": "", "message": message, "hint": hint, "limit": limit, "max": maximum}
    return ManifestTooLarge(message, hint=hint, details=[detail])


def manifest_json_schema() -> dict[str, Any]:
    """JSON Schema of worker.yml as written, including its shorthand forms."""
    schema = Manifest.model_json_schema()
    schema["title"] = "worker.yml"
    schema["required"] = ["name"]
    props = schema["properties"]
    field = {"anyOf": [{"$ref": "#/$defs/FieldSpec"}, {"enum": list(FIELD_TYPES)}]}
    for key in ("inputs", "outputs"):
        props[key]["additionalProperties"] = field
        props[key]["propertyNames"] = {"pattern": FIELD_NAME_PATTERN}
    props["retries"] = {
        "anyOf": [{"$ref": "#/$defs/Retries"}, {"type": "integer", "minimum": 0, "maximum": 20}]
    }
    props["approvals"] = {"$ref": "#/$defs/Approvals"}
    props["state"] = {"anyOf": [{"type": "boolean"}, {"$ref": "#/$defs/StateSpec"}]}
    props["state"].update(description=Manifest.model_fields["state"].description)
    schema["$defs"]["Approvals"] = Approvals.model_json_schema()
    props["expose"]["items"] = {"enum": list(EXPOSE_TARGETS)}
    props["expose"]["minItems"] = 1  # leave it out for every surface
    props["triggers"]["items"] = {
        "type": "object",
        "minProperties": 1,
        "maxProperties": 1,
        "propertyNames": {"enum": list(TRIGGER_KINDS)},
        "additionalProperties": {"type": ["object", "null"]},
    }
    props["tools"]["items"] = {
        "type": "object",
        "oneOf": [{"required": [source]} for source in TOOL_SOURCES],
    }
    return schema
