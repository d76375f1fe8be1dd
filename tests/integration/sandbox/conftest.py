"""The E2B stand-in for this folder's E2B tests: one per module, its faults and counts
cleared around each test, and the backend pointed at it. A module that needs more (or a
stand-in per test) defines its own fixture of the same name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from floom.sandbox.e2b.backend import E2BSandbox
from tests.standins.e2b import E2BStandin
from tests.support.rigs.e2b import e2b_backend, standin_for_module


@pytest.fixture(scope="module")
def service() -> Iterator[E2BStandin]:
    with standin_for_module() as standin:
        yield standin


@pytest.fixture
def standin(service: E2BStandin) -> Iterator[E2BStandin]:
    service.clear_faults()
    service.reset_counts()
    yield service
    service.clear_faults()


@pytest.fixture
def e2b(standin: E2BStandin) -> E2BSandbox:
    return e2b_backend(standin)
