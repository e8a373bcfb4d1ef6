"""Entries RedBeat created at run time become the store's, each with RedBeat's next run.

RedBeat's keys are written by real ``celery-redbeat`` 2.x entries (``save()``,
``reschedule()``) in a Redis server of the test's own; the import runs on every store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab, schedule
from redbeat import RedBeatSchedulerEntry
from redbeat.schedules import rrule

from beat_claims import occurrences, redbeat_import
from beat_claims.definitions import validate
from beat_claims.enums import ImportAction, Origin
from beat_claims.runs import to_ms
from beat_claims.stores.base import Store

from ..conftest import RedisServer

#: When RedBeat's entries last ran: now (their next run is to come), or long ago.
NOW = datetime.now(timezone.utc)
LONG_AGO = NOW - timedelta(hours=3)


@pytest.fixture
def redbeat_app(server: RedisServer) -> Iterator[Celery]:
    """An app whose RedBeat keeps its entries in the test's own Redis, with entries of every
    kind a RedBeat user makes: run and never run, disabled, static, and unimportable."""
    app = Celery("redbeat_users", set_as_current=False)
    app.conf.update(redbeat_redis_url=server.url, broker_url=server.url, timezone="UTC")

    def entry(name: str, sched: Any, last_run: datetime | None = None, **kw: Any) -> None:
        e = RedBeatSchedulerEntry(name, kw.pop("task", "tasks.report"), sched, app=app, **kw)
        e.save()
        if last_run is not None:
            e.reschedule(last_run_at=last_run)

    entry("every-30s", schedule(timedelta(seconds=30)), NOW - timedelta(seconds=10),
          args=["tenant-7"], kwargs={"token": "s3cr3t-arg"}, options={"queue": "reports"})
    entry("cron-5min", crontab(minute="*/5"), NOW)
    entry("cron-list", crontab(minute=[0, 30], hour="9-17", day_of_week="mon-fri"), NOW)
    entry("overdue", schedule(timedelta(seconds=60)), LONG_AGO)
    entry("never-ran", schedule(timedelta(seconds=90)))  # RedBeat counts from save()
    entry("switched-off", schedule(timedelta(seconds=60)), NOW, enabled=False)
    entry("rrule-weekly", rrule("WEEKLY", dtstart=NOW))
    entry("datetime-arg", schedule(timedelta(seconds=60)), kwargs={"since": NOW})
    entry("from-config", schedule(timedelta(seconds=60)))
    client = server.client()
    client.sadd("redbeat::statics", "from-config")
    client.set("redbeat:not-an-entry", "x")  # another key under RedBeat's prefix
    yield app
    client.close()


def rows(store: Store, app: Celery, server: RedisServer) -> dict[str, Any]:
    entries = list(redbeat_import.read(server.client(), "redbeat:", "UTC", page=3))
    return {r.entry.name: r for r in redbeat_import.plan(store, entries)}


def redbeats_next_run_ms(app: Celery, name: str) -> tuple[int, int]:
    """When RedBeat's beat finds the entry due: when Celery's ``is_due(last_run_at)`` turns
    true, now plus its remaining estimate (its sorted set's score only says when to look).
    Celery reads its clock between two readings of ours: the instant lies between the two
    bounds returned (a few ms apart; more on a loaded machine)."""
    e = RedBeatSchedulerEntry.from_key(f"redbeat:{name}", app=app)
    before = datetime.now(timezone.utc)
    remaining = e.schedule.remaining_estimate(e.last_run_at)
    after = datetime.now(timezone.utc)
    return to_ms(before + remaining), to_ms(after + remaining)


def test_what_each_entry_becomes_is_shown_and_nothing_is_written(
        store: Store, redbeat_app: Celery, server: RedisServer) -> None:
    planned = rows(store, redbeat_app, server)
    actions = {name: r.action for name, r in planned.items()}
    assert actions == {
        "every-30s": ImportAction.CREATE, "cron-5min": ImportAction.CREATE,
        "cron-list": ImportAction.CREATE, "never-ran": ImportAction.CREATE,
        "overdue": ImportAction.CREATE,
        "switched-off": ImportAction.CREATE, "rrule-weekly": ImportAction.REFUSED,
        "datetime-arg": ImportAction.REFUSED, "from-config": ImportAction.STATIC}, actions
    assert "rrule" in planned["rrule-weekly"].entry.problem
    assert "kwargs['since']" in planned["datetime-arg"].entry.problem
    assert store.definitions(list(planned)) == []
    shown = json.dumps([r.as_json() for r in planned.values()])
    assert "s3cr3t-arg" not in shown and "tenant-7" not in shown


def test_each_created_entry_runs_next_when_redbeat_would(
        store: Store, redbeat_app: Celery, server: RedisServer) -> None:
    planned = rows(store, redbeat_app, server)
    done = redbeat_import.apply(store, list(planned.values()))
    created = [r.entry.name for r in done if r.action is ImportAction.CREATE]
    assert sorted(created) == ["cron-5min", "cron-list", "every-30s", "never-ran",
                               "overdue", "switched-off"]
    defined = {d.name: d for d in store.definitions(created)}
    states = {e.name: e for e in store.entries(created)}
    for name in created:
        d = defined[name]
        assert d.origin is Origin.REDBEAT and d.version == 1 and not d.deleted, d
        definition = json.loads(d.definition or "{}")
        assert definition["task"] == "tasks.report"
        sched = validate(name, definition).schedule.celery(redbeat_app)
        e = states[name]
        first = occurrences.next_after(sched, e.anchor, e.checkpoint or e.anchor)
        assert first is not None and first == planned[name].entry.next_run_ms, (name, e)
        if name == "overdue":
            # RedBeat sends it at once; here its first is due already: sent at once.
            assert first <= store.now(), (name, e)
        else:
            low, high = redbeats_next_run_ms(redbeat_app, name)
            assert low - 5 <= first <= high + 5, (name, e, low, high)
    every = json.loads(defined["every-30s"].definition or "{}")
    assert every["args"] == ["tenant-7"] and every["kwargs"] == {"token": "s3cr3t-arg"}
    assert every["options"] == {"queue": "reports"} and every["schedule"] == {"every": 30}
    assert json.loads(defined["switched-off"].definition or "{}")["enabled"] is False
    cron = json.loads(defined["cron-list"].definition or "{}")["schedule"]["crontab"]
    assert cron["minute"] == "0,30" and cron["timezone"] == "UTC", cron


def test_imported_again_it_creates_nothing_more(
        store: Store, redbeat_app: Celery, server: RedisServer) -> None:
    redbeat_import.apply(store, list(rows(store, redbeat_app, server).values()))
    again = redbeat_import.apply(store, list(rows(store, redbeat_app, server).values()))
    assert not [r for r in again if r.action is ImportAction.CREATE], again
    versions = {d.name: d.version for d in store.definitions(["every-30s", "cron-5min"])}
    assert versions == {"every-30s": 1, "cron-5min": 1}


def test_an_entry_the_store_defines_is_left_alone(
        store: Store, redbeat_app: Celery, server: RedisServer) -> None:
    planned = rows(store, redbeat_app, server)
    only = [planned["cron-5min"]]
    redbeat_import.apply(store, only)
    # Defined meanwhile by someone else: the plan said create, the store says exists.
    done = redbeat_import.apply(store, [planned["cron-5min"]])
    assert done[0].action is ImportAction.EXISTS
    assert rows(store, redbeat_app, server)["cron-5min"].action is ImportAction.EXISTS
