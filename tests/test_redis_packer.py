"""The store's command packer writes exactly the bytes redis-py's would, for every kind of
argument redis-py takes, and refuses what redis-py refuses; the store's clients use it
(without hiredis), and their commands reach a real server intact."""

from __future__ import annotations

import enum

import pytest
from redis._parsers.encoders import Encoder
from redis.connection import PythonRespSerializer
from redis.exceptions import DataError

from beat_claims.stores import redis_packer
from beat_claims.stores.base import ClaimPlan, ClaimStatus
from beat_claims.stores.redis import RedisStore
from beat_claims.stores.redis_client import connect
from beat_claims.stores.redis_packer import Packed, RespPacker, takes_packed

from .conftest import RedisServer
from .contract.helpers import A, register, sending


class Color(str, enum.Enum):
    RED = "red"


COMMANDS = [
    ("GET", "key"),
    ("CONFIG GET", "maxmemory"),
    (b"CONFIG GET", b"maxmemory"),
    ("SET", "k", ""),
    ("FCALL", "f", 2, b"{p}:a", b"{p}:b", "owner", 1796171293865, -5, 0, 1.5, 2.0e-3),
    ("SET", "ünïcödé", "名前"),
    ("SET", memoryview(b"view"), bytearray(b"array")),
    ("SET", Color.RED, "x" * 100_000),  # longer than redis-py's buffer cutoff
    ("HSET", "h", *[f"f{i}" for i in range(300)]),
]


def _redis_py(command: tuple[object, ...]) -> bytes | type[Exception]:
    try:
        packed = PythonRespSerializer(6000, Encoder("utf-8", "strict", True).encode).pack(
            *command)
    except DataError:
        return DataError
    return b"".join(packed)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: str(c[0]))
def test_the_packer_writes_what_redis_py_writes(command: tuple[object, ...]) -> None:
    """(bytearray: redis-py 8 takes it, 5 to 7 refuse it; the packer does as the one
    installed does.)"""
    theirs = _redis_py(command)
    if theirs is DataError:
        with pytest.raises(DataError):
            RespPacker().pack(*command)
    else:
        assert b"".join(RespPacker().pack(*command)) == theirs


@pytest.mark.parametrize("bad", [True, None, object(), [1]],
                         ids=["bool", "None", "object", "list"])
def test_the_packer_refuses_what_redis_py_refuses(bad: object) -> None:
    with pytest.raises(DataError, match="Invalid input of type"):
        RespPacker().pack("SET", "k", bad)


def test_a_store_client_packs_with_it_and_its_commands_arrive_intact(
        server: RedisServer) -> None:
    client = connect(server.url)
    packer = client.connection_pool.connection_kwargs.get("command_packer")
    if redis_packer._PACKS_IN_C:
        assert packer is None, "with hiredis, redis-py's own packer (in C) is faster"
    else:
        assert isinstance(packer, RespPacker)
    values = {f"f{i}": f"välue {i}" for i in range(200)}
    client.hset("h", mapping=values)
    assert client.hgetall("h") == values
    assert client.execute_command("ECHO", 12345) == "12345"
    client.close()


def test_a_store_client_is_utf_8_whatever_the_url_says(server: RedisServer) -> None:
    """The store's URL is often the broker's: an encoding in its query is not the store's
    (its scripts and JSON records are UTF-8)."""
    client = connect(server.url + "?encoding=shift_jis")
    client.set("名前", "表ソ能")
    assert server.client().get("名前".encode()) == "表ソ能"
    assert client.get("名前") == "表ソ能"
    client.close()


def test_arguments_already_in_the_protocol_are_sent_as_they_are(server: RedisServer) -> None:
    """A run of keys of one length (a rebuild sweep's, made by the server) is joined once,
    not packed key by key: the same bytes as the keys one by one, and a client of the
    store's own pool takes it."""
    keys = [b"{p:%02d}:e:%020x" % (i % 16, i) for i in range(50)]
    run = Packed.of_one_length(b"\n".join(keys), len(keys), len(keys[0]))
    assert RespPacker().pack("FCALL", "f", len(keys), run, "x") == RespPacker().pack(
        "FCALL", "f", len(keys), *keys, "x")
    client = connect(server.url)
    assert takes_packed(client) is not redis_packer._PACKS_IN_C
    if takes_packed(client):
        client.mset({k: "1" for k in keys[:10]})
        assert client.execute_command("DEL", run) == 10
    client.close()


@pytest.mark.parametrize("prefix", ["beat-claims", "100% ü {x}:%s"])
def test_an_entrys_keys_made_in_one_step_are_the_bytes_of_its_keys_one_by_one(
        server: RedisServer, prefix: str) -> None:
    """A claim, its check and its sent mark pass the entry's eleven keys as one argument
    already in the protocol (whatever the prefix holds): the bytes of the keys one by one,
    and the scripts find the entry by them."""
    store = RedisStore.from_url(server.url, prefix)
    try:
        for name in ["e", "名前 %s %d", *(f"entry-{i}" for i in range(100))]:
            keys, encoded = store._entry_head(name)
            assert encoded == name.encode()
            one_by_one = RespPacker().pack("X", *(k.encode() for k in store.entry_keys(name)))
            assert RespPacker().pack("X", *keys) == one_by_one
        state = register(store, "名前 %s %d")["名前 %s %d"]
        [result] = store.claim(A, [ClaimPlan("名前 %s %d", state, (state.anchor + 1000,))])
        assert result.status is ClaimStatus.OK and len(result.claims) == 1, result
        assert store.record_sent(A, [sending(store, A, result.claims[0])]) == 1
    finally:
        store.close()
