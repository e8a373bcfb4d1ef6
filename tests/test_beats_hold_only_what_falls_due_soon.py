"""A beat holds only the dynamic entries that fall due soon, taken from the store's due
index, whatever the store holds: it starts without reading every definition, lets an
entry go once it is sent and not due again soon, takes it back in time for its next
occurrence, writes back the real instant of an entry indexed earlier than its truth, and
takes up a run of an entry it does not hold when that run is due again (an operator's
request). The suite's 10,000-entry smoke test."""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from beat_claims import operations
from beat_claims.beat import dynamic as dynamic_module
from beat_claims.beat import window
from beat_claims.beat.window import LOOKAHEAD
from beat_claims.entries import Entries
from beat_claims.enums import RunState
from beat_claims.runs import Run, iso
from beat_claims.scheduler import Scheduler
from beat_claims.stores.base import ClaimPlan, EntryState, IndexWrite, Outcome, Release
from beat_claims.stores.redis import RedisStore, function_name

from .conftest import RedisServer, SnapshotServer, seed_settled_epoch
from .faults import proxy
from .inprocess import beats, joined, make, make_app, occurrences_sent, run_for
from .processes import wait_for

#: Dynamic entries not due for an hour: what a large store mostly holds.
IDLE = 10_000


@pytest.fixture(autouse=True)
def settled_store(request: pytest.FixtureRequest) -> None:
    """The store on the test's redis-server has run a while (a settled epoch): the tests
    here are about what beats hold once they run, not a new store's start, and their beats
    claim at once rather than after the new epoch's settle period of a TTL. (The tests on a
    SnapshotServer seed their own.)"""
    if "server" in request.fixturenames:
        seed_settled_epoch(request.getfixturevalue("server"))


def idle_entries(n: int) -> list[dict[str, object]]:
    return [{"name": f"idle-{i:05d}", "task": "t.noop", "schedule": {"every": 3600}}
            for i in range(n)]


def tick_for(seconds: float, beat: Scheduler, watch: list[int] | None = None) -> None:
    """Tick for ``seconds``; ``watch`` collects how many entries the beat held each tick."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        wait = beat.tick()
        if watch is not None:
            watch.append(len(beat.schedule))
        time.sleep(min(0.05, max(0.0, wait)))


def test_a_beat_among_10000_entries_holds_only_those_due_soon(server: RedisServer) -> None:
    app = make_app(server, schedule={})
    with Entries(app) as entries:
        entries.bulk_create(idle_entries(IDLE))
        for name in ("fast-a", "fast-b"):
            entries.create(name, "t.noop", {"every": 1})
        entries.create("every-4s", "t.noop", {"every": 4})
    beat = make(app)
    try:
        held: list[int] = []
        let_go_seen = False

        def enough() -> bool:
            sent = Counter(entry for entry, _ in occurrences_sent(server))
            return (let_go_seen and sent["fast-a"] >= 10 and sent["fast-b"] >= 10
                    and sent["every-4s"] >= 3)

        deadline = time.monotonic() + 14  # (what is asserted below is sent by then)
        while time.monotonic() < deadline and not enough():
            wait = beat.tick()
            held.append(len(beat.schedule))
            let_go_seen |= "every-4s" not in beat.schedule
            time.sleep(min(0.05, max(0.0, wait)))
        sent = Counter(entry for entry, _ in occurrences_sent(server))
        evidence = f"sent {dict(sent)}, held per tick (max) {max(held)}"
        assert sent["fast-a"] >= 10 and sent["fast-b"] >= 10, evidence
        # Let go between two of its occurrences (4 s apart, the look-ahead is 2 s), and
        # taken back in time for each.
        assert let_go_seen, evidence
        assert sent["every-4s"] >= 3, evidence
        assert not any(name.startswith("idle-") for name in sent), evidence
        # Never more than the entries due within the look-ahead (and its own: none).
        assert max(held) <= 3, evidence
        assert len(beat.stored.known) <= 3, sorted(beat.stored.known)
        assert len(beat.claimer.states) <= 3, sorted(beat.claimer.states)
        assert len(beat.knowledge.entries) <= 3, sorted(beat.knowledge.entries)
        # Every occurrence once.
        dues = occurrences_sent(server)
        assert len(dues) == len(set(dues)), evidence
    finally:
        beat.close()


def test_an_entry_indexed_earlier_than_its_truth_has_its_instant_written_back(
        server: RedisServer) -> None:
    app = make_app(server, schedule={})
    with Entries(app) as entries:
        entries.bulk_create(idle_entries(50))
    beat = make(app)
    store = beat.store
    try:
        now = store.now()
        assert store.due(now + LOOKAHEAD, 100) == []
        # Indexed due at once, as a writer that does not compute the index leaves it.
        [record] = store.entries(["idle-00007"])
        [definition] = store.definitions(["idle-00007"])
        state = EntryState(record.anchor or 0, record.checkpoint, record.token)
        assert store.index([IndexWrite("idle-00007", state, definition.version, 0)]) == [True]
        assert [d.name for d in store.due(now, 100)] == ["idle-00007"]
        tick_for(1.5, beat)
        assert store.due(store.now() + LOOKAHEAD, 100) == []
        assert "idle-00007" not in beat.schedule
        [indexed] = store.due(store.now() + 3_700_000, 100, after=None)[:1]
        assert indexed.next_due >= now + 3_500_000, indexed
        assert not any(entry.startswith("idle-") for entry, _ in occurrences_sent(server))
    finally:
        beat.close()


def test_a_run_now_of_an_entry_no_beat_holds_is_taken_and_sent(server: RedisServer) -> None:
    app = make_app(server, schedule={})
    with Entries(app) as entries:
        entries.bulk_create(idle_entries(20))
    beat = make(app)
    try:
        tick_for(1.0, beat)
        assert "idle-00003" not in beat.schedule
        # Nobody registered it (no beat holds every dynamic entry): every live beat
        # schedules it, so the request is taken.
        triggered = operations.trigger(beat.store, "idle-00003", "operator")
        assert triggered.beats and len(triggered.beats) == 1, triggered
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not occurrences_sent(server):
            time.sleep(min(0.05, max(0.0, beat.tick())))
        assert [entry for entry, _ in occurrences_sent(server)] == ["idle-00003"]
    finally:
        beat.close()


def test_an_entry_whose_record_cannot_be_read_is_named_and_repaired(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    app = make_app(server, schedule={})
    with Entries(app) as entries:
        entries.create("fine", "t.noop", {"every": 1})
        entries.create("broken", "t.noop", {"every": 1})
    beat = make(app)
    try:
        tick_for(1.5, beat)
        store = beat.store
        assert isinstance(store, RedisStore)
        beat.close()
        # Its record's anchor is no longer a number (a bad restore, a hand edit): the due
        # index still answers it, without a state.
        server.client().hset(store.entry_keys("broken")[0], "anchor", "garbage")
        assert [d.state for d in store.due(store.now() + 60_000, 10) if d.name == "broken"
                ] == [None]
        before = len(occurrences_sent(server))
        caplog.set_level(logging.INFO, logger="celery.beat.claims")
        beat = make(app)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and sum(
                1 for entry, _ in occurrences_sent(server)[before:] if entry == "broken") < 2:
            time.sleep(min(0.05, max(0.0, beat.tick())))
        sent = Counter(entry for entry, _ in occurrences_sent(server)[before:])
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert sent["broken"] >= 2 and sent["fine"] >= 2, (dict(sent), errors)
        assert len([e for e in errors if "broken" in e and "cannot be read" in e]) == 1, errors
    finally:
        beat.close()


def _sent_of(server: RedisServer, entry: str) -> list[str]:
    return [due for name, due in occurrences_sent(server) if name == entry]


def _tick_until(beat: Scheduler, predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(min(0.05, max(0.0, beat.tick())))


def test_a_store_put_back_older_does_not_send_again_what_a_beat_sent_and_let_go(
        store_server: SnapshotServer, broker: RedisServer, tmp_path: Path) -> None:
    """A dynamic entry sent and let go (its next instant is 4 s away): the store comes
    back from an older snapshot. The beat noticed nothing of the entry is known to it any
    more, so it must still not send again the occurrence it sent after the snapshot (the
    snapshot's checkpoint is older: a beat holding the entry would re-seed it)."""
    beat = sent_and_let_go(store_server, broker)
    try:
        store_server.snapshot(tmp_path / "old.rdb")
        _tick_until(beat, lambda: len(_sent_of(broker, "dyn")) >= 2
                    and "dyn" not in beat.schedule, 15, "dyn sent again and let go")
        after_snapshot = _sent_of(broker, "dyn")[-1]
        store_server.come_back(tmp_path / "old.rdb")
        tick_for(6, beat)
        sent = _sent_of(broker, "dyn")
        assert sent.count(after_snapshot) == 1, (
            f"{after_snapshot} (sent after the snapshot) published"
            f" {sent.count(after_snapshot)} times; every send: {sent}")
    finally:
        beat.close()


def test_a_pause_the_store_lost_of_an_entry_a_beat_let_go_is_restored(
        store_server: SnapshotServer, broker: RedisServer, tmp_path: Path) -> None:
    """A dynamic entry is paused; a beat skips an occurrence for the pause (it knows of it)
    and lets the entry go (its next instant is 4 s away). The store comes back from a
    snapshot taken before the pause: the beat pauses the entry again, as it does its own
    entries, and nothing of it is sent."""
    beat = sent_and_let_go(store_server, broker)
    try:
        store_server.snapshot(tmp_path / "old.rdb")
        operations.pause(beat.store, "dyn", "operator", "hold on")
        _tick_until(beat, lambda: "dyn" in beat.knowledge.paused
                    and "dyn" not in beat.schedule, 15, "a skip for the pause, let go")
        sent_before = _sent_of(broker, "dyn")
        store_server.come_back(tmp_path / "old.rdb")
        tick_for(6, beat)
        [record] = beat.store.entries(["dyn"])
        sent = _sent_of(broker, "dyn")
        assert record.paused is not None and sent == sent_before, (
            f"paused in the store: {record.paused}; sent before {sent_before}, now {sent}")
    finally:
        beat.close()


def sent_and_let_go(store_server: SnapshotServer, broker: RedisServer) -> Scheduler:
    """A beat that sent the first run of a dynamic entry ("dyn", every 4 s) and let it go."""
    seed_settled_epoch(store_server)
    app = make_app(store_server, schedule={}, broker=broker, beat_claims_catch_up_grace=10)
    with Entries(app) as entries:
        entries.create("dyn", "t.noop", {"every": 4})
    beat = make(app)
    try:
        _tick_until(beat, lambda: _sent_of(broker, "dyn") and "dyn" not in beat.schedule,
                    15, "dyn sent once and let go")
    except BaseException:
        beat.close()
        raise
    return beat


def gone_fleet(server: RedisServer, entries: int, every: float) -> Scheduler:
    """Another fleet's beat, with ``entries`` of its own ``beat_schedule`` (cfg-0, ...)
    due every ``every`` seconds: it ran a while and is gone (closed)."""
    other = make_app(server, schedule={f"cfg-{i}": {"task": "t.noop", "schedule": every}
                                       for i in range(entries)})
    gone = make(other)
    tick_for(1.5, gone)
    gone.close()
    return gone


def beat_with_one_entry(server: RedisServer, every: float) -> Scheduler:
    """A beat with no entries of its own, and one dynamic entry ("dyn") in the store."""
    app = make_app(server, schedule={})
    with Entries(app) as entries:
        entries.create("dyn", "t.noop", {"every": every})
    return make(app)


def test_entries_of_a_stopped_fleet_overdue_in_the_index_do_not_starve_dynamic_ones(
        server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another fleet's beats (their own ``beat_schedule``) stopped: their entries stay in
    the due index at instants long past, ahead of every dynamic entry. A beat of this fleet
    reads them (they are not dynamic: it takes none of them) and must still reach the
    dynamic entries behind them. HELD_MAX is made small (5) to stand for 10,000 such
    entries (a decommissioned deployment's schedule)."""
    gone_fleet(server, 8, 1.0)
    monkeypatch.setattr(window, "HELD_MAX", 5)
    beat = beat_with_one_entry(server, 1)
    try:
        before = len(occurrences_sent(server))
        tick_for(5, beat)
        store = beat.store
        overdue = [d.name for d in store.due(store.now() - 2000, 100)]
        sent = Counter(e for e, _ in occurrences_sent(server)[before:])
        assert sent["dyn"] >= 3, (f"sent {dict(sent)}; overdue in the index: {overdue};"
                                  f" held {sorted(beat.window.held)}")
    finally:
        beat.close()


def test_a_pass_longer_than_a_heartbeat_interval_reaches_the_entries_behind(
        server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that takes longer than a heartbeat interval to read past what it does not
    take (a stopped fleet's many overdue entries) goes on to the dynamic entries behind
    them before it starts over. Pages of 2 entries, one a tick, and a pass started over
    at every tick if it could be, stand for 100,000 such entries read a page of 1,000 a
    call."""
    gone_fleet(server, 8, 1.0)
    monkeypatch.setattr(window, "PAGE", 2)
    monkeypatch.setattr(window, "PAGES_PER_SCAN", 1)
    beat = beat_with_one_entry(server, 1)
    beat.window.restart_every = 0.0
    try:
        before = len(occurrences_sent(server))
        tick_for(4, beat)
        sent = Counter(e for e, _ in occurrences_sent(server)[before:])
        assert sent["dyn"] >= 2, (f"sent {dict(sent)}; held {sorted(beat.window.held)}")
    finally:
        beat.close()


def test_a_scan_of_a_slow_store_starts_no_page_after_half_a_heartbeat_interval(
        server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store slow to answer the due index (each page takes 60 % of half a heartbeat
    interval) under many pages a beat reads past (a stopped fleet's overdue entries): a
    scan starts no new page once half an interval went by, so that the beat's loop renews
    its heartbeat between two scans (twenty pages in one scan would take six intervals,
    two TTLs), and the pass goes on at the next tick to the dynamic entry behind them.
    Pages of 2 entries stand for pages of 1,000."""
    gone_fleet(server, 24, 1.0)
    monkeypatch.setattr(window, "PAGE", 2)
    beat = beat_with_one_entry(server, 2)  # (its first instant after theirs)
    slow = beat.window.scan_for * 0.6
    pages: list[int] = []  # pages read by each scan that read any
    real_due_ahead, real_scan = beat.window.store.due_ahead, beat.window.scan

    def due_ahead(*args: Any, **kwargs: Any) -> Any:
        time.sleep(slow)
        pages[-1] += 1
        return real_due_ahead(*args, **kwargs)

    def scan(now: int) -> Any:
        pages.append(0)
        try:
            return real_scan(now)
        finally:
            if not pages[-1]:
                pages.pop()

    monkeypatch.setattr(beat.window.store, "due_ahead", due_ahead)
    monkeypatch.setattr(beat.window, "scan", scan)
    try:
        before = len(occurrences_sent(server))
        wait_for(lambda: Counter(e for e, _ in occurrences_sent(server)[before:])["dyn"] >= 2,
                 20, "two runs of the dynamic entry behind the pages read past", 0.02,
                 beat.tick)
        # Each page takes at least `slow`: a scan that stops starting pages after
        # scan_for reads two at most (it began the second before scan_for went by).
        assert pages and max(pages) <= 2, f"pages read by each scan: {pages}"
        assert sum(pages) >= 24 // 2, f"the passes read past the overdue entries: {pages}"
    finally:
        beat.close()


def test_more_entries_due_at_once_than_a_beat_holds_are_said_and_all_sent(
        server: RedisServer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """More dynamic entries fall due at once than a beat holds (HELD_MAX made 3 to stand
    for 5,000): it says so once, in a warning, and sends every one of them, the rest as
    the first are sent (those it read past are read again)."""
    monkeypatch.setattr(window, "HELD_MAX", 3)
    # The default heartbeat interval: a pass starts over from the first entry only every 5 s.
    app = make_app(server, schedule={}, beat_claims_heartbeat_interval=5)
    seed_settled_epoch(server)  # (claims at once, not after a TTL of 15 s)
    with Entries(app) as entries:
        entries.bulk_create([{"name": f"burst-{i}", "task": "t.noop", "schedule": {"every": 4}}
                             for i in range(7)])
    caplog.set_level(logging.INFO, logger="celery.beat.claims")
    beat = make(app)
    try:
        _tick_until(beat, lambda: occurrences_sent(server), 10, "the first sent")
        first = time.monotonic()
        _tick_until(beat, lambda: len({e for e, _ in occurrences_sent(server)}) == 7, 10,
                    "every entry sent")
        # Those read past while the beat held 3 are read again at the next scan (a second
        # later: three rounds of 3), not left behind the scan for a heartbeat interval or
        # more.
        assert time.monotonic() - first < 6, occurrences_sent(server)
        warned = [r.getMessage() for r in caplog.records if "may be due at once" in
                  r.getMessage()]
        assert len(warned) >= 1, [r.getMessage() for r in caplog.records]
        dues = occurrences_sent(server)
        assert len(dues) == len(set(dues)), dues
    finally:
        beat.close()


@pytest.mark.parametrize("overlap", ["buffer_one", "skip"])
def test_a_run_that_waited_for_the_previous_one_is_sent_once_it_ends(
        server: RedisServer, overlap: str) -> None:
    """overlap=buffer_one: the occurrence due while the previous run is unfinished waits
    in the store, and the beat lets the entry go meanwhile (its next instant is 4 s away);
    once the previous run ends, the waiting one is sent (a sweep takes it up), once.
    overlap=skip: the next occurrence after the end is sent (the entry is taken back)."""
    app = make_app(server, schedule={})
    with Entries(app) as entries:
        entries.create("slow", "t.noop", {"every": 4}, claims={"overlap": overlap})
    beat = make(app)
    try:
        _tick_until(beat, lambda: _sent_of(server, "slow"), 10, "the first run sent")
        first = _sent_of(server, "slow")[0]
        # The next occurrence comes while the first is unfinished.
        _tick_until(beat, lambda: len(beat.store.history("slow")) >= 2, 10,
                    "the next occurrence")
        tick_for(0.6, beat)
        states = {iso(r.due): r.state for r in beat.store.history("slow")}
        assert "slow" not in beat.schedule, ("let go while it waits", states)
        [run] = [r for r in beat.store.history("slow") if iso(r.due) == first]
        assert beat.store.finish([Outcome("slow", run.due, None, RunState.DONE)]) == [True]
        ended = beat.clock.now()
        _tick_until(beat, lambda: len(_sent_of(server, "slow")) >= 2, 10,
                    f"a run after the first ended; history {beat.store.history('slow')}")
        sent = _sent_of(server, "slow")
        assert len(sent) == len(set(sent)), sent
        if overlap == "buffer_one":
            second = next(r for r in beat.store.history("slow") if iso(r.due) == sent[1])
            assert second.due < ended, (sent, "the waiting one, not a later one")
    finally:
        beat.close()


@pytest.mark.parametrize("checked", [True, False], ids=["checked-with-it", "claim-only"])
def test_a_lost_reply_to_the_claim_of_an_entry_the_beat_then_lets_go(
        server: RedisServer, checked: bool) -> None:
    """The reply to a dynamic entry's claim is lost (the store claimed it, and moved its
    index 3 s on): the beat does not know it holds the run, and may let the entry go. The
    run is still sent once, and every later occurrence too."""

    with proxy(server.port) as lossy:
        app = make_app(server, schedule={}, beat_claims_url=lossy.url(),
                       beat_claims_heartbeat_interval=0.3, beat_claims_catch_up="all")
        with Entries(app) as entries:
            entries.create("dyn", "t.noop", {"every": 3})
        beat = make(app)
        beat.claimer.check_with_claim = checked
        try:
            _tick_until(beat, lambda: _sent_of(server, "dyn"), 10, "a first run")
            lossy.drop_reply_to(function_name("claim"))
            _tick_until(beat, lambda: lossy.pending() == 0, 10, "the lost reply")
            tick_for(8, beat)
            sent = _sent_of(server, "dyn")
            history = {iso(r.due): r.state for r in beat.store.history("dyn")}
            evidence = f"sent {sent}; history {history}"
            assert len(sent) == len(set(sent)), evidence
            dues = sorted(r.due for r in beat.store.history("dyn"))
            assert all(b - a == 3000 for a, b in itertools.pairwise(dues)), evidence
            old = [iso(d) for d in dues[:-1]]
            assert all(history[d] is RunState.SENT and d in sent for d in old), evidence
        finally:
            beat.close()


def test_a_run_of_an_entry_no_beat_holds_is_presumed_lost_after_its_own_run_timeout(
        server: RedisServer) -> None:
    """A dynamic entry with a run_timeout (1 s) shorter than the default (a day), due every
    8 s: between two occurrences no beat holds it. Its run that no worker reported is
    recorded lost after its own run_timeout, not the default's."""
    app = make_app(server, schedule={})
    with Entries(app) as entries:
        entries.create("short", "t.noop", {"every": 8}, claims={"run_timeout": 1})
    beat = make(app)
    try:
        _tick_until(beat, lambda: _sent_of(server, "short"), 15, "a first run")
        sent_at = time.monotonic()
        tick_for(4.5, beat)  # (its next occurrence is 8 s after the first: not held now)
        held = "short" in beat.schedule
        states = [(r.due, r.state) for r in beat.store.history("short")]
        assert states and states[0][1] is RunState.LOST, (
            f"{time.monotonic() - sent_at:.1f}s after it was sent (held now: {held}):"
            f" {states}")
    finally:
        beat.close()


def test_a_requested_run_is_taken_up_whatever_other_fleets_leave_due_again(
        server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another fleet's beats (their own ``beat_schedule``) are gone, and runs of their
    entries are due again for good (claims given back): no beat here schedules them. An
    operator's run of a dynamic entry no beat holds is still taken up and sent by a sweep.
    Sweeps take up a page of such entries at a time (PAGE, made 3 here: it stands for
    1,000 due-again runs of a fleet that died)."""
    gone = gone_fleet(server, 4, 3600.0)
    store = gone.store
    for record in store.entries([f"cfg-{i}" for i in range(4)]):
        assert record.anchor is not None
        state = EntryState(record.anchor, record.checkpoint, record.token)
        [result] = store.claim(gone.owner, [ClaimPlan(record.name, state, (record.anchor + 1,))])
        store.release(gone.owner, [Release(claim) for claim in result.claims])
    monkeypatch.setattr(dynamic_module, "PAGE", 3)
    beat = beat_with_one_entry(server, 3600)
    try:
        tick_for(1.0, beat)
        before = len(occurrences_sent(server))
        operations.trigger(beat.store, "dyn", "operator")
        tick_for(4, beat)
        sent = [e for e, _ in occurrences_sent(server)[before:]]
        due_again = sorted(ref.entry for ref in beat.store.live_runs(beat.sweeper.query()).due)
        assert sent == ["dyn"], f"sent {sent}; due again: {due_again}"
    finally:
        beat.close()


def test_two_beats_sharing_dynamic_entries_send_each_occurrence_once(
        server: RedisServer) -> None:
    """Two beats take the same dynamic entries from the index, let them go and take them
    back: every occurrence (jittered ones too) is sent once, none is missed."""

    app = make_app(server, schedule={})
    periods = {"one": 1, "three": 3, "jittered": 3, "four-skip": 4}
    with Entries(app) as entries:
        entries.create("one", "t.noop", {"every": 1})
        entries.create("three", "t.noop", {"every": 3})
        entries.create("jittered", "t.noop", {"every": 3}, claims={"jitter": 2})
        entries.create("four-skip", "t.noop", {"every": 4}, claims={"overlap": "skip"})
    a, b = beats(app, app)
    try:
        run_for(13, a, b)
        sent = occurrences_sent(server)
        twice = {k: n for k, n in Counter(sent).items() if n > 1}
        assert twice == {}, twice
        store = a.store
        for name, period in periods.items():
            runs = {r.due: r.state for r in store.history(name)}
            history = sorted(runs)
            dues = [d for d in history if d < store.now() - 4000]
            gaps = [(iso(x), iso(y)) for x, y in itertools.pairwise(dues) if y - x != period * 1000]
            assert len(dues) >= 2 and not gaps, (name, gaps, [iso(d) for d in history])
            # (overlap=skip: no worker ends a run here, the next ones are recorded skipped)
            unsent = [iso(d) for d in dues
                      if (name, iso(d)) not in sent and runs[d] is not RunState.SKIPPED]
            assert not unsent, (name, unsent)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("period", [3, 4])
def test_an_entry_let_go_is_taken_back_in_time_for_its_next_occurrence(
        server: RedisServer, period: int) -> None:
    """An entry due every 3 or 4 s (more than the look-ahead, less than the heartbeat
    interval, 5 s): once sent it is let go, and its claim moved its index ahead of where
    the scan stopped. It is taken back in time: each occurrence is sent on time, not at
    the next pass of the index from the first entry (up to a heartbeat interval late)."""
    app = make_app(server, schedule={}, beat_claims_heartbeat_interval=5.0)
    seed_settled_epoch(server)  # (claims at once, not after a TTL of 15 s)
    with Entries(app) as entries:
        entries.create("dyn", "t.noop", {"every": period})
    beat = make(app)
    try:
        began = beat.clock.now()  # (what fell due while the beat started is not judged)

        def sent() -> list[Run]:
            return [r for r in beat.store.history("dyn")
                    if r.sent_at is not None and r.due > began]

        deadline = time.monotonic() + 14  # (three occurrences sent, late or not, by then)
        while len(sent()) < 3 and time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, beat.tick())))
        runs = sent()
        late = {iso(r.due): r.sent_at - r.due for r in runs
                if r.sent_at is not None and r.sent_at - r.due > 500}
        assert len(runs) >= 3 and not late, f"late (ms): {late}; {len(runs)} sent"
    finally:
        beat.close()


def test_live_beats_each_take_their_own_share_of_the_due_index(server: RedisServer) -> None:
    """Two beats take disjoint shares of the dynamic entries (a hash of the name among the
    live beats): each occurrence is planned and claimed by one beat, not raced for by
    both; every occurrence is sent once. When one beat stops, the other takes its share."""
    app = make_app(server, schedule={})
    names = [f"shared-{i:03d}" for i in range(60)]
    with Entries(app) as entries:
        entries.bulk_create({"name": n, "task": "t.noop", "schedule": {"every": 1}}
                            for n in names)
    a = joined(app)
    began = time.monotonic()  # (b is seen alive from now on at the earliest)
    b = joined(app, a)
    held: dict[str, set[str]] = {a.owner.id: set(), b.owner.id: set()}
    try:
        # A beat just started is joining: no share waits for it until it has been seen
        # alive for two heartbeat intervals (counted from when b was made: a loaded
        # machine makes the ticks later, the rule is the same).
        interval = a.settings.heartbeat_interval
        counted = wait_for(lambda: a.window.share.beats == 2 and time.monotonic(),
                           10 * interval + 10, "a's share to count b",
                           interval=0.02, between=lambda: (a.tick(), b.tick()))
        assert counted - began >= 2 * interval - 0.05, (
            f"b counted in a's share {counted - began:.2f}s after b was made")
        run_for(a.settings.heartbeat_interval * 2, a, b)
        assert a.window.share.beats == b.window.share.beats == 2
        assert a.window.share.rank != b.window.share.rank
        # (what each held before the shares were set is let go once not due)
        run_for(1, a, b)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for beat in (a, b):
                wait = beat.tick()
                held[beat.owner.id] |= set(beat.window.held)
            time.sleep(min(0.05, max(0.0, wait)))
        both = held[a.owner.id] & held[b.owner.id]
        assert len(both) <= len(names) // 10, f"held by both beats: {sorted(both)}"
        assert held[a.owner.id] and held[b.owner.id], "each beat holds a share"
        sent = occurrences_sent(server)
        twice = {k: n for k, n in Counter(sent).items() if n > 1}
        assert twice == {}, twice
        b.close()
        stopped_at = a.store.now()
        run_for(a.settings.heartbeat_interval * 3 + 3, a)
        late = [n for n in names
                if not any(r.due > stopped_at + 2_000 and r.state is RunState.SENT
                           for r in a.store.history(n))]
        assert not late, f"the stopped beat's share was not taken over: {late}"
    finally:
        a.close()
        b.close()


def test_a_beat_takes_another_beats_late_entries_only_while_it_keeps_up(
        server: RedisServer) -> None:
    """Another live beat's entries are taken once a second late (that beat stopped, or is
    not yet known dead), but not by a beat late itself: it would only race the other for
    their claims."""
    app = make_app(server, schedule={})
    names = [f"late-{i:02d}" for i in range(20)]
    with Entries(app) as entries:
        entries.bulk_create({"name": n, "task": "t.noop", "schedule": {"every": 1}}
                            for n in names)
    store = RedisStore.from_url(server.url, "beat-claims")
    wait_for = store.now() + window.HELP_AFTER + 1_500
    while store.now() < wait_for:  # (no beat runs: every entry falls late)
        time.sleep(0.05)
    share = window.Share(0, 2)
    mine = {n for n in names if n in share}
    assert 0 < len(mine) < len(names)

    def taken(late_here: bool) -> set[str]:
        found = window.DynamicWindow(store, logging.getLogger("test"), 5.0)
        found.share = share
        found.late_here = lambda now: late_here
        return {t.name for t in found.scan(store.now())}

    assert taken(late_here=False) == set(names)
    assert taken(late_here=True) == mine


def test_an_idle_beat_wakes_once_a_heartbeat_interval(server: RedisServer) -> None:
    """An idle beat (dynamic entries, none due soon) reads the due index from its first
    entry in the tick of its heartbeat, and a heartbeat due a moment after the tick at
    hand is taken by it: it wakes once an interval, not once for the heartbeat and again
    for the index's read a moment apart."""
    app = make_app(server, schedule={})
    with Entries(app) as entries:
        entries.bulk_create(idle_entries(100))
    beat = make(app)
    try:
        heartbeats: list[bool] = []  # (whether each tick heartbeated)
        for _ in range(12):
            last = beat.liveness.last
            wait = beat.tick()
            heartbeats.append(beat.liveness.last != last)
            time.sleep(max(0.0, wait))
        assert all(heartbeats[2:]), heartbeats  # (the first: what make() left to do)
    finally:
        beat.close()
