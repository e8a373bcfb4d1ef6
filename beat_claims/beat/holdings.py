"""Claims this beat holds and has not handed to the broker, and publishes whose sent mark
is not stored yet.

A hint, not the truth: if this were lost at any moment, the store's records still hold
every one of these runs (claimed, or being sent), and the sweeps find them — this beat's
own at its next sweep, anybody's once the claim is older than ``reclaim_after`` or its
owner is gone.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..stores.base import CheckResult, Claim, RunRef


class Holdings:
    def __init__(self) -> None:
        self.held: dict[RunRef, Claim] = {}  # claimed (or checked) and not yet published
        self.waited: set[RunRef] = set()  # held ones that did not come straight from a claim
        #: Held ones taken due again (released, taken back, a buffered run's turn): late by
        #: design, never this beat falling behind (lateness).
        self.due_again: set[RunRef] = set()
        self.checked: list[Claim] = []  # passed the check; publish not begun
        self.unmarked: list[Claim] = []  # published; the sent mark is still to be stored
        self.later: dict[RunRef, int] = {}  # held ones not to be sent before (jitter), ms
        #: Held ones the store checked before publish with their claim (SendAtOnce), and
        #: when (monotonic): the answer the sender's check would get, if it comes soon.
        self.prechecked: dict[RunRef, tuple[CheckResult, float]] = {}

    def hold(self, claims: Iterable[Claim], waited: bool) -> None:
        for claim in claims:
            self.held[claim.ref] = claim
            if waited:
                self.waited.add(claim.ref)
                self.due_again.add(claim.ref)

    def drop(self, ref: RunRef) -> None:
        self.held.pop(ref, None)
        self.waited.discard(ref)
        self.due_again.discard(ref)
        self.later.pop(ref, None)
        self.prechecked.pop(ref, None)

    def ready(self, now: int) -> list[Claim]:
        """The held claims whose instant to be sent has come."""
        return [claim for ref, claim in self.held.items() if self.later.get(ref, 0) <= now]

    def next_send(self) -> int | None:
        """The earliest instant a held claim waits for (jitter), if any."""
        return min(self.later.values(), default=None)

    def knows(self, ref: RunRef) -> bool:
        """Whether this beat is handling the run right now (held, checked or published)."""
        return (ref in self.held or any(c.ref == ref for c in self.checked)
                or any(c.ref == ref for c in self.unmarked))

    def entries(self) -> set[str]:
        return {ref.entry for ref in self.held}

    def clear(self) -> None:
        self.held.clear()
        self.waited.clear()
        self.due_again.clear()
        self.later.clear()
        self.prechecked.clear()
        self.checked.clear()
        self.unmarked.clear()

    def __len__(self) -> int:
        return len(self.held)
