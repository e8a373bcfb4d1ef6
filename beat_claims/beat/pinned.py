"""Claims this beat holds whose entry's definition changed (or went) since they were made,
each with the entry it was claimed with: the claim is sent with that entry, whatever changed
since (one definition per occurrence). An entry that left the schedule is retired with its
last claim held here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..stores.base import Claim, RunRef
from .holdings import Holdings


class PinnedEntries(dict[RunRef, Any]):
    def __init__(self, holdings: Holdings, logger: logging.Logger, *,
                 schedule: Callable[[], dict[str, Any]]) -> None:
        super().__init__()
        self.holdings = holdings
        self.logger = logger
        self.schedule = schedule

    def pin(self, changed: set[str], old: dict[str, Any]) -> None:
        """The claims held of ``changed`` entries keep the entry they were made with
        (``old``: name -> entry before the change)."""
        held = [*self.holdings.held.values(), *self.holdings.checked]
        for claim in held:
            if claim.entry in changed and claim.entry in old and claim.ref not in self:
                self[claim.ref] = old[claim.entry]

    def prune(self) -> None:
        """Forget the pinned entries of claims no longer held (sent, given back, skipped);
        an entry that left the schedule is retired with its last one."""
        if not self:
            return
        schedule = self.schedule()
        checked = {claim.ref for claim in self.holdings.checked}
        for ref in [r for r in self if r not in self.holdings.held and r not in checked]:
            del self[ref]
            if ref.entry not in schedule and not any(r.entry == ref.entry for r in self):
                self.logger.info("beat-claims: entry %s: retired (its last claim held here"
                                 " is done)", ref.entry)

    def entry_for(self, claim: Claim) -> Any:
        """The entry a claim is sent with: the one it was claimed with."""
        pinned = self.get(claim.ref)
        if pinned is not None:
            return pinned
        entry = self.schedule().get(claim.entry)
        if entry is not None:
            return entry
        return next((e for r, e in self.items() if r.entry == claim.entry), None)

    def sendable(self) -> dict[str, Any]:
        """The entries whose claims this beat sends: the schedule's, and those of its
        pinned claims."""
        if not self:
            return self.schedule()
        return {**{ref.entry: entry for ref, entry in self.items()}, **self.schedule()}
