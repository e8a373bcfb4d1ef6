"""heartbeat(written=...): whether the store still holds a beat's newest claim and sent mark.
A store put back from an older copy, whatever way, keeps its epoch and identity; what it
lost of the beat's writes is how the beat finds out. ``lost`` names the writes the store no
longer holds (no such entry, a counter below the write's token, a run at the instant with a
lower token, a check before publish whose run is still claimed with that token, a sent mark
whose run is still claimed, being sent, due or waiting with that token);
a run taken over with a higher token, in a later state, or trimmed from the history holds
them, and so does a run with no token (an operator's backfill replaced what the instant
held: the counter judges); a record that cannot be read is not judged (``unjudged``).
``last_beat`` is the instant of the heartbeat before (None on a new store)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from beat_claims.enums import RunState
from beat_claims.runs import Run
from beat_claims.stores.base import (
    BackfillForgotten,
    Claim,
    Continuity,
    Heartbeat,
    Outcome,
    Reclaim,
    Release,
    Store,
    StoreError,
    Written,
    Wrote,
)

from .conftest import Backend
from .helpers import (
    A,
    B,
    after,
    claims,
    one_claim,
    poll,
    process,
    register,
    run,
    runs,
    send,
    sending,
    started,
    take,
)

TTL = 10.0


def claimed(c: Claim) -> Written:
    return Written(c.entry, c.due, c.token)


def checked(c: Claim) -> Written:
    return Written(c.entry, c.due, c.token, Wrote.CHECK)


def marked(c: Claim) -> Written:
    return Written(c.entry, c.due, c.token, Wrote.SENT)


def beat(store: Store, *written: Written) -> Heartbeat:
    return store.heartbeat(A, TTL, written=written)


def put_back(store: Store, backend: Backend, older: Run) -> None:
    """The run's record as an older copy of the store has it."""
    backend.corrupt_run(store, older.entry, older.due, json.dumps(older.to_record()))
    assert run(store, (older.entry, older.due)) == older


# -- held ---------------------------------------------------------------------------------
def test_the_store_holds_a_claim_a_check_and_a_sent_mark_it_took(store: Store) -> None:
    held, sent = claims(store, A, 1000, 2000)
    sending(store, A, sent)
    assert beat(store, claimed(sent), checked(sent)).lost == ()
    send(store, A, sent)
    assert beat(store).lost == ()
    assert beat(store, claimed(held), checked(sent), marked(sent)).lost == ()
    # A sent run that goes on to start and finish still holds its mark, and its claim.
    started(store, sent, process(1))
    assert beat(store, claimed(sent), checked(sent), marked(sent)).lost == ()
    assert store.finish([Outcome("e", sent.due, sent.token, RunState.DONE)]) == [True]
    assert beat(store, claimed(held), claimed(sent), checked(sent), marked(sent)).lost == ()


def test_a_run_taken_back_after_its_check_holds_the_check(store: Store) -> None:
    """Due again with its token (an operator's release, or a beat that took this one for
    dead, while it published): the check was made, and the store holds it; the sent mark
    the store then refused was never its to lose (see the beat's own test)."""
    c = one_claim(store, A)
    sending(store, A, c)
    assert store.reclaim([Reclaim("e", c.due, None)], "alice@ops") == [True]
    assert (run(store, c).state, run(store, c).token) == (RunState.DUE, c.token)
    assert store.record_sent(A, [c]) == 0
    assert beat(store, claimed(c), checked(c)).lost == ()
    [again] = take(store, B)
    assert beat(store, claimed(c), checked(c)).lost == ()
    assert store.heartbeat(B, TTL, written=[claimed(again)]).lost == ()


def test_a_run_another_beat_took_over_with_a_higher_token_holds_the_first_beat_s_writes(
        store: Store) -> None:
    """A beat that died while sending, its runs taken back and claimed again by another:
    its own writes are not lost (the store went forward, not back)."""
    released, being_sent = claims(store, A, 1000, 2000)
    sending(store, A, being_sent)
    assert store.release(A, [Release(released)]) == [RunState.DUE]
    assert store.reclaim([Reclaim("e", being_sent.due, being_sent.token)], B.id) == [True]
    taken = {c.due: c for c in take(store, B)}
    assert {taken[c.due].token > c.token for c in (released, being_sent)} == {True}
    assert beat(store, claimed(released), claimed(being_sent)).lost == ()
    # Sent by B: A's claim of that instant still holds.
    send(store, B, taken[being_sent.due])
    assert beat(store, claimed(being_sent), marked(taken[being_sent.due])).lost == ()


@pytest.mark.history_limit(2)
def test_a_run_trimmed_from_the_history_is_judged_by_the_entry_s_counter(
        store: Store, backend: Backend) -> None:
    first = send(store, A, one_claim(store, A, 1000))
    started(store, first, process(1))
    assert store.finish([Outcome("e", first.due, first.token, RunState.DONE)]) == [True]
    claims(store, A, 2000, 3000)  # three runs for a limit of two: the final one goes
    assert first.due not in runs(store)
    assert beat(store, claimed(first), marked(first)).lost == ()
    # Its counter put back below the run's token: the store lost it.
    backend.corrupt_entry_field(store, "e", "token", str(first.token - 1))
    assert beat(store, claimed(first), marked(first)).lost == (claimed(first), marked(first))


def test_an_instant_an_operator_backfilled_since_holds_the_writes_before_it(
        store: Store) -> None:
    """A backfill replaces a run that ended without running by a manual run due now, with
    no token until a beat claims it: that record says nothing of the tokens of its instant
    before it, so the counter judges (found in review: a revoked run backfilled at once
    made its beat take the store for an older copy, and start a new epoch)."""
    c = send(store, A, one_claim(store, A))
    assert store.finish([Outcome("e", c.due, c.token, RunState.CANCELLED)]) == [True]
    result = store.backfill("e", [c.due], "alice@ops")
    assert result is not None and result.created == (c.due,)
    assert (run(store, c).state, run(store, c).token) == (RunState.DUE, 0)
    assert beat(store, claimed(c), marked(c)).lost == ()
    # Once a beat claims the backfilled run, its claim is held, and the first one too.
    [again] = take(store, B)
    assert again.due == c.due and again.token > c.token
    assert beat(store, claimed(c), marked(c), claimed(again)).lost == ()


@pytest.mark.history_limit(2)
def test_an_instant_trimmed_from_the_history_holds_the_writes_before_it(
        store: Store) -> None:
    """(A backfill of it is refused: the store no longer knows whether it ran.)"""
    first = send(store, A, one_claim(store, A, 1000))
    assert store.finish([Outcome("e", first.due, first.token, RunState.CANCELLED)]) == [True]
    for c in claims(store, A, 2000, 3000):
        send(store, A, c)
        assert store.finish([Outcome("e", c.due, c.token, RunState.CANCELLED)]) == [True]
    assert first.due not in runs(store)
    with pytest.raises(BackfillForgotten):
        store.backfill("e", [first.due], "alice@ops")
    assert beat(store, claimed(first), marked(first)).lost == ()


def test_a_backfilled_run_put_back_to_before_its_claim_has_lost_it(
        store: Store, backend: Backend) -> None:
    """The other way round: a copy older than the claim of a backfilled run has the run due
    with no token, and the counter below the claim's."""
    c = send(store, A, one_claim(store, A))
    assert store.finish([Outcome("e", c.due, c.token, RunState.CANCELLED)]) == [True]
    assert store.backfill("e", [c.due], "alice@ops") is not None
    older = run(store, c)
    [again] = take(store, B)
    put_back(store, backend, older)
    backend.corrupt_entry_field(store, "e", "token", str(c.token))
    assert store.heartbeat(B, TTL, written=[claimed(again)]).lost == (claimed(again),)


# -- lost ---------------------------------------------------------------------------------
def test_a_wiped_store_has_lost_every_write(store: Store, backend: Backend) -> None:
    held, sent = claims(store, A, 1000, 2000)
    send(store, A, sent)
    before = beat(store)
    backend.wipe(store)
    hb = beat(store, claimed(held), marked(sent))
    assert hb.lost == (claimed(held), marked(sent))
    assert hb.last_beat is None  # (a new store: no heartbeat was seen)
    assert hb.epoch != before.epoch


def test_an_entry_the_store_does_not_have_has_lost_its_writes(store: Store) -> None:
    c = one_claim(store, A)
    nobody = Written("nobody", c.due, c.token)
    assert beat(store, nobody, claimed(c)).lost == (nobody,)


def test_a_counter_put_back_below_the_claim_has_lost_it(store: Store,
                                                       backend: Backend) -> None:
    earlier, later = claims(store, A, 1000, 2000)
    backend.corrupt_entry_field(store, "e", "token", str(earlier.token))
    # Only the write above the counter is lost; the answer names it, in order.
    assert beat(store, claimed(earlier), claimed(later)).lost == (claimed(later),)
    assert beat(store, claimed(later), claimed(earlier)).lost == (claimed(later),)


def test_a_run_put_back_to_an_earlier_token_has_lost_the_later_claim(
        store: Store, backend: Backend) -> None:
    """The entry's counter still above it (its copy newer than the run's): the run at the
    instant, with the older token, tells."""
    c = one_claim(store, A)
    assert store.release(A, [Release(c)]) == [RunState.DUE]
    older = run(store, c)
    [again] = take(store, B)
    assert again.token > c.token
    assert store.heartbeat(B, TTL, written=[claimed(again)]).lost == ()
    put_back(store, backend, older)
    assert store.heartbeat(B, TTL, written=[claimed(again)]).lost == (claimed(again),)
    assert beat(store, claimed(c)).lost == ()  # the earlier claim is what the store holds


@pytest.mark.parametrize("back_to", ["claimed", "being sent", "due"])
def test_a_run_put_back_to_before_its_sent_mark_has_lost_the_mark_not_the_claim(
        store: Store, backend: Backend, back_to: str) -> None:
    """Put back to before its check too (claimed), it has lost the check as well."""
    c = one_claim(store, A)
    older = run(store, c)  # claimed
    sending(store, A, c)
    if back_to != "claimed":
        older = run(store, c)
    assert store.record_sent(A, [c]) == 1
    if back_to == "due":  # (a due run with that token: released, as before the send)
        older = Run(c.entry, c.due, RunState.DUE, token=c.token)
    assert older.state is {"claimed": RunState.CLAIMED, "being sent": RunState.SENDING,
                           "due": RunState.DUE}[back_to]
    assert beat(store, claimed(c), checked(c), marked(c)).lost == ()
    put_back(store, backend, older)
    lost = (checked(c), marked(c)) if back_to == "claimed" else (marked(c),)
    assert beat(store, claimed(c), checked(c), marked(c)).lost == lost


# -- not judged ---------------------------------------------------------------------------
def test_a_run_whose_record_cannot_be_read_is_not_judged(store: Store,
                                                        backend: Backend) -> None:
    """A bad record is local: it never makes a beat believe the whole store went back. The
    writes it could not judge are named (the beat does not take them for confirmed)."""
    c, other = claims(store, A, 1000, 2000)
    backend.corrupt_run(store, "e", c.due, '{"due": 1, "state": "claimed", "tok')
    hb = beat(store, claimed(c), marked(c), marked(other))
    assert (hb.lost, hb.unjudged) == ((marked(other),), (claimed(c), marked(c)))


def test_an_entry_whose_counter_cannot_be_read_is_not_judged(store: Store,
                                                            backend: Backend) -> None:
    c = one_claim(store, A)
    backend.corrupt_entry_field(store, "e", "token", "not a number")  # (PostgreSQL: skips)
    assert beat(store, claimed(c), marked(c)).lost == ()


# -- the last heartbeat -------------------------------------------------------------------
# -- removed: an operator's prune -----------------------------------------------------------
def confirmed(w: Written) -> Written:
    """As a beat asks after a write the store held at its heartbeat before."""
    return dataclasses.replace(w, confirmed=True)


def pruned(store: Store) -> Claim:
    """A run of "e" sent and done, then "e" removed with its runs (as a prune does)."""
    c = send(store, A, one_claim(store, A))
    assert store.finish([Outcome("e", c.due, c.token, RunState.DONE)]) == [True]
    assert beat(store, marked(c)).lost == ()
    assert store.forget(["e"]) == ["e"]
    return c


def test_a_confirmed_write_of_an_entry_removed_since_is_no_loss(store: Store) -> None:
    """The caller's heartbeat found the writes held; an operator's prune then removed the
    entry with its runs. Asked after as confirmed, they are named ``removed``, not lost,
    and the store does not take itself for an older copy (no new epoch)."""
    before = beat(store)
    c = pruned(store)
    writes = (confirmed(marked(c)), confirmed(checked(c)), confirmed(claimed(c)))
    hb = store.heartbeat(A, TTL, written=writes,
                         continuity=Continuity(before.epoch, before.now, True))
    assert (hb.lost, hb.removed, hb.went_back) == ((), writes, False)
    assert hb.epoch == before.epoch


def test_a_write_not_confirmed_of_an_entry_removed_since_is_lost(store: Store) -> None:
    """Not confirmed (made after the caller's last heartbeat: a copy taken since, before
    the entry was made, and put back shows no entry either), it is lost."""
    c = pruned(store)
    hb = beat(store, marked(c), confirmed(claimed(c)))
    assert (hb.lost, hb.removed) == ((marked(c),), (confirmed(claimed(c)),))


def test_a_confirmed_write_of_an_entry_the_store_still_holds_is_judged_as_any(
        store: Store, backend: Backend) -> None:
    """An entry the store holds (the write's anchor) with its counter, or a run, below the
    write (keys restored one by one from an older copy) has lost it, confirmed or not."""
    earlier, later = claims(store, A, 1000, 2000)
    anchor = earlier.due - 1000

    def confirmed_of_e(w: Written) -> Written:
        return dataclasses.replace(confirmed(w), anchor=anchor)

    older = run(store, later)  # claimed
    send(store, A, later)
    put_back(store, backend, older)
    hb = beat(store, confirmed_of_e(marked(later)))
    assert (hb.lost, hb.removed) == ((confirmed_of_e(marked(later)),), ())
    backend.corrupt_entry_field(store, "e", "token", str(earlier.token))
    hb = beat(store, confirmed_of_e(claimed(later)), confirmed_of_e(claimed(earlier)))
    assert (hb.lost, hb.removed) == ((confirmed_of_e(claimed(later)),), ())


def test_a_confirmed_write_of_an_entry_whose_record_is_gone_but_not_its_run_is_lost(
        store: Store, backend: Backend) -> None:
    """A prune removes an entry with its runs: an entry whose own record is gone while the
    run the write was about is still there (a key evicted or deleted, the entries' table
    restored from an older copy apart from the runs') was not pruned, and lost the write."""
    c = send(store, A, one_claim(store, A))
    assert beat(store, marked(c)).lost == ()
    backend.drop_entry_record(store, "e")
    hb = beat(store, confirmed(marked(c)))
    assert (hb.lost, hb.removed) == ((confirmed(marked(c)),), ())


def test_a_confirmed_write_of_an_entry_removed_and_made_anew_since_is_no_loss(
        store: Store) -> None:
    """An operator's prune removed the entry; the name was registered again (a schedule
    given it back, a definition written anew) before the caller's next heartbeat: a new
    entry, with an anchor and a counter of its own (below the write's token until its
    first claim). The confirmed write is of the entry removed: no loss, and no new epoch."""
    before = beat(store)
    c = pruned(store)
    after(store, c.due - 1000 + 2000)  # (past the 2 s new entries share an anchor for)
    anew = register(store, "e")["e"]
    assert anew.anchor > c.due - 1000, anew
    writes = (dataclasses.replace(confirmed(marked(c)), anchor=c.due - 1000),)
    hb = store.heartbeat(A, TTL, written=writes,
                         continuity=Continuity(before.epoch, before.now, True))
    assert (hb.lost, hb.removed, hb.went_back) == ((), writes, False), (hb, anew)
    assert hb.epoch == before.epoch


def test_last_beat_is_none_on_a_new_store_then_the_previous_heartbeat_s_instant(
        store: Store) -> None:
    first = store.heartbeat(A, TTL)
    assert first.last_beat is None
    second = store.heartbeat(B, TTL)  # any beat's heartbeat counts
    assert second.last_beat == first.now
    third = store.heartbeat(A, TTL, resync=True)  # kept across epochs
    assert third.epoch != second.epoch and third.last_beat == second.now
    assert store.heartbeat(B, TTL).last_beat == third.now


def test_a_store_restored_from_a_copy_answers_the_copy_s_last_beat(
        store: Store, backend: Backend) -> None:
    store.heartbeat(A, TTL)
    copied = store.heartbeat(B, TTL)
    backend.restart(store)  # the data comes back from a copy taken just before

    def answer() -> Heartbeat | None:  # (the first call may find its connection gone)
        try:
            return store.heartbeat(A, TTL)
        except StoreError:
            return None

    hb = poll(answer, 10, "the store to answer after the restart")
    assert hb is not None and hb.last_beat == copied.now


# -- the caller's own record --------------------------------------------------------------
def test_owner_known_says_whether_the_caller_s_record_was_there_before(
        store: Store, backend: Backend) -> None:
    """A store put back from a copy taken before a beat started has no record of it (the
    beat may have written nothing else yet); one that stopped (left) is still known."""
    assert store.heartbeat(A, TTL).owner_known is False
    assert store.heartbeat(A, TTL).owner_known is True
    assert store.heartbeat(B, TTL).owner_known is False
    store.leave(A)
    assert store.heartbeat(A, TTL).owner_known is True  # (started again, the same owner)
    backend.wipe(store)
    assert store.heartbeat(A, TTL).owner_known is False


def test_epoch_since_is_when_the_epoch_began(store: Store) -> None:
    """A store put back in place keeps the epoch of its copy: one that began before the
    beats' last heartbeats (the beat's side: tests/test_store_put_back_noticed.py)."""
    first = store.heartbeat(A, TTL)
    assert first.epoch_since is not None and first.epoch_since <= first.now
    later = store.heartbeat(B, TTL)
    assert (later.epoch, later.epoch_since) == (first.epoch, first.epoch_since)
    again = store.heartbeat(A, TTL, resync=True)
    assert again.epoch != first.epoch
    assert again.epoch_since is not None and later.now <= again.epoch_since <= again.now
