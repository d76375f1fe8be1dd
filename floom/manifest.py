"""worker.yml: the manifest schema, its validation into friendly problems, and the checks of a
run's inputs and outputs against the fields it declares."""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
import re
import shutil
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from floom.errors import FloomError, InputInvalid, ManifestInvalid

ENTRY_CANDIDATES: tuple[str, ...] = ("run.py", "run.sh", "run.js", "run.ts", "SKILL.md")
FieldType = Literal["string", "integer", "number", "boolean", "object", "array", "file"]
FIELD_TYPES: tuple[str, ...] = get_args(FieldType)
TYPESCRIPT_RUNNERS: tuple[str, ...] = ("tsx", "ts-node", "deno", "bun")
TRIGGER_KINDS: tuple[str, ...] = ("schedule", "webhook", "composio", "handoff")
TOOL_SOURCES: tuple[str, ...] = ("builtin", "mcp", "composio")
EXPOSE_TARGETS: tuple[str, ...] = ("mcp", "ui", "rest")
SKIPPED_DIRS = frozenset({".git", "__pycache__", ".venv", "node_modules"})

NAME_PATTERN = r"^[a-z][a-z0-9-]{0,62}$"
FIELD_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
SECRET_NAME_PATTERN = r"^[A-Z_][A-Z0-9_]*$"
# The sandbox sets FLOOM_RUN_ID and friends; a secret of that name would shadow them.
RESERVED_SECRET_PREFIX = "FLOOM_"

_INTERPRETERS = {".py": ["python3"], ".sh": ["bash"], ".js": ["node"]}
_TS_COMMANDS = {
    "tsx": ["tsx"],
    "ts-node": ["ts-node"],
    "deno": ["deno", "run", "-A"],
    "bun": ["bun", "run"],
}
# Names people reach for from other languages; difflib alone misses most of them.
_TYPE_ALIASES = {
    "str": "string",
    "text": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "dict": "object",
    "list": "array",
    "path": "file",
}
_TRUE_WORDS = frozenset({"true", "yes", "1"})
_FALSE_WORDS = frozenset({"false", "no", "0"})
_NAME_HINT = 'use lowercase letters, digits and dashes, starting with a letter, e.g. "my-worker"'
_BAD = object()  # returned by the checkers below for a value that produced a problem

SlugStr = Annotated[str, Field(pattern=NAME_PATTERN)]
SecretName = Annotated[str, Field(pattern=SECRET_NAME_PATTERN)]


@dataclass(frozen=True)
class Problem:
    """One thing wrong, at a path into the document ("limits.timeout_seconds", "triggers[0]";
    "" is the whole document), with a hint on how to fix it."""

    path: str
    message: str
    hint: str | None = None

    def to_dict(self) -> dict[str, Any]:
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
    timeout_seconds: int = Field(600, ge=1, le=86400)
    memory_mb: int = Field(512, ge=16, le=65536)
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


class Manifest(_Frozen):
    """A worker's validated worker.yml. Build it with `parse_manifest` or `load_folder`, which
    check everything and resolve `entry`; `model_validate` alone checks only the shape."""

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
    limits: Limits = Field(default_factory=Limits)
    retries: Retries = Field(default_factory=Retries)
    concurrency: int | None = Field(None, ge=1, description="most runs at once; none: unlimited")
    triggers: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    calls: list[SlugStr] = Field(default_factory=list)
    approvals: dict[str, Any] = Field(default_factory=dict)
    model: str | None = None
    expose: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _title_defaults_to_name(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and not data.get("title") and "name" in data:
            return {**data, "title": data.get("name")}
        return data

    @property
    def kind(self) -> Literal["script", "agent"]:
        return "agent" if PurePosixPath(self.entry).name == "SKILL.md" else "script"

    def command(self) -> list[str]:
        """The command line that runs a script entry, relative to the worker folder."""
        if self.kind == "agent":
            raise FloomError(f"worker '{self.name}' is an agent (SKILL.md) and has no command")
        suffix = PurePosixPath(self.entry).suffix
        if suffix == ".ts":
            runner = typescript_runner()
            if runner is None:
                raise FloomError(f"no TypeScript runner to run {self.entry}", hint=_TS_HINT)
            return [*_TS_COMMANDS[runner], self.entry]
        return [*_INTERPRETERS[suffix], self.entry]

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
                f"inputs must be a mapping of input name to value, got {_kind_of(raw)}",
                hint=self._inputs_summary(),
            )
        problems: list[Problem] = []
        for name in raw:
            if name not in self.inputs:
                hint = _suggest(str(name), self.inputs, noun="inputs")
                problems.append(Problem(f"inputs.{name}", "not a declared input", hint))
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
                value, error = _parse_text(spec.type, value)
            else:
                value, error = _check_value(spec.type, value)
            error = error or _enum_error(spec, value)
            if error:
                problems.append(Problem(f"inputs.{name}", error, _enum_hint(spec)))
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
            got = _kind_of(outputs)
            return [Problem("outputs", f"must be a mapping of name to value, got {got}")]
        problems: list[Problem] = []
        if self.outputs:
            for name in outputs:
                if name not in self.outputs:
                    hint = _suggest(str(name), self.outputs, noun="outputs")
                    problems.append(Problem(f"outputs.{name}", "undeclared output", hint))
        for name, spec in self.outputs.items():
            value = outputs.get(name)
            if value is None:
                if spec.required:
                    problems.append(Problem(f"outputs.{name}", "required output missing"))
                continue
            _, error = _check_value(spec.type, value)
            error = error or _enum_error(spec, value)
            if error:
                problems.append(Problem(f"outputs.{name}", error, _enum_hint(spec)))
        return problems

    def _inputs_summary(self) -> str:
        if not self.inputs:
            return "this worker declares no inputs"
        parts = []
        for name, spec in self.inputs.items():
            extra = ", required" if spec.required else ""
            if spec.default is not None:
                extra = f", default {_show(spec.default)}"
            parts.append(f"{name} ({spec.type}{extra})")
        return "declared inputs: " + ", ".join(parts)


_TS_HINT = "install one of these TypeScript runners: " + ", ".join(TYPESCRIPT_RUNNERS)


def typescript_runner() -> str | None:
    """The first TypeScript runner on PATH, in order of preference, or None."""
    return next((name for name in TYPESCRIPT_RUNNERS if shutil.which(name)), None)


# -- reporting -------------------------------------------------------------------------------


def format_problems(problems: Iterable[Problem]) -> str:
    """Human lines, one per problem: "  inputs.x.type: unknown type 'strng' (hint: ...)"."""
    lines = []
    for problem in problems:
        where = f"{problem.path}: " if problem.path else ""
        hint = f" (hint: {problem.hint})" if problem.hint else ""
        lines.append(f"  {where}{problem.message}{hint}")
    return "\n".join(lines)


def _invalid(problems: list[Problem]) -> ManifestInvalid:
    count = len(problems)
    shown = "; ".join(f"{p.path or 'worker.yml'}: {p.message}" for p in problems[:5])
    more = f"; and {count - 5} more" if count > 5 else ""
    plural = "problem" if count == 1 else "problems"
    hint = problems[0].hint if count == 1 else "each problem in details has its own hint"
    return ManifestInvalid(
        f"worker.yml has {count} {plural}: {shown}{more}",
        hint=hint,
        details=[p.to_dict() for p in problems],
    )


# -- public entry points ---------------------------------------------------------------------


def check_manifest(text: str, files: Iterable[str]) -> tuple[Manifest | None, list[Problem]]:
    """Validate worker.yml text against the folder's file list (relative posix paths).

    Returns the manifest and no problems, or None and every problem found; never raises for
    anything wrong in the content.
    """
    file_set = frozenset(PurePosixPath(f).as_posix() for f in files)
    doc, problems = _load_yaml(text)
    if problems:
        return None, problems
    if doc is None:
        return None, [Problem("", "worker.yml is empty", "add at least name: my-worker")]
    if not isinstance(doc, Mapping):
        message = f"worker.yml must be a mapping of keys to values, got {_kind_of(doc)}"
        return None, [Problem("", message, "start it with a line like name: my-worker")]
    clean, problems = _check_document(doc, file_set)
    if problems:
        return None, problems
    try:
        return Manifest.model_validate(clean), []
    except ValidationError as exc:  # a rule the checks above missed; still report, not crash
        return None, [_from_pydantic(error) for error in exc.errors()]


def parse_manifest(text: str, files: Iterable[str]) -> Manifest:
    """Like check_manifest, but raises ManifestInvalid listing every problem."""
    manifest, problems = check_manifest(text, files)
    if manifest is None:
        raise _invalid(problems)
    return manifest


def list_worker_files(folder: Path) -> list[str]:
    """Relative posix paths of the files under folder, skipping VCS, cache and env folders."""
    found: list[str] = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        base = Path(root).relative_to(folder)
        found.extend((base / name).as_posix() for name in names)
    return sorted(found)


def check_folder(folder: Path) -> tuple[Manifest | None, list[Problem]]:
    """check_manifest for a worker folder on disk."""
    if not folder.is_dir():
        return None, [Problem("", f"{folder} is not a folder", "point at a worker's folder")]
    path = folder / "worker.yml"
    if not path.is_file():
        hint = "create worker.yml with at least name:"
        if (folder / "worker.yaml").is_file():
            hint = "rename worker.yaml to worker.yml"
        return None, [Problem("", f"no worker.yml in {folder}", hint)]
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None, [Problem("", "worker.yml is not UTF-8 text", "save it as UTF-8")]
    return check_manifest(text, list_worker_files(folder))


def load_folder(folder: Path) -> Manifest:
    """Read and validate a worker folder's worker.yml; raises ManifestInvalid."""
    manifest, problems = check_folder(folder)
    if manifest is None:
        raise _invalid(problems)
    return manifest


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
    schema["$defs"]["Approvals"] = Approvals.model_json_schema()
    props["expose"]["items"] = {"enum": list(EXPOSE_TARGETS)}
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


# -- YAML ------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys, which PyYAML would silently overwrite."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key; the base constructor reports it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _load_yaml(text: str) -> tuple[Any, list[Problem]]:
    try:
        return yaml.load(text, Loader=_StrictLoader), []
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        reason = getattr(exc, "problem", None) or str(exc)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        hint = "check the indentation and quoting around that line"
        if "\t" in reason:
            hint = "indent with spaces, not tabs"
        elif reason.startswith("duplicate key"):
            hint = "give each key once"
        return None, [Problem("", f"worker.yml is not valid YAML{where}: {reason}", hint)]


# -- the document ----------------------------------------------------------------------------

Checker = Callable[[Any, str, list[Problem]], Any]


def _check_document(doc: Mapping[Any, Any], files: frozenset[str]) -> tuple[dict, list[Problem]]:
    out: list[Problem] = []
    _check_keys(doc, Manifest.model_fields, "", out)
    clean: dict[str, Any] = {}
    for key, value in doc.items():
        if key not in Manifest.model_fields or key == "entry" or value is None:
            continue
        checker = _SECTIONS.get(key)
        if checker is not None:
            result = checker(value, key, out)
        else:
            info = Manifest.model_fields[key]
            result = _check_scalar(info.annotation, info.metadata, value, key, out)
        if result is not _BAD:
            clean[key] = result
    if doc.get("name") is None:
        out.append(Problem("name", "required", "add a line like name: my-worker"))
    entry = _resolve_entry(doc.get("entry"), files, out)
    if entry is not None:
        clean["entry"] = entry
    from floom.agent.spec import check_agent_sections  # late: it imports this module

    check_agent_sections(doc, clean, out)
    if "triggers" in clean:
        from floom.triggers.checks import check_triggers  # late: it imports this module

        check_triggers(doc["triggers"], clean.get("inputs", {}), str(doc.get("name", "")), out)
    return clean, out


def _check_name(value: Any, path: str, out: list[Problem]) -> Any:
    if isinstance(value, str) and re.fullmatch(NAME_PATTERN, value):
        return value
    hint = _NAME_HINT
    slug = re.sub(r"[^a-z0-9]+", "-", str(value).lower()).strip("-")[:63]
    if re.fullmatch(NAME_PATTERN, slug):
        hint = f'use lowercase letters, digits and dashes, starting with a letter: try "{slug}"'
    out.append(Problem(path, f"{_show(value)} is not a valid worker name", hint))
    return _BAD


def _resolve_entry(raw: Any, files: frozenset[str], out: list[Problem]) -> str | None:
    kinds = "run.py, run.sh, run.js, run.ts or SKILL.md"
    if raw is None:
        found = [name for name in ENTRY_CANDIDATES if name in files]
        if not found:
            hint = f"add one of {kinds}, or set entry: in worker.yml"
            out.append(Problem("entry", "no entry file", hint))
            return None
        if len(found) > 1:
            message = f"more than one entry file: {', '.join(found)}"
            out.append(Problem("entry", message, "set entry: in worker.yml"))
            return None
        entry = found[0]
    else:
        pure = PurePosixPath(str(raw))
        if not isinstance(raw, str) or not raw.strip() or "\\" in raw:
            out.append(Problem("entry", f"{_show(raw)} is not a file path", f"e.g. {kinds}"))
            return None
        if pure.is_absolute() or ".." in pure.parts:
            message = f"entry '{raw}' must be a relative path inside the worker folder"
            out.append(Problem("entry", message, "e.g. entry: src/run.py"))
            return None
        if pure.name != "SKILL.md" and pure.suffix not in (*_INTERPRETERS, ".ts"):
            message = f"entry '{raw}' is not a .py, .sh, .js or .ts script nor SKILL.md"
            out.append(Problem("entry", message, f"use one of those kinds, e.g. {kinds}"))
            return None
        entry = pure.as_posix()
        if entry not in files:
            hint = _suggest(entry, sorted(files), noun="files") if files else "the folder is empty"
            out.append(Problem("entry", f"entry file '{entry}' is not in the folder", hint))
            return None
    if entry.endswith(".ts") and typescript_runner() is None:
        message = f"{entry} needs a TypeScript runner on PATH ({', '.join(TYPESCRIPT_RUNNERS)})"
        out.append(Problem("entry", message, _TS_HINT))
        return None
    return entry


def _check_fields(raw: Any, path: str, out: list[Problem]) -> Any:
    if not isinstance(raw, Mapping):
        message = f"must be a mapping of field name to spec, got {_kind_of(raw)}"
        out.append(Problem(path, message, f"e.g. {path}: {{topic: string}}"))
        return _BAD
    clean = {}
    for name, spec in raw.items():
        field_path = f"{path}.{name}"
        name_ok = isinstance(name, str) and re.fullmatch(FIELD_NAME_PATTERN, name)
        if not name_ok:
            hint = "use letters, digits and underscores, not starting with a digit"
            out.append(Problem(field_path, f"{_show(name)} is not a valid field name", hint))
        result = _check_field_spec(spec, field_path, out)
        if name_ok and result is not _BAD:
            clean[name] = result
    return clean


def _check_field_spec(spec: Any, path: str, out: list[Problem]) -> Any:
    if spec is None or isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, Mapping):
        message = f"must be a type name or a mapping, got {_kind_of(spec)}"
        out.append(Problem(path, message, "e.g. string, or {type: integer, default: 3}"))
        return _BAD
    before = len(out)
    _check_keys(spec, FieldSpec.model_fields, path, out)
    clean: dict[str, Any] = {}
    type_ = "string" if spec.get("type") is None else spec["type"]
    if type_ in FIELD_TYPES:
        clean["type"] = type_
    else:
        hint = _suggest(_TYPE_ALIASES.get(str(type_), str(type_)), FIELD_TYPES, noun="types")
        out.append(Problem(f"{path}.type", f"unknown type {_show(type_)}", hint))
        type_ = None
    for key in ("required", "description"):
        if spec.get(key) is not None:
            annotation = FieldSpec.model_fields[key].annotation
            clean[key] = _check_scalar(annotation, [], spec[key], f"{path}.{key}", out)
    enum = spec.get("enum")
    if enum is not None:
        if not isinstance(enum, list) or not enum:
            out.append(Problem(f"{path}.enum", "must be a non-empty list", "e.g. [low, high]"))
            enum = None
        else:
            for i, item in enumerate(enum):
                error = _check_value(type_, item)[1] if type_ else None
                if error:
                    out.append(Problem(f"{path}.enum[{i}]", error, f"enum values are {type_}s"))
            clean["enum"] = enum
    default = spec.get("default")
    if default is not None:
        error = _check_value(type_, default)[1] if type_ else None
        if error:
            out.append(Problem(f"{path}.default", error, f"the default must be a {type_}"))
        elif enum is not None and default not in enum:
            hint = "choose one of: " + ", ".join(_show(v) for v in enum)
            out.append(Problem(f"{path}.default", f"{_show(default)} is not in enum", hint))
        if spec.get("required") is True:
            hint = "a default already makes it optional: drop required: true or the default"
            out.append(Problem(path, "required: true and a default cannot both be set", hint))
        clean["default"] = default
    return clean if len(out) == before else _BAD


def _check_secrets(raw: Any, path: str, out: list[Problem]) -> Any:
    def check(item: Any, item_path: str) -> bool:
        if not isinstance(item, str) or not re.fullmatch(SECRET_NAME_PATTERN, item):
            hint = "use upper-case letters, digits and underscores"
            suggestion = re.sub(r"[^A-Z0-9_]", "_", str(item).upper())
            if re.fullmatch(SECRET_NAME_PATTERN, suggestion):
                hint += f', e.g. "{suggestion}"'
            out.append(Problem(item_path, f"{_show(item)} is not a valid secret name", hint))
            return False
        if item.startswith(RESERVED_SECRET_PREFIX):
            message = f"'{item}' is reserved: floom sets {RESERVED_SECRET_PREFIX}* variables"
            out.append(Problem(item_path, message, "choose a name without that prefix"))
            return False
        return True

    return _check_list(raw, path, out, check, example="[OPENAI_API_KEY]")


def _check_calls(raw: Any, path: str, out: list[Problem]) -> Any:
    def check(item: Any, item_path: str) -> bool:
        return _check_name(item, item_path, out) is not _BAD

    return _check_list(raw, path, out, check, example="[summarise-page]")


def _check_expose(raw: Any, path: str, out: list[Problem]) -> Any:
    def check(item: Any, item_path: str) -> bool:
        if item in EXPOSE_TARGETS:
            return True
        hint = _suggest(str(item), EXPOSE_TARGETS, noun="values")
        out.append(Problem(item_path, f"cannot expose on {_show(item)}", hint))
        return False

    return _check_list(raw, path, out, check, example="[mcp, rest]")


def _check_list(
    raw: Any,
    path: str,
    out: list[Problem],
    check: Callable[[Any, str], bool],
    *,
    example: str,
) -> Any:
    if not isinstance(raw, list):
        out.append(Problem(path, f"must be a list, got {_kind_of(raw)}", f"e.g. {example}"))
        return _BAD
    clean = []
    for i, item in enumerate(raw):
        item_path = f"{path}[{i}]"
        if check(item, item_path):
            if item in clean:
                out.append(Problem(item_path, f"'{item}' is listed twice", "list it once"))
            else:
                clean.append(item)
    return clean


def _check_triggers(raw: Any, path: str, out: list[Problem]) -> Any:
    if not isinstance(raw, list):
        hint = "e.g. triggers: [{schedule: {cron: '0 9 * * *'}}]"
        out.append(Problem(path, f"must be a list, got {_kind_of(raw)}", hint))
        return _BAD
    clean = []
    for i, item in enumerate(raw):
        item_path = f"{path}[{i}]"
        if not isinstance(item, Mapping) or len(item) != 1:
            message = f"a trigger is a mapping with one key ({', '.join(TRIGGER_KINDS)})"
            hint = "put its settings under that key, e.g. - schedule: {cron: '0 9 * * *'}"
            out.append(Problem(item_path, message, hint))
            continue
        ((kind, settings),) = item.items()
        kind_path = f"{item_path}.{kind}"
        if kind not in TRIGGER_KINDS:
            hint = _suggest(str(kind), TRIGGER_KINDS, noun="kinds")
            out.append(Problem(kind_path, f"unknown trigger kind {_show(kind)}", hint))
        elif settings is not None and not isinstance(settings, Mapping):
            message = f"must be a mapping of settings, got {_kind_of(settings)}"
            out.append(Problem(kind_path, message, f"e.g. - {kind}: {{...}}"))
        else:
            clean.append({kind: dict(settings or {})})
    return clean


def _check_tools(raw: Any, path: str, out: list[Problem]) -> Any:
    if not isinstance(raw, list):
        hint = "e.g. tools: [{builtin: web_fetch}]"
        out.append(Problem(path, f"must be a list, got {_kind_of(raw)}", hint))
        return _BAD
    clean = []
    sources = ", ".join(f"{s}:" for s in TOOL_SOURCES)
    for i, item in enumerate(raw):
        item_path = f"{path}[{i}]"
        if not isinstance(item, Mapping):
            out.append(Problem(item_path, f"a tool is a mapping, got {_kind_of(item)}"))
            continue
        found = [source for source in TOOL_SOURCES if source in item]
        if not found:
            near = [k for k in item if difflib.get_close_matches(str(k), TOOL_SOURCES, n=1)]
            hint = _suggest(str(near[0]), TOOL_SOURCES) if near else f"add one of {sources}"
            out.append(Problem(item_path, f"a tool needs exactly one of {sources}", hint))
        elif len(found) > 1:
            message = f"a tool has one source, this one has {' and '.join(found)}"
            out.append(Problem(item_path, message, "split it into one tool per source"))
        else:
            clean.append(dict(item))
    return clean


def _check_retries(raw: Any, path: str, out: list[Problem]) -> Any:
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = {"count": raw}
    if not isinstance(raw, Mapping):
        message = f"must be a number of retries or a mapping, got {_kind_of(raw)}"
        out.append(Problem(path, message, "e.g. retries: 2, or retries: {count: 2}"))
        return _BAD
    return _check_flat_model(Retries, raw, path, out)


def _section(model: type[BaseModel]) -> Checker:
    return lambda raw, path, out: _check_flat_model(model, raw, path, out)


_SECTIONS: dict[str, Checker] = {
    "name": _check_name,
    "inputs": _check_fields,
    "outputs": _check_fields,
    "secrets": _check_secrets,
    "apply_secrets": _check_secrets,
    "limits": _section(Limits),
    "retries": _check_retries,
    "triggers": _check_triggers,
    "tools": _check_tools,
    "calls": _check_calls,
    "approvals": _section(Approvals),
    "expose": _check_expose,
}


# -- generic checks --------------------------------------------------------------------------


def _check_keys(
    raw: Mapping[Any, Any], allowed: Iterable[str], path: str, out: list[Problem]
) -> None:
    allowed = list(allowed)
    for key in raw:
        key_path = f"{path}.{key}" if path else str(key)
        if not isinstance(key, str):
            hint = "quote the key"
            if isinstance(key, bool):  # YAML 1.1 reads bare on/off/yes/no as booleans
                hint = "YAML reads a bare on, off, yes or no as true/false: quote the key"
            out.append(Problem(key_path, f"key {_show(key)} is not text", hint))
        elif key not in allowed:
            out.append(Problem(key_path, f"unknown key '{key}'", _suggest(key, allowed)))


def _check_flat_model(model: type[BaseModel], raw: Any, path: str, out: list[Problem]) -> Any:
    """Check a mapping of scalars against a model's fields, using the model's own bounds."""
    if not isinstance(raw, Mapping):
        keys = ", ".join(model.model_fields)
        out.append(Problem(path, f"must be a mapping, got {_kind_of(raw)}", f"keys: {keys}"))
        return _BAD
    _check_keys(raw, model.model_fields, path, out)
    clean = {}
    for key, value in raw.items():
        info = model.model_fields.get(key)
        if info is None or value is None:
            continue
        result = _check_scalar(info.annotation, info.metadata, value, f"{path}.{key}", out)
        if result is not _BAD:
            clean[key] = result
    return clean


def _check_scalar(
    annotation: Any, bounds: list[Any], value: Any, path: str, out: list[Problem]
) -> Any:
    """Check a value against a scalar annotation (bool, int, float, str, Literal, optional)."""
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    if get_origin(annotation) is Literal:
        choices = get_args(annotation)
        if value in choices:
            return value
        message = f"must be one of {', '.join(map(_show, choices))}, got {_show(value)}"
        out.append(Problem(path, message, _suggest(str(value), choices, noun="values")))
        return _BAD
    wanted = {bool: "true or false", int: "an integer", float: "a number", str: "text"}
    type_ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: _is_number(value),
        str: isinstance(value, str),
    }
    if not type_ok[annotation]:
        out.append(Problem(path, f"must be {wanted[annotation]}, got {_show(value)}"))
        return _BAD
    for bound in bounds:
        for attr, word in (("ge", "at least"), ("gt", "more than"), ("le", "at most")):
            limit = getattr(bound, attr, None)
            if limit is not None and not _within(attr, value, limit):
                out.append(Problem(path, f"must be {word} {limit}, got {_show(value)}"))
                return _BAD
    return value


def _within(attr: str, value: float, limit: float) -> bool:
    return {"ge": value >= limit, "gt": value > limit, "le": value <= limit}[attr]


# -- values ----------------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_value(type_: str, value: Any) -> tuple[Any, str | None]:
    """A JSON value checked against a declared field type: (value, None) or (None, error)."""
    if type_ in ("string", "file"):
        ok = isinstance(value, str)
    elif type_ == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif type_ == "number":
        ok = _is_number(value)
    elif type_ == "boolean":
        ok = isinstance(value, bool)
    elif type_ == "object":
        ok = isinstance(value, Mapping)
        value = dict(value) if ok else value
    else:
        ok = isinstance(value, list | tuple)
        value = list(value) if ok else value
    return (value, None) if ok else (None, f"expected {type_}, got {_show(value)}")


def _parse_text(type_: str, text: str) -> tuple[Any, str | None]:
    """A command-line value parsed by its declared type: (value, None) or (None, error)."""
    stripped = text.strip()
    if type_ in ("string", "file"):
        return text, None
    if type_ == "integer" and re.fullmatch(r"[+-]?\d+", stripped):
        return int(stripped), None
    if type_ == "number" and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", stripped):
        number = float(stripped)
        return (int(number) if re.fullmatch(r"[+-]?\d+", stripped) else number), None
    if type_ == "boolean":
        word = stripped.lower()
        if word in _TRUE_WORDS | _FALSE_WORDS:
            return word in _TRUE_WORDS, None
        return None, f"expected boolean (true/false, yes/no, 1/0), got {_show(text)}"
    if type_ in ("object", "array"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return None, f"expected {type_} as JSON text, got {_show(text)}"
        return _check_value(type_, value)
    return None, f"expected {type_}, got {_show(text)}"


def _enum_error(spec: FieldSpec, value: Any) -> str | None:
    if spec.enum is None or value is None or value in spec.enum:
        return None
    return f"expected one of {', '.join(map(_show, spec.enum))}, got {_show(value)}"


def _enum_hint(spec: FieldSpec) -> str | None:
    return f"allowed values: {', '.join(map(_show, spec.enum))}" if spec.enum else None


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind_of(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return _show(value)


def _suggest(word: str, choices: Iterable[str], *, noun: str = "keys") -> str:
    options = list(choices)
    close = difflib.get_close_matches(word, options, n=1)
    if close:
        return f"did you mean '{close[0]}'?"
    if not options:
        return f"there are no {noun} to choose from"
    return f"allowed {noun}: " + ", ".join(options)


def _from_pydantic(error: Any) -> Problem:
    path = ""
    for part in error["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return Problem(path, error["msg"])
