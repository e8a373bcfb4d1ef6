"""The Redis backend of the contract suite: a private redis-server (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import os
import uuid
import weakref
from collections.abc import Callable, Iterator

import pytest
import redis

from beat_claims.stores.base import Store, WorkerProcess
from beat_claims.stores.redis import RedisStore

from ..conftest import RedisServer
from .backend import Backend, counting

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


def _redis_drop_next_due(store: Store, entry: str) -> None:
    s = _redis(store)
    s.client.hdel(s.entry_keys(entry)[0], "next_due")
    s.client.zrem(s.index_key(entry), entry)


def _redis_drop_entry_record(store: Store, entry: str) -> None:
    s = _redis(store)
    s.client.delete(s.entry_keys(entry)[0])


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


#: A copy of a store's keys: (key, its DUMP, its ttl in ms or 0).
Keys = list[tuple[bytes, bytes, int]]


def copy_keys(clients: list[redis.Redis], prefix: str) -> Keys:
    """Every key of the store (``{prefix}`` and its buckets ``{prefix:NN}``) on these
    servers, dumped (``clients`` answer bytes)."""
    out = []
    for client in clients:
        for key in client.scan_iter(match=f"{{{prefix}*", count=1000):
            dump, ttl = client.dump(key), client.pttl(key)
            if dump is not None:
                out.append((key, dump, max(0, ttl)))
    return out


def put_keys_back(clients: list[redis.Redis], prefix: str, keys: Keys,
                  client_of: Callable[[bytes], redis.Redis]) -> None:
    """The store's keys as ``keys`` holds them, one by one (``RESTORE``): every key of the
    store removed first."""
    for client in clients:
        for key in list(client.scan_iter(match=f"{{{prefix}*", count=1000)):
            client.delete(key)
    for key, dump, ttl in keys:
        client_of(key).restore(key, ttl, dump, replace=True)


def _redis_copy(store: Store) -> Callable[[], None]:
    s = _redis(store)
    client = redis.Redis(port=_redis_servers[s].port)
    keys = copy_keys([client], s.prefix)
    return lambda: put_keys_back([client], s.prefix, keys, lambda key: client)


BACKEND = Backend(open=_redis_open, reopen=_redis_reopen, corrupt_run=_redis_corrupt_run,
                  corrupt_entry_field=_redis_corrupt_entry_field, wipe=_redis_wipe,
                  restart=_redis_restart,
                  corrupt_worker_record=_redis_corrupt_worker_record, copy=_redis_copy,
                  drop_next_due=_redis_drop_next_due,
                  drop_entry_record=_redis_drop_entry_record,
                  round_trips=lambda store: counting(store, "_round_trip"))
