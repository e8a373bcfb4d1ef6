"""Exact due instants of an entry, the same on every beat.

An occurrence is (entry, due instant in UTC milliseconds). Every beat must compute the same
instants for the same entry, whatever its start time, so no instant here is derived from
"now": interval schedules count whole periods from an *anchor* kept in the store (the
first beat to see the entry sets it), and crontab and solar schedules use Celery's own
arithmetic, started from the anchor or from the last occurrence handed out (after a long
gap, searched back from now: see ``due_between``). A *clocked* schedule (one instant:
beat-claims' own, or django-celery-beat's) is absolute: its instant does not depend on the
anchor, and after it there is nothing.
"""

from __future__ import annotations

import copy
import hashlib
import sys
from dataclasses import dataclass
from datetime import timedelta, timezone
from typing import Any

from celery.schedules import BaseSchedule, crontab, schedule

from .runs import from_ms, iso, to_ms
from .schedules import clocked

#: The first window probed back from ``until`` when walking a non-interval schedule: a
#: crontab's resolution, so a dense schedule's first windows hold about one occurrence each.
_FIRST_WINDOW_MS = 60_000

#: How far after a UTC-offset change a window may start and still be walked from just
#: before the change: Celery lands a wall time the change skipped up to one shift later.
_DST_REACH_MS = 3 * 3600_000


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
    if ms > _MAX_PERIOD_MS:
        raise UnsupportedSchedule(f"interval {run_every!r} is longer than ten years")
    return ms


#: The longest interval: beyond it instants in ms lose precision in the stores' numbers.
_MAX_PERIOD_MS = 10 * 366 * 24 * 3600 * 1000


def _frozen_now(sched: BaseSchedule, at_ms: int, tz: Any = timezone.utc) -> BaseSchedule:
    """A copy of ``sched`` whose clock reads ``at_ms`` (in ``tz``): Celery's arithmetic,
    our instant."""
    frozen = _shallow_copy(sched)
    # A copy of Celery's crontab keeps the app only when it was given to the constructor;
    # a beat_schedule entry's gets its app afterwards: keep it, or the copy reads the
    # timezone of whatever app is current.
    frozen.app = sched.app
    instant = from_ms(at_ms).astimezone(tz)
    frozen.nowfun = lambda: instant
    return frozen


def _shallow_copy(sched: BaseSchedule) -> BaseSchedule:
    """A crontab's attributes in a new object of its class, its constructor not run:
    ``copy.copy`` of a crontab goes through its ``__reduce__``, which parses its five
    fields again (most of a beat's CPU at 100,000 one-minute crontabs). Its computations
    only read them."""
    attributes = getattr(sched, "__dict__", None)
    if attributes is None or not isinstance(sched, crontab):
        # (a solar's observer is set by each computation: a copy of its own, as before)
        return copy.copy(sched)
    frozen = object.__new__(type(sched))
    frozen.__dict__.update(attributes)
    return frozen


def _celery_next(sched: BaseSchedule, at_ms: int) -> int:
    """The instant Celery's arithmetic gives as the next one after ``at_ms``.

    Celery's beat hands schedules instants in the app's timezone; older Celery versions do
    crontab arithmetic in whatever timezone they are given, so the instant is given in the
    schedule's own. A crontab's next wall time is Celery's (``remaining_delta``), counted
    here in UTC: before 5.7, Celery compared the day of "now" with the last run's (so both
    are given in the schedule's timezone) and subtracted two wall times of one zone
    across a DST change as if no change were there.
    """
    tz = _tz(sched)
    local = from_ms(at_ms).astimezone(tz)
    if _own_arithmetic(sched):
        _, delta, _ = _frozen_now(sched, at_ms, tz).remaining_delta(local)
        return to_ms(local + delta)
    remaining = _frozen_now(sched, at_ms).remaining_estimate(local)
    return at_ms + round(remaining.total_seconds() * 1000)


def _own_arithmetic(sched: Any) -> bool:
    """A crontab computed by Celery's own arithmetic (a subclass that overrides
    ``remaining_estimate`` may depend on more than its fields and the instant asked)."""
    return isinstance(sched, crontab) and (
        type(sched).remaining_estimate is crontab.remaining_estimate)


def _tz(sched: BaseSchedule) -> Any:
    try:
        return sched.tz
    except Exception:
        return timezone.utc


def clocked_instant(sched: Any) -> int | None:
    """The instant of a one-time ``clocked`` schedule (beat-claims' own or
    django-celery-beat's); None for any other.

    django-celery-beat's is looked up without importing it: an instance implies its module
    is loaded.
    """
    if isinstance(sched, clocked):
        return sched.at_ms
    module = sys.modules.get("django_celery_beat.clockedschedule")
    if module is None or not isinstance(sched, module.clocked):
        return None
    when = sched.clocked_time
    if when.tzinfo is None:  # clocked() makes it aware; naive means UTC there as well
        when = when.replace(tzinfo=timezone.utc)
    return to_ms(when)


#: Before every instant: where an entry that never ran looks for a clocked schedule's one
#: instant (see :func:`looked_after`).
BEFORE_ANY = -1


def looked_after(sched: Any, anchor_ms: int, checkpoint_ms: int | None) -> int:
    """The instant after which an entry's next occurrences are looked for: its checkpoint,
    or, never claimed, its anchor (the instant the store first saw it).

    A clocked instant is absolute: one that passed before the store first saw the entry
    (created a moment after its time, or its time passed while no beat ran) is a missed
    occurrence, which the entry's catch-up policy judges (``latest``: it runs once, late,
    as django-celery-beat and RedBeat run it), never one that silently never was. Every
    reader of an entry's next instant (the beats, the due index's writers, ``status``,
    ``health``) asks this one function, so that they agree.
    """
    if checkpoint_ms is not None:
        return checkpoint_ms
    if clocked_instant(sched) is not None:
        return BEFORE_ANY
    return anchor_ms


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
    pure = _own_arithmetic(sched)
    if pure:
        known = _NEXT.get((id(sched), after_ms))
        if known is not None and known[0] is sched:
            return known[1]
    found = _next_of_calendar(sched, after_ms)
    if pure:
        if len(_NEXT) >= NEXT_KEPT:
            _NEXT.clear()
        _NEXT[(id(sched), after_ms)] = (sched, found)  # (holding it: its id is not reused)
    return found


#: Next instants of crontab schedules computed lately, by the schedule object and the
#: instant after which: a beat asks the same several times an occurrence (its plan, its
#: place on the heap, the due index), and entries that share a schedule object (built once
#: per spec) ask the same at the same checkpoint. A crontab's arithmetic depends on
#: nothing else (its clock is frozen at the instant asked).
_NEXT: dict[tuple[int, int], tuple[Any, int]] = {}
NEXT_KEPT = 8192


def _next_of_calendar(sched: Any, after_ms: int) -> int:
    probe = after_ms
    for _ in range(1440):
        nxt = _celery_next(sched, probe)
        if nxt > after_ms:
            return nxt
        # A wall-clock instant that repeats (DST ending) or a schedule that answers "now":
        # look again a minute later so the timeline only moves forward.
        probe = max(probe, nxt) + 60_000
    raise UnsupportedSchedule(f"{sched!r} does not move forward after {from_ms(after_ms)}")


@dataclass(frozen=True)
class DueWindow:
    """What is due in ``(after, until]``: the newest instants and how many there are.

    A long gap of a crontab is not walked from its start, so its size may be known only from
    below: ``total`` is then a lower bound (``exact`` False), never a silently short count.
    """

    newest: list[int]  # the newest ``keep`` due instants, ascending (all of them if fewer)
    total: int  # how many are due: exact when ``exact``, otherwise a lower bound
    exact: bool

    @property
    def last(self) -> int | None:
        """The newest due instant, where the caller's checkpoint moves to (None: nothing)."""
        return self.newest[-1] if self.newest else None


def due_between(
    sched: Any, anchor_ms: int, after_ms: int, until_ms: int, keep: int
) -> DueWindow:
    """Occurrences in ``(after_ms, until_ms]``: the newest ``keep`` of them and their count.

    Interval schedules are counted arithmetically, so a long outage costs nothing. A clocked
    schedule has at most one. Other schedules are searched back from ``until_ms`` (see
    ``_Search``), so a year-long gap of an every-minute crontab costs ``keep`` to about
    ``2 * keep`` steps of Celery's arithmetic, not half a million (the old walk from
    ``after_ms`` stopped at 200,000 and handed out the wrong newest ones).
    """
    keep = max(keep, 0)
    instant = clocked_instant(sched)
    if instant is not None:
        if after_ms < instant <= until_ms:
            return DueWindow([instant] if keep > 0 else [], 1, True)
        return DueWindow([], 0, True)
    after_ms = max(after_ms, anchor_ms)
    if until_ms <= after_ms:
        return DueWindow([], 0, True)
    if is_interval(sched):
        period = period_ms(sched)
        k_lo = (after_ms - anchor_ms) // period + 1
        k_hi = (until_ms - anchor_ms) // period
        if k_hi < k_lo:
            return DueWindow([], 0, True)
        start = max(k_lo, k_hi - keep + 1)
        return DueWindow([anchor_ms + k * period for k in range(start, k_hi + 1)],
                         k_hi - k_lo + 1, True)
    return _Search(sched, anchor_ms, after_ms, until_ms, keep).run()


class _Search:
    """The newest occurrences before ``until`` of a schedule that only answers "what comes
    next after t", without walking the whole gap from ``after``.

    Windows grow back from ``until``, each twice the last (1, 2, 4... minutes), and each is
    walked forward from its start with at most the number still needed plus one step. Every
    occurrence a complete window yields is among the newest, so that costs at most ``need``
    steps plus one per window. A window that holds more than is still needed ("overflow": a
    dense stretch behind a sparse one) keeps what its walk saw as the fallback for the
    oldest ones needed, and the search goes on ("a level"), with small windows again, in
    the part of it not yet walked, at most two thirds of what was left. So the steps are
    at most ``need + levels * (need + 1 + 6 * windows)``, ``levels`` and ``windows`` (per
    level) both O(log(gap)); with a roughly even density there are one or two levels, and
    it comes to at most about ``2 * need + 2 * log2(gap / 1 minute)``. ``need`` is
    ``keep``, or 1 when ``keep`` is 0 (so that "is anything due" is still answered).
    """

    def __init__(self, sched: Any, anchor_ms: int, after_ms: int, until_ms: int,
                 keep: int) -> None:
        self.sched, self.anchor, self.after, self.until = sched, anchor_ms, after_ms, until_ms
        self.keep = keep
        self.need = max(keep, 1)
        self.steps = 0
        # The proven bound with room to spare: exceeding it is a bug, reported, not hidden.
        bits = (until_ms - after_ms).bit_length() + 2
        self.budget = 2 * (self.need + (2 * bits + 2) * (self.need + 2 * bits + 4))
        self.tz = _tz(sched)

    def _next(self, t: int) -> int | None:
        self.steps += 1
        if self.steps > self.budget:
            raise UnsupportedSchedule(
                f"{self.sched!r}: no answer for ({iso(self.after)}, {iso(self.until)}] "
                f"within {self.budget} steps (a schedule whose next occurrences disagree?)")
        return next_after(self.sched, self.anchor, t)

    def run(self) -> DueWindow:
        blocks: list[list[int]] = []  # complete windows' occurrences, newest window first
        fallback: list[int] = []  # what the last overflowing window's walk saw, ascending
        seen: set[int] = set()
        floor, inner, width = self.after, self.until, _FIRST_WINDOW_MS
        needed, exact = self.need, True
        while needed > 0 and inner > floor:
            lo = max(floor, inner - width)
            got: list[int] = []
            nxt = self._first_after(lo, floor)
            while nxt is not None and nxt <= inner:
                got.append(nxt)
                if len(got) > needed:
                    break
                nxt = self._next(nxt)
            seen.update(got)
            if len(got) <= needed:  # the window (lo, inner] is complete: all of it is newest
                blocks.append(got)
                needed -= len(got)
                inner, width = lo, width * 2
            else:  # overflow: the newest needed are in (got[0], inner]; go on above got[-1]
                exact = False
                fallback, floor = got, got[-1]
                spacing = (got[-1] - got[0]) // needed
                width = max(1, min(spacing, (inner - floor) // 4))
        if needed > 0 and fallback:
            blocks.append(fallback[-needed:])
        found = [t for block in reversed(blocks) for t in block]
        exact = exact and inner <= self.after
        return DueWindow(found[-self.keep:] if self.keep else [], len(seen), exact)

    def _first_after(self, lo: int, floor: int) -> int | None:
        """The first occurrence after ``lo`` as a walk from ``floor`` would find it.

        ``floor`` is ``after`` or an occurrence, so walking from it is the plain forward
        walk. An arbitrary ``lo`` just after a UTC-offset change can differ: Celery lands a
        skipped wall time (02:30 on the day clocks jump 02:00 -> 03:00) at 03:30, but asked
        from 03:10 it answers the next day. There, walk a few steps from before the change.
        """
        if lo > floor:
            change = self._offset_change(lo)
            if change is not None:
                nxt = self._next(max(floor, change - 1))
                for _ in range(4):
                    if nxt is None or nxt > lo:
                        return nxt
                    nxt = self._next(nxt)
        return self._next(lo)

    def _offset_change(self, at: int) -> int | None:
        """The first instant of the schedule's current UTC offset at ``at``, when that
        offset began less than ``_DST_REACH_MS`` before; None otherwise."""
        try:
            def offset(t: int) -> Any:
                return from_ms(t).astimezone(self.tz).utcoffset()

            now, early = offset(at), at - _DST_REACH_MS
            if offset(early) == now:
                return None
            lo, hi = early, at  # offset(lo) differs, offset(hi) is the current one
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if offset(mid) == now else (mid, hi)
            return hi
        except Exception:  # a timezone object that cannot say: walk from ``lo`` as asked
            return None


__all__ = [
    "BEFORE_ANY",
    "DueWindow",
    "UnsupportedSchedule",
    "clocked_instant",
    "due_between",
    "from_ms",
    "is_interval",
    "looked_after",
    "next_after",
    "period_ms",
    "to_ms",
]


def jitter_offset(entry: str, due_ms: int, jitter_s: float) -> int:
    """The fixed delay (ms, in ``[0, jitter)``) after ``due_ms`` at which the occurrence is
    sent: derived from the entry and the instant alone, so that every beat, before and
    after a restart, sends it at the same moment."""
    span = int(jitter_s * 1000)
    if span <= 0:
        return 0
    digest = hashlib.blake2b(f"{entry}\0{due_ms}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % span
