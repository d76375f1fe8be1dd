"""`floom mcp`: the MCP server over stdio, a thin client of a floom server's REST API.

It acts only as a key it is given: FLOOM_API_KEY, or a key file named with `--key-file`
(FLOOM_API_KEY_FILE). The admin key a local `floom serve` saved is used only when its file
is named; the CLI's fallback to it would hand every agent admin rights unasked. Which key it
acts as (name and scope, never the value) is said in the server's instructions.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from floom.client.rest import FloomClient
from floom.client_env import client_base_url
from floom.errors import FloomError
from floom.mcp.backends.rest import NotConfigured, RestBackend, principal_of_key
from floom.mcp.catalog import CatalogWorker, all_workers
from floom.mcp.server import INSTRUCTIONS, FloomMCPServer
from floom.services.access.principal import SCOPES, Principal

# Deploys made elsewhere reach the tool list this often (and on every list).
POLL_SECONDS = 10.0
KEY_ENV = "FLOOM_API_KEY"
KEY_FILE_ENV = "FLOOM_API_KEY_FILE"
# Asking the server which key this is must not hold up the client's start for long.
IDENTIFY_TIMEOUT_SECONDS = 5.0
# A key is one short line; anything much longer is not a key file.
MAX_KEY_FILE_BYTES = 4096


@dataclass(frozen=True)
class ConfiguredKey:
    """The key `floom mcp` was given and where from, or why it has none (`problem`)."""

    value: str | None
    source: str
    problem: NotConfigured | None = None


def configured_key(key_file: str | None) -> ConfiguredKey:
    """The key named explicitly: the file `key_file` when given, else FLOOM_API_KEY.

    Nothing else: no admin.key found by looking in a data dir."""
    if key_file:
        return _read_key_file(Path(key_file).expanduser())
    value = os.environ.get(KEY_ENV, "").strip()
    if value:
        return ConfiguredKey(value, KEY_ENV)
    return ConfiguredKey(None, "", NotConfigured())


def _read_key_file(path: Path) -> ConfiguredKey:
    source = f"the key file {path}"
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_KEY_FILE_BYTES + 1)
    except FileNotFoundError:
        why = f"the key file {path} (--key-file) does not exist"
    except IsADirectoryError:
        why = f"--key-file names {path}, a directory, not a key file"
    except OSError as exc:
        why = f"the key file {path} (--key-file) cannot be read: {exc.strerror}"
    else:
        value = raw.decode("utf-8", errors="replace").strip()
        if len(raw) > MAX_KEY_FILE_BYTES or len(value.split()) > 1:
            why = f"the key file {path} (--key-file) does not hold a single API key"
        elif not value:
            why = f"the key file {path} (--key-file) is empty"
        else:
            return ConfiguredKey(value, source)
    return ConfiguredKey(None, source, NotConfigured(why))


def identify(client: FloomClient, source: str) -> tuple[Principal | None, str]:
    """The key as the server knows it (None when it cannot say) and the sentence the
    server's instructions carry about it; never the key's value."""
    probe = FloomClient(
        client.base_url, client.api_key, timeout=IDENTIFY_TIMEOUT_SECONDS, surface="mcp"
    )
    try:
        body = probe.my_key()
    except FloomError as exc:
        if exc.code in ("unauthorized", "forbidden"):
            return None, (
                f"floom at {client.base_url} refused the API key from {source} "
                f"({exc.code}: {exc.message}); every tool call will answer so until the "
                f"client is configured with a valid key ({KEY_ENV} or --key-file)."
            )
        return None, (
            f"floom at {client.base_url} could not be asked which API key this is "
            f"({exc.code}: {exc.message}); the key comes from {source}. Tool calls reach "
            "floom once it answers."
        )
    finally:
        probe.close()
    caller = principal_of_key(body)
    scope = max(caller.scopes, key=SCOPES.index) if caller.scopes else "none"
    agent = f", agent {caller.agent_id}" if caller.agent_id else ""
    return caller, (
        f"This server acts as the API key '{caller.name}' (scope {scope}{agent}) from "
        f"{source}, on floom at {client.base_url}. It lists only the tools that scope allows."
    )


def instructions_for(key: ConfiguredKey, about_key: str) -> str:
    """The server's instructions: setup first when there is no key, else who it acts as."""
    if key.problem is not None:
        problem = key.problem
        return (
            f"NOT CONFIGURED: {problem.message}. Every floom tool answers not_configured "
            f"until it is set up: {problem.hint}\n\n{INSTRUCTIONS}"
        )
    return f"{INSTRUCTIONS}\n\n{about_key}"


def build_server(backend: RestBackend, *, instructions: str = INSTRUCTIONS) -> FloomMCPServer:
    def load_workers() -> list[CatalogWorker]:
        return all_workers(lambda cursor: backend.list_workers(cursor=cursor, limit=200))

    return FloomMCPServer(
        backend_for=lambda _ctx: backend,
        load_workers=load_workers,
        poll_seconds=POLL_SECONDS,
        instructions=instructions,
        reads_local_folders=backend.reads_local_folders,
    )


def serve(*, key_file: str | None = None) -> None:
    """Serve MCP on stdin/stdout until the client closes it, as the key named by `key_file`
    or FLOOM_API_KEY, on FLOOM_BASE_URL. Without a key it still starts: its instructions
    and every tool call say how to set one."""
    key = configured_key(key_file or os.environ.get(KEY_FILE_ENV) or None)
    client = None
    caller = None
    about_key = ""
    if key.value is not None:
        client = FloomClient(client_base_url(), key.value, surface="mcp")
        caller, about_key = identify(client, key.source)
    # stdout is the protocol; stderr is the server log that MCP clients keep.
    said = about_key or f"not configured: {key.problem}; {key.problem and key.problem.hint}"
    print(f"floom mcp: {said}", file=sys.stderr, flush=True)
    backend = RestBackend(client, caller=caller, setup_error=key.problem)
    try:
        build_server(backend, instructions=instructions_for(key, about_key)).run("stdio")
    finally:
        backend.close()
