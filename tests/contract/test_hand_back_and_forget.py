"""A delivery that gives its run back (Reject(requeue=True), a replacing task), outcomes of
deliveries that never ran, the store's id, idempotent operator requests, entries removed
by an operator, and what a beat learns while the store settles."""

from __future__ import annotations

from beat_claims.enums import Overlap, RunState, StartVerdict
from beat_claims.runs import Run
from beat_claims.stores.base import CheckVerdict, Claim, EntrySeed, Outcome, Store

from .helpers import A, B, check, claims, delivery, now, process, register, run, send, started
from .helpers import runs as runs_of


def _sent(store: Store) -> list[Claim]:
    cs = claims(store, A, 1000, 2000)
    for c in cs:
        send(store, A, c)
    return cs


def test_a_started_run_given_back_by_its_delivery_is_started_by_the_next_one(
        store: Store) -> None:
    c, _ = _sent(store)
    first = process(1)
    started(store, c, first)
    assert store.requeue(delivery(c, first))
    assert run(store, c).state is RunState.SENT
    # Redelivered (to the same process or another): it runs, it is not "already started".
    again = store.start(delivery(c, first))
    assert again.verdict is StartVerdict.RUN, again
    assert run(store, c).state is RunState.STARTED


def test_only_the_process_that_started_a_run_can_give_it_back(store: Store) -> None:
    c, other = _sent(store)
    started(store, c, process(1))
    assert not store.requeue(delivery(c, process(2)))  # another process
    assert not store.requeue(delivery(other, process(1)))  # a run it did not start
    store.finish([Outcome("e", c.due, c.token, RunState.DONE)])
    assert not store.requeue(delivery(c, process(1)))  # final: nothing to give back
    assert run(store, c).state is RunState.DONE


def test_giving_back_twice_after_a_lost_reply_is_harmless(store: Store) -> None:
    c, _ = _sent(store)
    started(store, c, process(1))
    assert store.requeue(delivery(c, process(1)))
    assert not store.requeue(delivery(c, process(1)))
    assert run(store, c).state is RunState.SENT


def test_an_outcome_for_unstarted_runs_only_leaves_a_running_one_alone(store: Store) -> None:
    """A duplicate delivery that expires or is revoked before it runs must not cancel the
    run another delivery is executing."""
    running, waiting = _sent(store)
    started(store, running, process(1))
    recorded = store.finish([
        Outcome("e", running.due, running.token, RunState.CANCELLED, unstarted_only=True),
        Outcome("e", waiting.due, waiting.token, RunState.CANCELLED, unstarted_only=True)])
    assert recorded == [False, True]
    assert run(store, running).state is RunState.STARTED
    assert run(store, waiting).state is RunState.CANCELLED


def test_the_store_has_an_id_that_workers_see_too(store: Store) -> None:
    first = store.heartbeat(A, 10).store_id
    assert first and store.heartbeat(B, 10).store_id == first
    c, _ = _sent(store)
    assert store.start(delivery(c, process(1))).store_id == first


def test_a_request_asked_again_with_its_id_records_one_run(store: Store) -> None:
    register(store, "e")
    due = store.request_run("e", "operator:alice", "req-1")
    assert due is not None
    assert store.request_run("e", "operator:alice", "req-1") == due
    other = store.request_run("e", "operator:alice", "req-2")
    assert other is not None and other != due
    manual = [r for r in runs_of(store).values() if r.manual]
    assert sorted(r.due for r in manual) == sorted([due, other])


def test_an_entry_forgotten_loses_its_records_unless_a_run_is_live(store: Store) -> None:
    cs = claims(store, A, 1000, entry="busy")
    register(store, "idle", "kept")
    done = claims(store, A, 1000, entry="idle")[0]
    send(store, A, done)
    started(store, done, process(1), task_id="task-idle")
    store.finish([Outcome("idle", done.due, done.token, RunState.DONE)])
    assert sorted(store.forget(["busy", "idle", "never-seen"])) == ["idle"]
    assert store.history("idle") == []
    assert store.lookup_task("task-idle") is None
    assert {r.name for r in store.entries()} >= {"busy", "kept"}
    assert "idle" not in {r.name for r in store.entries()}
    assert run(store, cs[0]).state is RunState.CLAIMED  # the live one is untouched
    # Registered again later, it starts afresh.
    assert register(store, "idle")["idle"].checkpoint is None


def test_a_settling_heartbeat_keeps_the_store_settling(store: Store) -> None:
    first = store.heartbeat(A, 10, resync=True)
    assert first.settle_until is not None
    later = store.heartbeat(A, 30, settling=True)
    assert later.settle_until is not None and later.settle_until >= later.now + 29_000
    assert later.epoch == first.epoch


def test_a_settling_heartbeat_does_not_start_a_settle(store: Store) -> None:
    store.heartbeat(A, 0.05, resync=True)
    hb = store.heartbeat(A, 0.05)
    while hb.settle_until is not None and hb.settle_until > hb.now:
        hb = store.heartbeat(A, 0.05)
    settled = store.heartbeat(A, 30, settling=True)
    assert settled.settle_until is None or settled.settle_until <= settled.now


def test_a_run_the_caller_sent_replaces_an_older_copy_held_as_claimed(store: Store) -> None:
    """After a restore from a snapshot taken between a claim and its check: the store holds
    the run claimed, the beat knows it sent it."""
    c = claims(store, A, 1000)[0]
    known = Run("e", c.due, RunState.SENT, token=c.token, sent_at=now(store),
                task_id="t-1", extra={"reseeded": True})
    store.register([EntrySeed("e", "every 1s", token=c.token + 10, runs=(known,))])
    assert run(store, c).state is RunState.SENT


def test_a_run_registered_again_as_sent_does_not_make_later_ones_overlap(
        store: Store) -> None:
    """Its outcome went with the wiped store: it must not make an overlap="skip" entry wait
    for one (until a worker starts it)."""
    old, new = claims(store, A, 1000, 2000)
    known = Run("e", old.due - 1, RunState.SENT, token=1, sent_at=now(store),
                extra={"reseeded": True})
    store.register([EntrySeed("e", "every 1s", runs=(known,))])
    assert check(store, A, new, overlap=Overlap.SKIP).verdict is CheckVerdict.SEND
