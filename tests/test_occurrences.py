"""Exact due instants: the same on every beat, Celery's crontab arithmetic, DST."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.schedules import BaseSchedule, crontab, schedule, solar

from beat_claims.occurrences import (
    DueWindow,
    UnsupportedSchedule,
    due_between,
    next_after,
)
from beat_claims.runs import iso, to_ms
from beat_claims.schedule_words import describe


def make_app(tz: str) -> Celery:
    app = Celery("occ", set_as_current=False)
    app.conf.timezone = tz
    return app


@pytest.fixture
def app() -> Celery:
    return make_app("America/New_York")


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
    window = due_between(every, anchor, anchor, anchor + 86_400_000, keep=3)
    assert window == DueWindow(
        [anchor + 86_398_000, anchor + 86_399_000, anchor + 86_400_000], 86_400, True)
    assert window.last == anchor + 86_400_000
    assert due_between(every, anchor, anchor + 5_000, anchor + 5_999, 10) == DueWindow(
        [], 0, True)
    assert due_between(every, anchor, anchor, anchor + 10_000, 0) == DueWindow([], 10, True)


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
        # Celery's beat hands the schedule "now" in the app's timezone (app.now()).
        local = now.astimezone(app.timezone)
        celery = crontab(minute="*/7", hour="3-5,22", day_of_week="mon-fri", app=app,
                         nowfun=lambda local=local: local)
        theirs = t + int(celery.remaining_estimate(local).total_seconds() * 1000)
        assert mine == theirs
        t = mine


def test_crontab_sends_every_minute_it_names_when_the_utc_date_differs(app: Celery) -> None:
    """Celery before 5.7 compared the day of "now" with the last run's: with "now" in UTC
    and the last run in the app's zone, the hour after midnight in Paris ran once."""
    paris = make_app("Europe/Paris")
    for cron in (crontab(minute="*/20", hour="0", app=paris),
                 tz_crontab(app, "Europe/Paris", minute="*/20", hour="0")):
        assert walk(cron, 0, utc(2026, 3, 28, 12), 6) == [
            "2026-03-28T23:00:00.000Z", "2026-03-28T23:20:00.000Z",
            "2026-03-28T23:40:00.000Z", "2026-03-29T22:00:00.000Z",
            "2026-03-29T22:20:00.000Z", "2026-03-29T22:40:00.000Z"], cron


def test_a_beat_schedule_crontab_keeps_its_apps_timezone_whatever_app_is_current(
        app: Celery) -> None:
    """Celery gives a ``beat_schedule`` crontab its app after building it; a copy of it
    (each step here works on one) must not fall back to the current app's timezone."""
    cron = crontab(minute="0", hour="9")
    cron.app = app  # New York's, as ScheduleEntry does; the current app's is UTC
    assert walk(cron, 0, utc(2026, 6, 1), 2) == [
        "2026-06-01T13:00:00.000Z", "2026-06-02T13:00:00.000Z"]


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
    assert due_between(once, at + 60_000, at - 1, at + 120_000, keep=5) == DueWindow(
        [at], 1, True)
    assert due_between(once, 0, at - 1, at - 1, keep=5) == DueWindow([], 0, True)  # not yet
    # Handed out already:
    assert due_between(once, 0, at, at + 120_000, keep=5) == DueWindow([], 0, True)
    assert due_between(once, 0, at - 1, at, keep=0) == DueWindow([], 1, True)
    assert due_between(once, 0, at - 1, at, keep=0).last is None
    assert describe(once) == "once at 2026-05-01 12:00:00.250 UTC"


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
        # django-celery-beat's clock reads the crontab's own timezone (its nowfunc).
        before = datetime.fromtimestamp((mine - 1) / 1000, tz=probe.tz)
        at = datetime.fromtimestamp(mine / 1000, tz=probe.tz)
        probe.nowfun = lambda before=before: before  # type: ignore[attr-defined]
        assert not probe.is_due(last)[0]
        probe.nowfun = lambda at=at: at  # type: ignore[attr-defined]
        assert probe.is_due(last)[0]
        t = mine


def test_a_crontab_is_said_in_its_own_timezone_or_its_apps(app: Celery) -> None:
    cron = tz_crontab(app, "Europe/Paris", minute="0", hour="2")
    assert describe(cron) == "at 02:00 Europe/Paris"
    assert describe(crontab(minute=0, hour=2, app=app)) == "at 02:00 America/New_York"


# -- long gaps: the newest due instants without walking the whole gap (hole 8) -----------

MINUTE = 60_000


@pytest.fixture
def estimates(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts calls of Celery's own crontab arithmetic (the real cost of a walk)."""
    calls = [0]
    real = crontab.remaining_estimate

    def counted(self: crontab, last_run_at: datetime) -> timedelta:
        calls[0] += 1
        return real(self, last_run_at)

    monkeypatch.setattr(crontab, "remaining_estimate", counted)
    yield calls


def forward_walk(sched: object, after: int, until: int) -> list[int]:
    """Every occurrence in ``(after, until]``, one after the other, as the old code did."""
    out, t = [], after
    while True:
        nxt = next_after(sched, 0, t)
        assert nxt is not None
        if nxt > until:
            return out
        out.append(nxt)
        t = nxt


def assert_agrees_with_forward_walk(window: DueWindow, walked: list[int], keep: int) -> None:
    assert window.newest == (walked[-keep:] if keep else [])
    if window.exact:
        assert window.total == len(walked)
    else:  # stopped early only because enough were found; the count is a true lower bound
        assert len(walked) >= max(keep, 1)
        assert len(window.newest) <= window.total <= len(walked)


@pytest.mark.parametrize("keep", [1, 10, 101])
def test_a_year_long_gap_of_an_every_minute_crontab_is_bridged_quickly(
        app: Celery, estimates: list[int], keep: int) -> None:
    every_minute = crontab(app=app)
    after, until = utc(2025, 6, 1), utc(2026, 6, 1, 12, 34, 56) + 789
    window = due_between(every_minute, 0, after, until, keep)
    last = utc(2026, 6, 1, 12, 34)
    assert window.newest == [last - (keep - 1 - i) * MINUTE for i in range(keep)]
    assert window.last == last  # the checkpoint lands on the newest, not 200,000 minutes in
    assert window.exact is False  # 525,600 are due; counting them is what is not done
    assert window.total >= keep
    # The old walk asked Celery 200,000 times (and stopped short); this asks a few per kept.
    assert estimates[0] <= 3 * keep + 60


def test_ten_years_of_a_yearly_crontab_are_exact_because_the_window_reaches_after(
        app: Celery, estimates: list[int]) -> None:
    new_year = crontab(minute=0, hour=0, day_of_month=1, month_of_year=1, app=app)
    window = due_between(new_year, 0, utc(2016, 6, 1), utc(2026, 6, 1), keep=20)
    # Midnight in New York (EST, UTC-5) on each Jan 1 from 2017 to 2026.
    assert window == DueWindow([utc(year, 1, 1, 5) for year in range(2017, 2027)], 10, True)
    assert estimates[0] <= 60


def test_a_crontab_that_matches_on_feb_29_only_is_found_across_decades(
        app: Celery, estimates: list[int]) -> None:
    leap_noon = crontab(minute=0, hour=12, day_of_month=29, month_of_year=2, app=app)
    after, until = utc(2000, 1, 1), utc(2026, 6, 1)
    window = due_between(leap_noon, 0, after, until, keep=3)
    assert window.newest == [utc(2016, 2, 29, 17), utc(2020, 2, 29, 17), utc(2024, 2, 29, 17)]
    assert window.exact is False and window.total >= 3
    assert estimates[0] <= 60
    window = due_between(leap_noon, 0, after, until, keep=100)
    assert window == DueWindow([utc(y, 2, 29, 17) for y in range(2000, 2025, 4)], 7, True)
    nothing_kept = due_between(leap_noon, 0, after, until, keep=0)
    assert nothing_kept.newest == [] and nothing_kept.total >= 1 and not nothing_kept.exact
    assert estimates[0] <= 3 * 60


def test_keep_zero_still_says_whether_anything_is_due(app: Celery) -> None:
    daily = crontab(minute=30, hour=1, app=app)  # 01:30 EDT is 05:30Z
    after = utc(2026, 6, 1, 6)
    assert due_between(daily, 0, after, utc(2026, 6, 2, 5), 0) == DueWindow([], 0, True)
    window = due_between(daily, 0, after, utc(2026, 6, 2, 6), 0)
    assert window.newest == [] and window.total == 1 and window.last is None
    window = due_between(daily, 0, utc(2025, 6, 1, 6), utc(2026, 6, 2, 6), 0)  # a year
    assert window.newest == [] and window.total >= 1 and not window.exact


@pytest.mark.parametrize("keep", [10, 100])
def test_a_dense_stretch_behind_a_sparse_one_stays_cheap(
        app: Celery, estimates: list[int], keep: int) -> None:
    """Every minute on Mondays only, looked at on a Wednesday: the windows back from now
    are empty for two days, then one of them holds a whole Monday (1,440)."""
    mondays = crontab(day_of_week="mon", app=app)
    window = due_between(mondays, 0, utc(2025, 6, 1), utc(2026, 6, 3, 15), keep)
    last = utc(2026, 6, 2, 3, 59)  # Monday 23:59 EDT
    assert window.newest == [last - (keep - 1 - i) * MINUTE for i in range(keep)]
    assert not window.exact and window.total >= keep
    assert estimates[0] <= 3 * keep + 60


def test_a_schedule_denser_than_a_minute_is_bridged_too(app: Celery) -> None:
    """A custom schedule (Celery's BaseSchedule API) every five seconds, down for a day."""

    class EveryFiveSeconds(BaseSchedule):
        calls = 0

        def remaining_estimate(self, last_run_at: datetime) -> timedelta:
            EveryFiveSeconds.calls += 1
            ms = to_ms(last_run_at)
            return timedelta(milliseconds=(ms // 5_000 + 1) * 5_000 - ms)

    until = utc(2026, 6, 1, 12) + 2_345
    window = due_between(EveryFiveSeconds(app=app), 0, until - 86_400_000, until, keep=50)
    assert window.newest == [utc(2026, 6, 1, 12) - (49 - i) * 5_000 for i in range(50)]
    assert not window.exact and window.total >= 50
    assert EveryFiveSeconds.calls <= 3 * 50 + 60


def test_a_gap_across_a_dst_change_in_paris_matches_the_forward_walk(app: Celery) -> None:
    """Clocks jump 02:00 -> 03:00 on 2026-03-29: Celery lands that day's 02:30 at 03:30
    CEST (01:30Z), but asked from 03:10 it answers the next day. Windows that start in
    that half hour must still find it, as the forward walk does."""
    app.conf.timezone = "Europe/Paris"
    twice_a_night = crontab(minute=30, hour="0,2", app=app)
    change = utc(2026, 3, 29, 1)
    for minutes in range(0, 8 * 60, 7):
        until = change + minutes * MINUTE + 17
        for days in (2, 20):  # a short gap (exact) and a longer one
            after = until - days * 86_400_000
            walked = forward_walk(twice_a_night, after, until)
            for keep in (1, 3, 5):
                window = due_between(twice_a_night, 0, after, until, keep)
                assert_agrees_with_forward_walk(window, walked, keep)
    # And when the clocks go back (02:00-03:00 CEST then CET), in the app's timezone too.
    every_20 = crontab(minute="*/20", hour="1-3", app=app)
    back = utc(2026, 10, 25, 1)
    for minutes in range(-120, 240, 13):
        until = back + minutes * MINUTE
        walked = forward_walk(every_20, until - 86_400_000, until)
        for keep in (1, 4, 12):
            window = due_between(every_20, 0, until - 86_400_000, until, keep)
            assert_agrees_with_forward_walk(window, walked, keep)


@pytest.mark.parametrize("spec", [
    {"minute": "*/7", "hour": "3-5,22", "day_of_week": "mon-fri"},
    {"minute": "*/15"},
    {"minute": "0", "hour": "*/3"},
    {"minute": "30", "hour": "2"},  # skipped once a year in New York
    {"minute": "0", "hour": "0", "day_of_month": "1"},
])
def test_short_gaps_give_what_the_forward_walk_gives(app: Celery, spec: dict[str, str]) -> None:
    cron = crontab(app=app, **spec)
    rnd = random.Random(repr(sorted(spec.items())))
    for _ in range(15):
        until = rnd.choice([utc(2026, 3, 8, 7), utc(2026, 11, 1, 6), utc(2026, 6, 1)])
        until += rnd.randint(-6 * 3_600_000, 6 * 3_600_000)
        after = until - rnd.choice([3_600, 86_400, 3 * 86_400, 10 * 86_400]) * 1000
        walked = forward_walk(cron, after, until)
        for keep in (0, 1, 3, 20):
            assert_agrees_with_forward_walk(due_between(cron, 0, after, until, keep), walked,
                                            keep)


def test_a_schedule_that_never_moves_forward_is_reported_not_truncated(app: Celery) -> None:
    class Backwards(BaseSchedule):  # a custom schedule with a bug: always two days ago
        def remaining_estimate(self, last_run_at: datetime) -> timedelta:
            return timedelta(days=-2)

    with pytest.raises(UnsupportedSchedule, match="does not move forward"):
        due_between(Backwards(app=app), 0, utc(2025, 1, 1), utc(2026, 1, 1), keep=5)
