"""Reading worker.yml: strict YAML loading and the section-by-section checks that turn the
document into clean values for Manifest, or into problems with hints."""

from __future__ import annotations

import difflib
import re
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from pathlib import PurePosixPath
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel

from floom.errors import ManifestAliasesRefused
from floom.manifest.agent import check_agent_sections
from floom.manifest.alerts import check_alerts
from floom.manifest.fields import check_value, is_number, kind_of, show, suggest
from floom.manifest.replay import check_replay
from floom.manifest.schema import (
    ENTRY_CANDIDATES,
    EXPOSE_TARGETS,
    FIELD_NAME_PATTERN,
    FIELD_TYPES,
    INTERPRETERS,
    MAX_MANIFEST_DEPTH,
    MAX_MANIFEST_NODES,
    MAX_NETWORK_ALLOW,
    NAME_PATTERN,
    NETWORK_ALLOW_WITHOUT_NETWORK,
    SECRET_NAME_PATTERN,
    TOOL_SOURCES,
    TRIGGER_KINDS,
    TYPESCRIPT_HINT,
    TYPESCRIPT_RUNNERS,
    Approvals,
    FieldSpec,
    Limits,
    Manifest,
    Problem,
    Retries,
    SandboxChoice,
    StateSpec,
    manifest_too_large,
    typescript_runner,
)
from floom.manifest.triggers import check_triggers
from floom.sandbox import env_names
from floom.sandbox.local.network import ALLOW_HINT, parse_allowed_network

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
_NAME_HINT = 'use lowercase letters, digits and dashes, starting with a letter, e.g. "my-worker"'
_BAD = object()  # returned by the checkers below for a value that produced a problem


# -- YAML ------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys, which PyYAML would silently overwrite, and
    bounds the document while composing it, before anything is built from it: no anchors or
    aliases, at most MAX_MANIFEST_DEPTH nested collections and MAX_MANIFEST_NODES nodes.
    PyYAML composes recursively and lazily, so stopping here also stops the scanner."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        self.nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]  # unannotated in types-PyYAML
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            message = (
                f"worker.yml uses a YAML anchor or alias{_where(event.start_mark)}; floom "
                "refuses them, because a few of them can expand to gigabytes"
            )
            hint = "write the repeated part out in full (drop the &name and *name marks)"
            detail = {"path": "", "message": message, "hint": hint, "limit": "aliases", "max": 0}
            raise ManifestAliasesRefused(message, hint=hint, details=[detail])
        self.nodes += 1
        if self.nodes > MAX_MANIFEST_NODES:
            raise manifest_too_large(
                limit="nodes",
                maximum=MAX_MANIFEST_NODES,
                message=f"worker.yml has more than {MAX_MANIFEST_NODES} keys and values",
                hint="keep worker.yml to settings; put data in files and read them at run time",
            )
        nested = isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent))
        if nested:
            self.depth += 1
            if self.depth > MAX_MANIFEST_DEPTH:
                raise manifest_too_large(
                    limit="depth",
                    maximum=MAX_MANIFEST_DEPTH,
                    message=f"worker.yml nests deeper than {MAX_MANIFEST_DEPTH} levels"
                    f"{_where(event.start_mark)}",
                    hint="flatten the structure; a default or setting this deep belongs in a "
                    "file read at run time",
                )
        try:
            return super().compose_node(parent, index)
        finally:
            if nested:
                self.depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError, TypeError) as exc:
            raise _UnreadableValue(node, _reason(exc)) from exc


def _where(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""


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


class _UnreadableValue(Exception):
    """A scalar PyYAML's constructors could not build (they raise ValueError and friends,
    not YAMLError): an integer past Python's digit limit, a date that does not exist."""

    def __init__(self, node: yaml.Node, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


def _reason(exc: Exception) -> str:
    text = str(exc)
    if "integer string conversion" in text:
        return f"is an integer of more than {sys.get_int_max_str_digits()} digits"
    return f"cannot be read ({text[:200]})"


def _path_to(root: yaml.Node, target: yaml.Node) -> str:
    """Where `target` sits in the document ("inputs.count.default", "triggers[0]")."""
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = str(key.value)[:80] if isinstance(key, yaml.ScalarNode) else "?"
                if key is target:
                    return f"{path}.{name}" if path else name
                stack.append((value, f"{path}.{name}" if path else name))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
    return ""


def load_yaml(text: str) -> tuple[Any, list[Problem]]:
    loader: _StrictLoader | None = None
    root = None
    try:
        # The loader reads the start of the text at once: a character YAML does not allow
        # there (a NUL, a worker.yml saved as UTF-16) is a problem to tell, not a 500.
        loader = _StrictLoader(text)
        root = loader.get_single_node()
        return (None if root is None else loader.construct_document(root)), []
    except _UnreadableValue as exc:
        path = _path_to(root, exc.node) if root is not None else ""
        message = f"{path or 'a value'}{_where(exc.node.start_mark)} {exc.reason}"
        hint = "quote it to keep it as text, or write a smaller value"
        return None, [Problem(path, message, hint)]
    except yaml.YAMLError as exc:
        reason = getattr(exc, "problem", None) or str(exc)
        where = _where(getattr(exc, "problem_mark", None))
        hint = "check the indentation and quoting around that line"
        if "\t" in reason:
            hint = "indent with spaces, not tabs"
        elif reason.startswith("duplicate key"):
            hint = "give each key once"
        if isinstance(exc, yaml.reader.ReaderError):
            line = text.count("\n", 0, exc.position) + 1
            where, reason = f" at line {line}", str(exc).split("\n", 1)[0]
            hint = "save worker.yml as UTF-8 text without control characters"
        return None, [Problem("", f"worker.yml is not valid YAML{where}: {reason}", hint)]
    finally:
        if loader is not None:
            loader.dispose()


# -- the document ----------------------------------------------------------------------------

Checker = Callable[[Any, str, list[Problem]], Any]


def check_document(
    doc: Mapping[Any, Any], files: frozenset[str]
) -> tuple[dict[str, Any], list[Problem]]:
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
    if clean.get("network_allow") and clean.get("network") != "full":
        hint = "add network: full, or drop network_allow"
        out.append(Problem("network_allow", NETWORK_ALLOW_WITHOUT_NETWORK, hint))
    entry = _resolve_entry(doc.get("entry"), files, out)
    if entry is not None:
        clean["entry"] = entry
    check_agent_sections(doc, clean, out)
    check_replay(doc, clean, out)
    if "triggers" in clean:
        check_triggers(doc["triggers"], clean.get("inputs", {}), str(doc.get("name", "")), out)
    return clean, out


def unquoted_hint(value: Any, key: str | None) -> str | None:
    """For text that YAML read as something else (`title: yes` is the boolean true,
    `description: 1.10` the number 1.1): quote it, shown for `key`'s value, or for a list's
    item when `key` is None."""
    if isinstance(value, bool):
        read, text = "an unquoted yes, no, on, off, true or false as a boolean", "yes"
    elif isinstance(value, int | float):
        read, text = "an unquoted number as a number", str(value)
    else:
        return None
    example = f'["{text.upper()}"]' if key is None else f'{key}: "{text}"'
    return f"YAML reads {read}: quote the text as you wrote it, e.g. {example}"


def _check_name(value: Any, path: str, out: list[Problem]) -> Any:
    if isinstance(value, str) and re.fullmatch(NAME_PATTERN, value):
        return value
    hint = (isinstance(value, bool) and unquoted_hint(value, "name")) or _NAME_HINT
    slug = re.sub(r"[^a-z0-9]+", "-", str(value).lower()).strip("-")[:63]
    if re.fullmatch(NAME_PATTERN, slug) and isinstance(value, str):
        hint = f'use lowercase letters, digits and dashes, starting with a letter: try "{slug}"'
    out.append(Problem(path, f"{show(value)} is not a valid worker name", hint))
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
            out.append(Problem("entry", f"{show(raw)} is not a file path", f"e.g. {kinds}"))
            return None
        if pure.is_absolute() or ".." in pure.parts:
            message = f"entry '{raw}' must be a relative path inside the worker folder"
            out.append(Problem("entry", message, "e.g. entry: src/run.py"))
            return None
        if pure.name != "SKILL.md" and pure.suffix not in (*INTERPRETERS, ".ts"):
            message = f"entry '{raw}' is not a .py, .sh, .js or .ts script nor SKILL.md"
            out.append(Problem("entry", message, f"use one of those kinds, e.g. {kinds}"))
            return None
        entry = pure.as_posix()
        if entry not in files:
            hint = suggest(entry, sorted(files), noun="files") if files else "the folder is empty"
            out.append(Problem("entry", f"entry file '{entry}' is not in the folder", hint))
            return None
    if entry.endswith(".ts") and typescript_runner() is None:
        message = f"{entry} needs a TypeScript runner on PATH ({', '.join(TYPESCRIPT_RUNNERS)})"
        out.append(Problem("entry", message, TYPESCRIPT_HINT))
        return None
    return entry


def _check_fields(raw: Any, path: str, out: list[Problem]) -> Any:
    if not isinstance(raw, Mapping):
        message = f"must be a mapping of field name to spec, got {kind_of(raw)}"
        out.append(Problem(path, message, f"e.g. {path}: {{topic: string}}"))
        return _BAD
    clean = {}
    for name, spec in raw.items():
        field_path = f"{path}.{name}"
        name_ok = isinstance(name, str) and re.fullmatch(FIELD_NAME_PATTERN, name)
        if not name_ok:
            hint = "use letters, digits and underscores, not starting with a digit"
            out.append(Problem(field_path, f"{show(name)} is not a valid field name", hint))
        result = _check_field_spec(spec, field_path, out)
        if name_ok and result is not _BAD:
            clean[name] = result
    return clean


def _check_field_spec(spec: Any, path: str, out: list[Problem]) -> Any:
    if spec is None or isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, Mapping):
        message = f"must be a type name or a mapping, got {kind_of(spec)}"
        out.append(Problem(path, message, "e.g. string, or {type: integer, default: 3}"))
        return _BAD
    before = len(out)
    _check_keys(spec, FieldSpec.model_fields, path, out)
    clean: dict[str, Any] = {}
    type_ = "string" if spec.get("type") is None else spec["type"]
    if type_ in FIELD_TYPES:
        clean["type"] = type_
    else:
        hint = suggest(_TYPE_ALIASES.get(str(type_), str(type_)), FIELD_TYPES, noun="types")
        out.append(Problem(f"{path}.type", f"unknown type {show(type_)}", hint))
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
                error = check_value(type_, item)[1] if type_ else None
                if error:
                    out.append(Problem(f"{path}.enum[{i}]", error, f"enum values are {type_}s"))
            clean["enum"] = enum
    default = spec.get("default")
    if default is not None:
        error = check_value(type_, default)[1] if type_ else None
        if error:
            out.append(Problem(f"{path}.default", error, f"the default must be a {type_}"))
        elif enum is not None and default not in enum:
            hint = "choose one of: " + ", ".join(show(v) for v in enum)
            out.append(Problem(f"{path}.default", f"{show(default)} is not in enum", hint))
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
            if not isinstance(item, str):
                hint = unquoted_hint(item, None) or hint
            elif re.fullmatch(SECRET_NAME_PATTERN, suggestion):
                hint += f', e.g. "{suggestion}"'
            out.append(Problem(item_path, f"{show(item)} is not a valid secret name", hint))
            return False
        if why := env_names.refusal(item):
            message = f"{why}; a declared secret becomes an environment variable of the run"
            out.append(Problem(item_path, message, env_names.RENAME_HINT))
            return False
        return True

    return _check_list(raw, path, out, check, example="[OPENAI_API_KEY]")


def _check_calls(raw: Any, path: str, out: list[Problem]) -> Any:
    def check(item: Any, item_path: str) -> bool:
        return _check_name(item, item_path, out) is not _BAD

    return _check_list(raw, path, out, check, example="[summarise-page]")


def _check_network_allow(raw: Any, path: str, out: list[Problem]) -> Any:
    def check(item: Any, item_path: str) -> bool:
        try:
            parse_allowed_network(item)
        except ValueError as exc:
            out.append(Problem(item_path, str(exc), ALLOW_HINT))
            return False
        return True

    if isinstance(raw, list) and len(raw) > MAX_NETWORK_ALLOW:
        hint = "allow whole networks (e.g. 10.1.0.0/16) rather than many small ones"
        message = f"lists {len(raw)} networks; at most {MAX_NETWORK_ALLOW}"
        out.append(Problem(path, message, hint))
        return _BAD
    return _check_list(raw, path, out, check, example="[10.1.2.0/24]")


def _check_expose(raw: Any, path: str, out: list[Problem]) -> Any:
    # Absent means every surface; an empty list would read as none, yet stored manifests
    # carry [] for an absent expose, so it is refused rather than given a second meaning.
    if raw == []:
        hint = f"leave `expose` out to allow every surface, or list some of {list(EXPOSE_TARGETS)}"
        out.append(Problem(path, "lists no surface", hint))
        return _BAD

    def check(item: Any, item_path: str) -> bool:
        if item in EXPOSE_TARGETS:
            return True
        hint = suggest(str(item), EXPOSE_TARGETS, noun="values")
        out.append(Problem(item_path, f"cannot expose on {show(item)}", hint))
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
        out.append(Problem(path, f"must be a list, got {kind_of(raw)}", f"e.g. {example}"))
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
        out.append(Problem(path, f"must be a list, got {kind_of(raw)}", hint))
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
            hint = suggest(str(kind), TRIGGER_KINDS, noun="kinds")
            out.append(Problem(kind_path, f"unknown trigger kind {show(kind)}", hint))
        elif settings is not None and not isinstance(settings, Mapping):
            message = f"must be a mapping of settings, got {kind_of(settings)}"
            out.append(Problem(kind_path, message, f"e.g. - {kind}: {{...}}"))
        else:
            clean.append({kind: dict(settings or {})})
    return clean


def _check_tools(raw: Any, path: str, out: list[Problem]) -> Any:
    if not isinstance(raw, list):
        hint = "e.g. tools: [{builtin: web_fetch}]"
        out.append(Problem(path, f"must be a list, got {kind_of(raw)}", hint))
        return _BAD
    clean = []
    sources = ", ".join(f"{s}:" for s in TOOL_SOURCES)
    for i, item in enumerate(raw):
        item_path = f"{path}[{i}]"
        if not isinstance(item, Mapping):
            out.append(Problem(item_path, f"a tool is a mapping, got {kind_of(item)}"))
            continue
        found = [source for source in TOOL_SOURCES if source in item]
        if not found:
            near = [k for k in item if difflib.get_close_matches(str(k), TOOL_SOURCES, n=1)]
            hint = suggest(str(near[0]), TOOL_SOURCES) if near else f"add one of {sources}"
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
        message = f"must be a number of retries or a mapping, got {kind_of(raw)}"
        out.append(Problem(path, message, "e.g. retries: 2, or retries: {count: 2}"))
        return _BAD
    return _check_flat_model(Retries, raw, path, out)


def _check_state(raw: Any, path: str, out: list[Problem]) -> Any:
    if isinstance(raw, bool):
        return {"enabled": raw}
    if not isinstance(raw, Mapping):
        message = f"must be true, false or a mapping, got {kind_of(raw)}"
        out.append(Problem(path, message, "e.g. state: true, or state: {on_conflict: retry}"))
        return _BAD
    return _check_flat_model(StateSpec, raw, path, out)


def _section(model: type[BaseModel]) -> Checker:
    return lambda raw, path, out: _check_flat_model(model, raw, path, out)


_SECTIONS: dict[str, Checker] = {
    "name": _check_name,
    "inputs": _check_fields,
    "outputs": _check_fields,
    "secrets": _check_secrets,
    "apply_secrets": _check_secrets,
    "limits": _section(Limits),
    "sandbox": _section(SandboxChoice),
    "retries": _check_retries,
    "state": _check_state,
    "triggers": _check_triggers,
    "tools": _check_tools,
    "calls": _check_calls,
    "approvals": _section(Approvals),
    "expose": _check_expose,
    "network_allow": _check_network_allow,
    # Checked as a whole by check_replay, which needs the tools and outputs around it.
    "replay": lambda raw, path, out: _BAD,
    "alerts": lambda raw, path, out: _or_bad(check_alerts(raw, path, out)),
}


def _or_bad(value: Any) -> Any:
    return _BAD if value is None else value


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
            out.append(Problem(key_path, f"key {show(key)} is not text", hint))
        elif key not in allowed:
            out.append(Problem(key_path, f"unknown key '{key}'", suggest(key, allowed)))


def _check_flat_model(model: type[BaseModel], raw: Any, path: str, out: list[Problem]) -> Any:
    """Check a mapping of scalars against a model's fields, using the model's own bounds."""
    if not isinstance(raw, Mapping):
        keys = ", ".join(model.model_fields)
        out.append(Problem(path, f"must be a mapping, got {kind_of(raw)}", f"keys: {keys}"))
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
        message = f"must be one of {', '.join(map(show, choices))}, got {show(value)}"
        out.append(Problem(path, message, suggest(str(value), choices, noun="values")))
        return _BAD
    wanted = {bool: "true or false", int: "an integer", float: "a number", str: "text"}
    type_ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: is_number(value),
        str: isinstance(value, str),
    }
    if not type_ok[annotation]:
        hint = unquoted_hint(value, path.rsplit(".", 1)[-1]) if annotation is str else None
        out.append(Problem(path, f"must be {wanted[annotation]}, got {show(value)}", hint))
        return _BAD
    for bound in bounds:
        for attr, word in (("ge", "at least"), ("gt", "more than"), ("le", "at most")):
            limit = getattr(bound, attr, None)
            if limit is not None and not _within(attr, value, limit):
                out.append(Problem(path, f"must be {word} {limit}, got {show(value)}"))
                return _BAD
    return value


def _within(attr: str, value: float, limit: float) -> bool:
    return {"ge": value >= limit, "gt": value > limit, "le": value <= limit}[attr]
