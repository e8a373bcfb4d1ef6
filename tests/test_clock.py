"""'Now' is the store's clock plus monotonic time: a step of the beat host's wall clock
between two heartbeats changes nothing (no occurrence early, none skipped or lost)."""

from __future__ import annotations

import itertools
import logging
import time
from datetime import timedelta
from pathlib import Path

import pytest

from beat_claims.enums import RunState

from .conftest import RedisServer, seed_settled_epoch
from .inprocess import beats, make, make_app, occurrences_sent, run_for


@pytest.mark.parametrize("step", [3600, -3600], ids=["forward-1h", "back-1h"])
def test_a_step_of_the_wall_clock_between_heartbeats_changes_nothing(
        server: RedisServer, monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1),
                                  "claims": {"run_timeout": 30}}},
                   beat_claims_heartbeat_interval=2, beat_claims_catch_up="all")
    seed_settled_epoch(server)  # (claims at once, not after a TTL of 6 s)
    s = make(app)
    run_for(1.2, s)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + step)
    started = real()
    run_for(3.5, s)
    monkeypatch.undo()
    ended = real()
    history = s.store.history("e")
    assert [r for r in history if r.state in (RunState.SKIPPED, RunState.LOST)] == []
    dues = sorted(r.due for r in history)
    assert all(b - a == 1000 for a, b in itertools.pairwise(dues))
    # None early: every run was sent at or after its due instant, by the store's clock.
    assert all(r.sent_at is not None and r.sent_at >= r.due for r in history
               if r.state is RunState.SENT)
    # Only what fell due: about one per second, not an hour's worth.
    assert max(dues) <= ended * 1000 + 50
    assert len([d for d in dues if d >= started * 1000]) <= 5
    assert len(occurrences_sent(server)) == len(history)
    s.close()


@pytest.mark.parametrize("step_s", [-300, 300], ids=["back-5min", "forward-5min"])
def test_a_step_of_the_store_s_clock_begins_a_bounded_number_of_epochs(
        server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, step_s: int) -> None:
    """SQLite's clock is the host's. Three beats run; the clock steps by minutes, and a new
    epoch begins (an operator's resync): a beat whose last heartbeat the store's clock now
    reads as later than that epoch's start takes it for an earlier epoch put back, and the
    store begins another. Each beat does so once at most: the epochs then stay as they
    are, not one more at every heartbeat (no beat would ever claim again)."""
    from beat_claims.runs import Owner
    from beat_claims.stores import sqlite as sqlite_store

    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(hours=1)}},
                   beat_claims_url=f"sqlite:///{tmp_path}/claims.db",
                   beat_claims_heartbeat_interval=0.5)  # a TTL of 1.5 s
    fleet = beats(app, app, app)
    observer = fleet[0].store
    try:
        run_for(1, *fleet)
        before = {s.liveness.epoch for s in fleet}
        real = sqlite_store._now
        monkeypatch.setattr(sqlite_store, "_now", lambda: real() + step_s * 1000)
        operator = Owner("resync", "test", 1, 0.0)
        observer.heartbeat(operator, 1.5, resync=True)
        observer.leave(operator)
        caplog.set_level(logging.WARNING, logger="celery.beat.claims")
        epochs: list[str] = []

        def watch() -> None:
            for s in fleet:
                s.tick()
                if s.liveness.epoch is not None and (not epochs
                                                     or epochs[-1] != s.liveness.epoch):
                    epochs.append(s.liveness.epoch)

        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            watch()
            time.sleep(0.02)
        begun = len(set(epochs) - before)  # (the resync's, and one a beat at most)
        assert begun <= 1 + len(fleet), epochs
        deadline = time.monotonic() + 3  # two TTLs more: nothing begins any more
        while time.monotonic() < deadline:
            watch()
            time.sleep(0.02)
        assert len(set(epochs) - before) == begun, caplog.text
        assert len({s.liveness.epoch for s in fleet}) == 1
    finally:
        for s in fleet:
            s.close()
