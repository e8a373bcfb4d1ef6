"""pause and resume: while an entry is paused every beat records each of its occurrences
skipped (paused) in the store, at the claim, when taken due again, or at the check before
publish; runs already handed over and an operator's requests are not touched. The pause is
of the instants: an occurrence due while the entry was paused, [last_paused_at, resumed_at),
stays skipped when it is claimed or checked after the resume."""

from __future__ import annotations

from beat_claims.enums import Reason, RunState
from beat_claims.stores.base import CheckVerdict, ClaimStatus, Outcome, Release, Store

from .helpers import (
    A,
    B,
    after,
    check,
    claim,
    claims,
    entry,
    now,
    one_claim,
    process,
    register,
    run,
    runs,
    send,
    started,
    take,
)


def test_an_unknown_entry_cannot_be_paused_or_resumed(store: Store) -> None:
    assert store.pause("nobody", "ops@host", "why") is None
    assert store.resume("nobody", "ops@host") is None


def test_a_pause_is_recorded_with_who_why_and_when(store: Store) -> None:
    entry(store)
    before = now(store)
    record = store.pause("e", "alice@ops", "billing is down")
    assert record is not None and record.paused is not None
    assert (record.paused.by, record.paused.note) == ("alice@ops", "billing is down")
    assert before <= record.paused.at <= now(store)
    [listed] = store.entries(["e"])
    assert listed.paused == record.paused
    # Pausing again keeps the instant, takes the new note and who.
    again = store.pause("e", "bob@ops", "still down")
    assert again is not None and again.paused is not None
    assert (again.paused.by, again.paused.note, again.paused.at) == (
        "bob@ops", "still down", record.paused.at)


def test_occurrences_claimed_while_paused_are_recorded_skipped(store: Store) -> None:
    state = entry(store)
    store.pause("e", "alice@ops")
    due1, due2 = state.anchor + 1000, state.anchor + 2000
    result = claim(store, A, state, due1, due2)
    assert result.status is ClaimStatus.OK
    assert result.claims == ()
    assert sorted(result.skipped) == [(due1, Reason.PAUSED), (due2, Reason.PAUSED)]
    assert result.state is not None and result.state.checkpoint == due2
    for due in (due1, due2):
        r = run(store, ("e", due))
        assert (r.state, r.reason) == (RunState.SKIPPED, Reason.PAUSED)


def test_a_run_claimed_before_the_pause_is_skipped_at_its_check(store: Store) -> None:
    c = one_claim(store, A)
    store.pause("e", "alice@ops")
    result = check(store, A, c)
    assert (result.verdict, result.reason) == (CheckVerdict.SKIPPED, Reason.PAUSED)
    r = run(store, c)
    assert (r.state, r.reason) == (RunState.SKIPPED, Reason.PAUSED)
    store.record_sent(A, [c])
    assert run(store, c).state is RunState.SKIPPED


def test_a_run_checked_again_after_the_pause_is_skipped(store: Store) -> None:
    """Its holder checked it, then asks again before publishing (a lost reply, a publish
    that stalled): the pause applies, nothing was published yet."""
    c = one_claim(store, A)
    assert check(store, A, c).verdict is CheckVerdict.SEND
    store.pause("e", "alice@ops")
    result = check(store, A, c)
    assert (result.verdict, result.reason) == (CheckVerdict.SKIPPED, Reason.PAUSED)
    assert run(store, c).state is RunState.SKIPPED


def test_a_run_due_again_while_paused_is_skipped_not_taken(store: Store) -> None:
    c = one_claim(store, A)
    store.release(A, [Release(c)])
    store.pause("e", "alice@ops")
    result = claim(store, B, None)
    assert result.taken == ()
    assert (c.due, Reason.PAUSED) in result.skipped
    r = run(store, c)
    assert (r.state, r.reason) == (RunState.SKIPPED, Reason.PAUSED)


def test_runs_handed_over_before_the_pause_are_not_touched(store: Store) -> None:
    sent, running = claims(store, A, 1000, 2000)
    send(store, A, sent)
    send(store, A, running)
    started(store, running, process(1))
    store.pause("e", "alice@ops")
    assert run(store, sent).state is RunState.SENT
    assert run(store, running).state is RunState.STARTED
    assert store.finish([Outcome("e", running.due, running.token, RunState.DONE)]) == [True]
    assert run(store, running).state is RunState.DONE


def test_an_operators_request_is_sent_while_paused(store: Store) -> None:
    entry(store)
    store.pause("e", "alice@ops")
    due = store.request_run("e", "bob@ops")
    assert due is not None
    [taken] = take(store, A)
    assert taken.manual and taken.due == due
    assert check(store, A, taken).verdict is CheckVerdict.SEND


def test_resume_records_who_and_occurrences_are_claimed_again(store: Store) -> None:
    state = entry(store)
    store.pause("e", "alice@ops")
    skipped = claim(store, A, state, state.anchor + 1000)
    assert skipped.state is not None
    before = now(store)
    record = store.resume("e", "bob@ops")
    assert record is not None and record.paused is None
    assert record.resumed_by == "bob@ops"
    assert record.resumed_at is not None and before <= record.resumed_at <= now(store)
    [listed] = store.entries(["e"])
    assert (listed.paused, listed.resumed_by) == (None, "bob@ops")
    result = claim(store, A, skipped.state, state.anchor + 2000)
    assert [c.due for c in result.claims] == [state.anchor + 2000]
    # What was skipped while paused stays skipped.
    assert runs(store)[state.anchor + 1000].state is RunState.SKIPPED


def test_resuming_an_entry_that_is_not_paused_records_nothing(store: Store) -> None:
    register(store, "e")
    record = store.resume("e", "bob@ops")
    assert record is not None
    assert (record.paused, record.resumed_by, record.resumed_at) == (None, None, None)


def test_a_pause_is_per_entry(store: Store) -> None:
    states = register(store, "e", "f")
    store.pause("e", "alice@ops")
    f = states["f"]
    result = claim(store, A, f, f.anchor + 1000, entry="f")
    assert [c.due for c in result.claims] == [f.anchor + 1000]
    [e_rec, f_rec] = store.entries(["e", "f"])
    assert e_rec.paused is not None and f_rec.paused is None


def test_the_store_clock_reads_as_the_heartbeat_does(store: Store) -> None:
    first = now(store)
    read = store.now()
    assert first <= read <= now(store)


# -- the last pause's instants, after the resume ------------------------------------------
def _paused_and_resumed(store: Store, hold_ms: int = 5) -> tuple[int, int]:
    """Pause the entry for a little while: its last pause [paused at, resumed at)."""
    paused = store.pause("e", "alice@ops", "billing is down")
    assert paused is not None and paused.paused is not None
    after(store, paused.paused.at + hold_ms)
    resumed = store.resume("e", "bob@ops")
    assert resumed is not None and resumed.resumed_at is not None
    assert (resumed.paused, resumed.last_paused_at) == (None, paused.paused.at)
    return paused.paused.at, resumed.resumed_at


def test_the_last_pause_is_kept_after_the_resume(store: Store) -> None:
    entry(store)
    start, end = _paused_and_resumed(store)
    [record] = store.entries(["e"])
    assert (record.paused, record.last_paused_at, record.resumed_at) == (None, start, end)
    assert record.paused_for(start) and record.paused_for(end - 1)
    assert not record.paused_for(start - 1) and not record.paused_for(end)
    # Paused again: every occurrence is skipped; the last pause is the one before, until
    # this one is resumed.
    again = store.pause("e", "carol@ops")
    assert again is not None and again.paused is not None
    assert (again.last_paused_at, again.resumed_at) == (start, end)
    assert again.paused_for(start - 1) and again.paused_for(end + 10**9)
    after(store, again.paused.at)
    record = store.resume("e", "dave@ops")
    assert record is not None and record.last_paused_at == again.paused.at


def test_only_the_instants_of_the_last_pause_are_skipped_after_the_resume(
        store: Store) -> None:
    state = entry(store)
    start, end = _paused_and_resumed(store)
    dues = [start - 1, start, end - 1, end, end + 1000]
    result = claim(store, A, state, *dues)
    assert result.status is ClaimStatus.OK
    assert [c.due for c in result.claims] == [start - 1, end, end + 1000]
    assert result.skipped == ((start, Reason.PAUSED), (end - 1, Reason.PAUSED))
    assert (run(store, ("e", start)).state, run(store, ("e", start)).reason) == (
        RunState.SKIPPED, Reason.PAUSED)


def test_a_run_claimed_before_a_pause_and_due_in_it_is_skipped_at_its_check(
        store: Store) -> None:
    state = entry(store)
    due = now(store) + 300  # claimed ahead of its instant (a beat's look-ahead)
    [c] = claim(store, A, state, due).claims
    paused = store.pause("e", "alice@ops")
    assert paused is not None and paused.paused is not None and paused.paused.at < due
    after(store, due)
    resumed = store.resume("e", "bob@ops")
    assert resumed is not None and resumed.resumed_at is not None
    assert resumed.resumed_at > due
    result = check(store, A, c)
    assert (result.verdict, result.reason) == (CheckVerdict.SKIPPED, Reason.PAUSED)
    assert check(store, A, c).verdict is CheckVerdict.SKIPPED  # asked again: the same


def test_a_run_due_again_from_the_last_pause_is_skipped_when_taken_after_the_resume(
        store: Store) -> None:
    state = entry(store)
    due = now(store) + 300
    [c] = claim(store, A, state, due).claims
    store.pause("e", "alice@ops")
    after(store, due)
    store.resume("e", "bob@ops")
    assert store.release(A, [Release(c)]) == [RunState.DUE]  # its holder gave it back
    result = claim(store, B, None)
    assert result.taken == () and result.skipped == ((due, Reason.PAUSED),)
    assert run(store, c).state is RunState.SKIPPED


def test_an_operators_request_of_an_instant_of_the_last_pause_is_sent(store: Store) -> None:
    state = entry(store)
    start, _end = _paused_and_resumed(store)
    skipped = claim(store, A, state, start + 1).skipped
    assert skipped == ((start + 1, Reason.PAUSED),)
    result = store.backfill("e", [start + 1], "carol@ops")  # what the pause skipped
    assert result is not None and result.created == (start + 1,)
    [manual] = take(store, B)
    assert manual.manual and manual.due == start + 1
    assert check(store, B, manual).verdict is CheckVerdict.SEND
