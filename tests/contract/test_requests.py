"""request_run: an operator's run now, claimed and sent by a beat like any other, without
touching the schedule's checkpoint."""

from __future__ import annotations

from beat_claims.enums import RunState, StartVerdict
from beat_claims.stores.base import CheckVerdict, ClaimStatus, Outcome, Store

from .helpers import (
    A,
    B,
    C,
    check,
    claim,
    clock_tokens,
    delivery,
    now,
    one_claim,
    process,
    query,
    register,
    run,
    send,
    take,
)


def test_a_request_records_a_due_manual_run_at_the_store_clock(store: Store) -> None:
    state = register(store, "e")["e"]
    before = now(store)
    due = store.request_run("e", "operator:alice")
    assert due is not None and before <= due <= now(store)
    r = run(store, ("e", due))
    assert (r.state, r.manual, r.requested_by) == (RunState.DUE, True, "operator:alice")
    assert [(x.entry, x.due) for x in store.live_runs(query(C)).due] == [("e", due)]
    # The schedule is untouched: its checkpoint did not move, its plans still apply.
    assert register(store, "e")["e"] == state
    assert claim(store, A, state, state.anchor + 1000, take_due=False).status is (
        ClaimStatus.OK)


def test_a_request_for_an_unknown_entry_is_none_and_records_nothing(store: Store) -> None:
    assert store.request_run("nobody", "operator:alice") is None
    assert store.history("nobody") == []
    assert store.live_runs(query(C)).due == ()


def test_requests_in_the_same_millisecond_each_get_their_own_run(store: Store) -> None:
    register(store, "e")
    dues = [store.request_run("e", f"operator:{i}") for i in range(20)]
    assert None not in dues and len(set(dues)) == 20
    assert {r.requested_by for r in store.history("e")} == {f"operator:{i}" for i in range(20)}


def test_a_request_does_not_overwrite_a_scheduled_run(store: Store) -> None:
    c = one_claim(store, A, 0)  # claimed at the anchor, i.e. at about the store's clock
    due = store.request_run("e", "operator:alice")
    assert due is not None and due != c.due
    assert run(store, c).state is RunState.CLAIMED


def test_a_requested_run_is_claimed_sent_and_finished_like_any_other(store: Store) -> None:
    register(store, "e")
    due = store.request_run("e", "operator:alice")
    lowest = clock_tokens(store)
    [taken] = take(store, B)
    assert (taken.due, taken.manual) == (due, True)
    assert taken.token >= lowest and store.entries(["e"])[0].token == taken.token
    assert check(store, A, taken).verdict is CheckVerdict.REFUSED  # B's, not A's
    send(store, B, taken)
    assert store.start(delivery(taken, process(1))).verdict is StartVerdict.RUN
    assert store.finish([Outcome("e", taken.due, taken.token, RunState.DONE)]) == [True]
    r = run(store, taken)
    assert (r.state, r.manual, r.requested_by) == (RunState.DONE, True, "operator:alice")
    assert register(store, "e")["e"].checkpoint is None
