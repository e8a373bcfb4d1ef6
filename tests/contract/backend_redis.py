"""The Redis backend of the contract suite: a private redis-server (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import os
import uuid
import weakref
from collections.abc import Iterator

import pytest

from beat_claims.stores.base import Store, WorkerProcess
from beat_claims.stores.redis import RedisStore

from ..conftest import RedisServer
from .backend import Backend

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


def _redis_corrupt_worker_record(store: Store, process: WorkerProcess, raw: str) -> None:
    s = _redis(store)
    s.client.set(s.worker_key(process), raw, keepttl=True)


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


BACKEND = Backend(open=_redis_open, reopen=_redis_reopen, corrupt_run=_redis_corrupt_run,
                  corrupt_entry_field=_redis_corrupt_entry_field, wipe=_redis_wipe,
                  restart=_redis_restart,
                  corrupt_worker_record=_redis_corrupt_worker_record)
