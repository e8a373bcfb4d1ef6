"""Redis only: how the Redis store talks to its server (scripts the server lost, a call that
could not connect, the shared anchoring instant across clients)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from beat_claims.stores.base import ClaimStatus, EntrySeed, StoreError
from beat_claims.stores.redis import RedisStore

from ..conftest import RedisServer
from .helpers import A, plan, register


@pytest.fixture
def redis_store(server: RedisServer) -> Iterator[RedisStore]:
    store = RedisStore.from_url(server.url, "bc-redis")
    yield store
    store.close()


def test_a_batch_survives_a_script_flush(redis_store: RedisStore, server: RedisServer) -> None:
    states = register(redis_store, *(f"e{i}" for i in range(30)))
    server.client().script_flush()
    results = redis_store.claim(A, [plan(s, s.anchor + 1000, entry=name)
                                    for name, s in states.items()])
    assert [r.status for r in results] == [ClaimStatus.OK] * 30
    assert all(len(r.claims) == 1 for r in results)


def test_a_call_that_could_not_connect_is_an_outage_and_leaves_nothing_queued(
        redis_store: RedisStore, server: RedisServer) -> None:
    """redis-py does not reset a pipeline whose connection failed; the store's reused
    pipeline must not send those commands with the next call (found by a chaos run: a beat
    crashed reading anchors after the store restarted)."""
    register(redis_store, "e")
    server.stop()
    with pytest.raises(StoreError):
        redis_store.claim(A, [plan(None, entry="e")])
    server.start()
    assert set(redis_store.register([EntrySeed("e"), EntrySeed("f")])) == {"e", "f"}


def test_entries_first_seen_by_clients_starting_together_share_their_anchor(
        redis_store: RedisStore, server: RedisServer) -> None:
    """Two beats registering overlapping halves (their batches interleave on the server)
    still anchor every entry first seen within ANCHOR_SHARED_MS at the same instant."""
    other = RedisStore.from_url(server.url, "bc-redis")
    names = [f"e{i}" for i in range(10)]
    first = register(redis_store, *names[:5])
    second = register(other, *names[5:], *names[:5])
    other.close()
    assert len({s.anchor for s in {**first, **second}.values()}) == 1
