"""Sandbox backends: where script workers run, chosen by name."""

from __future__ import annotations

import os
from collections.abc import Callable

from floom.config import Settings
from floom.errors import InvalidRequest
from floom.sandbox.base import LineSink, Sandbox, SandboxResult, SandboxSpec, SandboxUnavailable
from floom.sandbox.local.backend import LocalSandbox
from floom.sandbox.local.uid_pool import UidRange
from floom.sandbox.local.warm.pools import WarmSettings

__all__ = [
    "BACKENDS",
    "LineSink",
    "LocalSandbox",
    "Sandbox",
    "SandboxResult",
    "SandboxSpec",
    "SandboxUnavailable",
    "backend_readiness",
    "configuration_problem",
    "e2b_api_key",
    "get_sandbox",
]


def e2b_api_key(settings: Settings) -> str:
    """The E2B key: FLOOM_E2B_API_KEY, else the SDK's own E2B_API_KEY; "" when unset."""
    return settings.e2b_api_key or os.environ.get("E2B_API_KEY", "")


def _local(settings: Settings | None) -> Sandbox:
    if settings is None:
        return LocalSandbox()
    return LocalSandbox(
        uids=UidRange(settings.sandbox_uid_base, settings.sandbox_uid_count),
        ceilings=settings.limit_ceilings(),
        warm=WarmSettings(
            enabled=settings.warm_enabled,
            ready=settings.warm_ready_children,
            recycle_runs=settings.warm_recycle_runs,
            recycle_seconds=settings.warm_recycle_seconds,
            idle_seconds=settings.warm_idle_seconds,
            memory_mb=settings.warm_memory_mb,
        ),
        runs_at_once=settings.executor_slots,
    )


def _e2b(settings: Settings | None) -> Sandbox:
    # Imported on first use: the e2b SDK takes ~1 s of CPU to import (its HTTP clients and
    # protobuf messages), which only a node that runs scripts in E2B pays, not every CLI
    # command or local-only server.
    from floom.sandbox.e2b.backend import Budgets, E2BSandbox, E2BWarmSettings

    s = settings or Settings()
    return E2BSandbox(
        api_key=e2b_api_key(s),
        template=s.e2b_template,
        budgets=Budgets(
            result_bytes=s.max_result_bytes,
            artifact_bytes=s.max_artifact_bytes,
            bundle_bytes=s.max_bundle_bytes,
        ),
        warm=E2BWarmSettings(
            count=s.e2b_warm, idle_seconds=s.e2b_warm_idle_seconds, budget=s.e2b_warm_budget
        ),
    )


#: Every backend a server can be configured with, by name. A new one registers here.
BACKENDS: dict[str, Callable[[Settings | None], Sandbox]] = {"local": _local, "e2b": _e2b}


def get_sandbox(name: str, settings: Settings | None = None) -> Sandbox:
    """Build the sandbox backend called `name` with `settings` (defaults without them);
    raise InvalidRequest for an unknown name. Building one starts nothing."""
    factory = BACKENDS.get(name)
    if factory is None:
        known = ", ".join(sorted(BACKENDS))
        raise InvalidRequest(
            f"unknown sandbox {name!r}", hint=f"choose one of: {known}", details={"name": name}
        )
    return factory(settings)


def configuration_problem(name: str, settings: Settings) -> str | None:
    """What setting backend `name` lacks on this server, or None when it is configured (the
    local backend needs none; whether bubblewrap works is `check`'s to say)."""
    if name == "e2b" and not e2b_api_key(settings):
        return "FLOOM_E2B_API_KEY (or E2B_API_KEY) is not set"
    return None


def backend_readiness(settings: Settings) -> dict[str, str]:
    """Each backend: "ready", or why it is not (for /healthz and `floom serve`'s start line).
    Checks only the settings and local tools; starts no sandbox."""
    found: dict[str, str] = {}
    for name in BACKENDS:
        problem = configuration_problem(name, settings)
        if problem is None:
            try:
                get_sandbox(name, settings).check()
            except SandboxUnavailable as exc:
                problem = exc.message
        found[name] = "ready" if problem is None else f"not ready: {problem}"
    return found
