"""Runs sent and never started are reported: a fleet whose workers record nothing (no
``beat_claims.install(app)``, another store or prefix, nobody on the queue) is named by a
warning of each beat, by ``claims status`` and by ``claims health``; and an entry whose
overlap policy would wait a whole default ``run_timeout`` for such a run is warned about
at start. Real ``celery beat`` and ``worker`` processes, a real store."""

from __future__ import annotations

import itertools
import json
import logging
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from beat_claims import health, inspect, unstarted
from beat_claims.enums import RunState
from beat_claims.runs import Owner
from beat_claims.settings import Settings
from beat_claims.stores import open_store
from beat_claims.stores.base import (
    Check,
    Claim,
    ClaimPlan,
    Delivery,
    EntrySeed,
    Store,
    WorkerProcess,
)
from beat_claims.stores.redis import RedisStore
from beat_claims.unstarted import Said

from .any_store import StoreUnderTest
from .conftest import RedisServer
from .inprocess import make, make_app, settled
from .processes import executions, fleet, wait_for
from .test_cli import Ran, cli, cli_steps, step

pytestmark = pytest.mark.usefixtures("settled_store")

#: Every second, overlap skip: one run that never reports holds back every later one.
SCHEDULE = {"skipper": {"every": 1, "claims": {"overlap": "skip"}}}
#: Runs sent and not started for 3 s are reported (the default is 300 s): a worker with
#: the hooks starts each in milliseconds, even on a loaded machine.
CONF = {"beat_claims_unstarted_after": 3}
WARNING = re.compile(r"WARNING/\w+\] beat-claims: .*sent and not started.*\bskipper\b")


def run(server: RedisServer, *args: str) -> Ran:
    return cli(server, *args, schedule=SCHEDULE, BC_CONF=json.dumps(CONF))


def run_each(server: RedisServer, *commands: tuple[str, ...]) -> list[Ran]:
    """What :func:`run` gives for each of ``commands``, one after the other in one
    ``celery`` process."""
    return cli_steps(server, [step(*args) for args in commands], schedule=SCHEDULE,
                     BC_CONF=json.dumps(CONF))


def doc_of(ran: Ran, code: int) -> dict[str, Any]:
    assert ran.code == code and "Traceback" not in ran.err, ran
    found: dict[str, Any] = json.loads(ran.out)
    return found


@pytest.mark.integration
def test_a_worker_without_install_is_warned_by_the_beat_and_flagged_by_status_and_health(
        server: RedisServer, tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    with fleet(server.url, server.broker_url(), tmp_path, SCHEDULE,
               BC_CONF=json.dumps(CONF)) as f:
        # With the hooks: each run is started as soon as a worker takes it; nothing said.
        worker = f.worker()
        beat = f.beat()
        wait_for(lambda: sum(r.state is RunState.DONE for r in store.history("skipper")) >= 4,
                 40, "four runs of skipper done by the worker with the hooks")
        healthy = doc_of(run(server, "health", "-j"), 0)
        [check] = [c for c in healthy["checks"] if c["name"] == "unstarted"]
        assert check["ok"] is True, healthy
        f.stop(worker)
        assert not WARNING.search(f.log(beat)), f.log(beat)

        # Without them: the worker runs the first message it gets and records nothing; the
        # run stays sent, and overlap=skip skips every later occurrence.
        bare = f.worker(BC_NO_INSTALL="1")
        f.wait_log(bare, "ready", 30)
        f.wait_log(beat, "sent and not started", 30)

        def skipped() -> int:
            return sum(r.state is RunState.SKIPPED for r in store.history("skipper"))

        # (counted from the warning on: the commands below run while the beat passes on)
        said = skipped()
        warning = [line for line in f.log(beat).splitlines() if WARNING.search(line)]
        assert len(warning) == 1, warning
        for cause in ("beat_claims.install(app)", "another store or key prefix",
                      "queue", "down"):
            assert cause in warning[0], warning[0]
        stuck = [r for r in store.history("skipper") if r.state is RunState.SENT]
        assert stuck and all(r.started_at is None for r in stuck), stuck
        assert any(e["entry"] == "skipper" for e in executions(server.client())), \
            "the worker without the hooks ran a message"

        ran, table, unhealthy, text = run_each(
            server, ("status", "-j"), ("status",), ("health", "-j"), ("health",))
        status = doc_of(ran, 0)
        assert status["unstarted_after"] == 3.0
        [entry] = [e for e in status["entries"] if e["name"] == "skipper"]
        assert entry["unstarted"]["runs"] >= 1 and entry["unstarted"]["seconds"] > 3, entry
        assert table.code == 0, table
        assert "runs sent and not started for more than 3 s: skipper" in table.out, table.out
        assert "beat_claims.install(app)" in table.out
        [line] = [x for x in table.out.splitlines() if x.startswith("skipper ")]
        assert "NOT STARTED: " in line and "run(s) sent, the oldest" in line, line

        health = doc_of(unhealthy, 1)
        assert health["failed"] == ["unstarted"], health
        [check] = [c for c in health["checks"] if c["name"] == "unstarted"]
        assert [i["entry"] for i in check["items"]] == ["skipper"], check
        assert "beat_claims.install(app)" in check["detail"]
        assert text.code == 1 and "FAIL  unstarted: 1 entr(ies) with runs sent and not" \
            " started for more than 3 s: skipper" in text.out, text

        # Once per entry (each beat): the passes of the next seconds (one a second here)
        # find the same entry, and say nothing more.
        wait_for(lambda: skipped() >= said + 4, 30, "four more occurrences skipped")
        assert len([line for line in f.log(beat).splitlines() if WARNING.search(line)]) == 1


@pytest.mark.parametrize(("conf", "claims", "warned"), [
    ({}, {"overlap": "skip"}, "the default run_timeout"),
    ({}, {"overlap": "buffer_one"}, "the default run_timeout"),
    ({}, {"overlap": "skip", "run_timeout": None}, "run_timeout=None"),
    ({"beat_claims_overlap": "skip"}, None, "the default run_timeout"),
    ({}, {"overlap": "skip", "run_timeout": 86400}, None),  # chosen, even if a day
    ({"beat_claims_run_timeout": 600}, {"overlap": "skip"}, None),
    ({}, {"overlap": "allow"}, None),
])
def test_an_overlap_policy_that_waits_for_a_run_timeout_nobody_chose_is_warned_at_start(
        server: RedisServer, caplog: pytest.LogCaptureFixture, conf: dict[str, Any],
        claims: dict[str, Any] | None, warned: str | None) -> None:
    entry: dict[str, Any] = {"task": "t.noop", "schedule": timedelta(seconds=60)}
    if claims is not None:
        entry["claims"] = claims
    app = make_app(server, {"nightly": entry}, **conf)
    with caplog.at_level(logging.WARNING, logger="celery.beat.claims"):
        s = make(app, settle=False)
    s.close()
    lines = [r.getMessage() for r in caplog.records if "run_timeout" in r.getMessage()]
    if warned is None:
        assert lines == []
        return
    [line] = lines
    assert "'nightly'" in line and warned in line, line
    assert "beat_claims.install(app)" in line, line


def test_the_beat_judges_each_run_once_as_it_ages_past_the_bound(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    # "taken" has a worker (this test starts each run as soon as it is sent); nobody
    # takes "idle"'s messages. Each look of the beat reads only the open runs that aged
    # past the bound since its last look.
    app = make_app(server, {name: {"task": "t.noop", "schedule": timedelta(seconds=0.5)}
                            for name in ("idle", "taken")},
                   beat_claims_unstarted_after=1)
    s = make(app, settle=False)
    bands: list[tuple[int | None, int, int]] = []
    read = s.store.open_runs

    def open_runs(before: int, after: int | None = None, limit: int = 1000) -> Any:
        found = read(before, after, limit)
        if before > s.store.now() - 60_000:  # not the look for runs past run_timeout
            bands.append((after, before, len(found)))
        return found

    s.store.open_runs = open_runs  # type: ignore[method-assign]
    settled(s)

    def start_what_is_sent() -> None:
        for r in s.store.history("taken"):
            if r.state is RunState.SENT:
                s.store.start(Delivery("taken", r.due, r.token,
                                       WorkerProcess("w@test", 1, "boot:1")))

    def named() -> list[str]:
        return [r.getMessage() for r in caplog.records if "sent and not started" in
                r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="celery.beat.claims"):
        wait_for(lambda: len(named()) >= 1 and len(bands) >= 6, 30,
                 "the warning, and six looks", interval=0.05,
                 between=lambda: (start_what_is_sent(), s.tick()))
    s.close()
    [line] = named()
    assert ": idle (likely causes" in line, line
    # Consecutive looks read consecutive bands: none twice, none skipped.
    for (_, before, _), (after, _, _) in itertools.pairwise(bands):
        assert after == before - 1, bands
    assert bands[0][0] is None  # the first look starts from the oldest open run


def test_status_and_health_read_the_store_alone_and_do_not_look_when_told_not_to(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/claims.db"
    store = open_store(Settings(url=url))
    beat = Owner("b" * 16, "beat-host", 4242, 1_796_000_000.0)
    store.heartbeat(beat, 60)
    states = store.register([EntrySeed("quiet", "every 60s"), EntrySeed("busy", "every 60s")])
    for name, state in states.items():  # both sent; a worker starts busy's run
        [result] = store.claim(beat, [ClaimPlan(name, state, (state.anchor + 1000,))])
        [claim] = result.claims
        store.check(beat, [Check(claim, f"task-{name}")])
        store.record_sent(beat, [claim])
        if name == "busy":
            assert store.start(Delivery(name, claim.due, claim.token,
                                        WorkerProcess("w@h", 1, "boot:1"))).ok
    sent = store.now()
    wait_for(lambda: store.now() > sent + 1100, 10, "the runs to be 1.1 s old")

    found = health.unstarted_check(store, store.now(), 1.0)
    assert not found.ok and [i["entry"] for i in found.items] == ["quiet"], found
    assert found.items[0]["runs"] == 1 and found.items[0]["seconds"] > 1.0
    assert health.unstarted_check(store, store.now(), 3600.0).ok
    off = health.unstarted_check(store, store.now(), None)
    assert off.ok and "not checked" in off.detail

    def app(**conf: Any) -> Celery:
        a = Celery("status", set_as_current=False)
        a.conf.update(broker_url="redis://127.0.0.1:1/0", beat_claims_url=url, **conf)
        return a

    doc = inspect.status(app(beat_claims_unstarted_after=1), store, schedules={})
    by_name = {e["name"]: e["unstarted"] for e in doc["entries"]}
    assert by_name["busy"] is None and by_name["quiet"]["runs"] == 1, by_name
    doc = inspect.status(app(beat_claims_unstarted_after=None), store, schedules={})
    assert doc["unstarted_after"] is None
    assert [e["unstarted"] for e in doc["entries"]] == [None, None]
    store.close()


def test_a_beat_names_an_entry_again_only_after_the_repeat() -> None:
    said = Said(repeat=0.3)
    assert said.unsaid(["b", "a"]) == ["a", "b"]
    said.said(["a"])
    assert said.unsaid(["a", "b"]) == ["b"]
    wait_for(lambda: said.unsaid(["a"]) == ["a"], 5, "the repeat to pass")


def _open_runs(store: Store, beat: Owner, entry: str, n: int, start: bool) -> list[Claim]:
    """``n`` runs of ``entry`` claimed, checked, marked sent (one batch each), and started
    by a worker (long tasks) when ``start``."""
    [state] = store.register([EntrySeed(entry, "every 60s")]).values()
    dues = tuple(state.anchor + 1000 * (i + 1) for i in range(n))
    [result] = store.claim(beat, [ClaimPlan(entry, state, dues)])
    claims = list(result.claims)
    store.check(beat, [Check(c, f"task-{entry}-{c.due}") for c in claims])
    assert store.record_sent(beat, claims) == n
    for c in claims:
        if start:
            assert store.start(Delivery(entry, c.due, c.token,
                                        WorkerProcess("w@h", 1, "boot:1"))).ok
    return claims


def test_every_unstarted_run_is_found_behind_pages_of_started_ones(
        any_store: StoreUnderTest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Long tasks started before the unstarted run fill the first pages of open runs (the
    oldest first): the read pages on (a page at a time, each run counted once) until it has
    seen every open run older than the bound, and finds the unstarted ones."""
    store = any_store.open()
    beat = Owner("b" * 16, "beat-host", 4242, 1_796_000_000.0)
    try:
        store.heartbeat(beat, 60)
        _open_runs(store, beat, "long", 7, start=True)
        [quiet] = _open_runs(store, beat, "quiet", 1, start=False)
        _open_runs(store, beat, "quiet-too", 2, start=False)
        sent = store.now()
        wait_for(lambda: store.now() > sent + 1100, 10, "the runs to be 1.1 s old")
        calls: list[int] = []
        real = store.open_runs

        def open_runs(before: int, after: int | None = None, limit: int = 1000) -> Any:
            calls.append(limit)
            return real(before, after, limit)

        store.open_runs = open_runs  # type: ignore[method-assign]
        found = unstarted.read(store, store.now(), 1.0, 3)
        assert [(u.entry, u.runs) for u in found.entries] == [("quiet", 1), ("quiet-too", 2)]
        assert found.entries[0].oldest_due == quiet.due and found.complete, found
        # (a page at a time; an instant that fills a page, read alone: ten pages at most)
        assert calls and max(calls) <= 3 * unstarted.INSTANT_PAGES, calls
        # (status and health read the same way)
        monkeypatch.setattr(unstarted, "PAGE", 3, raising=False)
        check = health.unstarted_check(store, store.now(), 1.0)
        assert not check.ok and [i["entry"] for i in check.items] == ["quiet", "quiet-too"]
        assert max(calls) <= 3 * unstarted.INSTANT_PAGES, calls
    finally:
        store.close()


@pytest.mark.parametrize(("quiet", "complete"), [(8, True), (40, False)])
def test_open_runs_sharing_one_instant_across_pages_are_each_counted_once(
        server: RedisServer, quiet: int, complete: bool) -> None:
    """Many runs marked in the same millisecond (here: every open run's instant in the
    Redis store's index set to one): pages of 3 end inside it; the read counts each once
    and misses none, reading that instant alone (ten pages' worth at most: beyond that it
    says it is not complete)."""
    store = RedisStore.from_url(server.url, "beat-claims")
    beat = Owner("b" * 16, "beat-host", 4242, 1_796_000_000.0)
    store.heartbeat(beat, 60)
    _open_runs(store, beat, "long", 4, start=True)
    _open_runs(store, beat, "quiet", quiet, start=False)
    client = server.client()
    instant = store.now() - 5000
    for key in client.keys("{beat-claims:*}:open"):
        client.zadd(key, dict.fromkeys(client.zrange(key, 0, -1), instant))
    found = unstarted.read(store, store.now(), 1.0, 3)
    if complete:
        assert [(u.entry, u.runs) for u in found.entries] == [("quiet", quiet)], found
    assert found.complete is complete, found
    store.close()
