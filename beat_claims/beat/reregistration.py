"""Registering again what a beat knows when its store may have lost writes (a restart, a
failover, a wipe, an older copy put back): anchors, checkpoints, a token floor, the claims
it held as due runs, the runs it sent lately as sent, the pauses it knew. Nobody claims
until every live beat has had the time to do the same.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import schedule_words
from ..stores.base import EntrySeed, Store
from .claimer import REGISTER_CHUNK, Claimer
from .holdings import Holdings
from .knowledge import Knowledge
from .liveness import Liveness, StoreWentBack
from .pauses import KnownPauses
from .sweeper import IndexKeeper, Sweeper


class Reregistration:
    def __init__(self, store: Store, knowledge: Knowledge, holdings: Holdings,
                 claimer: Claimer, sweeper: Sweeper, index_keeper: IndexKeeper,
                 liveness: Liveness, pauses: KnownPauses, logger: logging.Logger) -> None:
        self.store = store
        self.knowledge = knowledge
        self.holdings = holdings
        self.claimer = claimer
        self.sweeper = sweeper
        self.index_keeper = index_keeper
        self.liveness = liveness
        self.pauses = pauses
        self.logger = logger
        #: Why the store may have lost writes, until what this beat knows is registered
        #: again (None: nothing to register).
        self.why: str | None = None
        self._epoch_begun = False  # (see StoreWentBack.epoch_begun)
        self._seeds: list[EntrySeed] | None = None
        self._aside: list[EntrySeed] = []

    def noticed(self, exc: StoreWentBack) -> None:
        """Kept until done: if registering again fails half way (the store went away
        again), it is started over at the next tick. A new epoch this beat must begin is
        not forgotten for one the store began (it may be an earlier one, put back)."""
        self._epoch_begun = exc.epoch_begun and (self.why is None or self._epoch_begun)
        self.why = str(exc)

    def run(self, schedule: dict[str, Any]) -> None:
        """Register again what this beat knows of ``schedule`` (and of the dynamic entries
        it let go lately). What to register is taken once: a failure half way starts over
        with the same."""
        why = self.why or "unknown"
        names = sorted(schedule)
        if self._seeds is None:
            held = list(self.holdings.held.values()) + list(self.holdings.checked)
            descriptions = {n: schedule_words.describe(schedule[n].schedule) for n in names}
            self._aside = self.knowledge.set_aside_seeds(set(descriptions))
            self._seeds = self.knowledge.seeds(descriptions, held)
            self.holdings.clear()
            self.claimer.reset()
            self.sweeper.store_went_back()
            self.index_keeper.store_went_back()
            self.logger.warning("beat-claims: the store may have lost writes (%s): registering"
                                " again what this beat knows of its %d entries (%d claim(s)"
                                " held, %d run(s) sent lately); no beat claims meanwhile",
                                why, len(names), len(held), len(self.knowledge.recent))
        # A beat that found it out from the data (not from the epoch) starts a new epoch:
        # every live beat then registers what it knows, and the store settles (for as
        # long as this beat is still registering: a large schedule takes a while).
        self.liveness.beat(resync=not self._epoch_begun)
        while self._seeds:
            chunk = self._seeds[:REGISTER_CHUNK]
            self.claimer.register([seed.name for seed in chunk], chunk)
            del self._seeds[:REGISTER_CHUNK]
            self.liveness.beat(settling=True)
        while self._aside:  # dynamic entries it let go (it sent their runs too)
            chunk = self._aside[:REGISTER_CHUNK]
            defined = {d.name for d in self.store.definitions([seed.name for seed in chunk])
                       if not d.deleted}
            if defined:
                self.store.register([seed for seed in chunk if seed.name in defined])
            del self._aside[:REGISTER_CHUNK]
            self.liveness.beat(settling=True)
        self.pauses.restore()
        self._seeds = None
        self.why = None
        self._epoch_begun = False
