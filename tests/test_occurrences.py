"""Exact due instants: the same on every beat, Celery's crontab arithmetic, DST."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.schedules import crontab, schedule, solar

from beat_claims.occurrences import UnsupportedSchedule, describe, due_between, next_after
from beat_claims.runs import iso, to_ms


@pytest.fixture
def app() -> Celery:
    app = Celery("occ", set_as_current=False)
    app.conf.timezone = "America/New_York"
    return app


def utc(*args: int) -> int:
    return to_ms(datetime(*args, tzinfo=timezone.utc))


def walk(sched: object, anchor: int, start: int, n: int) -> list[str]:
    out, t = [], start
    for _ in range(n):
        t = next_after(sched, anchor, t)
        out.append(iso(t))
    return out


def test_interval_occurrences_do_not_depend_on_when_a_beat_looks(app: Celery) -> None:
    every = schedule(timedelta(seconds=7), app=app)
    anchor = utc(2026, 1, 1, 0, 0, 0) + 123
    # Two beats that started at different instants compute the same instants.
    seen_by_a = walk(every, anchor, anchor + 1_000, 5)
    seen_by_b = walk(every, anchor, anchor + 3_500, 5)
    assert seen_by_a == seen_by_b
    assert seen_by_a[0] == iso(anchor + 7_000)  # one period after the anchor, as Celery does


def test_interval_counts_missed_occurrences_arithmetically(app: Celery) -> None:
    every = schedule(timedelta(seconds=1), app=app)
    anchor = utc(2026, 1, 1)
    due, total = due_between(every, anchor, anchor, anchor + 86_400_000, keep=3)
    assert total == 86_400
    assert due == [anchor + 86_398_000, anchor + 86_399_000, anchor + 86_400_000]
    assert due_between(every, anchor, anchor + 5_000, anchor + 5_999, 10) == ([], 0)


def test_new_crontab_entry_fires_at_the_next_match_not_at_once(app: Celery) -> None:
    hourly = crontab(minute=0, app=app)
    anchor = utc(2026, 6, 1, 12, 0, 0)  # exactly on a match: the first is the next one
    assert next_after(hourly, anchor, anchor) == utc(2026, 6, 1, 13, 0, 0)
    assert next_after(hourly, anchor + 1, anchor + 1) == utc(2026, 6, 1, 13, 0, 0)


def test_crontab_matches_celerys_own_arithmetic(app: Celery) -> None:
    cron = crontab(minute="*/7", hour="3-5,22", day_of_week="mon-fri", app=app)
    t = utc(2026, 2, 27, 20, 0, 0)
    for _ in range(50):
        mine = next_after(cron, 0, t)
        now = datetime.fromtimestamp(t / 1000, tz=timezone.utc)
        celery = crontab(minute="*/7", hour="3-5,22", day_of_week="mon-fri", app=app,
                         nowfun=lambda now=now: now)
        # Celery's beat hands the schedule "now" in the app's timezone (app.now()).
        local = now.astimezone(celery.tz)
        theirs = t + int(celery.remaining_estimate(local).total_seconds() * 1000)
        assert mine == theirs
        t = mine


def test_crontab_across_dst_end_in_new_york(app: Celery) -> None:
    daily = crontab(hour=1, minute=30, app=app)
    got = walk(daily, 0, utc(2026, 10, 30, 12), 4)
    # 01:30 EDT (UTC-4) until Nov 1, then 01:30 EST (UTC-5): 25 hours apart once.
    assert got == ["2026-10-31T05:30:00.000Z", "2026-11-01T05:30:00.000Z",
                   "2026-11-02T06:30:00.000Z", "2026-11-03T06:30:00.000Z"]


def test_crontab_across_dst_start_in_new_york(app: Celery) -> None:
    daily = crontab(hour=2, minute=30, app=app)
    got = walk(daily, 0, utc(2026, 3, 6, 12), 4)
    # 02:30 does not exist on Mar 8: Celery's arithmetic lands on 03:30 EDT that day.
    assert got == ["2026-03-07T07:30:00.000Z", "2026-03-08T07:30:00.000Z",
                   "2026-03-09T06:30:00.000Z", "2026-03-10T06:30:00.000Z"]


def test_crontab_instants_only_move_forward_through_a_repeated_hour(app: Celery) -> None:
    half_hourly = crontab(minute="*/30", app=app)
    got = [to_ms(datetime.fromisoformat(x.replace("Z", "+00:00")))
           for x in walk(half_hourly, 0, utc(2026, 11, 1, 4), 8)]
    assert got == sorted(set(got))


def test_solar_schedule_gives_exact_increasing_instants(app: Celery) -> None:
    pytest.importorskip("ephem")
    sunrise = solar("sunrise", 40.7, -74.0, app=app)
    first = next_after(sunrise, 0, utc(2026, 6, 1))
    second = next_after(sunrise, 0, first)
    assert utc(2026, 6, 1, 9) < first < utc(2026, 6, 1, 10)  # ~05:25 EDT
    assert 23 * 3600_000 < second - first < 25 * 3600_000
    assert next_after(sunrise, 0, utc(2026, 6, 1)) == first  # deterministic


def test_unsupported_schedule_is_reported() -> None:
    with pytest.raises(UnsupportedSchedule):
        next_after(object(), 0, 0)


# -- django-celery-beat's schedules: one clocked instant, crontabs in their own timezone --

def tz_crontab(app: Celery, tz: str, **fields: str) -> object:
    from zoneinfo import ZoneInfo

    from django_celery_beat.tzcrontab import TzAwareCrontab

    return TzAwareCrontab(tz=ZoneInfo(tz), app=app, **fields)


def clocked_at(ms: int) -> object:
    from django_celery_beat.clockedschedule import clocked

    return clocked(datetime.fromtimestamp(ms / 1000, tz=timezone.utc))


def test_clocked_is_one_absolute_instant_whatever_the_anchor() -> None:
    at = utc(2026, 5, 1, 12, 0, 0) + 250
    once = clocked_at(at)
    # Before the anchor too: whether such an instant still runs is the scheduler's choice.
    assert next_after(once, at + 60_000, at - 1) == at
    assert next_after(once, 0, at) is None
    assert next_after(once, 0, at + 5) is None
    assert due_between(once, at + 60_000, at - 1, at + 120_000, keep=5) == ([at], 1)
    assert due_between(once, 0, at - 1, at - 1, keep=5) == ([], 0)  # not yet
    assert due_between(once, 0, at, at + 120_000, keep=5) == ([], 0)  # handed out already
    assert due_between(once, 0, at - 1, at, keep=0) == ([], 1)
    assert describe(once) == "once at 2026-05-01T12:00:00.250Z"


def test_clocked_naive_time_is_utc_as_in_django_celery_beat() -> None:
    from django_celery_beat.clockedschedule import clocked

    naive = clocked(datetime(2026, 5, 1, 12, 0, 0))
    assert next_after(naive, 0, 0) == utc(2026, 5, 1, 12, 0, 0)


def test_crontab_in_its_own_timezone_ignores_the_apps_across_dst_end(app: Celery) -> None:
    app.conf.timezone = "Asia/Tokyo"  # not the schedule's
    daily = tz_crontab(app, "America/New_York", hour="1", minute="30")
    got = walk(daily, 0, utc(2026, 10, 30, 12), 4)
    assert got == ["2026-10-31T05:30:00.000Z", "2026-11-01T05:30:00.000Z",
                   "2026-11-02T06:30:00.000Z", "2026-11-03T06:30:00.000Z"]


def test_crontab_in_its_own_timezone_across_dst_start(app: Celery) -> None:
    daily = tz_crontab(app, "Europe/Paris", hour="0,2", minute="30")
    got = walk(daily, 0, utc(2026, 3, 27, 12), 6)
    # 00:30 and 02:30 Paris; 02:30 does not exist on Mar 29 (clocks jump 02:00 -> 03:00):
    # Celery's arithmetic lands an hour later (03:30 CEST = 01:30Z); only forward.
    assert got == ["2026-03-27T23:30:00.000Z", "2026-03-28T01:30:00.000Z",
                   "2026-03-28T23:30:00.000Z", "2026-03-29T01:30:00.000Z",
                   "2026-03-29T22:30:00.000Z", "2026-03-30T00:30:00.000Z"]


def test_crontab_in_its_own_timezone_matches_django_celery_beats_is_due(app: Celery) -> None:
    """django-celery-beat asks ``is_due(last_run_at)``; the instant it would next run at is
    the one computed here, for each of many starting points."""
    cron = tz_crontab(app, "Australia/Lord_Howe", minute="*/20", hour="1-3")  # 30-min DST
    t = utc(2026, 4, 3, 10)
    for _ in range(40):
        mine = next_after(cron, 0, t)
        assert mine is not None
        last = datetime.fromtimestamp(t / 1000, tz=timezone.utc)
        probe = tz_crontab(app, "Australia/Lord_Howe", minute="*/20", hour="1-3")
        before = datetime.fromtimestamp((mine - 1) / 1000, tz=timezone.utc)
        at = datetime.fromtimestamp(mine / 1000, tz=timezone.utc)
        probe.nowfun = lambda before=before: before  # type: ignore[attr-defined]
        assert not probe.is_due(last)[0]
        probe.nowfun = lambda at=at: at  # type: ignore[attr-defined]
        assert probe.is_due(last)[0]
        t = mine


def test_describe_names_the_crontabs_own_timezone(app: Celery) -> None:
    cron = tz_crontab(app, "Europe/Paris", minute="0", hour="2")
    assert describe(cron) == "<crontab: 0 2 * * * (m/h/dM/MY/d) Europe/Paris>"
    assert describe(crontab(minute=0, hour=2, app=app)) == repr(crontab(minute=0, hour=2))
