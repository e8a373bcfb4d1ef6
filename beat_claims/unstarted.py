"""Runs sent and not started: what a fleet looks like whose workers record nothing.

A worker with ``beat_claims.install(app)`` records the start of each run it executes, in
the beats' store, as it takes the message. A run still ``sent`` long after it was sent (or
given back to the broker) was started by no such worker: nothing is wrong with the run
itself, and no beat can tell which of the causes it is (:data:`LIKELY_CAUSES`). With
``overlap: skip`` or ``buffer_one`` every later occurrence then waits for its
``run_timeout``. Found from the store's own records (:meth:`Store.open_runs`) by the beats
(a warning), ``claims status``, ``claims health`` and the exporter, with one bound:
``beat_claims_unstarted_after``.
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
#: Open runs read at once by a probe (status, health, the exporter).
LIMIT = 1000
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


def unstarted(runs: Iterable[OpenRun], cutoff: int) -> list[Unstarted]:
    """Per entry, its runs ``sent`` (no worker started them) whose last activity is before
    ``cutoff``, the entry whose oldest waited longest first."""
    found: dict[str, list[OpenRun]] = {}
    for run in runs:
        if run.state is RunState.SENT and run.since < cutoff:
            found.setdefault(run.entry, []).append(run)
    out = [Unstarted(entry, len(mine), min(r.due for r in mine), min(r.since for r in mine))
           for entry, mine in found.items()]
    return sorted(out, key=lambda u: (u.since, u.entry))


@dataclass(frozen=True)
class Found:
    entries: list[Unstarted]
    complete: bool  # False: the oldest LIMIT open runs were read, and there are more


def read(store: Store, now: int, after: float, limit: int = LIMIT) -> Found:
    """One read of the open runs whose last activity is more than ``after`` seconds old,
    oldest first, at most ``limit`` (``complete`` says whether that was all of them)."""
    cutoff = now - int(after * 1000)
    runs = store.open_runs(before=cutoff, limit=limit)
    return Found(unstarted(runs, cutoff), len(runs) < limit)


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


__all__ = ["LIKELY_CAUSES", "LIMIT", "REPEAT", "Found", "Said", "Unstarted", "read", "summary",
           "unstarted"]
