"""A beat that cannot send what falls due as fast as it falls due says so in its log, once
a window while it lasts, and once when it keeps up again (``beat_claims.beat.lateness``);
one that keeps up says nothing. Real beats, a broker whose publishes are made slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import RedisServer
from .processes import fleet, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("settled_store")]

#: Twenty entries due every second: a beat whose every publish takes 0.2 s sends five.
SCHEDULE = {f"e{i:02d}": {"every": 1} for i in range(20)}
WINDOW_MS = "3000"


def test_a_beat_that_cannot_send_as_fast_as_entries_fall_due_warns_then_says_it_caught_up(
        server: RedisServer, tmp_path: Path) -> None:
    slow = tmp_path / "publish-seconds"
    slow.write_text("0.2")
    with fleet(server.url, server.broker_url(), tmp_path, SCHEDULE,
               BC_LATENESS_WINDOW_MS=WINDOW_MS, BC_SLOW_PUBLISH_FILE=str(slow)) as f:
        beat = f.beat()
        f.wait_log(beat, "beat-claims: falling behind:", 60)
        line = next(x for x in f.log(beat).splitlines() if "falling behind" in x)
        assert "WARNING" in line and "more than 1s after their instant" in line, line
        slow.write_text("0")  # the broker is fast again
        f.wait_log(beat, "beat-claims: keeping up again", 60)
        log = f.log(beat)
    # One line a window while behind, not one a send.
    assert log.count("falling behind") < 20, log[-3000:]


def test_a_beat_that_keeps_up_says_nothing_of_lateness(
        server: RedisServer, tmp_path: Path) -> None:
    with fleet(server.url, server.broker_url(), tmp_path, SCHEDULE,
               BC_LATENESS_WINDOW_MS=WINDOW_MS) as f:
        beat = f.beat()
        # Three windows of sends, once the first ones went out.
        f.wait_log(beat, "Sending due task", 60)
        sent = f.log(beat).count("Sending due task")
        wait_for(lambda: f.log(beat).count("Sending due task") >= sent + 150, 60,
                 "more than three windows of sends")
        log = f.log(beat)
    assert "falling behind" not in log and "keeping up" not in log, log[-3000:]


def test_runs_sent_late_by_their_overlap_policy_are_not_the_beat_falling_behind(
        server: RedisServer, tmp_path: Path) -> None:
    """An ``overlap: buffer_one`` entry whose task outlasts its period: each occurrence
    waits for the previous run, and is sent late by design once it ends (taken due again,
    as a run released or taken back from a beat that died is). The beat keeps up with
    what falls due: it says nothing of lateness."""
    schedule = {"buffered": {"every": 1, "task": "slow", "kwargs": {"seconds": 2.5},
                             "claims": {"overlap": "buffer_one"}}}
    with fleet(server.url, server.broker_url(), tmp_path, schedule,
               BC_LATENESS_WINDOW_MS=WINDOW_MS) as f:
        beat = f.beat()
        f.worker()
        # Runs that waited for the one before them, over more than three windows.
        wait_for(lambda: f.log(beat).count("Sending due task") >= 6
                 or "falling behind" in f.log(beat), 90,
                 "six sends, each after the run before it")
        log = f.log(beat)
    assert "falling behind" not in log, log[-3000:]
