"""The heartbeat's and the sweep's replies (one JSON string each) are read whatever the
store holds: names in any script, an encoding in the URL's query, bytes that are not UTF-8
and scores that are not finite written by something else. None of it stops a heartbeat,
and the other runs of the answer are still listed."""

from __future__ import annotations

import json
import logging

import pytest

from beat_claims.runs import Owner
from beat_claims.stores.base import EntrySeed, LiveQuery, Release
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer
from .contract.helpers import plan

ME = Owner(id="replies-me", host="replies-host", pid=4242, started_at=1.0)
GONE = Owner(id="replies-gone", host="replies-host", pid=4243, started_at=1.0)


def _due_runs(store: RedisStore, names: list[str]) -> None:
    """One run due again (claimed, then given back) in each of ``names``."""
    states = store.register([EntrySeed(n, f"every 1s ({n})") for n in names])
    store.heartbeat(GONE, 60)
    claims = []
    for result in store.claim(GONE, [plan(states[n], states[n].anchor + 1000, entry=n)
                                     for n in names]):
        claims += result.claims
    store.release(GONE, [Release(c) for c in claims])


def _query(now: int) -> LiveQuery:
    return LiveQuery(ME.id, frozenset({ME.id}), held_before=now - 60_000,
                     mine_before=now - 5000, dead_before=now - 5000)


def _swept(store: RedisStore) -> set[str]:
    """The entries with a run due again, as a heartbeat carrying the sweep lists them and
    as the sweep asked apart does (the two must agree)."""
    now = store.heartbeat(ME, 60).now
    hb = store.heartbeat(ME, 60, sweep=_query(now))
    assert hb.live is not None, "the sweep's answer came with the heartbeat"
    carried = {ref.entry for ref in hb.live.due}
    assert {ref.entry for ref in store.live_runs(_query(now)).due} == carried
    return carried


@pytest.mark.parametrize("query", ["", "?encoding=shift_jis"], ids=["utf-8", "shift_jis"])
def test_names_in_any_script_come_back_as_they_went(server: RedisServer, query: str) -> None:
    """(In Shift_JIS the second byte of 表 is a backslash: read in the URL's encoding, the
    JSON escape of it would land in the wrong place.)"""
    store = RedisStore.from_url(server.url + query, "replies")
    names = ["表", "ソ能", "naïve", 'quote"back\\slash/', "tab\tnewline\n", "emoji 🎉", "plain"]
    _due_runs(store, names)
    assert _swept(store) == set(names)
    assert ME.id in {o.owner.id for o in store.heartbeat(ME, 60).owners}
    store.close()


def test_bytes_that_are_not_utf_8_are_logged_once_and_stop_nothing(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    store = RedisStore.from_url(server.url, "replies")
    _due_runs(store, ["good"])
    raw = server.client()
    due_key = store._bucket_keys(0, "due")[0]
    raw.zadd(due_key, {b"1000|bad \xff\xfe name": 1})  # not UTF-8, by something else
    owners_key = store._heartbeat_keys[0]
    raw.hset(owners_key, b"intruder \xff", b"{\xfe}")
    with caplog.at_level(logging.ERROR, logger="celery.beat.claims"):
        for _ in range(3):
            swept = _swept(store)
            assert "good" in swept
            assert not [name for name in swept if name not in ("good", "bad \ufffd\ufffd name")]
    assert caplog.text.count("not UTF-8") == 1, caplog.text
    store.close()


def test_scores_that_are_not_finite_stop_no_heartbeat(server: RedisServer) -> None:
    store = RedisStore.from_url(server.url, "replies")
    _due_runs(store, ["good"])
    raw = server.client()
    raw.zadd(store._bucket_keys(0, "held")[0], {f"{GONE.id}|7|1000|ghost": "-inf"})
    raw.zadd(store._heartbeat_keys[1], {"forever": "+inf", "never": "-inf"})
    forever = Owner(id="forever", host="replies-host", pid=4244, started_at=1.0)
    raw.hset(store._heartbeat_keys[0], "forever", json.dumps(forever.as_dict()))
    assert _swept(store) == {"good"}
    hb = store.heartbeat(ME, 60)
    assert {o.owner.id for o in hb.owners if o.alive} == {ME.id, GONE.id}
    store.close()


def test_every_read_takes_bytes_that_are_not_utf_8(server: RedisServer) -> None:
    """Not only the heartbeat and the sweep: the owners (what a worker's probe and a beat's
    first contact read) and the open runs (the lost-run pass) read as well."""
    store = RedisStore.from_url(server.url, "replies")
    _due_runs(store, ["good"])
    raw = server.client()
    raw.hset(store._heartbeat_keys[0], b"intruder \xff", b"{\xfe}")
    raw.zadd(store._bucket_keys(0, "open")[0], {b"1000|bad \xff": 1})
    assert GONE.id in {o.owner.id for o in store.owners()}
    store.open_runs(before=store.now())  # no error; the bad member names no entry
    store.close()


@pytest.mark.parametrize("flush", ["FUNCTION", "SCRIPT"])
def test_a_heartbeat_sent_again_after_the_server_lost_the_scripts_reads_bad_bytes(
        server: RedisServer, flush: str) -> None:
    """The call the server refused (it lost the library, or the scripts) is sent again,
    its reply read as bytes as the first time."""
    store = RedisStore.from_url(server.url, "replies")
    _due_runs(store, ["good"])
    raw = server.client()
    raw.hset(store._heartbeat_keys[0], b"intruder \xff", b"{\xfe}")
    raw.zadd(store._bucket_keys(0, "due")[0], {b"1000|bad \xff": 1})
    if flush == "SCRIPT":
        store._no_functions("the test")  # calls by EVALSHA from here on
    raw.execute_command(flush, "FLUSH")
    assert "good" in _swept(store)
    store.close()
