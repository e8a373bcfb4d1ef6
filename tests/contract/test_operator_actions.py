"""Pause/resume, backfill and overlap="buffer_one" at the contract.

Each problem the review found has a test here that reproduced it (it was marked
``xfail(strict=True)`` until the stores were fixed, on every backend): a backfill the
history cannot hold, a lost run a worker started, the task ids of a run a backfill
replaced, the token counter after register(), the pause applied to the instants of the
last pause, an occurrence older than the running one, waiting runs in the sweeps, and the
answer to a waiting run checked again. The others prove a property that holds and was not
covered elsewhere.
"""

from __future__ import annotations

import pytest

from beat_claims.enums import Overlap, Reason, RunState, StartVerdict
from beat_claims.runs import Run
from beat_claims.stores.base import (
    BackfillRefused,
    CheckVerdict,
    Claim,
    ClaimStatus,
    EntrySeed,
    LiveQuery,
    Outcome,
    Reclaim,
    Release,
    Store,
    StoreConfigurationError,
)

from .backend import Backend
from .helpers import (
    A,
    B,
    above_clock,
    after,
    check,
    claim,
    claims,
    delivery,
    entry,
    process,
    run,
    runs,
    send,
    sending,
    started,
    take,
)


def buffered(store: Store, who: object, c: object) -> CheckVerdict:
    return check(store, who, c, overlap=Overlap.BUFFER_ONE).verdict  # type: ignore[arg-type]


def _lost(store: Store, c: object) -> None:
    """The sweep's presumption of loss (no outcome within run_timeout)."""
    big = 2**62
    assert store.finish([Outcome(c.entry, c.due, c.token, RunState.LOST,  # type: ignore[attr-defined]
                                 Reason.RUN_TIMEOUT, inactive_since=big)]) == [True]


# -- backfill -------------------------------------------------------------------------------
@pytest.mark.history_limit(3)
def test_every_backfilled_run_that_was_sent_can_still_be_started(store: Store) -> None:
    # The schedule is past these instants (its checkpoint), as whenever one backfills.
    first = claims(store, A, 1000)[0]
    send(store, A, first)
    store.finish([Outcome("e", first.due, first.token, RunState.DONE)])
    dues = [first.due - 1000 * k for k in range(1, 11)]  # ten past instants
    try:
        result = store.backfill("e", dues, "alice@ops")
    except (ValueError, StoreConfigurationError):
        return  # refused where it enters: nothing was promised
    assert result is not None
    taken = take(store, A)
    assert sorted(c.due for c in taken) == sorted(result.created)
    for c in taken:
        send(store, A, c)  # the beat publishes every one of them at once
    # The entry's next claim (any beat, any occurrence) trims its history.
    store.request_run("e", "bob@ops")
    refused = []
    for c in taken:
        decision = store.start(delivery(c, process(1)))
        if decision.verdict is not StartVerdict.RUN:
            refused.append((c.due, decision.why))
    assert refused == []


def test_a_lost_run_that_a_worker_started_is_kept_by_a_backfill(store: Store) -> None:
    c = claims(store, A, 1000)[0]
    send(store, A, c)
    started(store, c, process(1))
    _lost(store, c)  # no outcome within run_timeout: perhaps still running
    r = run(store, c)
    assert r.state is RunState.LOST and r.started_at is not None
    result = store.backfill("e", [c.due], "alice@ops")
    assert result is not None
    assert result.created == () and result.kept == ((c.due, RunState.LOST),)
    # The worker that started it reports at last: recorded (once).
    assert store.finish([Outcome("e", c.due, c.token, RunState.DONE)]) == [True]
    r = run(store, c)
    assert (r.state, r.reason) == (RunState.DONE, None)
    assert store.finish([Outcome("e", c.due, c.token, RunState.FAILED)]) == [False]
    assert store.backfill("e", [c.due], "alice@ops") == type(result)(
        "e", (), ((c.due, RunState.DONE),))


@pytest.mark.history_limit(2)
def test_a_late_outcome_of_a_started_run_pushed_out_to_the_lost_keep_is_recorded(
        store: Store) -> None:
    c = claims(store, A, 1000)[0]
    send(store, A, c)
    started(store, c, process(1))
    _lost(store, c)
    for later in claims(store, B, 2000, 3000):  # the lost run leaves the history
        send(store, B, later)
        store.finish([Outcome("e", later.due, later.token, RunState.DONE)])
    take(store, B)  # trims
    assert c.due not in runs(store)
    # A revoke of an unstarted delivery does not touch it; the execution's outcome does.
    assert store.finish([Outcome("e", c.due, c.token, RunState.CANCELLED,
                                 unstarted_only=True)]) == [False]
    assert store.finish([Outcome("e", c.due, None, RunState.FAILED, exc_type="E")]) == [True]
    assert (run(store, c).state, run(store, c).exc_type) == (RunState.FAILED, "E")


def test_a_lost_run_never_started_is_run_again_and_its_old_message_is_refused(
        store: Store) -> None:
    c = claims(store, A, 1000)[0]
    send(store, A, c, task_id="t-old")
    _lost(store, c)
    result = store.backfill("e", [c.due], "alice@ops")
    assert result is not None and result.created == (c.due,)
    # The old message turns up before a beat claimed the new run, and after.
    assert store.start(delivery(c, process(1))).verdict is StartVerdict.REFUSED
    [again] = take(store, B)
    assert again.token > c.token and again.manual
    assert store.start(delivery(c, process(1))).verdict is StartVerdict.REFUSED
    send(store, B, again)
    assert store.start(delivery(c, process(1))).verdict is StartVerdict.REFUSED
    assert store.finish([Outcome("e", c.due, c.token, RunState.DONE)]) == [False]
    assert store.start(delivery(again, process(2))).verdict is StartVerdict.RUN
    assert run(store, again).state is RunState.STARTED


def test_runs_being_sent_or_waiting_are_kept_by_a_backfill(store: Store) -> None:
    busy, being_sent, waiting = claims(store, A, 1000, 2000, 3000)
    send(store, A, busy)
    assert check(store, A, being_sent).verdict is CheckVerdict.SEND
    assert buffered(store, A, waiting) is CheckVerdict.WAITING
    result = store.backfill("e", [being_sent.due, waiting.due], "alice@ops")
    assert result is not None and result.created == ()
    assert dict(result.kept) == {being_sent.due: RunState.SENDING,
                                 waiting.due: RunState.WAITING}
    r = run(store, being_sent)
    assert (r.state, r.owner, r.token) == (RunState.SENDING, A.id, being_sent.token)
    assert store.record_sent(A, [being_sent]) == 1


@pytest.mark.parametrize("backfilled", [False, True])
def test_lookup_task_after_a_backfill_replaced_the_run(store: Store, backfilled: bool
                                                      ) -> None:
    """The task id of the run that was cancelled must not lead a signal (which carries
    only the task id, and records with the current token) to the run that replaced it."""
    c = claims(store, A, 1000)[0]
    send(store, A, c, task_id="t-1")
    started(store, c, process(1), task_id="t-1")
    assert store.lookup_task("t-1") == c
    assert store.finish([Outcome("e", c.due, c.token, RunState.CANCELLED)]) == [True]
    if not backfilled:
        assert store.lookup_task("t-1") == c  # kept while the run is
        return
    assert store.backfill("e", [c.due], "alice@ops") is not None
    assert store.lookup_task("t-1") is None


def test_a_backfilled_run_gets_a_token_above_every_token_of_its_instant(
        store: Store) -> None:
    state = entry(store)
    due = state.anchor - 5000
    # Registered again after a wipe by a beat that knows the run it sent (a token above the
    # clock's, which would hide a counter left below it), but not the entry's counter (it
    # had forgotten the entry: its anchor moved).
    sent = above_clock(store)
    known = Run("e", due, RunState.SENT, token=sent, task_id="t-50",
                extra={"reseeded": True})
    assert store.register([EntrySeed("e", "every 1s", runs=(known,))])["e"].token >= sent
    assert store.finish([Outcome("e", due, sent, RunState.CANCELLED)]) == [True]
    assert store.backfill("e", [due], "alice@ops") is not None
    [again] = take(store, A)
    assert again.due == due and again.token > sent


@pytest.mark.history_limit(4)
def test_a_backfill_the_history_cannot_hold_is_refused_before_it_writes(
        store: Store) -> None:
    done, busy = claims(store, A, 1000, 2000)
    send(store, A, done)
    store.finish([Outcome("e", done.due, done.token, RunState.DONE)])
    send(store, A, busy)  # one unfinished run: room for three more
    past = [done.due - 1000 * k for k in range(1, 5)]
    before = runs(store)
    with pytest.raises(BackfillRefused) as refused:
        store.backfill("e", [*past, done.due], "alice@ops")  # four to create, one kept
    message = str(refused.value)
    assert "beat_claims_history_limit" in message and "beat_claims_backfill_limit" in message
    assert (refused.value.created, refused.value.live, refused.value.limit) == (4, 1, 4)
    assert isinstance(refused.value, ValueError)
    assert runs(store) == before and take(store, B) == ()  # nothing was written
    result = store.backfill("e", [*past[:3], done.due], "alice@ops")
    assert result is not None and sorted(result.created) == sorted(past[:3])
    assert result.kept == ((done.due, RunState.DONE),)
    # Full of unfinished runs now: even one more is refused; instants kept cost nothing.
    with pytest.raises(BackfillRefused):
        store.backfill("e", [past[3]], "alice@ops")
    again = store.backfill("e", past[:3], "alice@ops")
    assert again is not None and again.created == () and len(again.kept) == 3


# -- pause and resume -------------------------------------------------------------------
def test_an_occurrence_due_while_paused_is_skipped_even_if_claimed_after_the_resume(
        store: Store) -> None:
    state = entry(store)
    paused = store.pause("e", "alice@ops", "billing is down")
    assert paused is not None and paused.paused is not None
    after(store, paused.paused.at + 5)
    resumed = store.resume("e", "bob@ops")
    assert resumed is not None and resumed.resumed_at is not None
    due = paused.paused.at + 1  # came due while paused
    assert due < resumed.resumed_at
    result = claim(store, A, state, due)
    assert result.status is ClaimStatus.OK
    assert result.claims == () and result.skipped == ((due, Reason.PAUSED),)


def test_a_run_taken_back_while_being_sent_is_skipped_paused_and_its_message_refused(
        store: Store) -> None:
    c = one = claims(store, A, 1000)[0]
    sending(store, A, one)  # published, perhaps, and then its beat died
    assert store.reclaim([Reclaim("e", c.due, c.token)], B.id) == [True]
    store.pause("e", "alice@ops")
    result = claim(store, B, None)
    assert result.taken == () and (c.due, Reason.PAUSED) in result.skipped
    assert store.start(delivery(c, process(1))).verdict is StartVerdict.REFUSED
    assert run(store, c).state is RunState.SKIPPED


def test_a_paused_entry_checked_again_after_a_lost_reply_is_never_sent(store: Store) -> None:
    c = claims(store, A, 1000)[0]
    store.pause("e", "alice@ops")
    first = check(store, A, c)
    again = check(store, A, c)  # the first reply was lost
    assert (first.verdict, again.verdict) == (CheckVerdict.SKIPPED, CheckVerdict.SKIPPED)
    assert store.record_sent(A, [c]) == 1 or run(store, c).state is RunState.SKIPPED
    assert run(store, c).state is RunState.SKIPPED


# -- overlap="buffer_one" -----------------------------------------------------------------
@pytest.mark.parametrize("ending", ["released", "unreadable", "requeued_then_done"])
def test_more_ends_of_the_previous_run_free_the_waiting_one(store: Store, backend: Backend,
                                                            ending: str) -> None:
    previous, c = claims(store, A, 1000, 2000)
    sending(store, A, previous)
    if ending != "released":
        store.record_sent(A, [previous])
    assert buffered(store, A, c) is CheckVerdict.WAITING
    if ending == "released":  # its publish failed: its holder gives it back
        assert store.release(A, [Release(previous, "boom", "OSError")], 5) == [RunState.DUE]
    elif ending == "unreadable":
        backend.corrupt_run(store, "e", previous.due, '{"state": "sent"')
    else:
        started(store, previous, process(1))
        assert store.requeue(delivery(previous, process(1)))
        assert take(store, B) == ()  # sent again: still unfinished
        started(store, previous, process(2))
        assert store.finish([Outcome("e", previous.due, previous.token, RunState.DONE)])
    taken = [t for t in take(store, B) if t.due == c.due]
    assert len(taken) == 1 and taken[0].token > c.token
    assert buffered(store, B, taken[0]) is CheckVerdict.SEND


@pytest.mark.history_limit(2)
def test_a_previous_run_pushed_out_of_the_history_frees_the_waiting_one(
        store: Store) -> None:
    """Sent, never started, the oldest of a full history: presumed lost (history_limit)."""
    previous, c, _held = claims(store, A, 1000, 2000, 3000)  # ``_held``: claimed, unchecked
    send(store, A, previous)
    assert buffered(store, A, c) is CheckVerdict.WAITING
    assert take(store, B) == ()  # trims: the sent run is pushed out, presumed lost
    lost = run(store, ("e", previous.due)) if previous.due in runs(store) else None
    assert lost is None or (lost.state, lost.reason) == (RunState.LOST,
                                                         Reason.HISTORY_LIMIT)
    [again] = take(store, B)
    assert again.due == c.due
    assert buffered(store, B, again) is CheckVerdict.SEND
    # Its message still runs when it turns up (a lost run's late delivery).
    assert store.start(delivery(previous, process(1))).verdict is StartVerdict.RUN


def test_a_waiting_run_cannot_be_started_finished_or_marked_sent(store: Store) -> None:
    previous, c = claims(store, A, 1000, 2000)
    send(store, A, previous)
    assert buffered(store, A, c) is CheckVerdict.WAITING
    assert store.start(delivery(c, process(1))).verdict is StartVerdict.REFUSED
    assert store.finish([Outcome("e", c.due, c.token, RunState.DONE),
                         Outcome("e", c.due, None, RunState.FAILED)]) == [False, False]
    assert store.record_sent(A, [c]) == 0
    assert store.release(A, [Release(c)]) == [None]
    assert run(store, c).state is RunState.WAITING


def test_two_beats_checking_two_runs_of_a_buffered_entry_send_one(store: Store) -> None:
    first = claims(store, A, 1000)[0]
    state = store.entries(["e"])[0]
    [second] = claim(store, B, store.register([EntrySeed("e")])["e"],
                     state.anchor + 2000).claims
    verdicts = {buffered(store, B, second), buffered(store, A, first)}
    sent = [c for c in (first, second) if run(store, c).state is RunState.SENDING]
    assert len(sent) == 1 and CheckVerdict.SEND in verdicts


def test_an_occurrence_older_than_the_running_one_is_not_buffered(store: Store) -> None:
    older = claims(store, A, 1000)[0]
    state = store.entries(["e"])[0]
    [newer] = claim(store, B, store.register([EntrySeed("e")])["e"],
                    state.anchor + 2000).claims
    send(store, B, newer)  # A was slow to check its claim: B's newer one went first
    result = check(store, A, older, overlap=Overlap.BUFFER_ONE)
    assert (result.verdict, result.reason) == (CheckVerdict.SKIPPED, Reason.OVERLAP)


def test_an_occurrence_older_than_a_running_run_now_waits_for_it(store: Store) -> None:
    """An operator's run now is due now, newer than any occurrence: not a newer occurrence
    of the schedule, so the scheduled one waits for it (and then runs)."""
    c = claims(store, A, -5000)[0]  # due before now
    store.request_run("e", "alice@ops")
    [manual] = take(store, B)
    send(store, B, manual)
    assert manual.due > c.due
    assert buffered(store, A, c) is CheckVerdict.WAITING
    store.finish([Outcome("e", manual.due, manual.token, RunState.DONE)])
    [again] = take(store, B)
    assert again.due == c.due and buffered(store, B, again) is CheckVerdict.SEND


def test_a_backfilled_run_of_a_buffered_entry_is_sent_and_the_waiting_one_waits_on(
        store: Store) -> None:
    previous, c = claims(store, A, 1000, 2000)
    send(store, A, previous)
    assert buffered(store, A, c) is CheckVerdict.WAITING
    store.backfill("e", [previous.due - 1000], "alice@ops")
    [manual] = take(store, B)
    assert manual.manual and manual.due == previous.due - 1000
    assert buffered(store, B, manual) is CheckVerdict.SEND
    assert run(store, c).state is RunState.WAITING
    store.record_sent(B, [manual])
    store.finish([Outcome("e", previous.due, previous.token, RunState.DONE)])
    assert take(store, A) == ()  # the manual run is unfinished
    store.finish([Outcome("e", manual.due, manual.token, RunState.DONE)])
    assert [t.due for t in take(store, A)] == [c.due]


def test_a_waiting_run_whose_entry_is_busy_is_not_reported_due(store: Store) -> None:
    previous, c = claims(store, A, 1000, 2000)
    send(store, A, previous)
    assert buffered(store, A, c) is CheckVerdict.WAITING
    found = store.live_runs(LiveQuery(A.id, frozenset(), 0, 0, 0))
    assert [ref.due for ref in found.due if ref.entry == "e"] == []
    store.finish([Outcome("e", previous.due, previous.token, RunState.DONE)])
    found = store.live_runs(LiveQuery(A.id, frozenset(), 0, 0, 0))
    assert [ref.due for ref in found.due if ref.entry == "e"] == [c.due]


@pytest.mark.parametrize("overlap", list(Overlap))
def test_checking_a_waiting_run_again_answers_the_same_on_every_backend(
        store: Store, overlap: Overlap) -> None:
    """Its holder asks again (a lost reply), perhaps with another overlap policy (its
    settings were reloaded meanwhile): the run is waiting, made so by this holder, and that
    is the answer (CheckVerdict.WAITING)."""
    previous, c = claims(store, A, 1000, 2000)
    send(store, A, previous)
    assert buffered(store, A, c) is CheckVerdict.WAITING
    assert check(store, A, c, overlap=overlap).verdict is CheckVerdict.WAITING
    assert run(store, c).state is RunState.WAITING
    # Another holder (or this one with another token) is refused: the run is not its.
    assert check(store, B, c, overlap=overlap).verdict is CheckVerdict.REFUSED
    assert check(store, A, Claim(c.entry, c.due, c.token + 1),
                 overlap=overlap).verdict is CheckVerdict.REFUSED
    assert run(store, c).state is RunState.WAITING


def test_history_of_a_backfill_twice_lists_each_instant_once(store: Store) -> None:
    state = entry(store)
    dues = [state.anchor - 3000, state.anchor - 2000]
    store.backfill("e", dues + dues, "alice@ops")
    store.backfill("e", list(reversed(dues)), "alice@ops")
    assert sorted(d for d in runs(store) if d in dues) == dues


def test_register_raises_the_token_counter_to_known_runs_not_restored(store: Store) -> None:
    """A run the caller knows of at an instant where the store has another record is not
    restored, but its token was handed out all the same: no claim may get it again."""
    c = claims(store, A, 1000)[0]
    send(store, A, c)
    assert store.finish([Outcome("e", c.due, c.token, RunState.DONE)]) == [True]
    known = Run("e", c.due, RunState.SENT, token=c.token + 40, task_id="t-x")
    state = store.register([EntrySeed("e", "every 1s", runs=(known,))])["e"]
    assert state.token >= c.token + 40
    assert (run(store, c).token, run(store, c).state) == (c.token, RunState.DONE)  # kept
    [later] = claims(store, B, 2000)
    assert later.token > c.token + 40


def _due_refs(store: Store, limit: int = 10_000) -> list[int]:
    found = store.live_runs(LiveQuery(A.id, frozenset(), 0, 0, 0, limit))
    return [ref.due for ref in found.due if ref.entry == "e"]


def test_a_waiting_run_is_reported_due_as_its_entry_frees_and_fills(store: Store) -> None:
    """Every way the entry stops or starts being busy, and a pause, moves it in and out of
    what the sweeps report (they report what a claim would take)."""
    previous, c = claims(store, A, 1000, 2000)
    sending(store, A, previous)
    assert buffered(store, A, c) is CheckVerdict.WAITING
    assert _due_refs(store) == []
    store.pause("e", "alice@ops")  # a claim would record it skipped: reported
    assert _due_refs(store) == [c.due]
    store.resume("e", "bob@ops")
    assert _due_refs(store) == []
    assert store.release(A, [Release(previous)]) == [RunState.DUE]  # not busy any more
    assert sorted(_due_refs(store)) == sorted([previous.due, c.due])
    # Both taken by one claim (the entry is not busy); claimed, neither is reported.
    assert sorted(t.due for t in take(store, B)) == sorted([previous.due, c.due])
    assert _due_refs(store) == []


def test_waiting_runs_of_busy_entries_do_not_use_up_a_sweeps_limit(store: Store) -> None:
    previous, c = claims(store, A, 1000, 2000)
    send(store, A, previous)
    assert buffered(store, A, c) is CheckVerdict.WAITING
    other = claims(store, A, 1000, entry="f")[0]
    store.release(A, [Release(other)])
    found = store.live_runs(LiveQuery(A.id, frozenset(), 0, 0, 0, 1))
    assert [(ref.entry, ref.due) for ref in found.due] == [("f", other.due)]
