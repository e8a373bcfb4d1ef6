"""Pause/resume, backfill and overlap="buffer_one" at the contract: lost replies and more.

Tests marked ``xfail(strict=True, reason="review: ...")`` reproduce a problem found in the
review; the others pin a property that holds and was not pinned elsewhere: lost replies on
pause, resume and backfill, a waiting run two beats race for, a bad pause field.
"""

from __future__ import annotations

import sqlite3

import pytest

from beat_claims.enums import Overlap, Reason, RunState, StartVerdict
from beat_claims.runs import Run
from beat_claims.stores.base import CheckVerdict, EntrySeed, Outcome, Store
from beat_claims.stores.redis import RedisStore
from beat_claims.stores.sqlite import SQLiteStore

from .helpers import (
    A,
    B,
    after,
    check,
    claim,
    claims,
    delivery,
    entry,
    now,
    process,
    run,
    runs,
    send,
    take,
)


def _corrupt_pause_field(store: Store, field: str, raw: str) -> None:
    """One of the entry's pause fields becomes ``raw``, as another program (or an operator
    with redis-cli or the sqlite3 shell) would write it. PostgreSQL keeps them in bigint
    columns: there such a value cannot be stored."""
    if isinstance(store, RedisStore):
        store.client.hset(store.entry_keys("e")[0], field, raw)
    elif isinstance(store, SQLiteStore):
        db = sqlite3.connect(store.path, timeout=5, isolation_level=None)
        try:
            db.execute(f"UPDATE {store.tables.entries} SET {field} = ? WHERE name = ?",
                       (raw, "e"))
        finally:
            db.close()
    else:
        pytest.skip(f"{type(store).__name__} keeps {field} in a typed column: {raw!r} cannot"
                    " be stored there")


# -- bad records ----------------------------------------------------------------------------
def test_an_unreadable_pause_instant_is_read_as_the_claims_apply_it(store: Store) -> None:
    """An entry whose paused_at cannot be read is shown paused (instant 0) as the claims
    treat it, so status, the admin, health and the exporter say why nothing runs."""
    state = entry(store)
    assert store.pause("e", "alice@ops", "billing is down") is not None
    _corrupt_pause_field(store, "paused_at", "yesterday")
    [record] = store.entries(["e"])
    result = claim(store, A, state, state.anchor + 1000)
    skipped_for_pause = [due for due, reason in result.skipped if reason is Reason.PAUSED]
    # Either the entry is paused (and shown so), or it is not (and its occurrence runs).
    assert (record.paused is not None) == bool(skipped_for_pause), (record, result)


def test_an_unreadable_last_pause_skips_nothing_after_the_resume(store: Store) -> None:
    """A last pause whose start cannot be read is no interval: occurrences after the resume
    are claimed (nothing raises, the entry keeps running)."""
    state = entry(store)
    store.pause("e", "alice@ops")
    store.resume("e", "bob@ops")
    _corrupt_pause_field(store, "last_paused_at", "not-a-number")
    [record] = store.entries(["e"])
    assert record.paused is None and record.last_paused_at is None
    result = claim(store, A, state, state.anchor + 1000)
    assert [c.due for c in result.claims] == [state.anchor + 1000], result


# -- lost replies -------------------------------------------------------------------------
def test_a_pause_asked_twice_then_resumed_keeps_the_first_instant(store: Store) -> None:
    """pause's reply was lost and the operator asked again: the pause (and so the last
    pause after the resume) starts at the first request."""
    entry(store)
    first = store.pause("e", "alice@ops", "down")
    assert first is not None and first.paused is not None
    after(store, first.paused.at + 5)
    again = store.pause("e", "alice@ops", "down")
    assert again is not None and again.paused is not None
    assert again.paused.at == first.paused.at
    resumed = store.resume("e", "bob@ops")
    assert resumed is not None and resumed.last_paused_at == first.paused.at


def test_a_resume_asked_twice_keeps_the_first_resume(store: Store) -> None:
    """resume's reply was lost and the operator asked again: the second records nothing,
    so the last pause stays [paused at, first resume) and who resumed is kept."""
    entry(store)
    paused = store.pause("e", "alice@ops")
    assert paused is not None and paused.paused is not None
    first = store.resume("e", "bob@ops")
    assert first is not None and first.resumed_at is not None
    after(store, first.resumed_at + 5)
    again = store.resume("e", "carol@ops")
    assert again is not None
    assert (again.resumed_by, again.resumed_at, again.last_paused_at) == (
        "bob@ops", first.resumed_at, paused.paused.at)


def test_a_backfill_asked_again_after_its_runs_were_sent_creates_nothing(
        store: Store) -> None:
    """The first backfill's reply was lost, a beat already sent what it created, and the
    operator asks again: nothing is created twice, whatever state the runs reached."""
    [first] = claims(store, A, 1000)
    send(store, A, first)
    store.finish([Outcome("e", first.due, first.token, RunState.DONE)])
    dues = [first.due - 1000 * k for k in (1, 2, 3)]
    made = store.backfill("e", dues, "alice@ops")
    assert made is not None and sorted(made.created) == sorted(dues)
    taken = take(store, B)
    assert sorted(c.due for c in taken) == sorted(dues)
    send(store, B, taken[0])  # sent
    store.finish([Outcome("e", taken[1].due, None, RunState.DONE)])  # claimed, not yet sent
    again = store.backfill("e", dues, "alice@ops")
    assert again is not None and again.created == ()
    assert take(store, A) == ()


# -- buffer_one ---------------------------------------------------------------------------
def test_two_beats_racing_for_a_waiting_run_send_it_once(store: Store) -> None:
    """The previous run finishes and both beats' sweeps take the waiting run: one gets it
    (a fresh token), the other nothing; the loser's stale check is refused."""
    first, second = claims(store, A, 1000, 2000)
    send(store, A, first)
    assert check(store, A, second, overlap=Overlap.BUFFER_ONE).verdict is CheckVerdict.WAITING
    store.finish([Outcome("e", first.due, first.token, RunState.DONE)])
    got_a = take(store, A)
    got_b = take(store, B)
    assert len(got_a) + len(got_b) == 1, (got_a, got_b)
    winner, c = (A, got_a[0]) if got_a else (B, got_b[0])
    loser = B if winner is A else A
    assert check(store, loser, c, overlap=Overlap.BUFFER_ONE).verdict is CheckVerdict.REFUSED
    assert check(store, winner, c, overlap=Overlap.BUFFER_ONE).verdict is CheckVerdict.SEND
    # The first holder checks its old token again (a lost reply): not its run any more.
    assert check(store, A, second, overlap=Overlap.BUFFER_ONE).verdict is CheckVerdict.REFUSED
    assert run(store, c).state is RunState.SENDING


def test_a_waiting_run_of_an_entry_paused_and_resumed_meanwhile_is_sent(store: Store) -> None:
    """A run waiting from before a pause is not an instant of the pause: resumed before
    any beat took it, it is sent once the previous run ends."""
    first, second = claims(store, A, 1000, 2000)
    send(store, A, first)
    assert check(store, A, second, overlap=Overlap.BUFFER_ONE).verdict is CheckVerdict.WAITING
    after(store, max(second.due, now(store)))
    store.pause("e", "alice@ops")
    store.resume("e", "alice@ops")
    store.finish([Outcome("e", first.due, first.token, RunState.DONE)])
    [again] = take(store, B)
    assert again.due == second.due
    assert check(store, B, again, overlap=Overlap.BUFFER_ONE).verdict is CheckVerdict.SEND
    assert runs(store)[second.due].state is RunState.SENDING


def test_a_backfill_naming_an_instant_twice_creates_one_run(store: Store) -> None:
    """Instants repeated or out of order (a caller that merged two ranges) make one run
    each, taken oldest first."""
    [first] = claims(store, A, 1000)
    send(store, A, first)
    store.finish([Outcome("e", first.due, first.token, RunState.DONE)])
    older, old = first.due - 2000, first.due - 1000
    made = store.backfill("e", [old, older, old, older], "alice@ops")
    assert made is not None and sorted(made.created) == [older, old], made
    taken = take(store, B)
    assert [c.due for c in taken] == [older, old]


@pytest.mark.parametrize("ended", [RunState.CANCELLED, RunState.SKIPPED])
def test_a_sent_run_a_beat_knows_replaces_an_older_copys_run_that_ended_without_running(
        store: Store, ended: RunState) -> None:
    """The store came back from a copy taken before a backfill: it holds the run the
    backfill replaced (ended without running, a lower token). A live beat that sent the
    backfill's run registers it: it is restored, and its delivery starts (not refused as
    superseded). One that ended after running (done) is never replaced."""
    c = claims(store, A, 1000)[0]
    send(store, A, c, task_id="t-old")
    store.finish([Outcome("e", c.due, c.token, ended, reason=Reason.PAUSED)
                  if ended is RunState.SKIPPED else Outcome("e", c.due, c.token, ended)])
    assert run(store, c).state is ended
    known = Run("e", c.due, RunState.SENT, token=c.token + 5, task_id="t-new", manual=True,
                extra={"reseeded": True})
    store.register([EntrySeed("e", "every 1s", runs=(known,))])
    restored = run(store, c)
    assert (restored.state, restored.token) == (RunState.SENT, c.token + 5)
    new = delivery(c, process(1), task_id="t-new", token=c.token + 5)
    assert store.start(new).verdict is StartVerdict.RUN
    assert store.lookup_task("t-old") is None
