"""What a beat's lateness counts (``beat_claims.beat.lateness``): the occurrences it sent
in one minute of the store's clock, judged once that minute is over; never a span of hours
of an idle beat, and a store clock that steps back does not stop the count."""

from __future__ import annotations

import logging

import pytest

from beat_claims.beat import lateness
from beat_claims.beat.lateness import Lateness
from beat_claims.metrics import Metrics

T = 1_800_000_000_000  # ms, the store's clock
HOUR = 3_600_000


def _lateness(caplog: pytest.LogCaptureFixture) -> Lateness:
    caplog.set_level(logging.WARNING, logger="test.lateness")
    return Lateness(logging.getLogger("test.lateness"), Metrics())


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "beat-claims:" in r.getMessage()]


def test_a_beat_idle_for_hours_is_judged_on_the_minute_it_sent_in(
        caplog: pytest.LogCaptureFixture) -> None:
    """One occurrence on time, three hours idle, one 1.5 s late: the minute of the first
    is judged on its own (on time); the late one is not counted over three hours."""
    beat = _lateness(caplog)
    beat.sent(0, T)
    beat.sent(1500, T + 3 * HOUR)
    said = _warnings(caplog)
    assert not [line for line in said if "10800s" in line], said
    assert not [line for line in said if "falling behind" in line], said


def test_a_store_clock_that_steps_back_does_not_stop_the_count(
        caplog: pytest.LogCaptureFixture) -> None:
    """The store's clock steps back ten minutes (a failover to a host whose clock is
    behind): every send after it is 5 s late, and within two minutes of them the beat says
    it is falling behind (not ten minutes later)."""
    beat = _lateness(caplog)
    beat.sent(0, T)
    now = T - 10 * 60_000
    for _ in range(2 * lateness.WINDOW_MS // 100):  # two minutes, ten sends a second
        now += 100
        beat.sent(5000, now)
    said = _warnings(caplog)
    assert [line for line in said if "falling behind" in line], said
