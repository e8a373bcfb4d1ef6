"""'Now' is the store's clock plus monotonic time: a step of the beat host's wall clock
between two heartbeats changes nothing (no occurrence early, none skipped or lost)."""

from __future__ import annotations

import itertools
import time
from datetime import timedelta

import pytest

from beat_claims.enums import RunState

from .conftest import RedisServer, seed_settled_epoch
from .inprocess import make, make_app, occurrences_sent, run_for


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
