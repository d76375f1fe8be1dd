"""Sandbox backends: where script workers run, chosen by name."""

from __future__ import annotations

from collections.abc import Callable

from floom.errors import InvalidRequest
from floom.sandbox.base import LineSink, Sandbox, SandboxResult, SandboxSpec
from floom.sandbox.local import LocalSandbox, SandboxUnavailable

__all__ = [
    "LineSink",
    "LocalSandbox",
    "Sandbox",
    "SandboxResult",
    "SandboxSpec",
    "SandboxUnavailable",
    "get_sandbox",
]

_BACKENDS: dict[str, Callable[[], Sandbox]] = {"local": LocalSandbox}


def get_sandbox(name: str) -> Sandbox:
    """Build the sandbox backend called `name`; raise InvalidRequest for an unknown name."""
    factory = _BACKENDS.get(name)
    if factory is None:
        known = ", ".join(sorted(_BACKENDS))
        raise InvalidRequest(
            f"unknown sandbox {name!r}", hint=f"choose one of: {known}", details={"name": name}
        )
    return factory()
