"""backfill: a manual run at each past instant that has none, or whose run ended without
running; what ran, runs or is on its way is kept; the checkpoint is not touched."""

from __future__ import annotations

import pytest

from beat_claims.enums import Overlap, Reason, RunState
from beat_claims.runs import Run
from beat_claims.stores.base import (
    CheckVerdict,
    ClaimStatus,
    EntrySeed,
    Outcome,
    Reclaim,
    Store,
)

from .helpers import A, B, check, claim, claims, entry, process, run, runs, send, started, take


def test_an_unknown_entry_cannot_be_backfilled(store: Store) -> None:
    assert store.backfill("nobody", [1000], "ops@host") is None


def test_instants_without_runs_become_manual_runs_taken_oldest_first(store: Store) -> None:
    state = entry(store)
    dues = [state.anchor - 3000, state.anchor - 1000, state.anchor - 2000]
    result = store.backfill("e", dues, "alice@ops")
    assert result is not None
    assert (result.entry, sorted(result.created), result.kept) == ("e", sorted(dues), ())
    for due in dues:
        r = run(store, ("e", due))
        assert (r.state, r.manual, r.requested_by) == (RunState.DUE, True, "alice@ops")
    taken = take(store, A)
    assert [c.due for c in taken] == sorted(dues)
    assert all(c.manual for c in taken)
    for c in taken:
        assert check(store, A, c, overlap=Overlap.SKIP).verdict is CheckVerdict.SEND
    # The checkpoint did not move.
    [record] = store.entries(["e"])
    assert record.checkpoint == state.checkpoint


def test_instants_that_ran_or_are_on_their_way_are_kept(store: Store) -> None:
    done, failed, sent, running, claimed, due_again = claims(
        store, A, 1000, 2000, 3000, 4000, 5000, 6000)
    for c in (done, failed, sent, running):
        send(store, A, c)
    for c in (done, failed, running):
        started(store, c, process(1))
    store.finish([Outcome("e", done.due, done.token, RunState.DONE),
                  Outcome("e", failed.due, failed.token, RunState.FAILED)])
    assert store.reclaim([Reclaim("e", due_again.due, due_again.token)], B.id) == [True]
    dues = [c.due for c in (done, failed, sent, running, claimed, due_again)]
    result = store.backfill("e", dues, "alice@ops")
    assert result is not None and result.created == ()
    assert dict(result.kept) == {
        done.due: RunState.DONE, failed.due: RunState.FAILED, sent.due: RunState.SENT,
        running.due: RunState.STARTED, claimed.due: RunState.CLAIMED,
        due_again.due: RunState.DUE}
    assert run(store, claimed).owner == A.id  # untouched


@pytest.mark.parametrize("ending", ["skipped", "lost", "cancelled"])
def test_a_run_that_ended_without_running_is_run_again(store: Store, ending: str) -> None:
    c = claims(store, A, 1000)[0]
    if ending == "skipped":
        check(store, A, c, skip=Reason.CATCH_UP)
    else:
        send(store, A, c)
        state = RunState.LOST if ending == "lost" else RunState.CANCELLED
        assert store.finish([Outcome("e", c.due, c.token, state)]) == [True]
    assert run(store, c).state is RunState(ending)
    result = store.backfill("e", [c.due], "alice@ops")
    assert result is not None and result.created == (c.due,)
    [again] = take(store, B)
    assert (again.due, again.manual) == (c.due, True)
    assert again.token > c.token
    # The old token cannot start it; the new one can.
    assert check(store, A, c).verdict is CheckVerdict.REFUSED
    assert check(store, B, again).verdict is CheckVerdict.SEND


def test_a_backfill_made_since_is_not_undone_when_a_beat_registers_what_it_sent(
        store: Store) -> None:
    """After a new epoch a beat registers the runs it sent lately; one whose instant an
    operator has backfilled since (its run ended without running) stays the backfill's,
    and is sent; the record of a run the beat sent as an operator's request is taken."""
    c, d = claims(store, A, 1000, 2000)
    for sent in (c, d):
        send(store, A, sent)
        assert store.finish([Outcome("e", sent.due, sent.token, RunState.CANCELLED)]) == [True]
    store.backfill("e", [c.due], "alice@ops")
    known = Run("e", c.due, RunState.SENT, token=c.token, owner=A.id, sent_at=c.due)
    store.register([EntrySeed("e", runs=(known,))])
    backfilled = run(store, c)
    assert (backfilled.state, backfilled.manual, backfilled.requested_by) == (
        RunState.DUE, True, "alice@ops")
    [again] = take(store, B)
    assert (again.due, again.manual) == (c.due, True)
    # A backfilled run the beat claimed and sent as such, in a copy put back to before its
    # claim: what the beat knows is newer.
    store.backfill("e", [d.due], "alice@ops")
    sent_since = Run("e", d.due, RunState.SENT, token=d.token + 5, owner=A.id,
                     sent_at=d.due, manual=True)
    store.register([EntrySeed("e", runs=(sent_since,))])
    assert (run(store, d).state, run(store, d).token) == (RunState.SENT, d.token + 5)


def test_asking_twice_sends_each_instant_once(store: Store) -> None:
    state = entry(store)
    dues = [state.anchor - 2000, state.anchor - 1000]
    first = store.backfill("e", dues, "alice@ops")
    assert first is not None and sorted(first.created) == dues
    second = store.backfill("e", dues, "alice@ops")  # the first reply was lost
    assert second is not None and second.created == ()
    assert sorted(second.kept) == [(d, RunState.DUE) for d in dues]
    assert sorted(c.due for c in take(store, A)) == dues


def test_backfilled_runs_are_sent_while_the_entry_is_paused(store: Store) -> None:
    state = entry(store)
    store.pause("e", "alice@ops")
    store.backfill("e", [state.anchor - 1000], "alice@ops")
    [c] = take(store, A)
    assert check(store, A, c).verdict is CheckVerdict.SEND


def test_a_backfilled_instant_is_not_claimed_again_by_the_schedule(store: Store) -> None:
    state = entry(store)
    due = state.anchor + 1000  # not yet claimed by any beat (a beat that fell behind)
    store.backfill("e", [due], "alice@ops")
    result = claim(store, A, state, due)
    assert result.status is ClaimStatus.OK
    assert result.claims == () and due in result.existing
    assert [c.due for c in result.taken] == [due]
    assert len(runs(store)) == 1
