"""check (the last word before a publish) and record_sent: only the current token's holder
sends; skips and the overlap policy are decided in the store; sent marks are idempotent."""

from __future__ import annotations

import pytest

from beat_claims.enums import Overlap, Reason, RunState
from beat_claims.stores.base import (
    Check,
    CheckVerdict,
    Claim,
    Outcome,
    Reclaim,
    Release,
    Store,
)

from .helpers import (
    A,
    B,
    check,
    claims,
    now,
    one_claim,
    process,
    run,
    send,
    sending,
    started,
    take,
)


def test_only_the_current_token_holder_passes_and_the_run_becomes_sending(
        store: Store) -> None:
    c = one_claim(store, A)
    other = check(store, B, c)
    assert other.verdict is CheckVerdict.REFUSED and other.why
    stale = check(store, A, Claim(c.entry, c.due, c.token - 1))
    assert stale.verdict is CheckVerdict.REFUSED and stale.why
    assert run(store, c).state is RunState.CLAIMED
    ok = check(store, A, c, task_id="the-task-id")
    assert (ok.verdict, ok.claim) == (CheckVerdict.SEND, c)
    r = run(store, c)
    assert (r.state, r.task_id, r.owner, r.token) == (RunState.SENDING, "the-task-id", A.id,
                                                      c.token)


def test_a_holder_whose_claim_was_taken_back_is_refused(store: Store) -> None:
    c = one_claim(store, A)
    assert store.reclaim([Reclaim(c.entry, c.due, c.token)], B.id) == [True]
    [new] = take(store, B)
    assert new.token > c.token
    refused = check(store, A, c)
    assert refused.verdict is CheckVerdict.REFUSED and refused.why
    assert check(store, B, new).verdict is CheckVerdict.SEND


def test_checking_again_after_a_lost_reply_answers_send_again(store: Store) -> None:
    c = one_claim(store, A)
    assert check(store, A, c).verdict is CheckVerdict.SEND
    assert check(store, A, c).verdict is CheckVerdict.SEND  # the first reply was lost
    assert run(store, c).state is RunState.SENDING
    assert check(store, B, c).verdict is CheckVerdict.REFUSED


def test_a_check_with_a_skip_reason_records_the_run_skipped(store: Store) -> None:
    c = one_claim(store, A)
    result = check(store, A, c, skip=Reason.CATCH_UP_WINDOW)
    assert (result.verdict, result.reason) == (CheckVerdict.SKIPPED, Reason.CATCH_UP_WINDOW)
    r = run(store, c)
    assert (r.state, r.reason) == (RunState.SKIPPED, Reason.CATCH_UP_WINDOW)
    # Asked again after a lost reply: the same answer, nothing rewritten.
    again = check(store, A, c, skip=Reason.CATCH_UP_WINDOW)
    assert (again.verdict, again.reason) == (CheckVerdict.SKIPPED, Reason.CATCH_UP_WINDOW)
    assert run(store, c) == r
    store.record_sent(A, [c])  # never published: still skipped
    assert run(store, c).state is RunState.SKIPPED


def test_a_run_being_sent_can_still_be_recorded_skipped(store: Store) -> None:
    c = sending(store, A, one_claim(store, A))
    result = check(store, A, c, skip=Reason.CATCH_UP)
    assert (result.verdict, result.reason) == (CheckVerdict.SKIPPED, Reason.CATCH_UP)
    assert run(store, c).state is RunState.SKIPPED


@pytest.mark.parametrize("other_state", ["sending", "sent", "started"])
def test_overlap_skip_records_skipped_while_another_run_is_unfinished(
        store: Store, other_state: str) -> None:
    previous, c = claims(store, A, 1000, 2000)
    sending(store, A, previous)
    if other_state != "sending":
        assert store.record_sent(A, [previous]) == 1
    if other_state == "started":
        started(store, previous, process(1))
    assert run(store, previous).state is RunState(other_state)
    result = check(store, A, c, overlap=Overlap.SKIP)
    assert (result.verdict, result.reason) == (CheckVerdict.SKIPPED, Reason.OVERLAP)
    r = run(store, c)
    assert (r.state, r.reason) == (RunState.SKIPPED, Reason.OVERLAP)
    assert run(store, previous).state is RunState(other_state)  # untouched


def test_overlap_skip_sends_when_no_other_run_is_unfinished(store: Store) -> None:
    previous, waiting, c = claims(store, A, 1000, 2000, 3000)
    send(store, A, previous)
    started(store, previous, process(1))
    assert store.finish([Outcome("e", previous.due, previous.token, RunState.DONE)]) == [True]
    # ``waiting`` is only claimed (nothing published): it does not count as overlapping.
    assert check(store, A, c, overlap=Overlap.SKIP).verdict is CheckVerdict.SEND
    # With overlap=ALLOW a run is sent whatever else is unfinished.
    assert check(store, A, waiting, overlap=Overlap.ALLOW).verdict is CheckVerdict.SEND


def test_refused_answers_carry_a_why(store: Store) -> None:
    c, finished, released = claims(store, A, 1000, 2000, 3000)
    send(store, A, finished)
    started(store, finished, process(1))
    store.finish([Outcome("e", finished.due, finished.token, RunState.DONE)])
    store.release(A, [Release(released)])
    never_claimed = Claim("e", c.due + 500, c.token)
    unknown_entry = Claim("nobody", c.due, 1)
    answers = store.check(A, [Check(x, "t") for x in (
        never_claimed, unknown_entry, finished, released, Claim("e", c.due, c.token + 9))])
    # No record at all: the store lost it (or it never was); the holder must know which.
    assert [a.verdict for a in answers] == [CheckVerdict.MISSING] * 2 + [
        CheckVerdict.REFUSED] * 3
    assert all(a.why for a in answers), answers
    assert run(store, finished).state is RunState.DONE
    assert run(store, released).state is RunState.DUE


def test_one_check_call_answers_each_claim_in_order(store: Store) -> None:
    mine, skipped, taken_back = claims(store, A, 1000, 2000, 3000)
    store.reclaim([Reclaim("e", taken_back.due, taken_back.token)], "operator:bob")
    answers = store.check(A, [Check(mine, "t1"), Check(skipped, "t2", Reason.CATCH_UP),
                              Check(taken_back, "t3")])
    assert [a.claim for a in answers] == [mine, skipped, taken_back]
    assert [a.verdict for a in answers] == [CheckVerdict.SEND, CheckVerdict.SKIPPED,
                                            CheckVerdict.REFUSED]


def test_record_sent_moves_sending_to_sent_and_is_idempotent(store: Store) -> None:
    c = sending(store, A, one_claim(store, A))
    assert store.record_sent(A, [c]) == 1
    first = run(store, c)
    assert first.state is RunState.SENT and first.sent_at is not None
    [opened] = store.open_runs(before=now(store) + 1)
    store.record_sent(A, [c])  # the first reply was lost
    assert run(store, c) == first
    assert store.open_runs(before=now(store) + 1) == [opened]


def test_record_sent_refuses_a_stale_token_and_an_unchecked_claim(store: Store) -> None:
    c, unchecked = claims(store, A, 1000, 2000)
    sending(store, A, c)
    assert store.record_sent(A, [Claim(c.entry, c.due, c.token + 1),
                                 Claim(c.entry, c.due, c.token - 1)]) == 0
    assert run(store, c).state is RunState.SENDING
    assert store.record_sent(A, [unchecked]) == 0
    assert run(store, unchecked).state is RunState.CLAIMED
    assert store.record_sent(A, [Claim("nobody", 1, 1)]) == 0


def test_record_sent_tolerates_a_worker_that_already_started_or_finished(
        store: Store) -> None:
    fast, faster = claims(store, A, 1000, 2000)
    for c in (fast, faster):
        sending(store, A, c)
        started(store, c, process(1))  # the worker was quicker than the sent mark
    store.finish([Outcome("e", faster.due, faster.token, RunState.DONE)])
    store.record_sent(A, [fast, faster])
    assert run(store, fast).state is RunState.STARTED
    assert run(store, faster).state is RunState.DONE
    assert [o.due for o in store.open_runs(before=now(store) + 1)] == [fast.due]
