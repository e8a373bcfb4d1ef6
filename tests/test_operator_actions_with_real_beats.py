"""Pause/resume, backfill, overlap="buffer_one" and jitter with real beats.

Schedulers ticked in this process (tests/inprocess.py) or real ``celery beat`` and
``celery worker`` processes (tests/processes.py), against the test's redis-server: nothing
is mocked. Tests marked ``xfail(strict=True, reason="review: ...")`` reproduce a problem
found in review.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery

from beat_claims.enums import Reason, RunState
from beat_claims.occurrences import jitter_offset
from beat_claims.runs import iso, task_id_for
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer
from .inprocess import make, make_app, messages, run_for
from .processes import fleet, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("settled_store")]


def test_a_jitter_longer_than_the_claim_window_skips_no_occurrence(
        server: RedisServer) -> None:
    jitter = 6.0
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1),
                                  "claims": {"jitter": jitter, "max_catch_up": 1}}},
                   beat_claims_history_limit=2)  # keep = 3 occurrences: 3 s < 6 s
    s = make(app)
    try:
        run_for(16, s)
        [record] = s.store.entries(["e"])
        history = s.store.history("e")
        now = s.store.now()
    finally:
        s.close()
    assert record.anchor is not None
    sent = {m["claims"]["due"] for m in messages(server) if m["claims"]}
    # Every occurrence whose instant + offset came more than 3 s ago was sent.
    expected = [d for d in (record.anchor + 1000 * k for k in range(1, 20))
                if d + jitter_offset("e", d, jitter) < now - 3000]
    assert len(expected) >= 4
    missing = [iso(d) for d in expected if iso(d) not in sent]
    assert missing == []
    dues = [m["claims"]["due"] for m in messages(server) if m["claims"]]
    assert len(dues) == len(set(dues))
    for r in history:  # each one at its own instant: never before, and soon after
        if r.sent_at is not None:
            at = r.due + jitter_offset("e", r.due, jitter)
            # (the beat's clock: the store's, read to within half a round trip)
            assert at - 250 <= r.sent_at <= at + 2000, (r, at)


def test_a_pause_survives_the_store_being_wiped(server: RedisServer) -> None:
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1)}})
    s = make(app)
    try:
        run_for(2.2, s)
        assert s.store.pause("e", "alice@ops", "billing is down") is not None
        run_for(2.2, s)
        assert any(r.reason is Reason.PAUSED for r in s.store.history("e"))
        before = len(messages(server))
        server.client(0).flushdb()  # the store's db (the broker's is db 1)
        run_for(8, s)
        history = s.store.history("e")
        [record] = s.store.entries(["e"])
    finally:
        s.close()
    claimed = [r for r in history if r.claimed_at is not None or r.reason is not None]
    assert claimed, history
    assert record.paused is not None
    assert len(messages(server)) == before
    assert all(r.reason is Reason.PAUSED for r in claimed), claimed


def test_buffer_one_with_catch_up_none_sends_the_buffered_run(server: RedisServer,
                                                              tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    schedule = {"b": {"every": 1, "task": "slow", "args": [2.5],
                      "claims": {"overlap": "buffer_one", "catch_up": "none",
                                 "run_timeout": 60}}}
    # A short grace: the buffered run is sent more than a grace after its due instant.
    with fleet(server.url, server.broker_url(), tmp_path, schedule, BC_GRACE="0.2") as f:
        f.worker(concurrency=2)
        f.beat()
        wait_for(lambda: sum(r.reason is Reason.OVERLAP for r in store.history("b")) >= 2
                 and sum(r.state is RunState.DONE for r in store.history("b")) >= 2, 25,
                 "two runs done and two skipped for overlap")
        runs = sorted(store.history("b"), key=lambda r: r.due)
    # No beat was ever down: nothing was missed, so nothing is skipped for catch-up.
    caught = [r for r in runs if r.reason in (Reason.CATCH_UP, Reason.CATCH_UP_WINDOW)]
    assert caught == [], runs


def test_a_backfilled_instant_whose_run_was_revoked_runs(server: RedisServer,
                                                         tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    control = Celery("review", broker=server.broker_url())
    with fleet(server.url, server.broker_url(), tmp_path, {"e": {"every": 1}}) as f:
        worker = f.worker(concurrency=1)
        f.beat()
        f.wait_log(worker, "ready", 30)
        wait_for(lambda: any(r.state is RunState.DONE for r in store.history("e")), 30,
                 "a run done")
        [record] = store.entries(["e"])
        assert record.anchor is not None and record.checkpoint is not None
        due = record.checkpoint + 4000  # a run four occurrences ahead
        # An operator cancels that run (as `celery revoke` does) before it runs.
        control.control.revoke(task_id_for("e", due, "beat-claims"))
        wait_for(lambda: any(r.due == due and r.state is RunState.CANCELLED
                             for r in store.history("e")), 20, "the revoked run cancelled")
        store.pause("e", "alice@ops")  # nothing else of the entry meanwhile
        result = store.backfill("e", [due], "alice@ops")
        assert result is not None and result.created == (due,)
        wait_for(lambda: any(r.due == due and (r.finished_at or 0) > 0
                             and r.manual for r in store.history("e")), 20,
                 "the backfilled run finished")
        [again] = [r for r in store.history("e") if r.due == due]
    assert again.state is RunState.DONE, again
