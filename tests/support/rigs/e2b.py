"""The E2B backend pointed at the wire-level stand-in (tests/standins/e2b), for the tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest

from floom.config import Settings
from floom.sandbox import get_sandbox
from floom.sandbox.base import LineSink, Sandbox, SandboxResult, SandboxSession, SandboxSpec
from floom.sandbox.e2b.backend import NODE_LABEL, E2BSandbox
from floom.sandbox.e2b.warm import BoxShape
from tests.standins.e2b import E2BStandin, running_e2b_standin


@contextmanager
def standin_for_module() -> Iterator[E2BStandin]:
    """A stand-in, with the SDK's own settings pointing at it, for a module's tests."""
    with (
        pytest.MonkeyPatch.context() as patch,
        running_e2b_standin(templates={"python-data"}) as standin,
    ):
        for key, value in standin.env.items():
            patch.setenv(key, value)
        patch.delenv("E2B_DOMAIN", raising=False)
        patch.delenv("E2B_DEBUG", raising=False)
        yield standin


def e2b_backend(standin: E2BStandin, **settings: Any) -> E2BSandbox:
    backend = get_sandbox("e2b", Settings(e2b_api_key=standin.api_key, **settings))
    assert isinstance(backend, E2BSandbox)
    return backend


READY_SECONDS = 30.0


class WarmedE2B(Sandbox):
    """The E2B backend with FLOOM_E2B_WARM, each run (and session) started in a sandbox
    created ahead of it: before each, its pool has one ready, and the run must take it."""

    name = "e2b-warm"

    def __init__(self, backend: E2BSandbox, *, node: str = "node-e2b-warm") -> None:
        assert backend.warm is not None, "build it with e2b_warm > 0"
        self.backend = backend
        self.node = node

    def warm_spec(self, spec: SandboxSpec) -> SandboxSpec:
        return replace(spec, metadata={**spec.metadata, NODE_LABEL: self.node})

    def ready_for(self, spec: SandboxSpec) -> int:
        """Have a sandbox ready for `spec`; the pools' hits so far."""
        warm = self.backend.warm
        assert warm is not None
        template = spec.template or self.backend.template
        warm.start(BoxShape(template, spec.network, self.node))
        assert warm.wait_ready(template, network=spec.network, timeout=READY_SECONDS)
        hits: int = warm.stats()["hits"]
        return hits

    def taken(self, before: int) -> None:
        warm = self.backend.warm
        assert warm is not None
        assert warm.stats()["hits"] == before + 1, "the run did not start in a ready sandbox"

    def run(
        self, spec: SandboxSpec, *, on_line: LineSink, should_cancel: Callable[[], bool]
    ) -> SandboxResult:
        spec = self.warm_spec(spec)
        before = self.ready_for(spec)
        # A spec refused before anything runs raises, and takes none.
        result = self.backend.run(spec, on_line=on_line, should_cancel=should_cancel)
        self.taken(before)
        return result

    def open_session(self) -> SandboxSession:
        return WarmedSession(self)

    def protections(self) -> dict[str, bool | str]:
        return self.backend.protections()

    def close(self) -> None:
        self.backend.close()


class WarmedSession(SandboxSession):
    def __init__(self, outer: WarmedE2B) -> None:
        self.outer = outer
        self.inner = outer.backend.open_session()
        self.first = True

    def run(
        self, spec: SandboxSpec, *, on_line: LineSink, should_cancel: Callable[[], bool]
    ) -> SandboxResult:
        spec = self.outer.warm_spec(spec)
        if not self.first:
            return self.inner.run(spec, on_line=on_line, should_cancel=should_cancel)
        self.first = False
        before = self.outer.ready_for(spec)
        result = self.inner.run(spec, on_line=on_line, should_cancel=should_cancel)
        self.outer.taken(before)
        return result

    def close(self) -> None:
        self.inner.close()
