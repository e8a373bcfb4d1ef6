"""Worker-side pieces that need no worker: header parsing, and a store outage costing one
delivery one timeout, logged once, then probed in the background."""

from __future__ import annotations

import logging

import pytest

from beat_claims import worker
from beat_claims.stores.redis import RedisStore
from beat_claims.worker import _Context, parse_header

from .conftest import RedisServer, free_port
from .processes import wait_for


def test_header_parsing() -> None:
    assert parse_header({"entry": "e", "due": "2026-11-30T02:00:00.000Z", "token": 3}) == (
        "e", 1796004000000, 3)
    assert parse_header(None) is None
    assert parse_header({"entry": "e"}) is None  # malformed: ignored, not fatal


def test_a_store_outage_is_logged_once_and_probed_until_it_answers(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "PROBE_EVERY", 0.1)
    port = free_port()
    context = _Context()
    context.store = RedisStore.from_url(f"redis://127.0.0.1:{port}/0")
    with caplog.at_level(logging.DEBUG, logger="celery.worker.claims"):
        for n in range(5):
            context.failed(f"starting task {n}", ConnectionError("refused"))
        assert context.down_since is not None
        server = RedisServer()
        server.port = port
        server.start()
        try:
            wait_for(lambda: context.down_since is None, 10, "the probe to find the store")
        finally:
            server.stop()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1  # once per outage, not per task
    assert "reachable again" in caplog.text
