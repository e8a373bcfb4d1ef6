"""The heartbeat that carries the sweep (one round trip for an idle beat): what
its answer may and may not be used for, and what must never fail with it.

* Whatever fails the sweep's part never fails the heartbeat: a Redis Cluster with a bucket's
  slot being moved (TRYAGAIN for that bucket only) asks the sweep apart; on one server, an
  error in the sweep's replies (here an ACL that forbids the buckets) leaves the heartbeat
  standing, and the first heartbeat after an outage carries no sweep.
* The answer is for its own tick (not a later one, after settling), and only when the
  store's clock reads as the beat reckoned it (the cutoffs were computed before).
* Attacks that held: an owner that joined since the last heartbeat is judged by the fresh
  one (not taken back); a lost reply of the combined trip is an outage, nothing acted on;
  marks owed when the answer was read send nothing twice; the clock estimate stays within
  milliseconds with thousands of runs in the answer.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from redis.crc import key_slot

from beat_claims.beat.clock import StoreClock
from beat_claims.enums import RunState
from beat_claims.runs import Owner
from beat_claims.stores.base import (
    EntrySeed,
    LiveQuery,
    Release,
    Store,
    StoreConfigurationError,
    StoreError,
)
from beat_claims.stores.redis import RedisStore, function_name

from .conftest import RedisServer, seed_settled_epoch
from .contract.backend_redis_cluster import ClusterServers, cluster
from .contract.helpers import plan
from .faults import Proxy, proxy
from .inprocess import beats, make, make_app, occurrences_sent, run_for
from .processes import wait_for

ENTRY = "review-every-half-second"


@pytest.fixture(autouse=True)
def settled_store(request: pytest.FixtureRequest) -> None:
    """The store on the test's redis-server has run a while (a settled epoch): no test
    here is about a new store's start, and their beats claim at once rather than after
    the new epoch's settle period of a TTL (a store the test stops comes back new all the
    same)."""
    if "server" in request.fixturenames:
        seed_settled_epoch(request.getfixturevalue("server"))


@pytest.fixture
def cluster_servers(request: pytest.FixtureRequest) -> Iterator[ClusterServers]:
    c = cluster(request)
    c.ensure_running()
    c.flushall()
    yield c
    c.ensure_running()
    c.repair()


def test_an_open_bucket_slot_fails_only_the_sweep_not_the_heartbeat_nor_the_sends(
        server: RedisServer, cluster_servers: ClusterServers) -> None:
    app = make_app(server, {ENTRY: {"task": "t.noop",
                                    "schedule": timedelta(milliseconds=500)}},
                   beat_claims_url=cluster_servers.url,
                   beat_claims_key_prefix=f"bc-review-{uuid.uuid4().hex[:8]}",
                   beat_claims_heartbeat_interval=1.5)
    s = make(app)
    store = s.store
    assert isinstance(store, RedisStore) and not store.single_node
    run_for(2.0, s)
    assert occurrences_sent(server), "the beat sends before the slot is opened"

    # Open the slot of a bucket that is neither the entry's nor the global keys' one.
    mine = int(store._tag(ENTRY)[0][-3:-1])
    glob = key_slot(store._epoch.encode())
    bucket = next(b for b in range(16) if b != mine
                  and key_slot(store._bucket_keys(b, "due")[0].encode()) != glob)
    slot = key_slot(store._bucket_keys(bucket, "due")[0].encode())
    source = cluster_servers.node_of_slot(slot)
    target = next(n for n in cluster_servers.nodes if n.port != source.port)
    cluster_servers.move_slot(slot, target, finish=False)
    try:
        # The store: a heartbeat alone works; the sweep alone fails (TRYAGAIN); a heartbeat
        # asked to carry the sweep works, and leaves it to be asked apart.
        store.heartbeat(s.owner, 4.5)
        with pytest.raises(StoreError):
            store.live_runs(s.sweeper.query())
        assert store.heartbeat(s.owner, 4.5, sweep=s.sweeper.query()).live is None

        # The beat: the entry's own bucket is fine, so it should keep sending every 0.5 s
        # between two failed sweeps (and did before 5fd17ab).
        before = len(occurrences_sent(server))
        run_for(6.0, s)
        sent = len(occurrences_sent(server)) - before
        assert sent >= 6, (
            f"{sent} occurrence(s) sent in 6 s with a bucket slot open (12 due): every"
            f" heartbeat carried the failing sweep; store outage={s.store_outage.active}")
    finally:
        cluster_servers.finish_move(slot, target, source)
        s.close()


@pytest.fixture
def lossy(server: RedisServer) -> Iterator[Proxy]:
    with proxy(server.port) as p:
        yield p


def _capture_swept(s: Any) -> list[Any]:
    """Record what Liveness.take_swept hands the sweep (None: the sweep asked itself)."""
    seen: list[Any] = []
    real = s.liveness.take_swept

    def take() -> Any:
        found = real()
        seen.append(found)
        return found

    s.liveness.take_swept = take
    return seen


def test_a_claim_of_an_owner_that_joined_since_the_last_heartbeat_is_not_taken_back(
        server: RedisServer) -> None:
    app = make_app(server, beat_claims_reclaim_after=60)
    a = make(app)
    run_for(0.6, a)
    b = make(app)  # joins after A's last heartbeat (once it lapsed: A does not tick)
    b.sender.send = lambda claims, schedule: None  # type: ignore[method-assign]
    held = wait_for(lambda: [r for r in b.store.history("every-1s")
                             if r.state is RunState.CLAIMED and r.owner == b.owner.id],
                    10, "a claim held by B", interval=0.05, between=b.tick)[0]
    # A did not tick meanwhile: its owners are from before B; wait until B's claim is older
    # than one heartbeat interval (the query's dead_before), keeping B alive.
    wait_for(lambda: a.clock.now() > held.claimed_at + 700, 5, "B's claim to age",
             interval=0.05, between=b.tick)
    assert b.owner.id not in a.liveness.live_ids()
    a.liveness.lapse()
    a._last_sweep = float("-inf")
    query = a.sweeper.query()
    assert b.owner.id not in query.live_owners
    seen = _capture_swept(a)
    a.tick()  # heartbeat + sweep in one round trip, the answer used (B is alive now)
    assert b.owner.id in a.liveness.live_ids()
    assert seen and seen[0] is not None, "the answer that came with the heartbeat was used"
    assert (held.entry, held.due, b.owner.id) in {(h.entry, h.due, h.owner)
                                                  for h in seen[0].held}
    [now] = [r for r in a.store.history("every-1s") if r.due == held.due]
    assert now.owner == b.owner.id and now.reclaimed_from is None, now
    a.close()
    b.close()


def test_a_lost_reply_to_the_heartbeat_carrying_the_sweep(server: RedisServer,
                                                           lossy: Proxy) -> None:
    app_b = make_app(server, beat_claims_reclaim_after=60)
    app_a = make_app(server, beat_claims_reclaim_after=60, beat_claims_url=lossy.url())
    a, b = beats(app_a, app_b)
    b.sender.send = lambda claims, schedule: None  # type: ignore[method-assign]
    held = wait_for(lambda: [r for r in b.store.history("every-1s")
                             if r.state is RunState.CLAIMED and r.owner == b.owner.id],
                    10, "a claim held by B", interval=0.05, between=b.tick)[0]
    b.store.leave(b.owner)
    b._closed = True
    lossy.drop_reply_to(function_name("live"))  # only a heartbeat carrying the sweep (or a sweep)
    started = time.monotonic()
    wait_for(lambda: lossy.pending() == 0, 5, "the lost reply", interval=0.02,
             between=a.tick)

    def taken_back() -> bool:
        [r] = [r for r in a.store.history("every-1s") if r.due == held.due]
        return r.reclaimed_from == b.owner.id

    wait_for(taken_back, 3, "B's claim taken back", interval=0.02, between=a.tick)
    assert time.monotonic() - started < 1.5 + 0.5 + 1.0
    run_for(1.5, a)
    sent = Counter(occurrences_sent(server))
    assert {k: n for k, n in sent.items() if n > 1} == {}
    a.close()


def test_marks_owed_when_the_answer_was_read_send_nothing_twice(server: RedisServer) -> None:
    """The sent mark's call fails before it reaches the server (injected at the store
    method: the records in Redis are real and stay ``sending``), so the mark is owed."""
    a = make(make_app(server))
    run_for(0.8, a)
    real = a.store.record_sent
    failed: list[int] = []

    def record_sent(owner: Any, claims: Any) -> Any:
        if not failed:
            failed.append(len(claims))
            raise StoreError("injected: the sent mark never reached the server")
        return real(owner, claims)

    a.store.record_sent = record_sent  # type: ignore[method-assign]
    wait_for(lambda: failed and a.holdings.unmarked, 5, "a sent mark owed", interval=0.02,
             between=a.tick)
    owed = [c.ref for c in a.holdings.unmarked]
    history = {r.due: r for r in a.store.history("every-1s")}
    assert all(history[ref.due].state is RunState.SENDING for ref in owed)
    # Let the owed runs age past mine_before, then one tick: heartbeat + answer, then
    # flush_marks, then the sweep with the answer read before the marks were stored.
    owed_at = a.clock.now()  # they were checked (being sent) before this
    wait_for(lambda: a.clock.now() > owed_at + 600, 5, "the owed runs to age", interval=0.02)
    a.liveness.lapse()
    a._last_sweep = float("-inf")
    a.store_outage.up()  # as after a tick that went through without sweeping
    seen = _capture_swept(a)
    a.tick()
    assert not a.holdings.unmarked
    assert seen and seen[0] is not None, "the answer that came with the heartbeat was used"
    listed = {(h.entry, h.due) for h in seen[0].held if h.owner == a.owner.id}
    assert {(r.entry, r.due) for r in owed} <= listed, "the answer lists the owed runs"
    history = {r.due: r for r in a.store.history("every-1s")}
    for ref in owed:
        assert history[ref.due].state is RunState.SENT, history[ref.due]
        assert history[ref.due].reclaimed_from is None, history[ref.due]
    run_for(1.5, a)
    sent = Counter(occurrences_sent(server))
    assert {k: n for k, n in sent.items() if n > 1} == {}
    a.close()


BACKLOG = 3000
ME = Owner(id="review-me", host="review-host", pid=4242, started_at=1.0)
GONE = Owner(id="review-gone", host="review-host", pid=4243, started_at=1.0)


def _backlog(store: Store) -> None:
    names = [f"review-{i}" for i in range(BACKLOG)]
    states = {}
    for start in range(0, BACKLOG, 500):
        states.update(store.register([EntrySeed(n, f"every 1s ({n})")
                                      for n in names[start:start + 500]]))
    store.heartbeat(GONE, 60)
    claims = []
    for start in range(0, BACKLOG, 500):
        chunk = names[start:start + 500]
        for result in store.claim(GONE, [plan(states[n], states[n].anchor + 1000, entry=n)
                                         for n in chunk]):
            claims += result.claims
    store.release(GONE, [Release(c) for c in claims])


def _error_ms(store: Store, truth: Any, sweep: bool) -> tuple[float, float]:
    """How far behind the store's clock "now" is right after a heartbeat (as Liveness
    reckons it), and that heartbeat's round trip in ms: medians of 7."""
    errors, trips = [], []
    for _ in range(7):
        clock = StoreClock()
        hb0 = store.heartbeat(ME, 60)
        query = LiveQuery(ME.id, frozenset({ME.id}), held_before=hb0.now - 60_000,
                          mine_before=hb0.now - 5000, dead_before=hb0.now - 5000)
        asked = time.monotonic()
        hb = store.heartbeat(ME, 60, sweep=query if sweep else None)
        answered = time.monotonic()
        clock.set(hb.now, asked, answered)
        if sweep:
            assert hb.live is not None and len(hb.live.due) >= BACKLOG
        errors.append(truth() - clock.now())
        trips.append((answered - asked) * 1000)
    errors.sort()
    trips.sort()
    return errors[len(errors) // 2], trips[len(trips) // 2]


def _check(store: Store, truth: Any) -> None:
    """The estimate's bound is half the round trip (the store read its clock somewhere in
    it): a heartbeat carrying a sweep of thousands of runs keeps to it, however slow the
    machine makes that round trip. 2 ms for the whole-ms readings."""
    _backlog(store)
    alone, alone_trip = _error_ms(store, truth, sweep=False)
    carried, carried_trip = _error_ms(store, truth, sweep=True)
    print(f"\n{type(store).__name__}: clock behind by {alone:.1f} ms after a heartbeat"
          f" ({alone_trip:.1f} ms round trip), {carried:.1f} ms after a heartbeat carrying"
          f" the sweep ({carried_trip:.1f} ms)")
    for error, trip, what in ((alone, alone_trip, "a heartbeat"),
                              (carried, carried_trip, "a heartbeat that carried the sweep")):
        assert error <= trip / 2 + 2, (
            f"after {what}, 'now' is {error:.1f} ms behind the store's clock: more than half"
            f" its {trip:.1f} ms round trip")


def test_redis_clock_estimate_after_a_heartbeat_carrying_the_sweep(server: RedisServer
                                                                   ) -> None:
    store = RedisStore.from_url(server.url, "review-clock")
    client = server.client()

    def truth() -> int:
        sec, usec = client.time()
        return sec * 1000 + usec // 1000

    try:
        _check(store, truth)
    finally:
        store.close()


def test_an_error_in_the_sweeps_part_leaves_the_heartbeat_standing(server: RedisServer
                                                                     ) -> None:
    """One server, a user whose ACL allows the store's global keys but not its buckets: the
    sweep's scripts are refused (NOPERM), the heartbeat carrying them is not."""
    prefix = f"acl-{uuid.uuid4().hex[:6]}"
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "limited", "on", ">pw", "+@all",
                          f"~{{{prefix}}}:*")
    store = RedisStore.from_url(f"redis://limited:pw@127.0.0.1:{server.port}/0", prefix)
    try:
        me = Owner.current()
        hb = store.heartbeat(me, 10)
        query = LiveQuery(me.id, frozenset({me.id}), hb.now, hb.now, hb.now)
        with pytest.raises(StoreConfigurationError):  # NOPERM: the credentials' fault
            store.live_runs(query)
        carried = store.heartbeat(me, 10, sweep=query)
        assert carried.live is None and carried.epoch == hb.epoch
    finally:
        store.close()
        admin.execute_command("ACL", "DELUSER", "limited")


def test_the_first_heartbeat_after_a_store_outage_carries_no_sweep(server: RedisServer
                                                                    ) -> None:
    s = make(make_app(server))
    run_for(0.6, s)
    asked: list[bool] = []
    real = s.store.heartbeat

    def heartbeat(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("sweep") is not None)
        return real(*args, **kwargs)

    s.store.heartbeat = heartbeat  # type: ignore[method-assign]
    server.stop()
    try:
        wait_for(lambda: s.store_outage.active, 10, "the outage noticed", interval=0.05,
                 between=s.tick)
    finally:
        server.start()
    asked.clear()
    wait_for(lambda: not s.store_outage.active, 20, "the store back", interval=0.05,
             between=s.tick)
    assert asked and asked[0] is False, asked
    run_for(1.2, s)
    assert any(asked[1:]), f"later heartbeats carry the sweep again: {asked}"
    s.close()


def test_an_answer_is_not_used_in_a_later_tick_nor_after_a_clock_step(
        server: RedisServer) -> None:
    s = make(make_app(server))
    run_for(0.6, s)
    s.liveness.lapse()
    s._last_sweep = float("-inf")
    query = s.sweeper.query()
    assert not s.liveness.beat(sweep=query) and s.liveness.swept is not None
    # A tick that ends without sweeping (settling, say) drops it: the next one asks anew.
    s._last_sweep = time.monotonic()
    s.tick()
    assert s.liveness.swept is None
    # The store's clock a second from where this beat reckoned it: the answer is not kept.
    s.clock._store_ms = (s.clock._store_ms or 0) - 1000
    assert not s.liveness.beat(sweep=s.sweeper.query())
    assert s.liveness.swept is None
    s.close()
