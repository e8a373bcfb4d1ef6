"""Logs that tell the truth: skips are logged only once the store recorded them, with the
true reason, counted per reason in one line per tick; nothing is logged for what another
beat did."""

from __future__ import annotations

import logging
import re
import time
from datetime import timedelta
from typing import Any

import pytest

from beat_claims.enums import Reason, RunState

from .conftest import RedisServer
from .inprocess import beats, make, make_app, run_for

pytestmark = pytest.mark.usefixtures("settled_store")


def skip_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]


def test_a_restart_logs_a_pile_of_skips_as_one_line_per_reason(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """overlap=skip and catch_up=all, every 0.1 s, no beat for 3 s: about 30 missed
    occurrences; one runs, the others are recorded skipped (overlap) — one line says so."""
    app = make_app(server, {"busy": {"task": "t.noop", "schedule": timedelta(seconds=0.1),
                                     "claims": {"catch_up": "all", "overlap": "skip",
                                                "max_catch_up": 100}}},
                   beat_claims_catch_up_grace=0.2)
    first = make(app)
    run_for(0.4, first)
    first.close()
    time.sleep(3.0)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="celery.beat.claims"):
        second = make(app)
        second.tick()
    lines = skip_lines(caplog)
    recorded = [r for r in second.store.history("busy") if r.reason is Reason.OVERLAP]
    assert len(recorded) >= 20
    # The pile is one line (and the occurrence after it, whose run overlapped the one
    # sent, another): never a line per occurrence.
    assert len(lines) <= 2, lines
    counted = re.match(r"beat-claims: recorded (\d+) occurrence\(s\) skipped \(overlap\): busy",
                       lines[0])
    assert counted and int(counted.group(1)) >= 20, lines
    assert "previous run" not in caplog.text
    second.close()


def test_a_beat_waking_from_a_pause_logs_nothing_another_beat_did(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=0.5)}},
                   beat_claims_heartbeat_interval=0.3, beat_claims_reclaim_after=0.6,
                   beat_claims_catch_up_grace=0.2)
    a, b = beats(app, app)
    real_send = a.sender.send
    a.sender.send = lambda claims, schedule: None  # type: ignore[method-assign]
    run_for(0.8, a)
    held = set(a.holdings.held)
    assert held
    run_for(2.0, b)  # a is "paused": b takes its claims back and sends them
    sent_by_b = {r.due for r in b.store.history("e") if r.state is RunState.SENT}
    assert {ref.due for ref in held} <= sent_by_b
    a.sender.send = real_send  # type: ignore[method-assign]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="celery.beat.claims"):
        run_for(0.3, a)
    woke: list[Any] = [r.getMessage() for r in caplog.records]
    assert not [m for m in woke if "skipped" in m], woke
    a.close()
    b.close()
