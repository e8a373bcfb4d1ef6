"""The contract suite's one store fixture, parameterised over every backend in BACKENDS.

A backend registers here: a factory yielding a fresh, empty store, and the few hooks the
suite needs to inject faults no client can cause through the contract (a corrupt record,
a wiped or restarted store). Everything else the tests do goes through the contract. To
add a backend, add its ``Backend`` to ``BACKENDS``: every contract test then runs on it.

``@pytest.mark.history_limit(n)`` gives a test's store another history limit.
"""

from __future__ import annotations

import contextlib
import os
import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

import pytest

from beat_claims.stores.base import Store
from beat_claims.stores.redis import RedisStore

from ..conftest import RedisServer

#: The history limit of every store in the suite, unless a test's marker says otherwise.
HISTORY_LIMIT = 100


@dataclass(frozen=True)
class Backend:
    """How the suite gets stores of one backend, and breaks them."""

    open: Callable[[pytest.FixtureRequest, int], AbstractContextManager[Store]]
    """``open(request, history_limit)``: a fresh, empty store, closed on exit."""
    reopen: Callable[[Store], Store]
    """Another client of the same store (what another process would open)."""
    corrupt_run: Callable[[Store, str, int, str], None]
    """``corrupt_run(store, entry, due, raw)``: the run's stored record becomes ``raw``
    (a JSON text, or not even that)."""
    corrupt_entry_field: Callable[[Store, str, str, str], None]
    """``corrupt_entry_field(store, entry, field, raw)``: one of the entry's stored fields
    (``anchor``, ``checkpoint``, ``token``) becomes ``raw``."""
    wipe: Callable[[Store], None]
    """The store loses everything (a restart without persistence, a FLUSHALL)."""
    restart: Callable[[Store], None]
    """The store's server restarts, with the data it had (as from a snapshot taken just
    before); returns once it answers again."""


# -- Redis --------------------------------------------------------------------------------
_redis_servers: weakref.WeakKeyDictionary[RedisStore, RedisServer] = (
    weakref.WeakKeyDictionary())


def _redis(store: Store) -> RedisStore:
    assert isinstance(store, RedisStore)
    return store


@contextlib.contextmanager
def _redis_open(request: pytest.FixtureRequest, history_limit: int) -> Iterator[Store]:
    # tests/conftest.py's private redis-server, running and flushed for this test.
    server: RedisServer = request.getfixturevalue("server")
    store = RedisStore.from_url(server.url, f"bc-contract-{uuid.uuid4().hex[:8]}",
                                history_limit)
    _redis_servers[store] = server
    try:
        yield store
    finally:
        store.close()


def _redis_reopen(store: Store) -> Store:
    s = _redis(store)
    server = _redis_servers[s]
    other = RedisStore.from_url(server.url, s.prefix, s.history_limit)
    _redis_servers[other] = server
    return other


def _redis_corrupt_run(store: Store, entry: str, due: int, raw: str) -> None:
    s = _redis(store)
    s.client.hset(s.entry_keys(entry)[1], str(due), raw)


def _redis_corrupt_entry_field(store: Store, entry: str, field: str, raw: str) -> None:
    s = _redis(store)
    s.client.hset(s.entry_keys(entry)[0], field, raw)


def _redis_wipe(store: Store) -> None:
    _redis(store).client.flushall()


def _redis_restart(store: Store) -> None:
    s = _redis(store)
    server = _redis_servers[s]
    s.client.save()  # the server comes back with this snapshot (it has no persistence)
    try:
        server.restart()  # returns once it answers
    finally:
        # Later restarts (other tests) must come back empty, as the server fixture says.
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(server.dir, "dump.rdb"))


BACKENDS: dict[str, Backend] = {
    "redis": Backend(open=_redis_open, reopen=_redis_reopen,
                     corrupt_run=_redis_corrupt_run,
                     corrupt_entry_field=_redis_corrupt_entry_field,
                     wipe=_redis_wipe, restart=_redis_restart),
}


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
