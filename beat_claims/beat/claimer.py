"""The heap of due instants, and claiming what is due.

Celery's heap is replaced by a heap of exact due instants, computed from each entry's
anchor and checkpoint as the store holds them. The heap is only a hint of what may be due:
a claim is a compare-and-set on the checkpoint it was computed from, and when the store
holds another, nothing is written and the beat computes again.
"""

from __future__ import annotations

import heapq
import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from .. import occurrences, schedule_words
from ..catch_up import plan
from ..enums import Overlap, Reason
from ..metrics import Metrics
from ..next_due import JITTER_WALK, horizon, next_instant
from ..runs import Owner, iso, task_id_for
from ..settings import Policy, Settings
from ..stores.base import (
    NOT_DUE,
    Claim,
    ClaimPlan,
    ClaimResult,
    ClaimStatus,
    EntrySeed,
    EntryState,
    SendAtOnce,
    Store,
)
from .holdings import Holdings
from .knowledge import TOKEN_GAP, Knowledge
from .liveness import StoreWentBack

#: Entries claimed in one call when many are due at once; beats sharing a burst each
#: start at their own share and then help with the rest, a chunk at a time.
CLAIM_CHUNK = 100
#: Entries registered in one store call (at start, after a change of many, after a lapse or
#: when the store went back): the call's time is bounded whatever the schedule's size
#: (about 0.2 s on Redis on a loaded 2-core VM), and the beat renews its heartbeat between
#: two calls. One call for 20,000 entries took 7 s, more than the TTL of a 1 s heartbeat.
REGISTER_CHUNK = 500
#: Compare-and-set conflicts retried in one tick (another beat claimed meanwhile).
CONFLICT_RETRIES = 5


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the system tells)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass(frozen=True)
class _Round:
    """One claim of a chunk of entries: the plans it was made of, and its results."""

    now: int
    plans: dict[str, tuple[ClaimPlan, Any]]
    future: Future[list[ClaimResult]]
    send: bool = False  # the caller publishes what it claims at once (SendAtOnce)
    #: When the claim call began (monotonic): its checks (SendAtOnce) are no younger.
    asked_at: float = 0.0


@dataclass(frozen=True)
class PolicyBounds:
    """The shortest windows over every entry's policy (computed once per schedule change:
    a sweep must not walk every entry's policy)."""

    reclaim_after: float
    run_timeout: float | None


class EntrySource(Protocol):
    """What the scheduler tells the claimer about its entries."""

    schedule: dict[str, Any]
    policies: dict[str, Policy]
    policy_bounds: PolicyBounds

    def bounds(self, name: str) -> tuple[int | None, int | None]: ...

    def version_of(self, name: str) -> int | None:
        """The version of the stored definition ``name`` is scheduled by (0: the store
        holds none of it); None when not known."""

    def take_up(self, names: list[str]) -> list[str]:
        """Hold, to claim a run of each that is due again, those of ``names`` that are
        dynamic entries not held now: the names now held."""

    def policies_of(self, names: list[str]) -> dict[str, Policy]:
        """The policies of those of ``names`` this beat does not hold that are dynamic
        entries, read from their definitions (a sweep judges their runs by them)."""

    def states_moved(self, names: list[str]) -> None:
        """The store's state of ``names`` moved under this beat (another's claim, or a
        change of their definitions, which moves the checkpoint): read what defines them
        again before planning from that state."""


class SkipLog:
    """What the store recorded skipped in one tick, logged as one line per reason."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.counts: dict[Reason, dict[str, int]] = defaultdict(dict)
        self.unlisted: dict[str, tuple[int, bool]] = {}

    def add(self, entry: str, reason: Reason, n: int = 1) -> None:
        per_entry = self.counts[reason]
        per_entry[entry] = per_entry.get(entry, 0) + n

    def add_unlisted(self, entry: str, n: int, exact: bool) -> None:
        """Skipped occurrences too old to be recorded one by one."""
        if n > 0:
            self.unlisted[entry] = (n, exact)

    def flush(self) -> None:
        for reason, per_entry in sorted(self.counts.items()):
            total = sum(per_entry.values())
            names = ", ".join(f"{name} ({n})" if n > 1 else name
                              for name, n in sorted(per_entry.items())[:5])
            more = f" and {len(per_entry) - 5} more" if len(per_entry) > 5 else ""
            self.logger.info("beat-claims: recorded %d occurrence(s) skipped (%s): %s%s",
                             total, reason.value, names, more)
        for entry, (n, exact) in sorted(self.unlisted.items()):
            self.logger.info("beat-claims: %s: %s%d older missed occurrence(s) skipped"
                             " without a record each (history_limit)", entry,
                             "" if exact else "at least ", n)
        self.counts.clear()
        self.unlisted.clear()


def _nothing() -> None:
    pass


class Claimer:
    def __init__(self, store: Store, owner: Owner, settings: Settings, source: EntrySource,
                 knowledge: Knowledge, holdings: Holdings, metrics: Metrics,
                 logger: logging.Logger, keep_alive: Callable[[], None] = _nothing) -> None:
        self.store = store
        #: Called between two store calls of a registration (Liveness.keep_alive: the
        #: beat's heartbeat is renewed from its own loop while it registers many entries).
        self.keep_alive = keep_alive
        self.metrics = metrics
        self.holdings = holdings
        self.owner = owner
        self.settings = settings
        self.source = source
        self.knowledge = knowledge
        self.logger = logger
        self.states: dict[str, EntryState] = {}
        self.refused: set[str] = set()  # entries the store would not register (yet)
        #: Entries still to be registered again after a lapse (:meth:`register_again`).
        self.again: list[str] = []
        #: Entries whose state this beat learned from the store and has not planned since:
        #: their definitions are read again first (EntrySource.states_moved).
        self.moved: set[str] = set()
        self.heap: list[tuple[int, str]] = []
        #: Next instants a claim's plan computed, for the push after it (see next_at).
        self._next_kept: dict[str, tuple[Any, tuple[Any, ...], int]] = {}
        #: Each entry's place on the heap (the instant it was pushed at): a place on the
        #: heap that is not it is stale (the entry was pushed again, or went), and is
        #: dropped when it comes up, so that moving one entry costs O(log N), not a rebuild.
        self.slots: dict[str, int] = {}
        self.skips = SkipLog(logger)
        self._noted: set[tuple[str, str]] = set()
        self._pool: ThreadPoolExecutor | None = None  # the claim thread (claim_chunks)
        #: A chunk claimed and sent at once asks the store to check its new occurrences
        #: before publish in the claim (SendAtOnce): one store call fewer a run. Off, they
        #: are checked by the sender's own call, as claims made ahead always are.
        self.check_with_claim = True
        self._pool_pid = 0  # the process it belongs to

    # -- entries ----------------------------------------------------------------------
    def register(self, names: Iterable[str], seeds: list[EntrySeed] | None = None,
                 repair: bool = False) -> None:
        """Register ``names`` (or the given seeds), with what this beat knows of each, and
        put each on the heap at its next occurrence. An entry the store refuses is tried
        again later (:meth:`retry_refused`). With ``repair`` the entry's record could not
        be read: its token floor leaves a gap, tokens nobody alive saw may exist.
        :data:`REGISTER_CHUNK` entries a store call, the heartbeat kept alive between two
        (:attr:`keep_alive`): registering many entries is not a stall."""
        if seeds is None:
            names = list(names)
            for start in range(0, len(names), REGISTER_CHUNK):
                if start:
                    self.keep_alive()
                self._register([self._seed(name, repair)
                                for name in names[start:start + REGISTER_CHUNK]])
            return
        for start in range(0, len(seeds), REGISTER_CHUNK):
            if start:
                self.keep_alive()
            self._register(seeds[start:start + REGISTER_CHUNK])

    def _register(self, seeds: list[EntrySeed]) -> None:
        """One store call of :meth:`register`."""
        states = self.store.register(seeds, self.owner)
        for seed in seeds:
            state = states.get(seed.name)
            if state is None:
                self.refused.add(seed.name)  # the store said why (logged there)
                self.slots.pop(seed.name, None)  # (off the heap until registered)
                continue
            self.refused.discard(seed.name)
            known = self.knowledge.entries.get(seed.name)
            if known is not None and known.anchor != state.anchor:
                self.note(seed.name, f"anchor {state.anchor}", logging.WARNING,
                          "beat-claims: %s: the store holds another anchor (%s) than this"
                          " beat knew (%s); following the store", seed.name,
                          iso(state.anchor), iso(known.anchor))
                self.knowledge.forget(seed.name)
            self.knowledge.learn(seed.name, state)
            self.states[seed.name] = state
            self.moved.add(seed.name)
        for name in states:  # (their old places on the heap, if any, are now stale)
            self.push(name)

    def retry_refused(self) -> None:
        """Register again the entries the store refused (a bad key since repaired)."""
        names = sorted(n for n in self.refused if n in self.source.schedule)
        self.refused &= set(names)
        if names:
            self.register(names)

    def sync(self, names: Iterable[str]) -> None:
        """The schedule is now ``names``: register the entries not registered yet, forget
        the ones gone (withdrawn in the store first: this beat no longer schedules them,
        and an operator's prune may remove them with their runs: what this beat wrote of
        them is no longer asked after), and rebuild the heap (bounds may have changed
        too)."""
        wanted = set(names)
        self._withdraw(set(self.states) - wanted)
        for gone in set(self.states) - wanted:
            del self.states[gone]
            self.knowledge.forget(gone)
            self._next_kept.pop(gone, None)
        new = sorted(wanted - set(self.states))
        if new:
            self.register(new)
        self.heap = []
        self.slots = {}
        for name in sorted(wanted & set(self.states)):
            self.push(name)

    def update(self, names: Iterable[str]) -> None:
        """Some entries of the schedule changed (``names``: added, changed or gone): what
        :meth:`sync` does, for them alone (a few rows of a large database changed: the work
        is in proportion to the change, not to the schedule)."""
        names = set(names)
        gone = {n for n in names if n in self.states and n not in self.source.schedule}
        self._withdraw(gone)
        for name in gone:
            del self.states[name]
            self.knowledge.forget(name)
            self.slots.pop(name, None)
            self._next_kept.pop(name, None)
        new = sorted(n for n in names if n in self.source.schedule and n not in self.states)
        if new:
            self.register(new)
        for name in sorted(names - gone - set(new)):
            self.push(name)  # (bounds and schedule may have changed)

    def adopt(self, states: dict[str, EntryState]) -> None:
        """Hold entries at the states the store's due index answered (dynamic entries this
        beat takes for now: never registered, every beat schedules them) and put each on
        the heap. A state older than one this beat knows means the store went back."""
        for name, state in states.items():
            problem = self.knowledge.learn(name, state)
            if problem is not None:
                raise StoreWentBack(f"entry {name!r}: {problem}")
            self.states[name] = state
            self.push(name)

    def let_go(self, names: Iterable[str]) -> None:
        """Forget entries held for now (:meth:`adopt`): nothing of them is held."""
        for name in names:
            self.states.pop(name, None)
            self.slots.pop(name, None)
            self._next_kept.pop(name, None)
            self.moved.discard(name)
            # (its newest writes, if any, stay asked after: the entry is still scheduled;
            # what is known of it is kept aside, for the store going back)
            self.knowledge.put_aside(name)

    def register_again(self) -> None:
        """Be recorded again as the registrant of the entries this beat schedules (after
        its heartbeat lapsed, another beat's registration may have dropped it). What this
        beat knows is merged in as at any registration; its view of the entries is left as
        it is (a claim compares it with the store's anyway). Done a chunk at a time by
        :meth:`register_again_next`, between the beat's claims: registering every entry
        in one go took longer than a heartbeat's TTL at a large schedule, and so lapsed
        again, for ever. (A lapse meanwhile starts it over: what was registered before it
        may have been dropped since.)"""
        self.again = sorted(n for n in self.states if n in self.source.schedule)

    def register_again_next(self) -> None:
        """Register again the next :data:`REGISTER_CHUNK` of :meth:`register_again`'s
        entries (one store call; those still scheduled). If the store does not answer, the
        same are asked again next time."""
        names = [n for n in self.again[:REGISTER_CHUNK]
                 if n in self.states and n in self.source.schedule]
        if names:
            self.store.register([self._seed(name) for name in names], self.owner)
        del self.again[:REGISTER_CHUNK]

    def _withdraw(self, gone: set[str]) -> None:
        """This beat no longer registers ``gone``: an operator's prune may remove them, and
        a run now is refused when no live beat schedules them. Before they are forgotten
        here: if the store does not answer, the next sync asks again."""
        if gone:
            self.store.unregister(self.owner, sorted(gone))

    def _seed(self, name: str, repair: bool = False) -> EntrySeed:
        known = self.knowledge.entries.get(name)
        description = schedule_words.describe(self.source.schedule[name].schedule)
        if known is None:
            return EntrySeed(name, description)
        return EntrySeed(name, description, known.anchor, known.checkpoint,
                         known.token + (TOKEN_GAP if repair else 0))

    def reset(self) -> None:
        self.states.clear()
        self.refused.clear()
        self.again = []
        self._next_kept.clear()
        self.heap = []
        self.slots = {}

    def push(self, name: str) -> None:
        """Put ``name`` on the heap at its next occurrence after its checkpoint (its place
        before, if any, is stale from now on)."""
        self.slots.pop(name, None)
        state = self.states.get(name)
        if state is None or name not in self.source.schedule:
            return
        try:
            at = self.next_at(name, state)
        except Exception as exc:
            self.note(name, "next", logging.ERROR, "beat-claims: cannot compute the next run"
                      " of %r (%s: %s); it is not scheduled", name, type(exc).__name__, exc)
            return
        if at == NOT_DUE:
            return  # no more occurrences (a one-off time that has passed), or past its end
        self.slots[name] = at
        heapq.heappush(self.heap, (at, name))
        if len(self.heap) > 2 * len(self.slots) + 1000:  # mostly stale places: compacted
            self.heap = [(t, n) for n, t in self.slots.items()]
            heapq.heapify(self.heap)

    def next_at(self, name: str, state: EntryState, keep: bool = False) -> int:
        """Where :meth:`push` puts ``name`` for ``state``: its next occurrence after the
        checkpoint (a jittered entry: when it next wakes), or NOT_DUE: none left, or past
        its ``until`` bound. What the due index holds for the entry. Raises what the
        schedule raises. With ``keep`` (a claim's plan computed it for the state after the
        claim), the next call for the same entry, state, bounds and policy (the push after
        the claim) answers it without computing it again (a crontab's next instant costs
        some 0.2 ms)."""
        entry = self.source.schedule[name]
        given = (state.anchor, self.after(name, state), self.source.bounds(name)[1],
                 self.source.policies[name])
        kept = self._next_kept.pop(name, None)
        if kept is not None and kept[0] is entry and kept[1] == given:
            return kept[2]
        at = next_instant(name, entry.schedule, *given)
        if keep:
            self._next_kept[name] = (entry, given, at)
        return at

    # -- jitter -----------------------------------------------------------------------
    # A jittered occurrence is sent at due + its offset (the same on every beat). Offsets
    # differ, so a later occurrence may be sent before an earlier one; the checkpoint only
    # moves forward, so to claim it the earlier ones are claimed with it and held until
    # their own instant, at most ``horizon`` ahead of it (half the entry's reclaim_after:
    # no beat takes back a claim held that long). An occurrence further out holds the
    # later ones back until it comes within the horizon: they are sent late, never lost.
    def _recent(self, name: str, anchor: int, after: int, upper: int, now: int,
                policy: Policy) -> tuple[list[int], list[int]]:
        """A jittered entry's occurrences in ``(after, upper]`` to claim now, ascending:
        those whose offset has come, and the earlier ones still to come (held until their
        instant). It stops at one beyond the horizon (nothing after it may be claimed
        yet); the ones still to come after the last that came are left for later."""
        sched = self.source.schedule[name].schedule
        limit = now + horizon(policy)
        walked: list[tuple[int, bool]] = []
        t = after
        for _ in range(JITTER_WALK):
            due = occurrences.next_after(sched, anchor, t)
            if due is None or due > upper:
                break
            at = due + occurrences.jitter_offset(name, due, policy.jitter)
            if at > limit:
                break
            walked.append((due, at <= now))
            t = due
        else:
            self.note(name, f"jitter walk {upper // 3_600_000}", logging.WARNING,
                      "beat-claims: %s: more than %d occurrences within its jitter (%ss);"
                      " some are sent after their offset", name, JITTER_WALK, policy.jitter)
        while walked and not walked[-1][1]:
            walked.pop()
        return [d for d, come in walked if come], [d for d, come in walked if not come]

    def after(self, name: str, state: EntryState) -> int:
        """The instant after which the entry's next occurrences are looked for.

        Interval and crontab arithmetic never goes below the anchor; a lower bound below it
        matters only to a schedule of absolute instants (a clocked time that passed before
        the store first saw the entry is a missed occurrence, for the catch-up policy).
        """
        not_before = self.source.bounds(name)[0]
        if state.checkpoint is None and not_before is not None:
            return not_before - 1
        after = occurrences.looked_after(self.source.schedule[name].schedule, state.anchor,
                                         state.checkpoint)
        if not_before is not None and not_before - 1 > after:
            after = not_before - 1
        return after

    def pop_due(self, now: int) -> list[str]:
        """The entries whose next instant has come, each once, in due order."""
        due: dict[str, None] = {}
        while self.heap and self.heap[0][0] <= now:
            at, name = heapq.heappop(self.heap)
            if self.slots.get(name) != at:
                continue  # a stale place
            del self.slots[name]  # (pushed again once handled)
            if name in self.source.schedule:
                due[name] = None
        return list(due)

    def due_count(self, now: int) -> int:
        """How many entries have an occurrence due (for a reminder during an outage)."""
        return sum(1 for at in self.slots.values() if at <= now)

    def next_due(self) -> int | None:
        while self.heap and self.slots.get(self.heap[0][1]) != self.heap[0][0]:
            heapq.heappop(self.heap)  # a stale place
        return self.heap[0][0] if self.heap else None

    # -- claiming ---------------------------------------------------------------------
    def shares(self, names: list[str], peers: list[str]) -> list[list[str]]:
        """Chunks of ``names`` in the order this beat claims them: its own share of the live
        beats' first, then the others' shares from their far end, to meet them halfway."""
        if len(names) <= CLAIM_CHUNK:
            return [names]
        order = names
        if len(peers) > 1 and self.owner.id in peers:
            order = sorted(names)
            rank, n = peers.index(self.owner.id), len(peers)
            start, end = rank * len(order) // n, (rank + 1) * len(order) // n
            order = order[start:end] + (order[end:] + order[:start])[::-1]
        return [order[i:i + CLAIM_CHUNK] for i in range(0, len(order), CLAIM_CHUNK)]

    def claim(self, names: list[str], now: int) -> tuple[list[Claim], list[Claim]]:
        """Claim what is due of ``names``: (new occurrences, runs that were due again)."""
        return self._finish(self._begin(names, now))

    def claim_chunks(self, chunks: list[list[str]], now: Callable[[], int],
                     claim_ahead: bool = True
                     ) -> Generator[tuple[list[Claim], list[Claim]], None, None]:
        """Claim chunk after chunk, as :meth:`claim` does each. With ``claim_ahead`` the
        store call of the next chunk is made in a thread of its own while the caller sends
        the current one: its reply is there when the caller asks for the next chunk, rather
        than the beat waiting on it between two chunks (worth it only with a core free for
        that thread). Whatever that call claimed is held once the generator is closed (a
        stop, an error), for the caller to send or give back; a reply that never came is
        the sweeps' to find (this beat's own claims whose reply it never had)."""
        ahead: _Round | None = None
        try:
            for i, chunk in enumerate(chunks):
                # Claimed here and sent next: checked before publish with the claim. (A
                # chunk claimed ahead waits for the one before it: checked when it is sent.)
                current = ahead if ahead is not None else self._begin(
                    chunk, now(), send=self.check_with_claim)
                ahead = None
                fresh, waited = self._finish(current)
                if claim_ahead and i + 1 < len(chunks):
                    ahead = self._begin(chunks[i + 1], now(), in_thread=True)
                yield fresh, waited
        finally:
            if ahead is not None:
                self._settle(ahead)

    def _begin(self, names: list[str], now: int, in_thread: bool = False,
               send: bool = False) -> _Round:
        """Plan ``names`` and make the first claim of them (in the claim thread: its reply
        is waited for by :meth:`_finish`). With ``send``, the caller publishes the new
        occurrences next: the store may check them before publish in the same call."""
        plans = self._plans([n for n in names if n in self.states], now, first=True,
                            send=send)
        items = [p for p, _ in plans.values()]
        future: Future[list[ClaimResult]] = Future()
        asked_at = time.monotonic()
        if not items:
            future.set_result([])
        elif in_thread:
            if self._pool is None or self._pool_pid != os.getpid():
                # (a forked child has the parent's pool but not its thread: a new one)
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="beat-claims-claim")
                self._pool_pid = os.getpid()
            future = self._pool.submit(self.store.claim, self.owner, items)
        else:
            future.set_result(self.store.claim(self.owner, items))
        return _Round(now, plans, future, send, asked_at)

    def _finish(self, first: _Round) -> tuple[list[Claim], list[Claim]]:
        """Take in a round's results, and claim again (at once) what met a conflict."""
        fresh: list[Claim] = []
        waited: list[Claim] = []
        plans = first.plans
        results = first.future.result()
        asked_at = first.asked_at
        for _attempt in range(1, CONFLICT_RETRIES):
            pending = [r.entry for r in results
                       if self._accept(r, plans[r.entry][1], fresh, waited, asked_at)]
            plans = self._plans(pending, first.now, first=False, send=first.send)
            if not plans:
                return fresh, waited
            asked_at = time.monotonic()
            results = self.store.claim(self.owner, [p for p, _ in plans.values()])
        for result in results:
            self._accept(result, plans[result.entry][1], fresh, waited, asked_at)
        return fresh, waited

    def _settle(self, round_: _Round) -> None:
        """Hold what a claim made ahead took, now that nobody will ask for it: the caller
        sends it later or gives it back (a stop, an outage of the broker). Never raises:
        it runs while another exception (a stop's SystemExit) is on its way out."""
        try:
            results = round_.future.result()
        except Exception as exc:  # found by the sweeps, and by close(), from the records
            self.logger.warning("beat-claims: the reply to a claim made ahead was lost"
                                " (%s: %s); its claims are taken back from the store's"
                                " records", type(exc).__name__, exc)
            return
        for result in results:
            try:
                self._accept(result, round_.plans[result.entry][1], [], [])
            except Exception as exc:  # the store went back: seen again at the next call
                self.logger.warning("beat-claims: %s: a claim made ahead could not be taken"
                                    " in (%s: %s)", result.entry, type(exc).__name__, exc)

    def _plans(self, names: list[str], now: int, first: bool, send: bool = False
               ) -> dict[str, tuple[ClaimPlan, Any]]:
        self.read_moved()
        plans: dict[str, tuple[ClaimPlan, Any]] = {}
        for name in names:
            if name not in self.source.schedule:
                continue  # (its definition went meanwhile)
            try:
                planned = self._plan(name, now, send)
            except Exception as exc:
                self.note(name, "plan", logging.ERROR, "beat-claims: cannot compute the"
                          " due runs of %r (%s: %s); trying again later", name,
                          type(exc).__name__, exc)
                continue
            if not first and not (planned[0].claim or planned[0].skip):
                # Another beat claimed what was due: nothing is left to write (its runs
                # due again, if any, are the sweeps' to take).
                continue
            plans[name] = planned
        return plans

    def read_moved(self) -> None:
        """Read again what defines the entries whose state this beat learned from the store
        and has not planned from since (:attr:`moved`): a state read from the store goes
        with the definition in force at it, one read after the state was (a change writes
        both at once). Done before planning, and by the scheduler as soon as it registered
        its entries: every one of them moved then, and the first burst after a start
        would otherwise wait on their definitions."""
        if not self.moved:
            return
        moved, self.moved = sorted(self.moved), set()
        try:
            self.source.states_moved(moved)
        except BaseException:
            self.moved.update(moved)
            raise

    def close(self) -> None:
        """Stop the claim thread (a claim made ahead has been settled by then)."""
        if self._pool is not None and self._pool_pid == os.getpid():
            self._pool.shutdown(wait=True)
        self._pool = None

    def take_due(self, names: Iterable[str]) -> list[Claim]:
        """Claim the runs of ``names`` that are due again (released, taken back,
        requested)."""
        plans = [ClaimPlan(name, None, token_floor=self._token_floor(name))
                 for name in sorted(set(names)) if name in self.states]
        waited: list[Claim] = []
        for result in self.store.claim(self.owner, plans):
            self._accept(result, None, [], waited)
        return waited

    def _token_floor(self, name: str) -> int:
        known = self.knowledge.entries.get(name)
        return known.token if known is not None else 0

    def _plan(self, name: str, now: int, send: bool = False) -> tuple[ClaimPlan, Any]:
        state = self.states[name]
        policy = self.source.policies[name]
        keep = max(policy.max_catch_up, self.settings.history_limit) + 1
        until = self.source.bounds(name)[1]
        upper = now if until is None else min(now, until)
        after = self.after(name, state)
        grace = self.settings.catch_up_grace
        pending: list[int] = []
        if policy.jitter:
            # Every occurrence due before now - jitter has come: the catch-up policy's
            # window. The ones since are walked one by one (see _recent). Sent up to the
            # jitter after its due instant, an occurrence is still on time.
            settled = max(after, min(upper, now - int(policy.jitter * 1000)))
            window = occurrences.due_between(self.source.schedule[name].schedule,
                                             state.anchor, after, settled, keep)
            come, pending = self._recent(name, state.anchor, settled, upper, now, policy)
            newest, total = window.newest + come, window.total + len(come)
            grace += policy.jitter
        else:
            window = occurrences.due_between(self.source.schedule[name].schedule,
                                             state.anchor, after, upper, keep)
            newest, total = window.newest, window.total
        decided = plan(policy, newest, total, now, int(grace * 1000),
                       self.settings.history_limit, window.exact)
        if pending:  # on time, and sent at their own instant: the policy has no say yet
            decided.run = sorted(decided.run + pending)
        at_once = None
        # Not runs that wait for their jittered instant (those whose instant has come are
        # sent now, as any), nor an entry with an overlap policy: a reply lost would leave
        # runs being sent that count as busy until taken back.
        if send and decided.run and not pending and policy.overlap is Overlap.ALLOW:
            at_once = SendAtOnce(tuple(task_id_for(name, due, self.settings.key_prefix)
                                       for due in decided.run), policy.overlap)
        return ClaimPlan(name, state, tuple(decided.run), tuple(decided.skip),
                         token_floor=self._token_floor(name), send=at_once,
                         next_due=self._next_due_after(name, state, decided),
                         version=self.source.version_of(name)), decided

    def _next_due_after(self, name: str, state: EntryState, decided: Any) -> int | None:
        """What the heap holds for ``name`` once the plan's claims and skips passed (the
        checkpoint moved to the last of them, as the store moves it): written to the due
        index with the claim. None (the index is left as it is) when it cannot be
        computed."""
        moved = [due for due in decided.run] + [due for due, _ in decided.skip]
        if state.checkpoint is not None:
            moved.append(state.checkpoint)
        after = EntryState(state.anchor, max(moved) if moved else None, state.token)
        try:
            return self.next_at(name, after, keep=True)
        except Exception:  # (noted when the heap is computed: push)
            return None

    def _accept(self, result: ClaimResult, decided: Any, fresh: list[Claim],
                waited: list[Claim], asked_at: float = 0.0) -> bool:
        """Take in one result; True when the entry must be planned again (a conflict).
        ``asked_at``: when its claim call began (monotonic), what its checks date from
        (the store calls made taking in the results before it do not make them younger)."""
        name = result.entry
        if result.status is ClaimStatus.MISSING:
            raise StoreWentBack(f"entry {name!r} is missing from the store")
        if result.status is ClaimStatus.CORRUPT:
            self.note(name, "corrupt", logging.ERROR, "beat-claims: %s: its record in the"
                      " store cannot be read (%s); repairing it from what this beat knows",
                      name, result.detail)
            self.register([name], repair=True)
            return False
        assert result.state is not None
        problem = self.knowledge.learn(name, result.state)
        if problem is not None:
            raise StoreWentBack(f"entry {name!r}: {problem}")
        self.states[name] = result.state
        if result.status is ClaimStatus.CONFLICT:
            self.moved.add(name)
            return True
        # Held as soon as the store answers: nothing this beat claimed is forgotten, even if
        # a later result of the same call stops it.
        self.holdings.hold(result.claims, waited=False)
        self.holdings.hold(result.taken, waited=True)
        for check in result.checked:
            self.holdings.prechecked[check.claim.ref] = (check, asked_at)
        self._defer(list(result.claims) + list(result.taken))
        self.knowledge.claimed(list(result.claims) + list(result.taken))
        fresh.extend(result.claims)
        waited.extend(result.taken)
        self.metrics.count("claimed", len(result.claims) + len(result.taken))
        self.metrics.count("skipped", len(result.skipped))
        for _, reason in result.skipped:
            self.skips.add(name, reason)
        self._learn_pause(name, result)
        if decided is not None and decided.unrecorded:
            self.skips.add_unlisted(name, decided.unrecorded, decided.unrecorded_exact)
        for due in result.unreadable:
            self.note(name, f"unreadable {due}", logging.ERROR, "beat-claims: %s due %s: its"
                      " record in the store cannot be read; it is left out of the store's"
                      " indexes (nothing will send it)", name, iso(due))
        for due in result.existing:
            self.note(name, f"existing {due}", logging.WARNING, "beat-claims: %s due %s"
                      " already has a run (an operator's, or one registered after a wipe):"
                      " it is not claimed again", name, iso(due))
        return False

    def _learn_pause(self, name: str, result: ClaimResult) -> None:
        """Keep what the store says of the entry's pause, to restore it if the store loses
        it (see KnownPauses.restore): paused when an occurrence was skipped for it,
        not paused when a scheduled one was claimed."""
        if result.claims or any(not c.manual for c in result.taken):  # (claims: scheduled)
            self.knowledge.paused.pop(name, None)
        elif name not in self.knowledge.paused and any(
                reason is Reason.PAUSED for _, reason in result.skipped):
            try:
                records = self.store.entries([name])
            except Exception as exc:  # a hint: known at the next skip
                self.logger.debug("beat-claims: %s: cannot read its pause: %s", name, exc)
                return
            for record in records:
                if record.name == name and record.paused is not None:
                    self.knowledge.paused[name] = record.paused

    def _defer(self, claims: list[Claim]) -> None:
        """A jittered entry's runs are not sent before due + offset (an operator's at
        once): held until then."""
        for claim in claims:
            policy = self.source.policies.get(claim.entry)
            if policy is not None and policy.jitter and not claim.manual:
                self.holdings.later[claim.ref] = claim.due + occurrences.jitter_offset(
                    claim.entry, claim.due, policy.jitter)

    def note(self, name: str, key: str, level: int, message: str, *args: Any) -> None:
        """Log a problem of one entry once (until the beat restarts)."""
        if (name, key) not in self._noted:
            if len(self._noted) > 10_000:
                self._noted.clear()
            self._noted.add((name, key))
            self.logger.log(level, message, *args)
