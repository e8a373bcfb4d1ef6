"""Redis only: how the Redis store talks to its server (the library or the scripts the
server lost, a server that takes no functions, a call that could not connect, the shared
anchoring instant across clients); a member of a bucket's due index whose entry is gone
(keys put back one by one) is answered without a state, and leaves the index at its
entry's next index write."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from beat_claims.beat.sweeper import REBUILD_PAUSE, REBUILD_READS
from beat_claims.enums import Origin
from beat_claims.stores.base import (
    CheckVerdict,
    ClaimStatus,
    DefinitionWrite,
    EntrySeed,
    EntryState,
    IndexWrite,
    StoreError,
)
from beat_claims.stores.redis import RedisStore, _NotRun, digest, library_name

from ..conftest import RedisServer, own_redis, seed_settled_epoch
from ..inprocess import make, make_app, occurrences_sent, run_for
from .helpers import A, above_clock, check, plan, query, rebuild_pass, register, send

#: Servers that take no functions, each as redis-server's options: an ACL without
#: FUNCTION and FCALL; FCALL not a command at all (as before Redis 7.0); an ACL that runs
#: functions but does not let this user load them.
NO_FUNCTIONS = {
    "acl without functions": ["--user", "default", "on", "nopass", "~*", "&*", "+@all",
                              "-function", "-fcall", "-fcall_ro"],
    "no FCALL command": ["--rename-command", "FCALL", ""],
    "acl without FUNCTION LOAD": ["--user", "default", "on", "nopass", "~*", "&*", "+@all",
                                  "-function"],
}


@pytest.fixture
def redis_store(server: RedisServer) -> Iterator[RedisStore]:
    store = RedisStore.from_url(server.url, "bc-redis")
    yield store
    store.close()


@pytest.fixture(params=sorted(NO_FUNCTIONS))
def no_functions(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    with own_redis(NO_FUNCTIONS[request.param]) as server:
        yield server


def script_calls(server: RedisServer, command: str) -> tuple[int, int]:
    """``command``'s calls (``fcall``, ``evalsha``) that ran, and those that failed."""
    stats = server.client().info("commandstats").get(f"cmdstat_{command}", {})
    calls, failed = int(stats.get("calls", 0)), int(stats.get("failed_calls", 0))
    return calls - failed, failed


def test_scripts_run_as_one_library_of_functions() -> None:
    """On Redis 7, every call is an FCALL of this version's library, loaded once. (A
    server of the test's own: the server-wide counts must not take in a call from what an
    earlier test left running against the session's server.)"""
    with own_redis() as server:
        redis_store = RedisStore.from_url(server.url, "bc-redis")
        try:
            server.client().function_flush()
            server.client().config_resetstat()
            states = register(redis_store, *(f"e{i}" for i in range(30)))
            results = redis_store.claim(A, [plan(s, s.anchor + 1000, entry=name)
                                            for name, s in states.items()])
            for r in results:
                send(redis_store, A, r.claims[0])
            # register (and its anchoring instant), check, sent: once each; the claims: one
            calls = server.client().info("commandstats")
            assert script_calls(server, "fcall")[0] == 30 * 3 + 1 + 1, calls
            assert script_calls(server, "evalsha") == (0, 0)
            assert calls["cmdstat_function|load"]["calls"] == 1
            assert server.client().function_list(library=library_name())
        finally:
            redis_store.close()


def test_a_key_of_another_type_fails_only_its_entry_of_a_call_for_many(
        redis_store: RedisStore, server: RedisServer) -> None:
    """The claims of many entries are one script call, and so are their sent marks: an
    entry whose script raises (a key of another type where its history is) is answered
    corrupt, not sent, and the entries before and after it in the same call are claimed
    and marked as if alone."""
    names = [f"e{i}" for i in range(5)]
    states = register(redis_store, *names)
    server.client().set(redis_store.entry_keys("e2")[2], "not a sorted set")
    server.client().config_resetstat()
    results = redis_store.claim(A, [plan(s, s.anchor + 1000, entry=name)
                                    for name, s in states.items()])
    assert script_calls(server, "fcall") == (1, 0)  # one call for the five
    statuses = {r.entry: r.status for r in results}
    assert statuses == {**{n: ClaimStatus.OK for n in names}, "e2": ClaimStatus.CORRUPT}
    corrupt = next(r for r in results if r.entry == "e2")
    assert "WRONGTYPE" in (corrupt.detail or ""), corrupt.detail
    claims = [r.claims[0] for r in results if r.entry != "e2"]
    for c in claims:
        assert check(redis_store, A, c).verdict is CheckVerdict.SEND
    server.client().config_resetstat()
    assert redis_store.record_sent(A, claims) == 4
    assert script_calls(server, "fcall") == (1, 0)  # one call for the four marks


def test_a_heartbeat_reads_the_change_feed_in_its_round_trip(
        redis_store: RedisStore, server: RedisServer) -> None:
    """An idle beat reads the definitions' change feed at each heartbeat: on one server
    its page rides in the heartbeat's round trip (its script after the heartbeat's), the
    page the feed answers from that cursor."""
    cursor = redis_store.changes(None).cursor
    redis_store.write_definitions([DefinitionWrite("e", '{"task": "t"}', 0, Origin.API,
                                                   "ops")])
    calls = server.client().info("commandstats")["cmdstat_fcall"]["calls"]
    hb = redis_store.heartbeat(A, 10, changes=cursor)
    # heartbeat and change feed: one script each (and the definition changed, read after)
    assert server.client().info("commandstats")["cmdstat_fcall"]["calls"] - calls == 2
    assert hb.changes is not None and [d.name for d in hb.changes.changed] == ["e"]
    assert hb.changes == redis_store.changes(cursor)
    assert redis_store.heartbeat(A, 10).changes is None  # (not asked)


def test_a_rebuild_page_looks_at_thousands_of_entries_in_two_script_calls(
        redis_store: RedisStore, server: RedisServer) -> None:
    """A rebuild sweep's page (what an idle beat looks at, a page a sweep) is one HSCAN
    step of the registry of up to REGISTRY_SCAN entries, made into the entries' keys and
    read on the server: two script calls and one read of the names found, not a command
    or a reply an entry; an entry without a next_due is still answered."""
    names = [f"e{i}" for i in range(3000)]
    for start in range(0, len(names), 1000):
        register(redis_store, *names[start:start + 1000])
    for name in ("e7", "e2999"):
        server.client().hdel(redis_store.entry_keys(name)[0], "next_due")
    server.client().config_resetstat()
    page = redis_store.unindexed(1000)
    assert sorted(page.names) == ["e2999", "e7"] and page.complete
    assert script_calls(server, "fcall") == (2, 0)  # (the HSCAN and HMGETs run inside)
    stats = server.client().info("commandstats")
    assert stats["cmdstat_hmget"]["calls"] == 3000 + 1  # (the names: one read)


def test_an_idle_read_of_the_due_index_and_its_next_instant_is_one_script_call(
        redis_store: RedisStore, server: RedisServer) -> None:
    """An idle beat reads the due index once a heartbeat interval: what falls due soon
    (nothing) and when the next entry comes, in one script call over the buckets'
    indexes, not one for each and a third for that entry's state, which it does not use."""
    states = register(redis_store, "a", "b")
    assert redis_store.index([IndexWrite(n, s, 0, 5000) for n, s in states.items()]) == [
        True, True]
    server.client().config_resetstat()
    ahead = redis_store.due_ahead(4000, 1000, (3000, "z"))
    assert (ahead.entries, ahead.beyond) == ([], 5000)
    assert script_calls(server, "fcall") == (1, 0)


def test_a_rebuild_pass_reads_at_most_rebuild_reads_records_a_sweep(
        server: RedisServer) -> None:
    """A Redis store's rebuild pass reads every entry's record, 10,000 a page: a page that
    indexed nothing is followed by a sweep for each REBUILD_READS records it read, and a
    pass that indexed nothing by REBUILD_PAUSE sweeps at least, so that an idle beat reads
    as much a minute whatever the number of entries (a page every sweep read 2.8x as much
    a minute at 1,000,000 entries as at 10,000), and an entry left without next_due is
    still indexed within those sweeps and a pass."""
    entries = 36_000  # a pass of four pages: 10,000, 10,000, 10,000 and 6,000
    beat = make(make_app(server, schedule={}))
    try:
        for start in range(0, entries, 4000):
            beat.store.register([EntrySeed(f"e{i}") for i in range(start, start + 4000)])
        client = server.client()

        def scans() -> int:
            return int(client.info("commandstats").get("cmdstat_hscan", {}).get("calls", 0))

        per_page = 10_000 // REBUILD_READS
        scanned: list[bool] = []
        for _ in range(2 * 4 * (per_page + 1)):
            before = scans()
            beat.index_keeper.sweep()
            scanned.append(scans() > before)
        seen = "".join("p" if s else "." for s in scanned)
        waits = [len(w) for w in seen.strip(".").split("p")[1:-1]]
        assert len(waits) >= 5 and set(waits) == {max(per_page, REBUILD_PAUSE)}, seen
        assert "pp" not in seen  # (a page a sweep at most, and never two in a row)
        records_a_sweep = entries / (4 * (per_page + 1))
        assert records_a_sweep <= REBUILD_READS, seen
    finally:
        beat.close()


def drop_next_due(server: RedisServer, store: RedisStore, names: list[str]) -> None:
    """``names`` have no next_due at all (a store from before the due index)."""
    pipe = server.client().pipeline(transaction=False)
    for name in names:
        pipe.hdel(store.entry_keys(name)[0], "next_due")
        pipe.zrem(store.index_key(name), name)
    pipe.execute()


def test_a_rebuild_pass_reads_each_record_once_however_many_have_no_next_due(
        redis_store: RedisStore, server: RedisServer) -> None:
    """Half the entries have no next_due, every other one: a pass of pages of 1,000 names
    (some five a step of 10,000 entries) reads each entry's record once on the server, a
    page going on right after the record the one before it read last, and a page's
    ``looked_at`` (what the beat paces the pass by) is what it read (each page read the
    rest of its step: 32,051 records for 12,000)."""
    names = [f"e{i}" for i in range(12_000)]
    for start in range(0, len(names), 4000):
        register(redis_store, *names[start:start + 4000])
    drop_next_due(server, redis_store, names[::2])
    server.client().config_resetstat()
    pages = rebuild_pass(redis_store, 1000)
    assert sorted(name for page in pages for name in page.names) == sorted(names[::2])
    looked_at = [page.looked_at for page in pages]
    reads = server.client().info("commandstats")["cmdstat_hmget"]["calls"] - sum(
        1 for page in pages if page.names)  # (the names found: one read a page)
    assert reads == sum(looked_at) == len(names), (reads, looked_at)


def pass_answers(store: RedisStore, limit: int, between: Callable[[], None]) -> list[str]:
    """Every name a rebuild pass of pages of ``limit`` answers, ``between()`` called
    between each two pages."""
    answered: list[str] = []
    cursor, pages = "", 0
    while True:
        page = store.unindexed(limit, cursor)
        answered += page.names
        pages += 1
        if page.complete:
            return answered
        assert pages < 1000, page
        between()
        cursor = page.cursor


def test_a_rebuild_pass_answers_every_entry_unindexed_throughout_it_as_the_registry_resizes(
        redis_store: RedisStore, server: RedisServer) -> None:
    """A page ends inside a step of the registry's HSCAN once it found ``limit`` names, and
    the next page reads that step again: the registry resized in between (2,000 entries
    registered, then pruned, between each two pages: it grows to 4,096 slots and back)
    holds the step's entries in another order. Every entry without next_due throughout
    the pass is answered within it (the pass ends at the first page that says so). The
    entries share a bucket: each page goes on inside the same one."""
    names = [n for n in (f"e{i}" for i in range(10_000))
             if redis_store._tag(n)[0] == redis_store._tag("e0")[0]][:300]
    register(redis_store, *names)
    drop_next_due(server, redis_store, names)
    client = server.client()
    others = [digest(f"other{i}") for i in range(2000)]

    def resized() -> None:
        pipe = client.pipeline(transaction=False)
        for other in others:
            pipe.hset(redis_store._registry, other, "registered meanwhile")
        pipe.hdel(redis_store._registry, *others)
        pipe.execute()

    missing = sorted(set(names) - set(pass_answers(redis_store, 5, resized)))
    assert not missing, (len(missing), missing[:10])


def test_a_rebuild_pass_answers_every_entry_unindexed_throughout_it_as_the_registry_shrinks(
        redis_store: RedisStore, server: RedisServer) -> None:
    """A registry of 42,000 entries, over several HSCAN steps, 1,500 of them pruned between
    each two pages: a step read again from the same cursor may end later than it did (the
    registry shrank), holding entries the first reading did not. Each of the 2,000 entries
    without next_due throughout the pass is answered within it."""
    names = [f"e{i}" for i in range(2000)]
    for start in range(0, len(names), 1000):
        register(redis_store, *names[start:start + 1000])
    drop_next_due(server, redis_store, names)
    client = server.client()
    others = [digest(f"other{i}") for i in range(40_000)]
    for start in range(0, len(others), 10_000):
        client.hset(redis_store._registry, mapping=dict.fromkeys(
            others[start:start + 10_000], "registered, to be pruned"))

    def pruned() -> None:
        if others:
            client.hdel(redis_store._registry, *others[-1500:])
            del others[-1500:]

    missing = sorted(set(names) - set(pass_answers(redis_store, 50, pruned)))
    assert not missing, (len(missing), missing[:10])


def test_a_rebuild_pass_over_entries_no_beat_can_index_keeps_its_pace(
        server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Half the entries have no next_due and no live beat can index them (no schedule has
    them): the pass ends a page at each 1,000 of them, each followed by a sweep for each
    REBUILD_READS records it read, so that the pass with its pause takes a sweep for each
    page and for each REBUILD_READS entries, and REBUILD_PAUSE at most after its last
    page: 96 sweeps over 20,000 entries (each page read the rest of its step and paused
    for it: some 60,000 records read, 216 to 219 sweeps)."""
    entries = 20_000
    beat = make(make_app(server, schedule={}))
    try:
        store = beat.store
        assert isinstance(store, RedisStore)
        names = [f"e{i}" for i in range(entries)]
        for start in range(0, entries, 4000):
            store.register([EntrySeed(name) for name in names[start:start + 4000]])
        drop_next_due(server, store, names[::2])
        # The registry grew past 16,384 entries: its table rehashes a step a command on it,
        # and a step of HSCAN read again meanwhile ends where the earliest reading ended,
        # reading again records past it (a few, at times). Read once a pass is a registry
        # whose table stays as it is: every bucket moved first.
        settle = server.client().pipeline(transaction=False)
        for _ in range(40_000):
            settle.hexists(store._registry, "")
        settle.execute()
        pages: list[tuple[str, int, bool]] = []  # each page's cursor, looked_at, complete
        unindexed = store.unindexed

        def observed(limit: int, cursor: str = "") -> Any:
            page = unindexed(limit, cursor)
            pages.append((cursor, page.looked_at, page.complete))
            return page

        monkeypatch.setattr(store, "unindexed", observed)
        sweeps = 0  # from the pass's first page to the next pass's
        while [cursor for cursor, _, _ in pages].count("") < 2:
            assert sweeps < 2000, pages
            beat.index_keeper.sweep()
            sweeps += 1 if pages else 0
        pass_pages = pages[:-1]
        assert pass_pages[-1][2] and not any(c for _, _, c in pass_pages[:-1]), pages
        # (pages: one a step of 10,000 entries, and one for each 1,000 left)
        assert len(pass_pages) <= entries / 10_000 + entries / 2 / 1000 + 2, pages
        # (a pass's last page is followed by REBUILD_PAUSE sweeps at least)
        bound = len(pass_pages) + entries / REBUILD_READS + REBUILD_PAUSE
        assert sweeps - 1 <= bound, (sweeps - 1, bound, pages)
        assert sum(n for _, n, _ in pass_pages) == entries, pages
    finally:
        beat.close()


def test_a_batch_survives_a_function_flush(redis_store: RedisStore,
                                           server: RedisServer) -> None:
    """A restart without persistence or FUNCTION FLUSH: the calls refused are sent again
    once the library is loaded, each run once."""
    states = register(redis_store, *(f"e{i}" for i in range(30)))
    server.client().function_flush()
    server.client().config_resetstat()
    results = redis_store.claim(A, [plan(s, s.anchor + 1000, entry=name)
                                    for name, s in states.items()])
    assert [r.status for r in results] == [ClaimStatus.OK] * 30
    assert all(len(r.claims) == 1 for r in results)
    # one call for the 30 claims: refused once (not found), then run once
    assert script_calls(server, "fcall") == (1, 1)


def test_a_library_another_process_loaded_meanwhile_is_used(redis_store: RedisStore,
                                                            server: RedisServer) -> None:
    """Two beats find the library missing at once: the second one's load is refused (it
    exists), and that is no reason to give up functions."""
    server.client().config_resetstat()  # (calls counted from here: the server may be shared)
    register(redis_store, "e")
    redis_store._mend({_NotRun.NO_FUNCTION}, redis_store.client.pipeline())
    redis_store._mend({_NotRun.NO_FUNCTION}, redis_store.client.pipeline())
    assert redis_store._functions
    register(redis_store, "f")
    assert script_calls(server, "evalsha") == (0, 0)


def test_a_server_out_of_memory_is_an_outage_for_a_claim_and_the_claim_never_ran(
        server: RedisServer) -> None:
    """Refused before it started (a function may write): sent again by EVALSHA, which
    fails at its first write; nothing was written, and the claim made afterwards is the
    first (the floor's next token)."""
    store = RedisStore.from_url(server.url, "bc-redis")
    client = server.client()
    try:
        states = register(store, "e")
        floor = above_clock(store)  # (a token the refused call took would show)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")
        try:
            with pytest.raises(StoreError, match=r"OutOfMemory|OOM"):
                store.claim(A, [plan(states["e"], states["e"].anchor + 1000, entry="e",
                                     token_floor=floor)])
        finally:
            client.config_set("maxmemory", "0")
        [result] = store.claim(A, [plan(states["e"], states["e"].anchor + 1000, entry="e",
                                        token_floor=floor)])
        assert result.status is ClaimStatus.OK
        assert [c.token for c in result.claims] == [floor + 1]
        assert store._functions  # (a refusal to write says nothing of functions)
    finally:
        client.config_set("maxmemory", "0")
        store.close()


def test_a_server_that_takes_no_functions_is_sent_scripts(
        no_functions: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """Redis before 7.0, or an ACL without functions: the calls it refused did not run;
    they are sent again by EVALSHA, each run once, and every call after too. Said once."""
    store = RedisStore.from_url(no_functions.url, "bc-redis")
    try:
        with caplog.at_level(logging.INFO, logger="celery.beat.claims"):
            states = register(store, *(f"e{i}" for i in range(30)))
            results = store.claim(A, [plan(s, s.anchor + 1000, entry=name)
                                      for name, s in states.items()])
            assert [r.status for r in results] == [ClaimStatus.OK] * 30
            assert [len(r.claims) for r in results] == [1] * 30
            for r in results:
                send(store, A, r.claims[0])
            hb = store.heartbeat(A, 10, sweep=query(A, live=(A,), mine_before=1))
            assert hb.live is not None and hb.live.complete
        # register (and its anchoring instant), check, sent; one call for the 30 claims; a
        # heartbeat, a sweep
        assert script_calls(no_functions, "evalsha") == (30 * 3 + 1 + 1 + 2, 0)
        assert script_calls(no_functions, "fcall")[0] == 0
        said = [r for r in caplog.records if "EVALSHA" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in said]
    finally:
        store.close()


def test_a_beat_on_a_server_without_functions_sends_each_occurrence_once(
        no_functions: RedisServer) -> None:
    app = make_app(no_functions, {
        f"every-1s-{i}": {"task": "t.noop", "schedule": timedelta(seconds=1)}
        for i in range(5)})
    s = make(app)
    try:
        run_for(3.5, s)
    finally:
        s.close()
    sent = occurrences_sent(no_functions)
    assert len(sent) >= 10
    assert len(sent) == len(set(sent))


def test_a_batch_survives_a_script_flush(no_functions: RedisServer) -> None:
    """By EVALSHA (a server that takes no functions): the scripts are loaded again."""
    store = RedisStore.from_url(no_functions.url, "bc-redis")
    try:
        states = register(store, *(f"e{i}" for i in range(30)))
        no_functions.client().script_flush()
        results = store.claim(A, [plan(s, s.anchor + 1000, entry=name)
                                  for name, s in states.items()])
        assert [r.status for r in results] == [ClaimStatus.OK] * 30
        assert all(len(r.claims) == 1 for r in results)
        assert script_calls(no_functions, "evalsha")[1] == 1  # NOSCRIPT once (one call)
    finally:
        store.close()


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


def test_the_redis_store_checks_new_claims_with_their_claim(redis_store: RedisStore) -> None:
    """SendAtOnce is honoured here (one script call a run fewer in a burst), and a beat
    sending a burst asks for it: its scripts are claim and sent, no check."""
    from .test_send_at_once import claim_at_once

    result = claim_at_once(redis_store, 1000, 2000)
    assert [c.verdict for c in result.checked] == [CheckVerdict.SEND] * 2
    assert [c.claim for c in result.checked] == list(result.claims)


def count_checks(s: Any) -> list[int]:
    """The number of runs in each check call the beat ``s`` makes (the store's own)."""
    asked: list[int] = []
    check = s.store.check

    def counting(owner: Any, checks: Any) -> Any:
        asked.append(len(checks))
        return check(owner, checks)

    s.store.check = counting
    return asked


def test_a_burst_is_sent_without_a_check_call_of_its_own(server: RedisServer) -> None:
    """150 entries due at once, one beat (not claiming ahead: a chunk claimed ahead is
    checked when it is sent): every run is sent once, and the sender asks the store to
    check none of them."""
    app = make_app(server, {f"e{i}": {"task": "t.noop", "schedule": timedelta(seconds=1)}
                            for i in range(150)}, beat_claims_claim_ahead=False,
                   # (an answer of the claim counts for half an interval: a slow machine
                   # must not outlast it)
                   beat_claims_heartbeat_interval=2.0)
    seed_settled_epoch(server)  # (claims at once, not after a new store's TTL of 6 s)
    s = make(app)
    asked = count_checks(s)
    run_for(1.5, s)
    sent = occurrences_sent(server)
    assert len(sent) >= 150 and len(set(sent)) == len(sent)
    assert sum(asked) == 0, asked
    s.close()


def test_an_answer_of_the_claim_older_than_half_an_interval_is_asked_again(
        server: RedisServer) -> None:
    """A beat that stalled between its claim and its publish (taking in the claim's other
    results, a paused VM) asks the store again: another beat may hold the run by then."""
    app = make_app(server, {f"e{i}": {"task": "t.noop", "schedule": timedelta(seconds=1)}
                            for i in range(3)}, beat_claims_claim_ahead=False,
                   beat_claims_heartbeat_interval=2.0)
    seed_settled_epoch(server)  # (claims at once, not after a new store's TTL of 6 s)
    s = make(app)
    asked = count_checks(s)
    send = s.sender.send

    def stalled(claims: Any, schedule: Any) -> None:
        for ref, (answer, _) in list(s.holdings.prechecked.items()):
            s.holdings.prechecked[ref] = (answer, 0.0)  # as if the claim began long ago
        send(claims, schedule)

    s.sender.send = stalled  # type: ignore[method-assign]
    run_for(1.5, s)
    sent = occurrences_sent(server)
    assert sent and len(set(sent)) == len(sent)
    assert sum(asked) >= len(sent), (asked, sent)
    s.close()


def test_a_due_index_member_whose_entry_is_gone_leaves_the_index_at_its_next_write(
        redis_store: RedisStore) -> None:
    state = register(redis_store, "e", "f")["e"]
    redis_store.client.delete(redis_store.entry_keys("e")[0])  # (its index member stays)
    found = {d.name: d for d in redis_store.due(redis_store.now(), 10)}
    assert found["e"].state is None and found["f"].state is not None
    assert redis_store.index([IndexWrite("e", state, 0, 5)]) == [False]
    assert [d.name for d in redis_store.due(redis_store.now(), 10)] == ["f"]
    assert redis_store.index([IndexWrite("e", EntryState(1, None), 0, 5)]) == [False]
