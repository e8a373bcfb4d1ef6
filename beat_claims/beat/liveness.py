"""This beat's heartbeat, which owners are alive, and the store's epoch.

Liveness is renewed from the beat's own loop, never from a background thread: a beat
stuck in a blocked publish must look dead, so that its claims are taken back (and fencing
keeps it from sending them when it wakes).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from ..runs import Owner, iso, process_is_gone
from ..stores.base import (
    ChangeCursor,
    Changes,
    Continuity,
    Heartbeat,
    LiveQuery,
    LiveRuns,
    OwnerStatus,
    Store,
    Written,
    Wrote,
)
from .clock import StoreClock

#: How far the store's clock may be from this beat's reckoning of it at a heartbeat for the
#: answer of a sweep asked with that heartbeat to be used (half a round trip either way
#: of error in each reading, and some drift).
CLOCK_STEP_MS = 250
#: Once every beat it waited for has heartbeated, a joining beat heartbeats once more this
#: long after (at most half an interval) before it claims: a margin over the store's own
#: step, in which a running beat that found the store went back began a new epoch with
#: its renewal (where the store reads the owners and the epoch in two statements, or a
#: Redis Cluster reads the writes a round trip before).
JOIN_CONFIRM = 0.5


#: How long before it is due a heartbeat is taken by a tick that wakes for something else
#: (seconds): the due index's read follows the heartbeat's interval, a few ms behind.
EARLY = 0.05


#: Each of a beat's newest writes, as its log says it lost.
WROTE = {Wrote.CLAIM: "claim", Wrote.CHECK: "check before publish", Wrote.SENT: "sent mark"}


class StoreWentBack(Exception):
    """The store may have lost writes (a restart, a failover, a wipe, an older snapshot):
    what this beat knows must be registered again before anything is claimed.
    ``epoch_begun``: the store began a new epoch itself (a restart, a failover, a wipe,
    another beat that found it out), and settles: this beat only registers. Otherwise this
    beat found it out from the data, and begins one (every live beat registers)."""

    def __init__(self, why: str, epoch_begun: bool = False) -> None:
        super().__init__(why)
        self.epoch_begun = epoch_begun


class Liveness:
    def __init__(self, store: Store, owner: Owner, interval: float, clock: StoreClock,
                 written: Callable[[], Sequence[Written]] = tuple,
                 removed: Callable[[Sequence[Written]], None] = lambda items: None) -> None:
        self.store = store
        self.owner = owner
        self.interval = interval
        self.ttl = 3 * interval
        self.clock = clock
        #: This beat's newest writes, asked after at every heartbeat (Knowledge.written),
        #: and what to tell of those whose entry was removed since (Knowledge.removed).
        self.written = written
        self.removed = removed
        #: The writes the last heartbeat asked after that the store held (Written.key):
        #: asked after again, they are confirmed.
        self.confirmed: set[tuple[str, int, int, Wrote]] = set()
        self.join = Joining(owner.id, interval, self.ttl)
        self.last = float("-inf")  # monotonic instant of the last heartbeat
        #: When the last heartbeat that the store answered was asked (monotonic; lapse()
        #: leaves it), and whether the one before it was asked more than a TTL earlier.
        self.renewed = float("-inf")
        self.lapsed = False
        self.epoch: str | None = None
        #: The store's clock at the last heartbeat it answered (None: none yet).
        self.last_now: int | None = None
        self.store_id = ""  # stamped on messages: workers compare it with their store's
        self.settle_until: int | None = None
        self.owners: tuple[OwnerStatus, ...] = ()
        #: The sweep query the last heartbeat answered, and its answer (see take_swept).
        self.swept: tuple[LiveQuery, LiveRuns] | None = None
        #: The change feed's cursor the last heartbeat read from, and the page it answered
        #: (see take_changes).
        self.fed: tuple[ChangeCursor, Changes] | None = None
        #: When each live beat was first seen alive (monotonic): see :meth:`sharers`.
        self._seen: dict[str, float] = {}

    def due(self) -> bool:
        """A heartbeat is due once an interval has passed, or :data:`EARLY` before (a
        tenth of the interval at most): the tick at hand takes it (an idle beat wakes once
        an interval, not once for another timer due a moment before the heartbeat, and
        again for the heartbeat)."""
        early = min(EARLY, self.interval / 10)
        return time.monotonic() - self.last >= self.interval - early or self.join.beat_due()

    def beat(self, resync: bool = False, settling: bool = False,
             sweep: LiveQuery | None = None, changes: ChangeCursor | None = None) -> bool:
        """Renew the heartbeat and read the store's clock, owners and epoch (and with
        ``sweep``, that sweep's answer, with ``changes`` the change feed's page from that
        cursor, in the same round trip where the store can). True when the epoch changed
        since the last heartbeat (the store may have lost writes)."""
        self.swept = self.fed = None
        reckoned = self.clock.now()  # what the sweep's cutoffs were reckoned from
        asked = time.monotonic()
        # This beat's record, renewed less than a TTL ago, is forgotten by no store (a
        # stopped beat's lapses; it is forgotten an hour after): a store without it is a
        # copy taken before it started, whatever else it holds.
        renewed_since = asked - self.renewed
        # What the store must still show, judged in the heartbeat's own step: a store that
        # went back begins a new epoch there, with this beat's renewal (a beat joining
        # meanwhile never sees the renewal without it).
        continuity = None
        if self.epoch is not None and self.last_now is not None and not (resync or settling):
            continuity = Continuity(self.epoch, self.last_now, renewed_since <= self.ttl)
        # (A heartbeat that failed leaves them confirmed: the continuity the next one judges
        # is still that of the last one answered, whose copies it finds.)
        written = [dataclasses.replace(w, confirmed=True) if w.key in self.confirmed else w
                   for w in self.written()]
        hb = self.store.heartbeat(self.owner, self.ttl, resync=resync, settling=settling,
                                  sweep=sweep, written=written, changes=changes,
                                  continuity=continuity)
        self.confirmed = set()  # (until this heartbeat is judged: none if it went back)
        answered = time.monotonic()
        self._renewed(asked)
        # This beat's reckoning of the store's clock at the instant the store read it (the
        # middle of the round trip, as the clock takes it).
        expected = reckoned + int((answered - asked) * 500)
        self.clock.set(hb.now, asked, answered)
        self.last = answered
        changed = self.epoch is not None and hb.epoch != self.epoch
        # An epoch that began before this beat's last heartbeat, when the store showed
        # another: the store went back to an earlier one (a copy put back in place keeps
        # the epoch it was taken in), which settled long ago. It must settle again. (Taken
        # wrongly, for one begun by a call the store answered at about the same instant,
        # it costs one more epoch.)
        earlier = (changed and self.last_now is not None and hb.epoch_since is not None
                   and hb.epoch_since < self.last_now)
        last_now, self.last_now = self.last_now, hb.now
        self.epoch = hb.epoch
        self.store_id = hb.store_id
        self.settle_until = hb.settle_until
        self.owners = hb.owners
        # The store's clock stepped since the last heartbeat: cutoffs reckoned before it are
        # not this reading's (a new owner's claim could look old): the sweep asks again.
        in_step = abs(hb.now - expected) <= CLOCK_STEP_MS
        if sweep is not None and hb.live is not None and not changed and in_step:
            self.swept = (sweep, hb.live)
        if changes is not None and hb.changes is not None and not changed:
            self.fed = (changes, hb.changes)
        # (The store began a new epoch in the heartbeat's step when it went back: this
        # beat registers what it knows. Found here alone, this beat begins one.)
        begun = hb.went_back
        if earlier and not (resync or settling):
            raise StoreWentBack(
                f"the store's epoch went back to one that began at {iso(hb.epoch_since or 0)},"
                f" before this beat's last heartbeat at {iso(last_now or 0)}: it was put back"
                " from a copy of an earlier epoch", epoch_begun=begun)
        if hb.lost and not (resync or settling):
            lost = hb.lost[0]
            raise StoreWentBack(
                f"the store no longer holds what this beat wrote ({lost.entry} due"
                f" {iso(lost.due)}: its {WROTE[lost.kind]}, token {lost.token}): it was put"
                " back from an older copy", epoch_begun=begun)
        if not hb.owner_known and renewed_since <= self.ttl and not (resync or settling):
            raise StoreWentBack(
                f"the store no longer holds what this beat wrote (its heartbeat's record,"
                f" renewed {renewed_since:.1f}s before): it was put back from an older copy",
                epoch_begun=begun)
        if (continuity is not None and hb.last_beat is not None
                and hb.last_beat < continuity.seen_at):
            # (beat_at only moves forward, whatever the store's clock does)
            raise StoreWentBack(
                f"the store's last heartbeat of any beat is at {iso(hb.last_beat)}, before"
                f" this beat's own last heartbeat at {iso(continuity.seen_at)}: it went back"
                " (a copy taken before put back, or writes lost with a restart or a"
                " failover)", epoch_begun=begun)
        if begun:
            raise StoreWentBack(
                "the store's epoch went back to one that began before this beat's last"
                f" heartbeat at {iso(last_now or 0)}: it was put back from a copy of an"
                " earlier epoch", epoch_begun=True)
        if hb.removed:
            self.removed(hb.removed)
        not_held = {w.key for w in (*hb.lost, *hb.removed, *hb.unjudged)}
        self.confirmed = {w.key for w in written if w.key not in not_held}
        if not self.join.joined:
            self.join.step(hb, answered, owner_alive)
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

    def take_changes(self, cursor: ChangeCursor | None) -> Changes | None:
        """The change feed's page read from ``cursor`` with this tick's heartbeat, once (a
        page read a moment ago, in the same round trip: what reading it now would answer,
        but for a write in between, which the next read from its cursor answers). None:
        the caller reads it."""
        fed, self.fed = self.fed, None
        if fed is None or cursor is None or fed[0] != cursor:
            return None
        return fed[1]

    def keep_alive(self) -> None:
        """During a long burst of sends: keep looking alive, but only from this loop. A
        changed epoch stops the burst."""
        if time.monotonic() - self.last >= self.interval / 2:
            self.confirm()

    def confirm(self) -> None:
        """Heartbeat now, whenever the last one was: what the beat read since may be what a
        copy put back since shows, and it acts on it only once this heartbeat has checked
        the store still holds what it wrote and saw (StoreWentBack if not, or if the epoch
        changed)."""
        if self.beat():
            raise StoreWentBack("the store's epoch changed (a restart, a failover or a"
                                " wipe)", epoch_begun=True)

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
                         if o.owner.id == self.owner.id or owner_alive(o))

    def joining_for(self) -> float:
        """Seconds until this beat may claim its first occurrence (0 once it may)."""
        if self.join.joined:
            return 0.0
        return max(0.0, min(self.join.next_beat(), self.last + self.interval)
                   - time.monotonic())

    def beats_here(self) -> int:
        """Live beats on this host, this one included (they share its cores)."""
        live = self.live_ids()
        return max(1, sum(1 for o in self.owners
                          if o.owner.id in live and o.owner.host == self.owner.host))

    def peers(self) -> list[str]:
        """The live beats' ids in a stable order (to share a burst between them)."""
        return sorted(self.live_ids())

    def sharers(self) -> list[str]:
        """The live beats the due index is shared among, in a stable order: this one, and
        those seen alive for two heartbeat intervals at least. A beat that has just
        started is still joining (it claims nothing for about that long): its share would
        wait, late, for the others to help."""
        now = time.monotonic()
        live = self.live_ids()
        for gone in set(self._seen) - live:
            del self._seen[gone]
        for found in live:
            self._seen.setdefault(found, now)
        return sorted(i for i in live
                      if i == self.owner.id or now - self._seen[i] >= 2 * self.interval)


def owner_alive(status: OwnerStatus) -> bool:
    """Whether a beat is alive: its heartbeat has not lapsed, and on this host its process
    is still there (a beat killed here is known dead at once, not when its heartbeat
    lapses). The one judgement of liveness: the beats', ``claims status``'s, ``claims
    health``'s and the exporter's."""
    owner = status.owner
    return status.alive and process_is_gone(owner.host, owner.pid, owner.process) is not True


class Joining:
    """Whether a beat that just started may claim yet.

    A store put back from an older copy keeps its epoch and identity; the beats that were
    running find it out at their next heartbeat (the store no longer holds what they
    wrote), and the store begins a new epoch in that heartbeat's own step, in which
    everyone registers again what it knows. A beat that starts meanwhile knows nothing: it
    waits until every beat the store shows alive has heartbeated since its own first
    heartbeat, or lapsed (a beat late by less than its TTL, on a loaded host, is still
    alive and still to find out: it is waited for; a replacement for a beat killed on
    another host waits for its heartbeat to lapse, as its claims do; one on this host is
    known dead at once); when the store shows no heartbeat for longer than a TTL (its copy
    may be older than that: the running beats are not in it), it waits a TTL in any case.
    Then it heartbeats once more, and claims if that heartbeat shows no new epoch. On a
    new store, or one whose last heartbeat is recent with no other beat alive (a beat
    restarted), it joins at its first heartbeat.
    """

    def __init__(self, owner_id: str, interval: float, ttl: float) -> None:
        self.owner_id = owner_id
        self.interval = interval
        self.ttl = ttl
        self.joined = False
        self.began: float | None = None  # monotonic: the first heartbeat
        self.waiting_for: dict[str, int] = {}  # live beats at the first one: their expiry
        #: When each of them lapses if it does not heartbeat (monotonic, as the store's
        #: clock was read at this beat's first heartbeat): a heartbeat then finds it gone.
        self.lapses: dict[str, float] = {}
        self.until = 0.0  # monotonic: not joined before
        self.confirm_at: float | None = None

    def step(self, hb: Heartbeat, answered: float,
             alive: Callable[[OwnerStatus], bool]) -> None:
        statuses = {o.owner.id: o for o in hb.owners if o.owner.id != self.owner_id}
        if self.began is None:
            self.began = answered
            self.waiting_for = {i: o.expires_at for i, o in statuses.items() if alive(o)}
            self.lapses = {i: answered + max(0, expiry - hb.now) / 1000 + EARLY
                           for i, expiry in self.waiting_for.items()}
            stale = hb.last_beat is not None and hb.now - hb.last_beat > self.ttl * 1000
            self.until = answered + (self.ttl if stale else 0.0)
            if not self.waiting_for and not stale:
                self.joined = True
            return
        for owner_id, expiry in list(self.waiting_for.items()):
            status = statuses.get(owner_id)
            if status is None or not alive(status) or status.expires_at > expiry:
                del self.waiting_for[owner_id]  # it heartbeated since, or it is gone
                self.lapses.pop(owner_id, None)
            else:  # (reckoned again from this reading of the store's clock)
                self.lapses[owner_id] = answered + max(0, expiry - hb.now) / 1000 + EARLY
        if self.waiting_for or answered < self.until:
            return
        if self.confirm_at is None:
            self.confirm_at = answered + min(JOIN_CONFIRM, self.interval / 2)
        elif answered >= self.confirm_at:
            self.joined = True

    def next_beat(self) -> float:
        """When the next heartbeat helps this beat join (monotonic)."""
        if self.confirm_at is not None:
            return self.confirm_at
        began = self.began or 0.0
        if self.until > began:
            return self.until
        # Waiting for beats: a heartbeat an interval on finds those that heartbeat, one
        # just after the first lapse finds that one gone.
        return min(self.lapses.values(), default=float("inf"))

    def beat_due(self) -> bool:
        return not self.joined and self.began is not None and \
            time.monotonic() >= self.next_beat()
