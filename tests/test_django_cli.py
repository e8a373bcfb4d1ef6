"""``celery -A proj claims ...`` in a Django project sees the schedule the beats run:
django-celery-beat's rows, read by beat-claims' DatabaseScheduler. Real ``celery beat`` and
``celery ... claims`` processes of the test Django site, on the test's database (committed
rows: ``transaction=True``) and a private redis-server.

What operators' commands must never do is destroy what they cannot see: ``prune`` keeps
every entry a live beat registered or an enabled row holds, and lists what it would remove
(and why) until asked with ``--yes``; ``trigger`` of an entry no live beat schedules is
refused, and records nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django_celery_beat")

from django_celery_beat.models import CrontabSchedule

from beat_claims.runs import iso
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer
from .processes import ROOT, wait_for
from .test_cli import Ran, cli_steps, one_line, step
from .test_django_beat import Site, every, row, site

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("settled_store")]

#: The README's set-up: the database scheduler named in the settings.
SCHEDULER = "beat_claims.contrib.django.DatabaseScheduler"


@pytest.fixture
def env(server: RedisServer, broker: RedisServer) -> dict[str, str]:
    """The environment of every process of the site: its settings, the test's database,
    the private servers, and the database scheduler in CELERY_BEAT_SCHEDULER."""
    from django.conf import settings

    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.djangosite.settings",
        "BC_DJANGO_DB_NAME": settings.DATABASES["default"]["NAME"],
        "BC_REDIS_URL": server.url,
        "BC_BROKER_URL": broker.broker_url(),
        "BC_BEAT_SCHEDULER": SCHEDULER,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }


@pytest.fixture
def fleet(env: dict[str, str], tmp_path: Path) -> Iterator[Site]:
    with site(env, tmp_path) as f:
        yield f


@pytest.fixture
def store(server: RedisServer) -> Iterator[RedisStore]:
    s = RedisStore.from_url(server.url, "beat-claims")
    yield s
    s.close()


def claims(env: dict[str, str], *args: str, app: str = "tests.djangosite.celery") -> Ran:
    """``celery -A APP claims ARGS`` in its own process, as an operator runs it."""
    done = subprocess.run([sys.executable, "-m", "celery", "-A", app, "claims", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return Ran(done.returncode, done.stdout, done.stderr)


def claims_steps(env: dict[str, str], *steps: tuple[tuple[str, ...], str],
                 app: str = "tests.djangosite.celery") -> list[Ran]:
    """What :func:`claims` gives for each of ``steps`` (:func:`step`), run one after the
    other in one process (each as ``celery`` runs it): one start of the project for all."""
    return cli_steps(None, list(steps), app=app, environ=env)


def doc(ran: Ran) -> Any:
    assert ran.code == 0, ran
    return json.loads(ran.out)


def nightly() -> CrontabSchedule:
    """A schedule that does not fall due while a test runs."""
    return CrontabSchedule.objects.create(minute="0", hour="3", day_of_month="1",
                                          month_of_year="1")


def registrants(store: RedisStore, name: str) -> set[str] | None:
    found = [e for e in store.entries([name]) if e.anchor is not None]
    if not found or found[0].registrants is None:
        return None
    return {r.owner for r in found[0].registrants}


def started(fleet: Site) -> Any:
    """A beat of the site, once it claims: its first registration done. (A stop signal
    that lands in the garbage collection it runs then, in an object's finalizer, is lost:
    Celery's handler raises SystemExit there, and Python ignores it.)"""
    beat = fleet.beat()
    fleet.wait_log(beat, "registered; claiming", 60)
    return beat


def registered(store: RedisStore, *names: str) -> bool:
    """Every one of ``names`` is registered in the store (anchored, and its registrants
    noted in the same round trip)."""
    return all(e.anchor is not None for e in store.entries(names))


def test_status_health_backfill_and_trigger_see_the_rows_the_beats_run(
        env: dict[str, str], fleet: Site, store: RedisStore) -> None:
    row("every-2s", interval=every(2))
    row("yearly", crontab=nightly())
    beat = started(fleet)
    wait_for(lambda: registered(store, "every-2s", "yearly")
             and any(r.sent_at for r in store.history("every-2s")), 60,
             "the beat to register the rows and send every-2s")

    [record] = store.entries(["every-2s"])
    assert record.anchor is not None
    now = store.now()
    status, table, backfill, ran = claims_steps(
        env, step("status", "-j"), step("status"),
        step("backfill", "every-2s", "--from", iso(record.anchor) or "", "--to", iso(now) or "",
             "-j"),
        step("trigger", "every-2s", "-j"))

    # status: the rows are in the schedule, with their next occurrences.
    entries = {e["name"]: e for e in doc(status)["entries"]}
    for name in ("every-2s", "yearly"):
        assert entries[name]["in_schedule"] and entries[name]["next_due"], entries[name]
    assert table.code == 0 and "(removed)" not in table.out, table

    # backfill: the row's occurrences are computed as the beat computes them.
    done = doc(backfill)
    assert done["occurrences"] >= 1 and done["created"] == [], done  # every one was sent

    # trigger: no warning that the entry is not scheduled; the live beat is named.
    triggered = doc(ran)
    assert triggered["in_schedule"] is True and ran.err == "", ran
    assert triggered["beats"] and all(":" in b for b in triggered["beats"]), triggered
    wait_for(lambda: any(r.manual and r.sent_at for r in store.history("every-2s")), 30,
             "the beat to send the triggered run")

    # health: the rows are examined; once no beat runs, every-2s is overdue.
    fleet.stop(beat)

    def overdue() -> dict[str, Any] | None:
        ran = claims(env, "health", "--grace", "1", "-j")
        report: dict[str, Any] = json.loads(ran.out)
        [check] = [c for c in report["checks"] if c["name"] == "overdue"]
        return report if ran.code == 1 and "every-2s" in json.dumps(check) else None

    report = wait_for(overdue, 30, "health to find every-2s overdue")
    assert "overdue" in report["failed"], report


def test_prune_keeps_what_a_live_beat_registered_or_an_enabled_row_holds(
        env: dict[str, str], fleet: Site, store: RedisStore,
        server: RedisServer) -> None:
    row("yearly", crontab=nightly())
    weekly = row("to-disable", crontab=nightly())
    beat = started(fleet)
    wait_for(lambda: registered(store, "yearly", "to-disable"), 60,
             "the beat to register the rows")
    anchors = {e.name: e.anchor for e in store.entries(["yearly", "to-disable"])}

    # Run with an app that does not have the rows (a worker-only module): a live beat
    # registered them, so nothing may go, with --yes or without.
    other = {**env, "BC_REDIS_URL": server.url, "BC_SCHEDULE": "{}"}
    other.pop("DJANGO_SETTINGS_MODULE")
    listed, done = map(doc, claims_steps(
        other, step("prune", "--older-than", "0", "-j"),
        step("prune", "--older-than", "0", "--yes", "-j"), app="tests.proj.app"))
    assert listed["removable"] == [] and listed["dry_run"] is True, listed
    assert {k["entry"] for k in listed["kept_registered"]} == {"yearly", "to-disable"}
    assert done["removed"] == [] and done["dry_run"] is False, done
    assert {e.name: e.anchor for e in store.entries(["yearly", "to-disable"])} == anchors

    # With the Django project's app: the enabled rows are its schedule.
    listed = doc(claims(env, "prune", "--older-than", "0", "-j"))
    assert listed["removable"] == [] and listed["kept_scheduled"] >= 2, listed

    # A row disabled while the beat runs: the beat withdraws it, and prune lists it (and
    # why) without removing it until --yes (which finds it there after the listing).
    weekly.enabled = False
    weekly.save()
    wait_for(lambda: registrants(store, "to-disable") == set(), 30,
             "the beat to withdraw the disabled row")
    ran, removed = claims_steps(env, step("prune", "--older-than", "0"),
                                step("prune", "--older-than", "0", "--yes", "-j"))
    assert ran.code == 0, ran
    assert "would remove 1 entr(ies)" in ran.out and "--yes" in ran.out, ran.out
    assert "to-disable: not in this app's schedule" in ran.out, ran.out
    assert "no longer schedules it" in ran.out, ran.out
    done = doc(removed)
    assert done["removed"] == ["to-disable"], done
    assert "to-disable" not in {e.name for e in store.entries()}

    # No live beat any more: the enabled row still holds its entry.
    fleet.stop(beat)
    pruned, bad = claims_steps(env, step("prune", "--older-than", "0", "--yes", "-j"),
                               step("prune", "--yes", "--dry-run"))
    done = doc(pruned)
    assert done["removed"] == [] and done["removable"] == [], done
    assert [e.anchor for e in store.entries(["yearly"])] == [anchors["yearly"]]
    assert bad.code == 2 and "--dry-run" in bad.err, bad


def test_trigger_of_an_entry_no_live_beat_schedules_is_refused_and_records_nothing(
        env: dict[str, str], fleet: Site, store: RedisStore) -> None:
    row("yearly", crontab=nightly())
    later = row("disabled-later", crontab=nightly())
    beat = started(fleet)
    wait_for(lambda: registered(store, "yearly", "disabled-later"), 60,
             "the beat to register the rows")
    fleet.stop(beat)  # the only beat that schedules them
    line = one_line(claims(env, "trigger", "yearly"))
    assert "no live beat schedules yearly" in line and "(stopped)" in line, line
    assert "nothing was recorded" in line, line
    assert store.history("yearly") == []
    # A row disabled while a beat runs: that beat withdraws it, and nobody else has it.
    beat = started(fleet)
    wait_for(lambda: bool(registrants(store, "yearly")
                          & {o.owner.id for o in store.owners() if o.alive}), 60,
             "a new beat to register the rows")
    later.enabled = False
    later.save()
    wait_for(lambda: registrants(store, "disabled-later") == set(), 30,
             "the beat to withdraw the disabled row")
    refused, triggered = claims_steps(env, step("trigger", "disabled-later"),
                                      step("trigger", "yearly", "-j"))
    line = one_line(refused)
    assert "no live beat schedules disabled-later" in line, line
    assert "no longer schedules it" in line, line
    assert store.history("disabled-later") == []
    assert doc(triggered)["beats"]  # the live beat has it
