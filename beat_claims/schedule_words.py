"""A schedule in words (``every minute``, ``at 02:00 Europe/Paris``, ``every 10 s``): what
a beat registers as an entry's description, and what ``celery claims status`` and the
admin show, so that an operator reads a schedule without decoding a ``repr``.

A crontab too irregular for a sentence keeps its five fields, on one line, with its
timezone; a schedule of an unknown kind, or one no beat can run (an interval not positive, or
longer than ten years), keeps its ``repr``: saying a schedule never fails what shows it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from celery import Celery
from celery.schedules import crontab, solar

from .definitions import Clocked, Cron, Every, Solar
from .occurrences import UnsupportedSchedule, clocked_instant, is_interval, period_ms
from .runs import from_ms

#: Units an interval is said in, largest first: (milliseconds, short name).
UNITS = ((86_400_000, "d"), (3_600_000, "h"), (60_000, "min"), (1000, "s"))
#: Whole units said by name when there is one of them (``every minute``).
ONE = {"d": "day", "h": "hour", "min": "minute", "s": "second"}
DAYS = ("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat")  # Celery's 0 is Sunday
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
#: The most times of day listed (``at 09:00, 13:00 and 17:00``) before the fields are shown.
MAX_TIMES = 4
#: Solar events, as Celery names them, in words.
EVENTS = {
    "dawn_astronomical": "astronomical dawn", "dawn_nautical": "nautical dawn",
    "dawn_civil": "civil dawn", "sunrise": "sunrise", "solar_noon": "solar noon",
    "sunset": "sunset", "dusk_civil": "civil dusk", "dusk_nautical": "nautical dusk",
    "dusk_astronomical": "astronomical dusk",
}


def describe(sched: Any, app: Celery | None = None) -> str:
    """``sched`` in words: a Celery schedule (beat-claims' or django-celery-beat's), or
    a stored definition's schedule (a crontab without a timezone of its own at ``app``'s
    wall times, the current app's by default)."""
    if isinstance(sched, Solar):  # (said without ephem, which Celery's solar needs)
        return _solar(sched.event, sched.latitude, sched.longitude)
    if isinstance(sched, (Every, Cron, Clocked)):
        sched = sched.celery(app)
    if is_interval(sched):
        try:
            return _interval(period_ms(sched))
        except UnsupportedSchedule:  # (one no beat runs: the page describing it still shows)
            return repr(sched)
    instant = clocked_instant(sched)
    if instant is not None:
        ms = f".{instant % 1000:03d}" if instant % 1000 else ""
        return f"once at {from_ms(instant):%Y-%m-%d %H:%M:%S}{ms} UTC"
    if isinstance(sched, crontab):
        return _crontab(sched)
    if isinstance(sched, solar):
        return _solar(sched.event, sched.lat, sched.lon)
    return repr(sched)


def _interval(ms: int) -> str:
    for size, unit in UNITS:
        if ms % size == 0:
            count = ms // size
            return f"every {ONE[unit]}" if count == 1 else f"every {count} {unit}"
    return f"every {ms / 1000:g} s"


def _crontab(sched: crontab) -> str:
    minutes, hours = sorted(sched.minute), sorted(sched.hour)
    zone = _zone(sched)
    days = _days(sched)
    if days is None:
        return _fields(sched, zone)
    every_hour = len(hours) == 24
    if every_hour and len(minutes) == 1:
        return _joined(f"every hour at :{minutes[0]:02d}", days, zone)
    step = _step(minutes, 60) if len(minutes) > 1 else None
    if step is not None:
        said = f"every {step} min" if step > 1 else "every minute"
        if every_hour:  # (steps that divide 15: the same minutes in every timezone in use)
            return _joined(said, days, zone if days or 15 % step else "")
        if hours == list(range(hours[0], hours[-1] + 1)):
            return _joined(f"{said} from {hours[0]:02d}:00 to {hours[-1]:02d}:{60 - step:02d}",
                           days, zone)
    if len(minutes) * len(hours) <= MAX_TIMES:
        times = [f"{h:02d}:{m:02d}" for h in hours for m in minutes]
        return _joined(f"at {_listed(times)}", days, zone)
    hour_step = _step(hours, 24)
    if hour_step is not None and len(minutes) == 1:
        return _joined(f"every {hour_step} hours at :{minutes[0]:02d}", days, zone)
    return _fields(sched, zone)


def _joined(time: str, days: str, zone: str) -> str:
    return " ".join(part for part in (time, days, zone) if part)


def _days(sched: crontab) -> str | None:
    """``on weekdays``, ``on Mon and Thu``, ``on day 1 of the month``, ``in Jan``: which
    days the crontab names ('' for every day); None when both the days of the month and
    of the week are restricted (said as fields: not a sentence one reads right)."""
    week, month_days, months = (sorted(sched.day_of_week), sorted(sched.day_of_month),
                                sorted(sched.month_of_year))
    parts = []
    if len(week) < 7 and len(month_days) < 31:
        return None
    if week == [1, 2, 3, 4, 5]:
        parts.append("on weekdays")
    elif week == [0, 6]:
        parts.append("on weekends")
    elif len(week) < 7:
        parts.append(f"on {_listed(DAYS[d] for d in week)}")
    if len(month_days) < 31:
        parts.append(f"on day{'s' if len(month_days) > 1 else ''}"
                     f" {_listed(str(d) for d in month_days)} of the month")
    if len(months) < 12:
        parts.append(f"in {_listed(MONTHS[m - 1] for m in months)}")
    return " ".join(parts)


def _step(values: list[int], size: int) -> int | None:
    """The step of ``values`` when they are 0, step, 2*step... up to ``size`` (None if
    they are not)."""
    if not values or values[0] != 0:
        return None
    step = values[1] - values[0] if len(values) > 1 else size
    return step if size % step == 0 and values == list(range(0, size, step)) else None


def _listed(items: Iterable[str]) -> str:
    shown = list(items)
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"


def _zone(sched: crontab) -> str:
    """The timezone of the crontab's wall times: its own (beat-claims' ``zoned_crontab``,
    django-celery-beat's) or its app's."""
    name = getattr(sched, "zone_name", None)
    if name:
        return str(name)
    try:
        zone = sched.tz
    except Exception:  # an app that cannot say: its fields are said all the same
        return ""
    return str(getattr(zone, "key", None) or getattr(zone, "zone", None) or zone)


def _fields(sched: crontab, zone: str) -> str:
    fields = " ".join(str(getattr(sched, f"_orig_{name}")) for name in (
        "minute", "hour", "day_of_month", "month_of_year", "day_of_week"))
    return f"cron {fields} (m h dom mon dow) {zone}".rstrip()


def _solar(event: str, lat: float, lon: float) -> str:
    said = EVENTS.get(event, str(event).replace("_", " "))
    return (f"at {said} at {abs(lat):g}°{'N' if lat >= 0 else 'S'}"
            f" {abs(lon):g}°{'E' if lon >= 0 else 'W'}")
