"""claim: a compare-and-set on each entry's checkpoint, a fresh token per claim, planned
skips recorded, due runs taken, existing runs never overwritten, the history bounded."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest

from beat_claims.enums import Reason, RunState, StartVerdict
from beat_claims.stores.base import (
    Claim,
    ClaimPlan,
    ClaimStatus,
    EntryState,
    Outcome,
    Reclaim,
    Release,
    Store,
)

from .conftest import Backend
from .helpers import (
    A,
    B,
    C,
    above_clock,
    claim,
    claims,
    clock_tokens,
    delivery,
    now,
    one_claim,
    owner,
    plan,
    process,
    register,
    run,
    runs,
    send,
    sending,
    started,
    take,
)


def done(store: Store, c: Claim) -> None:
    send(store, A, c)
    started(store, c, process(1))
    assert store.finish([Outcome(c.entry, c.due, c.token, RunState.DONE)]) == [True]


def test_claims_get_fresh_increasing_tokens_and_move_the_checkpoint(store: Store) -> None:
    state = register(store, "e")["e"]
    a = state.anchor
    lowest = clock_tokens(store)
    first = claim(store, A, state, a + 1000, a + 2000)
    assert first.status is ClaimStatus.OK
    # From the clock, then one up within the call.
    t = first.claims[0].token
    assert t >= lowest, (t, lowest)
    assert [(c.entry, c.due, c.token) for c in first.claims] == [("e", a + 1000, t),
                                                                 ("e", a + 2000, t + 1)]
    assert first.state == EntryState(a, a + 2000, t + 1)
    lowest = clock_tokens(store)
    second = claim(store, B, first.state, a + 3000)
    [(due, t3)] = [(c.due, c.token) for c in second.claims]
    assert due == a + 3000 and t3 > t + 1 and t3 >= lowest, (t, t3, lowest)
    assert second.state == EntryState(a, a + 3000, t3)
    found = runs(store)
    assert {d: (r.state, r.token, r.owner) for d, r in found.items()} == {
        a + 1000: (RunState.CLAIMED, t, A.id), a + 2000: (RunState.CLAIMED, t + 1, A.id),
        a + 3000: (RunState.CLAIMED, t3, B.id)}
    assert [r.due for r in store.history("e")] == [a + 3000, a + 2000, a + 1000]  # newest first
    assert [r.due for r in store.history("e", limit=2)] == [a + 3000, a + 2000]
    assert store.history("e", limit=0) == []


def test_a_stale_plan_writes_nothing_and_returns_the_store_state(store: Store) -> None:
    state = register(store, "e")["e"]
    a = state.anchor
    [c] = claim(store, A, state, a + 1000).claims
    before = runs(store)
    stale = claim(store, B, state, a + 2000, skip=((a + 1500, Reason.CATCH_UP),))
    assert stale.status is ClaimStatus.CONFLICT
    assert stale.state == EntryState(a, a + 1000, c.token)
    assert (stale.claims, stale.skipped, stale.taken, stale.existing) == ((), (), (), ())
    assert runs(store) == before
    assert store.entries(["e"])[0].token == c.token
    # A plan from another anchor is stale too.
    other = claim(store, B, EntryState(a - 1, a + 1000, c.token), a + 2000)
    assert other.status is ClaimStatus.CONFLICT and other.state == stale.state
    # With the store's state, the plan goes through.
    assert [c.due for c in claim(store, B, stale.state, a + 2000).claims] == [a + 2000]


def test_no_token_is_handed_out_at_or_below_the_token_floor(store: Store) -> None:
    state = register(store, "e")["e"]
    a = state.anchor
    floor = above_clock(store)  # (a floor below the clock's: test_tokens_from_the_clock.py)
    result = claim(store, A, state, a + 1000, a + 2000, token_floor=floor)
    assert [c.token for c in result.claims] == [floor + 1, floor + 2]
    assert result.state is not None and result.state.token == floor + 2
    # The counter was raised: a later claim without a floor continues above it.
    assert [c.token for c in claim(store, A, result.state, a + 3000).claims] == [floor + 3]
    # A floor below the counter changes nothing.
    later = claim(store, A, EntryState(a, a + 3000, floor + 3), a + 4000, token_floor=2)
    assert [c.token for c in later.claims] == [floor + 4]


def test_the_checkpoint_only_moves_forward(store: Store) -> None:
    state = register(store, "e")["e"]
    a = state.anchor
    claim(store, A, state, a + 5000)
    # The right expected state, but an instant at or behind the checkpoint: nothing new.
    result = claim(store, A, EntryState(a, a + 5000, 1), a + 3000, a + 5000)
    assert result.status is ClaimStatus.OK and result.claims == ()
    assert result.state is not None and result.state.checkpoint == a + 5000
    assert sorted(runs(store)) == [a + 5000]
    assert store.entries(["e"])[0].checkpoint == a + 5000


def test_planned_skips_are_recorded_with_their_reason(store: Store) -> None:
    state = register(store, "e")["e"]
    a = state.anchor
    floor = above_clock(store)
    result = claim(store, A, state, a + 4000, skip=(
        (a + 1000, Reason.CATCH_UP_WINDOW), (a + 2000, Reason.CATCH_UP),
        (a + 3000, Reason.MAX_CATCH_UP)), token_floor=floor)
    assert result.skipped == ((a + 1000, Reason.CATCH_UP_WINDOW), (a + 2000, Reason.CATCH_UP),
                              (a + 3000, Reason.MAX_CATCH_UP))
    assert [c.due for c in result.claims] == [a + 4000]
    assert [c.token for c in result.claims] == [floor + 1]  # skips take no token
    found = runs(store)
    assert {d: (r.state, r.reason) for d, r in found.items()} == {
        a + 1000: (RunState.SKIPPED, Reason.CATCH_UP_WINDOW),
        a + 2000: (RunState.SKIPPED, Reason.CATCH_UP),
        a + 3000: (RunState.SKIPPED, Reason.MAX_CATCH_UP),
        a + 4000: (RunState.CLAIMED, None)}
    # Skips alone move the checkpoint too.
    assert result.state is not None
    only = claim(store, A, result.state, skip=((a + 5000, Reason.CATCH_UP),))
    assert only.state is not None and only.state.checkpoint == a + 5000
    assert runs(store)[a + 5000].state is RunState.SKIPPED


def test_take_due_claims_released_reclaimed_and_requested_runs_as_taken(
        store: Store) -> None:
    released, failed_once, being_sent = claims(store, A, 1000, 2000, 3000)
    before = max(released.token, failed_once.token, being_sent.token)
    assert store.release(A, [Release(released)]) == [RunState.DUE]
    assert store.release(A, [Release(failed_once, "broker down", "OSError")],
                         max_attempts=3) == [RunState.DUE]
    sending(store, A, being_sent)
    assert store.reclaim([Reclaim("e", being_sent.due, being_sent.token)], B.id) == [True]
    requested = store.request_run("e", "operator:alice")
    assert requested is not None
    lowest = clock_tokens(store)
    result = claim(store, B, None)
    assert result.status is ClaimStatus.OK and result.claims == ()
    taken = {c.due: c for c in result.taken}
    assert set(taken) == {released.due, failed_once.due, being_sent.due, requested}
    assert {(c.manual, c.maybe_sent, c.attempts) for c in [taken[released.due]]} == {
        (False, False, 0)}
    assert (taken[failed_once.due].attempts, taken[failed_once.due].maybe_sent) == (1, False)
    assert taken[being_sent.due].maybe_sent is True
    assert taken[requested].manual is True
    # Fresh tokens, each above every token handed out before (and the clock's), one up
    # from the first within the call.
    tokens = sorted(c.token for c in taken.values())
    first = tokens[0]
    assert first > before and first >= lowest, (tokens, before, lowest)
    assert tokens == [first, first + 1, first + 2, first + 3]
    assert result.state is not None and result.state.token == first + 3
    for c in taken.values():
        r = run(store, c)
        assert (r.state, r.owner, r.token) == (RunState.CLAIMED, B.id, c.token)
    # Taken runs are held now: nothing is due any more.
    assert take(store, C) == ()


def test_take_due_false_leaves_due_runs_alone(store: Store) -> None:
    c = one_claim(store, A)
    store.release(A, [Release(c)])
    state = register(store, "e")["e"]
    result = claim(store, B, state, state.anchor + 2000, take_due=False)
    assert [x.due for x in result.claims] == [state.anchor + 2000] and result.taken == ()
    assert run(store, c).state is RunState.DUE


def test_a_claim_of_an_unknown_entry_is_missing_and_writes_nothing(store: Store) -> None:
    state = register(store, "e")["e"]
    results = store.claim(A, [plan(EntryState(state.anchor, None), state.anchor + 1000,
                                   entry="nobody"),
                              plan(None, entry="nobody-either"),
                              plan(state, state.anchor + 1000)])
    assert [r.status for r in results] == [ClaimStatus.MISSING, ClaimStatus.MISSING,
                                           ClaimStatus.OK]
    assert [r.entry for r in results] == ["nobody", "nobody-either", "e"]
    assert results[0].claims == () and store.history("nobody") == []
    assert [e.name for e in store.entries()] == ["e"]


def test_a_planned_instant_that_already_has_a_run_is_existing_and_never_overwritten(
        store: Store) -> None:
    state = register(store, "e")["e"]
    due = store.request_run("e", "operator:alice")
    assert due is not None
    before = run(store, ("e", due))
    # The schedule says an occurrence falls on the same millisecond.
    result = claim(store, A, state, due, take_due=False)
    assert result.status is ClaimStatus.OK
    assert result.existing == (due,) and result.claims == ()
    assert run(store, ("e", due)) == before  # still the operator's manual, due run
    assert result.state is not None and result.state.checkpoint == due
    assert result.state.token == 0
    # An instant that has a final run is not overwritten either.
    c = claim(store, A, result.state, due + 1000).claims[0]
    done(store, c)
    final = run(store, c)
    again = claim(store, B, EntryState(state.anchor, None, 0), due + 1000)
    assert again.status is ClaimStatus.CONFLICT  # (the checkpoint moved)
    assert run(store, c) == final


@pytest.mark.history_limit(3)
def test_the_history_keeps_history_limit_runs_dropping_final_ones_first(store: Store) -> None:
    first = claims(store, A, 1000, 2000, 3000)
    a = first[0].due - 1000
    done(store, first[0])
    done(store, first[1])
    state = register(store, "e")["e"]
    claim(store, A, state, a + 4000, a + 5000)
    assert sorted(runs(store)) == [a + 3000, a + 4000, a + 5000]
    # Live runs are never dropped, even beyond the limit.
    state = register(store, "e")["e"]
    claim(store, A, state, a + 6000, a + 7000, a + 8000)
    assert sorted(runs(store)) == [a + d for d in range(3000, 9000, 1000)]
    assert all(r.state is RunState.CLAIMED for r in store.history("e"))


@pytest.mark.history_limit(3)
def test_final_runs_are_dropped_even_behind_an_older_live_run(store: Store) -> None:
    old, d2, d3 = claims(store, A, 1000, 2000, 3000)
    a = old.due - 1000
    done(store, d2)
    done(store, d3)
    state = register(store, "e")["e"]
    claim(store, A, state, a + 4000)  # four runs: the oldest is live, two are final
    assert sorted(runs(store)) == [a + 1000, a + 3000, a + 4000]
    state = register(store, "e")["e"]
    claim(store, A, state, a + 5000)
    assert sorted(runs(store)) == [a + 1000, a + 4000, a + 5000]
    assert run(store, old).state is RunState.CLAIMED


@pytest.mark.history_limit(2)
def test_a_sent_run_never_started_pushed_out_of_the_history_is_presumed_lost(
        store: Store) -> None:
    pushed = send(store, A, one_claim(store, A, 1000))
    running = send(store, A, one_claim(store, A, 2000))
    started(store, running, process(1))
    state = register(store, "e")["e"]
    claim(store, A, state, pushed.due + 2000)  # three live runs for a limit of two
    assert sorted(runs(store)) == [running.due, pushed.due + 2000]
    # Pushed out as lost (reason history_limit): final, so neither open nor finished by a
    # late outcome; a started run is never pushed out.
    assert [(o.due, o.state) for o in store.open_runs(before=now(store) + 1)] == [
        (running.due, RunState.STARTED)]
    assert store.finish([Outcome("e", pushed.due, pushed.token, RunState.DONE)]) == [False]
    # Its record is kept for a late delivery, which revives it.
    assert store.start(delivery(pushed, process(2))).verdict is StartVerdict.RUN
    assert runs(store)[pushed.due].state is RunState.STARTED


def _claim_race(backend: Backend, store: Store, state: EntryState, due: int,
                barrier: Any, out: Any, n: int) -> None:
    mine = backend.reopen(store)
    barrier.wait(10)
    who = owner(10 + n)
    [result] = mine.claim(who, [ClaimPlan("e", state, (due,))])
    out.put((who.id, result.status.value, [c.token for c in result.claims]))


def test_concurrent_claims_of_one_occurrence_from_many_processes_exactly_one_wins(
        store: Store, backend: Backend) -> None:
    state = register(store, "e")["e"]
    due = state.anchor + 1000
    lowest = clock_tokens(store)
    ctx = multiprocessing.get_context("fork")
    n = 12
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_claim_race,
                         args=(backend, store, state, due, barrier, out, i))
             for i in range(n)]
    for p in procs:
        p.start()
    try:
        answers = [out.get(timeout=30) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
    assert [p.exitcode for p in procs] == [0] * n
    wins = [(who, tokens) for who, _, tokens in answers if tokens]
    assert len(wins) == 1 and len(wins[0][1]) == 1, answers
    [token] = wins[0][1]
    assert token >= lowest, (answers, lowest)
    assert {status for _, status, _ in answers} <= {"ok", "conflict"}
    [r] = store.history("e")
    assert (r.due, r.token, r.state, r.owner) == (due, token, RunState.CLAIMED, wins[0][0])
    assert store.entries(["e"])[0].token == token  # no other token was handed out


def test_one_call_answers_each_plan_in_order(store: Store) -> None:
    states = register(store, "e", "f", "g")
    a = states["e"].anchor
    claim(store, A, states["f"], a + 1000, entry="f")
    floor = above_clock(store)  # (each entry counts on from it: its own counter)
    results = store.claim(B, [plan(states["g"], a + 1000, entry="g", token_floor=floor),
                              plan(states["f"], a + 2000, entry="f"),  # stale
                              plan(None, entry="unknown"),
                              plan(states["e"], a + 1000, entry="e", token_floor=floor)])
    assert [(r.entry, r.status) for r in results] == [
        ("g", ClaimStatus.OK), ("f", ClaimStatus.CONFLICT), ("unknown", ClaimStatus.MISSING),
        ("e", ClaimStatus.OK)]
    assert [[c.token for c in r.claims] for r in results] == [
        [floor + 1], [], [], [floor + 1]]
