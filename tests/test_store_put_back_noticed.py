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
from datetime import timedelta

import pytest

from beat_claims.runs import Owner
from beat_claims.scheduler import Scheduler
from beat_claims.stores.base import Check, CheckResult, Claim

from .any_store import (
    StoreUnderTest,
    Worker,
    published,
    sent_twice,
    went_back_lines,
)
from .conftest import RedisServer
from .inprocess import joined, make
from .processes import wait_for

LOGGER = "celery.beat.claims"


def ticking(worker: Worker, *schedulers: Scheduler) -> Callable[[], None]:
    """One step of the fleet: each beat ticks, the worker runs what was published."""
    def step() -> None:
        for s in schedulers:
            s.tick()
        worker.step()

    return step


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
