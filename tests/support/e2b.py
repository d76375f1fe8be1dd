"""The E2B backend pointed at the wire-level stand-in (tests/standins/e2b), for the tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from floom.config import Settings
from floom.sandbox import get_sandbox
from floom.sandbox.e2b.backend import E2BSandbox
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
