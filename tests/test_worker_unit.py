"""Worker-side pieces that need no worker: header parsing, and a store outage costing one
delivery one timeout, logged once, then probed in the background."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from beat_claims import worker
from beat_claims.enums import RunState
from beat_claims.runs import TASK_ID_NAMESPACE, Owner, manual_task_id_for, task_id_for
from beat_claims.stores.base import (
    Check,
    CheckVerdict,
    ClaimPlan,
    Delivery,
    EntrySeed,
    Outcome,
    WorkerProcess,
)
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
    monkeypatch.setattr(worker, "PROBE_FIRST", 0.05)
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


def test_a_blip_is_over_for_the_worker_soon_after_the_store_is_back(
        server: RedisServer) -> None:
    """The first probe comes after a quarter of a second, then at doubling waits: a
    store that was away for a moment is fenced again within about a second of its return,
    not at the next 5 s probe (deliveries meanwhile run unfenced)."""
    context = _Context()
    context.store = RedisStore.from_url(server.url)
    failed_at = time.monotonic()
    context.failed("starting a task", ConnectionError("a blip"))
    wait_for(lambda: context.down_since is None, 3, "the probe to find the store back")
    assert time.monotonic() - failed_at < worker.PROBE_EVERY / 2


def test_outages_one_after_the_other_keep_the_probes_backoff(
        server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that answers the probe (a read) and fails every delivery's write: each new
    outage waits as long as the last one had got to, up to PROBE_EVERY, so a delivery pays
    one timeout per PROBE_EVERY, not one per PROBE_FIRST."""
    monkeypatch.setattr(worker, "PROBE_FIRST", 0.05)
    monkeypatch.setattr(worker, "PROBE_EVERY", 0.4)
    context = _Context()
    context.store = RedisStore.from_url(server.url)
    waits = []
    for _ in range(5):
        started = time.monotonic()
        context.failed("finishing a task", ConnectionError("writes refused"))
        wait_for(lambda: context.down_since is None, 5, "the probe to find the store")
        waits.append(time.monotonic() - started)
    assert waits[-1] >= 0.4 and waits[-2] >= 0.4, waits  # at PROBE_EVERY, as it got to
    assert waits[0] < 0.3, waits  # the first outage in a while: a blip, soon over


def test_an_operators_run_has_a_task_id_of_its_own_the_worker_finds() -> None:
    scheduled = task_id_for("e", 1000)
    assert manual_task_id_for("e", 1000, 7) == manual_task_id_for("e", 1000, 7)
    assert len({scheduled, manual_task_id_for("e", 1000, 7), manual_task_id_for("e", 1000, 8),
                manual_task_id_for("e", 1000, 7, "other")}) == 4


def test_a_runs_task_id_is_the_one_every_version_gave_it() -> None:
    """A fleet of beats of several versions (and the workers that look runs up by task id)
    agree on each occurrence's id: the UUID 5 of its prefix, entry and instant (and token,
    for an operator's run), whatever the entry's name holds."""
    names = ["e", "", "名前", "a\x00b", "entry-00042", "x" * 300, "ü|;,\n"]
    for name in names:
        for due in (0, 1000, -5, 1796004000000, 2 ** 53 - 1):
            for prefix in ("beat-claims", "other", ""):
                assert task_id_for(name, due, prefix) == str(uuid.uuid5(
                    TASK_ID_NAMESPACE, f"{prefix}\x00{name}\x00{due}"))
                assert manual_task_id_for(name, due, 7, prefix) == str(uuid.uuid5(
                    TASK_ID_NAMESPACE, f"{prefix}\x00{name}\x00{due}\x00manual\x007"))
    assert task_id_for("e", 1796004000000) == "c476e688-71f3-574d-a28d-b120308af216"


def test_a_backfilled_run_is_looked_up_by_its_own_task_id(server: RedisServer) -> None:
    """The signals that carry only a task id lead to the run that replaced a cancelled one,
    and the replaced run's id does not."""
    store = RedisStore.from_url(server.url, "unit")
    beat = Owner(id="unit-beat", host="h", pid=1, started_at=1.0)
    state = store.register([EntrySeed("e", "every 1s")])["e"]
    due = state.anchor + 1000
    [first] = store.claim(beat, [ClaimPlan("e", state, (due,))])[0].claims
    old_id = task_id_for("e", due, "unit")
    assert store.check(beat, [Check(first, old_id)])[0].verdict is CheckVerdict.SEND
    assert store.record_sent(beat, [first]) == 1
    assert store.finish([Outcome("e", due, first.token, RunState.CANCELLED)]) == [True]
    assert store.backfill("e", [due], "alice@ops") is not None
    [again] = store.claim(beat, [ClaimPlan("e", None)])[0].taken
    assert again.manual and again.token > first.token
    new_id = manual_task_id_for("e", due, again.token, "unit")
    assert store.check(beat, [Check(again, new_id)])[0].verdict is CheckVerdict.SEND
    assert store.record_sent(beat, [again]) == 1
    process = WorkerProcess("w@h", 2, "p")
    assert store.start(Delivery("e", due, again.token, process, task_id=new_id)).ok
    found = store.lookup_task(new_id)
    assert found is not None and (found.entry, found.due, found.token) == (
        "e", due, again.token)
    old = store.lookup_task(old_id)
    assert old is None or old.token == first.token  # never leads to the new run
