"""A store that was never put back is never taken for an older copy.

At each heartbeat a beat asks whether the store still holds its newest writes (its newest
claim, its newest sent mark); a store that lost one of them was put back, and every beat
then registers again what it knows, and nobody claims for a heartbeat TTL. A write the
store no longer holds for another reason (its entry left the schedule and an operator's
prune removed it; a claim given back, taken over, its reply lost) must not start that.
Schedulers ticked in this process against a real store of each kind."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from beat_claims import operations
from beat_claims.enums import RunState
from beat_claims.runs import Owner
from beat_claims.scheduler import Scheduler
from beat_claims.stores.base import Claim, ClaimResult, Release, Store, StoreError

from .any_store import StoreUnderTest, Worker, went_back_lines
from .conftest import RedisServer
from .contract.helpers import A, one_claim, sending
from .inprocess import beats, make, run_for
from .processes import wait_for
from .test_beats_follow_definitions import define

LOGGER = "celery.beat.claims"
#: An entry defined in the store, whose definition a test deletes.
GONE = {"task": "t.noop", "schedule": {"every": 0.5}}


def heartbeats(s: Scheduler, seconds: float) -> None:
    """``s`` heartbeats at once, then ticks for ``seconds`` (a few more heartbeats)."""
    s.liveness.lapse()
    run_for(seconds, s)


@contextlib.contextmanager
def one_beat(any_store: StoreUnderTest, server: RedisServer) -> Iterator[
        tuple[Celery, Scheduler, Store, Worker, Callable[[], None]]]:
    """One beat of an hourly entry on a store that has run a while (no new store's settle
    period), an observer, a worker, and a step that ticks the beat and the worker."""
    app = any_store.app({"kept": {"task": "t.noop", "schedule": timedelta(hours=1)}})
    any_store.settled()
    s = make(app)
    observer = any_store.open()
    worker = Worker(observer, server)

    def step() -> None:
        s.tick()
        worker.step()

    try:
        yield app, s, observer, worker, step
    finally:
        s.close()
        observer.close()


def prune_gone(observer: Store, scheduled: set[str], ttl: float,
               step: Callable[[], None]) -> None:
    """An operator's prune, as ``celery claims prune --older-than 0 --yes`` makes it (it
    keeps what was active within the beats' heartbeat TTL), until it removes 'gone'."""
    wait_for(lambda: operations.prune(observer, scheduled, 0, remove=True,
                                      ttl=ttl).removed == ("gone",),
             ttl + 5, "the prune to remove 'gone'", interval=0.02, between=step)


def no_new_epoch(s: Scheduler, caplog: pytest.LogCaptureFixture) -> None:
    """A few heartbeats of ``s`` say nothing of a store that went back, nor begin an epoch."""
    epoch = s.liveness.epoch
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        heartbeats(s, 1.5)
    assert went_back_lines(caplog.records) == [], caplog.text
    assert s.liveness.epoch == epoch


def test_an_entry_dropped_from_the_schedule_and_pruned_is_not_taken_for_a_put_back(
        any_store: StoreUnderTest, server: RedisServer,
        caplog: pytest.LogCaptureFixture) -> None:
    """The beat's newest writes are of an entry its schedule then drops (its definition
    deleted from the store); an operator's prune removes the entry and its runs. The store
    never went back: the beat must not ask after those writes any more, nor take the store
    for an older copy (a new epoch: the whole fleet registers again and claims nothing for
    a heartbeat TTL)."""
    with one_beat(any_store, server) as (app, s, observer, worker, step):
        define(observer, app, "gone", GONE)
        wait_for(lambda: len(worker.executed) >= 2, 10, "two runs of 'gone' sent and done",
                 interval=0.02, between=step)
        assert {w.entry for w in s.knowledge.written()} == {"gone"}
        define(observer, app, "gone", None)
        wait_for(lambda: "gone" not in s.claimer.states, 5, "the beat to drop 'gone'",
                 interval=0.02, between=step)
        wait_for(lambda: not [r for r in observer.history("gone")
                              if r.state in operations.LIVE_STATES],
                 5, "the runs of 'gone' to finish", interval=0.02, between=step)
        prune_gone(observer, set(s.schedule), s.liveness.ttl, step)
        no_new_epoch(s, caplog)


class LostReplies:
    """The next call of each method named is made (the store acts on it), and its reply is
    lost: the caller gets a StoreError, as after a timeout. A reply ``worth`` losing is one
    its predicate accepts (a claim's reply only when it held a run: otherwise nothing is
    left for the beat to take back, and the loss proves nothing); others pass through."""

    def __init__(self, store: Store,
                 worth: dict[str, Callable[[Any], bool]] | None = None) -> None:
        self.store = store
        self.worth = worth or {}
        self.pending: set[str] = set()
        self.lost: list[str] = []

    def lose(self, *names: str) -> None:
        for name in names:
            if name not in self.pending:
                self.pending.add(name)
                real = getattr(self.store, name)
                setattr(self.store, name, self._losing(name, real))

    def _losing(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            if name in self.pending and self.worth.get(name, lambda _: True)(result):
                self.pending.discard(name)
                self.lost.append(name)
                setattr(self.store, name, real)
                raise StoreError(f"the reply to {name} was lost (test)")
            return result

        return call


def held_a_run(results: list[ClaimResult]) -> bool:
    """Whether a claim's reply gave the beat a run to hold."""
    return any(r.claims or r.taken for r in results)


def test_an_entry_a_beat_let_go_of_then_deleted_and_pruned_is_not_taken_for_a_put_back(
        any_store: StoreUnderTest, server: RedisServer,
        caplog: pytest.LogCaptureFixture) -> None:
    """The beat's newest writes are of a dynamic entry it no longer holds (sent, and not due
    again within the look-ahead: let go); an operator deletes its definition and prunes it.
    Nothing tells the beat of the delete (it does not hold the entry): its heartbeats still
    ask after those writes, and the store answers them removed, not lost. The store never
    went back: no new epoch, and the writes are asked after no more."""
    with one_beat(any_store, server) as (app, s, observer, worker, step):
        define(observer, app, "gone", {"task": "t.noop", "schedule": {"every": 4}})
        wait_for(lambda: worker.executed and "gone" not in s.claimer.states, 15,
                 "a run of 'gone' sent and done, and the beat to let go of it",
                 interval=0.02, between=step)
        assert {w.entry for w in s.knowledge.written()} == {"gone"}
        define(observer, app, "gone", None)
        # (by the time the prune removes it, the beat has heartbeated since its writes)
        prune_gone(observer, set(s.schedule), s.liveness.ttl, step)
        assert {w.entry for w in s.knowledge.written()} == {"gone"}
        no_new_epoch(s, caplog)
        assert s.knowledge.written() == []


def test_an_entry_pruned_and_defined_again_before_a_beat_s_next_heartbeat_is_not_taken_for_a_put_back(  # noqa: E501
        any_store: StoreUnderTest, server: RedisServer,
        caplog: pytest.LogCaptureFixture) -> None:
    """As above, and the operator defines the name again right after the prune, before the
    beat's next heartbeat: a new entry, with an anchor and a counter of its own (no claim
    yet: its counter is below the beat's writes of the entry removed). Those writes are
    of the entry removed, not lost: no new epoch."""
    with one_beat(any_store, server) as (app, s, observer, worker, step):
        define(observer, app, "gone", {"task": "t.noop", "schedule": {"every": 4}})
        wait_for(lambda: worker.executed and "gone" not in s.claimer.states, 15,
                 "a run of 'gone' sent and done, and the beat to let go of it",
                 interval=0.02, between=step)
        define(observer, app, "gone", None)
        prune_gone(observer, set(s.schedule), s.liveness.ttl, step)
        define(observer, app, "gone", {"task": "t.noop", "schedule": {"every": 3600}})
        no_new_epoch(s, caplog)
        assert s.knowledge.written() == []


def test_an_entry_pruned_while_a_beat_could_not_reach_the_store_is_not_taken_for_a_put_back(
        any_store: StoreUnderTest, server: RedisServer,
        caplog: pytest.LogCaptureFixture) -> None:
    """The store held the beat's newest writes (of a dynamic entry it let go of) at a
    heartbeat; then the beat could not reach the store for longer than its heartbeat TTL
    (each heartbeat failed), and meanwhile an operator deleted the entry and pruned it.
    A failed heartbeat takes nothing back from what the last answered one confirmed: once
    the store answers again, the writes are answered removed, not lost (no new epoch)."""
    with one_beat(any_store, server) as (app, s, observer, worker, step):
        define(observer, app, "gone", {"task": "t.noop", "schedule": {"every": 4}})
        wait_for(lambda: worker.executed and "gone" not in s.claimer.states
                 and {w.entry for w in s.knowledge.written()} == {"gone"}
                 and {w.key for w in s.knowledge.written()} <= s.liveness.confirmed, 15,
                 "a run of 'gone' sent and done, let go, and the writes confirmed",
                 interval=0.02, between=step)
        real = s.store.heartbeat

        def unreachable(*args: Any, **kwargs: Any) -> Any:
            raise StoreError("the store cannot be reached from this beat (test)")

        s.store.heartbeat = unreachable  # type: ignore[method-assign]
        try:
            define(observer, app, "gone", None)
            prune_gone(observer, set(s.schedule), s.liveness.ttl, step)
        finally:
            s.store.heartbeat = real  # type: ignore[method-assign]
        no_new_epoch(s, caplog)
        assert s.knowledge.written() == []


def test_an_entry_last_written_by_a_beat_that_stalled_is_kept_by_a_prune_until_it_wakes(
        any_store: StoreUnderTest, server: RedisServer,
        caplog: pytest.LogCaptureFixture) -> None:
    """The beat marks a run of a dynamic entry sent, and stalls (a paused VM) before its
    next heartbeat, for longer than its heartbeat TTL: the store never showed it the mark
    held. The worker runs it; an operator deletes the entry and prunes: the beat's
    heartbeat has lapsed (it is no live beat), yet the prune keeps the entry, which that
    beat wrote of after its last renewal. The beat wakes and takes nothing for a store put
    back; once it heartbeated, the prune removes the entry."""
    with one_beat(any_store, server) as (app, s, observer, worker, step):
        define(observer, app, "gone", {"task": "t.noop", "schedule": {"every": 4}})

        def marked_not_confirmed() -> bool:
            w = s.knowledge.newest_sent
            return w is not None and w.entry == "gone" and w.key not in s.liveness.confirmed

        wait_for(marked_not_confirmed, 15, "a run of 'gone' marked sent, not yet confirmed",
                 interval=0.02, between=step)
        # (the beat stalls: only the worker and the operator act)
        wait_for(lambda: worker.executed, 10, "the worker to run it", interval=0.02,
                 between=worker.step)
        define(observer, app, "gone", None)
        ttl = s.liveness.ttl
        wait_for(lambda: not [o for o in observer.owners() if o.alive], ttl + 5,
                 "the stalled beat's heartbeat to lapse", interval=0.05, between=worker.step)
        # (what `celery claims prune` keeps: this app's schedule; the stalled beat's still
        # has 'gone')
        kept = operations.prune(observer, {"kept"}, 0, remove=True, ttl=ttl)
        assert (kept.removed, kept.kept_recent) == ((), ("gone",)), kept
        no_new_epoch(s, caplog)
        prune_gone(observer, {"kept"}, ttl, step)


def test_a_prune_keeps_an_entry_whose_run_a_beat_checked_and_gave_back_within_the_ttl(
        any_store: StoreUnderTest) -> None:
    """A claim made well ahead of its instant (a jittered occurrence is held until then),
    checked before publish once its instant came, and given back (the publish failed): the
    beat's newest write of the entry is that check, long after the claim. The entry is
    active since the check and the give-back, not since the claim: a prune keeps it for
    the beats' heartbeat TTL (else the beat, which has not heartbeated since, would take
    the removal for a store put back)."""
    ttl = 1.0
    store = any_store.open()
    try:
        c = one_claim(store, A)
        claimed_at = store.history("e")[0].claimed_at or 0
        wait_for(lambda: store.now() > claimed_at + ttl * 1000 + 50, 5,
                 "the claim to be older than the TTL", interval=0.02)
        sending(store, A, c)
        assert store.release(A, [Release(c, error="cannot serialize")], max_attempts=3) == [
            RunState.DUE]
        pruned = operations.prune(store, set(), 0, remove=False, ttl=ttl)
        assert pruned.kept_recent == ("e",), (pruned, store.history("e"))
    finally:
        store.close()


def test_a_fleet_through_prunes_lost_replies_releases_and_restarts_never_takes_its_store_for_an_older_copy(  # noqa: E501
        any_store: StoreUnderTest, server: RedisServer,
        caplog: pytest.LogCaptureFixture) -> None:
    """Two beats and a worker; one beat loses the reply to each of its writes (a claim,
    the check before publish, a sent mark, a release, a take-back, a heartbeat); an
    operator releases a claim being published; that beat stops and starts again (the same
    owner); an entry leaves both schedules (its definition deleted) and is pruned. Nothing
    of that is a store put back: no beat may say the store lost writes."""
    schedule = {f"e{i}": {"task": "t.noop", "schedule": timedelta(seconds=0.5)}
                for i in range(3)}
    app = any_store.app(schedule)
    any_store.settled()  # (the store has run a while: no new store's settle period)
    a, b = beats(app, app)
    observer = any_store.open()
    define(observer, app, "gone", GONE)
    worker = Worker(observer, server)
    lossy = LostReplies(a.store, {"claim": held_a_run})
    released: list[bool] = []
    failing: list[str] = []
    real_publish = a._publish

    def publish(entry: Any, claim: Claim, task_id: str) -> Any:
        if not released and claim.entry == "e1":  # an operator releases it meanwhile
            released.append(operations.release(observer, claim.entry, claim.due,
                                               "alice@ops").released)
        if failing:  # this message cannot be sent: given back (due again), retried
            raise ValueError(failing.pop())
        return real_publish(entry, claim, task_id)

    def step() -> None:
        for s in (a, b):
            s.tick()
        worker.step()

    def work_for(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            step()
            time.sleep(0.02)

    caplog.set_level(logging.WARNING, logger=LOGGER)
    try:
        a._publish = publish  # type: ignore[method-assign]
        wait_for(lambda: released, 10, "an operator's release", interval=0.02, between=step)
        assert released == [True]
        # (a claim whose reply is lost is taken back by the beat's sweep: a take-back)
        for names in (("claim", "reclaim"), ("check",), ("record_sent",), ("release",),
                      ("heartbeat",)):
            lossy.lose(*names)
            a.claimer.check_with_claim = names != ("check",)
            if names == ("release",):
                failing.append("cannot serialize")
            wait_for(lambda n=names: set(n) <= set(lossy.lost), 20,  # type: ignore[misc]
                     f"the replies to {names} lost", interval=0.02, between=step)
            a.liveness.lapse()
            work_for(0.5)
        a.close()  # (its held claims are given back)
        work_for(2)  # started again at its next tick: the same owner
        assert any(entry == "gone" for entry, _, _ in worker.executed)
        define(observer, app, "gone", None)
        wait_for(lambda: all("gone" not in s.claimer.states for s in (a, b)), 5,
                 "the beats to drop 'gone'", interval=0.02, between=step)
        wait_for(lambda: not [r for r in observer.history("gone")
                              if r.state in operations.LIVE_STATES],
                 10, "the runs of 'gone' to finish", interval=0.02, between=step)
        prune_gone(observer, set(a.schedule), a.liveness.ttl, step)
        for s in (a, b):
            s.liveness.lapse()
        work_for(2)
    finally:
        a.close()
        b.close()
        observer.close()
    assert went_back_lines(caplog.records) == [], caplog.text


def test_a_beat_back_from_a_stall_registers_in_an_epoch_begun_meanwhile_without_beginning_one(
        any_store: StoreUnderTest, caplog: pytest.LogCaptureFixture) -> None:
    """Another beat began a new epoch (it found the store went back) while this one was
    stalled, and the store settled before it came back: that epoch began after this beat's
    last heartbeat, so it is not an earlier one put back. The beat registers again what it
    knows in it, and begins none of its own (which would make the whole fleet register
    again, and claim nothing for a TTL)."""
    app = any_store.app({"e": {"task": "t.noop", "schedule": timedelta(seconds=0.5)}})
    s = make(app)
    observer = any_store.open()
    resync = Owner("resync", "test", 1, 0.0)
    try:
        run_for(1, s)
        begun = observer.heartbeat(resync, s.liveness.ttl, resync=True)
        observer.leave(resync)
        wait_for(lambda: observer.now() > (begun.settle_until or 0) + 200, 10,
                 "the new epoch to settle while the beat is stalled")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            heartbeats(s, 1.5)
        assert [line for line in went_back_lines(caplog.records)
                if "epoch changed" not in line] == [], caplog.text
        assert s.liveness.epoch == begun.epoch
    finally:
        s.close()
        observer.close()
