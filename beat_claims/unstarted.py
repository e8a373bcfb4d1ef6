"""Runs sent and not started: what a fleet looks like whose workers record nothing.

A worker with ``beat_claims.install(app)`` records the start of each run it executes, in
the beats' store, as it takes the message. A run still ``sent`` long after it was sent (or
given back to the broker) was started by no such worker: nothing is wrong with the run
itself, and no beat can tell which of the causes it is (:data:`LIKELY_CAUSES`). With
``overlap: skip`` or ``buffer_one`` every later occurrence then waits for its
``run_timeout``. Found from the store's own records (:meth:`Store.open_runs`) by the beats
(a warning), ``claims status``, ``claims health`` and the exporter, with one bound:
``beat_claims_unstarted_after``. Those three read every open run older than the bound, a
page of at most :data:`PAGE` runs a store call (long tasks started earlier fill the first
pages: an unstarted run behind them is found all the same), and keep a count per entry.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .enums import RunState
from .runs import iso
from .stores.base import OpenRun, Store

#: Why a run is sent and never started, as the beats' warning, status and health say it.
LIKELY_CAUSES = ("workers without beat_claims.install(app); workers on another store or"
                 " key prefix than the beats; no worker consumes the entry's queue; workers"
                 " down or busy")
#: Open runs read in one store call by a probe (status, health, the exporter): it reads
#: page after page, oldest first, until it has seen every open run older than the bound.
PAGE = 1000
#: A millisecond whose open runs fill a whole page (a large batch marked sent at once) is
#: read alone, up to this many pages' worth of runs in that call; a millisecond with more
#: is the one case a read is not complete (said).
INSTANT_PAGES = 10
#: A beat names an entry again after this long, if its runs still are not started (the
#: workers may have been fixed, and broken again, meanwhile).
REPEAT = 24 * 3600.0


@dataclass(frozen=True)
class Unstarted:
    """One entry's runs sent and not started since before a cutoff."""

    entry: str
    runs: int
    oldest_due: int  # UTC ms
    since: int  # when the oldest of them was sent, or given back to the broker (UTC ms)

    def as_dict(self, now: int) -> dict[str, Any]:
        return {"entry": self.entry, "runs": self.runs, "oldest_due": iso(self.oldest_due),
                "sent_at": iso(self.since), "seconds": round((now - self.since) / 1000, 1)}


class _Tally:
    """Per entry, how many of the runs counted are ``sent`` since before the cutoff, the
    oldest one's due instant and since when: what a read keeps (a count per entry, never
    the runs)."""

    def __init__(self, cutoff: int) -> None:
        self.cutoff = cutoff
        self.found: dict[str, Unstarted] = {}

    def count(self, runs: Iterable[OpenRun]) -> None:
        for run in runs:
            if run.state is not RunState.SENT or run.since >= self.cutoff:
                continue
            known = self.found.get(run.entry)
            self.found[run.entry] = Unstarted(run.entry, 1, run.due, run.since) \
                if known is None else Unstarted(run.entry, known.runs + 1,
                                                min(known.oldest_due, run.due),
                                                min(known.since, run.since))

    def entries(self) -> list[Unstarted]:
        """The entry whose oldest waited longest first."""
        return sorted(self.found.values(), key=lambda u: (u.since, u.entry))


def unstarted(runs: Iterable[OpenRun], cutoff: int) -> list[Unstarted]:
    """Per entry, its runs ``sent`` (no worker started them) whose last activity is before
    ``cutoff``, the entry whose oldest waited longest first."""
    tally = _Tally(cutoff)
    tally.count(runs)
    return tally.entries()


@dataclass(frozen=True)
class Found:
    entries: list[Unstarted]
    complete: bool  # False: a millisecond held more than INSTANT_PAGES pages of open runs


def read(store: Store, now: int, after: float, page: int | None = None) -> Found:
    """Every open run whose last activity is more than ``after`` seconds old, page after
    page, oldest first, at most ``page`` runs a store call (:data:`PAGE` by default): runs
    sharing the instant a page ends at are read again by the next, and counted once. A
    page that one instant fills is followed by a read of that instant alone (at most
    :data:`INSTANT_PAGES` pages' worth: ``complete`` is False when it held more)."""
    size = max(1, page or PAGE)
    cutoff = now - int(after * 1000)
    tally = _Tally(cutoff)
    complete = True
    cursor: int | None = None  # what is left to read is after it
    counted: set[tuple[str, int]] = set()  # the runs read at the instant just after it
    while True:
        runs = store.open_runs(before=cutoff, after=cursor, limit=size)
        if len(runs) == size and runs[0].since == runs[-1].since:
            instant = runs[0].since
            runs = store.open_runs(before=instant + 1, after=instant - 1,
                                   limit=INSTANT_PAGES * size)
            complete = complete and len(runs) < INSTANT_PAGES * size
            tally.count(r for r in runs if (r.entry, r.due) not in counted)
            cursor, counted = instant, set()
            continue
        tally.count(r for r in runs if (r.entry, r.due) not in counted)
        if len(runs) < size:
            return Found(tally.entries(), complete)
        last = runs[-1].since
        cursor = last - 1
        counted = {(r.entry, r.due) for r in runs if r.since == last}


def summary(entries: Sequence[str], after: float, shown: int = 10) -> str:
    """One line for people: which entries (names), and the likely causes."""
    names = ", ".join(entries[:shown])
    more = f" and {len(entries) - shown} more" if len(entries) > shown else ""
    return (f"runs sent and not started for more than {after:g} s: {names}{more}"
            f" (likely causes: {LIKELY_CAUSES})")


class Said:
    """The entries a beat has named in a warning: each once, and again after ``repeat``
    seconds. Bounded by the entries of the store."""

    def __init__(self, repeat: float = REPEAT) -> None:
        self.repeat = repeat
        self._at: dict[str, float] = {}

    def unsaid(self, entries: Iterable[str]) -> list[str]:
        """Of ``entries``, those not named within ``repeat`` (sorted)."""
        now = time.monotonic()
        self._at = {e: at for e, at in self._at.items() if now - at < self.repeat}
        return sorted(set(entries) - set(self._at))

    def said(self, entries: Iterable[str]) -> None:
        now = time.monotonic()
        self._at.update((entry, now) for entry in entries)


__all__ = ["INSTANT_PAGES", "LIKELY_CAUSES", "PAGE", "REPEAT", "Found", "Said", "Unstarted", "read",
           "summary", "unstarted"]
