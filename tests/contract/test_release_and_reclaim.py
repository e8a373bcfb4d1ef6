"""release (the holder gives a claim back) and reclaim (a sweep or an operator takes it
back): the run is due again, its next claim gets a fresh token, the old holder is fenced."""

from __future__ import annotations

from beat_claims.enums import Reason, RunState
from beat_claims.stores.base import CheckVerdict, Claim, Outcome, Reclaim, Release, Store

from .helpers import (
    A,
    B,
    C,
    check,
    claims,
    now,
    one_claim,
    process,
    query,
    run,
    send,
    sending,
    started,
    take,
)


def due_refs(store: Store) -> list[tuple[str, int]]:
    return sorted((r.entry, r.due) for r in store.live_runs(query(C)).due)


def test_only_the_owner_with_the_right_token_releases(store: Store) -> None:
    c = one_claim(store, A)
    assert store.release(B, [Release(c)]) == [None]
    assert store.release(A, [Release(Claim(c.entry, c.due, c.token + 1))]) == [None]
    assert run(store, c).state is RunState.CLAIMED
    assert store.release(A, [Release(c)]) == [RunState.DUE]
    r = run(store, c)
    assert r.state is RunState.DUE and r.owner is None
    assert due_refs(store) == [("e", c.due)]


def test_a_released_run_stays_due_until_someone_claims_it_with_a_fresh_token(
        store: Store) -> None:
    c = one_claim(store, A)
    store.release(A, [Release(c)])
    assert due_refs(store) == [("e", c.due)]
    assert due_refs(store) == [("e", c.due)]  # reading does not consume it
    [again] = take(store, B)
    assert (again.due, again.token > c.token) == (c.due, True)
    assert due_refs(store) == []
    # The old holder is fenced: its check, release and sent mark are refused.
    assert check(store, A, c).verdict is CheckVerdict.REFUSED
    assert store.release(A, [Release(c)]) == [None]
    assert store.record_sent(A, [c]) == 0
    assert (run(store, c).owner, run(store, c).token) == (B.id, again.token)


def test_a_release_after_the_check_makes_the_run_due_again(store: Store) -> None:
    c = sending(store, A, one_claim(store, A))
    assert store.release(A, [Release(c, "connection refused", "OSError")],
                         max_attempts=5) == [RunState.DUE]
    assert due_refs(store) == [("e", c.due)]


def test_publish_errors_are_counted_and_at_max_attempts_the_run_fails(store: Store) -> None:
    c = one_claim(store, A)
    for attempt in (1, 2):
        state = store.release(A, [Release(c, f"broker down {attempt}", "OSError")],
                              max_attempts=3)
        assert state == [RunState.DUE]
        [c] = take(store, A)
        assert c.attempts == attempt
    sending(store, A, c)
    assert store.release(A, [Release(c, "broker down 3", "OSError")],
                         max_attempts=3) == [RunState.FAILED]
    r = run(store, c)
    assert (r.state, r.reason, r.exc_type, r.exc_message, r.attempts) == (
        RunState.FAILED, Reason.PUBLISH_ERROR, "OSError", "broker down 3", 3)
    assert due_refs(store) == []
    assert take(store, B) == ()
    # Final: nothing brings it back.
    assert store.release(A, [Release(c)]) == [None]
    assert store.reclaim([Reclaim(c.entry, c.due, None)], "operator:alice") == [False]


def test_a_plain_release_does_not_count_an_attempt(store: Store) -> None:
    c = one_claim(store, A)
    store.release(A, [Release(c)], max_attempts=1)
    [c] = take(store, A)
    assert c.attempts == 0
    assert store.release(A, [Release(c)], max_attempts=1) == [RunState.DUE]


def test_one_release_call_answers_each_item(store: Store) -> None:
    mine, sent, theirs = claims(store, A, 1000, 2000, 3000)
    send(store, A, sent)
    store.reclaim([Reclaim("e", theirs.due, theirs.token)], B.id)
    assert store.release(A, [Release(mine), Release(sent), Release(theirs)]) == [
        RunState.DUE, None, None]
    assert run(store, sent).state is RunState.SENT


def test_reclaim_with_the_right_token_makes_the_run_due_and_fences_the_holder(
        store: Store) -> None:
    c = one_claim(store, A)
    assert store.reclaim([Reclaim(c.entry, c.due, c.token)], B.id) == [True]
    r = run(store, c)
    assert r.state is RunState.DUE
    assert (r.reclaimed_from, r.released_by) == (A.id, B.id)
    assert due_refs(store) == [("e", c.due)]
    assert check(store, A, c).verdict is CheckVerdict.REFUSED
    assert store.release(A, [Release(c)]) == [None]
    [again] = take(store, B)
    assert again.token > c.token and not again.maybe_sent
    assert check(store, B, again).verdict is CheckVerdict.SEND


def test_reclaim_of_a_run_being_sent_marks_it_maybe_sent(store: Store) -> None:
    c = sending(store, A, one_claim(store, A))
    assert store.reclaim([Reclaim(c.entry, c.due, c.token)], B.id) == [True]
    [again] = take(store, B)
    assert again.maybe_sent is True
    assert store.record_sent(A, [c]) == 0  # the old holder's late sent mark is refused
    assert run(store, again).state is RunState.CLAIMED


def test_reclaim_with_a_stale_token_does_nothing(store: Store) -> None:
    c = one_claim(store, A)
    store.release(A, [Release(c)])
    [again] = take(store, B)
    before = run(store, again)
    assert store.reclaim([Reclaim(c.entry, c.due, c.token)], C.id) == [False]
    assert run(store, again) == before
    assert check(store, B, again).verdict is CheckVerdict.SEND


def test_reclaim_without_a_token_takes_the_run_back_whoever_holds_it(store: Store) -> None:
    first, second = claims(store, A, 1000, 2000)
    store.reclaim([Reclaim("e", second.due, second.token)], C.id)
    [second] = take(store, B)
    assert store.reclaim([Reclaim("e", first.due, None), Reclaim("e", second.due, None)],
                         "operator:alice") == [True, True]
    assert due_refs(store) == [("e", first.due), ("e", second.due)]
    assert run(store, first).released_by == "operator:alice"
    assert check(store, A, first).verdict is CheckVerdict.REFUSED
    assert check(store, B, second).verdict is CheckVerdict.REFUSED


def test_reclaim_leaves_runs_that_are_not_held_alone(store: Store) -> None:
    sent, running, finished, released = claims(store, A, 1000, 2000, 3000, 4000)
    send(store, A, sent)
    send(store, A, running)
    started(store, running, process(1))
    send(store, A, finished)
    started(store, finished, process(1))
    store.finish([Outcome("e", finished.due, finished.token, RunState.DONE)])
    store.release(A, [Release(released)])
    before = {d: run(store, c) for d, c in enumerate((sent, running, finished, released))}
    items = [Reclaim("e", c.due, None) for c in (sent, running, finished, released)]
    items += [Reclaim("e", sent.due + 1, None), Reclaim("nobody", sent.due, None)]
    assert store.reclaim(items, "operator:alice") == [False] * 6
    assert {d: run(store, c) for d, c in enumerate((sent, running, finished, released))} == (
        before)
    assert store.live_runs(query(C, held_before=now(store) + 1)).held == ()
