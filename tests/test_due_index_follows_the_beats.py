"""The store's due index follows what the beats' heaps hold, on every store: each claim
writes the instant its beat's heap will hold next (a jittered entry's wake, NOT_DUE once
an entry is past its ``until``), a change of a definition writes the new definition's
first instant, and the beats' sweeps index what nobody else did (an entry registered but
never claimed yet, an index wiped) within a bounded number of heartbeats, whatever
replies are lost.

"The heap's instant" of an entry is read from a beat that schedules it and whose state of
it is the store's (another beat may have claimed since this one looked): what its heap
holds (``Claimer.slots``), or NOT_DUE where it holds nothing, and NOT_DUE for an entry no
beat schedules (a disabled dynamic entry)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from celery import Celery
from celery.schedules import crontab

from beat_claims.beat.sweeper import INDEX_PAGE, REBUILD_PAUSE
from beat_claims.beat.window import LOOKAHEAD
from beat_claims.entries import Entries
from beat_claims.occurrences import jitter_offset
from beat_claims.scheduler import Scheduler
from beat_claims.stores.base import NOT_DUE, EntryState, IndexWrite, Store, StoreError
from beat_claims.stores.redis import RedisStore, function_name

from .any_store import StoreUnderTest
from .conftest import RedisServer
from .faults import Proxy, proxy
from .inprocess import make_app, occurrences_sent, settled, settled_epoch
from .processes import fleet, wait_for
from .test_integration_fleet import my_admin

#: Heartbeats within which the sweeps index every entry again after the index was wiped:
#: a rebuild pass over a few entries waits 30 sweeps after one that found nothing
#: (REBUILD_PAUSE in beat_claims/beat/sweeper.py; more only past 10,000 records read; a
#: sweep at least every heartbeat interval), then indexes a page (every entry here) in its
#: first sweep.
REBUILD_HEARTBEATS = 36
#: Sweeps of a beat within which its rebuild pass indexes every entry of a wiped index:
#: the pause after a pass that found nothing (REBUILD_PAUSE), the pass's one page, and the
#: sweep under way when the index was wiped.
REBUILD_SWEEPS = REBUILD_PAUSE + 2
HEARTBEAT = 0.5
#: The heartbeat interval of the test that waits for a rebuild pass after its pause: its
#: bound is in heartbeats (30 sweeps: 15 s at HEARTBEAT, 9 s at this one).
REBUILD_INTERVAL = 0.3
#: The ``until`` bound of the entry "bounded" (UTC ms; set by each test).
BOUND: dict[str, int] = {"until": 2 ** 53 - 1}


class BoundedScheduler(Scheduler):
    """A schedule source with an end date (as a database row's ``expires``): the entry
    "bounded" has no occurrence after ``BOUND["until"]``."""

    def bounds(self, name: str) -> tuple[int | None, int | None]:
        if name == "bounded":
            return None, BOUND["until"]
        return super().bounds(name)


SCHEDULE: dict[str, Any] = {
    "every-1s": {"task": "t.noop", "schedule": timedelta(seconds=1)},
    "every-3s": {"task": "t.noop", "schedule": timedelta(seconds=3)},
    "each-minute": {"task": "t.noop", "schedule": crontab(minute="*")},
    "jittered": {"task": "t.noop", "schedule": timedelta(seconds=2),
                 "options": {}, "claims": {"jitter": 1.5}},
    "bounded": {"task": "t.noop", "schedule": timedelta(seconds=1)},
}


def bound_until(beats: list[Scheduler], until: int) -> None:
    """Move the entry "bounded"'s end date, and say so to the beats, as a schedule source
    edited in place does (``entries_changed``: the heap is built again at the next tick)."""
    BOUND["until"] = until
    for s in beats:
        s.entries_changed()


def fleet_of_two(app: Celery) -> list[Scheduler]:
    """Two beats on one store, the second joining the first (tests/inprocess.py beats).
    The store has run a while (a settled epoch): no test here is about a new store's
    start, and the first beat claims at once rather than after its settle period."""
    settled_epoch(app)
    first = BoundedScheduler(app=app)
    settled(first)
    second = BoundedScheduler(app=app)
    settled(second, running=(first,))
    return [first, second]


def tick(*beats: Scheduler) -> None:
    for s in beats:
        s.tick()


def run_for(seconds: float, *beats: Scheduler) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        waits = [s.tick() for s in beats]
        time.sleep(min([0.05, *waits]))


def index_of(store: Store) -> dict[str, int | None]:
    """Every entry's next_due as the store holds it: an instant, NOT_DUE, or None (not
    indexed at all)."""
    indexed: dict[str, int] = {}
    after: tuple[int, str] | None = None
    while True:
        page = store.due(2 ** 53 - 1, 1000, after)
        indexed.update((d.name, d.next_due) for d in page)
        if len(page) < 1000:
            break
        after = (page[-1].next_due, page[-1].name)
    unindexed: set[str] = set()
    cursor = ""
    while True:
        found = store.unindexed(1000, cursor)
        unindexed |= set(found.names)
        cursor = found.cursor
        if found.complete:
            break
    return {r.name: indexed.get(r.name, None if r.name in unindexed else NOT_DUE)
            for r in store.entries()}


def heaps_of(store: Store, beats: list[Scheduler]) -> dict[str, int | None]:
    """Each entry's instant on the heap of a beat that schedules it and holds the store's
    state of it (None: no beat holds the store's state yet); NOT_DUE where no beat
    schedules it."""
    out: dict[str, int | None] = {}
    for record in store.entries():
        scheduling = [s for s in beats if record.name in s.schedule]
        if not scheduling:
            out[record.name] = NOT_DUE
            continue
        out[record.name] = None
        for s in scheduling:
            state = s.claimer.states.get(record.name)
            if state is not None and (state.anchor, state.checkpoint) == (
                    record.anchor, record.checkpoint):
                out[record.name] = s.claimer.slots.get(record.name, NOT_DUE)
                break
    return out


def count_sweeps(beats: list[Scheduler]) -> list[int]:
    """A list that counts, from now on, each beat's sweeps of the due index's upkeep."""
    counts = [0] * len(beats)
    for i, s in enumerate(beats):
        keeper = s.index_keeper
        sweep = keeper.sweep

        def counted(i: int = i, sweep: Any = sweep) -> None:
            counts[i] += 1
            sweep()
        keeper.sweep = counted  # type: ignore[method-assign]
    return counts


def index_follows_heaps(store: Store, beats: list[Scheduler], timeout: float) -> float:
    """Tick the beats until the store's index holds, for every entry, what the heaps hold
    (the seconds it took); else fail with both."""
    began = time.monotonic()
    deadline = began + timeout
    while True:
        index, heaps = index_of(store), heaps_of(store, beats)
        if index == heaps:
            return time.monotonic() - began
        if time.monotonic() > deadline:
            differs = {name: {"index": index.get(name), "heap": heaps.get(name)}
                       for name in sorted(set(index) | set(heaps))
                       if index.get(name) != heaps.get(name)}
            raise AssertionError(f"the due index differs from the beats' heaps after"
                                 f" {timeout}s: {differs}")
        tick(*beats)
        time.sleep(0.02)


def app_for(target: StoreUnderTest, url: str | None = None,
            schedule: dict[str, Any] | None = None, interval: float = HEARTBEAT) -> Celery:
    return make_app(target.server, schedule or SCHEDULE, beat_claims_url=url or target.url,
                    beat_claims_heartbeat_interval=interval)


def define_dynamic(app: Celery, store: Store, every: float = 10) -> Entries:
    """A disabled dynamic entry and one every 10s (``every``), written through the API."""
    entries = Entries(app, store=store, by="test")
    entries.create("dyn-disabled", "t.noop", timedelta(seconds=2), enabled=False)
    entries.create("dyn", "t.noop", timedelta(seconds=every))
    return entries


@pytest.fixture
def observer(any_store: StoreUnderTest) -> Iterator[Store]:
    store = any_store.open()
    yield store
    store.close()


def test_after_a_mixed_schedule_the_index_holds_what_the_heaps_hold(
        any_store: StoreUnderTest, observer: Store) -> None:
    app = app_for(any_store)
    beats = fleet_of_two(app)
    bound_until(beats, observer.now() + 2500)
    entries = define_dynamic(app, observer, every=5)  # (longer than a beat's look-ahead)
    run_for(3, *beats)
    entries.update("dyn", entries.get("dyn").version, schedule=timedelta(seconds=4))
    run_for(6, *beats)  # (the changed entry is claimed once by its new schedule)
    index_follows_heaps(observer, beats, timeout=5)
    index = index_of(observer)
    assert index["bounded"] == NOT_DUE and index["dyn-disabled"] == NOT_DUE, index
    sent = {entry for entry, _ in occurrences_sent(any_store.server)}
    assert {"every-1s", "jittered", "bounded", "dyn"} <= sent, sent
    for s in beats:
        s.close()


def test_a_beat_indexes_the_entries_it_registers_as_it_gets_ready(
        any_store: StoreUnderTest, observer: Store) -> None:
    """A registration indexes a new entry due at once; the beat that registered it writes
    each one's next instant before it claims anything, however many (more than a sweep's
    page here), not a page a sweep afterwards (a burst right after a start would wait on
    those sweeps)."""
    schedule: dict[str, Any] = {
        f"hourly-{i}": {"task": "t.noop", "schedule": timedelta(hours=1)}
        for i in range(INDEX_PAGE + 200)}
    schedule["at-noon"] = {"task": "t.noop", "schedule": crontab(minute=0, hour=12)}
    app = app_for(any_store, schedule=schedule)
    s = BoundedScheduler(app=app)
    settled(s)
    assert index_of(observer) == heaps_of(observer, [s])
    assert not s.index_keeper.pending, sorted(s.index_keeper.pending)
    s.close()


def wipe_index(target: StoreUnderTest, store: Store) -> None:
    """The due index gone, as in a store written before it: Redis, every bucket's
    ``{P:NN}:next`` zset and every entry's next_due field deleted; SQL, next_due NULL."""
    names = [r.name for r in store.entries()]
    if target.kind == "redis":
        assert isinstance(store, RedisStore)
        client = target.server.client()
        zsets = list(client.scan_iter(match=f"{{{store.prefix}:*}}:next"))
        assert zsets, "no index to wipe"
        client.delete(*zsets)
        for name in names:
            client.hdel(store.entry_keys(name)[0], "next_due")
    elif target.kind == "sqlite":
        path = target.url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as db:
            db.execute("UPDATE beat_claims_entries SET next_due = NULL")
    elif target.kind == "mysql":
        my_admin("UPDATE beat_claims_entries SET next_due = NULL",
                 target.url.rsplit("/", 1)[1])
    else:
        with psycopg.connect(target.url, autocommit=True) as db:
            db.execute("UPDATE beat_claims.entries SET next_due = NULL")
    assert set(n for n, at in index_of(store).items() if at is None) == set(names)


def test_a_wiped_index_is_rebuilt_within_a_bounded_number_of_heartbeats(
        any_store: StoreUnderTest, observer: Store) -> None:
    app = app_for(any_store, interval=REBUILD_INTERVAL)
    beats = fleet_of_two(app)
    bound_until(beats, observer.now() + 1500)
    define_dynamic(app, observer)
    run_for(3, *beats)
    wipe_index(any_store, observer)
    sweeps = count_sweeps(beats)
    # The bound is in sweeps (a loaded machine makes each later, not fewer of them): the
    # seconds are only the deadline of a run that would otherwise never end.
    began = time.monotonic()
    wait_for(lambda: all(at is not None for at in index_of(observer).values()),
             3 * REBUILD_HEARTBEATS * REBUILD_INTERVAL, "every entry indexed again",
             between=lambda: tick(*beats))
    took, swept = time.monotonic() - began, list(sweeps)
    print(f"the index was rebuilt in {took:.1f}s, after {swept} sweeps of each beat")
    assert min(swept) <= REBUILD_SWEEPS, (
        f"the index was rebuilt only after {swept} sweeps of each beat ({took:.1f}s)")
    # ... at the instants the beats' heaps hold (an entry let go is compared once held)
    index_follows_heaps(observer, beats, timeout=3 * REBUILD_HEARTBEATS * REBUILD_INTERVAL)
    for s in beats:
        s.close()


def test_after_a_new_epoch_an_index_later_than_the_truth_is_repaired(
        server: RedisServer) -> None:
    """An entry indexed an hour later than its next instant (keys restored from different
    instants, say) and not due for an hour: the beats that find a new epoch index every
    entry they schedule again."""
    target = StoreUnderTest("redis", server.url, server)
    observer = target.open()
    assert isinstance(observer, RedisStore)
    hourly = {"hourly": {"task": "t.noop", "schedule": timedelta(hours=1)}}
    beats = fleet_of_two(app_for(target, schedule={**SCHEDULE, **hourly}))
    index_follows_heaps(observer, beats, timeout=REBUILD_HEARTBEATS * HEARTBEAT)
    [record] = observer.entries(["hourly"])
    assert record.anchor is not None
    truth = index_of(observer)["hourly"]
    assert truth is not None and truth > 0
    later = truth + 3_600_000
    state = EntryState(record.anchor, record.checkpoint, record.token)
    [definition] = observer.definitions(["hourly"])  # (its beat_schedule definition)
    assert observer.index([IndexWrite("hourly", state, definition.version, later)]) == [True]
    assert index_of(observer)["hourly"] == later
    server.client().delete(f"{{{observer.prefix}}}:epoch")  # (a new epoch, as a wipe's)
    wait_for(lambda: all(s._went_back_why is None and s._ready for s in beats)
             and index_of(observer)["hourly"] == truth, REBUILD_HEARTBEATS * HEARTBEAT,
             "the entry indexed at its next instant again", between=lambda: tick(*beats))
    index_follows_heaps(observer, beats, timeout=REBUILD_HEARTBEATS * HEARTBEAT)
    for s in beats:
        s.close()
    observer.close()


@pytest.fixture
def lossy(server: RedisServer) -> Iterator[Proxy]:
    with proxy(server.port) as p:
        yield p


def test_entries_to_index_again_are_kept_when_the_store_cannot_be_read(
        server: RedisServer, lossy: Proxy) -> None:
    """After a new epoch the beats index every entry they schedule again; the reply to the
    read of those entries' records is lost (a dropped connection): the entries are indexed
    again at a later sweep, not forgotten (an entry indexed an hour late would stay so until
    its next claim, an hour away)."""
    target = StoreUnderTest("redis", server.url, server)
    observer = target.open()
    assert isinstance(observer, RedisStore)
    hourly = {"hourly": {"task": "t.noop", "schedule": timedelta(hours=1)}}
    beats = fleet_of_two(app_for(target, lossy.url(), schedule={**SCHEDULE, **hourly}))
    index_follows_heaps(observer, beats, timeout=REBUILD_HEARTBEATS * HEARTBEAT)
    [record] = observer.entries(["hourly"])
    assert record.anchor is not None
    truth = index_of(observer)["hourly"]
    assert truth is not None and truth > 0
    state = EntryState(record.anchor, record.checkpoint, record.token)
    [definition] = observer.definitions(["hourly"])
    later = truth + 3_600_000
    assert observer.index([IndexWrite("hourly", state, definition.version, later)]) == [True]
    # The read of the records to index again (Store.entries: HMGET ... horizon) loses its
    # reply, on each beat.
    lossy.drop_reply_to(b"horizon", times=2)
    server.client().delete(f"{{{observer.prefix}}}:epoch")  # (a new epoch, as a wipe's)
    wait_for(lambda: lossy.pending() == 0, REBUILD_HEARTBEATS * HEARTBEAT,
             "both reads of the records to index again lost", between=lambda: tick(*beats))
    wait_for(lambda: index_of(observer)["hourly"] == truth, REBUILD_HEARTBEATS * HEARTBEAT,
             f"the entry indexed at its next instant again (indexed {later}, truth {truth};"
             f" pending {[sorted(s.index_keeper.pending) for s in beats]})",
             between=lambda: tick(*beats))
    for s in beats:
        s.close()
    observer.close()


@pytest.mark.parametrize("lost", ["index", "claim", "define"])
def test_a_lost_reply_to_an_index_write_is_harmless(
        server: RedisServer, lossy: Proxy, lost: str, tmp_path: Any) -> None:
    """The reply to a sweep's index write, a claim's (which writes next_due) or a
    definition write's lost: the beats go on, the index ends as the heaps hold, nothing is
    sent twice."""
    target = StoreUnderTest("redis", server.url, server)
    observer = target.open()
    app = app_for(target, lossy.url())
    beats = fleet_of_two(app)
    bound_until(beats, observer.now() + 1500)
    entries = define_dynamic(app, observer)
    run_for(1, *beats)
    if lost == "index":
        wipe_index(target, observer)  # (a rebuild pass: the sweeps' index writes)
        lossy.drop_reply_to(function_name("index"))
    elif lost == "claim":
        lossy.drop_reply_to(function_name("claim"))
    else:
        lossy.drop_reply_to(function_name("define"))
        lossy_entries = Entries(app, store=beats[0].store, by="test")
        lossy_entries.update("dyn", entries.get("dyn").version, schedule=timedelta(seconds=7))
    wait_for(lambda: lossy.pending() == 0, REBUILD_HEARTBEATS * HEARTBEAT, "the lost reply",
             between=lambda: tick(*beats))
    run_for(2, *beats)
    index_follows_heaps(observer, beats, timeout=REBUILD_HEARTBEATS * HEARTBEAT)
    sent = occurrences_sent(server)
    assert len(sent) == len(set(sent)), sent
    for s in beats:
        s.close()
    observer.close()


#: The schedule of the real beats (tests/proj/app.py): periods in seconds, a crontab each
#: minute, a jittered entry (jitter below its period: it wakes at its next occurrence plus
#: that occurrence's offset).
PROCESS_SCHEDULE: dict[str, Any] = {
    "every-1s": {"every": 1},
    "every-3s": {"every": 3},
    "each-minute": {"cron": "*"},
    "jittered": {"every": 2, "claims": {"jitter": 1}},
}


def computed(store: Store, periods: dict[str, int]) -> dict[str, int | None]:
    """Each entry's next instant after its checkpoint as the store holds it, computed here
    from its schedule (``periods``: the interval entries' periods, ms): what a beat's heap
    holds for that state."""
    out: dict[str, int | None] = {}
    for record in store.entries():
        if record.anchor is None:
            out[record.name] = None
            continue
        after = record.checkpoint if record.checkpoint is not None else record.anchor
        if record.name == "dyn-disabled":
            out[record.name] = NOT_DUE
        elif record.name == "each-minute":
            out[record.name] = (after // 60_000 + 1) * 60_000
        else:
            period = periods[record.name]
            first = record.anchor + ((after - record.anchor) // period + 1) * period
            out[record.name] = first + (jitter_offset(record.name, first, 1.0)
                                        if record.name == "jittered" else 0)
    return out


@pytest.mark.integration
def test_real_beats_keep_the_index_as_their_heaps(server: RedisServer, broker: RedisServer,
                                                  tmp_path: Any) -> None:
    """Two ``celery beat`` processes: after they ran the schedule, with a dynamic entry
    changed from 5s to 4s and a disabled one, each entry's next_due is its next instant
    after the store's checkpoint (NOT_DUE for the disabled one). (Both periods are longer
    than a beat's look-ahead: the entry is let go between its occurrences, indexed.)"""
    assert LOOKAHEAD < 4000
    app = make_app(server, {}, beat_claims_url=server.url)
    store = StoreUnderTest("redis", server.url, server).open()
    periods = {"every-1s": 1000, "every-3s": 3000, "jittered": 2000, "dyn": 5000}
    with fleet(server.url, broker.broker_url(), tmp_path, PROCESS_SCHEDULE,
               BC_HEARTBEAT=str(HEARTBEAT)) as f:
        beats = [f.beat(), f.beat()]
        for beat in beats:
            f.wait_log(beat, "entries registered; claiming", 30)
        entries = define_dynamic(app, store, every=5)
        wait_for(lambda: any(r.entry == "dyn" for r in store.history("dyn")) or None, 20,
                 "a run of the dynamic entry")
        entries.update("dyn", entries.get("dyn").version, schedule=timedelta(seconds=4))
        periods["dyn"] = 4000
        changed = store.now()
        wait_for(lambda: any(r.due > changed for r in store.history("dyn")) or None, 20,
                 "a run of the dynamic entry by its new schedule")
        last: dict[str, Any] = {}

        def follows() -> bool:
            last["index"], last["computed"] = index_of(store), computed(store, periods)
            return last["index"] == last["computed"]

        try:
            wait_for(follows, 10, "the index to hold every entry's next instant")
        except AssertionError:
            differs = {name: {"index": last["index"].get(name),
                              "computed": last["computed"].get(name)}
                       for name in sorted(last["index"])
                       if last["index"].get(name) != last["computed"].get(name)}
            raise AssertionError(f"the due index differs: {differs}") from None
    store.close()


def test_a_store_error_in_the_index_upkeep_does_not_stop_the_beat_sending(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """The due index cannot be written (a Redis Cluster master down, say): the upkeep is
    put off, logged once, and the beat goes on claiming and sending; once the store
    answers, what was pending is indexed."""
    target = StoreUnderTest("redis", server.url, server)
    observer = target.open()
    beats = fleet_of_two(app_for(target))
    index_follows_heaps(observer, beats, timeout=REBUILD_HEARTBEATS * HEARTBEAT)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise StoreError("the index's master is down (test)")

    for s in beats:
        s.store.index = refused  # type: ignore[method-assign]
        s.index_keeper.reindex(s.claimer.states)
    before = len(occurrences_sent(server))
    with caplog.at_level("WARNING"):
        wait_for(lambda: len(occurrences_sent(server)) >= before + 6, 20,
                 "the beats to go on sending", between=lambda: tick(*beats))
    warned = [r.getMessage() for r in caplog.records
              if "the due index cannot be kept now" in r.getMessage()]
    assert len(warned) == 2, warned  # once by each beat, not once a sweep
    assert all(s.index_keeper.pending for s in beats)  # put off, not forgotten
    for s in beats:
        del s.store.index  # (the store's own method again)
    wait_for(lambda: not any(s.index_keeper.pending for s in beats),
             REBUILD_HEARTBEATS * HEARTBEAT, "what was pending to be indexed",
             between=lambda: tick(*beats))
    index_follows_heaps(observer, beats, timeout=REBUILD_HEARTBEATS * HEARTBEAT)
    for s in beats:
        s.close()
    observer.close()
