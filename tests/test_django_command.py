"""``manage.py beat_claims status|history`` prints what ``celery claims status|history``
prints, for the project's app (in process, on the test site against a private server)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO

import pytest
from celery import Celery
from click.testing import CliRunner
from django.core.management import call_command
from django.core.management.base import CommandError

from beat_claims.runs import RunState
from beat_claims.scheduler import Scheduler
from beat_claims.stores.base import Outcome
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer, free_port
from .djangosite.testing import PREFIX, poll, site_app
from .inprocess import settled

SCHEDULE = {"every-second": {"task": "site.tick", "schedule": timedelta(seconds=1)},
            "minutely": {"task": "site.report", "schedule": 60.0}}


@pytest.fixture
def app(server: RedisServer) -> Iterator[Celery]:
    with site_app(server.url, server.broker_url(), beat_schedule=SCHEDULE) as app:
        beat = Scheduler(app=app)
        settled(beat)
        store = RedisStore.from_url(server.url, PREFIX)
        try:
            poll(lambda: [r for r in store.history("every-second")
                          if r.state is RunState.SENT], 10, "a sent run", between=beat.tick)
            store.finish([Outcome("every-second", store.history("every-second")[0].due, None,
                                  RunState.FAILED, exc_type="ValueError", exc_message="boom")])
        finally:
            beat.close()
        yield app


def manage(*args: str) -> str:
    out = StringIO()
    call_command("beat_claims", *args, stdout=out)
    return out.getvalue()


def celery_claims(*args: str) -> str:
    from celery.bin.celery import celery

    result = CliRunner().invoke(celery, ["-A", "tests.djangosite.celery:app", "claims", *args],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_status(app: Celery) -> None:
    doc = json.loads(manage("status", "--json"))
    entries = {e["name"]: e for e in doc["entries"]}
    assert set(entries) >= {"every-second", "minutely"}
    assert entries["every-second"]["in_schedule"] and entries["every-second"]["next_due"]
    assert entries["every-second"]["counts"]["failed"] == 1
    assert [o["alive"] for o in doc["owners"]] in ([], [False])  # the beat stopped cleanly
    table = manage("status")
    assert table.splitlines()[1].startswith("ENTRY")
    # The same table as celery's command, for the same store.
    assert table.strip() == celery_claims("status").strip()


def test_history(app: Celery) -> None:
    doc = json.loads(manage("history", "every-second", "--json", "--limit", "1"))
    assert doc["entry"] == "every-second"
    [run] = doc["runs"]
    assert (run["state"], run["exc_type"], run["exc_message"]) == ("failed", "ValueError",
                                                                   "boom")
    table = manage("history", "every-second")
    assert "ValueError: boom" in table
    assert table.strip() == celery_claims("history", "every-second").strip()
    assert json.loads(manage("history", "every-second", "--json")) == json.loads(
        celery_claims("history", "every-second", "--json"))


def test_the_old_command_still_works_and_says_it_is_deprecated(app: Celery) -> None:
    out, err = StringIO(), StringIO()
    call_command("beat_claims_status", "--json", stdout=out, stderr=err)
    assert "deprecated" in err.getvalue() and "beat_claims status" in err.getvalue()
    assert {e["name"] for e in json.loads(out.getvalue())["entries"]} >= {"every-second"}


def test_an_unreachable_store_is_a_command_error(app: Celery) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with site_app(dead, dead), pytest.raises(CommandError, match="ConnectionError"):
        manage("status")
