"""The beat side: a ``celery.beat.Scheduler`` that claims each occurrence before it sends it.

This class keeps Celery's interface (``setup_schedule``, ``tick``, ``close``) and the hooks
a schedule source overrides (``bounds``, ``on_sent``, ``entries_changed``,
``entry_state``); the work is done by the objects of :mod:`beat_claims.beat`, each with its
own state. Each tick: renew the heartbeat (and notice a store that went back), take back
what nobody will send and pick up what is due again, claim what is due (one atomic
compare-and-set per entry, many entries per call), then check each claim immediately
before publishing it (a claim made just before its publish may carry that check: see
:class:`beat_claims.stores.base.SendAtOnce`).

The schedule is the beat's own entries (``beat_schedule``; a schedule source's, through
:meth:`Scheduler.set_local`, or :meth:`Scheduler.change_local` for a few of them)
composed with the entries' definitions in the store (:mod:`beat_claims.beat.composition`),
read at start and followed at each heartbeat
through the store's change feed (:mod:`beat_claims.beat.stored`). A claim is sent with the
entry it was claimed with, whatever changed since (``pinned``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from celery import Celery
from celery.beat import ScheduleEntry
from celery.beat import Scheduler as BaseScheduler
from celery.utils.log import get_logger

from . import celery_settings
from .beat.claimer import Claimer, PolicyBounds, usable_cores
from .beat.claims_entry import ClaimsEntry
from .beat.claims_entry import _rebuild_entry as _rebuild_entry  # (pickles made before)
from .beat.clock import StoreClock
from .beat.composition import Composition
from .beat.config_writes import write_own
from .beat.dynamic import DynamicEntries
from .beat.holdings import Holdings
from .beat.knowledge import Knowledge
from .beat.liveness import Liveness, StoreWentBack
from .beat.long_lived import freeze_long_lived
from .beat.outage import MAX_BACKOFF, Outage
from .beat.pauses import KnownPauses
from .beat.pinned import PinnedEntries
from .beat.policies import EntryPolicies
from .beat.publisher import Publisher
from .beat.recovery import Recovery
from .beat.reregistration import Reregistration
from .beat.sender import BrokerDown, Sender
from .beat.stop_signals import (
    built_by_celery_beat,
    deliver_held,
    hold_stop_signals,
    in_celery_stop_handler,
)
from .beat.stored import PAGE, StoredEntries
from .beat.sweeper import IndexKeeper, Sweeper
from .beat.window import HELP_AFTER, DynamicWindow, Share
from .enums import Reason
from .metrics import Metrics
from .runs import MAX_DIFFERS, Owner
from .settings import ConfigurationError, Policy, Settings, entry_name_problem
from .stores import open_store
from .stores.base import (
    Claim,
    EntryState,
    Store,
    StoreConfigurationError,
    StoreError,
)

logger = get_logger("celery.beat.claims")

#: Entries whose change of schedule is logged one by one (more: one line, counted).
LOGGED_CHANGES = 10
#: The least time (s) from a tick that sent something to the next, when what falls due
#: next is that close: occurrences due a few ms apart (thousands a minute, spread by
#: jitter) go out together, a claim, a check and a sent mark for many, not for each; an
#: occurrence after a quiet spell is not held back. Never later than this by the pace.
GATHER = 0.05


class Scheduler(BaseScheduler):
    """Run ``beat_schedule`` from any number of beats at once; each occurrence is sent once."""

    Entry = ClaimsEntry

    def __init__(self, app: Celery, *args: Any, store: Store | None = None,
                 **kwargs: Any) -> None:
        try:
            self._setup(app, store, *args, **kwargs)
        except (ConfigurationError, StoreConfigurationError) as exc:
            if not built_by_celery_beat():
                raise
            # One line, and the beat exits: a user's mistake, not a bug (no traceback).
            if logging.getLogger().handlers:
                logger.critical("beat-claims: %s", exc)
            else:  # Celery builds one for its banner before its logging is set up
                sys.stderr.write(f"beat-claims: {exc}\n")
            raise SystemExit(1) from None

    def _setup(self, app: Celery, store: Store | None, *args: Any, **kwargs: Any) -> None:
        self.settings = Settings.from_app(app)
        #: Celery's settings this beat does not apply as Celery would (named at start).
        self._not_applied = celery_settings.not_applied(
            app.conf, self.settings, schedule_filename=kwargs.get("schedule_filename"),
            max_interval=kwargs.get("max_interval"))
        self.owner = Owner.current()
        self.store: Store = store or open_store(self.settings)
        self.metrics = Metrics()
        self.entry_policies = EntryPolicies(self.settings)
        #: Each entry's policy (shared with the parts below: updated in place).
        self.policies = self.entry_policies.by_name
        self.clock = StoreClock()
        self.knowledge = Knowledge()
        self.holdings = Holdings()
        interval = self.settings.heartbeat_interval
        self.liveness = Liveness(self.store, self.owner, interval, self.clock,
                                 written=self.knowledge.written,
                                 removed=self.knowledge.removed)
        self.claimer = Claimer(self.store, self.owner, self.settings, self, self.knowledge,
                               self.holdings, self.metrics, logger,
                               keep_alive=self.liveness.keep_alive)
        #: Claims held when their entry's definition changed (or went): each is sent with
        #: the entry it was claimed with (one definition per occurrence).
        self.pinned = PinnedEntries(self.holdings, logger, schedule=lambda: self.schedule)
        self.publisher = Publisher(
            app, self.settings, self.liveness, self.pinned, logger,
            schedule=lambda: self.schedule, entry_for=self.pinned.entry_for,
            hook=lambda entry, claim, task_id: self._publish(entry, claim, task_id),
            on_sent=lambda entry, claim: self.on_sent(entry, claim),
            producer=lambda: self.producer,
            send_task=lambda *args, **kwargs: self.send_task(*args, **kwargs))
        self.sender = Sender(self.store, self.owner, self.settings, self.policies,
                             self.holdings, self.knowledge, self.liveness, self.clock,
                             self.publisher.publish_claim, self.metrics, self.claimer.skips,
                             logger, self.publisher.arguments)
        self.sweeper = Sweeper(self.store, self.owner, self.settings, self, self.holdings,
                               self.claimer, self.liveness, self.clock, self.metrics, logger)
        self.recovery = Recovery(app, self.store, self.settings, self.clock, logger)
        self.stored = StoredEntries(self.store, logger)
        self.stored.between = self.liveness.keep_alive
        self.index_keeper = IndexKeeper(self.store, self, self.claimer, self.stored, logger,
                                        app, self.settings)
        self.composition = Composition(app, self.stored, logger)
        self.composition.between = self.liveness.keep_alive
        #: The dynamic entries this beat holds for now, taken from the store's due index.
        self.window = DynamicWindow(self.store, logger, interval)
        self.window.late_here = lambda now: (self.claimer.next_due() or now) <= now - HELP_AFTER
        self.window.scheduled = lambda name: (name in self.schedule
                                              or name in self.composition.local)
        self.stored.wanted = lambda name: (name in self.composition.local
                                           or name in self.window.held)
        self.stored.wanted_names = lambda: [*self.composition.local, *self.window.held]
        self.pauses = KnownPauses(self.store, self.owner, self.knowledge, logger,
                                  schedule=lambda: self.schedule)
        self.reregistration = Reregistration(
            self.store, self.knowledge, self.holdings, self.claimer, self.sweeper,
            self.index_keeper, self.liveness, self.pauses, logger)
        self.dynamic = DynamicEntries(
            app, self.store, self.owner, self.settings, self.window, self.stored,
            self.composition, self.claimer, self.clock, self.holdings, self.entry_policies,
            self.pinned, schedule=lambda: self.schedule)
        # Retried at least every heartbeat interval: the beat's liveness depends on it.
        self.store_outage = Outage("store", self.store.description, logger,
                                   "nothing is sent unclaimed until it returns",
                                   max_backoff=max(0.5, interval),
                                   waiting=lambda: self.claimer.due_count(self.clock.now()))
        self.broker_outage = Outage("broker", "publishing failed", logger,
                                    "this beat claims nothing until it returns (what it held"
                                    " was given back)")
        self._bug_backoff = 0.0
        self._bug_retry_at = 0.0
        self._last_sweep = float("-inf")
        self._ready = False
        self._settle_logged = False
        self._join_logged = False
        self._registered_once = False
        self._own_written = False  # this beat's beat_schedule written to the store at start
        self._feed_down = False  # the definitions' change feed failed at the last heartbeat
        #: Entries changed since the claimer last took them in (Claimer.update).
        self._to_update: set[str] = set()
        self._closed = False
        self._closing = False
        self._in_tick = False
        #: When the last tick that published began (monotonic), for GATHER.
        self._sent_at = float("-inf")
        super().__init__(app, *args, **kwargs)
        self.max_interval: float = min(float(self.max_interval), interval)
        if built_by_celery_beat() and not kwargs.get("lazy"):
            self._first_contact()

    def _first_contact(self) -> None:
        """Credentials refused, a host that does not exist: found before the loop starts
        (raised: one line, and the beat exits). A store that merely does not answer yet is
        an outage: the beat runs, and waits."""
        try:
            self.store.owners()
        except StoreError as exc:
            self.store_outage.down(exc)

    # -- setup ------------------------------------------------------------------------
    def setup_schedule(self) -> None:
        super().setup_schedule()
        self._refuse_bad_names()
        # What Celery read (beat_schedule, its default entries) is this beat's own; the
        # store's definitions are composed in once read (the first tick, before claiming).
        self.composition.set_local(dict(self.schedule))
        self.entry_policies.read(self.schedule, self.pinned)
        self.entry_policies.warn_unbounded_overlap(self.schedule, logger)
        if self.settings.metrics_port is not None:
            self.metrics.start(self.settings.metrics_port)
        logger.info("beat-claims: owner %s, %d entries, store %s", self.owner,
                    len(self.schedule), self.info)
        line = celery_settings.start_line(self._not_applied)
        if line is not None:
            logger.warning("%s", line)

    def merge_inplace(self, b: dict[str, Any]) -> None:
        """Celery's, with an entry that cannot be built (``schedule: float("inf")``) named
        in the error instead of a traceback from deep inside Celery."""
        built: dict[str, Any] = {}
        for name, spec in b.items():
            try:
                built[name] = self.Entry(**dict(spec, name=name, app=self.app))
            except Exception as exc:
                raise ConfigurationError(
                    f"entry {name!r}: cannot be scheduled: {type(exc).__name__}: {exc}"
                ) from None
        schedule = self.schedule
        for name in set(schedule) ^ set(built):
            schedule.pop(name, None)
        for name, entry in built.items():
            if name in schedule:
                schedule[name].update(entry)
            else:
                schedule[name] = entry

    def _refuse_bad_names(self, names: Iterable[str] | None = None) -> None:
        """An entry whose name cannot be stored is left out, named once; the others run.
        (``names``: those alone are looked at.)"""
        for name in list(self.schedule if names is None else names):
            problem = entry_name_problem(name) if name in self.schedule else None
            if problem is not None:
                logger.error("beat-claims: %s; this entry is not scheduled", problem)
                del self.schedule[name]

    def entries_changed(self) -> None:
        """The schedule was changed in place (a schedule source that is edited while beat
        runs, such as a database): read policies again and, at the next tick, register new
        entries and rebuild the heap of due instants."""
        self._refuse_bad_names()
        self.entry_policies.read(self.schedule, self.pinned)
        self._ready = False

    # -- the schedule: this beat's own entries and the store's definitions -------------
    def set_local(self, entries: dict[str, Any], configured: set[str] | None = None) -> None:
        """This beat's own entries are now ``entries`` (a schedule source that reads a
        database calls this; ``configured``: those of them from ``beat_schedule``, all when
        None): the schedule is composed again with the store's definitions."""
        self.composition.set_local(entries, configured)
        if self.stored.loaded:
            self.stored.fetch(set(entries) - set(self.stored.known))
            self._recompose()

    def change_local(self, changed: dict[str, Any], removed: Iterable[str] = ()) -> None:
        """Some of this beat's own entries changed: ``changed`` (name -> entry, added or
        changed) and ``removed`` (names gone). What :meth:`set_local` and
        :meth:`entries_changed` do for the whole schedule, for these names alone: composed
        with the store's definitions, policies read, registered, withdrawn or put back on
        the heap at the next tick. The work is in proportion to the change, not to the
        schedule (one row changed among 100,000). An entry of ``beat_schedule`` changed
        this way is composed again as a whole."""
        gone = set(removed) - set(changed)
        names = set(changed) | gone
        if names & self.composition.configured:
            local = {n: e for n, e in self.composition.local.items() if n not in gone}
            self.set_local({**local, **changed}, self.composition.configured - gone)
            return
        self.composition.change_local(changed, gone)
        if self.stored.loaded:
            self.stored.fetch(set(changed) - set(self.stored.known))
            self._recompose(names)
            return
        # (composed with the store's definitions once they are read, at the first tick)
        for name in gone:
            self.schedule.pop(name, None)
        self.schedule.update(changed)
        self._entries_changed_some(names)

    def _entries_changed_some(self, names: set[str]) -> None:
        """What :meth:`entries_changed` does, for ``names`` alone: the claimer takes them
        in at the next tick (:meth:`Claimer.update`), before it claims."""
        self._refuse_bad_names(names)
        self.entry_policies.read_some(names, self.schedule, self.pinned)
        # Kept whether or not the beat is ready: a beat not ready takes the whole schedule
        # in (and drops these), but one registering again after the store went back is made
        # ready by that registration, of the entries it had when it began.
        self._to_update |= names

    def _follow_definitions(self) -> None:
        """Read what changed in the store's definitions (everything, the first time) and
        compose the schedule again if anything did."""
        first = not self.stored.loaded
        try:
            changed = self.stored.refresh(self.liveness.take_changes)
        except (StoreError, StoreConfigurationError) as exc:
            if first:
                raise  # nothing is claimed before the definitions are read
            # (a bucket of the store unreachable, say): what was read stays followed; a
            # claim of a changed entry meets its moved checkpoint and reads it apart.
            if not self._feed_down:
                self._feed_down = True
                logger.warning("beat-claims: the definitions' change feed cannot be read"
                               " (%s); following the definitions read last until it can",
                               exc)
            return
        if self._feed_down:
            self._feed_down = False
            logger.warning("beat-claims: the definitions' change feed can be read again")
        if self.stored.unseen:  # (indexed again by its writer: maybe behind the scan)
            self.stored.unseen = 0
            self.window.restart()
        self.pinned.prune()
        if first or (changed and self.stored.reloaded):  # (read again: written again too)
            self._recompose()
        elif changed:  # those alone: the work is in proportion to the change
            self._recompose(changed)
        if changed or first:
            self.index_keeper.reindex(changed)
        self._report_differences()

    def _write_own(self) -> None:
        """At start, and after the store went back (it may have lost them), once the store
        has settled and this beat joined, just before it registers its entries: this
        beat's beat_schedule entries as definitions (over another one only at start)."""
        if not self.stored.reloaded:
            return
        wrote = write_own(self.store, self.app, self.composition.own, self.stored.known,
                          self.owner.id, logger, replace=not self._own_written,
                          between=self.liveness.keep_alive)
        if wrote:
            self.stored.refresh()
        self.stored.reloaded = False
        self._own_written = self.composition.own_written = True
        self.liveness.keep_alive()  # (composing a large schedule takes a while)
        self._recompose()
        self._report_differences()

    def states_moved(self, names: list[str]) -> None:
        """Read again the definitions of those of ``names`` the store has one of (see
        ``EntrySource.states_moved``): a change moves the checkpoint with the definition,
        so that a beat that learned the new checkpoint plans by the new definition, not by
        the one it read last (it would claim the old grid's instants after the change)."""
        if not self.stored.loaded:
            return
        known = [name for name in names if name in self.stored.known]
        changed: set[str] = set()
        for start in range(0, len(known), PAGE):
            if start:  # (every entry moved after a registration: many pages)
                self.liveness.keep_alive()
            changed |= self.stored.take(self.store.definitions(known[start:start + PAGE]))
        if changed:
            self._recompose(changed)

    def _report_differences(self) -> None:
        """Write with the heartbeats which entries of this beat's beat_schedule differ from
        the store's definitions (it sends the stored ones): ``claims status`` and
        ``claims health`` show them."""
        differs = tuple(sorted(self.composition.differing())[:MAX_DIFFERS])
        if differs != self.liveness.owner.schedule_differs:
            self.liveness.owner = dataclasses.replace(self.owner, schedule_differs=differs)

    def _recompose(self, names: set[str] | None = None) -> None:
        """The schedule from this beat's own entries and the store's definitions (``names``:
        those alone are composed again). An entry whose definition changed or went keeps,
        for each claim this beat holds of it, the entry that claim was made with: the claim
        is sent with it."""
        if names is None:
            old = dict(self.schedule)
            new = self.composition.compose()
            candidates = set(old) | set(new)
        else:
            old = {name: self.schedule[name] for name in names if name in self.schedule}
            new = self.composition.compose_some(names)
            candidates = names
        changed = {name for name in candidates if old.get(name) is not new.get(name)}
        if not changed:
            return
        self.pinned.pin(changed, old)
        if names is None:
            self.schedule.clear()
            self.schedule.update(new)
        else:
            for name in changed:
                if name in new:
                    self.schedule[name] = new[name]
                else:
                    self.schedule.pop(name, None)
        hows = {name: "now scheduled" if name not in old else (
            "changed" if name in new else "no longer scheduled") for name in sorted(changed)}
        if len(hows) <= LOGGED_CHANGES:
            for name, how in hows.items():
                logger.info("beat-claims: entry %s: %s", name, how)
        else:
            counts = Counter(hows.values())
            logger.info("beat-claims: %d entries changed (%s)", len(hows),
                        ", ".join(f"{n} {how}" for how, n in sorted(counts.items())))
        if names is None:
            self.entries_changed()
        else:
            self._entries_changed_some(changed)

    @property
    def policy_bounds(self) -> PolicyBounds:
        """The shortest windows over every entry's policy (a sweep's bounds)."""
        return self.entry_policies.bounds

    # -- hooks for schedule sources ---------------------------------------------------
    def entry_state(self, name: str) -> EntryState | None:
        """The entry's anchor and checkpoint as this beat last read them from the store."""
        return self.claimer.states.get(name)

    def on_sent(self, entry: ScheduleEntry, claim: Claim) -> None:
        """Called after each successful publish; a schedule source may record it (a
        database's ``last_run_at``). It decides nothing: the store is the truth."""

    def bounds(self, name: str) -> tuple[int | None, int | None]:
        """(not before, not after) in UTC ms: occurrences outside are never due. A schedule
        source with start times or expiry dates overrides this."""
        return None, None

    def version_of(self, name: str) -> int | None:
        """The version of the stored definition ``name`` is scheduled by; for an entry of
        this beat's own, the version of what the store holds under its name (0: nothing):
        a claim indexes the entry only while the store holds that version (a definition
        written meanwhile indexed it). None before the definitions were read."""
        if not self.stored.loaded:
            return None
        chosen = self.composition.chosen.get(name)
        if chosen is not None and chosen[0][0] == "stored":
            return chosen[0][1]
        known = self.stored.known.get(name)
        return 0 if known is None else known.stored.version

    def take_up(self, names: list[str]) -> list[str]:
        """(:meth:`DynamicEntries.take_up`: a sweep takes up runs due again.)"""
        return self.dynamic.take_up(names)

    def policies_of(self, names: list[str]) -> dict[str, Policy]:
        """(:meth:`DynamicEntries.policies_of`: a sweep judges runs of entries not held.)"""
        return self.dynamic.policies_of(names)

    # -- the loop ---------------------------------------------------------------------
    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass; the seconds until the next, never more than ``max_interval`` (Celery's
        ``beat_max_loop_interval``): an outage's backoff is waited out in shorter sleeps."""
        return min(self._pass(), self.max_interval)

    def _pass(self) -> float:
        if self._closed:
            self._closed = False  # started again after close(): claim afresh
            self.liveness.lapse()
        wait = max(self.store_outage.waiting(), self._bug_retry_at - time.monotonic())
        if wait > 0:
            return wait
        self._in_tick = True
        try:
            wait = self._tick()
        except (StoreError, StoreConfigurationError) as exc:
            return self._store_down(exc)
        except StoreWentBack as exc:
            self.sender.up_since = None
            self.reregistration.noticed(exc)
            return self._guarded(self._went_back)
        except Exception:
            # A bug here must not stop the beat (its claims would wait to be taken back):
            # nothing unclaimed is sent; start again from the store, with backoff.
            logger.exception("beat-claims: unexpected error in a tick; starting again from"
                             " the store")
            self._bug_backoff = min(MAX_BACKOFF, max(0.5, self._bug_backoff * 2))
            self._bug_retry_at = time.monotonic() + self._bug_backoff
            self.liveness.lapse()
            self.sender.up_since = None
            self._ready = False
            return self._bug_backoff
        finally:
            self._in_tick = False
            self.liveness.swept = None  # a sweep's answer is for the tick it came in
        self._bug_backoff = 0.0
        self.store_outage.up()
        self.metrics.store_up(True)
        self.metrics.held(len(self.holdings))
        return wait

    def _guarded(self, step: Any) -> float:
        self._in_tick = True
        try:
            return float(step())
        except (StoreError, StoreConfigurationError) as exc:
            return self._store_down(exc)
        except StoreWentBack as exc:  # again, while registering: started over next tick
            self.reregistration.noticed(exc)
            return 0.0
        finally:
            self._in_tick = False

    def _tick(self) -> float:
        """The heartbeat (a sweep asked with it), the definitions followed; once the store
        has settled and this beat joined: the schedule taken in, the dynamic entries due
        soon held, the sweep, and what is due claimed and sent."""
        if self.reregistration.why is not None:
            return self._went_back()
        heartbeat = self.liveness.due() or self._heartbeat_with_sweep()
        sweep_due = self._sweep_due(heartbeat)
        if heartbeat:
            self._heartbeat(sweep_due)
        if heartbeat or not self.stored.loaded:
            self._follow_definitions()
        waiting = self._not_claiming_yet()
        if waiting is not None:
            return waiting
        self._take_in_schedule()
        if heartbeat:  # the epoch is the one this beat knows, and the store has settled
            self.pauses.check_in_turn()
        self._hold_dynamic_due_soon()
        began = self.clock.now()
        broker_down = self.broker_outage.waiting() > 0
        if sweep_due:
            self._sweep(pick_up=not broker_down)
        if broker_down:
            return min(self.broker_outage.waiting(), self._sleep_for())
        published = self.sender.published
        began_here = time.monotonic()
        waiting = self._claim_and_send()
        if self.sender.published != published:
            self._sent_at = began_here
        if waiting is not None:  # the broker went down
            return waiting
        self.pauses.check_stale()  # a skip for a pause: maybe a later one
        self.dynamic.let_go()
        self.broker_outage.up()
        if self.sender.up_since is None:  # claiming and sending from here on
            self.sender.up_since = began
        return self._sleep_for()

    def _heartbeat(self, sweep_due: bool) -> None:
        # A sweep due in this tick is asked with the heartbeat: one round trip, not two
        # (not the first heartbeat after an outage: that one only has to work).
        sweep = (self.sweeper.query()
                 if self._ready and sweep_due and not self.store_outage.active else None)
        feed = self.stored.cursor if self.stored.loaded else None  # (read with it)
        if self.liveness.beat(sweep=sweep, changes=feed):
            raise StoreWentBack("the store's epoch changed (a restart, a failover or a"
                                " wipe)", epoch_begun=True)
        self.metrics.heartbeat()
        self._register_again_after_a_lapse()
        self.window.share = Share.among(self.owner.id, self.liveness.sharers())
        # Its pass from the first entry (once an interval) in this tick: an idle beat
        # wakes once an interval, not once for each.
        self.window.restart()

    def _not_claiming_yet(self) -> float | None:
        """The wait while the store settles (a new epoch) or this beat joins; None once it
        may claim."""
        settling = self.liveness.settling_for()
        if settling > 0:
            if not self._settle_logged:
                self._settle_logged = True
                logger.info("beat-claims: the store has a new epoch (new, restarted, failed"
                            " over or wiped): claiming starts in %.1fs, once every live beat"
                            " could register what it knows", settling)
            return min(settling, self.max_interval)
        if not self.liveness.join.joined:
            if not self._join_logged:
                self._join_logged = True
                logger.info("beat-claims: joining: claiming starts once every live beat has"
                            " heartbeated since this one started (each checks the store"
                            " still holds what it wrote)")
            return max(0.05, min(self.liveness.joining_for(), self.max_interval))
        return None

    def _take_in_schedule(self) -> None:
        """The claimer takes in the whole schedule (not ready: at start, after a change of
        all of it) or the entries changed since the last tick; after a lapse, a chunk a
        tick is registered again."""
        if not self._ready:
            self._write_own()
            self._to_update.clear()  # (the whole schedule is taken in)
            self.claimer.sync(self.schedule)
            self.claimer.read_moved()  # (now, not at the first claim: see read_moved)
            # (registered: due at once)
            self.index_keeper.index_registered(self.claimer.states, self.liveness.keep_alive)
            self._ready = True
            if not self._registered_once:
                # A stop signal's handler (Celery's raises SystemExit) run inside a
                # finalizer of this collection would be ignored: it waits until after.
                held = hold_stop_signals()
                try:
                    freeze_long_lived()
                finally:
                    deliver_held(held)
        if self._to_update:
            names = set(self._to_update)
            self.claimer.update(names)
            self.index_keeper.reindex(names & set(self.claimer.states))
            self._to_update -= names
        if self._settle_logged or not self._registered_once:
            logger.info("beat-claims: %d entries registered; claiming",
                        len(self.claimer.states))
        self._settle_logged = False
        self._registered_once = True
        if self.claimer.again:  # after a lapse: a chunk a tick, between the claims
            self.claimer.register_again_next()

    def _hold_dynamic_due_soon(self) -> None:
        """The dynamic entries the due index says fall due soon, held (:class:`DynamicEntries`)."""
        now = self.clock.now()
        taken = self.window.scan(now)
        if any(t.next_due <= now for t in taken):
            # Read already due: held in time, an entry is read before its instant. It may
            # be an occurrence another beat sent that a copy put back since this beat's
            # last heartbeat lost (this beat never held it: nothing it knows is older):
            # the store is checked before it is claimed, as at a heartbeat.
            self.liveness.confirm()
        self.dynamic.hold(taken, write_back=True)
        if self.window.unreadable:
            self.dynamic.repair(sorted(self.window.unreadable))

    def _sweep(self, pick_up: bool) -> None:
        self._last_sweep = time.monotonic()
        if self.holdings.unmarked:
            self.sender.flush_marks()
        if self.claimer.refused:
            self.claimer.retry_refused()
        self.sweeper.sweep(pick_up=pick_up)
        self.index_keeper.sweep()
        if self.recovery.due():
            self.recovery.run()

    def _claim_and_send(self) -> float | None:
        """Claim what is due, a chunk at a time, and send each chunk; what this beat held
        first. The wait, when the broker went down (what it held is given back)."""
        due = self.claimer.pop_due(self.clock.now())
        try:
            due_rest = self._send_ready(due)
            chunks = self.claimer.shares(due_rest, self.liveness.peers()) if due_rest else []
            claiming = self.claimer.claim_chunks(chunks, self.clock.now,
                                                 claim_ahead=len(chunks) > 1
                                                 and self._claim_ahead())
            try:
                for fresh, waited in claiming:
                    now = self.clock.now()
                    self.sender.send([c for c in fresh + waited
                                      if self.holdings.later.get(c.ref, 0) <= now],
                                     self.pinned.sendable())
            finally:
                claiming.close()  # what was claimed ahead is held: sent later, or given back
        except BrokerDown as exc:
            self.sender.up_since = None
            self.broker_outage.down(exc.__cause__ or exc)
            # What was claimed ahead is held only once the send stopped: given back too, for
            # a beat whose broker is up (if the store cannot take it now, it is sent here
            # once the broker is back, or taken back by the sweeps).
            with contextlib.suppress(StoreError, StoreConfigurationError):
                self.sender.release(list(self.holdings.held.values()))
            return min(self.broker_outage.waiting(), self._sleep_for())
        finally:
            for name in due:  # each popped entry goes back once, at its next due instant
                self.claimer.push(name)
            self.knowledge.skipped_paused(self.claimer.skips.counts.get(Reason.PAUSED, ()))
            self.claimer.skips.flush()
        return None

    def _send_ready(self, due: list[str]) -> list[str]:
        """Send the held claims whose instant has come (picked up, left from an outage, or
        held until its jitter's instant: judged, then sent), together with what is due now
        of the same entries, so that the catch-up policy sees them all at once (latest: one
        run, not two). The rest of ``due``, to claim."""
        ready = self.holdings.ready(self.clock.now())
        if not ready:
            return due
        self.holdings.waited.update(claim.ref for claim in ready)
        entries = {claim.entry for claim in ready}
        together = [name for name in due if name in entries]
        if together:
            self.claimer.claim(together, self.clock.now())
        self.sender.send(self.holdings.ready(self.clock.now()), self.pinned.sendable())
        return [name for name in due if name not in set(together)]

    def _register_again_after_a_lapse(self) -> None:
        """This beat's heartbeat lapsed (a stall, an outage): another beat's registration
        may have dropped it from the registrants of its entries, as a dead beat. It
        registers them again, so that an operator's prune and run now see that it schedules
        them (nothing else changes: the store merges what it knows, as at any
        registration): a chunk each tick from here on (Claimer.register_again_next), the
        heartbeat renewed and what falls due claimed in between, so that registering a
        large schedule again is not a lapse again."""
        if self.liveness.lapsed:
            self.liveness.lapsed = False
            self.claimer.register_again()

    def _claim_ahead(self) -> bool:
        """Claiming the next chunk in a thread hides the store's time only when a core is
        free to run that thread: a core for each beat of this host, one for the thread and
        one for the rest (the broker's and the store's clients, a local server). Measured on
        two cores, one beat and the servers local, the thread cost 2-7 %; two beats, 7-11 %
        (docs/benchmarks.md)."""
        if self.settings.claim_ahead is not None:
            return self.settings.claim_ahead
        return usable_cores() >= self.liveness.beats_here() + 2

    def _heartbeat_with_sweep(self) -> bool:
        """A sweep due ahead of the heartbeat (they fell out of step: a heartbeat alone
        after an error) takes the heartbeat with it once half an interval has passed: the
        round trip is the same, and the two are in step again."""
        interval = self.settings.heartbeat_interval
        return (self._ready and not self.store_outage.active
                and time.monotonic() - self._last_sweep >= interval
                and time.monotonic() - self.liveness.last >= interval / 2
                and self.liveness.settling_for() == 0)  # (settling: no sweep to take)

    def _sweep_due(self, heartbeat: bool) -> bool:
        """A sweep at least every heartbeat interval, and with a heartbeat once half of one
        has passed: the two keep step, and are asked in one round trip. Not early after an
        outage (every tick's heartbeat is due then): a sweep that failed the last tick
        waits its interval, and the ticks between claim and send."""
        since = time.monotonic() - self._last_sweep
        interval = self.settings.heartbeat_interval
        early = heartbeat and not self.store_outage.active
        return since >= interval or (early and since >= interval / 2)

    def _sleep_for(self) -> float:
        if self.claimer.again:  # registering again after a lapse: the next chunk at once
            return 0.0
        wait = self.max_interval
        for nxt in (self.claimer.next_due(), self.holdings.next_send(),
                    self.window.next_scan()):
            if nxt is not None:
                wait = min(wait, max(0.0, (nxt - self.clock.now()) / 1000))
        hb_wait = self.liveness.last + self.settings.heartbeat_interval - time.monotonic()
        return max(0.0, min(wait, hb_wait), self._sent_at + GATHER - time.monotonic())

    def _store_down(self, exc: Exception) -> float:
        self.sender.up_since = None
        self.metrics.store_up(False)
        self.liveness.lapse()  # the first thing after an outage: a heartbeat (epoch check)
        return self.store_outage.down(exc)

    def _went_back(self) -> float:
        """The store may have lost writes: what this beat knows is registered again
        (:class:`Reregistration`); nothing is claimed meanwhile."""
        self._ready = False
        self.reregistration.run(self.schedule)
        self._ready = True
        return max(0.0, min(self.liveness.settling_for() or self.max_interval,
                            self.max_interval))

    @property
    def _went_back_why(self) -> str | None:
        """Why the store may have lost writes, while this beat registers again."""
        return self.reregistration.why

    # -- publishing -------------------------------------------------------------------
    def _publish(self, entry: ScheduleEntry, claim: Claim, task_id: str) -> Any:
        """Publish one claimed occurrence (:meth:`Publisher.publish`): the hook a subclass
        or a test wraps."""
        return self.publisher.publish(entry, claim, task_id)

    # -- stop -------------------------------------------------------------------------
    def close(self) -> None:
        """Give back every claim not sent. Idempotent, and safe to re-enter from a signal.

        Called from Celery's signal handler, it does nothing: the handler raises SystemExit,
        the tick (if one was running) unwinds, no store call is cut in half, and Celery
        calls close() again on its way out, which gives back. Nothing that waits (a store
        call, the claim thread) runs inside a signal handler, where the code it interrupted
        may hold what that would wait for.
        """
        if self._closed or self._closing or self._in_tick or in_celery_stop_handler():
            return
        self._closing = True
        deferred = hold_stop_signals()
        try:
            try:
                # A claim still in flight in the claim thread lands first: then it is
                # among this beat's claims that give_back_all finds in the store.
                self.claimer.close()
                self.sender.give_back_all()
            except (StoreError, StoreConfigurationError) as exc:
                logger.warning("beat-claims: could not give back the claims this beat held"
                               " at stop (%s); they are taken back once its heartbeat"
                               " lapses", exc)
            self.holdings.clear()
            self.sender.up_since = None
            self.recovery.close()
            self._ready = False
            self._closed = True
        finally:
            self._closing = False
            deliver_held(deferred)
        super().close()

    @property
    def info(self) -> str:
        return self.store.description
