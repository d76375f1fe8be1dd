"""Sandbox backends: where script workers run, chosen by name."""

from __future__ import annotations

from collections.abc import Callable

from floom.config import Settings
from floom.errors import InvalidRequest
from floom.sandbox.base import LineSink, Sandbox, SandboxResult, SandboxSpec, SandboxUnavailable
from floom.sandbox.identity import DEFAULT_SANDBOX_UID
from floom.sandbox.local import LocalSandbox

__all__ = [
    "LineSink",
    "LocalSandbox",
    "Sandbox",
    "SandboxResult",
    "SandboxSpec",
    "SandboxUnavailable",
    "get_sandbox",
]


def _local(settings: Settings | None) -> Sandbox:
    return LocalSandbox(sandbox_uid=settings.sandbox_uid if settings else DEFAULT_SANDBOX_UID)


_BACKENDS: dict[str, Callable[[Settings | None], Sandbox]] = {"local": _local}


def get_sandbox(name: str, settings: Settings | None = None) -> Sandbox:
    """Build the sandbox backend called `name` with `settings` (defaults without them);
    raise InvalidRequest for an unknown name."""
    factory = _BACKENDS.get(name)
    if factory is None:
        known = ", ".join(sorted(_BACKENDS))
        raise InvalidRequest(
            f"unknown sandbox {name!r}", hint=f"choose one of: {known}", details={"name": name}
        )
    return factory(settings)
