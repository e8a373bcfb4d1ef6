"""The Redis store's scripts as one function library (FCALL): what FCALL changed.

Each test runs against a real redis-server the test owns (the configuration it sets must
not leak into the session's server)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from beat_claims.enums import RunState
from beat_claims.stores import redis as redis_store
from beat_claims.stores.base import Outcome, StoreError
from beat_claims.stores.redis import RedisStore, function_name, library_name

from .conftest import RedisServer, own_redis
from .contract.helpers import A, delivery, one_claim, process, query, register, send, started


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    with own_redis() as server:
        yield server


@pytest.fixture
def store(own_server: RedisServer) -> Iterator[RedisStore]:
    s = RedisStore.from_url(own_server.url, "bc-review")
    yield s
    s.close()


#: Server states in which Redis refuses write commands. A script called by EVALSHA (no
#: shebang) still runs, and fails only at its first write; a function registered without
#: flags is a write command, refused before it runs.
WRITES_REFUSED = {
    "out of memory": [("maxmemory-policy", "noeviction"), ("maxmemory", "1")],
    "not enough replicas": [("min-replicas-to-write", "1")],
}
DEFAULTS = {"maxmemory": "0", "maxmemory-policy": "noeviction", "min-replicas-to-write": "0"}


@pytest.mark.parametrize("refused", sorted(WRITES_REFUSED))
def test_a_duplicate_delivery_is_still_refused_while_the_server_refuses_writes(
        store: RedisStore, own_server: RedisServer, refused: str) -> None:
    """The worker's fence (start.lua) refuses a duplicate delivery of a finished run
    without writing anything, also on a server that refuses writes (OOM, NOREPLICAS). A
    function that may write is refused up front there: were that refusal the answer, the
    store would raise StoreError and the worker run the duplicate unfenced
    (worker._decide: 'deliveries run unfenced'). The call goes again by EVALSHA."""
    c = one_claim(store, A)
    send(store, A, c)
    started(store, c, process(1))
    assert store.finish([Outcome(c.entry, c.due, c.token, RunState.DONE)]) == [True]
    client = own_server.client()
    for name, value in WRITES_REFUSED[refused]:
        client.config_set(name, value)
    try:
        try:
            decision = store.start(delivery(c, process(2)))  # the same message, again
        except StoreError as exc:
            pytest.fail(f"the fence did not answer ({exc}): the duplicate runs unfenced")
    finally:
        for name, _ in WRITES_REFUSED[refused]:
            client.config_set(name, DEFAULTS[name])
    assert not decision.ok, decision


@pytest.fixture
def library_caches() -> Iterator[None]:
    """The library's cached text and names are computed again after the test."""
    cached = (redis_store._library, redis_store.library_name, redis_store.function_name,
              redis_store._script_of)
    for f in cached:
        f.cache_clear()
    yield
    for f in cached:
        f.cache_clear()


def test_a_version_that_registers_other_flags_loads_its_own_library(
        own_server: RedisServer, library_caches: None, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """library_name() digests the whole library, the flags each function is registered
    with and the register_function wrapper too: a later version that changes only the
    flags gets a name of its own, rather than finding the library 'already exists' (or not
    missing at all) and running the old flags on every server that already holds them."""
    first = RedisStore.from_url(own_server.url, "bc-review")
    try:
        register(first, "e")  # this version's library, loaded
        first.live_runs(query(A))
    finally:
        first.close()
    # The next version: 'live' is no longer flagged no-writes (any change of flags).
    monkeypatch.setattr(redis_store, "READ_ONLY_SCRIPTS",
                        redis_store.READ_ONLY_SCRIPTS - {"live"})
    for f in (redis_store._library, redis_store.library_name, redis_store.function_name,
              redis_store._script_of):
        f.cache_clear()
    second = RedisStore.from_url(own_server.url, "bc-review")
    try:
        second.live_runs(query(A))
    finally:
        second.close()
    [lib] = own_server.client().function_list(library=library_name())
    lib = dict(zip(lib[::2], lib[1::2]))  # (RESP2: flat name/value lists)
    flags = {d["name"]: set(d["flags"]) for d in (dict(zip(f[::2], f[1::2]))
                                                  for f in lib["functions"])}
    assert flags[function_name("live")] == set(), (
        f"{library_name()}: 'live' runs with the flags another version registered:"
        f" {flags[function_name('live')]}")


def test_without_evalsha_a_call_refused_for_writes_is_an_outage_not_a_credentials_error(
        ) -> None:
    """An ACL with the library's commands only: the call refused for writes cannot go by
    EVALSHA (NOPERM); it stays what it was, an outage (StoreError), never "the store
    refused the credentials" (a configuration error, which the worker does not catch)."""
    acl = ["--user", "default", "on", "nopass", "~*", "&*", "+@all", "-evalsha", "-eval",
           "-script"]
    with own_redis(acl) as server:
        s = RedisStore.from_url(server.url, "bc-review")
        try:
            c = one_claim(s, A)
            send(s, A, c)
            started(s, c, process(1))
            client = server.client()
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", "1")
            try:
                with pytest.raises(StoreError) as raised:
                    s.start(delivery(c, process(2)))
                assert "credentials" not in str(raised.value)
                assert s._functions
            finally:
                client.config_set("maxmemory", "0")
        finally:
            s.close()


def test_a_duplicate_is_refused_while_the_server_is_full_and_has_lost_the_library(
        store: RedisStore, own_server: RedisServer) -> None:
    """FUNCTION LOAD is a write, refused out of memory: the calls go by EVALSHA."""
    c = one_claim(store, A)
    send(store, A, c)
    started(store, c, process(1))
    assert store.finish([Outcome(c.entry, c.due, c.token, RunState.DONE)]) == [True]
    client = own_server.client()
    client.function_flush()
    client.script_flush()
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")
    try:
        decision = store.start(delivery(c, process(2)))
    finally:
        client.config_set("maxmemory", "0")
    assert not decision.ok, decision
    assert store._functions  # (loaded at the next call that finds it missing)
