"""What this beat knows of each entry: its anchor, the highest checkpoint and token seen,
the runs it sent lately, and the pause it saw.

It serves two purposes. The store's answers are checked against it: a checkpoint or a
token lower than one this beat has seen means the store lost writes (an older snapshot, a
lagging replica), and is never adopted silently. And when the store's epoch changes, it is
registered again, so that no occurrence this beat handed out is handed out again, no token
is used twice, interval entries keep their grid, and a pause the store lost is restored
(what the beat knows of a pause only ever moves forwards: see :meth:`Knowledge.check_pause`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..enums import RunState
from ..runs import Run
from ..stores.base import Claim, EntryRecord, EntrySeed, EntryState, Pause, Written, Wrote

#: After the store may have lost writes, new tokens start this far above the highest one
#: seen: a beat that has since died may have handed out tokens nobody alive saw.
TOKEN_GAP = 1_000_000
#: Runs sent lately, registered again after a wipe so that their messages still run.
RECENT_SENDS = 10_000
#: One of them: entry, due, token, task id, sent at, manual.
_Sent = tuple[str, int, int, str, int, bool]


@dataclass
class Known:
    anchor: int
    checkpoint: int | None
    token: int


class Knowledge:
    def __init__(self) -> None:
        self.entries: dict[str, Known] = {}
        #: What it knew of the dynamic entries it let go (held while due soon), the latest
        #: RECENT_SENDS: checked when one is taken again, registered again (and its pause
        #: restored) after the store went back (it sent their runs too).
        self.let_go: OrderedDict[str, Known] = OrderedDict()
        #: (Kept as tuples: a Run of each is made only when the store went back.)
        self.recent: deque[_Sent] = deque(maxlen=RECENT_SENDS)
        #: Entries this beat knows paused (an occurrence was recorded skipped for the
        #: pause), with the pause as the store last showed it: kept current from the
        #: store's records (:meth:`pauses_to_check`, :meth:`check_pause`).
        self.paused: dict[str, Pause] = {}
        #: Known pauses whose entry had an occurrence skipped for a pause since they were
        #: last checked: the store may hold a later pause. Checked first.
        self.pauses_stale: set[str] = set()
        self._pause_turn = 0
        #: The newest claim this beat made, the newest of its checks before publish that
        #: let it publish, and the newest sent mark the store took from it: at each
        #: heartbeat the store is asked whether it still holds them (one put back from an
        #: older copy, whatever way, has lost them, whatever its epoch says). The check
        #: counts apart from the mark: a copy put back between the two holds the run
        #: claimed, refuses the mark, and still holds the claim and the mark before.
        self.newest_claim: Written | None = None
        self.newest_checked: Written | None = None
        self.newest_sent: Written | None = None

    def learn(self, name: str, state: EntryState) -> str | None:
        """Take in the store's state of an entry. Returns what went back, if anything did
        (the state is then not adopted)."""
        known = self.entries.get(name)
        if known is None:
            aside = self.let_go.pop(name, None)
            if aside is not None and aside.anchor == state.anchor:  # (else: made anew)
                self.entries[name] = known = aside
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

    def skipped_paused(self, names: Iterable[str]) -> None:
        """Occurrences of ``names`` were skipped for a pause: check the ones this beat knows
        paused soon (the pause may be a later one)."""
        self.pauses_stale.update(name for name in names if name in self.paused)

    def pauses_to_check(self, limit: int, stale_only: bool = False) -> list[str]:
        """Up to ``limit`` entries this beat knows paused, to check against the store: the
        stale ones first, then the others in turn (every one within a bounded number of
        calls)."""
        picked = [name for name in sorted(self.pauses_stale) if name in self.paused][:limit]
        self.pauses_stale.difference_update(picked)
        if stale_only or len(picked) >= limit:
            return picked
        names = [name for name in self.paused if name not in set(picked)]
        if len(names) <= limit - len(picked):
            return picked + names
        start = self._pause_turn % len(names)
        turn = (names[start:] + names[:start])[:limit - len(picked)]
        self._pause_turn = start + len(turn)
        return picked + turn

    def check_pause(self, name: str, record: EntryRecord | None) -> str | None:
        """Bring the pause this beat knows of ``name`` up to date with the store's record.
        Only later state is taken in: a resume at or after the known pause began forgets
        it ("resumed"); a pause that began later replaces it, and the same pause takes the
        store's who and note ("updated"). Anything else leaves it as it is (None): no
        record, no pause and no such resume, or an earlier pause, is what a store that lost
        writes shows (a wipe, an older snapshot not noticed yet), and the pause is then
        restored once the beat finds out (see KnownPauses.restore)."""
        known = self.paused.get(name)
        if known is None or record is None or record.name != name:
            return None
        current = record.paused
        if current is not None:
            if current.at > known.at or (current.at == known.at and current != known):
                self.paused[name] = current
                return "updated"
            return None
        if record.resumed_at is not None and record.resumed_at >= known.at:
            del self.paused[name]
            self.pauses_stale.discard(name)
            return "resumed"
        return None

    def claimed(self, claims: list[Claim]) -> None:
        for claim in claims:
            known = self.entries.get(claim.entry)
            if known is not None and claim.token > known.token:
                known.token = claim.token
        self.newest_claim = self._newest(claims, Wrote.CLAIM) or self.newest_claim

    def checked(self, claims: list[Claim]) -> None:
        """The store's check before publish let this beat publish ``claims``."""
        self.newest_checked = self._newest(claims, Wrote.CHECK) or self.newest_checked

    def marked_sent(self, claims: list[Claim]) -> None:
        """The store took the sent marks of ``claims`` (every one of them)."""
        self.newest_sent = self._newest(claims, Wrote.SENT) or self.newest_sent

    def _newest(self, claims: list[Claim], kind: Wrote) -> Written | None:
        """The write about the last of ``claims`` whose entry this beat still knows (with
        that entry's anchor): a mark stored late (a store error before it) of an entry
        forgotten since is not asked after."""
        last = next((c for c in reversed(claims) if c.entry in self.entries), None)
        if last is None:
            return None
        return Written(last.entry, last.due, last.token, kind,
                       anchor=self.entries[last.entry].anchor)

    def written(self) -> list[Written]:
        """What the store must still hold of this beat's writes (see newest_claim): of two
        writes about one run (its token), only the later one, which holds the other."""
        newest: dict[tuple[str, int, int], Written] = {}
        for w in (self.newest_claim, self.newest_checked, self.newest_sent):
            if w is not None:
                newest[(w.entry, w.due, w.token)] = w
        return list(newest.values())

    def removed(self, items: Sequence[Written]) -> None:
        """The store removed the entries of these writes since it last held them (an
        operator's prune): they are not asked after any more, nor a check or a claim of
        their runs that the later write stood for (a write of the name made anew since is:
        another run)."""
        gone = {(w.entry, w.due, w.token) for w in items}
        for attr in ("newest_claim", "newest_checked", "newest_sent"):
            w = getattr(self, attr)
            if w is not None and (w.entry, w.due, w.token) in gone:
                setattr(self, attr, None)

    def sent(self, claim: Claim, task_id: str, at: int) -> None:
        self.recent.append((claim.entry, claim.due, claim.token, task_id, at, claim.manual))

    def recent_runs(self) -> list[Run]:
        """The runs this beat sent lately, as they are registered again (see recent). Each
        is marked so: the store lost its outcome, and it must not make later runs of an
        overlap="skip" entry wait for one."""
        return [Run(entry, due, RunState.SENT, token=token, task_id=task_id, sent_at=at,
                    manual=manual, extra={"reseeded": True})
                for entry, due, token, task_id, at, manual in self.recent]

    def put_aside(self, name: str) -> None:
        """This beat let go of the dynamic entry ``name``: what it knows is kept aside."""
        known = self.entries.pop(name, None)
        if known is not None:
            self.let_go[name] = known
            self.let_go.move_to_end(name)
            while len(self.let_go) > RECENT_SENDS:
                gone, _ = self.let_go.popitem(last=False)
                self.paused.pop(gone, None)  # (its pause is restored no more either)
                self.pauses_stale.discard(gone)

    def set_aside_seeds(self, names: set[str]) -> list[EntrySeed]:
        """What to register again (with no registrant) after the store's epoch changed of
        the dynamic entries this beat let go or sent lately that are not among ``names``
        (its entries now): what it knows, and the runs it sent lately."""
        runs: dict[str, list[Run]] = {}
        for run in self.recent_runs():
            if run.entry not in names:
                runs.setdefault(run.entry, []).append(run)
        seeds = []
        for name in sorted(set(runs) | (set(self.let_go) - names)):
            known = self.let_go.get(name)
            if known is None:
                seeds.append(EntrySeed(name, runs=tuple(runs[name])))
                continue
            seeds.append(EntrySeed(name, "", known.anchor, known.checkpoint,
                                   known.token + TOKEN_GAP, tuple(runs.get(name, ()))))
        return seeds

    def forget(self, name: str) -> None:
        """Forget what this beat knows of ``name`` (it left the schedule; the store holds
        another anchor), and its newest writes of it: the store may remove the entry with
        its runs (an operator's prune), which says nothing of the store's age."""
        self.entries.pop(name, None)
        if self.newest_claim is not None and self.newest_claim.entry == name:
            self.newest_claim = None
        if self.newest_checked is not None and self.newest_checked.entry == name:
            self.newest_checked = None
        if self.newest_sent is not None and self.newest_sent.entry == name:
            self.newest_sent = None

    def seeds(self, descriptions: dict[str, str], held: list[Claim]) -> list[EntrySeed]:
        """What to register again after the store's epoch changed: every entry this beat
        has, with what it knows; the claims it held come back as due runs (nobody sent
        them), the runs it sent lately as sent (their messages may still be queued). The
        newest writes are forgotten: what is registered again replaces them."""
        self.newest_claim = self.newest_checked = self.newest_sent = None
        runs: dict[str, list[Run]] = {}
        for claim in held:
            runs.setdefault(claim.entry, []).append(
                Run(claim.entry, claim.due, RunState.DUE, manual=claim.manual,
                    attempts=claim.attempts))
        held_refs = {(c.entry, c.due) for c in held}
        for run in self.recent_runs():
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
