"""What this beat knows of each entry: its anchor, the highest checkpoint and token seen,
and the runs it sent lately.

It serves two purposes. The store's answers are checked against it: a checkpoint or a
token lower than one this beat has seen means the store lost writes (an older snapshot, a
lagging replica), and is never adopted silently. And when the store's epoch changes, it is
registered again, so that no occurrence this beat handed out is handed out again, no token
is used twice, and interval entries keep their grid.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..enums import RunState
from ..runs import Run
from ..stores.base import Claim, EntrySeed, EntryState, Pause

#: After the store may have lost writes, new tokens start this far above the highest one
#: seen: a beat that has since died may have handed out tokens nobody alive saw.
TOKEN_GAP = 1_000_000
#: Runs sent lately, registered again after a wipe so that their messages still run.
RECENT_SENDS = 10_000


@dataclass
class Known:
    anchor: int
    checkpoint: int | None
    token: int


class Knowledge:
    def __init__(self) -> None:
        self.entries: dict[str, Known] = {}
        self.recent: deque[Run] = deque(maxlen=RECENT_SENDS)
        #: Entries the store said were paused at this beat's last claim of them (an
        #: occurrence recorded skipped, paused), with the pause as the store held it.
        self.paused: dict[str, Pause] = {}

    def learn(self, name: str, state: EntryState) -> str | None:
        """Take in the store's state of an entry. Returns what went back, if anything did
        (the state is then not adopted)."""
        known = self.entries.get(name)
        if known is None:
            self.entries[name] = Known(state.anchor, state.checkpoint, state.token)
            return None
        if state.anchor != known.anchor:
            return f"its anchor moved from {known.anchor} to {state.anchor}"
        if known.checkpoint is not None and (
                state.checkpoint is None or state.checkpoint < known.checkpoint):
            return f"its checkpoint went back from {known.checkpoint} to {state.checkpoint}"
        if state.token < known.token:
            return f"its token went back from {known.token} to {state.token}"
        known.checkpoint = state.checkpoint
        known.token = state.token
        return None

    def claimed(self, claims: list[Claim]) -> None:
        for claim in claims:
            known = self.entries.get(claim.entry)
            if known is not None and claim.token > known.token:
                known.token = claim.token

    def sent(self, claim: Claim, task_id: str, at: int) -> None:
        # If it has to be registered again, it is marked so: the store lost its outcome,
        # and it must not make later runs of an overlap="skip" entry wait for one.
        self.recent.append(Run(claim.entry, claim.due, RunState.SENT, token=claim.token,
                               task_id=task_id, sent_at=at, manual=claim.manual,
                               extra={"reseeded": True}))

    def forget(self, name: str) -> None:
        self.entries.pop(name, None)

    def seeds(self, descriptions: dict[str, str], held: list[Claim]) -> list[EntrySeed]:
        """What to register again after the store's epoch changed: every entry this beat
        has, with what it knows; the claims it held come back as due runs (nobody sent
        them), the runs it sent lately as sent (their messages may still be queued)."""
        runs: dict[str, list[Run]] = {}
        for claim in held:
            runs.setdefault(claim.entry, []).append(
                Run(claim.entry, claim.due, RunState.DUE, manual=claim.manual,
                    attempts=claim.attempts))
        held_refs = {(c.entry, c.due) for c in held}
        for run in self.recent:
            if (run.entry, run.due) not in held_refs:
                runs.setdefault(run.entry, []).append(run)
        seeds = []
        for name, description in descriptions.items():
            known = self.entries.get(name)
            if known is None:
                seeds.append(EntrySeed(name, description, runs=tuple(runs.get(name, ()))))
                continue
            seeds.append(EntrySeed(name, description, known.anchor, known.checkpoint,
                                   known.token + TOKEN_GAP, tuple(runs.get(name, ()))))
        return seeds
