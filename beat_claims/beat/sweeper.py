"""Taking back claims nobody will send, picking up runs that are due again, presuming
lost the runs whose outcome never came, and saying which entries have runs no worker
starts.

Everything here is found from the store's own records (:meth:`Store.live_runs`,
:meth:`Store.open_runs`), read at every sweep: a claim is taken back whoever forgot it —
its beat died between two writes, its reply was lost, it was released while this beat was
away — at the first sweep after its owner is gone or after it is older than the entry's
``reclaim_after`` (this beat's own forgotten claims after one heartbeat interval).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from .. import next_due
from ..definitions import DefinitionError, validate
from ..enums import Reason, RunState
from ..metrics import Metrics
from ..runs import Owner, iso
from ..settings import Policy, Settings
from ..stores.base import (
    EntryRecord,
    EntryState,
    IndexWrite,
    LiveQuery,
    OpenRun,
    Outcome,
    Reclaim,
    RunRef,
    Store,
    StoreConfigurationError,
    StoredDefinition,
    StoreError,
    rebuild_page,
)
from ..unstarted import Said, summary, unstarted
from .claimer import Claimer, EntrySource
from .clock import StoreClock
from .composition import DYNAMIC
from .holdings import Holdings
from .liveness import Liveness
from .stored import StoredEntries

#: Open runs looked at per sweep for a presumption of loss (the next ones at the next).
LOST_BATCH = 1000
#: Entries one sweep indexes at most in each of the due index's two looks (see
#: :class:`IndexKeeper`): one page of each a sweep.
INDEX_PAGE = 1000
#: Sweeps between two rebuild passes at least, once a pass had nothing to index (or as
#: many as it took pages, if more). An index wiped is rebuilt within that many sweeps
#: and a pass.
REBUILD_PAUSE = 30
#: Records a rebuild page that indexed nothing may read for each sweep before the next
#: page (a Redis store's pass reads every entry's record, 10,000 a page: 30 sweeps): as
#: many as a pass over 10,000 entries reads a sweep with its pause of REBUILD_PAUSE
#: sweeps, so that an idle beat reads as much a minute with 1,000,000 entries as with
#: 10,000. (Its pass read a page every sweep: at 1,000,000 the beat's idle CPU was 2.8x
#: that at 10,000, 0.0515 against 0.0184 s a minute, through the pass's 100 sweeps.)
REBUILD_READS = 333


def next_cursor(runs: list[OpenRun], limit: int) -> int | None:
    """Where the next page of open runs starts: None (from the oldest again) after a short
    page; else just before the last one read, so that runs sharing its instant (a batch
    marked sent in one millisecond) are not skipped, unless the whole page shares it."""
    if len(runs) < limit:
        return None
    if runs[0].since == runs[-1].since:
        return runs[-1].since
    return runs[-1].since - 1


class Sweeper:
    def __init__(self, store: Store, owner: Owner, settings: Settings, source: EntrySource,
                 holdings: Holdings, claimer: Claimer, liveness: Liveness, clock: StoreClock,
                 metrics: Metrics, logger: logging.Logger) -> None:
        self.store = store
        self.owner = owner
        self.settings = settings
        self.source = source
        self.holdings = holdings
        self.claimer = claimer
        self.liveness = liveness
        self.clock = clock
        self.metrics = metrics
        self.logger = logger
        self._lost_cursor: int | None = None
        self._lost_last = float("-inf")
        #: Open runs whose last activity is up to this instant were looked at for being
        #: sent and not started (None: none yet; the first look starts from the oldest).
        self._unstarted_seen: int | None = None
        self._unstarted_last = float("-inf")
        self._unstarted_said = Said()
        #: Policies of dynamic entries this beat does not hold, read for one sweep.
        self._others: dict[str, Policy] = {}

    @property
    def policies(self) -> dict[str, Policy]:
        return self.source.policies

    def _policy(self, entry: str) -> Policy:
        policy = self.policies.get(entry)
        if policy is None:
            policy = self._others.get(entry, self.settings.policy)
        return policy

    def _read_policies(self, entries: Iterable[str]) -> None:
        """The policies of ``entries`` this beat does not hold (dynamic ones: read from
        their definitions, for this sweep; the others have the default)."""
        names = sorted({e for e in entries if e not in self.policies})[:LOST_BATCH]
        self._others = self.source.policies_of(names) if names else {}

    def query(self) -> LiveQuery:
        """What a sweep asks the store now (also sent with a heartbeat, see sweep)."""
        now = self.clock.now()
        interval = int(self.settings.heartbeat_interval * 1000)
        shortest = self.source.policy_bounds.reclaim_after
        return LiveQuery(self.owner.id, self.liveness.live_ids(),
                         held_before=now - int(shortest * 1000), mine_before=now - interval,
                         dead_before=now - interval)

    def sweep(self, pick_up: bool = True) -> None:
        """Take back what nobody will send; with ``pick_up``, claim what is due again in
        this beat's entries; presume lost what never reported.

        What the sweep reads may have come with this tick's heartbeat (one round trip for
        an idle beat): only a cheaper way to the same records. Every take-back and claim
        below is a compare-and-set in the store, so an answer a few milliseconds old can
        only miss what the next sweep finds, never take or send anything twice."""
        now = self.clock.now()
        live = self.liveness.live_ids()
        found = self.liveness.take_swept()
        if found is None:
            found = self.store.live_runs(self.query())
        reclaims: list[Reclaim] = []
        why: dict[tuple[str, int], tuple[str, str]] = {}
        # Another live beat's claim of a dynamic entry this beat does not hold is judged by
        # that entry's own policy, read from its definition.
        self._read_policies([held.entry for held in found.held
                             if held.owner != self.owner.id and held.owner in live])
        for held in found.held:
            if held.owner == self.owner.id:
                if self.holdings.knows(RunRef(held.entry, held.due)):
                    continue
                reason = "this beat's own, whose reply it never had"
            elif held.owner not in live:
                reason = "its owner is gone"
            elif held.since <= now - int(self._policy(held.entry).reclaim_after * 1000):
                reason = "older than reclaim_after"
            else:
                continue
            reclaims.append(Reclaim(held.entry, held.due, held.token))
            why[(held.entry, held.due)] = (reason, held.owner)
        taken_back: set[str] = set()
        if reclaims:
            done: dict[tuple[str, str], list[str]] = defaultdict(list)
            for item, ok in zip(reclaims, self.store.reclaim(reclaims, self.owner.id)):
                if ok:
                    taken_back.add(item.entry)
                    done[why[(item.entry, item.due)]].append(item.entry)
            for (reason, owner), names in sorted(done.items()):
                self.logger.warning("beat-claims: took back %d claim(s) of owner %s (%s): %s",
                                    len(names), owner, reason,
                                    ", ".join(sorted(set(names))[:10]))
            self.metrics.count("taken_over", sum(len(n) for n in done.values()))
        due = {ref.entry for ref in found.due} | taken_back
        mine = [name for name in due if name in self.source.schedule]
        if pick_up and len(mine) < len(due):  # (dynamic entries not held: held now)
            mine += self.source.take_up(sorted(due - set(mine)))
        if mine and pick_up:
            self.claimer.take_due(mine)
        self._presume_lost(now)
        self._look_for_unstarted(now)

    def _presume_lost(self, now: int) -> None:
        """Runs sent or started with no outcome within their entry's ``run_timeout``
        become lost (they are not sent again: redelivery is the broker's business). Looked
        for at a tenth of the shortest run_timeout, at most every ten sweeps."""
        default = self.settings.policy.run_timeout
        shortest = self.source.policy_bounds.run_timeout
        if shortest is None:
            return
        interval = self.settings.heartbeat_interval
        every = max(interval, min(10 * interval, shortest / 10))
        if time.monotonic() - self._lost_last < every and self._lost_cursor is None:
            return
        self._lost_last = time.monotonic()
        runs = self.store.open_runs(before=now - int(shortest * 1000),
                                    after=self._lost_cursor, limit=LOST_BATCH)
        self._lost_cursor = next_cursor(runs, LOST_BATCH)
        # A dynamic entry this beat does not hold now is judged by its own run_timeout,
        # shorter or longer than the default (read from its definition).
        self._read_policies(run.entry for run in runs)
        outcomes = []
        for run in runs:
            timeout = (self.policies[run.entry].run_timeout if run.entry in self.policies
                       else self._others[run.entry].run_timeout if run.entry in self._others
                       else default)
            if timeout is None:
                continue
            cutoff = now - int(timeout * 1000)
            if run.since < cutoff:
                outcomes.append(Outcome(run.entry, run.due, run.token, RunState.LOST,
                                        Reason.RUN_TIMEOUT, inactive_since=cutoff))
        if not outcomes:
            return
        for outcome, recorded in zip(outcomes, self.store.finish(outcomes)):
            if recorded:
                self.logger.warning("beat-claims: %s due %s: no outcome within run_timeout="
                                    "%ss: recorded lost", outcome.entry, iso(outcome.due),
                                    self._policy(outcome.entry).run_timeout)

    def store_went_back(self) -> None:
        """The store may hold runs again with instants this beat's looks have passed (a
        restore, the runs beats register again): the next look starts from the oldest."""
        self._unstarted_seen = None

    def _look_for_unstarted(self, now: int) -> None:
        """Name, in one warning, the entries with a run that is still ``sent`` (no worker
        started it) ``unstarted_after`` seconds after it was sent: each entry once (again
        after a day if it still has such runs: :class:`Said`), by each beat.

        Each look reads only the open runs that aged past the bound since the last one
        (the first look, every open run older than it), so its cost follows the rate of
        runs, not how many are open; a run is judged once, as it ages past the bound.
        Looked for every tenth of the bound, but not more often than every heartbeat
        interval nor less often than every ten."""
        after = self.settings.unstarted_after
        if after is None:
            return
        interval = self.settings.heartbeat_interval
        if time.monotonic() - self._unstarted_last < max(interval,
                                                          min(10 * interval, after / 10)):
            return
        self._unstarted_last = time.monotonic()
        cutoff = now - int(after * 1000)
        if self._unstarted_seen is not None and self._unstarted_seen >= cutoff:
            return  # the store's clock went back: nothing aged past the bound since
        runs = self.store.open_runs(before=cutoff, after=self._unstarted_seen,
                                    limit=LOST_BATCH)
        # After a full page, the next look goes on from it; else from this cutoff (runs at
        # the cutoff itself were not in this answer).
        self._unstarted_seen = (next_cursor(runs, LOST_BATCH) if len(runs) >= LOST_BATCH
                                else cutoff - 1)
        new = self._unstarted_said.unsaid(u.entry for u in unstarted(runs, cutoff))
        if not new:
            return
        self._unstarted_said.said(new)
        self.logger.warning("beat-claims: %s; `celery claims status` and `claims health` list"
                            " them (beat_claims_unstarted_after=%ss)",
                            summary(new, after), f"{after:g}")


class IndexKeeper:
    """Keeps the store's due index true (see :class:`~beat_claims.stores.base.DueEntry`)
    where claims and definition writes did not, at most one page of each a sweep:

    * the entries to index again (:meth:`reindex`): those this beat registered (a new
      entry is indexed due at once), those whose definition the change feed reported (a
      writer that does not compute ``next_due`` indexes the entry due at once, or later
      than the truth), and after the store went back (a new epoch) every entry this beat
      schedules;
    * a rebuild pass over the entries with no ``next_due`` at all (a store migrated to the
      index, an index wiped): passes follow one another until one indexes nothing, then
      start again after :data:`REBUILD_PAUSE` sweeps (or as many as the last pass took
      pages, if more), and at once after the store went back; a page that indexed
      nothing is followed by a sweep for each :data:`REBUILD_READS` records it read (a
      Redis store's, every entry's record) before the next page, so that an idle beat
      reads as much a minute whatever the number of entries.

    An idle beat asks nothing more of the store between two passes. Each write is
    :meth:`Store.index`, conditional on the state and definition version it was computed
    from, and computed as the beat's heap is (:meth:`Claimer.next_at`) from the
    definition this beat schedules the entry by: an entry of another beat's own is left to
    the beat that does; a dynamic entry this beat does not hold (no beat holds them all)
    is computed from its definition, as every beat would (NOT_DUE while disabled)."""

    def __init__(self, store: Store, source: EntrySource, claimer: Claimer,
                 stored: StoredEntries, logger: logging.Logger, app: Any,
                 settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.store = store
        self.source = source
        self.claimer = claimer
        self.stored = stored
        self.logger = logger
        #: Entries to index again at the next sweeps, a page each.
        self.pending: set[str] = set()
        self._everything = False  # every entry this beat schedules, at the next sweep
        self._cursor = ""  # the rebuild pass's
        self._passing = True  # a pass at start: entries written before the index
        self._pass_indexed = 0
        self._pass_pages = 0
        self._pause = 0  # sweeps left before the next pass
        self._failing = False  # the last sweep's upkeep met a store error (logged once)

    def reindex(self, names: Iterable[str]) -> None:
        """Index ``names`` again at the next sweeps (one page a sweep)."""
        self.pending.update(names)

    def index_registered(self, names: Iterable[str], between: Callable[[], None]) -> None:
        """Index the entries this beat just registered (a registration indexes a new entry
        due at once) from the states it answered, :data:`INDEX_PAGE` a store call
        (``between`` between two: the heartbeat kept alive, as a registration does),
        rather than from the store's records a page a sweep: the first burst after a start
        would wait on those sweeps. What the store refuses (the entry moved meanwhile),
        cannot be computed, or is not written for a store error is left to the sweeps."""
        names = sorted(names)
        for start in range(0, len(names), INDEX_PAGE):
            page = names[start:start + INDEX_PAGE]
            writes = []
            for name in page:
                state = self.claimer.states.get(name)
                version = self.source.version_of(name)
                at = None if state is None or version is None else self.next_due_of(
                    name, state, version)
                if state is None or version is None or at is None:
                    self.pending.add(name)
                else:
                    writes.append(IndexWrite(name, state, version, at))
            try:
                if start:
                    between()
                written = self.store.index(writes) if writes else []
            except StoreError as exc:
                self.logger.debug("beat-claims: the due index of the entries registered is"
                                  " left to the sweeps: %s", exc)
                self.pending.update(names[start:])
                return
            self.pending.update(w.name for w, ok in zip(writes, written) if not ok)

    def store_went_back(self) -> None:
        """Every entry is looked at again: those this beat schedules (once it registered
        them again), and a rebuild pass from the start."""
        self._everything = True
        self._start_pass()

    def _start_pass(self) -> None:
        self._cursor, self._passing = "", True
        self._pass_indexed = self._pass_pages = self._pause = 0

    def sweep(self) -> None:
        """One page of each kind of upkeep. The store failing it (a Redis Cluster master
        down, say) stops the upkeep, not the tick: the beat goes on claiming what it can,
        and what was pending stays pending for the next sweep."""
        if self._everything:
            self._everything = False
            self.pending.update(self.claimer.states)
        try:
            self._index_pending()
            self._rebuild()
        except StoreError as exc:
            if not self._failing:
                self._failing = True
                self.logger.warning("beat-claims: the due index cannot be kept now (%s);"
                                    " trying again at the next sweeps", exc)
            return
        if self._failing:
            self._failing = False
            self.logger.info("beat-claims: the due index is kept again")

    def next_due_of(self, name: str, state: EntryState, version: int,
                    definition: StoredDefinition | None = None) -> int | None:
        """``name``'s next due instant at ``state`` under its definition ``version`` (0:
        none), as this beat's heap would hold it; None when this beat cannot tell (it does
        not schedule the entry, or by another version of its definition)."""
        if name in self.source.schedule:
            if self.source.version_of(name) != version:
                return None
            try:
                return self.claimer.next_at(name, state)
            except Exception:  # (logged when the heap is computed)
                return None
        known = self.stored.known.get(name)
        record = definition if definition is not None else (
            known.stored if known is not None else None)
        if record is None or record.version != version or record.deleted or record.corrupt:
            return None
        if record.origin not in DYNAMIC or record.definition is None:
            return None
        if known is not None and known.stored == record:
            parsed = known.definition
        else:
            try:
                parsed = validate(name, record.definition)
            except DefinitionError:
                return None
        if parsed is None:
            return None
        # A dynamic entry this beat does not hold (no beat holds them all): computed from
        # its definition, as every beat would.
        return next_due.of_definition(name, parsed, self.app, state.anchor, state.checkpoint,
                                      self.settings)

    def _from_record(self, name: str, record: EntryRecord,
                     definition: StoredDefinition | None) -> int | None:
        if record.anchor is None:
            return None
        return self.next_due_of(name, EntryState(record.anchor, record.checkpoint,
                                                 record.token),
                                definition.version if definition is not None else 0,
                                definition)

    def _index_pending(self) -> None:
        if not self.pending:
            return
        names = list(itertools.islice(self.pending, INDEX_PAGE))
        # Taken off once indexed, or on an error of the beat's own (not asked for ever): a
        # store that did not answer leaves them for the next sweep (the writes are
        # conditional: asked again after a lost reply, harmless).
        try:
            self._index(names)
        except (StoreError, StoreConfigurationError):
            raise
        except Exception:
            self.pending.difference_update(names)
            raise
        self.pending.difference_update(names)

    def _index(self, names: list[str]) -> None:
        records = {r.name: r for r in self.store.entries(names)}
        definitions = {d.name: d for d in self.store.definitions(names)}
        writes = []
        for name in names:
            record, definition = records.get(name), definitions.get(name)
            if record is None or record.anchor is None or (
                    definition is not None and definition.corrupt):
                continue
            at = self._from_record(name, record, definition)
            if at is not None:
                writes.append(IndexWrite(name, EntryState(record.anchor, record.checkpoint,
                                                          record.token),
                                         definition.version if definition else 0, at))
        if writes:
            self.store.index(writes)

    def _rebuild(self) -> None:
        if self._pause > 0:
            self._pause -= 1
            return
        if not self._passing:
            self._start_pass()
        page = rebuild_page(self.store, self._from_record, self._cursor, INDEX_PAGE)
        self._cursor = page.cursor
        self._pass_indexed += len(page.indexed)
        self._pass_pages += 1
        if page.indexed:
            self.logger.debug("beat-claims: the due index: %d entries indexed by the"
                              " rebuild sweep", len(page.indexed))
        if not page.complete:
            if not page.indexed:  # (an index being rebuilt is read at a page a sweep)
                self._pause = page.looked_at // REBUILD_READS
            return
        if self._pass_indexed:
            self._start_pass()  # (until a whole pass has nothing to index)
        else:
            self._passing = False
            self._pause = max(REBUILD_PAUSE, self._pass_pages,
                              page.looked_at // REBUILD_READS)
