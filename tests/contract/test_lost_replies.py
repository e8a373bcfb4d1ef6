"""Replies get lost: a client whose call timed out after the store executed it calls again
with the same arguments. Each method must make that harmless: no second token for one
claim, nothing counted twice, and the same answer where the contract says so."""

from __future__ import annotations

from beat_claims.enums import Overlap, Reason, RunState, StartVerdict
from beat_claims.stores.base import (
    Check,
    CheckVerdict,
    ClaimPlan,
    ClaimStatus,
    EntrySeed,
    Outcome,
    Reclaim,
    Release,
    Store,
)

from .helpers import (
    A,
    B,
    C,
    after,
    claims,
    clock_tokens,
    delivery,
    now,
    one_claim,
    process,
    query,
    register,
    run,
    runs,
    send,
    sending,
    started,
)


def test_register_twice_answers_the_same(store: Store) -> None:
    seeds = [EntrySeed("e", "every 1s", token=3), EntrySeed("f", checkpoint=5)]
    first = store.register(seeds)
    assert store.register(seeds) == first
    assert store.entries() == store.entries()


def test_a_claim_twice_hands_out_no_second_token_and_is_found_again(store: Store) -> None:
    state = register(store, "e")["e"]
    p = ClaimPlan("e", state, (state.anchor + 1000,), ((state.anchor + 500, Reason.CATCH_UP),))
    [first] = store.claim(A, [p])
    [again] = store.claim(A, [p])  # the first reply was lost
    assert again.status is ClaimStatus.CONFLICT and again.claims == ()
    assert again.state == first.state
    assert sorted(runs(store)) == [state.anchor + 500, state.anchor + 1000]
    [c] = first.claims
    assert store.entries(["e"])[0].token == c.token
    # The claim it never heard of is found from the records: held by it, since its claim.
    cutoff = after(store, run(store, c).claimed_at or 0)
    [h] = store.live_runs(query(A, live=(A,), mine_before=cutoff)).held
    assert (h.entry, h.due, h.token, h.owner) == ("e", c.due, c.token, A.id)


def test_taking_due_runs_twice_hands_out_no_second_token(store: Store) -> None:
    c = one_claim(store, A)
    store.release(A, [Release(c)])
    p = ClaimPlan("e", None)
    lowest = clock_tokens(store)
    [first] = store.claim(B, [p])
    [again] = store.claim(B, [p])
    [token] = [x.token for x in first.taken]
    assert token > c.token and token >= lowest, (token, c.token, lowest)
    assert again.status is ClaimStatus.OK and again.taken == () and again.claims == ()
    assert store.entries(["e"])[0].token == token
    assert run(store, c).owner == B.id


def test_a_check_twice_answers_the_same(store: Store) -> None:
    send_it, skip_it, overlapping = claims(store, A, 1000, 2000, 3000)
    checks = [Check(send_it, "t1"), Check(skip_it, "t2", Reason.CATCH_UP),
              Check(overlapping, "t3", overlap=Overlap.SKIP)]
    first = store.check(A, checks)
    assert [(a.verdict, a.reason) for a in first] == [
        (CheckVerdict.SEND, None), (CheckVerdict.SKIPPED, Reason.CATCH_UP),
        (CheckVerdict.SKIPPED, Reason.OVERLAP)]
    before = runs(store)
    again = store.check(A, checks)
    assert [(a.verdict, a.reason) for a in again] == [(a.verdict, a.reason) for a in first]
    assert {d: (r.state, r.reason, r.task_id) for d, r in runs(store).items()} == {
        d: (r.state, r.reason, r.task_id) for d, r in before.items()}


def test_record_sent_twice_is_harmless(store: Store) -> None:
    c = sending(store, A, one_claim(store, A))
    store.record_sent(A, [c])
    first = run(store, c)
    after(store, first.sent_at or 0)
    store.record_sent(A, [c])
    assert run(store, c) == first  # still sent, since the first mark


def test_release_twice_counts_one_attempt(store: Store) -> None:
    c = one_claim(store, A)
    item = Release(c, "broker down", "OSError")
    assert store.release(A, [item], max_attempts=2) == [RunState.DUE]
    assert store.release(A, [item], max_attempts=2) == [None]  # not A's to release any more
    r = run(store, c)
    assert (r.state, r.attempts) == (RunState.DUE, 1)
    [taken] = store.claim(B, [ClaimPlan("e", None)])[0].taken
    assert taken.attempts == 1


def test_reclaim_twice_is_harmless(store: Store) -> None:
    c = sending(store, A, one_claim(store, A))
    item = Reclaim(c.entry, c.due, c.token)
    assert store.reclaim([item], C.id) == [True]
    first = run(store, c)
    assert store.reclaim([item], C.id) == [False]
    assert run(store, c) == first
    lowest = clock_tokens(store)
    [taken] = store.claim(B, [ClaimPlan("e", None)])[0].taken
    assert taken.maybe_sent is True
    assert taken.token > c.token and taken.token >= lowest, (taken.token, c.token, lowest)
    # And once someone else holds it, the repeated reclaim does not take it from them.
    assert store.reclaim([item], C.id) == [False]
    assert run(store, c).owner == B.id


def test_start_twice_from_the_same_process_starts_it_once(store: Store) -> None:
    c = send(store, A, one_claim(store, A))
    d = delivery(c, process(1), task_id="t")
    assert store.start(d).verdict is StartVerdict.RUN
    first = run(store, c)
    again = store.start(d)
    assert again.verdict is not StartVerdict.BUSY  # not taken for another process
    assert run(store, c) == first
    found = store.lookup_task("t")
    assert found is not None and found.token == c.token


def test_finish_twice_records_once(store: Store) -> None:
    c = send(store, A, one_claim(store, A))
    started(store, c, process(1))
    outcome = Outcome(c.entry, c.due, c.token, RunState.FAILED, exc_type="E", exc_message="1")
    assert store.finish([outcome]) == [True]
    first = run(store, c)
    after(store, first.finished_at or 0)
    assert store.finish([outcome]) == [False]
    assert run(store, c) == first
    lost = Outcome(c.entry, c.due, None, RunState.LOST, Reason.RUN_TIMEOUT,
                   inactive_since=now(store) + 1)
    assert store.finish([lost, lost]) == [False, False]


def test_a_presumption_of_loss_twice_records_once(store: Store) -> None:
    c = send(store, A, one_claim(store, A))
    lost = Outcome(c.entry, c.due, c.token, RunState.LOST, Reason.RUN_TIMEOUT,
                   inactive_since=after(store, run(store, c).sent_at or 0))
    assert store.finish([lost]) == [True]
    first = run(store, c)
    assert store.finish([lost]) == [False]
    assert run(store, c) == first


def test_heartbeat_and_leave_twice_are_harmless(store: Store) -> None:
    first = store.heartbeat(A, 10)
    again = store.heartbeat(A, 10)
    assert (again.epoch, again.settle_until) == (first.epoch, first.settle_until)
    store.leave(A)
    store.leave(A)
    assert {s.owner.id: s.alive for s in store.owners()}[A.id] is False


def test_reads_twice_answer_the_same(store: Store) -> None:
    c = send(store, A, one_claim(store, A))
    started(store, c, process(1), task_id="t")
    before = now(store) + 1
    q = query(C, held_before=before)
    assert store.live_runs(q) == store.live_runs(q)
    assert store.open_runs(before) == store.open_runs(before)
    assert store.history("e") == store.history("e")
    assert store.lookup_task("t") == store.lookup_task("t")


def test_request_run_twice_records_two_runs_and_overwrites_nothing(store: Store) -> None:
    # The contract has no request id: a repeated request is a second request. What must
    # hold is that neither overwrites anything.
    register(store, "e")
    first = store.request_run("e", "operator:alice")
    second = store.request_run("e", "operator:alice")
    assert first is not None and second is not None and first != second
    assert {d: r.state for d, r in runs(store).items()} == {first: RunState.DUE,
                                                           second: RunState.DUE}
