"""Worker-side pieces that need no worker: header parsing, the once-per-outage log."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from beat_claims.worker import _Outage, parse_header


def test_header_parsing() -> None:
    assert parse_header({"entry": "e", "due": "2026-11-30T02:00:00.000Z", "token": 3}) == (
        "e", 1796004000000, 3)
    assert parse_header(None) is None
    assert parse_header({"entry": "e"}) is None  # malformed: ignored, not fatal


def test_a_store_outage_is_logged_once_per_outage(caplog: pytest.LogCaptureFixture) -> None:
    outage = _Outage()
    with caplog.at_level(logging.DEBUG, logger="celery.worker.claims"):
        for n in range(5):
            outage.down(f"task {n}", RedisConnectionError("refused"))
        outage.up()
        outage.down("task 9", RedisConnectionError("refused again"))
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2  # one per outage
    assert "reachable again" in caplog.text
