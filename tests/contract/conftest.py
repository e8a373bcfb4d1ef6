"""The contract suite's one store fixture, parameterised over every backend in BACKENDS.

A backend registers in its own module, ``backend_<name>.py`` here, defining ``BACKEND``: a
factory yielding a fresh, empty store, and the few hooks the suite needs to inject faults
no client can cause through the contract (a corrupt record, a wiped or restarted store;
see ``backend.py``). Everything else the tests do goes through the contract. Every contract
test runs on every backend found.

``@pytest.mark.history_limit(n)`` gives a test's store another history limit.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from beat_claims.stores.base import Store

from .backend import Backend

#: The history limit of every store in the suite, unless a test's marker says otherwise.
HISTORY_LIMIT = 100


def _backends() -> dict[str, Backend]:
    """Every ``backend_<name>.py`` module here, each defining ``BACKEND``."""
    out = {}
    for path in sorted(Path(__file__).parent.glob("backend_*.py")):
        module = importlib.import_module(f"{__package__}.{path.stem}")
        out[path.stem.removeprefix("backend_")] = module.BACKEND
    return out


BACKENDS: dict[str, Backend] = _backends()


# -- fixtures -----------------------------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "history_limit(n): the test's store keeps n runs")


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Backend:
    return BACKENDS[request.param]


@pytest.fixture
def store(backend: Backend, request: pytest.FixtureRequest) -> Iterator[Store]:
    """A fresh, empty store of each backend."""
    marker = request.node.get_closest_marker("history_limit")
    limit = int(marker.args[0]) if marker else HISTORY_LIMIT
    with backend.open(request, limit) as store:
        yield store
