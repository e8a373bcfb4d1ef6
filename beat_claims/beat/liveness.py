"""This beat's heartbeat, which owners are alive, and the store's epoch.

Liveness is renewed from the beat's own loop, never from a background thread: a beat
stuck in a blocked publish must look dead, so that its claims are taken back (and fencing
keeps it from sending them when it wakes).
"""

from __future__ import annotations

import time

from ..runs import Owner, process_is_gone
from ..stores.base import LiveQuery, LiveRuns, OwnerStatus, Store
from .clock import StoreClock

#: How far the store's clock may be from this beat's reckoning of it at a heartbeat for the
#: answer of a sweep asked with that heartbeat to be used (half a round trip either way
#: of error in each reading, and some drift).
CLOCK_STEP_MS = 250


class StoreWentBack(Exception):
    """The store may have lost writes (a restart, a failover, a wipe, an older snapshot):
    what this beat knows must be registered again before anything is claimed."""


class Liveness:
    def __init__(self, store: Store, owner: Owner, interval: float, clock: StoreClock) -> None:
        self.store = store
        self.owner = owner
        self.interval = interval
        self.ttl = 3 * interval
        self.clock = clock
        self.last = float("-inf")  # monotonic instant of the last heartbeat
        #: When the last heartbeat that the store answered was asked (monotonic; lapse()
        #: leaves it), and whether the one before it was asked more than a TTL earlier.
        self.renewed = float("-inf")
        self.lapsed = False
        self.epoch: str | None = None
        self.store_id = ""  # stamped on messages: workers compare it with their store's
        self.settle_until: int | None = None
        self.owners: tuple[OwnerStatus, ...] = ()
        #: The sweep query the last heartbeat answered, and its answer (see take_swept).
        self.swept: tuple[LiveQuery, LiveRuns] | None = None

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.interval

    def beat(self, resync: bool = False, settling: bool = False,
             sweep: LiveQuery | None = None) -> bool:
        """Renew the heartbeat and read the store's clock, owners and epoch (and with
        ``sweep``, that sweep's answer, in the same round trip). True when the epoch changed
        since the last heartbeat (the store may have lost writes)."""
        self.swept = None
        reckoned = self.clock.now()  # what the sweep's cutoffs were reckoned from
        asked = time.monotonic()
        hb = self.store.heartbeat(self.owner, self.ttl, resync=resync, settling=settling,
                                  sweep=sweep)
        answered = time.monotonic()
        self._renewed(asked)
        # This beat's reckoning of the store's clock at the instant the store read it (the
        # middle of the round trip, as the clock takes it).
        expected = reckoned + int((answered - asked) * 500)
        self.clock.set(hb.now, asked, answered)
        self.last = answered
        changed = self.epoch is not None and hb.epoch != self.epoch
        self.epoch = hb.epoch
        self.store_id = hb.store_id
        self.settle_until = hb.settle_until
        self.owners = hb.owners
        # The store's clock stepped since the last heartbeat: cutoffs reckoned before it are
        # not this reading's (a new owner's claim could look old): the sweep asks again.
        in_step = abs(hb.now - expected) <= CLOCK_STEP_MS
        if sweep is not None and hb.live is not None and not changed and in_step:
            self.swept = (sweep, hb.live)
        return changed and not resync

    def _renewed(self, asked: float) -> None:
        """A heartbeat asked at ``asked`` was answered. More than a TTL after the last one:
        this beat may have looked dead meanwhile (another beat's registration then drops it
        from the registrants of the entries it schedules: it registers them again)."""
        if self.renewed > float("-inf") and asked - self.renewed > self.ttl:
            self.lapsed = True
        self.renewed = asked

    def take_swept(self) -> LiveRuns | None:
        """The answer to the sweep query sent with this tick's heartbeat, once, while it
        holds: the query's cutoffs were reckoned from the store's clock before that
        heartbeat (used only if the reading agreed) and its live owners from the one
        before, so it is used only when every owner it took for alive still is (else a
        dead owner's claims would wait for one more sweep). Else None: the sweep asks the
        store itself."""
        swept, self.swept = self.swept, None
        if swept is None or time.monotonic() - self.last >= self.interval:
            return None
        query, found = swept
        return found if query.live_owners <= self.live_ids() else None

    def keep_alive(self) -> None:
        """During a long burst of sends: keep looking alive, but only from this loop. A
        changed epoch stops the burst."""
        if time.monotonic() - self.last >= self.interval / 2 and self.beat():
            raise StoreWentBack("the store's epoch changed during a burst of sends")

    def lapse(self) -> None:
        """Heartbeat again at the next chance (after an error, or a wake-up)."""
        self.last = float("-inf")

    def settling_for(self) -> float:
        """Seconds until the store has settled (0 when it has)."""
        if self.settle_until is None:
            return 0.0
        return max(0.0, (self.settle_until - self.clock.now()) / 1000)

    def live_ids(self) -> frozenset[str]:
        """Owners believed alive: their heartbeat has not lapsed, and on this host their
        process is still there."""
        return frozenset(o.owner.id for o in self.owners
                         if o.owner.id == self.owner.id or (o.alive and not _gone(o.owner)))

    def beats_here(self) -> int:
        """Live beats on this host, this one included (they share its cores)."""
        live = self.live_ids()
        return max(1, sum(1 for o in self.owners
                          if o.owner.id in live and o.owner.host == self.owner.host))

    def peers(self) -> list[str]:
        """The live beats' ids in a stable order (to share a burst between them)."""
        return sorted(self.live_ids())


def _gone(owner: Owner) -> bool:
    return process_is_gone(owner.host, owner.pid, owner.process) is True
