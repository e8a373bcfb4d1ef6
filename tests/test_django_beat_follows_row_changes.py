"""DatabaseScheduler follows each kind of change of django-celery-beat's tables by reading
what changed: a row saved, renamed, enabled or disabled by the admin's actions
(``update()`` and the marker), a schedule row edited in place, a row committed late with
an older ``date_changed``, a change made with ``update()`` alone (at the full comparison);
and a change of one row costs the work of that row, not of every row.

Schedulers are driven tick by tick in the test's own database transaction
(``tests/test_django_beat.py`` has the helpers and the real-process tests).
"""

from __future__ import annotations

import logging
import re
import sys
from datetime import timedelta
from typing import Any

import pytest

pytest.importorskip("django_celery_beat")

from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks

from beat_claims import occurrences
from beat_claims.contrib.django.database_scheduler import CHANGE_MARGIN, DatabaseScheduler

from .conftest import RedisServer
from .inprocess import run_for
from .processes import wait_for
from .test_django_beat import TASK, every, row, scheduler

pytestmark = pytest.mark.usefixtures("settled_store")

MODULE = sys.modules[DatabaseScheduler.__module__]


def period(s: DatabaseScheduler, name: str) -> float | None:
    entry = s.schedule.get(name)
    return None if entry is None else entry.schedule.run_every.total_seconds()


def applied(s: DatabaseScheduler, check: Any, what: str) -> None:
    """``check()`` within one check of the change marker (and a little)."""
    wait_for(check, s.max_interval + 1.0, what, interval=0.02, between=lambda: s.tick())


def read_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "database rows (" in r.getMessage()]


@pytest.mark.django_db
def test_a_saved_row_is_read_alone_and_applied(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    for i in range(200):
        row(f"row-{i}", interval=every(60))
    s = scheduler(server)
    with caplog.at_level(logging.INFO, logger="celery.beat.claims"):
        changed = PeriodicTask.objects.get(name="row-7")
        changed.interval = every(30)
        changed.save()
        applied(s, lambda: period(s, "row-7") == 30, "the new interval")
    lines = read_lines(caplog)
    assert len(lines) == 1 and re.fullmatch(
        r"beat-claims: database rows \(the change marker moved\): read 1 changed rows of 200"
        r" enabled, 0 gone; 1 entries changed \([\d.]+s\)", lines[0]), lines
    s.close()


@pytest.mark.django_db
def test_a_renamed_row_replaces_its_old_entry(server: RedisServer) -> None:
    old = row("old-name", interval=every(60))
    s = scheduler(server)
    old.name = "new-name"
    old.save()
    applied(s, lambda: "new-name" in s.schedule and "old-name" not in s.schedule,
            "the entry under its new name alone")
    run_for(0.3, s)
    assert "old-name" not in s.claimer.states and "new-name" in s.claimer.states
    s.close()


@pytest.mark.django_db
def test_the_admins_enable_and_disable_actions_are_applied_at_the_marker_move(
        server: RedisServer) -> None:
    """The list's "Disable/Enable selected tasks": ``update(enabled=...)`` (date_changed
    does not move), then the marker."""
    row("kept", interval=every(60))
    acted = row("acted-on", interval=every(60))
    s = scheduler(server)
    PeriodicTask.objects.filter(pk=acted.pk).update(enabled=False)
    PeriodicTasks.update_changed()
    applied(s, lambda: "acted-on" not in s.schedule, "the disabled row to go")
    PeriodicTask.objects.filter(pk=acted.pk).update(enabled=True)
    PeriodicTasks.update_changed()
    applied(s, lambda: "acted-on" in s.schedule, "the enabled row to come back")
    assert "kept" in s.schedule
    s.close()


@pytest.mark.django_db
def test_a_schedule_row_edited_in_place_changes_every_row_that_uses_it(
        server: RedisServer) -> None:
    shared = every(60)
    row("a", interval=shared)
    row("b", interval=shared)
    row("other", interval=every(60))
    s = scheduler(server)
    shared.every = 20
    shared.save()  # moves the marker; no PeriodicTask row's date_changed moves
    applied(s, lambda: period(s, "a") == 20 and period(s, "b") == 20, "the new interval")
    assert period(s, "other") == 60
    s.close()


@pytest.mark.django_db
def test_a_row_committed_late_with_an_older_date_is_read_within_the_margin(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """A row saved before another but committed after it (or by a host whose clock is
    behind) has an older date_changed than the newest seen: read if within CHANGE_MARGIN;
    older than that, at the full comparison."""
    late = row("late", interval=every(60))
    older = row("older", interval=every(60))
    newest = row("newest", interval=every(60))
    s = scheduler(server)
    newest.save()  # the newest date seen
    applied(s, lambda: s._newest == PeriodicTask.objects.get(pk=newest.pk).date_changed,
            "the newest date to be read")
    at = PeriodicTask.objects.get(pk=newest.pk).date_changed
    interval = IntervalSchedule.objects.create(every=15, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.filter(pk=late.pk).update(
        interval=interval, date_changed=at - CHANGE_MARGIN + timedelta(seconds=5))
    PeriodicTask.objects.filter(pk=older.pk).update(
        interval=interval, date_changed=at - CHANGE_MARGIN - timedelta(seconds=5))
    PeriodicTasks.update_changed()
    applied(s, lambda: period(s, "late") == 15, "the row committed late")
    run_for(s.max_interval + 0.2, s)
    assert period(s, "older") == 60  # outside the margin: not read at the marker's move
    with caplog.at_level(logging.INFO, logger="celery.beat.claims"):
        s._last_full_read = float("-inf")  # the full comparison is due
        applied(s, lambda: period(s, "older") == 15, "the full comparison")
    assert any("compared in full): read 1 changed rows" in line
               for line in read_lines(caplog)), read_lines(caplog)
    s.close()


@pytest.mark.django_db
def test_a_change_made_with_update_alone_is_applied_at_the_full_comparison(
        server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    quiet = row("quiet", interval=every(60))
    s = scheduler(server)
    PeriodicTask.objects.filter(pk=quiet.pk).update(args="[42]")  # no marker, no date
    run_for(s.max_interval + 0.2, s)
    assert s.schedule["quiet"].args == []
    monkeypatch.setattr(MODULE, "FULL_READ_EVERY", 0.0)
    applied(s, lambda: s.schedule["quiet"].args == [42], "the full comparison")
    s.close()


@pytest.mark.django_db
def test_a_change_of_one_row_costs_the_work_of_that_row_alone(
        server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Among 1,000 rows, one changed: one row built, a handful of next-occurrence
    computations (the whole schedule's policies and heap were rebuilt: two per row)."""
    hourly = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.HOURS)
    PeriodicTask.objects.bulk_create([PeriodicTask(name=f"bulk-{i:04d}", task=TASK,
                                                   interval=hourly) for i in range(1000)])
    s = scheduler(server)
    run_for(0.2, s)
    built: list[str] = []
    computed: list[Any] = []
    build, next_after = MODULE.entry_from_row, occurrences.next_after

    def counting_build(r: Any, *args: Any, **kwargs: Any) -> Any:
        built.append(r.name)
        return build(r, *args, **kwargs)

    def counting_next(*args: Any, **kwargs: Any) -> Any:
        computed.append(args[0])
        return next_after(*args, **kwargs)

    monkeypatch.setattr(MODULE, "entry_from_row", counting_build)
    monkeypatch.setattr(occurrences, "next_after", counting_next)
    changed = PeriodicTask.objects.get(name="bulk-0500")
    changed.interval = every(30)
    changed.save()
    applied(s, lambda: period(s, "bulk-0500") == 30, "the new interval")
    run_for(0.3, s)  # the claimer takes the change in
    assert built == ["bulk-0500"]
    assert len(computed) <= 10, len(computed)
    s.close()
