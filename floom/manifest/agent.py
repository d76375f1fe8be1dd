"""The agent sections of worker.yml (tools, calls, model, apply_secrets): checked into friendly
problems at deploy, and read into ToolSpec values by the agent loop."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from floom.hints import act, told
from floom.manifest.schema import Manifest, Problem
from floom.sandbox import env_names

BUILTINS = (
    "read_file",
    "list_files",
    "write_file",
    "http_request",
    "run_command",
    "invoke_worker",
    "remember",
    "recall",
    "request_approval",
    "finish",
)
APPROVAL_MODES = ("always", "never")
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_BUILTIN_KEYS: dict[str, tuple[str, ...]] = {"http_request": ("allow_domains", "methods")}
_COMMON_KEYS = ("builtin", "name", "approval", "description")
_MCP_KEYS = ("name", "url", "command", "auth_secret", "allowed_tools", "approval")
_COMPOSIO_KEYS = ("app", "allowed_tools", "approval", "user_id")
TOOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
SERVER_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,30}$")
SECRET_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
DOMAIN = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
_IPV6 = re.compile(r"^[0-9a-f:]+$")


@dataclass(frozen=True)
class ToolSpec:
    """One entry of `tools:`. `source` is builtin, mcp or composio; `name` is the builtin's
    name as the model sees it (its alias), the MCP server's name, or the Composio app."""

    source: str
    name: str
    builtin: str = ""
    approval: str = "never"
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def gated(self) -> bool:
        return self.approval == "always"


def tool_specs(manifest: Manifest) -> list[ToolSpec]:
    """The manifest's tools, read from the shape `check_agent_sections` guaranteed."""
    specs = []
    for item in manifest.tools:
        if "builtin" in item:
            builtin = str(item["builtin"])
            options = {k: v for k, v in item.items() if k not in _COMMON_KEYS}
            specs.append(
                ToolSpec(
                    source="builtin",
                    name=str(item.get("name") or builtin),
                    builtin=builtin,
                    approval=str(item.get("approval") or "never"),
                    options=options,
                )
            )
            continue
        source = "mcp" if "mcp" in item else "composio"
        settings = dict(item[source] or {})
        approval = str(settings.pop("approval", None) or item.get("approval") or "never")
        name = str(settings.get("name") or settings.get("app") or source)
        specs.append(ToolSpec(source=source, name=name, approval=approval, options=settings))
    return specs


# -- checks at deploy -------------------------------------------------------------------------


def check_agent_sections(doc: Mapping[Any, Any], clean: dict[str, Any], out: list[Problem]) -> None:
    """Problems with the agent sections; tools are checked in depth only for SKILL.md workers
    (script workers never use them, so their tools keep the plain shape check)."""
    entry = str(clean.get("entry") or "")
    is_agent = entry.rsplit("/", 1)[-1] == "SKILL.md"
    approvals = clean.get("approvals") or {}
    apply_secrets = clean.get("apply_secrets") or []
    if apply_secrets and not approvals.get("required"):
        out.append(
            Problem(
                "apply_secrets",
                "apply_secrets are given only to the apply phase of a run-level approval",
                "set approvals: {required: true}, or move them to secrets",
            )
        )
    for name in set(apply_secrets) & set(clean.get("secrets") or []):
        out.append(
            Problem("apply_secrets", f"{name} is in both secrets and apply_secrets", "list it once")
        )
    if doc.get("name") in (clean.get("calls") or []):
        out.append(Problem("calls", "a worker cannot call itself", "remove its own name"))
    model = doc.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        out.append(Problem("model", "must be a model name", "e.g. model: claude-sonnet-4-5"))
    if not is_agent or not isinstance(doc.get("tools"), list):
        return
    seen: dict[str, str] = {}
    for i, item in enumerate(doc["tools"]):
        path = f"tools[{i}]"
        if not isinstance(item, Mapping):
            continue
        if "builtin" in item:
            names = _check_builtin(item, path, out)
        elif "mcp" in item:
            names = _check_source(item, "mcp", _MCP_KEYS, path, out)
        elif "composio" in item:
            names = _check_source(item, "composio", _COMPOSIO_KEYS, path, out)
        else:
            continue
        for name in names:
            if name in seen:
                hint = "give one of them another `name:`"
                out.append(
                    Problem(path, f"the tool name '{name}' is also used by {seen[name]}", hint)
                )
            seen[name] = path


def _check_builtin(item: Mapping[Any, Any], path: str, out: list[Problem]) -> list[str]:
    builtin = item.get("builtin")
    if builtin not in BUILTINS:
        out.append(
            Problem(
                f"{path}.builtin",
                f"unknown built-in tool {builtin!r}",
                _suggest(str(builtin), BUILTINS),
            )
        )
        return []
    allowed = (*_COMMON_KEYS, *_BUILTIN_KEYS.get(builtin, ()))
    _unknown_keys(item, allowed, path, out)
    _check_approval(item.get("approval"), f"{path}.approval", out)
    name = item.get("name") or builtin
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        out.append(
            Problem(
                f"{path}.name",
                f"{name!r} is not a valid tool name",
                "letters, digits, _ and -, starting with a letter",
            )
        )
    if builtin == "http_request":
        domains = item.get("allow_domains")
        if not isinstance(domains, list) or not domains:
            out.append(
                Problem(
                    f"{path}.allow_domains",
                    "http_request needs the domains it may reach",
                    "e.g. allow_domains: [api.github.com]",
                )
            )
        else:
            for j, d in enumerate(domains):
                text = str(d).lower()
                if not isinstance(d, str) or not (DOMAIN.fullmatch(text) or _IPV6.fullmatch(text)):
                    out.append(
                        Problem(
                            f"{path}.allow_domains[{j}]",
                            f"{d!r} is not a domain",
                            "a host name like api.github.com or *.example.com",
                        )
                    )
        methods = item.get("methods")
        if methods is not None:
            if not isinstance(methods, list) or not methods:
                out.append(
                    Problem(
                        f"{path}.methods", "must be a list of HTTP methods", "e.g. methods: [GET]"
                    )
                )
            else:
                for j, m in enumerate(methods):
                    if str(m).upper() not in HTTP_METHODS:
                        out.append(
                            Problem(
                                f"{path}.methods[{j}]",
                                f"unknown method {m!r}",
                                "one of " + ", ".join(HTTP_METHODS),
                            )
                        )
    return [name] if isinstance(name, str) else []


def _check_source(
    item: Mapping[Any, Any], source: str, keys: tuple[str, ...], path: str, out: list[Problem]
) -> list[str]:
    _unknown_keys(item, (source, "approval"), path, out)
    _check_approval(item.get("approval"), f"{path}.approval", out)
    settings = item.get(source)
    where = f"{path}.{source}"
    if not isinstance(settings, Mapping):
        example = (
            "{name: linear, url: https://mcp.linear.app/mcp, allowed_tools: [list_issues]}"
            if source == "mcp"
            else "{app: gmail, allowed_tools: [GMAIL_SEND_EMAIL]}"
        )
        out.append(Problem(where, "must be a mapping of settings", f"e.g. {source}: {example}"))
        return []
    _unknown_keys(settings, keys, where, out)
    _check_approval(settings.get("approval"), f"{where}.approval", out)
    tools = settings.get("allowed_tools")
    if not isinstance(tools, list) or not tools or not all(isinstance(t, str) for t in tools):
        out.append(
            Problem(
                f"{where}.allowed_tools",
                "list the tools the agent may use",
                'e.g. allowed_tools: [list_issues]; ["*"] allows all of them',
            )
        )
        tools = []
    if source == "composio":
        if not isinstance(settings.get("app"), str) or not settings["app"]:
            out.append(Problem(f"{where}.app", "required: the Composio toolkit", "e.g. app: gmail"))
        return [t for t in tools if t != "*"]
    name = settings.get("name")
    if not isinstance(name, str) or not SERVER_NAME.fullmatch(name):
        out.append(
            Problem(
                f"{where}.name",
                "each MCP server needs a short name",
                "lowercase, e.g. name: linear; its tools appear as linear__TOOL",
            )
        )
    if settings.get("command") is not None:
        out.append(
            Problem(
                f"{where}.command",
                "stdio MCP servers are not supported",
                "floom would run the command on its own host, outside the sandbox; "
                "serve it over Streamable HTTP and give url:",
            )
        )
    url = settings.get("url")
    if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url):
        out.append(
            Problem(
                f"{where}.url",
                "needs the server's Streamable HTTP URL",
                "e.g. url: https://mcp.linear.app/mcp",
            )
        )
    secret = settings.get("auth_secret")
    if secret is not None and (not isinstance(secret, str) or not SECRET_NAME.fullmatch(secret)):
        out.append(
            Problem(
                f"{where}.auth_secret",
                f"{secret!r} is not a secret name",
                told("upper-case, e.g. LINEAR_TOKEN (set it with ", act("secrets set"), ")"),
            )
        )
    elif secret is not None and (why := env_names.refusal(secret)):
        # Never an environment variable, but a secret under this name cannot be set.
        out.append(
            Problem(f"{where}.auth_secret", f"{why} as a secret name", env_names.RENAME_HINT)
        )
    return []


def _check_approval(value: Any, path: str, out: list[Problem]) -> None:
    if value is not None and value not in APPROVAL_MODES:
        out.append(
            Problem(
                path,
                f"approval must be always or never, got {value!r}",
                "approval: always makes a person approve every call",
            )
        )


def _unknown_keys(
    item: Mapping[Any, Any], allowed: tuple[str, ...], path: str, out: list[Problem]
) -> None:
    for key in item:
        if key not in allowed:
            out.append(
                Problem(f"{path}.{key}", f"unknown key '{key}'", _suggest(str(key), allowed))
            )


def _suggest(word: str, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f"did you mean '{close[0]}'?" if close else "one of " + ", ".join(choices)
