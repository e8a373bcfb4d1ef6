"""The store contract: the shared truth every beat, worker and operator reads and writes.

Each method is a domain operation. Where it takes a sequence, each item is its own atomic
transition (a backend may send them in one round trip; that is not part of the contract).
Every write about a run is a compare-and-set on the run's fencing token, or on its state
where no token is known; no caller ever reads and then writes across two calls without
such a check.

What the contract promises, and every backend's contract suite checks
(``tests/contract/``):

* **Truth from records alone.** Every run that may need a beat (due again, claimed,
  being sent) and every open run (sent, started) can be found by :meth:`live_runs` and
  :meth:`open_runs` from the store's own records, written in the same atomic step as the
  run: no per-owner note, notice or cache is needed to find them.
* **Replies can be lost.** Every method may have been executed and still raise in the
  client. Each is safe to call again (claims are found again by :meth:`live_runs`; a check,
  a sent mark, a release, a reclaim and an outcome repeated with the same token do no harm).
* **Nothing goes back.** A checkpoint and a token counter only move forward, and a token is
  never below the store's clock times :data:`TOKENS_PER_MS` (so not even a store restored
  from an older copy hands one out twice); a final state
  is never rewritten (``lost`` only by a late start of the same token, or by the late
  outcome of a delivery that started it); a claim never overwrites a run already recorded
  at its instant.
* **Bad records are local.** A record that cannot be read affects its entry only: the
  other items of the call get their answers.
* **A definition changes by compare-and-set.** Each write names the version its writer
  read; the new version, the skips it plans, the checkpoint it moves and the entry's place
  in the change feed are written in one atomic step, so a change is never lost, never
  applied twice (its change id), and every reader of the feed sees it or is told to reload.
* **The due index follows the checkpoint.** Each
  entry's ``next_due`` (UTC ms) is written in the same atomic step as what it follows from
  (the claim whose checkpoint compare-and-set passed, the definition write, a sweep's
  :meth:`Store.index` conditional on the checkpoint and version it was computed from), and
  :meth:`Store.due` reads it in (``next_due``, name) order. What is claimed is always
  computed from the entry's checkpoint and claimed by compare-and-set on it, never from
  the index: so an index that is wrong can delay an occurrence, never send one twice. See
  :class:`DueEntry` for what an index older or newer than the records costs, and who
  repairs it.
"""

from __future__ import annotations

import abc
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..enums import Origin, Overlap, Reason, RunState, StartVerdict
from ..runs import Owner, Run, iso
from ..settings import entry_name_problem

#: Every token a claim hands out is at least the store's clock (UTC ms) times this. A store
#: put back from an older copy (any way: a file copied back, SQLite's backup API, a dump
#: loaded again, an older RDB, keys restored) still hands out tokens above every token it
#: handed out before, without remembering them: as long as its clock has not gone back
#: further than the copy's age. Ten a millisecond: room for as many claims of one entry
#: before its counter runs ahead of the clock, and a token stays under 10^14 (Redis's Lua
#: writes 14 significant digits of a number in JSON) until the year 2286.
TOKENS_PER_MS = 10


class StoreError(Exception):
    """The store cannot be reached or did not answer: an outage, not a bad record."""


class StoreConfigurationError(ValueError):
    """The store's URL or options cannot work (named in the message)."""


class BackfillRefused(ValueError):
    """A backfill the store refuses as asked, before it records anything (the message says
    why and what to do)."""

    def __init__(self, entry: str, created: int, live: int, limit: int) -> None:
        self.entry, self.created, self.live, self.limit = entry, created, live, limit
        room = max(0, limit - live)
        advice = (f"backfill at most {room} occurrence{'s' if room != 1 else ''} at a time"
                  if room else "let its unfinished runs finish first")
        super().__init__(
            f"a backfill of {entry} would create {created} runs beside its {live} unfinished"
            f" runs: more than the {limit} runs the store keeps of an entry"
            f" (beat_claims_history_limit={limit}), so runs already sent could be pushed out"
            f" of its history before they ran. Nothing was recorded: {advice} (a shorter"
            f" range; one backfill is also bounded by beat_claims_backfill_limit), or raise"
            f" beat_claims_history_limit")


class BackfillForgotten(BackfillRefused):
    """A backfill reaching instants the store holds no run of at or before the entry's
    history horizon (the newest instant whose run was trimmed out of its history): whether
    they ran is no longer known, so a run created there could run an occurrence a second
    time. Refused before anything is recorded; ``horizon`` None when the store's record of
    it cannot be read."""

    def __init__(self, entry: str, horizon: int | None, instants: int, limit: int) -> None:
        # (BackfillRefused's own message is about the size of a backfill: not called)
        ValueError.__init__(self, _forgotten_message(entry, horizon, instants, limit))
        self.entry, self.created, self.live, self.limit = entry, instants, 0, limit
        self.horizon = horizon


def _forgotten_message(entry: str, horizon: int | None, instants: int, limit: int) -> str:
    many = f"{instants} occurrence{'s' if instants != 1 else ''}"
    if horizon is None:
        return (f"a backfill of {entry} reaches {many} without a run in its history, whose"
                f" horizon (the newest instant trimmed out of it) cannot be read: whether"
                f" they ran cannot be known, so nothing was recorded"
                f" (beat_claims_history_limit={limit})")
    return (f"a backfill of {entry} reaches {many} at or before {iso(horizon)}, the newest"
            f" instant whose run was trimmed out of its history (beat_claims_history_limit="
            f"{limit} keeps the newest {limit} runs of an entry), and the history holds no"
            f" run of them: whether they ran is not known, so nothing was recorded. Backfill"
            f" from after {iso(horizon)} (raise beat_claims_history_limit to keep more of"
            f" the history from now on)")


# -- entries ------------------------------------------------------------------------------
@dataclass(frozen=True)
class EntryState:
    """What the store holds for one entry: its anchor and checkpoint (UTC ms) and the last
    token it handed out."""

    anchor: int
    checkpoint: int | None
    token: int = 0


# -- the due index ------------------------------------------------------------------------
#: ``next_due`` of an entry that is not due at all (its definition deleted or disabled, or
#: a schedule with no occurrence left): out of the due index, and not unindexed either.
NOT_DUE = -1
#: Later than any instant the due index holds (UTC ms): what reads up to its end ask for.
LATEST = 2 ** 53 - 1
#: ``next_due`` a store writes where the writer does not know it (a new entry registered,
#: a definition written without one): due at once, so the next :meth:`Store.due` answers
#: it and its reader computes the real instant (an index earlier than truth costs a read).
DUE_AT_ONCE = 0


def index_value(next_due: Any, what: str = "next_due") -> int:
    """``next_due`` as a store writes it (a whole number of UTC ms >= 0, or
    :data:`NOT_DUE`); else ValueError naming it, before anything is written."""
    if not _whole_number(next_due) or not (next_due >= 0 or next_due == NOT_DUE) or (
            next_due >= 2 ** 53):
        raise ValueError(f"{what} {next_due!r}: must be an instant (whole UTC ms >= 0) or"
                         f" NOT_DUE ({NOT_DUE})")
    return int(next_due)


def checked_plans(plans: Sequence[ClaimPlan]) -> list[ClaimPlan]:
    """``plans`` as a list, once every ``next_due`` and ``version`` is one a store can
    write; else ValueError naming the first that is not, before anything is written."""
    out = list(plans)
    for p in out:
        if p.next_due is not None:
            index_value(p.next_due, f"the claim of {p.entry!r:.80}: next_due")
        if p.version is not None and (not _whole_number(p.version) or p.version < 0):
            raise ValueError(f"the claim of {p.entry!r:.80}: version {p.version!r}: must"
                             f" be a definition version >= 0")
    return out


def checked_index_writes(writes: Sequence[IndexWrite]) -> list[IndexWrite]:
    """``writes`` as a list, once each is one a store can write (ValueError else)."""
    out = list(writes)
    for w in out:
        index_value(w.next_due, f"the index of {w.name!r:.80}: next_due")
        if not _whole_number(w.version) or w.version < 0:
            raise ValueError(f"the index of {w.name!r:.80}: version {w.version!r}: must be"
                             f" a definition version >= 0")
    return out


def due_cursor(before: int, limit: int, after: tuple[int, str] | None
               ) -> tuple[int, int, tuple[int, str] | None]:
    """:meth:`Store.due`'s arguments, checked where they enter (ValueError naming one)."""
    if not _whole_number(before):
        raise ValueError(f"before {before!r}: must be an instant (whole UTC ms)")
    limit = page_limit(limit, 1)
    if after is not None:
        due, name = after
        if not _whole_number(due) or not isinstance(name, str):
            raise ValueError(f"after {after!r}: must be (next_due, name) as answered")
        after = (int(due), name)
    return int(before), limit, after


@dataclass(frozen=True)
class DueEntry:
    """One entry of the due index, as :meth:`Store.due` answers it: its ``next_due`` (UTC
    ms) as indexed, and the entry's state and definition version read with it (``state``
    None: its record cannot be read, or is gone: an index written apart from its records,
    Redis keys put back one by one, which :meth:`Store.index` of the entry cleans up;
    ``version`` 0: it has no definition), so that the reader computes the occurrences and
    claims without a second read.

    The index is written in the same atomic step as the entry's checkpoint, so in a store
    that was never put back it is exact or earlier than truth (a claim by a writer that
    did not compute it leaves it where it was: earlier). A store put back from an older
    copy holds the index the copy held, consistent with the copy's records (the same
    atomic writes: on Redis one slot per bucket, on SQL one row); beats then raise
    checkpoints they know (register), which leaves the index earlier than truth. Either
    way the reader computes from the checkpoint and claims by compare-and-set on it:

    * an index **earlier** than truth costs one read: the reader finds nothing due yet,
      and writes the real instant back (:meth:`Store.index`, or its next claim does);
    * an index **later** than truth (a copy of keys restored one by one from different
      instants, a definition written by a version that does not know the index) delays
      the entry's occurrences until the indexed instant, never sends one twice. It is
      repaired by whoever writes the entry next (a claim, a definition write) and by the
      beats: one that follows the change feed indexes every entry whose definition
      changed, and one that finds the store went back (a new epoch) indexes every entry
      again (:meth:`Store.index`, paged by :meth:`Store.definitions`): the delay is bounded
      by that sweep's period.
    """

    name: str
    next_due: int
    state: EntryState | None
    version: int = 0


@dataclass(frozen=True)
class DueAhead:
    """What :meth:`Store.due_ahead` answers: the page :meth:`Store.due` answers
    (``entries``), and when it is short (it holds every entry due by ``before`` after the
    cursor) the index's first instant after ``before`` (``beyond``: when its reader reads
    again; None: the index holds none, or the page is full)."""

    entries: list[DueEntry]
    beyond: int | None


@dataclass(frozen=True)
class IndexWrite:
    """A sweep's (re)indexing of one entry: ``next_due`` (UTC ms >= 0, or
    :data:`NOT_DUE`) as computed from the entry's anchor and checkpoint (``expected``;
    its token is not compared) and from the definition at ``version`` (0: none). Written
    only if the store still holds that anchor, checkpoint and version: asked again after
    a lost reply it writes the same value again, and after anything moved it writes
    nothing."""

    name: str
    expected: EntryState
    version: int
    next_due: int


@dataclass(frozen=True)
class Unindexed:
    """A page of entries that have no ``next_due`` at all (written before the store kept
    the index, or by a version that does not know it): what a rebuild sweep indexes.
    ``cursor``: what to ask with next (opaque; "" starts over); ``complete``: the pass
    over every entry is done (the last page); ``looked_at``: the entries whose records the
    page read to find them (Redis: those of its scan step up to its last found, each once
    a pass), 0 where the store's own index answers only those without one (what a pass
    costs: see the sweeper's pace)."""

    names: tuple[str, ...]
    cursor: str
    complete: bool
    looked_at: int = 0


@dataclass(frozen=True)
class EntrySeed:
    """An entry a beat registers, with what the beat knows of it.

    A new entry is anchored at the store's clock (entries first seen together share the
    instant). After a wipe or a rollback the beat also passes what it knows: its anchor
    (kept only where the store has none), a checkpoint and a token floor (the store keeps
    the higher of its own and these) and the runs it knows of (restored only where the
    store has no record at their instant). The entry's token counter is raised to at least
    every token of those runs, restored or not: a store that went back in time never hands
    out a token it handed out before (a later run at such an instant — a backfill — gets a
    token above the one whose message may still be in flight).
    """

    name: str
    description: str = ""
    anchor: int | None = None
    checkpoint: int | None = None
    token: int = 0
    runs: tuple[Run, ...] = ()


@dataclass(frozen=True)
class Registrant:
    """A beat that registered an entry (it schedules it), and when (store clock, UTC ms)."""

    owner: str  # the beat's owner id
    at: int


@dataclass(frozen=True)
class Pause:
    """An operator's pause of an entry: who, why, since when (store clock, UTC ms; 0 when
    the stored instant cannot be read: the entry is paused all the same)."""

    by: str
    note: str
    at: int


@dataclass(frozen=True)
class EntryRecord:
    """An entry as operators see it.

    ``paused``: the pause in force (None when the entry is not paused). ``resumed_by`` and
    ``resumed_at``: the last resume, who and when; ``last_paused_at``: when the pause it
    ended had begun. ``[last_paused_at, resumed_at)`` is the entry's last pause: a
    scheduled occurrence due in it stays skipped (``paused``) even when it is claimed or
    checked after the resume (a beat that fell behind, jitter, an outage). Only the last
    pause is kept; a pause in force skips every scheduled occurrence, whenever due. (All
    instants are the store's clock, UTC ms.)

    ``registrants``: the beats that registered the entry and have not withdrawn it (see
    :meth:`Store.register`), those whose heartbeat had lapsed at the last registration
    left out; None when not known (registered before the store kept them, or a record that
    cannot be read). ``history_horizon``: the newest instant whose run was trimmed out of
    the entry's history (what ran at or before it is no longer known: see
    :meth:`Store.backfill`); None when nothing was trimmed (or its record cannot be read).
    """

    name: str
    description: str
    anchor: int | None
    checkpoint: int | None
    token: int
    paused: Pause | None = None
    resumed_by: str | None = None  # the last resume: who, and when (UTC ms)
    resumed_at: int | None = None
    last_paused_at: int | None = None  # when the pause the last resume ended began (UTC ms)
    registrants: tuple[Registrant, ...] | None = None
    history_horizon: int | None = None

    def paused_for(self, due: int) -> bool:
        """Whether a scheduled occurrence due at ``due`` is skipped for a pause: the entry
        is paused, or ``due`` falls in its last pause ``[last_paused_at, resumed_at)``."""
        return self.paused is not None or in_last_pause(due, self.last_paused_at,
                                                        self.resumed_at)


def registrants_from_json(raw: Any) -> tuple[Registrant, ...] | None:
    """An entry's registrants as a backend stores them (a JSON object, as text or decoded:
    owner id -> when), oldest first; None when there are none recorded or they cannot be
    read."""
    try:
        found = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except ValueError:
        return None
    if not isinstance(found, dict) or not all(
            isinstance(at, (int, float)) and not isinstance(at, bool) for at in found.values()):
        return None
    return tuple(sorted((Registrant(str(owner), int(at)) for owner, at in found.items()),
                        key=lambda r: (r.at, r.owner)))


def in_last_pause(due: int, last_paused_at: int | None, resumed_at: int | None) -> bool:
    """Whether ``due`` falls in the last pause ``[last_paused_at, resumed_at)``."""
    return (last_paused_at is not None and resumed_at is not None
            and last_paused_at <= due < resumed_at)


# -- claims -------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunRef:
    """One occurrence: (entry, due instant in UTC ms)."""

    entry: str
    due: int


@dataclass(frozen=True)
class Claim:
    """A run a beat holds, with the fencing token that proves it."""

    entry: str
    due: int
    token: int
    manual: bool = False  # an operator's request: never collapsed by the catch-up policy
    maybe_sent: bool = False  # reclaimed while being sent: a message may already exist
    attempts: int = 0  # publishes of this run that failed so far

    @property
    def ref(self) -> RunRef:
        # (made once: a beat looks its claims up by it several times a run; kept beside
        # the fields, which alone are compared, hashed and shown)
        ref: RunRef | None = self.__dict__.get("_ref")
        if ref is None:
            ref = self.__dict__["_ref"] = RunRef(self.entry, self.due)
        return ref


@dataclass(frozen=True)
class ClaimPlan:
    """One entry's part of a claim: occurrences to claim and to record skipped.

    ``expected`` is the state the plan was computed from: the new occurrences are written
    only if the store still holds that anchor and checkpoint (otherwise nothing is, and the
    result carries the store's state). ``None`` claims no new occurrence. With
    ``take_due``, runs of the entry that are due again (released, reclaimed, requested) are
    claimed too, and a ``waiting`` run once the entry has no run being sent, sent or
    started. No token handed out is at or below ``token_floor``. While the entry is paused,
    new occurrences and runs due again that are not an operator's request are recorded
    skipped (``paused``) instead, and reported in ``skipped``; so are those due in its last
    pause (``[last_paused_at, resumed_at)``, see :class:`EntryRecord`) after the resume.
    """

    entry: str
    expected: EntryState | None
    claim: tuple[int, ...] = ()
    skip: tuple[tuple[int, Reason], ...] = ()
    take_due: bool = True
    token_floor: int = 0
    #: The caller publishes the new occurrences at once: a backend may check them before
    #: publish in the claim's own atomic step (see :class:`SendAtOnce`).
    send: SendAtOnce | None = None
    #: The entry's next due instant after what the plan claims and skips, as the caller
    #: computed it from the definition (UTC ms, or :data:`NOT_DUE`; for an entry a beat
    #: looks at before or after the instant itself, jitter, the instant it looks at it
    #: next: the index says when to read the entry, never what to claim): written to the due
    #: index in the claim's atomic step, only when its compare-and-set on the checkpoint
    #: passes (with ``expected``; a CONFLICT writes nothing) and, with ``version``, only
    #: while the entry's definition is at that version (else the index is left as it is:
    #: a definition write indexed the entry itself). None: the index is left as it is.
    next_due: int | None = None
    version: int | None = None


@dataclass(frozen=True)
class SendAtOnce:
    """The check before publish of a plan's new occurrences, asked with their claim.

    The caller is about to publish them, so a check made in the claim's own atomic step
    is the check it would make right after the claim, with one store call fewer a run.
    Each claimed occurrence is then checked as :meth:`Store.check` would check
    ``Check(claim, task_id, None, overlap)``, in due order, and its answer is in
    :attr:`ClaimResult.checked`. Not while the entry has runs due again (released,
    requested, waiting: the plan takes them, and the caller checks them with the new ones
    in due order); and a backend may always leave ``checked`` empty: the caller then
    checks them itself. The holder may check a run so answered again, and gets the same
    answer, as after any check.
    """

    task_ids: tuple[str, ...]  # one for each instant of ``ClaimPlan.claim``, in its order
    overlap: Overlap = Overlap.ALLOW


class ClaimStatus(str, Enum):
    OK = "ok"
    CONFLICT = "conflict"  # the store holds another checkpoint: nothing new was written
    MISSING = "missing"  # the store has no such entry (never registered, or wiped)
    CORRUPT = "corrupt"  # the entry's record cannot be read: see ``detail``


@dataclass(frozen=True)
class ClaimResult:
    entry: str
    status: ClaimStatus
    state: EntryState | None = None  # the store's state after the call (or the conflict's)
    claims: tuple[Claim, ...] = ()  # new occurrences claimed
    taken: tuple[Claim, ...] = ()  # runs that were due again (released, reclaimed, requested)
    skipped: tuple[tuple[int, Reason], ...] = ()  # planned skips, and what a pause skipped
    existing: tuple[int, ...] = ()  # planned instants that already had a run: left as they are
    unreadable: tuple[int, ...] = ()  # runs whose record cannot be read: out of the indexes
    detail: str = ""
    #: With ``ClaimPlan.send``: the check before publish of each of ``claims`` (or empty:
    #: not checked, see :class:`SendAtOnce`).
    checked: tuple[CheckResult, ...] = ()


# -- the check before publish -------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    """The holder's last word on one claim, immediately before it publishes (or not).

    With ``skip`` the run is recorded skipped for that reason instead. An operator's
    requests (run now, backfill) are sent whatever the pause and overlap policy; for the
    others: a run of an entry that is paused, or due in its last pause (see
    :class:`EntryRecord`), is recorded skipped (``paused``), and when
    another run of the entry is being sent, sent or started, with ``overlap=SKIP`` the run
    is recorded skipped (``overlap``); with ``overlap=BUFFER_ONE`` it is recorded
    ``waiting`` (and any older waiting run of the entry skipped, ``overlap``; if a newer one
    waits, this one is skipped instead), to be claimed again once the entry has no such
    run — unless a scheduled run newer than it is the one being sent, sent or started: it
    comes too late to run after that one, and is recorded skipped (``overlap``) instead
    (an operator's run now or backfill is no newer occurrence: it is waited for).
    """

    claim: Claim
    task_id: str
    skip: Reason | None = None
    overlap: Overlap = Overlap.ALLOW


class CheckVerdict(str, Enum):
    SEND = "send"  # still ours and now ``sending``: publish it
    SKIPPED = "skipped"  # recorded skipped (``reason``)
    WAITING = "waiting"  # recorded waiting (overlap=BUFFER_ONE): not ours any more
    """Recorded waiting (overlap=BUFFER_ONE): not the holder's any more. Its holder checking
    it again (a lost reply) gets this answer whatever the overlap policy it asks with then
    (its settings may have been reloaded meanwhile): the answer says what the holder's
    first check did, and what the run is. It is not a refusal — nothing went wrong, and
    nobody else took the run — and it is no new decision either: the policy of the moment
    applies when a beat claims the run again (a fresh token) and checks it."""
    REFUSED = "refused"  # not ours any more, or not in a state to send (``why``)
    MISSING = "missing"  # the store has no record of a run we hold: it lost writes


@dataclass(frozen=True)
class CheckResult:
    claim: Claim
    verdict: CheckVerdict
    reason: Reason | None = None
    why: str = ""


@dataclass(frozen=True)
class Release:
    """Give a claim back: it is due again. With ``error`` its publish failed: the attempt
    is counted, and at the ``max_attempts``-th failed attempt the run is recorded failed
    (``publish_error``) instead."""

    claim: Claim
    error: str | None = None
    error_type: str = ""


# -- sweeps -------------------------------------------------------------------------------
@dataclass(frozen=True)
class LiveQuery:
    """What a sweep asks for: runs due again, and held claims that may need taking back.

    A held claim is reported when its owner is not in ``live_owners`` (claimed before
    ``dead_before``, a grace for owners registered since the caller's liveness read), when
    it was claimed or checked before ``held_before`` whoever holds it, or when ``owner``
    holds it since before ``mine_before`` (a claim whose reply that owner may never have
    had).
    """

    owner: str
    live_owners: frozenset[str]
    held_before: int
    mine_before: int
    dead_before: int
    limit: int = 10_000


@dataclass(frozen=True)
class HeldRun:
    entry: str
    due: int
    token: int
    owner: str
    since: int  # when it was claimed, or checked (UTC ms)


@dataclass(frozen=True)
class LiveRuns:
    due: tuple[RunRef, ...]
    held: tuple[HeldRun, ...]
    complete: bool = True  # False when a limit cut the answer short


@dataclass(frozen=True)
class OpenRun:
    entry: str
    due: int
    token: int
    state: RunState
    since: int  # sent, started or revived at (UTC ms): when the run was last active
    task_id: str | None


@dataclass(frozen=True)
class Reclaim:
    """Take a held claim back from its holder: it is due again, and its next claim gets a
    fresh token, so the holder's check before publish refuses it. ``token`` None: whatever
    token it has (an operator's release)."""

    entry: str
    due: int
    token: int | None


# -- outcomes -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """What became of a run. ``token`` None: the current one (the caller could not tell).

    ``LOST`` (a sweep's presumption) applies only if the run was not active at or after
    ``inactive_since``. With ``unstarted_only`` the outcome applies only to a run no
    delivery has started: a delivery revoked or expired before it ran must not change the
    record of another delivery that is running it.
    """

    entry: str
    due: int
    token: int | None
    state: RunState
    reason: Reason | None = None
    exc_type: str = ""
    exc_message: str = ""
    worker: str = ""
    inactive_since: int | None = None
    unstarted_only: bool = False


@dataclass(frozen=True)
class WorkerProcess:
    """The process that executes a delivery: node name, pid, and its identity on its host
    (``runs.process_identity``: a restarted worker with the same name and pid is another
    process, whatever the wall clock did)."""

    worker: str
    pid: int
    process: str


@dataclass(frozen=True)
class Delivery:
    """A worker is about to run a message of a run (entry, due, token from its header)."""

    entry: str
    due: int
    token: int
    process: WorkerProcess
    retries: int = 0
    task_id: str = ""
    takeover: WorkerProcess | None = None  # the process that started it, found gone


@dataclass(frozen=True)
class StartDecision:
    verdict: StartVerdict
    why: str = ""
    busy_with: WorkerProcess | None = None
    store_id: str = ""  # the store's id (Heartbeat.store_id): a message from another's beats

    @property
    def ok(self) -> bool:
        return self.verdict in (StartVerdict.RUN, StartVerdict.UNTRACKED)


# -- operators ----------------------------------------------------------------------------
@dataclass(frozen=True)
class BackfillResult:
    """What a backfill did: the instants it recorded due (manual), and those it left as
    they were, with the state of the run found there."""

    entry: str
    created: tuple[int, ...]
    kept: tuple[tuple[int, RunState], ...]


# -- definitions --------------------------------------------------------------------------
#: The largest definition the store keeps: its JSON text, encoded as UTF-8 (64 KiB). A
#: larger one is refused where it enters (:class:`WriteRefused`), before anything is
#: written.
MAX_DEFINITION_BYTES = 64 * 1024
#: The longest ``by`` and ``change_id`` of a definition write (characters).
MAX_CHANGE_TEXT = 200
#: How long a deleted entry's tombstone stays in the change feed after its delete (ms): a
#: day. Then a later definition write drops it from the feed (on Redis, the next one of
#: its bucket; the tombstone stays on the entry's record until a prune removes it); a
#: reader whose cursor is older than a tombstone dropped so is answered ``reload``
#: (:class:`Changes`).
TOMBSTONE_KEPT_MS = 24 * 3600 * 1000
#: Tombstones older than TOMBSTONE_KEPT_MS one write drops from the change feed at most.
TOMBSTONES_DROPPED = 100
#: A change's sequence number is at least the store's clock (UTC ms) times this: a store put
#: back from an older copy numbers its next changes above every one it numbered before (as
#: it hands out tokens: :data:`TOKENS_PER_MS`), and exactly within 2^53 until the year 2255.
CHANGES_PER_MS = 1000
#: The most definitions, or changes, one read answers: a reader pages.
MAX_PAGE = 10_000


def page_limit(limit: int, least: int) -> int:
    """A read's ``limit``, once it is a whole number from ``least`` to :data:`MAX_PAGE`;
    else ValueError naming it (refused where it enters, before anything is read)."""
    if not _whole_number(limit) or not least <= limit <= MAX_PAGE:
        raise ValueError(f"limit {limit!r}: must be a whole number from {least} to"
                         f" {MAX_PAGE} (read in pages)")
    return limit


class WriteStatus(str, Enum):
    """What became of one definition write."""

    OK = "ok"  # written (or written before, with the same change id: nothing more)
    CONFLICT = "conflict"  # the version or the checkpoint moved: nothing was written
    EXISTS = "exists"  # a create (expected version 0) of an entry with a live definition
    MISSING = "missing"  # an update or delete of an entry without a definition (or a tombstone)
    CORRUPT = "corrupt"  # the entry's record cannot be read: see ``detail``


@dataclass(frozen=True)
class StoredDefinition:
    """An entry's definition as the store holds it.

    ``definition``: its JSON text, opaque to the store; None for a tombstone (``deleted``).
    ``version``: 1 on create, one more at each change (a delete too), never reused while
    the entry's record lives. ``changed_by``, ``changed_at`` (store clock, UTC ms) and
    ``origin``: the last change's. ``corrupt``: why the record cannot be read ('' when it
    can); then ``definition`` is None, ``deleted`` False, and what could not be read is
    0, '' or :attr:`Origin.API`. A corrupt definition whose version can be read is replaced
    by a write that names that version.
    """

    name: str
    definition: str | None
    version: int
    origin: Origin
    changed_by: str
    changed_at: int
    deleted: bool
    corrupt: str = ""


@dataclass(frozen=True)
class DefinitionWrite:
    """One change of an entry's definition: a compare-and-set on the version its caller read.

    ``definition`` None deletes it (a tombstone, with its own version). ``expected_version``
    0 creates it: the entry must have no definition, or a tombstone; an entry a beat
    registered from its ``beat_schedule`` alone has none. An entry that does not exist yet
    is created, anchored at the store's clock as :meth:`Store.register` anchors. ``skip``:
    occurrences of the old definition the change skips (due after the checkpoint, with no
    run yet), recorded skipped as a claim's planned skips are; ``checkpoint``: where the
    change moves the checkpoint (never back; None: leave it); with ``expected_checkpoint``
    the write is also a compare-and-set on the checkpoint. Written again with the same
    ``change_id`` (after a lost reply) while it is the entry's last change, it answers the
    same and changes nothing ('' : no id, every write is a new change).
    """

    name: str
    definition: str | None
    expected_version: int
    origin: Origin
    by: str
    change_id: str = ""
    skip: tuple[tuple[int, Reason], ...] = ()
    checkpoint: int | None = None
    expected_checkpoint: int | None = None
    #: The entry's first due instant under the new definition after the change (UTC ms,
    #: or :data:`NOT_DUE`: disabled, no occurrence left), computed by the caller: written
    #: to the due index with the change. None: not known, indexed :data:`DUE_AT_ONCE`
    #: (the next beat to read what is due computes it). A delete always takes the entry
    #: out of the index.
    next_due: int | None = None


@dataclass(frozen=True)
class DefinitionResult:
    """One write's answer. ``version``: the entry's version after the write (OK), or the
    store's (0: none). ``state``: the entry's anchor, checkpoint and token after the write,
    or the store's (None: no such entry, or unreadable). ``current``: the definition the
    store holds now (None: none, nor a tombstone)."""

    name: str
    status: WriteStatus
    version: int
    state: EntryState | None = None
    current: StoredDefinition | None = None
    detail: str = ""


@dataclass(frozen=True)
class ChangeCursor:
    """Where a reader of the change feed is: opaque to callers. One position per change log
    (one per bucket of the Redis store, one in SQL): the last sequence number read, and the
    entry read last with its sequence number (a store that went back no longer holds it
    there)."""

    positions: tuple[tuple[int, str, int], ...]


@dataclass(frozen=True)
class Changes:
    """What :meth:`Store.changes` answers: the entries whose definition changed after the
    caller's cursor, each once, as the store holds them now (``changed``), and the cursor to
    ask with next. ``reload``: the caller must read every definition again
    (:meth:`Store.definitions`, paged) and follow from ``cursor`` (the feed's head when it
    answered): it asked without a cursor, or its cursor is older than what the feed keeps
    (a tombstone dropped from it), or the store went back (it no longer holds what the
    cursor read: a copy put back). ``complete``: False when ``limit`` cut the answer
    short (ask again at once)."""

    cursor: ChangeCursor
    changed: tuple[StoredDefinition, ...]
    reload: bool
    complete: bool


class WriteRefused(ValueError):
    """A definition write refused where it enters (the message names the entry, the field
    and the value): nothing of the call was written."""


def checked_writes(writes: Sequence[DefinitionWrite], history_limit: int
                   ) -> list[DefinitionWrite]:
    """``writes`` as a list, once each is one the store can keep, else :class:`WriteRefused`
    naming the first that is not: a name that cannot be stored, a definition larger than
    :data:`MAX_DEFINITION_BYTES` (or not text), a version below 0, a delete that names no
    version, an origin that is not an :class:`Origin`, ``by`` or ``change_id`` longer than
    :data:`MAX_CHANGE_TEXT`, more skips than the history keeps (``history_limit``)."""
    out = list(writes)
    for w in out:
        problem = _write_problem(w, history_limit)
        if problem:
            raise WriteRefused(f"the definition of {w.name!r:.80}: {problem}; nothing was"
                               f" written")
    return out


def _write_problem(w: DefinitionWrite, history_limit: int) -> str:
    name = entry_name_problem(w.name)
    if name:
        return name
    if w.definition is not None:
        if not isinstance(w.definition, str) or not w.definition:
            return f"definition {w.definition!r:.80}: must be JSON text"
        try:
            size = len(w.definition.encode("utf-8"))
        except UnicodeEncodeError as exc:
            return f"definition: cannot be stored (not valid Unicode text at {exc.start})"
        if size > MAX_DEFINITION_BYTES:
            return (f"definition of {size} bytes: larger than {MAX_DEFINITION_BYTES} bytes"
                    f" (MAX_DEFINITION_BYTES)")
    if not _whole_number(w.expected_version) or w.expected_version < 0:
        return f"expected_version {w.expected_version!r}: must be a version >= 0"
    if w.definition is None and w.expected_version == 0:
        return "a delete names the version it deletes (expected_version 0 creates)"
    if not isinstance(w.origin, Origin):
        return f"origin {w.origin!r}: must be one of {', '.join(o.value for o in Origin)}"
    for what, text in (("by", w.by), ("change_id", w.change_id)):
        if not isinstance(text, str) or len(text) > MAX_CHANGE_TEXT:
            return f"{what} {text!r:.80}: must be text of at most {MAX_CHANGE_TEXT} characters"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return f"{what} {text!r:.80}: cannot be stored (not valid Unicode text)"
    if len(w.skip) > history_limit:
        return (f"{len(w.skip)} skipped occurrences: more than the {history_limit} runs the"
                f" store keeps of an entry (beat_claims_history_limit): record the newest"
                f" and count the others")
    for due, reason in w.skip:
        if not _whole_number(due) or not isinstance(reason, Reason):
            return f"skip ({due!r}, {reason!r}): must be (instant in UTC ms, Reason)"
    for what, instant in (("checkpoint", w.checkpoint),
                          ("expected_checkpoint", w.expected_checkpoint)):
        if instant is not None and not _whole_number(instant):
            return f"{what} {instant!r}: must be an instant in UTC ms"
    if w.next_due is not None:
        try:
            index_value(w.next_due)
        except ValueError as exc:
            return str(exc)
    return ""


def written_next_due(w: DefinitionWrite) -> int:
    """What a definition write puts in the due index: out of it for a delete, else its
    ``next_due``, or :data:`DUE_AT_ONCE` when it names none."""
    if w.definition is None:
        return NOT_DUE
    return DUE_AT_ONCE if w.next_due is None else w.next_due


def _whole_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2 ** 53


def stored_definition(name: str, definition: Any, version: Any, origin: Any,
                      changed_by: Any, changed_at: Any) -> StoredDefinition:
    """An entry's definition from its stored fields, as a backend reads them (text or bytes
    or numbers; None where a field is absent). One that cannot be read (a version that is
    not a whole number >= 1, a definition that is not JSON text, an origin that is not an
    :class:`Origin`, an instant that is not a number) is answered ``corrupt``, naming the
    field: never taken on trust."""
    problems = []
    number = _stored_whole(version)
    if number is None or number < 1:
        problems.append(f"version {_shown(version)}")
    if definition is not None:
        # (never the text itself: it holds the entry's arguments)
        problem = _unreadable_text(definition)
        if problem:
            problems.append(f"definition ({problem})")
            definition = None
        elif isinstance(definition, bytes):
            definition = definition.decode("utf-8")
    try:
        kind = Origin(origin.decode() if isinstance(origin, bytes) else origin)
    except (ValueError, UnicodeDecodeError):
        problems.append(f"origin {_shown(origin)}")
        kind = Origin.API
    at = _stored_whole(changed_at)
    if at is None:
        problems.append(f"changed_at {_shown(changed_at)}")
    by = changed_by.decode("utf-8", "replace") if isinstance(changed_by, bytes) else changed_by
    corrupt = ("unreadable " + ", ".join(problems)) if problems else ""
    return StoredDefinition(name, None if corrupt else definition,
                            number if number is not None and number >= 1 else 0, kind,
                            str(by or ""), at or 0, not corrupt and definition is None,
                            corrupt)


def _unreadable_text(definition: Any) -> str:
    """Why a stored definition is not JSON text ('' : it is), without a word of it."""
    if isinstance(definition, bytes):
        try:
            definition = definition.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"not UTF-8 text at byte {exc.start}"
    if not isinstance(definition, str):
        return f"a {type(definition).__name__}, not text"
    try:
        json.loads(definition)
    except RecursionError:
        return "JSON nested too deeply"
    except ValueError as exc:
        where = f" at character {exc.pos}" if isinstance(exc, json.JSONDecodeError) else ""
        return f"not JSON{where}"
    return ""


def _stored_whole(value: Any) -> int | None:
    """A whole number as a backend stores it (an int, or its text: '5', '5.0'); None when it
    is none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) < 2 ** 53 else None
    try:
        number = float(value.decode() if isinstance(value, bytes) else value)
    except (TypeError, ValueError, UnicodeDecodeError):
        return None
    if not math.isfinite(number) or not number.is_integer() or abs(number) >= 2 ** 53:
        return None
    return int(number)


def _shown(value: Any) -> str:
    return f"{value!r:.60}"


def definition_result(write: DefinitionWrite, status: WriteStatus, state: EntryState | None,
                      stored: Sequence[Any] | None, detail: str = "") -> DefinitionResult:
    """A write's result from what a backend answered: the status, the entry's state, and its
    definition's stored fields after the call (definition, version, origin, changed_by,
    changed_at; None or a version of None: the entry has none, nor a tombstone). An OK
    write's definition is the one it wrote (a backend need not send it back)."""
    current = None
    if stored is not None and (stored[1] is not None or stored[0] is not None):
        definition = write.definition if status is WriteStatus.OK else stored[0]
        current = stored_definition(write.name, definition, *stored[1:5])
    return DefinitionResult(write.name, status, current.version if current else 0, state,
                            current, detail)


@dataclass(frozen=True)
class LogRead:
    """One change log as a backend read it in one atomic step, for :func:`follow`.

    ``head``: the last sequence number it handed out (0: none); ``dropped``: the newest
    sequence number of a member it dropped (a tombstone kept its time, a pruned entry; 0:
    none); ``top``: its newest member (name, seq; ('', 0) when empty); ``seen``: the
    sequence number the log now holds for the cursor's entry (None: not there, or no
    entry named); ``members``: its members after the cursor's position, oldest first, at
    most ``limit`` + 1 (name, seq)."""

    head: int
    dropped: int
    top: tuple[str, int]
    seen: int | None
    members: tuple[tuple[str, int], ...]


def follow(cursor: ChangeCursor | None, reads: Sequence[LogRead], limit: int
           ) -> tuple[ChangeCursor, list[tuple[str, int]], bool, bool]:
    """The change feed's answer from what each log read (``reads``, in the cursor's order):
    the next cursor, the members taken (name, sequence number: at most ``limit``, oldest
    first), whether the reader must reload, and whether the answer is complete. Reload
    without a cursor (or one of another store's shape), when a log is behind the cursor
    (its head below the position, or the cursor's entry there at an older sequence number,
    or gone without being dropped: the store went back), or when it dropped a member after
    the position (a tombstone dropped, a pruned entry): then the cursor is every log's
    head, and nothing is taken."""
    positions = cursor.positions if cursor is not None else ()
    reload = len(positions) != len(reads)
    for (position, name, name_seq), read in zip(positions, reads):
        went_back = read.head < position or (name != "" and (
            (read.seen is None and read.dropped < name_seq)
            or (read.seen is not None and read.seen < name_seq)))
        if went_back or read.dropped > position:
            reload = True
    if reload:
        heads = tuple((read.head, *read.top) for read in reads)
        return ChangeCursor(heads), [], True, True
    every = sorted((seq, i, member) for i, read in enumerate(reads)
                   for member, seq in read.members)
    chosen = every[:limit]
    taken: list[list[tuple[str, int]]] = [[] for _ in reads]
    for seq, i, member in chosen:
        taken[i].append((member, seq))
    out = []
    for (position, name, name_seq), read, mine in zip(positions, reads, taken):
        if mine:
            name, name_seq = mine[-1]
        whole = len(mine) == len(read.members) and len(read.members) <= limit
        out.append((read.head if whole else (mine[-1][1] if mine else position),
                    name, name_seq))
    return (ChangeCursor(tuple(out)), [(member, seq) for seq, _, member in chosen], False,
            len(every) <= limit)


# -- the due index: a rebuild sweep's page -------------------------------------------------
@dataclass(frozen=True)
class RebuildPage:
    """What one page of a rebuild sweep did (:func:`rebuild_page`): the cursor to go on
    from, whether the pass is complete, and the entries it indexed, found moved (their
    writer indexed them, or will), and left (``next_due_of`` answered None, or a record
    that cannot be read: another caller's, or the next pass's); ``looked_at``: as
    :attr:`Unindexed.looked_at`."""

    cursor: str
    complete: bool
    indexed: tuple[str, ...]
    moved: tuple[str, ...]
    left: tuple[str, ...]
    looked_at: int = 0


def rebuild_page(store: Store,
                 next_due_of: Callable[[str, EntryRecord, StoredDefinition | None],
                                       int | None],
                 cursor: str = "", limit: int = 1000) -> RebuildPage:
    """One page of a rebuild sweep: the next ``limit`` entries with no ``next_due`` at all
    (:meth:`Store.unindexed` from ``cursor``), their state and definition read, each
    one's next due instant computed by ``next_due_of(name, record, definition)`` (an
    instant, :data:`NOT_DUE`, or None: this caller cannot tell, the entry is left), and
    written by :meth:`Store.index`, conditional on the anchor, checkpoint and version it
    was computed from (read apart: an entry that moved between the reads, or since, is
    written nothing, and whoever moved it wrote its instant, or leaves it earlier than
    truth). Three round trips and a write; safe to repeat (a lost reply: the same writes
    again, or nothing)."""
    page = store.unindexed(limit, cursor)
    names = list(page.names)
    records = {r.name: r for r in store.entries(names)} if names else {}
    found = {d.name: d for d in store.definitions(names)} if names else {}
    writes: list[IndexWrite] = []
    left: list[str] = []
    for name in names:
        record, definition = records.get(name), found.get(name)
        readable = record is not None and record.anchor is not None and not (
            definition is not None and definition.corrupt)
        next_due = next_due_of(name, record, definition) if readable and record else None
        if next_due is None or record is None or record.anchor is None:
            left.append(name)
            continue
        writes.append(IndexWrite(name, EntryState(record.anchor, record.checkpoint,
                                                  record.token),
                                 definition.version if definition else 0, next_due))
    written = store.index(writes) if writes else []
    return RebuildPage(page.cursor, page.complete,
                       tuple(w.name for w, ok in zip(writes, written) if ok),
                       tuple(w.name for w, ok in zip(writes, written) if not ok),
                       tuple(left), page.looked_at)


# -- liveness -----------------------------------------------------------------------------
class Wrote(str, Enum):
    """What a beat wrote about a run, of which the store must still hold the trace (see
    :class:`Written`). Each holds what the ones before it hold, and more."""

    CLAIM = "claim"  # it claimed the run: the token was handed to it
    CHECK = "check"  # its check before publish passed: the run is no longer only claimed
    SENT = "sent"  # the store took its mark that the run was handed to the broker


@dataclass(frozen=True)
class Written:
    """A newest write a beat made about a run: its claim, the check before publish that
    let it publish the run, or the mark that it was handed to the broker (``kind``). At
    each heartbeat the beat asks the store whether it still holds it: a store put back
    from an older copy, whatever way (a file copied back, SQLite's backup API, a dump
    loaded again, an older RDB, keys restored one by one), has lost it, whatever its epoch
    and identity say."""

    entry: str
    due: int
    token: int
    kind: Wrote = Wrote.CLAIM
    #: The store showed it held at an earlier heartbeat of the caller's, one that judged
    #: the caller's continuity: a copy taken before that heartbeat and put back is found by
    #: the continuity it judges now. An entry the store then no longer holds at all, or
    #: holds made anew (another ``anchor``: a name registered or defined again), was
    #: removed (an operator's prune removes an entry with its runs once no live definition,
    #: registrant or run keeps it, and it was quiet for the fleet's heartbeat TTL), which
    #: is no loss; the same entry with a counter or a run below the write still is.
    confirmed: bool = False
    #: The anchor of the entry the write was about (an entry keeps its anchor for as long
    #: as the store holds it); None: not known, only a missing entry was removed.
    anchor: int | None = None

    @property
    def key(self) -> tuple[str, int, int, Wrote]:
        """The write as the store judges it, confirmed or not."""
        return (self.entry, self.due, self.token, self.kind)


@dataclass(frozen=True)
class Continuity:
    """What a running beat saw at its last heartbeat, for the store to check in the
    heartbeat's own atomic step. A store that no longer shows it went back (an older copy
    put back in place) and begins a new epoch in that same step: a beat that starts
    meanwhile, waiting for the running beats to heartbeat, sees their renewal only with the
    new epoch, never before it (else it could claim an occurrence the copy lost, with a
    higher token, before they found out)."""

    epoch: str
    """The epoch the caller's last heartbeat answered."""
    seen_at: int
    """The store's clock at that heartbeat (UTC ms): an epoch other than ``epoch`` that
    began before it is an older copy's, and so is a store whose last heartbeat of any beat
    (``beat_at``, which only moves forward, whatever its clock does) is before it: a copy
    taken before that heartbeat."""
    owner_renewed: bool
    """The caller's record was renewed less than a TTL ago: a store without it is a copy
    taken before."""


def went_back_from(continuity: Continuity | None, resyncing: bool,
                   lost: Sequence[Written], owner_known: bool, epoch: str | None,
                   epoch_since: int | None, last_beat: int | None = None) -> bool:
    """Whether what a heartbeat's step read does not show the caller's ``continuity``
    (never for a caller that resyncs or settles: it registers what it knows).
    ``last_beat``: the store's last heartbeat before this one (beat_at)."""
    if continuity is None or resyncing:
        return False
    return bool(lost) or (continuity.owner_renewed and not owner_known) or (
        bool(epoch) and epoch != continuity.epoch and epoch_since is not None
        and epoch_since < continuity.seen_at) or (
        last_beat is not None and last_beat < continuity.seen_at)


@dataclass(frozen=True)
class OwnerStatus:
    owner: Owner
    alive: bool
    expires_at: int  # when its heartbeat lapses (or lapsed), store clock ms


@dataclass(frozen=True)
class Heartbeat:
    """What a beat learns at each heartbeat.

    ``epoch`` changes whenever the store may have lost writes (a restart, a failover, a
    wipe, or a beat that found the store went back); ``settle_until``: no beat claims
    before that store instant, so that every live beat can register what it knows first.
    """

    now: int
    epoch: str
    settle_until: int | None
    owners: tuple[OwnerStatus, ...] = field(default=())
    store_id: str = ""
    """An id the store keeps as long as it keeps its records (a wipe makes a new one):
    beats stamp it on their messages, workers compare it with their own store's."""
    live: LiveRuns | None = None
    """With a ``sweep`` query, where the backend answers it in the same round trip: its
    answer, read from the records just after the heartbeat was written (as
    :meth:`Store.live_runs` would). None otherwise."""
    lost: tuple[Written, ...] = ()
    """The items of the heartbeat's ``written`` the store no longer holds: it went back
    (see :meth:`Store.heartbeat`)."""
    removed: tuple[Written, ...] = ()
    """The items of ``written`` confirmed at an earlier heartbeat (:attr:`Written.confirmed`)
    whose entry the store no longer holds at all: removed since (a prune), no loss. The
    caller stops asking after them (the name may be made anew, with a counter of its own)."""
    unjudged: tuple[Written, ...] = ()
    """The items of ``written`` the store could not judge (a record that cannot be read; on
    a Redis Cluster, the round trip that looks for them failed): neither lost nor found
    held, so not confirmed by this heartbeat (see :attr:`Written.confirmed`)."""
    changes: Changes | None = None
    """With a ``changes`` cursor, where the backend reads the change feed in the same
    round trip: the page from that cursor, as :meth:`Store.changes` answers it (its
    default limit). None otherwise."""
    last_beat: int | None = None
    """When the store last saw a heartbeat of any beat before this one (store clock, UTC
    ms; None: never). Kept with the epoch, never forgotten: a store restored from a copy
    shows the copy's."""
    epoch_since: int | None = None
    """When the epoch began (store clock, UTC ms; None: not known). A store put back in
    place from a copy keeps the epoch the copy was taken in: one that began before the
    beats' last heartbeats, while they saw another."""
    owner_known: bool = True
    """Whether the store held the caller's record before this heartbeat (alive, lapsed or
    left: it is forgotten an hour after it lapsed). False at the caller's first heartbeat,
    and in a store put back from a copy taken before it: a beat that heartbeated a moment
    ago and is not known has found the store went back, whatever it holds of its other
    writes (a beat that wrote nothing else yet: it only registered its entries)."""
    went_back: bool = False
    """The store did not show the heartbeat's ``continuity`` (a write of ``written`` lost,
    the caller's record renewed a moment ago missing, or an epoch that began before the
    caller's last heartbeat while it saw another) and began a new epoch in the heartbeat's
    own step: ``epoch`` is the new one (every live beat registers what it knows again)."""


# -- worker processes' liveness -----------------------------------------------------------
#: How long the store keeps a worker process's record after it lapsed (seconds), unless the
#: store's ``worker_records_kept`` says otherwise: then it is removed (by expiry, or a
#: bounded clean-up at each heartbeat), so the records are those of the processes of the
#: last minutes, whatever the number of processes that ever ran.
WORKER_RECORDS_KEPT = 600.0


@dataclass(frozen=True)
class WorkerLiveness:
    """A worker process's heartbeat as the store holds it: when it was last renewed and when
    it lapses (the store's clock, UTC ms). The process renews it in the background while it
    lives; a redelivery of a run it started judges it by this record alone, never by asking
    the process (a worker running a task under ``-P solo`` cannot answer)."""

    process: WorkerProcess
    renewed_at: int
    expires_at: int

    def alive(self, now: int) -> bool:
        """Whether the record is fresh at the store instant ``now``."""
        return now < self.expires_at


def worker_id(process: WorkerProcess) -> str:
    """The id of a worker process's record: a digest of the whole triple (any text in the
    node name, and a fixed length for a key or a column)."""
    text = json.dumps([process.worker, process.pid, process.process])
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def worker_ttl_ms(ttl: float) -> int:
    """A worker heartbeat's ttl in whole ms; refused where it enters when it is not a finite
    number of seconds > 0."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not (
            math.isfinite(ttl) and ttl > 0):
        raise ValueError(f"a worker heartbeat's ttl must be a finite number of seconds > 0,"
                         f" not {ttl!r}")
    return max(1, round(ttl * 1000))


@dataclass(frozen=True)
class WorkerLivenessRead:
    """The records of the processes asked for, in their order (None: the store has none
    that can be read: never written, removed long after it lapsed, lost, or unreadable),
    and the store's clock when it read them."""

    now: int
    records: tuple[WorkerLiveness | None, ...]


def read_worker_record(process: WorkerProcess, raw: Any) -> WorkerLiveness | None:
    """A worker process's stored record (JSON text, or its object: ``worker``, ``pid``,
    ``process``, ``renewed_at``, ``expires_at``); None when there is none or it cannot be
    read (not JSON, a field missing or not a number, another process's): a bad record is
    never taken for a live process."""
    if not raw or isinstance(raw, Exception):
        return None
    try:
        data = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
        renewed, expires = data["renewed_at"], data["expires_at"]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(v) and abs(v) < 2**62 for v in (renewed, expires)):
            return None
        if (data["worker"], data["pid"], data["process"]) != (
                process.worker, process.pid, process.process):
            return None
    except (ValueError, KeyError, TypeError):
        return None
    return WorkerLiveness(process, int(renewed), int(expires))


def written_worker_record(process: WorkerProcess, reply: Any) -> WorkerLiveness:
    """The record a worker heartbeat answers as written; any other reply is the store's
    fault (StoreError), never a record taken on trust."""
    record = read_worker_record(process, reply)
    if record is None:
        raise StoreError(f"the store's reply to a worker heartbeat is no record:"
                         f" {reply!r:.200}")
    return record


# -- the contract -------------------------------------------------------------------------
class Store(abc.ABC):
    """One backend of the shared truth. See the module docstring for what every method
    promises; each method's docstring says what it does."""

    # beats: liveness and entries
    @abc.abstractmethod
    def heartbeat(self, owner: Owner, ttl: float, resync: bool = False,
                  settling: bool = False, sweep: LiveQuery | None = None,
                  written: Sequence[Written] = (), changes: ChangeCursor | None = None,
                  continuity: Continuity | None = None) -> Heartbeat:
        """Renew ``owner``'s liveness for ``ttl`` seconds and read the store's clock, epoch
        and owners. With ``resync`` the caller found the store went back: start a new epoch
        and settle for ``ttl`` (no claiming meanwhile). With ``settling`` the caller is
        still registering what it knows: a store that is settling stays so for ``ttl``
        more. With ``sweep``, a backend that can answer that :meth:`live_runs` query in the
        same round trip does (``live``: an idle beat's heartbeat and sweep are one round
        trip); one that cannot leaves ``live`` None, and the caller asks apart. So with
        ``changes`` (a cursor of the change feed) and :meth:`changes` (``changes``).
        Whatever fails the sweep's or the feed's part never fails the heartbeat.

        ``written``: the newest writes the caller made; ``lost`` answers those the store no
        longer holds: no such entry, an entry whose token counter is below the write's
        token, a run at the instant with a lower token, for a check before publish the same
        token still claimed, for a sent mark the same token still claimed, being sent, due
        or waiting. A run with a higher token, or in any later state, holds it (a checked
        run due again with its token was taken back after the check; one trimmed from the
        history is judged by the counter alone, and so is a run with no token: never
        claimed, a backfill or a request put it there over what the instant held); an entry
        or run whose record cannot be read is not judged.
        ``owner_known``: whether the caller's record was there before.

        ``continuity`` (a running beat's, never with ``resync`` or ``settling``): when the
        store does not show it (see :class:`Continuity`), the heartbeat begins a new epoch
        as a resync does, and answers ``went_back``. The writes, the record and the epoch
        are judged and the new epoch begun in the same atomic step as the renewal, so that
        no other heartbeat reads the renewal without the new epoch (on a Redis Cluster,
        where the runs live on other masters, the writes are read one round trip before the
        step that renews and begins the epoch)."""

    @abc.abstractmethod
    def leave(self, owner: Owner) -> None:
        """``owner`` stopped: it is known gone at once (its claims are taken back)."""

    @abc.abstractmethod
    def register(self, seeds: Sequence[EntrySeed], owner: Owner | None = None
                 ) -> dict[str, EntryState]:
        """Anchor new entries (the first beat wins), merge in what the seeds know, and
        return every seed's state. With ``owner`` (a beat that schedules them), it becomes
        one of each entry's registrants, and the registrants whose heartbeat has lapsed are
        dropped (so the list stays bounded by the live beats): what :meth:`forget` and an
        operator's run now go by. A registrant that registered after the caller read which
        beats are alive is kept."""

    @abc.abstractmethod
    def unregister(self, owner: Owner, entries: Sequence[str]) -> None:
        """``owner`` no longer schedules these entries (a row disabled or deleted while it
        runs): it is no longer one of their registrants. Asking again does no harm."""

    # beats: the life of a claim
    @abc.abstractmethod
    def claim(self, owner: Owner, plans: Sequence[ClaimPlan]) -> list[ClaimResult]:
        """Claim occurrences (compare-and-set on each entry's checkpoint, a fresh token
        each: above the entry's last token, the plan's floor and the store's clock times
        :data:`TOKENS_PER_MS`) and record the planned skips; take the entry's due runs.
        With a plan's ``send``, the new occurrences may be checked before publish in the
        same atomic step (:class:`SendAtOnce`). One result per plan, in order."""

    @abc.abstractmethod
    def check(self, owner: Owner, checks: Sequence[Check]) -> list[CheckResult]:
        """Immediately before publishing: is each claim still ``owner``'s with its token?
        If so mark it ``sending`` with its task id (or record it skipped, or waiting).
        Checking again after a lost reply answers the same: a run this holder's check made
        waiting answers ``WAITING`` whatever ``overlap`` the second check carries (see
        :attr:`CheckVerdict.WAITING`), on every backend."""

    @abc.abstractmethod
    def record_sent(self, owner: Owner, claims: Sequence[Claim]) -> int:
        """These publishes succeeded: ``sending`` becomes ``sent`` (a worker may already
        have started or finished them). Returns how many were marked."""

    @abc.abstractmethod
    def release(self, owner: Owner, releases: Sequence[Release], max_attempts: int = 0
                ) -> list[RunState | None]:
        """Give back claims ``owner`` holds and has not handed to the broker: each is due
        again (or failed, past ``max_attempts`` publish errors). Per item: the run's new
        state, or None when it was not ``owner``'s to release."""

    # sweeps
    @abc.abstractmethod
    def live_runs(self, query: LiveQuery) -> LiveRuns:
        """Runs due again, and held claims that may need taking back (see LiveQuery),
        read from the records alone."""

    @abc.abstractmethod
    def open_runs(self, before: int, after: int | None = None, limit: int = 1000
                  ) -> list[OpenRun]:
        """Runs sent or started whose last activity is in (``after``, ``before``), oldest
        first, at most ``limit``."""

    @abc.abstractmethod
    def reclaim(self, reclaims: Sequence[Reclaim], by: str) -> list[bool]:
        """Take held claims back (to ``due``) from their holders, if they still hold them
        with that token. ``by`` is recorded (an owner id, or an operator)."""

    # workers (and sweeps, for outcomes)
    @abc.abstractmethod
    def start(self, delivery: Delivery) -> StartDecision:
        """The worker's fencing: may this delivery run? Compare-and-set on the token; the
        first delivery of the current token starts the run."""

    @abc.abstractmethod
    def finish(self, outcomes: Sequence[Outcome]) -> list[bool]:
        """Record outcomes; a final state is never overwritten, a superseded token's
        outcome is ignored, the checkpoint is never touched. One exception: a run presumed
        lost (``run_timeout``) that a delivery had started takes the outcome of that
        execution when it reports at last (it ran after all). Per item: recorded or
        not."""

    @abc.abstractmethod
    def requeue(self, delivery: Delivery) -> bool:
        """The delivery that started a run gives it back without an outcome: its message
        goes back to the broker (``Reject(requeue=True)``) or to a task that replaces it.
        The run is sent again, so that the next delivery of its token starts it."""

    @abc.abstractmethod
    def lookup_task(self, task_id: str) -> Claim | None:
        """The run a task id was started for (signals that carry only the task id)."""

    # operators
    @abc.abstractmethod
    def request_run(self, entry: str, by: str, request_id: str = "") -> int | None:
        """Record a run of ``entry`` due now, claimed and sent by a beat like any other.
        Returns its due instant, or None when the store does not know the entry. The
        checkpoint is not touched: scheduled occurrences neither move nor are skipped.
        Asked again with the same ``request_id`` (after a lost reply), it records nothing
        more and answers the same instant."""

    @abc.abstractmethod
    def pause(self, entry: str, by: str, note: str = "") -> EntryRecord | None:
        """Pause the entry: from now on, on every beat, each of its occurrences is recorded
        skipped (``paused``) instead of being sent — at its claim, when taken due again,
        or at the check before publish of a run claimed before the pause. Runs already
        handed to the broker are not touched; an operator's requests (run now, backfill)
        are still sent. Pausing a paused entry keeps its instant and takes the new note and
        who. None when the store does not know the entry."""

    @abc.abstractmethod
    def resume(self, entry: str, by: str) -> EntryRecord | None:
        """End the entry's pause (recording who, and when, and keeping when the pause
        began: ``last_paused_at``); occurrences due from now on are sent again. Those due
        while it was paused, ``[last_paused_at, resumed_at)``, are skipped (``paused``)
        whenever they are claimed or checked, after the resume too (a beat that fell
        behind, jitter, an outage): the pause is of the instants, not of the moment of the
        claim. Resuming an entry that is not paused records nothing. None when the store
        does not know the entry."""

    @abc.abstractmethod
    def backfill(self, entry: str, dues: Sequence[int], by: str) -> BackfillResult | None:
        """Record a manual run (``requested_by``) due at each of these instants that has no
        run, or whose run ended without running (skipped, cancelled, or lost before any
        delivery started it): the beats claim and send them like any run due again, oldest
        first. Instants whose run ran, runs or is on its way (due, waiting, claimed,
        sending, sent, started, done, failed, and lost after a delivery started it: it ran,
        or runs still, and its outcome is recorded when it reports) are kept as they are,
        so asking twice (after a lost reply) sends each once. The checkpoint is not
        touched. None when the store does not know the entry.

        Bounded by the history: a backfill that would create more runs than the entry's
        history (``beat_claims_history_limit``) can hold beside its unfinished runs (due,
        waiting, claimed, sending, sent, started) is refused where it enters, before
        anything is recorded: :class:`BackfillRefused` (a ``ValueError``), whose message
        names ``beat_claims_history_limit`` and ``beat_claims_backfill_limit``. Otherwise
        the runs it creates could push runs already sent out of the history (trimmed,
        their deliveries refused). (Beyond a backfill, a full history of unfinished runs is
        trimmed as :meth:`claim` documents.)

        Bounded by what the store still knows: every trim of the entry's history (in the
        same atomic step) raises its horizon to the newest instant it removed a run of
        (``EntryRecord.history_horizon``). A backfill with an instant at or before the
        horizon that has no run recorded is refused before anything is recorded:
        :class:`BackfillForgotten` (a :class:`BackfillRefused`), naming the horizon and
        ``beat_claims_history_limit``. Whether the occurrence ran there is not known: a run
        created there could run it a second time. An instant the store still has a record
        of is known (that record is its latest run), whatever the horizon. A horizon that
        cannot be read counts as one after every such instant (the next trim writes it
        again, at the store's clock then)."""

    @abc.abstractmethod
    def forget(self, entries: Sequence[str]) -> list[str]:
        """Remove entries that no schedule has any more, with every record of theirs (an
        operator's prune). Judged atomically per entry: an entry with a run claimed, being
        sent, sent or started is kept, and so is one that a beat whose heartbeat has not
        lapsed registered (see :meth:`register`; a registrant recorded after the call read
        which beats are alive counts as alive), or whose registrants cannot be read.
        Returns the names removed."""

    # definitions
    @abc.abstractmethod
    def write_definitions(self, writes: Sequence[DefinitionWrite]
                          ) -> list[DefinitionResult]:
        """Change entries' definitions: each item one atomic compare-and-set on the version
        (and the checkpoint, with ``expected_checkpoint``) that writes the definition or its
        tombstone, the new version, origin, who and when (the store's clock), records the
        planned skips as a claim records its own (instants after the checkpoint with no run
        yet), moves the checkpoint forward only, and puts the entry in the change feed
        (:meth:`changes`). An entry that does not exist is created, anchored as
        :meth:`register` anchors it. A write with the ``change_id`` of the entry's last
        change answers OK with its version and writes nothing (a lost reply). The
        definition is opaque JSON text: only its size and the name are checked, and a
        call with an item the store cannot keep is refused before anything is written
        (:class:`WriteRefused`, see :func:`checked_writes`). One result per item, in
        order; a bulk goes in one round trip per chunk."""

    @abc.abstractmethod
    def definitions(self, names: Sequence[str] | None = None, after: str = "",
                    limit: int = 1000) -> list[StoredDefinition]:
        """The definitions (and tombstones) of these entries, in their order (an entry that
        never had a definition is left out); or, with ``names`` None, a page of every entry
        that has or had one, in name order (by code point), the first ``limit`` after the
        name ``after`` (at most :data:`MAX_PAGE`: ValueError beyond). A record that cannot
        be read is answered ``corrupt``."""

    @abc.abstractmethod
    def changes(self, cursor: ChangeCursor | None, limit: int = 1000) -> Changes:
        """The change feed: the entries whose definition changed after ``cursor`` (each
        once, however often it changed), oldest change first, at most ``limit`` (1 to
        :data:`MAX_PAGE`: ValueError else), as the store holds them now; or ``reload`` (see
        :class:`Changes`). Reads only. Changes made within one millisecond of the store's
        clock may come in any order on the Redis store (each of its buckets keeps its own
        log)."""

    # the due index
    @abc.abstractmethod
    def due(self, before: int, limit: int, after: tuple[int, str] | None = None
            ) -> list[DueEntry]:
        """The indexed entries whose ``next_due`` is at or before ``before``, in
        (``next_due``, name) order (names by code point), the first ``limit`` (1 to
        :data:`MAX_PAGE`: ValueError else) after ``after`` (exclusive; None: from the
        start): page with the last answered (``next_due``, name). Each with its state and
        definition version (:class:`DueEntry`). Reads only. Entries :data:`NOT_DUE` and
        entries not indexed are never answered."""

    def next_indexed(self, after: tuple[int, str] | None = None) -> int | None:
        """The due index's first ``next_due`` after ``after`` (exclusive, as :meth:`due`
        pages; None: from the start), or None when it holds none after it: when a reader
        that has read up to ``after`` reads again."""
        found = self.due(LATEST, 1, after)
        return found[0].next_due if found else None

    def due_ahead(self, before: int, limit: int, after: tuple[int, str] | None = None
                  ) -> DueAhead:
        """:meth:`due`, and when its page is short the index's first instant after
        ``before`` (:class:`DueAhead`): what a reader that reads up to ``before`` asks,
        and when to ask again. A store that can read both in one round trip does (Redis:
        an idle beat reads its index once a heartbeat interval)."""
        entries = self.due(before, limit, after)
        if len(entries) >= limit:
            return DueAhead(entries, None)
        last = (entries[-1].next_due, entries[-1].name) if entries else after
        return DueAhead(entries, self.next_indexed(last))

    @abc.abstractmethod
    def index(self, writes: Sequence[IndexWrite]) -> list[bool]:
        """(Re)index entries (a sweep, a reader that found an entry not due yet): each
        item one compare-and-set on the anchor, checkpoint and definition version it was
        computed from (:class:`IndexWrite`). Per item: written or not (moved, or no such
        entry)."""

    @abc.abstractmethod
    def unindexed(self, limit: int, cursor: str = "") -> Unindexed:
        """A page of the entries the store holds (registered or defined, tombstones too)
        that have no ``next_due`` at all, in a pass over every entry that ``cursor``
        continues ("" starts one). At most ``limit`` names (1 to :data:`MAX_PAGE`:
        ValueError else); a page may hold fewer, or none, before the pass is complete."""

    # reads
    @abc.abstractmethod
    def entries(self, names: Sequence[str] | None = None) -> list[EntryRecord]:
        """These entries (or every entry the store has seen), by name."""

    @abc.abstractmethod
    def history(self, entry: str, limit: int | None = None) -> list[Run]:
        """The entry's runs, newest first."""

    @abc.abstractmethod
    def owners(self) -> list[OwnerStatus]:
        """Every registered beat and whether its heartbeat is alive."""

    @abc.abstractmethod
    def now(self) -> int:
        """The store's clock (UTC ms): what readers such as a health probe compare with."""

    def close(self) -> None:  # noqa: B027 - optional for backends
        """Release connections."""

    @property
    @abc.abstractmethod
    def description(self) -> str:
        """The store for logs and status: its URL without secrets, and its key prefix."""

    #: How long a tombstone stays in the change feed after its delete, in ms (see
    #: TOMBSTONE_KEPT_MS).
    tombstones_kept_ms: int = TOMBSTONE_KEPT_MS
    #: The runs the store keeps of an entry (``beat_claims_history_limit``): also the most
    #: skips one definition write records (:func:`checked_writes`).
    history_limit: int = 100

    # workers: liveness of the processes that execute deliveries
    #: Seconds a worker process's record is kept after it lapsed (see WORKER_RECORDS_KEPT).
    worker_records_kept: float = WORKER_RECORDS_KEPT

    @property
    def worker_records_kept_ms(self) -> int:
        return max(0, round(self.worker_records_kept * 1000))

    @abc.abstractmethod
    def worker_heartbeat(self, process: WorkerProcess, ttl: float) -> WorkerLiveness:
        """``process`` is alive for ``ttl`` more seconds: its record is renewed from the
        store's clock and answered as written. Records lapsed more than
        ``worker_records_kept`` ago are removed. Calling again (a lost reply) renews it
        again. A record of the process that cannot be read is replaced."""

    @abc.abstractmethod
    def worker_liveness(self, processes: Sequence[WorkerProcess]) -> WorkerLivenessRead:
        """The records of ``processes`` (each the exact triple: node name, pid and process
        identity; another process with the same name and pid has a record of its own), and
        the store's clock. A record that cannot be read is None, and the others are read."""


__all__ = [
    "DUE_AT_ONCE",
    "NOT_DUE",
    "BackfillForgotten",
    "BackfillRefused",
    "BackfillResult",
    "Check",
    "CheckResult",
    "CheckVerdict",
    "Claim",
    "ClaimPlan",
    "ClaimResult",
    "ClaimStatus",
    "Continuity",
    "Delivery",
    "DueEntry",
    "EntryRecord",
    "EntrySeed",
    "EntryState",
    "Heartbeat",
    "HeldRun",
    "IndexWrite",
    "LiveQuery",
    "LiveRuns",
    "OpenRun",
    "Outcome",
    "OwnerStatus",
    "Pause",
    "Reclaim",
    "Registrant",
    "Release",
    "RunRef",
    "SendAtOnce",
    "StartDecision",
    "Store",
    "StoreConfigurationError",
    "StoreError",
    "Unindexed",
    "WorkerProcess",
    "Written",
    "Wrote",
    "checked_index_writes",
    "checked_plans",
    "due_cursor",
    "in_last_pause",
    "index_value",
    "registrants_from_json",
    "written_next_due",
]
__all__ += [
    "CHANGES_PER_MS",
    "MAX_CHANGE_TEXT",
    "MAX_DEFINITION_BYTES",
    "MAX_PAGE",
    "TOMBSTONES_DROPPED",
    "TOMBSTONE_KEPT_MS",
    "ChangeCursor",
    "Changes",
    "DefinitionResult",
    "DefinitionWrite",
    "LogRead",
    "StoredDefinition",
    "WriteRefused",
    "WriteStatus",
    "checked_writes",
    "definition_result",
    "follow",
    "page_limit",
    "stored_definition",
]
__all__ += ["went_back_from"]
__all__ += ["WORKER_RECORDS_KEPT", "WorkerLiveness", "WorkerLivenessRead",
            "read_worker_record", "worker_id",
            "worker_ttl_ms", "written_worker_record"]
