"""A schedule in words, as the admin, ``celery claims`` and a beat's registration say it:
crontabs (every minute, a time of day in its timezone, steps, weekdays), intervals, solar
events and one-off instants; a crontab too irregular for a sentence keeps its fields."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.schedules import crontab, schedule, solar

from beat_claims.definitions import Clocked, Cron, Every, Solar
from beat_claims.runs import to_ms
from beat_claims.schedule_words import describe
from beat_claims.schedules import clocked, zoned_crontab


@pytest.fixture
def app() -> Celery:
    app = Celery("words", set_as_current=False)
    app.conf.timezone = "Europe/Paris"
    return app


@pytest.mark.parametrize(("fields", "words"), [
    ({}, "every minute"),
    ({"minute": "*/15"}, "every 15 min"),
    ({"minute": "*/7"}, "cron */7 * * * * (m h dom mon dow) Europe/Paris"),
    ({"minute": "0"}, "every hour at :00 Europe/Paris"),
    ({"minute": "0", "hour": "2"}, "at 02:00 Europe/Paris"),
    ({"minute": "30", "hour": "9,13,17"}, "at 09:30, 13:30 and 17:30 Europe/Paris"),
    ({"minute": "0", "hour": "9", "day_of_week": "mon-fri"},
     "at 09:00 on weekdays Europe/Paris"),
    ({"minute": "0", "hour": "10", "day_of_week": "sat,sun"},
     "at 10:00 on weekends Europe/Paris"),
    ({"minute": "0", "hour": "8", "day_of_week": "mon,thu"},
     "at 08:00 on Mon and Thu Europe/Paris"),
    ({"minute": "*/5", "hour": "9-17"}, "every 5 min from 09:00 to 17:55 Europe/Paris"),
    ({"minute": "5", "hour": "*/2"}, "every 2 hours at :05 Europe/Paris"),
    ({"minute": "0", "hour": "0", "day_of_month": "1"},
     "at 00:00 on day 1 of the month Europe/Paris"),
    ({"minute": "0", "hour": "6", "month_of_year": "1,7"}, "at 06:00 in Jan and Jul Europe/Paris"),
    ({"minute": "0", "hour": "0", "day_of_month": "1", "day_of_week": "1"},
     "cron 0 0 1 * 1 (m h dom mon dow) Europe/Paris"),
])
def test_a_crontab_in_words_at_its_apps_wall_times(app: Celery, fields: dict[str, str],
                                                   words: str) -> None:
    assert describe(crontab(**fields, app=app)) == words


def test_a_crontab_in_its_own_timezone_says_that_timezone(app: Celery) -> None:
    from zoneinfo import ZoneInfo

    from django_celery_beat.tzcrontab import TzAwareCrontab

    assert describe(zoned_crontab(minute="0", hour="2", timezone="America/New_York",
                                  app=app)) == "at 02:00 America/New_York"
    assert describe(TzAwareCrontab(minute="15", hour="4", tz=ZoneInfo("Asia/Kolkata"),
                                   app=app)) == "at 04:15 Asia/Kolkata"
    # Every minute is every minute wherever: no timezone to say.
    assert describe(zoned_crontab(timezone="Asia/Kolkata", app=app)) == "every minute"


@pytest.mark.parametrize(("every", "words"), [
    (timedelta(seconds=10), "every 10 s"), (timedelta(seconds=1), "every second"),
    (timedelta(seconds=60), "every minute"), (timedelta(seconds=90), "every 90 s"),
    (timedelta(minutes=5), "every 5 min"), (timedelta(hours=2), "every 2 h"),
    (timedelta(days=1), "every day"), (timedelta(milliseconds=500), "every 0.5 s"),
])
def test_an_interval_in_words(every: timedelta, words: str) -> None:
    assert describe(schedule(every)) == words


def test_solar_and_one_instant_in_words(app: Celery) -> None:
    assert describe(solar("sunset", 48.85, 2.35, app=app)) == "at sunset at 48.85°N 2.35°E"
    assert describe(solar("dawn_civil", -33.9, -70.6, app=app)) == \
        "at civil dawn at 33.9°S 70.6°W"
    at = to_ms(datetime(2026, 1, 31, 2, tzinfo=timezone.utc))
    assert describe(clocked(at)) == "once at 2026-01-31 02:00:00 UTC"
    assert describe(clocked(at + 250)) == "once at 2026-01-31 02:00:00.250 UTC"


def test_a_stored_definitions_schedule_in_the_same_words(app: Celery) -> None:
    """What ``celery claims entries`` and the admin's Definition say of a stored schedule:
    the words of the Celery schedule the beats build from it (solar without ephem)."""
    assert describe(Every(10), app) == "every 10 s"
    assert describe(Cron(minute="0", hour="2"), app) == "at 02:00 Europe/Paris"
    assert describe(Cron(minute="0", hour="2", timezone="UTC"), app) == "at 02:00 UTC"
    assert describe(Solar("sunrise", 52.5, 13.4)) == "at sunrise at 52.5°N 13.4°E"
    assert describe(Clocked(0)) == "once at 1970-01-01 00:00:00 UTC"


@pytest.mark.parametrize("every", [timedelta(0), timedelta(seconds=-5), timedelta(days=4000)])
def test_an_interval_no_beat_can_run_is_said_by_its_repr_not_raised(every: timedelta) -> None:
    """``celery claims status`` and the admin's pages describe every entry in the app's
    beat_schedule, one a beat refuses at start included: saying it must not fail the page."""
    assert describe(schedule(every)) == repr(schedule(every))
