"""A copy of the store put back in place is noticed, whatever it lacks and whenever it
comes, and once noticed it is settled for.

The copy keeps the store's epoch and identity (SQLite's backup API, a PostgreSQL
data-only dump loaded again, every Redis key RESTOREd), so a beat learns it only from what
the store no longer holds of its writes. Schedulers ticked in this process against a real
store of each kind, a worker's part done from the broker's messages: nothing is sent
twice, no token is used for two occurrences, and the beat says the store went back."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from beat_claims.entries import Entries
from beat_claims.runs import Owner
from beat_claims.scheduler import Scheduler
from beat_claims.stores.base import Check, CheckResult, Claim

from .any_store import (
    StoreUnderTest,
    Worker,
    published,
    sent_twice,
    store_of,
    went_back_lines,
)
from .conftest import RedisServer
from .inprocess import beats, joined, make
from .processes import next_due_in, wait_for
from .test_store_put_back import Copy

LOGGER = "celery.beat.claims"
#: The share of their TTL beats late (alive) are silent for while others tick: the rest is
#: the margin for a step that overruns on a loaded host (2.25 s at a 2.5 s interval).
SILENT = 0.7
#: The most of their TTL they are kept silent for when the others must tick longer (a
#: put-back that took a while): the rest is the margin for a step that overruns.
SILENT_MOST = 0.88
#: How long the others tick alone at least, from their first step after the put-back:
#: half a TTL and half a second (a beat that joined once the silent ones had been silent
#: for half a TTL would join meanwhile). Shorter, the test checks nothing: it says so.
ALONE_SHARE, ALONE_MORE = 0.5, 0.5


def ticking(worker: Worker, *schedulers: Scheduler) -> Callable[[], None]:
    """One step of the fleet: each beat ticks, the worker runs what was published."""
    def step() -> None:
        for s in schedulers:
            s.tick()
        worker.step()

    return step


def put_back_after_heartbeats(copy: Copy, server: RedisServer,
                              *alive: Scheduler) -> tuple[float, int]:
    """Each of ``alive`` heartbeats, then the copy is put back: since when (monotonic) they
    are silent (the first one's heartbeat was asked then), and how many messages were
    published by then."""
    for s in alive:
        s.liveness.lapse()
        s.tick()
    silent_from = min(s.liveness.renewed for s in alive)
    copy.put_back()
    return silent_from, len(published(server))


def alone_while_silent(silent_from: float, ttl: float, step: Callable[[], None],
                       who: str) -> None:
    """``step`` (beats other than the silent ones) until the silent ones have been silent
    for SILENT of their TTL, from when their first heartbeat was asked (a put-back taking
    a while under load is part of it), and the others have stepped alone for
    ALONE_SHARE of it and ALONE_MORE (from their first step, after the put-back); for
    SILENT_MOST of the TTL at most. A silence of a TTL or more (a step that overran the
    margin on a loaded host), or the others alone for less (a put-back that took most of
    the TTL), is not the failure the caller is about, nor its absence: it says so, with
    how long the steps took."""
    alone_from = time.monotonic()
    need = ALONE_SHARE * ttl + ALONE_MORE
    until = max(silent_from + SILENT * ttl, alone_from + need)
    cap = silent_from + SILENT_MOST * ttl
    took: list[float] = []

    def timings() -> str:
        return (f"(the put-back and the heartbeats before it took"
                f" {alone_from - silent_from:.1f}s; {len(took)} steps, the longest"
                f" {max(took, default=0):.1f}s)")

    if until > cap:
        raise RuntimeError(
            f"inconclusive: the others could step alone for at most {cap - alone_from:.1f}s"
            f" with {who} silent for less than {SILENT_MOST} of their TTL ({ttl}s), less"
            f" than the {need:.2f}s that a beat joining early would need {timings()}")
    while not took or time.monotonic() < until:  # (once at least)
        began = time.monotonic()
        step()
        took.append(time.monotonic() - began)
        time.sleep(0.02)
    ended = time.monotonic()
    silent = ended - silent_from
    if silent >= ttl:
        raise RuntimeError(
            f"{who} silent {silent:.1f}s, a TTL ({ttl}s) or more: taken for dead"
            f" {timings()}")


def work_for(seconds: float, step: Callable[[], None]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        step()
        time.sleep(0.02)


def test_a_copy_put_back_between_the_check_and_the_sent_mark_is_noticed(
        any_store: StoreUnderTest, server: RedisServer,
        caplog: pytest.LogCaptureFixture) -> None:
    """The copy is taken just before a check before publish (it holds the run claimed by
    this beat), and put back just before that run's sent mark: the mark is refused (the
    run is not handed over in the copy), and the copy still holds the beat's newest claim
    (claimed) and its newest sent mark (the one before). The store lost the check that let
    the beat publish: the beat must find it out, and must not take that run for a claim of
    its own it forgot, to send again."""
    any_store.settled()
    app = any_store.app({"e": {"task": "t.noop", "schedule": timedelta(seconds=1)}})
    s = make(app)
    s.claimer.check_with_claim = False  # a claim, then its own check before publish
    worker = Worker(any_store.open(), server)
    step = ticking(worker, s)
    copy = any_store.copy()
    victim: list[Claim] = []
    real_check, real_sent = s.store.check, s.store.record_sent

    def check(owner: Owner, checks: Sequence[Check]) -> list[CheckResult]:
        if not victim and len(published(server)) >= 2:
            copy.take()
            victim.extend(c.claim for c in checks)
        return real_check(owner, checks)

    def record_sent(owner: Owner, claims: Sequence[Claim]) -> int:
        if victim and victim[0] in claims and copy.put_back is not None:
            copy.put_back()
            copy.put_back = None  # type: ignore[assignment]  # once
        return real_sent(owner, claims)

    s.store.check = check  # type: ignore[method-assign]  # the object the sender holds
    s.store.record_sent = record_sent  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, logger=LOGGER)
    try:
        wait_for(lambda: copy.put_back is None, 15, "the copy put back before a sent mark",
                 interval=0.02, between=step)
        sent = len(published(server))
        wait_for(lambda: went_back_lines(caplog.records), 5, "the beat to notice",
                 interval=0.02, between=step)
        work_for(3, step)  # settled, and claiming again
        assert len(published(server)) > sent
    finally:
        s.close()
    assert sent_twice(server) == {}, published(server)


def test_a_copy_lacking_only_a_beat_s_registration_is_noticed(
        any_store: StoreUnderTest, server: RedisServer,
        caplog: pytest.LogCaptureFixture) -> None:
    """The copy is taken while one beat runs; a second beat starts, registers its entry
    (hourly: nothing falls due here, so it writes nothing else) and heartbeats; the copy
    is put back. It lacks the second beat's heartbeat record and its registration of the
    entry (and, but on Redis, whose RESTORE leaves the keys made since, the entry itself):
    the beat must find that out at its next heartbeat, and register again what it knows
    (every beat does, in a new epoch). Nothing of it is found out from the first beat,
    whose records the copy holds."""
    hourly = {"task": "t.noop", "schedule": timedelta(hours=1)}
    any_store.settled()
    a = make(any_store.app({"first": hourly}))
    observer = any_store.open()
    copy = any_store.copy()
    copy.take()
    b = joined(any_store.app({"second": hourly}), a)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    try:
        assert b.knowledge.written() == []
        [record] = observer.entries(["second"])
        assert [r.owner for r in record.registrants or ()] == [b.owner.id]
        copy.put_back()
        b.liveness.lapse()
        wait_for(lambda: went_back_lines(caplog.records), 5, "the beat to notice",
                 interval=0.02, between=lambda: (a.tick(), b.tick()))
        assert b.owner.id in [r.owner for r in observer.entries(["second"])[0].registrants
                              or ()]
    finally:
        a.close()
        b.close()
        observer.close()


#: An operator's client that starts a new epoch, as a beat that found the store went back
#: does (it leaves at once: it is no beat).
RESYNC = Owner("resync", "test", 1, 0.0)


def test_a_copy_of_an_earlier_epoch_put_back_is_settled_for_once(
        any_store: StoreUnderTest, server: RedisServer,
        caplog: pytest.LogCaptureFixture) -> None:
    """The copy is taken in one epoch; beat B sends more, then the store begins a new
    epoch (both beats register again what they know, and forget their newest writes: what
    they registered replaces them), and, while it settles, the copy is put back: its epoch
    is the earlier one, which settled long ago, and it lacks the runs B sent since it was
    taken. Beat A, which heartbeats first, must not take that epoch for a new one to
    register in and claim at once (catch_up "all": it may send again the runs B sent,
    before B registers them): the store must settle again, for every beat, and A claims
    nothing before B has registered. Once it has, nobody notices anything any more."""
    app = any_store.app({"e": {"task": "t.noop", "schedule": timedelta(seconds=0.5),
                               "claims": {"catch_up": "all"}}},
                        beat_claims_heartbeat_interval=1)  # a TTL of 3 s
    any_store.settled()
    a, b = beats(app, app)
    observer = any_store.open()
    worker = Worker(observer, server)
    step = ticking(worker, a, b)
    copy = any_store.copy()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    try:
        wait_for(lambda: len(published(server)) >= 2, 10, "runs before the copy",
                 interval=0.02, between=step)
        copy.take()
        sent = len(published(server))
        wait_for(lambda: len(published(server)) >= sent + 2, 5, "runs B sends after the copy",
                 interval=0.02, between=ticking(worker, b))
        observer.heartbeat(RESYNC, a.liveness.ttl, resync=True)
        observer.leave(RESYNC)
        wait_for(lambda: a.liveness.settling_for() > 0 and b.liveness.settling_for() > 0
                 and not (a._went_back_why or b._went_back_why), 5,
                 "both beats to register again in the new epoch", interval=0.02,
                 between=step)
        assert a.knowledge.written() == b.knowledge.written() == []
        copy.put_back()
        caplog.clear()
        before = len(published(server))
        a.liveness.lapse()
        work_for(1.2, ticking(worker, a))  # A heartbeats first, B within its interval
        assert went_back_lines(caplog.records), caplog.text
        assert published(server)[before:] == [], "A claimed before B could register"
        work_for(6, step)
        noticed = went_back_lines(caplog.records)
        assert 1 <= len(noticed) <= 2, noticed  # (each beat once, at most)
        caplog.clear()
        work_for(2, step)
        assert went_back_lines(caplog.records) == []
        assert a.liveness.epoch == b.liveness.epoch
    finally:
        a.close()
        b.close()
        observer.close()
    assert sent_twice(server) == {}, published(server)


def test_a_copy_put_back_under_beats_late_by_less_than_a_ttl_is_not_sent_again(
        any_store: StoreUnderTest, server: RedisServer,
        caplog: pytest.LogCaptureFixture) -> None:
    """Two beats run; a copy is taken after one occurrence ran and put back after the next
    ran; a third beat starts at once. The running beats are alive (they heartbeated just
    before the copy was put back, and are silent for less than a TTL) but late, as on a
    loaded host: the third beat ticks alone for most of their TTL. It must wait for them
    (they have still to find out that the store went back), claim nothing meanwhile, and
    not send the occurrence the copy lost once they have; the running beats find it out,
    and the store begins a new epoch in the very heartbeat that does."""
    # A TTL of 15 s: late by 10.5 s at least, with a margin of 1.8 s at least; room for a
    # put-back of 5 s on a loaded host (a PostgreSQL one took 3.4 s, with the heartbeats,
    # beside the whole suite) before the joiner ticks alone for half a TTL and more. The
    # copy is put back once it is older than a TTL: its heartbeats are (the joiner finds
    # a store whose heartbeats are old: it must wait a TTL).
    interval = 5.0
    app = any_store.app({"e": {"task": "t.noop", "schedule": timedelta(seconds=10)}},
                        beat_claims_heartbeat_interval=interval)
    any_store.settled()
    next_due_in(any_store.url, {"e": {"every": 10}}, 1)  # (not a whole period from now)
    a, b = beats(app, app)
    worker = Worker(any_store.open(), server)
    step = ticking(worker, a, b)
    copy = any_store.copy()
    c: Scheduler | None = None
    caplog.set_level(logging.WARNING, logger=LOGGER)
    try:
        wait_for(lambda: worker.executed, 15, "an occurrence run", interval=0.02,
                 between=step)
        copy.take()
        taken = time.monotonic()
        wait_for(lambda: len(worker.executed) >= 2 and time.monotonic() - taken
                 > a.liveness.ttl + 0.5, 30, "an occurrence the copy lacks, and the copy"
                 " older than a TTL", interval=0.02, between=step)
        c = Scheduler(app=app)  # (made now; it first heartbeats at its first tick)
        joiner = c
        silent_from, sent = put_back_after_heartbeats(copy, server, a, b)
        # a and b late (alive, silent for less than a TTL): only the third beat ticks.
        alone_while_silent(silent_from, a.liveness.ttl,
                           lambda: (joiner.tick(), worker.step()), "a and b")
        assert not joiner.liveness.join.joined, "the third beat joined beside live beats"
        assert published(server)[sent:] == [], "the third beat sent while they were silent"
        epochs = {a.liveness.epoch}
        work_for(3, ticking(worker, a, b, c))
        epochs |= {s.liveness.epoch for s in (a, b, c)}
    finally:
        for s in (a, b, *([c] if c else [])):
            s.close()
    runs = [(entry, due) for entry, due, _ in worker.executed]
    assert len(runs) == len(set(runs)), (worker.executed, published(server)[sent:])
    assert sent_twice(server) == {}, published(server)
    assert went_back_lines(caplog.records)  # (the running beats found it out)
    assert len(epochs) >= 2, "no new epoch began"


def test_an_old_copy_put_back_is_noticed_by_a_beat_that_lost_none_of_its_writes(
        any_store: StoreUnderTest, server: RedisServer,
        caplog: pytest.LogCaptureFixture) -> None:
    """A copy older than a TTL (a backup): the beats it shows have lapsed in it. Beat B,
    whose records the copy holds and which wrote nothing since (an hourly entry), is the
    first to heartbeat after the copy is put back; beat A, which sent runs the copy lacks,
    is late (alive, silent for less than a TTL). A beat started just after B's heartbeat
    sees a recent heartbeat and no live beat but B: it must not claim the runs A sent
    (catch_up "all") before A has registered them. The copy lacks B's own last heartbeat:
    B must find out that the store went back, though it lost nothing else."""
    interval = 2.5  # a TTL of 7.5 s
    sent_often = any_store.app({"e": {"task": "t.noop", "schedule": timedelta(seconds=1),
                                      "claims": {"catch_up": "all"}}},
                               beat_claims_heartbeat_interval=interval)
    hourly = any_store.app({"quiet": {"task": "t.noop", "schedule": timedelta(hours=1)}},
                           beat_claims_heartbeat_interval=interval)
    any_store.settled()
    a = make(sent_often)
    b = joined(hourly, a)
    worker = Worker(any_store.open(), server)
    copy = any_store.copy()
    c: Scheduler | None = None
    caplog.set_level(logging.WARNING, logger=LOGGER)
    try:
        wait_for(lambda: worker.executed, 15, "an occurrence run", interval=0.02,
                 between=ticking(worker, a, b))
        copy.take()
        taken = time.monotonic()
        # Older than a TTL, with runs it lacks; B heartbeats on time meanwhile.
        wait_for(lambda: time.monotonic() - taken > a.liveness.ttl + 0.5
                 and len(worker.executed) >= 3, 15, "runs the copy lacks", interval=0.02,
                 between=ticking(worker, a, b))
        assert b.knowledge.written() == []
        silent_from, sent = put_back_after_heartbeats(copy, server, a)
        b.liveness.lapse()  # B heartbeats first
        b.tick()
        c = Scheduler(app=sent_often)
        # A late (alive, silent for less than a TTL): B and the new beat tick.
        alone_while_silent(silent_from, a.liveness.ttl,
                           lambda: (b.tick(), c.tick(), worker.step()), "a")
        assert published(server)[sent:] == [], "the new beat sent while A was silent"
        assert went_back_lines(caplog.records), "B did not notice"
        work_for(4, ticking(worker, a, b, c))
    finally:
        for s in (a, b, *([c] if c else [])):
            s.close()
    assert sent_twice(server) == {}, published(server)


def _ms(due: str) -> int:
    return int(datetime.fromisoformat(due.replace("Z", "+00:00")).timestamp() * 1000)


def test_an_occurrence_the_copy_lost_is_not_taken_again_before_a_heartbeat(
        any_store: StoreUnderTest, server: RedisServer,
        caplog: pytest.LogCaptureFixture) -> None:
    """A dynamic entry of beat A's share, B ticking alone (see the scenario below): B must
    heartbeat before it claims what it read already due."""
    copy_lost_not_taken_again(any_store, server, "a dynamic entry, another beat ticking",
                              caplog)


@pytest.mark.parametrize("case", [
    "a dynamic entry, the beat that sent it ticking",
    "a beat_schedule entry, another beat ticking",
])
def test_an_occurrence_the_copy_lost_is_not_taken_again_by_a_beat_that_knew_of_it(
        server: RedisServer, tmp_path: Path, case: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """The cases the beats' own memory covers (the checkpoint they knew meets the copy's
    older state: no heartbeat needed), on one store: the beat-side logic is the same on
    every store."""
    with store_of("sqlite", server, tmp_path) as store:
        copy_lost_not_taken_again(store, server, case, caplog)


def alive_together_for_two_intervals(*schedulers: Scheduler) -> None:
    """The beats have run beside one another for two heartbeat intervals, as if started that
    long ago: the due index is shared among beats seen alive that long
    (``Liveness.sharers``), each beat reckoning from when it first saw the other alive.
    Each heartbeats (and sees the others alive), that moment is put two intervals back, and
    each heartbeats again (the share is made at a heartbeat); ten seconds of waiting at the
    default interval, for nothing this test is about."""
    for s in schedulers:
        s.liveness.lapse()
        s.tick()
    for s in schedulers:
        back = 2 * s.liveness.interval
        s.liveness._seen = {i: seen - back for i, seen in s.liveness._seen.items()}
        s.liveness.lapse()
        s.tick()


def copy_lost_not_taken_again(any_store: StoreUnderTest, server: RedisServer, case: str,
                              caplog: pytest.LogCaptureFixture) -> None:
    """Two beats run an entry every 4 s; a copy is taken after one occurrence ran, and put
    back about 1.3 s after beat A sent the next one, R (the copy shows the entry due at R,
    unclaimed, more than HELP_AFTER late). Both beats heartbeated just before; then one of
    them ticks alone for less than its heartbeat interval (the other is late, alive), then
    both. R must not be sent again, whoever ticks.

    A beat_schedule entry is held by every beat, which tried R too (and lost it to A): its
    next claim is a compare-and-set on the state after R, and meets the copy's older one.
    A dynamic entry is held by the beat whose share it is: A, having let it go between two
    occurrences, kept what it knew aside, and meets the older state when it takes the
    entry from the index again. Beat B never held it, and knows nothing of R: it reads the
    due index from its first entry in time for the entry's next instant, 1.7 s after its
    heartbeat (less than half an interval: no heartbeat comes with the send), sees R more
    than HELP_AFTER late, and takes A's share. It must heartbeat before it claims what it
    read already due (a copy put back since its last heartbeat may show it), and so find
    out that the store went back."""
    interval = 5.0  # (the default) a TTL of 15 s; a scan of the due index every quarter second
    dynamic = case.startswith("a dynamic")
    every = {"task": "t.noop", "schedule": timedelta(seconds=4)}
    app = any_store.app({} if dynamic else {"e": every},
                        beat_claims_heartbeat_interval=interval)
    any_store.settled()  # (else the beats' new epoch settles for a TTL of 15 s)
    a, b = beats(app, app)
    worker = Worker(any_store.open(), server)
    copy = any_store.copy()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    try:
        name = "e"
        if dynamic:  # (shared among beats seen alive for two intervals)
            alive_together_for_two_intervals(a, b)
            wait_for(lambda: a.window.share.beats == b.window.share.beats == 2, 30,
                     "the due index shared by both beats", interval=0.02,
                     between=ticking(worker, a, b))
            name = next(f"dyn-{i}" for i in range(100) if f"dyn-{i}" in a.window.share)
            with Entries(app) as entries:
                entries.create(name, "t.noop", {"every": 4})
        wait_for(lambda: worker.executed, 15, "an occurrence run", interval=0.02,
                 between=ticking(worker, a, b))
        copy.take()
        wait_for(lambda: len(worker.executed) >= 2, 15, "an occurrence the copy lacks",
                 interval=0.02, between=ticking(worker, a, b))
        entry, due, token = worker.executed[-1]
        assert entry == name
        sender, other = (a, b) if a.knowledge.newest_claim is not None and (
            a.knowledge.newest_claim.token == token) else (b, a)
        assert sender.knowledge.newest_claim is not None
        assert sender.knowledge.newest_claim.token == token
        if dynamic:
            assert sender is a, "B took A's share"
        wait_for(lambda: time.time() * 1000 > _ms(due) + 1300, 5, "R late by 1.3 s",
                 interval=0.02, between=ticking(worker, a, b))
        silent_from, sent = put_back_after_heartbeats(copy, server, a, b)
        alone = sender if case.endswith("the beat that sent it ticking") else other
        # (less than an interval since their heartbeats, whatever the put-back took: the
        # due index is scanned every quarter second, R is late already)
        work_for(interval * 0.8 - (time.monotonic() - silent_from),
                 lambda: (alone.tick(), worker.step()))
        if time.monotonic() - silent_from >= interval - 0.1:
            raise RuntimeError("the window outlasted a heartbeat interval")
        again = [p for p in published(server)[sent:] if p[:2] == (entry, due)]
        work_for(5, ticking(worker, a, b))
    finally:
        a.close()
        b.close()
    assert again == [], f"{(entry, due)} sent again before a heartbeat: {again}"
    assert sent_twice(server) == {}, published(server)
    assert went_back_lines(caplog.records)
