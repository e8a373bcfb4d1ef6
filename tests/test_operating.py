"""Operating a fleet with real beats and a real worker (issue 13): a pause honoured by every
beat, backfill of what a pause skipped, overlap="buffer_one" across two beats, and jitter
that spreads an entry's runs the same way on every beat."""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path

import pytest

from beat_claims.enums import Reason, RunState
from beat_claims.occurrences import jitter_offset
from beat_claims.runs import Run, iso
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer
from .inprocess import beats, make_app, messages, run_for
from .processes import duplicates, executions, fleet, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("settled_store")]


def history(store: RedisStore, entry: str) -> list[Run]:
    return sorted(store.history(entry), key=lambda r: r.due)


def test_a_pause_is_honoured_by_every_beat_and_a_backfill_runs_what_it_skipped(
        server: RedisServer, tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    client = server.client()
    with fleet(server.url, server.broker_url(), tmp_path, {"e": {"every": 1}}) as f:
        f.worker()
        f.beat()
        f.beat()
        wait_for(lambda: sum(r.state is RunState.DONE for r in store.history("e")) >= 2, 40,
                 "two runs done before the pause")
        record = store.pause("e", "test@ops", "downstream is down")
        assert record is not None and record.paused is not None
        paused_at = record.paused.at
        wait_for(lambda: sum(r.reason is Reason.PAUSED and r.due > paused_at + 1000
                             for r in store.history("e")) >= 3, 30,
                 "three occurrences skipped (paused)")
        # Every occurrence claimed after the pause was skipped, by whichever beat.
        after = [r for r in store.history("e") if r.due >= paused_at + 1000]
        assert after and all((r.state, r.reason) == (RunState.SKIPPED, Reason.PAUSED)
                             for r in after), after
        assert not [row for row in executions(client)
                    if _due_ms(store, row) >= paused_at + 1000]

        # Backfill what the pause skipped (while still paused: an operator's request is
        # sent), and two instants that ran already: those are not sent again.
        skipped = [r.due for r in history(store, "e") if r.reason is Reason.PAUSED]
        done = [r.due for r in history(store, "e") if r.state is RunState.DONE][:2]
        result = store.backfill("e", skipped + done, "test@ops")
        assert result is not None
        assert sorted(result.created) == sorted(skipped)
        assert sorted(result.kept) == [(d, RunState.DONE) for d in sorted(done)]
        wait_for(lambda: all(r.state is RunState.DONE for r in store.history("e")
                             if r.due in set(skipped)), 40, "the backfilled runs done")
        for r in store.history("e"):
            if r.due in set(skipped):
                assert r.manual and r.requested_by == "test@ops", r

        resumed = store.resume("e", "test@ops")
        assert resumed is not None and resumed.resumed_at is not None
        resumed_at = resumed.resumed_at
        wait_for(lambda: any(r.state is RunState.DONE and r.due > resumed_at
                             for r in store.history("e")), 30, "a run done after resume")
        rows = executions(client)
    assert duplicates(rows) == {}


def _due_ms(store: RedisStore, row: dict[str, str]) -> int:
    """The due instant (ms) of an execution row (its header carries it in ISO form)."""
    for r in store.history(row["entry"]):
        if r.task_id == row["task_id"]:
            return r.due
    raise AssertionError(f"no run for {row}")


def test_buffer_one_across_two_beats_never_overlaps_and_sends_the_newest_waiting(
        server: RedisServer, tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    client = server.client()
    schedule = {"b": {"every": 1, "task": "slow", "args": [2.5],
                      "claims": {"overlap": "buffer_one", "run_timeout": 60}}}
    with fleet(server.url, server.broker_url(), tmp_path, schedule) as f:
        f.worker(concurrency=4)  # room to overlap, if anything let it
        f.beat()
        f.beat()
        wait_for(lambda: len(executions(client, "end")) >= 3, 60, "three runs finished")
        runs = history(store, "b")
        starts, ends = executions(client, "run"), executions(client, "end")
    assert duplicates(starts) == {}
    spans = sorted((s["at"], next(e["at"] for e in ends if e["task_id"] == s["task_id"]))
                   for s in starts if any(e["task_id"] == s["task_id"] for e in ends))
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 0.05, spans  # one run at a time
    # The occurrences due while one ran were skipped (overlap) but for the newest, which
    # waited and was sent once the previous one finished.
    assert any(r.reason is Reason.OVERLAP for r in runs), runs
    assert sum(r.state is RunState.WAITING for r in runs) <= 1, runs
    sent = [r for r in runs if r.sent_at is not None]
    for previous, nxt in itertools.pairwise(sent):
        # Checked (and so sent) only once the previous run's outcome was recorded.
        assert previous.finished_at is not None and nxt.sent_at is not None, (previous, nxt)
        assert nxt.sent_at >= previous.finished_at, (previous, nxt)


def test_jitter_sends_each_run_at_its_own_offset_the_same_on_every_beat(
        server: RedisServer, tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    client = server.client()
    jitter = 3.0
    names = [f"j{i}" for i in range(8)]
    schedule = {n: {"every": 4, "claims": {"jitter": jitter}} for n in names}
    with fleet(server.url, server.broker_url(), tmp_path, schedule) as f:
        f.worker(concurrency=4)
        f.beat()
        f.beat()
        wait_for(lambda: all(sum(r.state is RunState.DONE for r in store.history(n)) >= 2
                             for n in names), 60, "two runs of each entry done")
        rows = executions(client)
    assert duplicates(rows) == {}
    offsets = set()
    for name in names:
        for r in store.history(name):
            if r.claimed_at is None:
                continue
            assert r.reason is None, r  # a jittered run is on time, not caught up
            offset = jitter_offset(name, r.due, jitter)
            offsets.add(offset // 250)
            # Claimed (by whichever beat) once due + its offset had come by the beat's
            # reckoning of the store's clock (within half a round trip of it: a few ms
            # under load), and soon after.
            assert r.due + offset - 250 <= r.claimed_at <= r.due + offset + 1500, (r, offset)
    assert len(offsets) > 3  # the runs were spread, not sent together


def test_a_jitter_longer_than_half_reclaim_after_holds_no_claim_that_long(
        server: RedisServer) -> None:
    """An earlier occurrence is claimed with a later one whose offset came first, and held
    until its own instant, only within half the entry's reclaim_after (nobody takes it back
    meanwhile); beyond that the later ones wait for it. Each is sent once, none before its
    instant, on two beats."""
    jitter, reclaim_after = 4.0, 2.0  # held at most 1 s before its instant
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=0.5),
                                  "claims": {"jitter": jitter,
                                             "reclaim_after": reclaim_after}}})
    one, two = beats(app, app)
    try:
        run_for(12, one, two)
        history = one.store.history("e")
        [record] = one.store.entries(["e"])
        now = one.store.now()
    finally:
        one.close()
        two.close()
    assert record.anchor is not None
    dues = [m["claims"]["due"] for m in messages(server) if m["claims"]]
    assert len(dues) == len(set(dues))
    # Held back at most jitter - the horizon (3 s) by an earlier one; 1 s to spare.
    expected = [d for d in (record.anchor + 500 * k for k in range(1, 40))
                if d + jitter_offset("e", d, jitter) < now - 4000]
    assert len(expected) >= 8
    assert [iso(d) for d in expected if iso(d) not in set(dues)] == []
    held = [r for r in history if r.sent_at is not None and r.claimed_at is not None]
    instants = {r.due: r.due + jitter_offset("e", r.due, jitter) for r in held}
    assert any(r.claimed_at < instants[r.due] for r in held)  # claimed early, held
    for r in held:
        at = instants[r.due]
        # Not before its instant by the beat's clock: the store's, read to within half a
        # round trip (a loaded machine's round trips take a while).
        assert r.sent_at >= at - 250, (r.sent_at - at, r)
        assert r.sent_at - r.claimed_at < reclaim_after * 1000, r
        assert r.reclaimed_from is None, r  # nobody took it back
