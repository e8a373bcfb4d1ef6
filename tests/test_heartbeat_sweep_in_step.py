"""The heartbeat carries the sweep in two cases found in review where nothing is wrong
with the store (performance only: otherwise a second round trip per heartbeat interval).
Nothing is mocked: a real redis-server, behind a delaying TCP proxy for the first test.

1. A store far away (a round trip of 300 ms): the clock check compares the store's reading
   with this beat's reckoning for the same instant, not with a reading a round trip apart,
   so the answer is kept while the store's clock is steady.
2. A sweep that leads the heartbeat (they fell out of step: a heartbeat alone after an
   error, ``_store_down`` -> ``lapse()``) takes the heartbeat with it once half an interval
   has passed, so the two are one round trip again within an interval.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from beat_claims.scheduler import Scheduler

from .conftest import RedisServer, seed_settled_epoch
from .faults import Proxy, proxy
from .inprocess import make, make_app
from .processes import wait_for
from .test_heartbeat_sweep import _count_calls


@pytest.fixture
def slow(server: RedisServer) -> Iterator[Proxy]:
    with proxy(server.port) as p:
        yield p


@pytest.mark.parametrize("delay", [0.05, 0.3])
def test_the_answer_of_a_store_far_away_is_kept_while_its_clock_is_steady(
        server: RedisServer, slow: Proxy, delay: float) -> None:
    app = make_app(server, {"hourly": {"task": "t.noop", "schedule": timedelta(hours=1)}},
                   beat_claims_url=slow.url(), beat_claims_heartbeat_interval=3)
    seed_settled_epoch(server)  # (claims at once, not after a TTL of 9 s)
    s = make(app)
    slow.delay = delay
    for _ in range(2):  # the clock read through the slow path (its estimate: +-RTT/2)
        s.liveness.beat()
    client = server.client()
    sec, usec = client.time()
    error = s.clock.now() - (sec * 1000 + usec // 1000)
    assert not s.liveness.beat(sweep=s.sweeper.query())
    kept = s.liveness.swept is not None
    s.close()
    print(f"\ndelay {delay}s: clock estimate off by {error} ms; answer kept: {kept}")
    assert abs(error) <= delay * 1000 / 2 + 50  # half a round trip: no step
    assert kept, (f"{delay * 1000:.0f} ms to the store, its clock steady: the answer that"
                  f" came with the heartbeat was dropped")


def _celery_loop(s: Scheduler, seconds: float) -> None:
    """As celery.beat.Service does: sleep what tick() returns."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(max(0.0, min(s.tick(), deadline - time.monotonic())))


def test_a_sweep_that_leads_the_heartbeat_takes_it_along_and_they_keep_step(
        server: RedisServer) -> None:
    app = make_app(server, {"hourly": {"task": "t.noop", "schedule": timedelta(hours=1)}},
                   beat_claims_heartbeat_interval=1.0, beat_max_loop_interval=0.25)
    s = make(app)
    _celery_loop(s, 2.5)
    counts = _count_calls(s, "live_runs")
    _celery_loop(s, 3.2)
    assert counts["live_runs"] <= 1, f"in step: {counts['live_runs']} sweeps asked apart"
    # One heartbeat alone, 0.3 s after a sweep (what _store_down does after a failed call:
    # lapse(), and the next tick heartbeats at once).
    swept = s._last_sweep
    wait_for(lambda: s._last_sweep != swept, 5, "the next sweep (with its heartbeat)",
             interval=0.01, between=s.tick)
    time.sleep(0.3)  # (a phase to set up, not a condition to wait for)
    s.liveness.lapse()
    counts["live_runs"] = 0

    _celery_loop(s, 6.2)
    s.close()
    assert counts["live_runs"] <= 2, (
        f"{counts['live_runs']} of ~6 sweeps asked the store apart after one heartbeat alone: the"
        f" sweep leads the heartbeat and the half-interval rule never joins them again")
