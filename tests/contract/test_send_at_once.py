"""A claim that asks to check its new occurrences before publish at once (SendAtOnce):
each answer is the one a check made right after the claim gets, and asking again gets the
same. A backend may leave them unchecked; then nothing is checked, and the claims are
plain claims."""

from __future__ import annotations

from beat_claims.enums import Overlap, Reason, RunState
from beat_claims.stores.base import (
    CheckVerdict,
    ClaimPlan,
    ClaimResult,
    ClaimStatus,
    Release,
    SendAtOnce,
    Store,
)

from .helpers import A, B, check, one_claim, register, run, send, take


def claim_at_once(store: Store, *offsets: int, overlap: Overlap = Overlap.ALLOW,
                  entry: str = "e") -> ClaimResult:
    state = register(store, entry)[entry]
    dues = tuple(state.anchor + o for o in offsets)
    at_once = SendAtOnce(tuple(f"task-{entry}-{d}" for d in dues), overlap)
    [result] = store.claim(A, [ClaimPlan(entry, state, dues, send=at_once)])
    assert result.status is ClaimStatus.OK, result
    assert len(result.claims) == len(offsets), result
    return result


def test_each_claim_checked_with_it_is_being_sent_under_its_task_id(store: Store) -> None:
    result = claim_at_once(store, 1000, 2000)
    if not result.checked:  # this backend checks when asked: plain claims
        assert {run(store, c).state for c in result.claims} == {RunState.CLAIMED}
        return
    assert [c.claim for c in result.checked] == list(result.claims)
    assert {c.verdict for c in result.checked} == {CheckVerdict.SEND}
    for c in result.claims:
        r = run(store, c)
        assert (r.state, r.owner, r.token, r.task_id) == (
            RunState.SENDING, A.id, c.token, f"task-e-{c.due}")
        # The holder asking again (as a beat does when the answer came too long ago) gets
        # the same answer; another beat is refused, and nothing changes.
        assert check(store, A, c, task_id=f"task-e-{c.due}").verdict is CheckVerdict.SEND
        assert check(store, B, c).verdict is CheckVerdict.REFUSED
        assert run(store, c).state is RunState.SENDING
    assert store.record_sent(A, list(result.claims)) == 2
    assert {run(store, c).state for c in result.claims} == {RunState.SENT}


def test_overlap_skip_sends_the_first_and_skips_the_second_as_two_checks_would(
        store: Store) -> None:
    result = claim_at_once(store, 1000, 2000, overlap=Overlap.SKIP)
    if not result.checked:
        return
    first, second = result.claims
    assert [(c.claim, c.verdict, c.reason) for c in result.checked] == [
        (first, CheckVerdict.SEND, None), (second, CheckVerdict.SKIPPED, Reason.OVERLAP)]
    assert run(store, second).state is RunState.SKIPPED
    # Asked again, the skipped one's holder hears the same.
    again = check(store, A, second, overlap=Overlap.SKIP)
    assert (again.verdict, again.reason) == (CheckVerdict.SKIPPED, Reason.OVERLAP)


def test_overlap_skip_skips_a_claim_while_an_earlier_run_is_sent(store: Store) -> None:
    earlier = send(store, A, one_claim(store, A, 500))
    result = claim_at_once(store, 1000, overlap=Overlap.SKIP)
    if not result.checked:
        return
    [answer] = result.checked
    assert (answer.verdict, answer.reason) == (CheckVerdict.SKIPPED, Reason.OVERLAP)
    assert run(store, earlier).state is RunState.SENT


def test_buffer_one_makes_a_claim_wait_for_the_earlier_run(store: Store) -> None:
    send(store, A, one_claim(store, A, 500))
    result = claim_at_once(store, 1000, overlap=Overlap.BUFFER_ONE)
    if not result.checked:
        return
    [answer] = result.checked
    assert answer.verdict is CheckVerdict.WAITING
    assert run(store, answer.claim).state is RunState.WAITING


def test_a_claim_checked_with_it_and_given_back_is_due_again(store: Store) -> None:
    """A beat that does not publish after all (a stop, the broker down) gives it back."""
    result = claim_at_once(store, 1000)
    [c] = result.claims
    assert store.release(A, [Release(c)]) == [RunState.DUE]
    [again] = take(store, B)
    assert (again.due, again.token > c.token) == (c.due, True)


def test_an_entry_with_a_run_due_again_is_not_checked_with_the_claim(store: Store) -> None:
    """The claim takes the run due again too: the caller checks them all in due order
    (with overlap="skip" the older run is sent and the new one skipped; checked before it,
    the new one would have been sent as well)."""
    c = one_claim(store, A, 500)
    assert store.release(A, [Release(c)]) == [RunState.DUE]
    result = claim_at_once(store, 1000, overlap=Overlap.SKIP)
    assert result.checked == ()
    assert [t.due for t in result.taken] == [c.due]
    [new] = result.claims
    assert run(store, new).state is RunState.CLAIMED


def test_an_entry_with_an_operators_request_is_not_checked_with_the_claim(
        store: Store) -> None:
    register(store, "e")
    assert store.request_run("e", "ops") is not None
    result = claim_at_once(store, 1000, overlap=Overlap.SKIP)
    assert result.checked == ()
    assert [t.manual for t in result.taken] == [True]
    assert {run(store, c).state for c in result.claims} == {RunState.CLAIMED}


def test_any_text_of_a_task_id_or_an_entry_name_is_stored_as_given(store: Store) -> None:
    """A task id is the caller's text, whatever it holds (a separator, a line break, the
    characters a store's replies are made of), and so is an entry's name."""
    entry = "odd \x1f name;,\n ÿ 名前"
    state = register(store, entry)[entry]
    dues = (state.anchor + 1000, state.anchor + 2000)
    ids = ("id\x1fwith\x1fseparators", "id;with,all\n\x1f ÿ of them")
    [result] = store.claim(A, [ClaimPlan(entry, state, dues, send=SendAtOnce(ids))])
    assert result.status is ClaimStatus.OK, result
    assert [c.due for c in result.claims] == list(dues), result
    for c, task_id in zip(result.claims, ids):
        if result.checked:
            assert run(store, c).task_id == task_id, run(store, c)
        else:
            assert check(store, A, c, task_id=task_id).verdict is CheckVerdict.SEND
            assert run(store, c).task_id == task_id, run(store, c)
    assert store.record_sent(A, list(result.claims)) == 2
    assert {run(store, c).state for c in result.claims} == {RunState.SENT}
