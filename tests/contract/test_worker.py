"""The worker's side: start (the fencing before a task body runs), finish (outcomes), and
lookup_task (signals that carry only a task id)."""

from __future__ import annotations

import pytest

from beat_claims.enums import Reason, RunState, StartVerdict
from beat_claims.stores.base import Claim, EntryState, Outcome, Reclaim, Release, Store
from beat_claims.worker import ALREADY_HERE

from .helpers import (
    A,
    B,
    after,
    check,
    claim,
    claims,
    delivery,
    now,
    one_claim,
    process,
    register,
    run,
    runs,
    send,
    sending,
    started,
    take,
)


def sent(store: Store, offset: int = 1000) -> Claim:
    return send(store, A, one_claim(store, A, offset))


def finish(store: Store, c: Claim, state: RunState, token: int | str | None = "same",
           **kw: object) -> bool:
    t = c.token if token == "same" else token
    [recorded] = store.finish([Outcome(c.entry, c.due, t, state, **kw)])  # type: ignore[arg-type]
    return recorded


# -- start --------------------------------------------------------------------------------
def test_the_first_delivery_of_a_sent_run_starts_it(store: Store) -> None:
    c = sent(store)
    decision = store.start(delivery(c, process(1)))
    assert decision.verdict is StartVerdict.RUN and decision.ok
    r = run(store, c)
    assert (r.state, r.worker, r.worker_pid) == (RunState.STARTED, process(1).worker,
                                                 process(1).pid)
    assert r.started_at is not None


def test_a_delivery_faster_than_the_sent_mark_starts_the_run(store: Store) -> None:
    c = sending(store, A, one_claim(store, A))
    assert store.start(delivery(c, process(1))).verdict is StartVerdict.RUN
    assert run(store, c).state is RunState.STARTED


def test_a_second_delivery_while_the_first_runs_is_busy_and_names_the_starter(
        store: Store) -> None:
    c = sent(store)
    first = process(1, identity="9f0c6e2a-boot:4711")
    started(store, c, first)
    second = store.start(delivery(c, process(2)))
    assert second.verdict is StartVerdict.BUSY and not second.ok
    assert second.busy_with is not None
    assert (second.busy_with.worker, second.busy_with.pid) == (first.worker, first.pid)
    assert second.busy_with.process == first.process
    assert run(store, c).worker == first.worker


def test_the_starting_process_delivering_again_is_refused(store: Store) -> None:
    c = sent(store)
    started(store, c, process(1))
    again = store.start(delivery(c, process(1)))
    # The worker tells its own start whose reply was lost by this answer (worker.py).
    assert (again.verdict, again.why) == (StartVerdict.REFUSED, ALREADY_HERE), again


def test_same_name_and_pid_but_a_newer_process_is_another_process(store: Store) -> None:
    c = sent(store)
    started(store, c, process(1, identity="boot-1:100"))
    restarted = store.start(delivery(c, process(1, identity="boot-1:999")))
    assert restarted.verdict is StartVerdict.BUSY  # the caller judges whether 100.0 is gone


def test_a_celery_retry_with_more_retries_runs(store: Store) -> None:
    c = sent(store)
    started(store, c, process(1))
    assert store.start(delivery(c, process(1), retries=1)).verdict is StartVerdict.RUN
    assert store.start(delivery(c, process(2), retries=2)).verdict is StartVerdict.RUN
    r = run(store, c)
    assert (r.state, r.retries) == (RunState.STARTED, 2)
    # Not more retries than recorded: a duplicate.
    assert not store.start(delivery(c, process(3), retries=2)).ok


def test_a_redelivery_runs_when_the_process_that_started_it_is_gone(store: Store) -> None:
    c = sent(store)
    started(store, c, process(1))
    busy = store.start(delivery(c, process(2)))
    assert busy.busy_with is not None
    takeover = store.start(delivery(c, process(2), takeover=busy.busy_with))
    assert takeover.verdict is StartVerdict.RUN
    assert run(store, c).worker == process(2).worker
    # Naming a process that is not the one that started it takes nothing over.
    third = store.start(delivery(c, process(3), takeover=process(1)))
    assert third.verdict is StartVerdict.BUSY
    assert third.busy_with is not None and third.busy_with.worker == process(2).worker


def test_a_superseded_token_is_refused(store: Store) -> None:
    c = sending(store, A, one_claim(store, A))
    store.reclaim([Reclaim(c.entry, c.due, c.token)], B.id)  # a message may exist
    [again] = take(store, B)
    send(store, B, again)
    old = store.start(delivery(c, process(1)))
    assert old.verdict is StartVerdict.REFUSED and old.why
    assert store.start(delivery(again, process(2))).verdict is StartVerdict.RUN
    # Whatever the order: the old token never starts, even after the run finished.
    assert finish(store, again, RunState.DONE)
    assert store.start(delivery(c, process(3))).verdict is StartVerdict.REFUSED


def test_a_run_not_handed_to_the_broker_is_refused(store: Store) -> None:
    claimed, released = claims(store, A, 1000, 2000)
    store.release(A, [Release(released)])
    for c in (claimed, released):
        decision = store.start(delivery(c, process(1)))
        assert decision.verdict is StartVerdict.REFUSED and decision.why
    assert run(store, claimed).state is RunState.CLAIMED


@pytest.mark.parametrize("final", [RunState.DONE, RunState.FAILED, RunState.CANCELLED])
def test_a_finished_run_refuses_every_delivery(store: Store, final: RunState) -> None:
    c = sent(store)
    started(store, c, process(1))
    assert finish(store, c, final)
    for d in (delivery(c, process(2)), delivery(c, process(1), retries=5)):
        decision = store.start(d)
        assert decision.verdict is StartVerdict.REFUSED and decision.why
    assert run(store, c).state is final


def test_a_skipped_run_refuses_every_delivery(store: Store) -> None:
    c = one_claim(store, A)
    check(store, A, c, skip=Reason.CATCH_UP)
    assert store.start(delivery(c, process(1))).verdict is StartVerdict.REFUSED


@pytest.mark.history_limit(1)
def test_a_delivery_of_a_run_trimmed_behind_the_checkpoint_is_refused(store: Store) -> None:
    c = sent(store, 1000)
    started(store, c, process(1))
    assert finish(store, c, RunState.DONE)
    state = register(store, "e")["e"]
    claim(store, A, state, c.due + 1000)  # the final run is pushed out of the history
    assert c.due not in runs(store)
    refused = store.start(delivery(c, process(2)))
    assert refused.verdict is StartVerdict.REFUSED and refused.why


def test_a_delivery_without_a_record_past_the_checkpoint_is_untracked(store: Store) -> None:
    c = one_claim(store, A)
    ahead = store.start(delivery(Claim("e", c.due + 99_000, 1), process(1)))
    assert ahead.verdict is StartVerdict.UNTRACKED and ahead.ok
    unknown = store.start(delivery(Claim("never-registered", c.due, 1), process(1)))
    assert unknown.verdict is StartVerdict.UNTRACKED and unknown.ok
    assert sorted(runs(store)) == [c.due]  # nothing recorded for them


def test_a_late_start_of_a_run_presumed_lost_revives_it(store: Store) -> None:
    c = sent(store)
    cutoff = after(store, run(store, c).sent_at or 0)
    assert finish(store, c, RunState.LOST, reason=Reason.RUN_TIMEOUT, inactive_since=cutoff)
    assert run(store, c).state is RunState.LOST
    assert store.open_runs(before=now(store) + 1) == []
    assert store.start(delivery(c, process(1))).verdict is StartVerdict.RUN
    r = run(store, c)
    assert (r.state, r.reason, r.finished_at) == (RunState.STARTED, None, None)
    [revived] = store.open_runs(before=now(store) + 1)
    assert revived.since >= cutoff
    # Its run_timeout counts again from the late start: the same cutoff does not re-lose it.
    assert not finish(store, c, RunState.LOST, reason=Reason.RUN_TIMEOUT,
                      inactive_since=cutoff)
    assert store.start(delivery(c, process(2))).verdict is StartVerdict.BUSY
    assert finish(store, c, RunState.DONE)
    assert run(store, c).state is RunState.DONE


def test_a_run_lost_while_running_is_busy_for_a_second_delivery(store: Store) -> None:
    c = sent(store)
    started(store, c, process(1))
    cutoff = after(store, run(store, c).started_at or 0)
    assert finish(store, c, RunState.LOST, reason=Reason.RUN_TIMEOUT, inactive_since=cutoff)
    second = store.start(delivery(c, process(2)))
    assert second.verdict is StartVerdict.BUSY
    assert second.busy_with is not None and second.busy_with.worker == process(1).worker


# -- finish -------------------------------------------------------------------------------
def test_an_outcome_is_recorded_and_a_final_state_is_never_overwritten(store: Store) -> None:
    c = sent(store)
    started(store, c, process(1))
    assert finish(store, c, RunState.FAILED, exc_type="ValueError", exc_message="bad input",
                  worker=process(1).worker)
    r = run(store, c)
    assert (r.state, r.exc_type, r.exc_message, r.worker) == (
        RunState.FAILED, "ValueError", "bad input", process(1).worker)
    assert r.finished_at is not None
    # A hard time limit fires task_failure twice; a late success; a sweep's presumption.
    assert not finish(store, c, RunState.FAILED, exc_type="TimeLimitExceeded")
    assert not finish(store, c, RunState.DONE)
    assert not finish(store, c, RunState.DONE, token=None)
    assert not finish(store, c, RunState.LOST, inactive_since=now(store) + 1)
    assert run(store, c) == r


def test_an_outcome_of_a_superseded_token_is_ignored(store: Store) -> None:
    c = sent(store)
    started(store, c, process(1))
    assert not finish(store, c, RunState.DONE, token=c.token - 1)
    assert not finish(store, c, RunState.DONE, token=c.token + 1)
    assert run(store, c).state is RunState.STARTED
    assert finish(store, c, RunState.DONE, token=None)  # None: the current token
    assert run(store, c).state is RunState.DONE


def test_an_outcome_of_a_run_not_handed_to_the_broker_is_ignored(store: Store) -> None:
    claimed, released = claims(store, A, 1000, 2000)
    store.release(A, [Release(released)])
    assert store.finish([Outcome("e", c.due, None, RunState.DONE)
                         for c in (claimed, released)]) == [False, False]
    assert store.finish([Outcome("e", claimed.due + 1, None, RunState.DONE),
                         Outcome("nobody", claimed.due, None, RunState.DONE)]) == [False,
                                                                                   False]
    assert (run(store, claimed).state, run(store, released).state) == (RunState.CLAIMED,
                                                                       RunState.DUE)


def test_outcomes_never_touch_the_checkpoint(store: Store) -> None:
    old, new = claims(store, A, 1000, 2000)
    for c in (old, new):
        send(store, A, c)
        started(store, c, process(1))
    assert finish(store, new, RunState.DONE)
    assert finish(store, old, RunState.DONE)  # the older run's outcome comes last
    state = register(store, "e")["e"]
    assert state.checkpoint == new.due
    assert state == EntryState(state.anchor, new.due, new.token)


def test_lost_applies_only_to_a_run_not_active_since_inactive_since(store: Store) -> None:
    c = sent(store)
    sent_at = run(store, c).sent_at
    assert sent_at is not None
    assert not finish(store, c, RunState.LOST, reason=Reason.RUN_TIMEOUT,
                      inactive_since=sent_at)
    assert run(store, c).state is RunState.SENT
    assert finish(store, c, RunState.LOST, reason=Reason.RUN_TIMEOUT,
                  inactive_since=sent_at + 1)
    r = run(store, c)
    assert (r.state, r.reason) == (RunState.LOST, Reason.RUN_TIMEOUT)


def test_lost_applies_only_to_open_runs(store: Store) -> None:
    checked, claimed = claims(store, A, 1000, 2000)
    sending(store, A, checked)
    later = now(store) + 1
    assert store.finish([Outcome("e", c.due, c.token, RunState.LOST, Reason.RUN_TIMEOUT,
                                 inactive_since=later) for c in (checked, claimed)]) == [
        False, False]
    assert (run(store, checked).state, run(store, claimed).state) == (RunState.SENDING,
                                                                      RunState.CLAIMED)


# -- lookup_task --------------------------------------------------------------------------
def test_lookup_task_finds_the_run_a_task_id_was_started_for(store: Store) -> None:
    c = send(store, A, one_claim(store, A), task_id="task-42")
    assert store.lookup_task("task-42") is None  # not started yet
    started(store, c, process(1), task_id="task-42")
    found = store.lookup_task("task-42")
    assert found is not None and (found.entry, found.due, found.token) == (c.entry, c.due,
                                                                           c.token)
    assert store.lookup_task("no-such-task") is None


def test_a_refused_delivery_does_not_change_what_a_task_id_was_started_for(
        store: Store) -> None:
    c = sending(store, A, one_claim(store, A))
    store.reclaim([Reclaim(c.entry, c.due, c.token)], B.id)
    [again] = take(store, B)
    send(store, B, again, task_id="task-7")
    started(store, again, process(1), task_id="task-7")
    # The superseded message turns up late, with the same task id (it is the occurrence's).
    assert not store.start(delivery(c, process(2), task_id="task-7")).ok
    found = store.lookup_task("task-7")
    assert found is not None and found.token == again.token
