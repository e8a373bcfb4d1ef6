"""DatabaseScheduler: django-celery-beat's PeriodicTask rows as claimed entries.

In-process tests drive schedulers tick by tick in the test's own database transaction; the
integration test runs two real ``celery beat -S ...DatabaseScheduler`` processes and a real
worker against the same test database (committed data, ``transaction=True``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django_celery_beat")

from celery.schedules import solar
from django.db.utils import OperationalError
from django.utils import timezone
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    SolarSchedule,
)
from django_celery_beat.tzcrontab import TzAwareCrontab

from beat_claims import occurrences, schedule_words
from beat_claims.contrib.django.database_scheduler import (
    DatabaseScheduler,
    schedules_from_db,
)
from beat_claims.runs import RunState, iso, to_ms
from beat_claims.settings import ConfigurationError
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer
from .inprocess import make_app, messages, occurrences_sent, run_for, settled
from .processes import ROOT, Fleet, running, wait_for

pytestmark = pytest.mark.usefixtures("settled_store")

TASK = "djangosite.record"


def every(seconds: float) -> IntervalSchedule:
    if seconds == int(seconds):
        return IntervalSchedule.objects.create(every=int(seconds), period=IntervalSchedule.SECONDS)
    return IntervalSchedule.objects.create(every=round(seconds * 1_000_000),
                                           period=IntervalSchedule.MICROSECONDS)


def at(when: datetime) -> ClockedSchedule:
    return ClockedSchedule.objects.create(clocked_time=when)


def row(name: str, **fields: Any) -> PeriodicTask:
    return PeriodicTask.objects.create(name=name, task=TASK, **fields)


def scheduler(server: RedisServer, schedule: dict[str, Any] | None = None,
              **conf: Any) -> DatabaseScheduler:
    s = DatabaseScheduler(app=make_app(server, schedule or {}, **conf))
    settled(s)
    return s


def sent_dues(server: RedisServer, name: str) -> list[int]:
    return [to_ms(datetime.fromisoformat(due.replace("Z", "+00:00")))
            for entry, due in occurrences_sent(server) if entry == name]


def no_duplicates(pairs: list[tuple[str, str]]) -> None:
    assert {k: n for k, n in Counter(pairs).items() if n > 1} == {}


# -- entries from rows ----------------------------------------------------------------

@pytest.mark.django_db
def test_rows_become_entries_as_django_celery_beat_builds_them(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    soon = timezone.now() + timedelta(hours=1)
    row("interval", interval=every(2), args='[1, "a"]', kwargs='{"k": 2}', queue="q1",
        exchange="ex", routing_key="rk", priority=3, headers='{"h": "v"}', expire_seconds=30)
    row("cron", crontab=CrontabSchedule.objects.create(minute="15", hour="4",
                                                       timezone="Europe/Paris"))
    row("solar", solar=SolarSchedule.objects.create(event="sunrise", latitude=48.85,
                                                    longitude=2.35))
    row("clocked", clocked=at(soon), one_off=True)
    row("disabled", interval=every(2), enabled=False)
    row("bad-args", interval=every(2), args="[not json")
    row("from-config", interval=every(2))
    with caplog.at_level(logging.WARNING, logger="celery.beat.claims"):
        s = scheduler(server, {"from-config": {"task": "t.config", "schedule": 5.0}})
    assert set(s.schedule) == {"interval", "cron", "solar", "clocked", "from-config"}

    e = s.schedule["interval"]
    assert (e.task, e.args, e.kwargs) == (TASK, [1, "a"], {"k": 2})
    assert e.options == {"queue": "q1", "exchange": "ex", "routing_key": "rk", "priority": 3,
                         "expires": 30,
                         "headers": {"h": "v", "periodic_task_name": "interval"}}
    assert schedule_words.describe(e.schedule) == "every 2 s"
    cron = s.schedule["cron"].schedule
    assert isinstance(cron, TzAwareCrontab) and str(cron.tz) == "Europe/Paris"
    assert schedule_words.describe(cron) == "at 04:15 Europe/Paris"
    assert isinstance(s.schedule["solar"].schedule, solar)
    assert occurrences.clocked_instant(s.schedule["clocked"].schedule) == to_ms(soon)
    assert s.schedule["from-config"].task == "t.config"  # beat_schedule wins a name clash
    text = caplog.text
    assert "'bad-args' is not scheduled" in text and "not JSON" in text
    assert "'from-config' has the name of a beat_schedule entry" in text
    s.close()


@pytest.mark.django_db
def test_start_time_expires_and_one_off_are_the_entrys_bounds(server: RedisServer) -> None:
    now = timezone.now()
    row("plain", interval=every(1))
    row("later", interval=every(1), start_time=now + timedelta(seconds=30))
    row("expiring", interval=every(1), expires=now + timedelta(seconds=30))
    row("once", interval=every(1), one_off=True, start_time=now + timedelta(seconds=10))
    row("clocked", clocked=at(now + timedelta(seconds=20)), one_off=True,
        expires=now + timedelta(seconds=40))
    s = scheduler(server)
    s.tick()  # anchors the entries in the store
    anchor = s.store.entries(["once"])[0].anchor
    assert s.bounds("plain") == (None, None)
    assert s.bounds("later") == (to_ms(now) + 30_000, None)
    assert s.bounds("expiring") == (None, to_ms(now) + 30_000 - 1)
    # One-off: its first occurrence at or after start_time, on the entry's own grid, alone.
    first = anchor + ((to_ms(now) + 10_000 - 1 - anchor) // 1000 + 1) * 1000
    assert s.bounds("once") == (first, first)
    clocked = to_ms(now) + 20_000
    assert s.bounds("clocked") == (clocked, clocked)
    s.close()


@pytest.mark.django_db
def test_bounds_one_off_and_clocked_with_two_schedulers(server: RedisServer) -> None:
    # The instants below count from when the beats start claiming: at once, on the
    # store's settled epoch (settled_store).
    now = timezone.now()
    row("plain", interval=every(0.5))
    later = row("later", interval=every(0.5), start_time=now + timedelta(seconds=1.5))
    # (3 s: two schedulers made on a loaded machine may start claiming a second or two late)
    expiring = row("expiring", interval=every(0.5), expires=now + timedelta(seconds=3))
    once = row("once", interval=every(0.5), one_off=True)
    soon = row("clocked-soon", clocked=at(now + timedelta(seconds=1)), one_off=True)
    # Created a second before the first beat sees it: it still runs once (catch-up).
    past = row("clocked-past", clocked=at(now - timedelta(seconds=1)), one_off=True)
    one, two = scheduler(server), scheduler(server)
    run_for(4.2, one, two)
    one.close()
    two.close()
    no_duplicates(occurrences_sent(server))
    assert len(sent_dues(server, "plain")) >= 4
    assert sent_dues(server, "later") and min(sent_dues(server, "later")) >= to_ms(
        later.start_time)
    assert sent_dues(server, "expiring") and max(sent_dues(server, "expiring")) < to_ms(
        expiring.expires)
    assert len(sent_dues(server, "once")) == 1
    assert sent_dues(server, "clocked-soon") == [to_ms(soon.clocked.clocked_time)]
    assert sent_dues(server, "clocked-past") == [to_ms(past.clocked.clocked_time)]
    # Written back for the admin (close() writes what is still owed).
    for one_off in (once, soon, past):
        one_off.refresh_from_db()
        assert not one_off.enabled and one_off.total_run_count == 0
        assert one_off.last_run_at is not None
    plain = PeriodicTask.objects.get(name="plain")
    assert plain.total_run_count == len(sent_dues(server, "plain"))
    assert plain.last_run_at is not None
    assert to_ms(plain.last_run_at) == max(sent_dues(server, "plain"))


@pytest.mark.django_db
def test_a_clocked_time_that_passed_long_ago_is_skipped_with_catch_up_none(
        server: RedisServer) -> None:
    row("missed", clocked=at(timezone.now() - timedelta(seconds=30)), one_off=True)
    s = scheduler(server, beat_claims_catch_up="none")
    run_for(1.0, s)
    s.close()
    assert sent_dues(server, "missed") == []
    assert [r.state for r in s.store.history("missed")] == [RunState.SKIPPED]


@pytest.mark.django_db
def test_a_one_off_row_that_already_ran_is_disabled_not_run(server: RedisServer) -> None:
    now = timezone.now()
    # django-celery-beat's mark: an enabled one-off row with a run count.
    ran = row("ran", interval=every(0.5), one_off=True, total_run_count=1)
    # A clocked row whose last run is at or after its instant.
    clocked = row("clocked-ran", clocked=at(now - timedelta(seconds=1)), one_off=True)
    PeriodicTask.objects.filter(pk=clocked.pk).update(last_run_at=now)
    s = scheduler(server)
    assert "ran" not in s.schedule and "clocked-ran" not in s.schedule
    run_for(1.2, s)
    s.close()
    assert messages(server) == []
    for one_off in (ran, clocked):
        one_off.refresh_from_db()
        assert not one_off.enabled and one_off.total_run_count == 0


@pytest.mark.django_db
def test_a_re_enabled_one_off_row_runs_once_more(server: RedisServer) -> None:
    once = row("once", interval=every(0.5), one_off=True)
    s = scheduler(server)
    wait_for(lambda: run_for(0.2, s) or sent_dues(server, "once"), 5, "the one-off run")
    wait_for(lambda: run_for(0.2, s) or not PeriodicTask.objects.get(pk=once.pk).enabled, 5,
             "the one-off row to be disabled")
    once.refresh_from_db()
    once.enabled = True  # as the admin saves it
    once.save()
    wait_for(lambda: run_for(0.2, s) or len(sent_dues(server, "once")) == 2, 5,
             "the second run")
    run_for(1.5, s)
    s.close()
    assert len(sent_dues(server, "once")) == 2


# -- changes made in the admin ------------------------------------------------------

def tick_until(s: Any, predicate: Callable[[], Any], timeout: float, what: str) -> float:
    """Tick ``s`` until ``predicate()``: the monotonic instant the tick that made it true
    began (fail with ``what`` after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        began = time.monotonic()
        s.tick()
        if predicate():
            return began
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.mark.django_db
def test_changes_are_picked_up_within_max_interval(server: RedisServer) -> None:
    row("kept", interval=every(0.5))
    s = scheduler(server)
    delay = s.max_interval
    run_for(0.6, s)
    added = time.monotonic()
    new = row("added", interval=every(0.5))
    # (judged by when the tick that took it in began: a loaded machine makes ticks longer)
    took = tick_until(s, lambda: "added" in s.schedule, 5, "the new row")
    assert took - added <= delay + 0.3, took - added
    wait_for(lambda: run_for(0.05, s) or sent_dues(server, "added"), 5, "a send of the new row")

    new.enabled = False  # as the admin saves it
    new.save()
    disabled_at = to_ms(timezone.now())
    started = time.monotonic()
    took = tick_until(s, lambda: "added" not in s.schedule, 5, "the row to go")
    assert took - started <= delay + 0.3, took - started
    run_for(1.2, s)
    assert max(sent_dues(server, "added")) <= disabled_at + int(delay * 1000) + 300

    PeriodicTask.objects.get(name="kept").delete()
    wait_for(lambda: run_for(0.05, s) or "kept" not in s.schedule, 5, "the deleted row to go")
    s.close()


@pytest.mark.django_db
def test_database_outage_keeps_the_last_schedule_and_is_logged_once(
        server: RedisServer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    row("kept", interval=every(0.5))
    s = scheduler(server)
    module = sys.modules[DatabaseScheduler.__module__]

    def down() -> None:
        raise OperationalError("connection refused (test)")

    with caplog.at_level(logging.INFO, logger="celery.beat.claims"):
        with monkeypatch.context() as patch:
            patch.setattr(module, "_close_stale_connections", down)
            patch.setattr(module, "WRITE_BACK_EVERY", 0.0)
            run_for(1.6, s)  # reads and write-backs fail; sends go on
            assert set(s.schedule) == {"kept"}
            sent = sent_dues(server, "kept")
            assert len(sent) >= 2
            errors = [r for r in caplog.records if "cannot be read" in r.getMessage()]
            assert len(errors) == 1 and "connection refused (test)" in errors[0].getMessage()
        s._next_check = 0.0
        run_for(0.3, s)
        assert "reachable again" in caplog.text
    s.close()
    kept = PeriodicTask.objects.get(name="kept")  # nothing written back twice or lost
    assert kept.total_run_count == len(sent_dues(server, "kept"))


# -- policies, status ---------------------------------------------------------------

@pytest.mark.django_db
def test_per_entry_claims_for_rows_come_from_a_setting(server: RedisServer) -> None:
    row("nightly", crontab=CrontabSchedule.objects.create(minute="0", hour="2"))
    row("other", interval=every(5))
    s = scheduler(server, beat_claims_entry_claims={
        "nightly": {"catch_up": "all", "run_timeout": 60}})
    assert s.policies["nightly"].catch_up == "all" and s.policies["nightly"].run_timeout == 60
    assert s.policies["other"] == s.settings.policy
    s.close()
    with pytest.raises(ConfigurationError, match=r"'nightly'.*'catch_up'.*'sometimes'"):
        scheduler(server, beat_claims_entry_claims={"nightly": {"catch_up": "sometimes"}})


@pytest.mark.django_db
def test_schedules_from_db_for_status_pages(server: RedisServer) -> None:
    row("on", interval=every(5))
    row("off", interval=every(5), enabled=False)
    assert set(schedules_from_db()) == {"on"}
    assert set(schedules_from_db(enabled_only=False)) == {"on", "off"}
    assert schedule_words.describe(schedules_from_db()["on"]) == "every 5 s"


# -- two real beats and a worker ----------------------------------------------------

def _scheduler_path() -> str:
    """The documented ``-S`` path (the package exports it lazily)."""
    return "beat_claims.contrib.django.DatabaseScheduler"


class Site(Fleet):
    """Real celery processes of the test Django site, on the test's database."""

    APP = "tests.djangosite.celery"

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}

    def beat(self, **env: str) -> subprocess.Popen[bytes]:
        return self._spawn("beat", ["beat", "--loglevel", "INFO", "-S", _scheduler_path(),
                                    "-s", str(self.log_dir / f"unused-{len(self.procs)}")])

    def worker(self, *extra: str, concurrency: int = 2, **env: str) -> subprocess.Popen[bytes]:
        return self._spawn("worker", ["worker", "--loglevel", "INFO",
                                      "-I", "tests.djangosite.tasks", "-P", "prefork",
                                      "-c", str(concurrency), "--without-gossip",
                                      "--without-mingle", "-n", f"w{len(self.procs)}@%h",
                                      *extra])


def site(env: dict[str, str], log_dir: Path) -> contextlib.AbstractContextManager[Site]:
    return running(Site(env, log_dir))


def site_env(server: RedisServer, broker: RedisServer) -> dict[str, str]:
    """The environment of the site's processes: the test's database, its private servers."""
    from django.conf import settings

    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.djangosite.settings",
        "BC_DJANGO_DB_NAME": settings.DATABASES["default"]["NAME"],
        "BC_REDIS_URL": server.url,
        "BC_BROKER_URL": broker.broker_url(),
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }


def executions(broker: RedisServer) -> list[dict[str, Any]]:
    """What the worker ran (the task records into the broker's database)."""
    return [json.loads(raw) for raw in broker.client(db=1).lrange("executions", 0, -1)]


def dues_of(rows: list[dict[str, Any]], name: str) -> list[int]:
    return sorted(to_ms(datetime.fromisoformat(r["due"].replace("Z", "+00:00")))
                  for r in rows if r["entry"] == name)


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_two_real_beats_send_every_database_occurrence_once(
        server: RedisServer, broker: RedisServer, tmp_path: Path) -> None:
    row("every-1s", interval=every(1), args="[1]", kwargs='{"x": "y"}')
    row("every-2s", interval=every(2))
    row("cron-kolkata", crontab=CrontabSchedule.objects.create(minute="*",
                                                               timezone="Asia/Kolkata"))
    to_disable = row("to-disable", interval=every(1))
    row("one-off", interval=every(2), one_off=True)
    env = site_env(server, broker)
    delay = 1.0  # the site's max_interval: min(beat_max_loop_interval, heartbeat_interval)
    store = RedisStore.from_url(server.url, "beat-claims")
    with site(env, tmp_path) as fleet:
        worker = fleet.worker()
        beats = [fleet.beat(), fleet.beat()]
        for beat in beats:
            wait_for(lambda beat=beat: "from the database)" in fleet.log(beat), 30,
                     "the beat to read the database schedule")
        # Created while the beats run, as in the admin: one due in 3 s, one a second ago.
        soon = row("clocked-soon", clocked=at(timezone.now() + timedelta(seconds=3)),
                   one_off=True)
        past = row("clocked-past", clocked=at(timezone.now() - timedelta(seconds=1)),
                   one_off=True)
        wait_for(lambda: len(dues_of(executions(broker), "to-disable")) >= 5, 30,
                 "five runs of to-disable")
        to_disable.enabled = False  # as the admin saves it
        to_disable.save()
        disabled_at = to_ms(timezone.now())
        wait_for(lambda: len(dues_of(executions(broker), "every-1s")) >= 15, 40,
                 "fifteen runs of every-1s")
        for beat in beats:
            fleet.stop(beat)
        names = ("every-1s", "every-2s", "cron-kolkata", "to-disable", "one-off",
                 "clocked-soon", "clocked-past")

        def all_ran() -> bool:
            """Every run the store says was sent ran; a run caught ``sending`` by the stop
            (its publish may or may not have happened) may have run."""
            ran_now = executions(broker)
            for name in names:
                runs = store.history(name)
                sent = {r.due for r in runs if r.state in (
                    RunState.SENT, RunState.STARTED, RunState.DONE)}
                maybe = {r.due for r in runs if r.state is RunState.SENDING}
                if not sent <= set(dues_of(ran_now, name)) <= sent | maybe:
                    return False
            return True

        wait_for(all_ran, 30, "the worker to run every occurrence sent")
        fleet.stop(worker)
        ran = executions(broker)
        pairs = [(r["entry"], r["due"]) for r in ran]
        no_duplicates(pairs)
        for name, period in (("every-1s", 1000), ("every-2s", 2000), ("to-disable", 1000)):
            dues = dues_of(ran, name)
            assert dues and all(b - a == period for a, b in itertools.pairwise(dues)), (name, dues)
        assert next(r["args"] for r in ran if r["entry"] == "every-1s") == [1]
        assert {r["periodic_task_name"] for r in ran} == {r["entry"] for r in ran}
        # Disabled in the admin: nothing due after the documented delay was sent.
        late = [iso(d) for d in dues_of(ran, "to-disable")
                if d > disabled_at + int(delay * 1000) + 500]
        assert late == [], (iso(disabled_at), late)
        assert len(dues_of(ran, "one-off")) == 1
        assert dues_of(ran, "clocked-soon") == [to_ms(soon.clocked.clocked_time)]
        assert dues_of(ran, "clocked-past") == [to_ms(past.clocked.clocked_time)]
        for name in ("one-off", "clocked-soon", "clocked-past"):
            assert not PeriodicTask.objects.get(name=name).enabled, name
        # The admin's columns: each beat added what it sent; written back at its stop.
        row_1s = PeriodicTask.objects.get(name="every-1s")
        assert row_1s.total_run_count == len(dues_of(ran, "every-1s"))
        assert row_1s.last_run_at is not None
        assert to_ms(row_1s.last_run_at) == dues_of(ran, "every-1s")[-1]
        sys.stdout.write(f"executions: {dict(Counter(r['entry'] for r in ran))}\n")



@pytest.mark.django_db
def test_run_now_on_one_off_and_clocked_rows_keeps_their_own_instant(
        server: RedisServer) -> None:
    """An operator's run of a one-off or clocked row runs at once, and the row's own
    occurrence still runs at its instant (and only then is the row disabled)."""
    s = scheduler(server)
    now = timezone.now()
    once = row("once-later", interval=every(0.5), one_off=True,
               start_time=now + timedelta(seconds=2.5))
    clocked = row("clocked-later", clocked=at(now + timedelta(seconds=2.5)), one_off=True)
    s._refresh(force=True)
    run_for(0.6, s)  # registers the rows
    for name in ("once-later", "clocked-later"):
        assert s.store.request_run(name, "admin:op", f"req-{name}") is not None
    wait_for(lambda: s.tick() is not None and all(
        any(r.manual and r.state is RunState.SENT for r in s.store.history(n))
        for n in ("once-later", "clocked-later")), 10, "the operator's runs")
    for one_off in (once, clocked):
        one_off.refresh_from_db()
        assert one_off.enabled, f"{one_off.name} was disabled by a manual run"
    run_for(3.0, s)
    s.close()
    for one_off in (once, clocked):
        one_off.refresh_from_db()
        scheduled = [r for r in s.store.history(one_off.name) if not r.manual]
        assert len(scheduled) == 1 and scheduled[0].state is RunState.SENT, scheduled
        assert not one_off.enabled  # disabled once its own occurrence ran


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_re_enabled_one_off_row_runs_once_more_with_two_real_beats(
        server: RedisServer, broker: RedisServer, tmp_path: Path) -> None:
    """A one-off row that ran (and was disabled) and that the user enables again runs once
    more, by one of the beats: enabled in the row's form (``save()``: its ``date_changed``
    moves) or with the list's "Enable selected tasks" action (``update()``: nothing but
    ``enabled`` changes)."""
    from django_celery_beat.models import PeriodicTasks

    saved = row("re-saved", interval=every(1), one_off=True)
    action = row("re-enabled-by-action", interval=every(1), one_off=True)
    names = (saved.name, action.name)
    store = RedisStore.from_url(server.url, "beat-claims")

    def runs_sent(name: str) -> list[int]:
        return sorted(r.due for r in store.history(name) if r.state in (
            RunState.SENDING, RunState.SENT, RunState.STARTED, RunState.DONE))

    def shown(runs: dict[str, list[int]]) -> dict[str, list[str | None]]:
        return {name: [iso(due) for due in dues] for name, dues in runs.items()}

    def ran_and_disabled(count: int) -> bool:
        return all(len(runs_sent(name)) >= count
                   and not PeriodicTask.objects.get(name=name).enabled for name in names)

    with site(site_env(server, broker), tmp_path) as fleet:
        worker = fleet.worker(concurrency=1)
        beats = [fleet.beat(), fleet.beat()]
        wait_for(lambda: ran_and_disabled(1), 40, "each one-off row to run and be disabled")
        first = {name: runs_sent(name) for name in names}
        # Enabled again a few intervals later: the occurrences between are not the row's.
        ran_at = max(due for dues in first.values() for due in dues)
        wait_for(lambda: to_ms(timezone.now()) >= ran_at + 2500, 5, "two intervals more")
        enabled_at = to_ms(timezone.now())
        saved.refresh_from_db()
        saved.enabled = True  # the row's form in the admin
        saved.save()
        # The admin's "Enable selected tasks" action (PeriodicTaskAdmin.enable_tasks).
        PeriodicTask.objects.filter(pk=action.pk).update(enabled=True)
        PeriodicTasks.update_changed()
        try:
            wait_for(lambda: ran_and_disabled(2), 30, "each re-enabled row to run once more")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}; runs: {shown({n: runs_sent(n) for n in names})}") from None
        # A window of several intervals and of each beat's reading of the rows: nothing more.
        watch_until = time.monotonic() + 3.0
        wait_for(lambda: time.monotonic() >= watch_until, 5, "the watch window")
        for beat in beats:
            fleet.stop(beat)
        sent = {name: runs_sent(name) for name in names}
        wait_for(lambda: all(len(dues_of(executions(broker), n)) == len(sent[n])
                             for n in names), 30, f"the worker to run {shown(sent)}")
        fleet.stop(worker)
        ran = executions(broker)
        no_duplicates([(r["entry"], r["due"]) for r in ran])
        for name in names:
            assert len(sent[name]) == 2, (name, shown(first), shown(sent))
            assert sent[name][1] >= enabled_at, (name, iso(enabled_at), shown(sent))
            assert not PeriodicTask.objects.get(name=name).enabled, name
