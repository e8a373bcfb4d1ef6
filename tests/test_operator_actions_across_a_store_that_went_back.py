"""A pause, a resume and a backfill, with real beats, across a store
that was wiped or came back from an older snapshot.

Schedulers are ticked in this process (tests/inprocess.py) against redis-servers the tests
own; nothing is mocked. Tests marked ``xfail(strict=True, reason="review: ...")`` reproduce
a problem found in the review.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from pathlib import Path

import pytest

from beat_claims.enums import Reason, RunState
from beat_claims.runs import Run
from beat_claims.scheduler import Scheduler
from beat_claims.settings import Settings
from beat_claims.stores import open_store
from beat_claims.stores.base import Delivery, EntrySeed, WorkerProcess

from .conftest import RedisServer, SnapshotServer
from .inprocess import make, make_app, messages
from .processes import wait_for

pytestmark = pytest.mark.integration


def _tick(s: Scheduler) -> None:
    with contextlib.suppress(Exception):  # a store coming back: the beat retries
        s.tick()


def _knows_paused(s: Scheduler, note: str) -> bool:
    known = s.knowledge.paused.get("e")
    return known is not None and known.note == note


def _paused_skip_since(s: Scheduler, at: int) -> Run | None:
    return next((r for r in s.store.history("e")
                 if r.reason is Reason.PAUSED and r.due >= at), None)


def _back_and_settled(s: Scheduler, token_above: int) -> bool:
    """The beat re-registered what it knows (its token floor is in the store) and the store
    settled: it claims again."""
    try:
        records = s.store.entries(["e"])
    except Exception:
        return False
    return (bool(records) and records[0].token > token_above and s._ready
            and s.liveness.settling_for() == 0)


def test_a_resume_lost_with_the_store_before_the_next_claim_is_not_undone(
        server: RedisServer) -> None:
    """An hourly entry the beat saw paused (an occurrence skipped for the pause) is resumed,
    and the store is wiped a heartbeat later, long before the entry next falls due (so no
    scheduled claim told the beat of the resume): the beat does not pause it again. (Review:
    a beat forgot a pause only at its entry's next scheduled claim, up to a period later.)"""
    store = open_store(Settings(url=server.url))
    # Anchored so that its first occurrence is due in a few seconds, the next an hour later.
    store.register([EntrySeed("e", "every 3600s", anchor=store.now() - 3_600_000 + 4_000)])
    assert store.pause("e", "alice@ops", "billing is down") is not None
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(hours=1)}})
    s = make(app)
    try:
        wait_for(lambda: _knows_paused(s, "billing is down"), 15, "the beat to see the pause",
                 interval=0.02, between=s.tick)
        skipped = _paused_skip_since(s, 0)
        assert skipped is not None
        token = s.store.entries(["e"])[0].token
        resumed = s.store.resume("e", "bob@ops")
        assert resumed is not None and resumed.paused is None
        wait_for(lambda: "e" not in s.knowledge.paused, 5,
                 "the beat to see the resume (at a heartbeat)", interval=0.02, between=s.tick)
        # Nothing was claimed meanwhile: the beat learned the resume from the store's record.
        assert [r.due for r in s.store.history("e")] == [skipped.due]
        server.client(0).flushdb()  # the store's db (the broker's is db 1)
        wait_for(lambda: _back_and_settled(s, token), 20, "the beat to register again",
                 interval=0.02, between=lambda: _tick(s))
        [record] = s.store.entries(["e"])
    finally:
        s.close()
        store.close()
    assert record.paused is None, record


def test_an_older_snapshot_without_the_resume_never_makes_a_beat_forget_a_pause(
        store_server: SnapshotServer, server: RedisServer, tmp_path: Path) -> None:
    """The store comes back from a snapshot taken before the pause: before the beat notices
    (its check of the pauses it knows reads the older record), what it knows of the pause
    stays, and once it notices, it pauses the entry again."""
    app = make_app(store_server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1)}},
                   broker=server)
    s = make(app)
    try:
        store_server.snapshot(tmp_path / "old.rdb")
        assert s.store.pause("e", "carol@ops", "hold") is not None
        wait_for(lambda: _knows_paused(s, "hold"), 10, "the beat to see the pause",
                 interval=0.02, between=s.tick)
        token = s.store.entries(["e"])[0].token
        store_server.come_back(tmp_path / "old.rdb")
        # Read as a heartbeat's check reads it (the beat's own connection first wants the new
        # epoch read: a restart is always noticed; a failover to a lagging replica may not be).
        reader = open_store(Settings(url=store_server.url))
        try:
            [old] = reader.entries(["e"])
        finally:
            reader.close()
        assert old.paused is None and old.resumed_at is None
        assert s.knowledge.check_pause("e", old) is None
        assert _knows_paused(s, "hold")
        wait_for(lambda: _back_and_settled(s, token), 30, "the beat to register again",
                 interval=0.02, between=lambda: _tick(s))
        [record] = s.store.entries(["e"])
    finally:
        s.close()
    assert record.paused is not None and record.paused.by == "carol@ops", record
    assert record.paused.note.startswith("hold [restored by beat"), record


def test_a_second_pause_lost_with_an_older_snapshot_is_restored(
        store_server: SnapshotServer, server: RedisServer, tmp_path: Path) -> None:
    """Pause, resume and pause again with no scheduled claim in between; the store comes
    back from a snapshot taken between the resume and the second pause: the second pause,
    which the beat saw skip an occurrence, is restored, with its author and note. (Review: a
    beat kept the first pause it saw.)"""
    app = make_app(store_server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1)}},
                   broker=server)
    s = make(app)
    try:
        assert s.store.pause("e", "alice@ops", "first") is not None
        wait_for(lambda: _knows_paused(s, "first"), 10, "the beat to see the first pause",
                 interval=0.02, between=s.tick)
        # Before the entry next falls due: resumed, a snapshot, paused again.
        assert s.store.resume("e", "bob@ops") is not None
        store_server.snapshot(tmp_path / "old.rdb")
        second = s.store.pause("e", "carol@ops", "second")
        assert second is not None and second.paused is not None
        wait_for(lambda: _paused_skip_since(s, second.paused.at), 10,  # type: ignore[union-attr]
                 "an occurrence skipped for the second pause", interval=0.02, between=s.tick)
        token = s.store.entries(["e"])[0].token
        store_server.come_back(tmp_path / "old.rdb")
        wait_for(lambda: _back_and_settled(s, token), 30, "the beat to register again",
                 interval=0.02, between=lambda: _tick(s))
        [record] = s.store.entries(["e"])
    finally:
        s.close()
    assert record.paused is not None, record
    assert record.paused.by == "carol@ops" and record.paused.note.startswith("second ["), record


def test_a_backfilled_run_sent_before_an_older_snapshot_came_back_still_runs(
        store_server: SnapshotServer, server: RedisServer, tmp_path: Path) -> None:
    app = make_app(store_server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1)}},
                   broker=server)
    s = make(app)
    try:
        paused = s.store.pause("e", "alice@ops", "down")
        assert paused is not None and paused.paused is not None
        skipped = wait_for(lambda: _paused_skip_since(s, paused.paused.at), 10,  # type: ignore[union-attr]
                           "an occurrence skipped for the pause", interval=0.02,
                           between=s.tick)
        assert s.store.resume("e", "alice@ops") is not None
        store_server.snapshot(tmp_path / "old.rdb")
        made = s.store.backfill("e", [skipped.due], "alice@ops")
        assert made is not None and made.created == (skipped.due,)

        def backfill_sent() -> Run | None:
            return next((r for r in s.store.history("e") if r.due == skipped.due
                         and r.manual and r.state is RunState.SENT), None)

        sent = wait_for(backfill_sent, 10, "the backfilled run sent", interval=0.02,
                        between=s.tick)
        [message] = [m for m in messages(server) if m["claims"]
                     and m["claims"]["token"] == sent.token]
        token = s.store.entries(["e"])[0].token
        store_server.come_back(tmp_path / "old.rdb")
        wait_for(lambda: _back_and_settled(s, token), 30, "the beat to register again",
                 interval=0.02, between=lambda: _tick(s))
        # A worker now takes the backfill's message from the broker (which kept it).
        decision = s.store.start(Delivery(
            "e", skipped.due, sent.token, WorkerProcess("w1@review", 4242, "boot-1:4242"),
            task_id=message["id"]))
        after = next(r for r in s.store.history("e") if r.due == skipped.due)
    finally:
        s.close()
    assert decision.ok, (decision, after)
