"""An idle beat's heartbeat and sweep are one round trip, and the sweep's answer that came
with the heartbeat is used only while it holds.

The sweep's query is built before the heartbeat, so its live owners are those of the
heartbeat before: when one of them is gone by this heartbeat, the answer may lack that
owner's claims, and the sweep asks the store again instead of waiting for the next one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from beat_claims.enums import RunState
from beat_claims.runs import iso
from beat_claims.scheduler import Scheduler

from .conftest import RedisServer
from .inprocess import beats, make, make_app, occurrences_sent, run_for
from .processes import wait_for

pytestmark = pytest.mark.usefixtures("settled_store")


def _count_calls(s: Scheduler, *names: str) -> dict[str, int]:
    """Count the store's calls of ``names`` (and the Redis store's round trips)."""
    counts = dict.fromkeys((*names, "round_trips"), 0)
    store: Any = s.store

    def counted(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return real(*args, **kwargs)
        return call

    for name in names:
        setattr(store, name, counted(name, getattr(store, name)))
    store._round_trip = counted("round_trips", store._round_trip)
    return counts


def test_an_idle_beat_heartbeats_and_sweeps_in_one_round_trip(server: RedisServer) -> None:
    app = make_app(server, {"hourly": {"task": "t.noop", "schedule": timedelta(hours=1)}})
    s = make(app)
    run_for(1.0, s)  # past the first heartbeat and sweep
    counts = _count_calls(s, "heartbeat", "live_runs", "changes", "due_ahead")
    run_for(3.2, s)  # heartbeat_interval=0.5: six heartbeats or so
    assert counts["heartbeat"] >= 3, counts
    # (One tick stalled for a whole interval under load would ask apart once: allowed.)
    assert counts["live_runs"] <= 1, f"the sweeps asked the store apart: {counts}"
    # Little else is asked of the store while idle: the change feed of the definitions,
    # read with each heartbeat too (in its round trip), the due index once a heartbeat
    # interval (nothing is due soon: what falls due within the look-ahead and the next
    # instant after it, one round trip), the lost-run look (every 5 s at most).
    assert counts["changes"] <= 1, f"the change feed was read apart: {counts}"
    assert counts["due_ahead"] <= counts["heartbeat"] + 1, counts
    assert counts["round_trips"] <= (counts["heartbeat"] + counts["live_runs"]
                                     + counts["changes"] + counts["due_ahead"] + 2), counts
    s.close()


def test_a_claim_of_an_owner_gone_since_the_last_heartbeat_is_taken_back_at_once(
        server: RedisServer) -> None:
    """B holds a claim and stops (its heartbeat is gone at once). A's next sweep asks its
    query with the heartbeat that finds B gone, built while B was alive: the answer lacks
    B's claim, so the sweep asks again and takes the claim back in this very tick."""
    app = make_app(server, beat_claims_reclaim_after=60)
    a, b = beats(app, app)
    b.sender.send = lambda claims, schedule: None  # type: ignore[method-assign]
    held = wait_for(lambda: [r for r in b.store.history("every-1s")
                             if r.state is RunState.CLAIMED and r.owner == b.owner.id],
                    10, "a claim held by B", interval=0.05, between=b.tick)[0]
    wait_for(lambda: a.tick() is not None and b.owner.id in a.liveness.live_ids()
             and a.clock.now() > held.claimed_at + 600, 10,  # older than dead_before
             "A to see B alive with a claim older than one heartbeat interval",
             interval=0.05)
    b.store.leave(b.owner)
    a.liveness.lapse()
    a._last_sweep = float("-inf")
    a.tick()
    [now] = [r for r in a.store.history("every-1s") if r.due == held.due]
    assert now.owner == a.owner.id and now.reclaimed_from == b.owner.id, now
    wait_for(lambda: ("every-1s", iso(held.due)) in occurrences_sent(server), 5,
             "A to send the run it took back", interval=0.05, between=a.tick)
    a.close()
    b.close()
