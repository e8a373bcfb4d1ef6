"""The dynamic entries a beat holds for now: those the store's due index says fall due soon.

A dynamic entry (created at run time: origin API or REDBEAT) is scheduled by every beat,
but no beat holds them all, nor reads them all at start: each beat takes from the due
index (:meth:`Store.due`) the entries due within :data:`LOOKAHEAD` ms, a page at a time,
each with its state; reads their definitions (a bounded cache by name and version); and
holds them on its heap as it holds its own entries, claiming each occurrence by
compare-and-set on the state it read, as always. An entry whose next instant is further
out than the look-ahead, with nothing of it held, is let go; the index, written in the
claim's own atomic step, brings it back in time (the next scan is due by its next
instant, :meth:`DynamicWindow.let_go`). What a beat holds is bounded
(:data:`HELD_MAX`), whatever the store holds.

The index is a hint, never the truth (see :class:`~beat_claims.stores.base.DueEntry`): an
entry indexed earlier than its truth costs a read (it is taken, found not due, and its
real instant written back, conditional on the state and version it was computed from).
A pass reads forward from where the last one stopped (claims only move an entry forward);
a write of a definition, a registration or an operator may index an entry behind the
pass, so a pass starts again from the first entry every :attr:`DynamicWindow.restart_every`
seconds (the heartbeat interval) and whenever the change feed reported a change of an
entry this beat does not hold, once it has read up to the look-ahead: such an entry (and
one let go by a beat that died before it was due again) is found within one heartbeat
interval, and the time to read past what is due and not taken (another fleet's overdue
entries, a page of 1,000 a call).

Live beats share the index: each takes the entries of its own share (a hash of the name
among the live beats, :class:`Share`), and another's only once it is late by
:data:`HELP_AFTER` (its beat stopped, not yet known to be dead, or slow), and only while
nothing it holds itself is that late (a beat that falls behind would only race the other
for its claims). Two beats
holding the same entries would each plan every occurrence and one would lose each claim:
twice the work for the same sends. The share is a hint: a beat that holds an entry of
another's (their views of who is alive differ for a moment) loses or wins its claim by
compare-and-set, as always. An entry read already due (another's, or one a copy of the
store put back since the last heartbeat shows unclaimed at an occurrence another beat sent)
is claimed only after a heartbeat since it was read (the scheduler's tick): a store that
went back is found first.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..stores.base import NOT_DUE, DueEntry, EntryState, Store, StoredDefinition
from .composition import DYNAMIC
from .stored import PAGE

#: How far ahead of now (ms) entries are taken from the due index: an entry is held at
#: least LOOKAHEAD - SCAN_EVERY before its instant comes.
LOOKAHEAD = 2_000
#: How often (ms) a beat reads the index while entries fall due (every heartbeat interval,
#: if shorter): each scan takes what falls due in that much time, so that reading their
#: definitions never holds up the sends of a busy beat for long (at 1,000 a second, a
#: quarter of a second's entries a scan, not a second's).
SCAN_EVERY = 250
#: Pages of the due index one scan reads at most (the rest at the next tick).
PAGES_PER_SCAN = 20
#: Dynamic entries one beat holds at most; beyond it, the rest wait (logged: the beat
#: falls behind) until what it holds is sent and let go. About 4 KB an entry held: a
#: beat ready at 60 MiB stays under 100 MB whatever falls due at once.
HELD_MAX = 5_000
#: Definitions kept read, by name and version (the next time an entry falls due, its
#: definition is not read again unless it changed).
CACHED = 10_000
#: How late (ms) an entry of another live beat's share must be before this beat takes it:
#: found at the next pass from the first entry, at most a heartbeat interval later.
HELP_AFTER = 1_000


@dataclass(frozen=True)
class Share:
    """Which dynamic entries are this beat's to take: those whose name hashes to its rank
    among the live beats (``rank`` of ``beats``; all of them when it is alone, or not
    among them: not yet joined, or its heartbeat lapsed)."""

    rank: int = 0
    beats: int = 1

    @classmethod
    def among(cls, me: str, peers: list[str]) -> Share:
        if me not in peers or len(peers) < 2:
            return cls()
        return cls(peers.index(me), len(peers))

    def __contains__(self, name: str) -> bool:
        return (self.beats < 2
                or zlib.crc32(name.encode("utf-8", "surrogatepass")) % self.beats == self.rank)


@dataclass(frozen=True)
class Taken:
    """An entry taken from the due index: its state there, and its definition."""

    name: str
    state: EntryState
    next_due: int
    record: StoredDefinition


class DynamicWindow:
    """Which dynamic entries this beat holds, and the scan of the due index that finds
    them."""

    def __init__(self, store: Store, logger: logging.Logger, restart_every: float) -> None:
        self.store = store
        self.logger = logger
        self.restart_every = restart_every
        #: How often the index is read (ms): every SCAN_EVERY, or heartbeat interval.
        self.period = int(min(SCAN_EVERY, restart_every * 1000))
        #: The dynamic entries this beat holds now.
        self.held: set[str] = set()
        #: Whether ``name`` is one of this beat's own entries or already held (skipped).
        self.scheduled: Callable[[str], bool] = lambda name: name in self.held
        #: This beat's share of the index among the live beats (set at each heartbeat).
        self.share = Share()
        #: Whether something this beat holds is late by HELP_AFTER at ``now``: it takes
        #: no other beat's entry then.
        self.late_here: Callable[[int], bool] = lambda now: False
        self._cursor: tuple[int, str] | None = None
        self._pass_began = float("-inf")
        #: The pass under way has read up to the look-ahead (it may start over).
        self._reached = False
        self._restart_wanted = False
        self._cache: OrderedDict[tuple[str, int], StoredDefinition] = OrderedDict()
        self._behind = False
        self._next_scan = 0  # (store clock, UTC ms)
        #: Entries the index answered whose record cannot be read (or is gone): for the
        #: beat to repair (a registration), at most a page of them.
        self.unreadable: set[str] = set()

    @property
    def scan_for(self) -> float:
        """How long (s) a scan goes on to a new page: half a heartbeat interval."""
        return self.restart_every / 2

    def restart(self) -> None:
        """Read the index from its first entry again, at the next tick (once the pass
        under way has read up to the look-ahead: one cut short would never get past a
        long run of entries this beat does not take)."""
        self._restart_wanted = True
        self._next_scan = 0

    def let_go(self, names: Iterable[str], next_at: Iterable[int]) -> None:
        """This beat no longer holds ``names``; ``next_at``: their next instants (UTC ms,
        later than the look-ahead). A claim moved their index there, ahead of where the
        scan stopped but maybe before the entry :meth:`_after_pass` looked at: the next
        scan is due in time for the first of them."""
        self.held.difference_update(names)
        for at in next_at:
            if at != NOT_DUE:
                self._next_scan = min(self._next_scan, at - (LOOKAHEAD - SCAN_EVERY))

    def next_scan(self) -> int:
        """When the next scan is due (store clock, UTC ms)."""
        return self._next_scan

    def scan(self, now: int) -> list[Taken]:
        """The entries due by ``now`` + :data:`LOOKAHEAD` this beat does not hold yet whose
        definition is dynamic, read after the last scan's (one pass a heartbeat interval
        from the first), at most :data:`PAGES_PER_SCAN` pages and no new page once half a
        heartbeat interval went by (the beat's loop renews its heartbeat between two scans:
        a slow store does not make a long scan a lapse). The next scan is due once
        the next entry of the index comes within the look-ahead less :data:`SCAN_EVERY`
        (at the latest when the next pass begins; at the next tick when this one was cut
        short)."""
        if now < self._next_scan:
            return []  # (what falls due by then was read at the last scan)
        if self._reached and (self._restart_wanted or time.monotonic() - self._pass_began
                              >= self.restart_every):
            self._cursor = None
        if self._cursor is None:
            self._pass_began = time.monotonic()
            self._restart_wanted = self._reached = False
        before = now + LOOKAHEAD
        # Another beat's entries late by HELP_AFTER (at most: none while this one is late).
        others_from = now - HELP_AFTER if not self.late_here(now) else -1
        taken: list[Taken] = []
        room = HELD_MAX - len(self.held)
        self._next_scan = now  # (a pass cut short goes on at the next tick)
        began = time.monotonic()
        for pages in range(PAGES_PER_SCAN):
            if pages and time.monotonic() - began >= self.scan_for:
                # The rest at the next tick, after the loop's heartbeat; a pass cut short
                # is not started over before it reads up to the look-ahead again.
                self._reached = False
                break
            if len(taken) >= room:
                self._fall_behind()
                self._next_scan = now + self._retry_after_full()
                break
            ahead = self.store.due_ahead(before, PAGE, self._cursor)
            page = ahead.entries
            if page:
                last = page[-1]
                self._cursor = (last.next_due, last.name)
            found: list[DueEntry] = []
            for d in page:
                if self.scheduled(d.name) or (d.name not in self.share
                                              and d.next_due > others_from):
                    continue
                if d.state is not None:
                    found.append(d)
                elif len(self.unreadable) < PAGE:
                    self.unreadable.add(d.name)
            # Only dynamic entries count towards what this beat holds: other beats' own
            # entries (a stopped fleet's, overdue for good) are read past, not taken.
            taken += self.definitions(found)
            if len(page) < PAGE:
                self._reached = True
                if self._behind:
                    self._behind = False
                    self.logger.info("beat-claims: the due index is read up to now again")
                self._next_scan = self._after_pass(now, ahead.beyond)
                break
        else:
            self._reached = False  # (cut short by PAGES_PER_SCAN: as above)
        if len(taken) > room:  # (those left out are behind the cursor: read again)
            self._fall_behind()
            self._next_scan = now + self._retry_after_full()
        return taken[:max(0, room)]

    def _after_pass(self, now: int, beyond: int | None) -> int:
        """When to scan next, the index read up to the look-ahead: once the next entry it
        holds comes within the look-ahead less :data:`SCAN_EVERY` (an idle beat reads the
        index once a heartbeat interval, not four times a second), at least
        :attr:`period` from now, and at the latest when the next pass from the first entry
        begins. ``beyond``: the index's first instant after what the pass read (None:
        none)."""
        restart_at = now + max(0, int(
            (self._pass_began + self.restart_every - time.monotonic()) * 1000))
        at = beyond - (LOOKAHEAD - SCAN_EVERY) if beyond is not None else restart_at
        return max(now + self.period, min(at, restart_at))

    def _retry_after_full(self) -> int:
        """When a beat that holds all it may (HELD_MAX) reads the index again (ms from
        now): each read from the first entry reads pages and definitions to keep a few,
        so not at the quarter-second pace of a beat that keeps up: every half look-ahead,
        or heartbeat interval, as before SCAN_EVERY."""
        return int(min(LOOKAHEAD / 2, self.restart_every * 1000))

    def _fall_behind(self) -> None:
        if not self._behind:
            self._behind = True
            self.logger.warning("beat-claims: more dynamic entries may be due at once than"
                                " this beat holds (%d): the rest are taken as these are sent"
                                " (they may be late)", HELD_MAX)
        # (found again: the cursor goes back to the start at the next pass)
        self._cursor = None

    def take(self, entries: Iterable[tuple[str, EntryState]]) -> list[Taken]:
        """What :meth:`scan` answers, for entries found apart from the index (a run of
        theirs due again): those not held yet whose definition is dynamic."""
        return self.definitions([DueEntry(name, 0, state, -1) for name, state in entries
                                 if not self.scheduled(name)])

    def definitions(self, found: list[DueEntry]) -> list[Taken]:
        """``found`` with their definitions (read after their state: a change writes both
        at once), those that are dynamic and not deleted (and those that cannot be read:
        the beat names them in its log)."""
        missing = sorted({d.name for d in found if (d.name, d.version) not in self._cache})
        newest: dict[str, StoredDefinition] = {}
        for start in range(0, len(missing), PAGE):
            for read in self.store.definitions(missing[start:start + PAGE]):
                newest[read.name] = read
                self._remember(read)
        out: list[Taken] = []
        for d in found:
            assert d.state is not None
            record: StoredDefinition | None = newest.get(d.name) or self._cache.get(
                (d.name, d.version))
            if record is None or record.deleted or (
                    record.origin not in DYNAMIC and not record.corrupt):
                continue  # (a corrupt one is named in the log, once, by whoever holds it)
            self._cache.move_to_end((record.name, record.version))
            out.append(Taken(d.name, d.state, d.next_due, record))
        return out

    def _remember(self, record: StoredDefinition) -> None:
        self._cache[(record.name, record.version)] = record
        while len(self._cache) > CACHED:
            self._cache.popitem(last=False)
