"""Exact due instants of an entry, the same on every beat.

An occurrence is (entry, due instant in UTC milliseconds). Every beat must compute the same
instants for the same entry, whatever its start time, so no instant here is derived from
"now": interval schedules count whole periods from an *anchor* kept in the store (the
first beat to see the entry sets it), and crontab and solar schedules use Celery's own
arithmetic, started from the anchor or from the last occurrence handed out. A *clocked*
schedule (django-celery-beat's one instant) is absolute: its instant does not depend on the
anchor, and after it there is nothing.
"""

from __future__ import annotations

import copy
import sys
from collections import deque
from datetime import timedelta, timezone
from typing import Any

from celery.schedules import BaseSchedule, crontab, schedule

from .runs import from_ms, iso, to_ms

#: Guard against a schedule that never moves forward (a bug in a custom schedule class).
_MAX_STEPS = 200_000


class UnsupportedSchedule(ValueError):
    """The entry's schedule cannot be turned into exact instants."""


def is_interval(sched: Any) -> bool:
    return type(sched) is schedule or (
        isinstance(sched, schedule) and not isinstance(sched, crontab)
        and getattr(sched, "run_every", None) is not None
    )


def period_ms(sched: schedule) -> int:
    run_every: timedelta = sched.run_every
    ms = round(run_every.total_seconds() * 1000)
    if ms <= 0:
        raise UnsupportedSchedule(f"interval {run_every!r} is not positive")
    return ms


def _frozen_now(sched: BaseSchedule, at_ms: int) -> BaseSchedule:
    """A copy of ``sched`` whose clock reads ``at_ms``: Celery's arithmetic, our instant."""
    frozen = copy.copy(sched)
    instant = from_ms(at_ms)
    frozen.nowfun = lambda: instant
    return frozen


def _tz(sched: BaseSchedule) -> Any:
    try:
        return sched.tz
    except Exception:
        return timezone.utc


def clocked_instant(sched: Any) -> int | None:
    """The instant of django-celery-beat's one-time ``clocked`` schedule; None for any other.

    Looked up without importing django-celery-beat: an instance implies its module is loaded.
    """
    module = sys.modules.get("django_celery_beat.clockedschedule")
    if module is None or not isinstance(sched, module.clocked):
        return None
    when = sched.clocked_time
    if when.tzinfo is None:  # clocked() makes it aware; naive means UTC there as well
        when = when.replace(tzinfo=timezone.utc)
    return to_ms(when)


def next_after(sched: Any, anchor_ms: int, after_ms: int) -> int | None:
    """The first occurrence strictly after ``after_ms`` (and after the anchor), or None
    when there is none (a clocked instant that is not after ``after_ms``).

    A clocked instant is absolute, so the anchor does not hide it: whether an instant that
    passed before the store saw the entry still runs is the caller's choice (``after_ms``).
    """
    instant = clocked_instant(sched)
    if instant is not None:
        return instant if instant > after_ms else None
    after_ms = max(after_ms, anchor_ms)
    if is_interval(sched):
        period = period_ms(sched)
        k = (after_ms - anchor_ms) // period + 1
        return anchor_ms + k * period
    if not isinstance(sched, BaseSchedule) or not hasattr(sched, "remaining_estimate"):
        raise UnsupportedSchedule(f"{type(sched).__name__} has no remaining_estimate()")
    probe = after_ms
    for _ in range(1440):
        frozen = _frozen_now(sched, probe)
        # Celery's beat hands schedules instants in the app's timezone; older Celery
        # versions do crontab arithmetic in whatever timezone they are given.
        remaining = frozen.remaining_estimate(from_ms(probe).astimezone(_tz(sched)))
        nxt = probe + round(remaining.total_seconds() * 1000)
        if nxt > after_ms:
            return nxt
        # A wall-clock instant that repeats (DST ending) or a schedule that answers "now":
        # look again a minute later so the timeline only moves forward.
        probe = max(probe, nxt) + 60_000
    raise UnsupportedSchedule(f"{sched!r} does not move forward after {from_ms(after_ms)}")


def due_between(
    sched: Any, anchor_ms: int, after_ms: int, until_ms: int, keep: int
) -> tuple[list[int], int]:
    """Occurrences in ``(after_ms, until_ms]``: the newest ``keep`` of them and their count.

    Interval schedules are counted arithmetically, so a long outage costs nothing; other
    schedules are walked one occurrence at a time. A clocked schedule has at most one.
    """
    instant = clocked_instant(sched)
    if instant is not None:
        if after_ms < instant <= until_ms:
            return ([instant] if keep > 0 else []), 1
        return [], 0
    after_ms = max(after_ms, anchor_ms)
    if until_ms <= after_ms:
        return [], 0
    if is_interval(sched):
        period = period_ms(sched)
        k_lo = (after_ms - anchor_ms) // period + 1
        k_hi = (until_ms - anchor_ms) // period
        if k_hi < k_lo:
            return [], 0
        total = k_hi - k_lo + 1
        start = max(k_lo, k_hi - keep + 1)
        return [anchor_ms + k * period for k in range(start, k_hi + 1)], total
    newest: deque[int] = deque(maxlen=max(keep, 1))
    total = 0
    cursor = after_ms
    for _ in range(_MAX_STEPS):
        nxt = next_after(sched, anchor_ms, cursor)
        if nxt is None or nxt > until_ms:
            break
        cursor = nxt
        newest.append(cursor)
        total += 1
    return (list(newest) if keep > 0 else []), total


def describe(sched: Any) -> str:
    """A short human description for status output."""
    if is_interval(sched):
        return f"every {period_ms(sched) / 1000:g}s"
    instant = clocked_instant(sched)
    if instant is not None:
        return f"once at {iso(instant)}"
    if isinstance(sched, crontab) and "tz" in vars(sched):
        # A crontab with its own timezone (django-celery-beat's TzAwareCrontab): say which,
        # on one line (its repr spans several).
        fields = " ".join(str(getattr(sched, f"_orig_{name}")) for name in (
            "minute", "hour", "day_of_month", "month_of_year", "day_of_week"))
        return f"<crontab: {fields} (m/h/dM/MY/d) {sched.tz}>"
    return repr(sched)


__all__ = [
    "UnsupportedSchedule",
    "clocked_instant",
    "describe",
    "due_between",
    "from_ms",
    "is_interval",
    "next_after",
    "period_ms",
    "to_ms",
]
