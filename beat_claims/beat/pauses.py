"""The pauses this beat knows, kept in line with the store's records: checked in turn at
each heartbeat (a resume is not undone, a later pause replaces the one known), and put back
when the store lost them (it went back).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..runs import Owner, iso
from ..stores.base import Store
from .knowledge import Knowledge

#: Pauses this beat knows checked against the store's records per heartbeat (one read, in
#: turn): what it knows of each stays current, so that a resume is not undone and a later
#: pause is restored if the store loses writes.
PAUSE_CHECKS = 100


class KnownPauses:
    def __init__(self, store: Store, owner: Owner, knowledge: Knowledge,
                 logger: logging.Logger, *, schedule: Callable[[], dict[str, Any]]) -> None:
        self.store = store
        self.owner = owner
        self.knowledge = knowledge
        self.logger = logger
        self.schedule = schedule

    def check_in_turn(self) -> None:
        """The next of the pauses this beat knows (a heartbeat's share of them)."""
        self.check(self.knowledge.pauses_to_check(PAUSE_CHECKS))

    def check_stale(self) -> None:
        """Those an occurrence was skipped for lately (a skip for a pause: maybe a later
        one)."""
        if self.knowledge.pauses_stale:
            self.check(self.knowledge.pauses_to_check(PAUSE_CHECKS, stale_only=True))

    def check(self, names: list[str]) -> None:
        """Bring what this beat knows of these entries' pauses up to date with the store's
        records (Knowledge.check_pause): forgotten once the store shows a resume at or after
        it, replaced by a later pause. Called only while the store's epoch is the one this
        beat knows and the store is not settling; a store that went back unnoticed shows
        older state, which is never taken in."""
        if not names:
            return
        records = {record.name: record for record in self.store.entries(names)}
        for name in names:
            known = self.knowledge.paused.get(name)
            change = self.knowledge.check_pause(name, records.get(name))
            if change is not None and known is not None:
                self.logger.debug("beat-claims: %s: the pause this beat knew (by %s at %s)"
                                  " was %s in the store", name, known.by, iso(known.at),
                                  change)

    def restore(self) -> None:
        """Pause again, while the store settles (nobody claims), the entries this beat last
        saw paused (its own, and the dynamic ones it let go lately) whose pause the store
        lost: unless it holds a pause, or a resume at or
        after the one this beat knew. Logged, never silent; the pause's ``at`` is the
        restore's instant, its note says what happened."""
        schedule = self.schedule()
        known = sorted(n for n in self.knowledge.paused
                       if n in schedule or n in self.knowledge.let_go)
        if not known:
            return
        for record in self.store.entries(known):
            self.knowledge.check_pause(record.name, record)  # resumed since, or paused later
            pause = self.knowledge.paused.get(record.name)
            if pause is None or record.paused is not None:
                continue
            note = (f"{pause.note} " if pause.note else "") + (
                f"[restored by beat {self.owner}: the store lost this pause, made by"
                f" {pause.by} at {iso(pause.at)}]")
            restored = self.store.pause(record.name, pause.by, note[:1000])
            if restored is not None and restored.paused is not None:
                self.knowledge.paused[record.name] = restored.paused
                self.logger.warning("beat-claims: %s: the store lost its pause (by %s at %s:"
                                    " %r); paused again", record.name, pause.by,
                                    iso(pause.at), pause.note)
