"""A store that was never put back is never taken for an older copy.

At each heartbeat a beat asks whether the store still holds its newest writes (its newest
claim, its newest sent mark); a store that lost one of them was put back, and every beat
then registers again what it knows, and nobody claims for a heartbeat TTL. A write the
store no longer holds for another reason (its entry left the schedule and an operator's
prune removed it; a claim given back, taken over, its reply lost) must not start that.
Schedulers ticked in this process against a real store of each kind."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from beat_claims import operations
from beat_claims.scheduler import Scheduler

from .any_store import KINDS, StoreUnderTest, Worker, store_of, went_back_lines
from .conftest import RedisServer
from .inprocess import make, run_for
from .processes import wait_for

LOGGER = "celery.beat.claims"


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, server: RedisServer,
          tmp_path: Path) -> Iterator[StoreUnderTest]:
    with store_of(request.param, server, tmp_path) as made:
        yield made


def heartbeats(s: Scheduler, seconds: float) -> None:
    """``s`` heartbeats at once, then ticks for ``seconds`` (a few more heartbeats)."""
    s.liveness.lapse()
    run_for(seconds, s)


def test_an_entry_dropped_from_the_schedule_and_pruned_is_not_taken_for_a_put_back(
        store: StoreUnderTest, server: RedisServer,
        caplog: pytest.LogCaptureFixture) -> None:
    """The beat's newest writes are of an entry its schedule then drops (an entry removed
    from beat_schedule, a django row deleted); an operator's prune removes the entry and
    its runs. The store never went back: the beat must not ask after those writes any more,
    nor take the store for an older copy (a new epoch: the whole fleet registers again and
    claims nothing for a heartbeat TTL)."""
    app = store.app({"gone": {"task": "t.noop", "schedule": timedelta(seconds=0.5)},
                     "kept": {"task": "t.noop", "schedule": timedelta(hours=1)}})
    s = make(app)
    observer = store.open()
    worker = Worker(observer, server)
    try:
        def step() -> None:
            s.tick()
            worker.step()

        wait_for(lambda: len(worker.executed) >= 2, 10, "two runs of 'gone' sent and done",
                 interval=0.02, between=step)
        assert {w.entry for w in s.knowledge.written()} == {"gone"}
        del s.schedule["gone"]
        s.entries_changed()
        wait_for(lambda: "gone" not in s.claimer.states, 5, "the beat to drop 'gone'",
                 interval=0.02, between=step)
        wait_for(lambda: not [r for r in observer.history("gone")
                              if r.state in operations.LIVE_STATES],
                 5, "the runs of 'gone' to finish", interval=0.02, between=step)
        pruned = operations.prune(observer, set(s.schedule), 0, remove=True)
        assert pruned.removed == ("gone",), pruned
        epoch = s.liveness.epoch
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            heartbeats(s, 1.5)
        assert went_back_lines(caplog.records) == [], caplog.text
        assert s.liveness.epoch == epoch
    finally:
        s.close()
        observer.close()
