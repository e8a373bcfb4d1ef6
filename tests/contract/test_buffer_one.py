"""overlap="buffer_one": while another run of the entry is being sent, sent or started, the
newest checked run waits (recorded waiting) and older waiting ones are skipped (overlap);
a waiting run is claimable again once the entry has no such run, whatever ended it."""

from __future__ import annotations

import pytest

from beat_claims.enums import Overlap, Reason, RunState
from beat_claims.runs import Owner
from beat_claims.stores.base import CheckVerdict, Claim, Outcome, Reclaim, Store

from .helpers import A, B, check, claims, process, query, run, send, sending, started, take


def buffered(store: Store, who: Owner, c: Claim) -> CheckVerdict:
    return check(store, who, c, overlap=Overlap.BUFFER_ONE).verdict


@pytest.mark.parametrize("other_state", ["sending", "sent", "started"])
def test_a_run_checked_while_another_is_unfinished_waits(store: Store,
                                                         other_state: str) -> None:
    previous, c = claims(store, A, 1000, 2000)
    sending(store, A, previous)
    if other_state != "sending":
        store.record_sent(A, [previous])
    if other_state == "started":
        started(store, previous, process(1))
    assert buffered(store, A, c) is CheckVerdict.WAITING
    r = run(store, c)
    assert (r.state, r.owner) == (RunState.WAITING, None)
    assert run(store, previous).state is RunState(other_state)
    # Not claimable while the previous run is unfinished; its holder cannot send it.
    assert take(store, B) == ()
    assert store.record_sent(A, [c]) == 0
    # Asked again after a lost reply: the same answer (never send); another owner: refused.
    assert buffered(store, A, c) is CheckVerdict.WAITING
    assert check(store, B, c).verdict is CheckVerdict.REFUSED
    assert run(store, c).state is RunState.WAITING


def test_a_waiting_run_is_claimed_and_sent_once_the_previous_finishes(store: Store) -> None:
    previous, c = claims(store, A, 1000, 2000)
    send(store, A, previous)
    started(store, previous, process(1))
    assert buffered(store, A, c) is CheckVerdict.WAITING
    assert store.finish([Outcome("e", previous.due, previous.token, RunState.DONE)]) == [True]
    [again] = take(store, B)
    assert again.due == c.due and again.token > c.token
    assert buffered(store, B, again) is CheckVerdict.SEND
    assert run(store, again).state is RunState.SENDING


@pytest.mark.parametrize("ending", ["failed", "lost", "cancelled", "reclaimed"])
def test_whatever_ends_the_previous_run_frees_the_waiting_one(store: Store,
                                                              ending: str) -> None:
    previous, c = claims(store, A, 1000, 2000)
    sending(store, A, previous)
    assert buffered(store, A, c) is CheckVerdict.WAITING
    if ending == "reclaimed":  # the sender died while sending: it may never have published
        assert store.reclaim([Reclaim("e", previous.due, previous.token)], B.id) == [True]
    else:
        store.record_sent(A, [previous])
        state = {"failed": RunState.FAILED, "lost": RunState.LOST,
                 "cancelled": RunState.CANCELLED}[ending]
        assert store.finish([Outcome("e", previous.due, previous.token, state)]) == [True]
    taken = take(store, B)
    assert c.due in [t.due for t in taken]


def test_the_newest_waits_and_older_waiting_runs_are_skipped(store: Store) -> None:
    previous, older, newer = claims(store, A, 1000, 2000, 3000)
    send(store, A, previous)
    assert buffered(store, A, older) is CheckVerdict.WAITING
    assert buffered(store, A, newer) is CheckVerdict.WAITING
    r = run(store, older)
    assert (r.state, r.reason) == (RunState.SKIPPED, Reason.OVERLAP)
    assert run(store, newer).state is RunState.WAITING


def test_an_older_run_checked_after_a_newer_one_waits_is_skipped(store: Store) -> None:
    previous, older, newer = claims(store, A, 1000, 2000, 3000)
    send(store, A, previous)
    assert buffered(store, A, newer) is CheckVerdict.WAITING
    result = check(store, A, older, overlap=Overlap.BUFFER_ONE)
    assert (result.verdict, result.reason) == (CheckVerdict.SKIPPED, Reason.OVERLAP)
    assert run(store, newer).state is RunState.WAITING


def test_with_nothing_unfinished_a_buffered_run_is_sent(store: Store) -> None:
    c = claims(store, A, 1000)[0]
    assert buffered(store, A, c) is CheckVerdict.SEND


def test_a_waiting_run_of_a_paused_entry_is_skipped_paused(store: Store) -> None:
    previous, c = claims(store, A, 1000, 2000)
    send(store, A, previous)
    assert buffered(store, A, c) is CheckVerdict.WAITING
    store.pause("e", "alice@ops")
    store.finish([Outcome("e", previous.due, previous.token, RunState.DONE)])
    assert take(store, B) == ()
    r = run(store, c)
    assert (r.state, r.reason) == (RunState.SKIPPED, Reason.PAUSED)


def test_a_waiting_run_is_not_a_held_claim(store: Store) -> None:
    previous, c = claims(store, A, 1000, 2000)
    send(store, A, previous)
    assert buffered(store, A, c) is CheckVerdict.WAITING
    found = store.live_runs(query(A, held_before=2**62, mine_before=2**62,
                                  dead_before=2**62))
    assert all(h.due != c.due for h in found.held)
    assert store.reclaim([Reclaim("e", c.due, None)], B.id) == [False]
    assert run(store, c).state is RunState.WAITING
