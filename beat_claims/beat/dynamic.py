"""The dynamic entries a beat holds while they fall due soon: taken into its schedule with
their state, policies and place on the heap, and taken out again once nothing of them is
held and they are not due within the look-ahead.

:class:`~beat_claims.beat.window.DynamicWindow` finds them (the due index); this object
puts what it found into the schedule, and takes it out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from celery import Celery

from ..runs import Owner
from ..settings import Policy, Settings
from ..stores.base import NOT_DUE, EntrySeed, EntryState, IndexWrite, RunRef, Store
from .claimer import Claimer
from .clock import StoreClock
from .composition import Composition
from .holdings import Holdings
from .policies import EntryPolicies
from .stored import PAGE, StoredEntries
from .window import LOOKAHEAD, DynamicWindow, Taken


class DynamicEntries:
    def __init__(self, app: Celery, store: Store, owner: Owner, settings: Settings,
                 window: DynamicWindow, stored: StoredEntries, composition: Composition,
                 claimer: Claimer, clock: StoreClock, holdings: Holdings,
                 policies: EntryPolicies, pinned: dict[RunRef, Any], *,
                 schedule: Callable[[], dict[str, Any]]) -> None:
        self.app = app
        self.store = store
        self.owner = owner
        self.settings = settings
        self.window = window
        self.stored = stored
        self.composition = composition
        self.claimer = claimer
        self.clock = clock
        self.holdings = holdings
        self.policies = policies  # (the scheduler's)
        self.pinned = pinned  # (the scheduler's: an entry pinned is busy)
        self.schedule = schedule
        self._let_go_at = 0.0
        self._take_up_after = ""  # (the last name a sweep's take-up looked at)

    def hold(self, taken: list[Taken], write_back: bool = False) -> set[str]:
        """Hold dynamic entries taken from the due index (or found apart from it) at the
        state read with them: composed, their policies read, put on the heap. With
        ``write_back`` (taken from the index), an entry not due within the look-ahead (its
        index was earlier than its truth: new, or written by a writer that did not compute
        it) has its real instant written back and is let go. The names now held."""
        if not taken:
            return set()
        names = {t.name for t in taken}
        self.window.held |= names  # (their definitions are followed from here on)
        self.stored.take([t.record for t in taken])
        built = self.composition.compose_some(names)
        passed = names - set(built)
        self.window.held -= passed
        self.stored.forget(passed)
        schedule = self.schedule()
        schedule.update(built)
        self.policies.read_some(set(built), schedule, self.pinned)
        self.claimer.adopt({t.name: t.state for t in taken if t.name in built})
        if not write_back:
            return set(built)
        limit = self.clock.now() + LOOKAHEAD
        writes: list[IndexWrite] = []
        later: list[str] = []
        for t in taken:
            if t.name in built:
                slot = self.claimer.slots.get(t.name)  # (what adopt put on the heap)
                if slot is not None:
                    at = slot
                else:  # NOT_DUE, or it cannot be computed (noted when it was pushed)
                    try:
                        at = self.claimer.next_at(t.name, t.state)
                    except Exception:
                        continue
                if at == NOT_DUE or at > limit:
                    later.append(t.name)
            else:
                known = self.stored.known.get(t.name)
                definition = known.definition if known is not None else None
                if definition is None or definition.enabled:
                    continue  # (not valid, or not buildable here: named once, in the log)
                at = NOT_DUE
            if at != t.next_due:
                writes.append(IndexWrite(t.name, t.state, t.record.version, at))
        if writes:
            self.store.index(writes)
        self.drop(later)
        return set(built) - set(later)

    def take_up(self, names: list[str]) -> list[str]:
        """Hold, to claim them, the dynamic entries among ``names`` (a run of each is due
        again: released, taken back, requested) this beat does not hold: the names held."""
        wanted = sorted(n for n in names if n not in self.schedule())
        if len(wanted) > PAGE:
            # A page a sweep, on from where the last one stopped: entries other beats left
            # due again (a fleet that is gone) must not hide the dynamic ones behind them.
            wanted = ([n for n in wanted if n > self._take_up_after] or wanted)[:PAGE]
            self._take_up_after = wanted[-1]
        if not wanted:
            return []
        found = [(r.name, EntryState(r.anchor, r.checkpoint, r.token))
                 for r in self.store.entries(wanted) if r.anchor is not None]
        return sorted(self.hold(self.window.take(found)))

    def repair(self, names: list[str]) -> None:
        """Register again the dynamic entries among ``names`` whose record in the store
        cannot be read (the due index answered them without one): the store repairs the
        record, and the next scan takes them (registered: this beat schedules them)."""
        self.window.unreadable.clear()
        taken = self.window.take((n, EntryState(0, None)) for n in names)
        for t in taken:
            self.claimer.note(t.name, "unreadable record", logging.ERROR,
                              "beat-claims: %s: its record in the store cannot be read;"
                              " repairing it (registered again)", t.name)
        if taken:
            self.store.register([EntrySeed(t.name) for t in taken], self.owner)

    def policies_of(self, names: list[str]) -> dict[str, Policy]:
        """The policies of those of ``names`` that are dynamic entries this beat does not
        hold, from their definitions (one read; a definition not valid is left out)."""
        wanted = [n for n in names if n not in self.policies.by_name][:PAGE]
        out: dict[str, Policy] = {}
        for taken in self.window.take((n, EntryState(0, None)) for n in wanted):
            known = self.stored.read(taken.record)
            if known.definition is not None:
                try:
                    out[taken.name] = self.settings.policy_for(
                        taken.name, dict(known.definition.claims) or None,
                        known.definition.schedule.celery(self.app))
                except Exception:  # (refused where it entered; named once when held)
                    continue
        return out

    def let_go(self) -> None:
        """Let go of the dynamic entries with nothing of them held that are not due within
        the look-ahead, or are another live beat's share and not due yet (its beat takes
        them in time; late, this one takes them again). Looked at every half second at
        most: the index brings them back."""
        if not self.window.held or time.monotonic() < self._let_go_at:
            return
        self._let_go_at = time.monotonic() + 0.5
        limit = self.clock.now() + LOOKAHEAD
        busy = ({ref.entry for ref in self.holdings.held}
                | {claim.entry for claim in self.holdings.checked}
                | {ref.entry for ref in self.pinned})
        slots = self.claimer.slots
        share, now = self.window.share, self.clock.now()
        schedule = self.schedule()
        self.drop([name for name in self.window.held if name not in busy and (
            name not in schedule or slots.get(name, NOT_DUE) == NOT_DUE
            or slots[name] > limit or (name not in share and slots[name] > now))])

    def drop(self, names: list[str]) -> None:
        """Take these entries out of the schedule, the policies and the heap."""
        if not names:
            return
        schedule = self.schedule()
        for name in names:
            schedule.pop(name, None)
            self.composition.chosen.pop(name, None)
            self.policies.by_name.pop(name, None)
        self.stored.forget(names)
        next_at = [at for name in names if (at := self.claimer.slots.get(name)) is not None]
        self.claimer.let_go(names)
        self.window.let_go(names, next_at)
