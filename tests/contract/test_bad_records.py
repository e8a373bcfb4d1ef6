"""A record that cannot be read affects only its own item: every other item of the same
call gets its answer, and nothing raises (a bad record is not a store outage)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from beat_claims.beat.knowledge import TOKEN_GAP
from beat_claims.enums import RunState, StartVerdict
from beat_claims.runs import Run
from beat_claims.stores.base import (
    Check,
    CheckVerdict,
    Claim,
    ClaimStatus,
    EntrySeed,
    Outcome,
    Reclaim,
    Release,
    Store,
)

from .conftest import Backend
from .helpers import (
    A,
    C,
    above_clock,
    check,
    claim,
    claims,
    delivery,
    now,
    one_claim,
    plan,
    process,
    query,
    register,
    run,
    runs,
    send,
    sending,
    started,
)

#: Ways a run's record can be unreadable, each from its due instant.
BAD: dict[str, Callable[[int], str]] = {
    "invalid-json": lambda due: f'{{"due": {due}, "state": "claimed", "tok',
    "string-for-a-number": lambda due: json.dumps(
        {"due": due, "state": "claimed", "token": "seven", "owner": A.id,
         "claimed_at": "yesterday"}),
    "digits-for-a-number": lambda due: json.dumps(
        {"due": due, "state": "sent", "token": "1", "sent_at": str(due)}),
    "not-an-object": lambda due: json.dumps([due, "claimed", 1]),
    "unknown-state": lambda due: json.dumps({"due": due, "state": "exploded", "token": 1}),
    "wrong-due": lambda due: json.dumps({"due": "soon", "state": "sent", "token": 1}),
}


@pytest.fixture(params=sorted(BAD))
def bad(request: pytest.FixtureRequest) -> Callable[[int], str]:
    return BAD[request.param]


def spoil(store: Store, backend: Backend, bad: Callable[[int], str], c: Claim) -> None:
    backend.corrupt_run(store, c.entry, c.due, bad(c.due))


def test_claim_answers_every_plan_and_the_entry_goes_on(
        store: Store, backend: Backend, bad: Callable[[int], str]) -> None:
    spoilt, fine = claims(store, A, 1000, 2000)
    store.release(A, [Release(fine)])
    other = one_claim(store, A, entry="f")
    store.release(A, [Release(other)])
    spoil(store, backend, bad, spoilt)
    states = register(store, "e", "f")
    results = store.claim(C, [
        plan(states["e"], spoilt.due + 2000),
        plan(states["f"], other.due + 1000, entry="f")])
    assert [r.status for r in results] == [ClaimStatus.OK, ClaimStatus.OK]
    assert [c.due for c in results[0].claims] == [spoilt.due + 2000]
    assert [c.due for c in results[0].taken] == [fine.due]
    assert [c.due for c in results[1].claims] == [other.due + 1000]
    assert [c.due for c in results[1].taken] == [other.due]


def test_check_answers_every_claim(store: Store, backend: Backend,
                                   bad: Callable[[int], str]) -> None:
    spoilt, fine = claims(store, A, 1000, 2000)
    other = one_claim(store, A, entry="f")
    spoil(store, backend, bad, spoilt)
    answers = store.check(A, [Check(spoilt, "t1"), Check(fine, "t2"), Check(other, "t3")])
    assert answers[0].verdict is CheckVerdict.REFUSED and answers[0].why
    assert [a.verdict for a in answers[1:]] == [CheckVerdict.SEND, CheckVerdict.SEND]
    assert store.record_sent(A, [spoilt, fine, other]) == 2


def test_release_reclaim_start_and_finish_answer_every_item(
        store: Store, backend: Backend, bad: Callable[[int], str]) -> None:
    spoilt, released, reclaimed, running = claims(store, A, 1000, 2000, 3000, 4000)
    send(store, A, running)
    spoil(store, backend, bad, spoilt)
    assert store.release(A, [Release(spoilt), Release(released)]) == [None, RunState.DUE]
    assert store.reclaim([Reclaim("e", spoilt.due, None),
                          Reclaim("e", reclaimed.due, reclaimed.token)], C.id) == [False, True]
    store.start(delivery(spoilt, process(1)))  # answers (how is the backend's call)
    assert store.start(delivery(running, process(1))).verdict is StartVerdict.RUN
    assert store.finish([Outcome("e", spoilt.due, spoilt.token, RunState.DONE),
                         Outcome("e", running.due, running.token, RunState.DONE)]) == [
        False, True]
    assert run(store, running).state is RunState.DONE


def test_sweeps_and_history_list_every_other_run(store: Store, backend: Backend,
                                                 bad: Callable[[int], str]) -> None:
    spoilt_held, held, spoilt_sent, sent, released = claims(
        store, A, 1000, 2000, 3000, 4000, 5000)
    send(store, A, spoilt_sent)
    send(store, A, sent)
    store.release(A, [Release(released)])
    other = sending(store, A, one_claim(store, A, entry="f"))
    spoil(store, backend, bad, spoilt_held)
    spoil(store, backend, bad, spoilt_sent)
    cutoff = now(store) + 1
    found = store.live_runs(query(C, held_before=cutoff))
    assert {(h.entry, h.due) for h in found.held} >= {("e", held.due), ("f", other.due)}
    assert {(r.entry, r.due) for r in found.due} == {("e", released.due)}
    opened = {(o.entry, o.due) for o in store.open_runs(before=cutoff)}
    assert ("e", sent.due) in opened
    history = runs(store)
    assert {held.due, sent.due, released.due} <= set(history)
    assert all(isinstance(r, Run) for r in history.values())


def test_register_and_request_run_answer_with_a_bad_run_in_the_entry(
        store: Store, backend: Backend, bad: Callable[[int], str]) -> None:
    spoilt = one_claim(store, A)
    spoil(store, backend, bad, spoilt)
    known = (Run("e", spoilt.due, RunState.DONE, token=spoilt.token),
             Run("e", spoilt.due + 1000, RunState.SENT, token=9))
    states = store.register([EntrySeed("e", runs=known), EntrySeed("f")])
    assert set(states) == {"e", "f"}
    assert run(store, ("e", spoilt.due + 1000)).state is RunState.SENT
    assert store.request_run("e", "operator:alice") is not None


@pytest.mark.history_limit(2)
def test_bad_runs_are_trimmed_from_the_history_like_final_ones(
        store: Store, backend: Backend, bad: Callable[[int], str]) -> None:
    first, second = claims(store, A, 1000, 2000)
    spoil(store, backend, bad, first)
    state = register(store, "e")["e"]
    assert claim(store, A, state, second.due + 1000).status is ClaimStatus.OK
    assert sorted(runs(store)) == [second.due, second.due + 1000]


def test_a_corrupt_entry_is_reported_and_the_other_plans_answer(
        store: Store, backend: Backend) -> None:
    states = register(store, "e", "f")
    c = one_claim(store, A, entry="e")
    backend.corrupt_entry_field(store, "e", "checkpoint", "yesterday")
    results = store.claim(A, [plan(states["e"], c.due + 1000),
                              plan(states["f"], c.due, entry="f")])
    assert results[0].status is ClaimStatus.CORRUPT and results[0].detail
    assert results[1].status is ClaimStatus.OK and len(results[1].claims) == 1
    # The entry's runs still answer, and the worker is not stopped by it.
    assert check(store, A, c).verdict is CheckVerdict.SEND
    started(store, c, process(1))
    assert [r.name for r in store.entries()] == ["e", "f"]


def test_a_token_counter_stored_as_a_whole_float_is_read_as_its_number(
        store: Store, backend: Backend) -> None:
    """A counter written as '5.0' (by a tool, a restore) is the number 5: a claim that hands
    out no token reads it, and so do the other plans of the same call (found in review: the
    reply of the whole batch could not be read). One that hands out a token gets one above
    it, or, where the store cannot count on from such a value (Redis' HINCRBY), reports the
    entry corrupt alone; registering it again (the beat's repair) makes it claimable. (The
    number is above the clock's tokens, which would hide a counter read as less.)"""
    states = register(store, "e", "f")
    n = above_clock(store)
    backend.corrupt_entry_field(store, "e", "token", f"{n}.0")
    results = store.claim(A, [plan(None), plan(states["f"], states["f"].anchor + 1000,
                                               entry="f")])
    assert [r.status for r in results] == [ClaimStatus.OK, ClaimStatus.OK]
    assert results[0].state is not None and results[0].state.token == n
    assert len(results[1].claims) == 1
    state = results[0].state
    first = claim(store, A, state, state.anchor + 1000)
    if first.status is ClaimStatus.CORRUPT:
        state = store.register([EntrySeed("e", "every 1s (e)", state.anchor,
                                          state.checkpoint, n + TOKEN_GAP)])["e"]
        first = claim(store, A, state, state.anchor + 1000)
    assert first.status is ClaimStatus.OK and first.claims[0].token > n


@pytest.mark.parametrize("raw", ["inf", "1e400"])
def test_a_token_counter_that_is_no_whole_number_makes_only_its_entry_corrupt(
        store: Store, backend: Backend, raw: str) -> None:
    states = register(store, "e", "f")
    backend.corrupt_entry_field(store, "e", "token", raw)
    results = store.claim(A, [plan(None), plan(states["f"], states["f"].anchor + 1000,
                                               entry="f")])
    assert results[0].status is ClaimStatus.CORRUPT  # reported, so that the beat repairs it
    assert results[1].status is ClaimStatus.OK and len(results[1].claims) == 1
    # (the repair's counter above the clock's tokens: a claim counts on from it)
    repaired = above_clock(store)
    state = store.register([EntrySeed("e", "every 1s (e)", states["e"].anchor, None,
                                      repaired)])["e"]
    c = claim(store, A, state, state.anchor + 1000)
    assert c.status is ClaimStatus.OK and c.claims[0].token > repaired


@pytest.mark.parametrize("written", [lambda n: f"{n}.0", lambda n: f"{n // 1000}e3"],
                         ids=["5.0", "5e0"])
def test_a_token_counter_written_otherwise_counts_on_without_a_repair(
        store: Store, backend: Backend, written: Callable[[int], str]) -> None:
    """A whole number written otherwise is counted on from (found in review: Redis' HINCRBY
    refused it, and a beat that knew nothing of the entry could not repair it). (The number
    is above the clock's tokens, which would hide a counter read as less.)"""
    state = register(store, "e")["e"]
    n = above_clock(store) // 1000 * 1000
    backend.corrupt_entry_field(store, "e", "token", written(n))
    result = claim(store, A, state, state.anchor + 1000)
    assert result.status is ClaimStatus.OK and result.claims[0].token == n + 1
