"""`celery claims import redbeat`: shows what it will create unless told --yes, then creates
it; run again, it creates nothing more. RedBeat's keys are written by celery-redbeat."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
import redis
from celery import Celery
from celery.schedules import crontab, schedule
from redbeat import RedBeatSchedulerEntry

from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer
from .test_cli import cli


def redbeat_url(server: RedisServer) -> str:
    return f"redis://:pw%2Fwith%40@127.0.0.1:{server.port}/2"


@pytest.fixture
def redbeat_keys(server: RedisServer) -> Iterator[None]:
    server.client().config_set("requirepass", "pw/with@")
    app = Celery("redbeat_users", set_as_current=False)
    app.conf.update(redbeat_redis_url=redbeat_url(server), timezone="UTC")
    now = datetime.now(timezone.utc)
    for name, sched in (("tenant-1-report", schedule(timedelta(minutes=15))),
                        ("tenant-2-report", crontab(minute="*/10"))):
        e = RedBeatSchedulerEntry(name, "tasks.report", sched, app=app,
                                  kwargs={"api_key": "s3cr3t-key"})
        e.save()
        e.reschedule(last_run_at=now)
    yield
    redis.Redis.from_url(redbeat_url(server)).config_set("requirepass", "")


def test_a_dry_run_shows_each_entry_and_creates_nothing_then_yes_creates_them(
        server: RedisServer, redbeat_keys: None) -> None:
    store_url = f"redis://:pw%2Fwith%40@127.0.0.1:{server.port}/0"
    env = {"BC_REDIS_URL": store_url, "BC_BROKER_URL": store_url}
    dry = cli(None, "import", "redbeat", "--url", redbeat_url(server), **env)
    assert dry.code == 0, dry
    assert "tenant-1-report" in dry.out and "would create" in dry.out, dry.out
    assert "s3cr3t-key" not in dry.out + dry.err and "pw/with@" not in dry.out + dry.err
    store = RedisStore.from_url(store_url)
    names = ["tenant-1-report", "tenant-2-report"]
    assert store.definitions(names) == []

    done = cli(None, "import", "redbeat", "--url", redbeat_url(server), "--yes", "-j", **env)
    assert done.code == 0, done
    doc = json.loads(done.out)
    assert doc["dry_run"] is False and doc["counts"] == {"create": 2}, doc
    assert "pw/with@" not in done.out and doc["source"].startswith("redis://:***@"), doc
    assert [d.origin.value for d in store.definitions(names)] == ["redbeat", "redbeat"]

    again = cli(None, "import", "redbeat", "--url", redbeat_url(server), "--yes", "-j",
                **env)
    assert json.loads(again.out)["counts"] == {"exists": 2}, again.out


def test_redbeats_redis_unreachable_is_one_line_without_its_password(
        server: RedisServer) -> None:
    ran = cli(server, "import", "redbeat", "--url", "redis://:hunter2@127.0.0.1:1/0")
    assert ran.code == 1 and "hunter2" not in ran.err and "cannot be read" in ran.err, ran


def _redbeat_datetime(**fields: object) -> dict[str, object]:
    """A datetime as RedBeat's encoder writes it, with ``fields`` changed."""
    return {"__type__": "datetime", "year": 2026, "month": 1, "day": 1, "hour": 0,
            "minute": 0, "second": 0, "microsecond": 0, "timezone": "UTC", **fields}


def test_a_redbeat_record_that_cannot_be_read_is_refused_and_the_others_are_imported(
        server: RedisServer, redbeat_keys: None) -> None:
    """A hand-edited or damaged RedBeat record (a datetime with a zone this host does not
    know, a field its encoding never writes, a number JSON cannot make a date of, JSON
    nested deeper than a parser goes, a ``last_run_at`` that cannot be read, or one that
    puts the next run past the year 9999 or before 1970) is that entry's problem: listed
    refused (the unreadable ``last_run_at`` alone: as if never run), and the import goes
    on."""
    client = redis.Redis.from_url(redbeat_url(server))
    interval = {"__type__": "interval", "every": 60, "relative": False}

    def entry(name: str, definition: str, meta: str | None = None) -> None:
        client.hset(f"redbeat:{name}", mapping={"definition": definition,
                                                 **({"meta": meta} if meta else {})})
        client.zadd("redbeat::schedule", {f"redbeat:{name}": time.time() + 60})

    def doc(kwargs: object) -> str:
        return json.dumps({"name": "x", "task": "tasks.report", "schedule": interval,
                           "args": [], "kwargs": kwargs, "options": {}, "enabled": True})

    entry("unknown-zone", doc({"since": _redbeat_datetime(timezone="Mars/Olympus")}))
    entry("odd-field", doc({"since": _redbeat_datetime(leap=1)}))
    entry("infinite-year", doc({"since": _redbeat_datetime(year=float("inf"))}))
    entry("too-deep", "[" * 100_000 + "]" * 100_000)
    entry("bad-meta", doc({}), json.dumps({"last_run_at": _redbeat_datetime(
        year=float("inf"))}))
    # A last run whose next run no date reaches, and one before 1970.
    entry("year-9999", doc({}), json.dumps({"last_run_at": _redbeat_datetime(
        year=9999, month=12, day=31, hour=23, minute=59, second=30)}))
    entry("year-1", doc({}), json.dumps({"last_run_at": _redbeat_datetime(year=1)}))
    store_url = f"redis://:pw%2Fwith%40@127.0.0.1:{server.port}/0"
    dry = cli(None, "import", "redbeat", "--url", redbeat_url(server), "-j",
              BC_REDIS_URL=store_url, BC_BROKER_URL=store_url)
    client.close()
    assert dry.code == 0, dry
    actions = {row["name"]: row["action"] for row in json.loads(dry.out)["entries"]}
    assert actions == {"unknown-zone": "refused", "odd-field": "refused",
                       "infinite-year": "refused", "too-deep": "refused",
                       "bad-meta": "create", "year-9999": "refused", "year-1": "refused",
                       "tenant-1-report": "create",
                       "tenant-2-report": "create"}, actions
