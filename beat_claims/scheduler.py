"""The beat side: a ``celery.beat.Scheduler`` that claims each occurrence before it sends it.

Celery's heap of entries is replaced by a heap of exact due instants; the store is the
truth. Each tick: renew the heartbeat, take over what dead or stopped beats left, claim
what is due (one atomic compare-and-set per entry, all entries of the tick in one round
trip), then for each claim check it is still ours immediately before publishing it.
"""

from __future__ import annotations

import heapq
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from celery import Celery, signals
from celery.backends.base import DisabledBackend
from celery.backends.rpc import RPCBackend
from celery.beat import ScheduleEntry, _evaluate_entry_args, _evaluate_entry_kwargs
from celery.beat import Scheduler as BaseScheduler
from celery.utils.log import get_logger
from redis.exceptions import RedisError

from . import occurrences
from .catch_up import plan
from .metrics import Metrics
from .runs import HEADER, Owner, Run, RunState, from_ms, iso, process_is_gone, task_id_for
from .settings import ConfigurationError, Policy, Settings
from .stores.base import Claim, ClaimRequest, ClaimResult, EntryState, Store
from .stores.redis import RedisStore

logger = get_logger("celery.beat.claims")

#: How often a beat looks for release notices when the release generation did not move.
RELEASED_SCAN_EVERY = 60.0
#: Claims checked before publish in one store round trip.
SEND_BATCH = 100
#: Entries claimed in one round trip when many are due at once; beats sharing a burst
#: each start at their own share and then help with the rest, a chunk at a time.
CLAIM_CHUNK = 100
MAX_BACKOFF = 30.0
#: Result backend states that settle a run.
BACKEND_STATES = {"SUCCESS": RunState.DONE, "FAILURE": RunState.FAILED,
                  "REVOKED": RunState.CANCELLED}


class ClaimsEntry(ScheduleEntry):
    """A schedule entry that also carries its ``claims`` policy overrides."""

    def __init__(self, *args: Any, claims: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.claims = claims
        super().__init__(*args, **kwargs)

    def __reduce__(self) -> Any:
        cls, args = super().__reduce__()[:2]
        return _rebuild_entry, (cls, args, self.claims)

    def update(self, other: ScheduleEntry) -> None:
        super().update(other)
        self.claims = getattr(other, "claims", None)

    def editable_fields_equal(self, other: Any) -> bool:
        return bool(super().editable_fields_equal(other)) and (
            self.claims == getattr(other, "claims", None))


def _rebuild_entry(cls: type, args: tuple[Any, ...], claims: Any) -> ClaimsEntry:
    entry: ClaimsEntry = cls(*args)
    entry.claims = claims
    return entry


class Scheduler(BaseScheduler):
    """Run ``beat_schedule`` from any number of beats at once; each occurrence is sent once."""

    Entry = ClaimsEntry

    def __init__(self, app: Celery, *args: Any, store: Store | None = None,
                 **kwargs: Any) -> None:
        self.settings = Settings.from_app(app)
        self.owner = Owner.current()
        self.store: Store = store or RedisStore.from_url(
            self.settings.url, self.settings.key_prefix,
            socket_timeout=max(1.0, self.settings.heartbeat_interval),
            sentinel_master=self.settings.sentinel_master,
        )
        self.metrics = Metrics()
        self.policies: dict[str, Policy] = {}
        self._state: dict[str, EntryState] = {}
        self._heap: list[tuple[int, str]] = []
        self._held: dict[tuple[str, int], Claim] = {}  # claimed, not yet sent
        self._unmarked: list[Claim] = []  # published; the "sent" mark is still to be stored
        self._checked: list[Claim] = []  # passed the check before publish; not yet published
        self._peers: list[str] = []  # ids of the live beats, as of the last sweep
        self._known_owners: list[str] = []  # every registered owner, as of the last sweep
        self._full_scan = True  # look for released runs in every entry at the next sweep
        self._open_scan = True  # look for open runs in every entry at the next sweep
        self._claiming: set[str] = set()  # entries with a claim call in flight
        self._offset_ms = 0
        self._last_heartbeat = float("-inf")
        self._last_sweep = float("-inf")
        self._last_released_scan = float("-inf")
        self._last_recovery = float("-inf")
        self._generation: int | None = None
        self._outage_since: float | None = None
        self._backoff = 0.0
        self._retry_at = 0.0
        self._closed = False
        self._closing = False
        self._in_tick = False
        self._ready = False
        super().__init__(app, *args, **kwargs)
        self.max_interval: float = min(float(self.max_interval),
                                       self.settings.heartbeat_interval)

    # -- setup ------------------------------------------------------------------------
    def setup_schedule(self) -> None:
        super().setup_schedule()
        self._read_policies()
        for name, policy in self.policies.items():
            if policy.overlap == "skip" and policy.run_timeout is None:
                logger.warning("beat-claims: entry %r has overlap=skip and no run_timeout: a"
                               " run whose outcome is never reported would skip every later"
                               " occurrence. Set claims['run_timeout'].", name)
        if self.settings.metrics_port is not None:
            self.metrics.start(self.settings.metrics_port)
        logger.info("beat-claims: owner %s, %d entries, store %s", self.owner,
                    len(self.schedule), self.info)

    def _read_policies(self) -> None:
        self.policies = {
            name: self.settings.policy_for(name, getattr(entry, "claims", None))
            for name, entry in self.schedule.items()
        }
        for name, entry in self.schedule.items():
            try:
                occurrences.next_after(entry.schedule, 0, 0)
            except occurrences.UnsupportedSchedule as exc:
                raise ConfigurationError(f"entry {name!r}: schedule {exc}") from None

    def entries_changed(self) -> None:
        """The schedule was changed in place (a schedule source that is edited while beat
        runs, such as a database): read policies again and, at the next tick, anchor new
        entries and rebuild the heap of due instants."""
        self._read_policies()
        self._ready = False

    def entry_state(self, name: str) -> EntryState | None:
        """The entry's anchor and checkpoint as this beat last read them from the store."""
        return self._state.get(name)

    def on_sent(self, entry: ScheduleEntry, claim: Claim) -> None:
        """Called after each successful publish; a schedule source may record it (a
        database's ``last_run_at``). It decides nothing: the store is the truth."""

    def bounds(self, name: str) -> tuple[int | None, int | None]:
        """(not before, not after) in UTC ms: occurrences outside are never due. A schedule
        source with start times or expiry dates overrides this."""
        return None, None

    def _prepare(self) -> None:
        """Anchor and read every entry; build the heap of next due instants."""
        names = sorted(self.schedule)
        described = [(n, occurrences.describe(self.schedule[n].schedule)) for n in names]
        self._state = self.store.ensure_entries(described)
        self._heap = []
        for name in names:
            self._push(name)
        self._full_scan = True  # the store may have been wiped or restored meanwhile
        self._open_scan = True
        self._last_recovery = float("-inf")
        self._ready = True

    def _push(self, name: str) -> None:
        state = self._state.get(name)
        if state is None:
            return
        after = self._after(name, state)
        try:
            nxt = occurrences.next_after(self.schedule[name].schedule, state.anchor, after)
        except Exception:
            logger.exception("beat-claims: cannot compute the next run of %r", name)
            nxt = self._now() + int(self.max_interval * 1000)
        if nxt is None:
            return  # the schedule has no more occurrences (a one-off time that has passed)
        until = self.bounds(name)[1]
        if until is not None and nxt > until:
            return
        heapq.heappush(self._heap, (nxt, name))

    def _after(self, name: str, state: EntryState) -> int:
        """The instant after which the entry's next occurrences are looked for.

        Interval and crontab arithmetic never goes below the anchor; a lower bound below it
        matters only to a schedule of absolute instants (a clocked time that passed before
        the store first saw the entry is a missed occurrence, for the catch-up policy).
        """
        not_before = self.bounds(name)[0]
        if state.checkpoint is None and not_before is not None:
            return not_before - 1
        after = state.checkpoint if state.checkpoint is not None else state.anchor
        if not_before is not None and not_before - 1 > after:
            after = not_before - 1
        return after

    # -- clock ------------------------------------------------------------------------
    def _now(self) -> int:
        """The store's clock, as estimated at the last heartbeat."""
        return int(time.time() * 1000) + self._offset_ms

    # -- the loop ---------------------------------------------------------------------
    def tick(self, *args: Any, **kwargs: Any) -> float:
        if self._closed:
            self._closed = False  # started again after close(): claim afresh
            self._last_heartbeat = float("-inf")
        mono = time.monotonic()
        if mono < self._retry_at:
            return self._retry_at - mono
        self._in_tick = True
        try:
            self._tick()
        except RedisError as exc:
            return self._store_down(exc)
        except Exception as exc:
            # A bug here must not stop the beat (its claims would wait for a takeover):
            # nothing unclaimed is sent; start again from the store, with backoff.
            logger.exception("beat-claims: unexpected error in a tick; starting again from"
                             " the store")
            return self._store_down(exc, quiet=True)
        finally:
            self._in_tick = False
        self.metrics.store_up(True)
        self.metrics.held(len(self._held))
        if self._outage_since is not None:
            logger.warning("beat-claims: store reachable again after %.1fs; catching up by"
                           " policy", time.monotonic() - self._outage_since)
            self._outage_since = None
            self._backoff = 0.0
        return self._sleep_for()

    def _tick(self) -> None:
        if not self._ready:
            self._prepare()
        mono = time.monotonic()
        if mono - self._last_heartbeat >= self.settings.heartbeat_interval:
            self._heartbeat()
        if self._held:  # left from an outage: send (or drop) them first
            self._send(sorted(self._held.values(), key=lambda c: (c.due, c.entry)))
        if mono - self._last_sweep >= self.settings.heartbeat_interval:
            self._sweep()
        now = self._now()
        due: dict[str, None] = {}  # ordered, unique
        while self._heap and self._heap[0][0] <= now:
            _, name = heapq.heappop(self._heap)
            if name in self.schedule:
                due[name] = None
        if due:
            try:
                self._claim_due(list(due), now)
            finally:  # each popped entry goes back once, at its next due instant
                for name in due:
                    self._push(name)

    def _sleep_for(self) -> float:
        now = self._now()
        wait = self.max_interval
        if self._heap:
            wait = min(wait, max(0.0, (self._heap[0][0] - now) / 1000))
        hb_wait = self._last_heartbeat + self.settings.heartbeat_interval - time.monotonic()
        return max(0.0, min(wait, hb_wait))

    def _store_down(self, exc: Exception, quiet: bool = False) -> float:
        if not quiet:
            self.metrics.store_up(False)
        if self._outage_since is None and not quiet:
            self._outage_since = time.monotonic()
            logger.error("beat-claims: store unreachable (%s: %s); nothing is sent unclaimed"
                         " until it returns. Retrying with backoff; logged once per outage.",
                         type(exc).__name__, exc)
        self._backoff = min(MAX_BACKOFF, max(0.5, self._backoff * 2))
        self._retry_at = time.monotonic() + self._backoff
        self._ready = False  # re-read anchors and checkpoints: the store may have been wiped
        self._last_heartbeat = float("-inf")
        return self._backoff

    # -- heartbeat and sweeps ---------------------------------------------------------
    def _heartbeat(self) -> None:
        before = time.time()
        generation, store_ms = self.store.heartbeat(self.owner, self.settings.heartbeat_ttl)
        after = time.time()
        self._offset_ms = store_ms - int((before + after) / 2 * 1000)
        self._last_heartbeat = time.monotonic()
        self.metrics.heartbeat()
        if generation != self._generation:
            self._generation = generation
            self._last_released_scan = float("-inf")

    def _heartbeat_if_due(self) -> None:
        """During a long burst of sends: keep looking alive, but only from this loop."""
        if time.monotonic() - self._last_heartbeat >= self.settings.heartbeat_interval / 2:
            self._heartbeat()

    def _sweep(self) -> None:
        """Take over claims of dead owners and abandoned claims; pick up released runs."""
        self._last_sweep = time.monotonic()
        now = self._now()
        if self._unmarked:  # published, but the "sent" mark did not reach the store
            self._flush_unmarked()
        # Our own note last: claims taken over in this sweep are not stale.
        owners, active = self.store.sweep_view(self._known_owners)
        self._known_owners = [owner.id for owner, _, _ in owners]
        self._peers = sorted(o.id for o, alive, _ in owners if alive or o.id == self.owner.id)
        for owner, alive, entries in sorted(owners, key=lambda o: o[0].id == self.owner.id):
            if owner.id == self.owner.id:
                busy = self._held_entries() | self._claiming
                busy |= {c.entry for c in self._unmarked}
                stale = [n for n in entries if n not in busy]
                if stale:  # claims whose reply this process never got
                    self._take_over(owner, stale, None, "this process's unanswered")
                continue
            dead = not alive or process_is_gone(owner.host, owner.pid, owner.started_at) is True
            if dead:
                self._take_over(owner, list(entries), None, "dead")
                self.store.drop_owner(owner.id)
                continue
            for name, since in entries.items():
                policy = self.policies.get(name)
                if policy is None:
                    continue
                reclaim_ms = int(policy.reclaim_after * 1000)
                if since <= now - reclaim_ms:
                    self._take_over(owner, [name], now - reclaim_ms, "slow")
        if time.monotonic() - self._last_released_scan >= RELEASED_SCAN_EVERY:
            self._pick_up_released(now)
        names = sorted(name for name in (self._state if self._open_scan else active)
                       if name in self.policies and name in self._state)
        self._mark_lost(now, names)
        if time.monotonic() - self._last_recovery >= 10 * self.settings.heartbeat_interval:
            self._last_recovery = time.monotonic()
            runs = self.store.open_runs(names)
            self._recover_outcomes(now, runs)
            self.store.settled({name: active[name] for name in names
                                if name in active and not runs.get(name)})
            if self._open_scan:  # open runs the index does not know of (an older version's)
                self.store.note_open([name for name in runs if name not in active])
            self._open_scan = False
        if self._held:
            self._send(sorted(self._held.values(), key=lambda c: (c.due, c.entry)))

    def _pick_up_released(self, now: int) -> None:
        """Claim runs that stopped beats released (or operators requested): where the
        notices say, or in every entry after a (re)start, in case the store was restored."""
        self._last_released_scan = time.monotonic()
        notices = self.store.released_in()
        names = sorted(self.schedule) if self._full_scan else sorted(
            name for name in notices if name in self.schedule)
        if names:
            for result in self._claim_batch([ClaimRequest(name, None) for name in names], now):
                self._hold(result.claims)
        # Each claim above took every released run of its entry: those notices are done.
        self.store.picked_up({name: notices[name] for name in names if name in notices})
        self._full_scan = False

    def _take_over(self, owner: Owner, names: list[str], cutoff: int | None, why: str) -> None:
        """Reclaim ``owner``'s claims in ``names``; what this beat cannot send (an entry it
        does not have, e.g. during a rolling deploy) is released for a beat that has it."""
        claims = self.store.reclaim(names, owner.id, self.owner, cutoff)
        foreign = [(c.entry, c.due) for c in claims if c.entry not in self.schedule]
        if foreign:
            self.store.release(self.owner, [], foreign)
        mine = [c for c in claims if c.entry in self.schedule]
        for name in sorted({c.entry for c in mine}):
            count = sum(1 for c in mine if c.entry == name)
            logger.warning("beat-claims: took over %d claim(s) of %r from %s owner %s",
                           count, name, why, owner)
        self.metrics.count("taken_over", len(mine))
        self._hold(mine)

    def _mark_lost(self, now: int, names: list[str]) -> None:
        cutoffs = {name: now - int(policy.run_timeout * 1000) for name in names
                   if (policy := self.policies[name]).run_timeout is not None}
        for name, dues in self.store.mark_lost(cutoffs).items():
            for due in dues:
                logger.warning("beat-claims: %s due %s: no outcome within run_timeout=%ss:"
                               " recorded lost", name, iso(due), self.policies[name].run_timeout)

    def _recover_outcomes(self, now: int, open_runs: dict[str, list[Run]]) -> None:
        """Runs still ``sent``/``started`` whose outcome no worker reported: ask the result
        backend by task id (works for workers without beat-claims' hooks)."""
        if not self.settings.result_backend_recovery or not self.app.conf.result_backend:
            return
        if isinstance(self.app.backend, (DisabledBackend, RPCBackend)):
            return  # results go to the sender's reply queue: nothing to look up here
        settle_ms = int(2 * self.settings.heartbeat_interval * 1000)
        for name, runs in open_runs.items():
            for run in runs:
                if run.state not in (RunState.SENT, RunState.STARTED) or not run.task_id:
                    continue
                if (run.sent_at or now) > now - settle_ms:
                    continue
                try:
                    result = self.app.AsyncResult(run.task_id)
                    backend_state = result.state
                    outcome = BACKEND_STATES.get(backend_state)
                    if outcome is None:
                        continue
                    exc = result.result if outcome is RunState.FAILED else None
                except Exception as exc2:
                    logger.debug("beat-claims: result backend lookup failed: %r", exc2)
                    return
                self._heartbeat_if_due()
                if self.store.finish(name, run.due, run.token, outcome.value,
                                     type(exc).__name__ if exc is not None else "",
                                     str(exc)[:500] if exc is not None else ""):
                    logger.info("beat-claims: %s due %s: %s (from the result backend)",
                                name, iso(run.due), outcome.value)

    # -- claiming ---------------------------------------------------------------------
    def _claim_batch(self, requests: list[ClaimRequest], now: int) -> list[ClaimResult]:
        names = {req.entry for req in requests}
        self._claiming |= names
        try:
            results = self.store.claim(self.owner, requests, self.settings.history_limit, now)
        finally:
            self._claiming -= names
        # Entries where nothing was claimed: this owner holds nothing there.
        holding = self._held_entries() | {c.entry for c in self._unmarked}
        empty = [r.entry for r in results if not r.claims and r.entry not in holding]
        self.store.done_claiming(self.owner, empty)
        return results

    def _request(self, name: str, now: int) -> tuple[ClaimRequest, int]:
        state = self._state[name]
        policy = self.policies[name]
        after = self._after(name, state)
        keep = max(policy.max_catch_up, self.settings.history_limit) + 1
        until = self.bounds(name)[1]
        due, total = occurrences.due_between(
            self.schedule[name].schedule, state.anchor, after,
            now if until is None else min(now, until), keep)
        decided = plan(policy, due, total, now, int(self.settings.catch_up_grace * 1000),
                       self.settings.history_limit)
        if decided.skip or decided.unrecorded:
            logger.info("beat-claims: %s: %d missed occurrence(s) skipped (catch_up=%s)",
                        name, len(decided.skip) + decided.unrecorded, policy.catch_up)
        request = ClaimRequest(name, state, decided.run, decided.skip, policy.overlap)
        return request, (due[-1] if due else after)

    def _claim_due(self, names: list[str], now: int) -> None:
        """Claim and send what is due, a chunk at a time, so that beats share a burst."""
        for chunk in self._shares(names):
            claims = self._claim_chunk(chunk, now)
            if claims:
                self._hold(claims)
                self._send(sorted(claims, key=lambda c: (c.due, c.entry)))

    def _shares(self, names: list[str]) -> list[list[str]]:
        """Chunks of ``names`` in the order this beat claims them: its own share of the live
        beats' first, then the others' shares from their far end, to meet them halfway."""
        if len(names) <= CLAIM_CHUNK:
            return [names]
        order = names
        if len(self._peers) > 1 and self.owner.id in self._peers:
            order = sorted(names)
            rank, n = self._peers.index(self.owner.id), len(self._peers)
            start, end = rank * len(order) // n, (rank + 1) * len(order) // n
            order = order[start:end] + (order[end:] + order[:start])[::-1]
        return [order[i:i + CLAIM_CHUNK] for i in range(0, len(order), CLAIM_CHUNK)]

    def _claim_chunk(self, names: list[str], now: int) -> list[Claim]:
        pending = names
        claims: list[Claim] = []
        for _attempt in range(5):
            planned = {}
            for name in pending:
                try:
                    planned[name] = self._request(name, now)
                except Exception:
                    logger.exception("beat-claims: cannot compute the due runs of %r; trying"
                                     " again later", name)
            requests = [req for req, _ in planned.values() if req.claim or req.skip]
            if not requests:
                break
            pending = []
            missing: list[str] = []
            for result in self._claim_batch(requests, now):
                if result.missing:
                    missing.append(result.entry)
                elif result.conflict is not None:
                    self._state[result.entry] = result.conflict
                    pending.append(result.entry)
                else:
                    state = self._state[result.entry]
                    self._state[result.entry] = EntryState(state.anchor,
                                                           planned[result.entry][1])
                    claims += result.claims
                    self.metrics.count("claimed", len(result.claims))
                    self.metrics.count("skipped", len(result.skipped))
                    for due, reason in result.skipped:
                        if reason == "overlap":
                            logger.info("beat-claims: %s due %s skipped: previous run still"
                                        " going (overlap=skip)", result.entry, iso(due))
            if missing:
                logger.warning("beat-claims: %d entr(ies) missing from the store (wiped?);"
                               " re-anchoring: they start from their next occurrence",
                               len(missing))
                described = [(n, occurrences.describe(self.schedule[n].schedule))
                             for n in missing]
                self._state.update(self.store.ensure_entries(described))
                pending += missing
            if not pending:
                break
        return claims

    def _held_entries(self) -> set[str]:
        return {entry for entry, _ in self._held}

    def _hold(self, claims: Iterable[Claim]) -> None:
        for claim in claims:
            self._held[(claim.entry, claim.due)] = claim

    # -- sending ----------------------------------------------------------------------
    def _send(self, claims: list[Claim]) -> None:
        """Check, publish and mark claims: one store round trip per batch of sends.

        Each batch is checked in one round trip, immediately before its publishes; the
        "sent" marks owed travel with the next batch's check. If publishing stalls (a
        paused VM, a slow broker) for half a heartbeat interval, the rest of the batch is
        checked again, so a beat that wakes after its claims were taken over sends at most
        the one message that was in flight. A beat that dies in between leaves those runs
        ``sending``, which other beats take over (and the worker's fencing runs each once).
        A claim is owed as soon as its publish returns; an exception on its way out (the
        SystemExit of a stop) leaves it owed, and close() stores it; claims checked and not
        yet published are released by close().
        """
        finished: set[str] = set()
        keys = list(dict.fromkeys((c.entry, c.due) for c in claims))
        for start in range(0, len(keys), SEND_BATCH):
            self._heartbeat_if_due()
            batch = [claim for key in keys[start:start + SEND_BATCH]
                     if (claim := self._sendable(key, finished)) is not None]
            queue = self._check(batch, finished)
            checked_at = time.monotonic()
            while queue:
                if time.monotonic() - checked_at > self.settings.heartbeat_interval / 2:
                    self._heartbeat_if_due()
                    queue = self._check(list(queue), finished)
                    checked_at = time.monotonic()
                    continue
                claim = queue.popleft()
                self._checked.pop(0)  # from here on, it may be published
                self._publish_one(claim)
                finished.add(claim.entry)
        # The last "sent" marks, and the entries where this beat holds nothing any more.
        self.store.mark_all_sent(self._unmarked, self.owner, finished - self._held_entries())
        self._unmarked.clear()

    def _check(self, claims: list[Claim], finished: set[str]) -> deque[Claim]:
        """The check before publish for ``claims``, in one round trip: those still ours."""
        self._checked = []
        if not claims:
            return deque()
        items = [(c, task_id_for(c.entry, c.due, self.settings.key_prefix)) for c in claims]
        answers = self.store.check_many(self.owner, items, tuple(self._unmarked))
        self._unmarked.clear()  # stored with the check (an error leaves them owed)
        for claim, (ok, why) in zip(claims, answers):
            if ok:
                self._checked.append(claim)
                continue
            self.metrics.count("not_sent")
            logger.warning("beat-claims: not sending %s due %s (token %d): %s",
                           claim.entry, iso(claim.due), claim.token, why)
            del self._held[(claim.entry, claim.due)]
            finished.add(claim.entry)
        return deque(self._checked)

    def _publish_one(self, claim: Claim) -> None:
        key = (claim.entry, claim.due)
        task_id = task_id_for(claim.entry, claim.due, self.settings.key_prefix)
        try:
            self._publish(self.schedule[claim.entry], claim, task_id)
        except Exception as exc:
            logger.error("beat-claims: publishing %s due %s failed, released for a"
                         " later try: %r", claim.entry, iso(claim.due), exc, exc_info=True)
            self.store.release(self.owner, [], [key])
            self.metrics.count("publish_failed")
        else:
            self._unmarked.append(claim)
            self.metrics.count("sent")
            try:
                self.on_sent(self.schedule[claim.entry], claim)
            except Exception:
                logger.exception("beat-claims: on_sent(%r) failed", claim.entry)
        del self._held[key]

    def _sendable(self, key: tuple[str, int], finished: set[str]) -> Claim | None:
        """The held claim for ``key`` if it is to be sent; give back or skip it otherwise."""
        claim = self._held.get(key)
        if claim is None:
            return None
        if claim.entry not in self.schedule:  # removed from the schedule while claimed
            self.store.release(self.owner, [], [key])
            del self._held[key]
            return None
        window = self.policies[claim.entry].catch_up_window
        if window is not None and claim.due < self._now() - int(window * 1000):
            # Released or taken over long ago (or held through an outage): the window
            # applies to these too.
            self.store.skip(self.owner, claim, "catch_up_window")
            self.metrics.count("skipped")
            logger.info("beat-claims: %s due %s skipped: older than catch_up_window",
                        claim.entry, iso(claim.due))
            del self._held[key]
            finished.add(claim.entry)
            return None
        return claim

    def _flush_unmarked(self) -> None:
        """Store the "sent" marks still owed. Until they are stored, this beat does not
        treat those runs as its own unanswered claims (which would send them again)."""
        if self._unmarked:
            self.store.mark_all_sent(self._unmarked)
            self._unmarked.clear()

    def _publish(self, entry: ScheduleEntry, claim: Claim, task_id: str) -> Any:
        if logger.isEnabledFor(logging.INFO):
            logger.info("Scheduler: Sending due task %s (%s) due %s token %d", entry.name,
                        entry.task, iso(claim.due), claim.token)
        # Copy, never mutate, the entry's options and headers (apply_async copies shallowly).
        options = dict(entry.options)
        headers = dict(options.get("headers") or {})
        headers["celery_beat_task"] = True
        headers["periodic_task_name"] = entry.name  # django-celery-results records it
        headers[HEADER] = {"entry": entry.name, "due": iso(claim.due), "token": claim.token}
        options["headers"] = headers
        options["task_id"] = task_id
        args = _evaluate_entry_args(entry.args)
        kwargs = _evaluate_entry_kwargs(entry.kwargs)
        task = self.app.tasks.get(entry.task)
        if task is not None:
            result = task.apply_async(args, kwargs, producer=self.producer, **options)
        else:
            result = self.send_task(entry.task, args, kwargs, producer=self.producer, **options)
        entry.last_run_at = from_ms(claim.due)
        entry.total_run_count += 1
        return result

    # -- stop -------------------------------------------------------------------------
    def close(self) -> None:
        """Release every claim not yet sent. Idempotent, and safe to re-enter from a signal.

        Called from Celery's signal handler in the middle of a tick, it does nothing: the
        handler raises SystemExit, the tick unwinds (no Redis command is cut in half), and
        Celery calls close() again on its way out, which releases.
        """
        if self._closed or self._closing or self._in_tick:
            return
        self._closing = True
        deferred = _hold_stop_signals()
        try:
            held = set(self._held)
            entries = {name for name, _ in held} | self._claiming
            if isinstance(self.store, RedisStore):
                # A signal may have cut a command in half: start from fresh connections.
                self.store.client.connection_pool.disconnect()
            try:
                self._flush_unmarked()
                # Checked but never handed to the broker: safe to give back even though they
                # passed the check (the one being published when the stop came is not here).
                unsent = [(c.entry, c.due) for c in self._checked]
                released = self.store.release(self.owner, entries, unsent)
                # The owner's note of its entries stays: a claim past its check before
                # publish (state "sending") is not released, and other beats take it over
                # at once now that this owner's heartbeat is gone.
                self.store.forget_owner(self.owner)
                if released:
                    self.metrics.count("released", released)
                    logger.info("beat-claims: released %d unsent claim(s)", released)
            except RedisError as exc:
                logger.warning("beat-claims: could not release the claims in %d entr(ies) at"
                               " stop (%s); they are taken over once this beat's heartbeat"
                               " expires", len(entries), exc)
            self._held.clear()
            self._checked.clear()
            self._claiming.clear()
            self._ready = False
            self._closed = True
        finally:
            self._closing = False
            _deliver_held(deferred)
        super().close()

    @property
    def info(self) -> str:
        url = self.settings.url
        if "@" in url:
            scheme, rest = url.split("://", 1)
            url = f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
        return f"{url} (prefix {self.settings.key_prefix!r})"


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


Held = tuple[dict[Any, Any], list[int]]


def _hold_stop_signals() -> Held | None:
    """Defer SIGTERM/SIGINT while close() releases claims: a second Ctrl-C must not cut
    the release short. (Blocking the signal in this thread is not enough: another thread
    may take it, and Python runs the handler here all the same.)"""
    if threading.current_thread() is not threading.main_thread():
        return None
    pending: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        pending.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in _STOP_SIGNALS}
    return previous, pending


def _deliver_held(held: Held | None) -> None:
    """Put the previous handlers back, then deliver what arrived meanwhile, once each."""
    if held is None:
        return
    previous, pending = held
    for sig, handler in previous.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    for sig in dict.fromkeys(pending):
        signal.raise_signal(sig)


@signals.beat_embedded_init.connect
def _stop_cleanly_when_embedded(sender: Any = None, **kwargs: Any) -> None:
    """``worker -B`` runs beat in a child process that is stopped with SIGTERM: exit
    through the normal path so that close() releases what this beat claimed."""
    if threading.current_thread() is not threading.main_thread():
        return
    scheduler = getattr(sender, "scheduler", None)
    if not isinstance(scheduler, Scheduler):
        return

    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit()

    signal.signal(signal.SIGTERM, _exit)
