"""The store interface: the shared truth every beat and worker reads and writes.

Each method is one atomic transition (or a batch of independent atomic transitions).
Every write about a run is a compare-and-set on the run's fencing token; the Scheduler
and the worker handlers never read-then-write across two calls without a token check.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..runs import Owner, Run


@dataclass(frozen=True)
class EntryState:
    """What the store holds for one entry: its anchor and checkpoint (UTC ms)."""

    anchor: int
    checkpoint: int | None


@dataclass(frozen=True)
class Claim:
    """A claim this beat holds on one occurrence, with its fencing token."""

    entry: str
    due: int
    token: int
    reclaimed: bool = False
    maybe_sent: bool = False  # taken over from an owner that had passed the check


@dataclass
class ClaimRequest:
    """One entry's batch: occurrences to claim and to record as skipped, in due order."""

    entry: str
    expected: EntryState | None  # None: only take released occurrences
    claim: Sequence[int] = ()
    skip: Sequence[tuple[int, str]] = ()
    overlap: str = "allow"


@dataclass
class ClaimResult:
    entry: str
    conflict: EntryState | None = None  # the store's state when ours was stale
    missing: bool = False  # the entry has no anchor in the store (new, or the store was wiped)
    claims: list[Claim] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)


@dataclass(frozen=True)
class StartDecision:
    """The worker's answer for one delivery."""

    ok: bool
    why: str = ""
    busy_with: tuple[str, int, float] | None = None  # (worker, pid, its process start time)


class Store(abc.ABC):
    """One backend of the shared truth."""

    @abc.abstractmethod
    def now_ms(self) -> int:
        """The store's clock (UTC ms): every beat measures due-ness against it."""

    # -- beat side --------------------------------------------------------------------
    @abc.abstractmethod
    def ensure_entries(self, entries: Sequence[tuple[str, str]]) -> dict[str, EntryState]:
        """Anchor new entries (first beat wins) and read every entry's anchor/checkpoint."""

    @abc.abstractmethod
    def claim(self, owner: Owner, requests: Sequence[ClaimRequest],
              history_limit: int, now_ms: int) -> list[ClaimResult]:
        """Claim occurrences of many entries, one atomic compare-and-set per entry."""

    @abc.abstractmethod
    def check_many(self, owner: Owner, items: Sequence[tuple[Claim, str]],
                   sent: Sequence[Claim] = ()) -> list[tuple[bool, str]]:
        """Atomically for each (claim, task id): is the claim still ours? If so mark it as
        being sent (with its task id). One answer (ok, why not) per item, in order.

        In the same round trip, marks ``sent`` (earlier claims whose publish succeeded).
        """

    def check_before_send(self, owner: Owner, claim: Claim, task_id: str,
                          sent: Sequence[Claim] = ()) -> tuple[bool, str]:
        """:meth:`check_many` for one claim."""
        return self.check_many(owner, [(claim, task_id)], sent)[0]

    @abc.abstractmethod
    def skip(self, owner: Owner, claim: Claim, reason: str) -> bool:
        """The holder records a claimed run as skipped instead of sending it."""

    @abc.abstractmethod
    def mark_sent(self, claim: Claim) -> bool:
        """The publish succeeded."""

    @abc.abstractmethod
    def mark_all_sent(self, claims: Sequence[Claim], owner: Owner | None = None,
                      done_in: Iterable[str] = ()) -> int:
        """:meth:`mark_sent` for many claims in one round trip; how many were marked. With
        ``owner``, :meth:`done_claiming` of ``done_in`` travels in the same round trip."""

    @abc.abstractmethod
    def release(self, owner: Owner, entries: Iterable[str], unsent: Iterable[tuple[str, int]] = ()
                ) -> int:
        """Give back claims that were not sent; they are due again. Returns how many.

        Every claim the owner holds in ``entries`` that never reached the check before
        publish is released (whether or not the owner learnt its token), and each of
        ``unsent`` (entry, due) too, even past that check: its publish failed.
        """

    @abc.abstractmethod
    def released_in(self) -> dict[str, int]:
        """Entries where runs were released (or requested) and may wait for a beat, each
        with a count that moves at every new release there."""

    @abc.abstractmethod
    def picked_up(self, seen: dict[str, int]) -> None:
        """A beat claimed what was released in these entries: drop the notices it read,
        unless their count moved since (a newer release keeps its notice)."""

    @abc.abstractmethod
    def open_in(self) -> dict[str, str]:
        """Entries where runs may be open (being sent, sent, started): the only ones the
        lost and outcome sweeps look at. Each with a stamp that changes at every new check
        (the owner and token of the newest claim checked there)."""

    @abc.abstractmethod
    def note_open(self, entries: Sequence[str]) -> None:
        """Add entries to :meth:`open_in` (runs found open that it did not list)."""

    @abc.abstractmethod
    def settled(self, seen: dict[str, str]) -> None:
        """These entries have no open run: drop them from :meth:`open_in`, unless their stamp
        changed since it was read (a run checked meanwhile keeps its entry there)."""

    @abc.abstractmethod
    def heartbeat(self, owner: Owner, ttl: float) -> tuple[int, int]:
        """Renew the owner's liveness; returns (release generation, store clock in ms).

        The generation changes whenever a beat releases claims, so others look for them.
        """

    @abc.abstractmethod
    def forget_owner(self, owner: Owner) -> None:
        """The owner stopped cleanly: its heartbeat is removed so it is known gone at once."""

    @abc.abstractmethod
    def done_claiming(self, owner: Owner, entries: Iterable[str]) -> None:
        """The owner holds no more claims in these entries."""

    @abc.abstractmethod
    def owners(self) -> list[tuple[Owner, bool, dict[str, int]]]:
        """Every registered owner, whether its heartbeat is alive, and its claiming entries."""

    def sweep_view(self, known: Sequence[str]
                   ) -> tuple[list[tuple[Owner, bool, dict[str, int]]], dict[str, str]]:
        """What a sweep reads: :meth:`owners` and :meth:`open_in`. ``known`` are the owner
        ids the caller saw last time (a backend may read those in fewer round trips)."""
        return self.owners(), self.open_in()

    @abc.abstractmethod
    def reclaim(self, entries: Sequence[str], old_owner: str, new_owner: Owner,
                cutoff_ms: int | None) -> list[Claim]:
        """Take over ``old_owner``'s claims in ``entries``: all of them when it is known dead
        (cutoff None; the entries then leave its note), else those claimed (or, when being
        sent, checked) before the cutoff. The new owner notes the entries first."""

    @abc.abstractmethod
    def drop_owner(self, owner_id: str) -> None:
        """Unregister a dead owner, if its note is empty and its heartbeat still absent."""

    @abc.abstractmethod
    def mark_lost(self, cutoffs: dict[str, int]) -> dict[str, list[int]]:
        """Per entry: runs sent before its cutoff (ms) with no outcome become lost."""

    # -- worker side ------------------------------------------------------------------
    @abc.abstractmethod
    def start(self, entry: str, due: int, token: int, worker: str, pid: int, retries: int,
              takeover: tuple[str, int] | None = None, created: float = 0.0,
              task_id: str = "") -> StartDecision:
        """Compare-and-set before a delivery executes (the worker's fencing). With
        ``task_id``, also index it for :meth:`lookup_task` in the same round trip."""

    @abc.abstractmethod
    def finish(self, entry: str, due: int, token: int | None, state: str,
               exc_type: str = "", exc_message: str = "", worker: str = "") -> bool:
        """Record an outcome; never overwrites a final state."""

    @abc.abstractmethod
    def lookup_task(self, task_id: str) -> tuple[str, int, int] | None:
        """(entry, due, token) of a task id sent by beat-claims, if known."""

    # -- operators --------------------------------------------------------------------
    @abc.abstractmethod
    def request_run(self, entry: str, requested_by: str) -> int | None:
        """Record a run of ``entry`` due now, for a beat to claim and send like any other.

        Returns its due instant, or None when the store does not know the entry. The
        checkpoint is not touched: scheduled occurrences are unaffected.
        """

    @abc.abstractmethod
    def free_claim(self, entry: str, due: int, released_by: str) -> bool:
        """Release a claimed (or being sent) run whoever holds it: it is due again, and the
        holder's token is superseded at the next claim."""

    # -- inspection -------------------------------------------------------------------
    @abc.abstractmethod
    def entry_names(self) -> list[str]:
        """Every entry the store has seen."""

    @abc.abstractmethod
    def entry_info(self, entry: str) -> dict[str, Any]:
        """Anchor, checkpoint, token and description of one entry."""

    @abc.abstractmethod
    def history(self, entry: str, limit: int | None = None) -> list[Run]:
        """Recent runs of an entry, newest first."""

    @abc.abstractmethod
    def open_runs(self, entries: Sequence[str]) -> dict[str, list[Run]]:
        """Per entry: runs that are claimed, due again, being sent, sent or started."""

    def close(self) -> None:  # noqa: B027 - optional for backends
        """Release connections."""
