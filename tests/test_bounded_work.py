"""Every loop and every pile is bounded, and the policies hold for runs that waited:
publish retries (one task's errors never stop the others), runs held through a broker
outage, runs that never report, result-backend recovery (however slow the backend), and a
gap of any length in a crontab's history."""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from celery.schedules import crontab

from beat_claims.enums import Reason, RunState
from beat_claims.runs import iso
from beat_claims.stores.base import EntrySeed

from .conftest import RedisServer, seed_settled_epoch
from .faults import proxy
from .inprocess import make, make_app, occurrences_sent, run_for
from .processes import wait_for


@pytest.fixture(autouse=True)
def settled_store(server: RedisServer) -> None:
    """The store on the test's redis-server has run a while (a settled epoch): no test
    here is about a new store's start, and their beats claim at once rather than after
    the new epoch's settle period of a TTL."""
    seed_settled_epoch(server)


def test_a_publish_that_always_fails_is_retried_then_recorded_failed(
        server: RedisServer) -> None:
    """A message the serializer cannot encode: tried 1 + publish_retries times, then the run
    is failed (publish_error); it does not come back, nor pile up with later ones, and the
    other entries are sent meanwhile."""
    app = make_app(server, {
        "bad": {"task": "t.noop", "schedule": timedelta(seconds=1), "args": [object()]},
        "good": {"task": "t.noop", "schedule": timedelta(seconds=1)},
    }, beat_claims_heartbeat_interval=0.3, beat_claims_publish_retries=2)
    s = make(app)

    def first_failed() -> list[object]:
        s.tick()
        return [r for r in s.store.history("bad") if r.state is RunState.FAILED]

    [failed, *_] = wait_for(first_failed, 15, "the unpublishable run to be recorded failed",
                            interval=0.05)
    assert failed.reason is Reason.PUBLISH_ERROR
    assert failed.attempts == 3 and failed.exc_type == "EncodeError"
    run_for(2.5, s)

    def good_sent() -> list[int]:
        return [due for entry, due in occurrences_sent(server) if entry == "good"]

    # Meanwhile the other entry is sent (ticked until four of its runs were, however
    # slow the machine).
    wait_for(lambda: len(good_sent()) >= 4, 20, "four runs of the good entry",
             interval=0.05, between=s.tick)
    history = s.store.history("bad")
    # Each occurrence is failed in turn; none waits for ever, none is retried beyond 3.
    assert all(r.attempts <= 3 for r in history)
    assert len([r for r in history if not r.state.final]) <= 2
    assert len(s.holdings) <= 2
    good = good_sent()
    assert len(good) == len(set(good))
    assert not [due for entry, due in occurrences_sent(server) if entry == "bad"]
    s.close()


def test_a_broker_outage_sends_the_latest_run_not_every_missed_one(
        server: RedisServer, broker: RedisServer) -> None:
    """catch_up=latest: occurrences that fell due while the broker was away are recorded
    skipped, and one run is sent when it is back (not one per missed occurrence)."""
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=0.5)}},
                   broker=broker, beat_claims_heartbeat_interval=0.5,
                   beat_claims_catch_up_grace=0.3)
    s = make(app)
    run_for(1.2, s)
    before = len(occurrences_sent(broker))
    assert before >= 1
    broker.stop()
    down_at = time.time() * 1000
    run_for(3.5, s)
    up_at = time.time() * 1000
    broker.start()
    run_for(2.5, s)
    sent = [due for _, due in occurrences_sent(broker)]
    assert len(sent) == len(set(sent))
    history = s.store.history("e")
    missed = [r for r in history if down_at < r.due < up_at - 300]
    assert len(missed) >= 5
    assert len([r for r in missed if r.state is RunState.SENT]) <= 1, [
        (iso(r.due), r.state) for r in missed]
    assert {r.reason for r in missed if r.state is RunState.SKIPPED} <= {Reason.CATCH_UP}
    # And scheduling goes on once it is back.
    assert [r for r in history if r.due > up_at + 500 and r.state is RunState.SENT]
    s.close()


@pytest.mark.parametrize("limit", [5])
def test_sent_runs_without_an_outcome_do_not_grow_the_history_for_ever(
        server: RedisServer, limit: int) -> None:
    """No worker reports: the history stays at history_limit runs; the sent runs pushed
    out of it are presumed lost (history_limit)."""
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=0.2)}},
                   beat_claims_history_limit=limit)
    s = make(app)
    run_for(3.0, s)
    sent = occurrences_sent(server)
    assert len(sent) >= 3 * limit
    history = s.store.history("e")
    assert len(history) <= limit + 1
    assert {r.state for r in history} <= {RunState.SENT, RunState.CLAIMED, RunState.SENDING}
    s.close()


def test_result_backend_recovery_keeps_the_heartbeat_alive_and_is_bounded(
        server: RedisServer) -> None:
    """Hundreds of runs without an outcome, and a result backend that answers slowly
    (50 ms a lookup, through a real TCP proxy): each tick stays short, and the beat stays
    alive, however many runs there are to look up."""
    schedule = {f"e{i}": {"task": "t.noop", "schedule": timedelta(seconds=1)}
                for i in range(200)}
    with proxy(server.port) as slow:
        slow.delay = 0.05
        app = make_app(server, schedule, result_backend=slow.url(3),
                       beat_claims_heartbeat_interval=0.4)
        s = make(app)
        # some hundreds of sent runs, older than the settling time (200 a second: a
        # deadline, not a fixed time, for a slow machine)
        wait_for(lambda: len(occurrences_sent(server)) >= 400, 30, "400 sent runs",
                 between=lambda: run_for(0.2, s))
        passes: list[float] = []
        run = s.recovery.run

        def timed() -> None:
            started = time.monotonic()
            try:
                run()
            finally:
                passes.append(time.monotonic() - started)

        s.recovery.run = timed  # type: ignore[method-assign]
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            wait = s.tick()
            alive = [o for o in s.store.owners() if o.owner.id == s.owner.id]
            assert alive and alive[0].alive
            time.sleep(min(0.05, wait))
        assert passes and s.recovery.last > 0  # it ran
        # A pass is bounded by half a heartbeat interval (0.2 s) plus the lookup under way
        # (50 ms and its parsing); unbounded, one pass would look up every run, 5 s or more.
        # (The tick around it also sends 200 runs a second: its length is the machine's.)
        assert max(passes) < 0.6, passes
        s.close()


def test_a_year_long_gap_of_a_crontab_entry_is_bridged_without_blocking(
        server: RedisServer) -> None:
    """Every minute, and its beats were down for a year: the first tick does not walk the
    525,600 missed minutes; with catch_up=latest the newest runs, the newest others are
    recorded skipped, and the checkpoint lands on the newest due minute."""
    app = make_app(server, {"m": {"task": "t.noop", "schedule": crontab(minute="*")}})
    s = make(app, settle=False)
    now = int(time.time() * 1000)
    year_ago = now - 366 * 24 * 3600 * 1000
    s.store.register([EntrySeed("m", "every minute", year_ago, year_ago)])
    started = time.monotonic()
    wait_for(lambda: s.tick() is not None and any(
        r.state is RunState.SENT for r in s.store.history("m")), 15, "the newest minute")
    assert time.monotonic() - started < 8
    history = s.store.history("m")
    newest_minute = now // 60_000 * 60_000
    sent = [r for r in history if r.state is RunState.SENT]
    assert len(sent) == 1 and sent[0].due in (newest_minute, newest_minute + 60_000)
    skipped = [r for r in history if r.state is RunState.SKIPPED]
    assert len(skipped) == 99 and all(r.reason is Reason.CATCH_UP for r in skipped)
    assert Counter(r.due % 60_000 for r in history) == {0: 100}
    assert s.store.entries(["m"])[0].checkpoint == sent[0].due
    s.close()


def _ms(due: str) -> int:
    return round(datetime.fromisoformat(due.replace("Z", "+00:00")).timestamp() * 1000)


@pytest.mark.parametrize("sweep_first", [False, True], ids=["claim-first", "sweep-first"])
def test_latest_sends_one_run_for_a_broker_outage_whichever_step_finds_the_broker_back(
        server: RedisServer, broker: RedisServer, sweep_first: bool) -> None:
    """catch_up=latest: the run whose publish hit the outage was given back. When the
    broker returns, that run (picked up by a sweep) and the occurrences due since are
    judged together: one missed run is sent for the outage (or the on-time ones, never
    both), whether the tick that finds the broker back claims first or sweeps first (the
    sweep picks up the given-back run before the entry's due occurrences are claimed)."""
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1)}},
                   broker=broker, beat_claims_catch_up_grace=1)
    s = make(app)
    run_for(2.5, s)
    broker.stop()
    try:
        run_for(6, s)
    finally:
        broker.start()
    back = s.clock.now()
    starts: list[int] = []  # the store's instant as each tick began

    def tick() -> None:
        if sweep_first:  # hold the tick until it will sweep (else a 50/50 of timing)
            wait_for(lambda: s.broker_outage.waiting() == 0 and time.monotonic()
                     - s._last_sweep >= s.settings.heartbeat_interval, 40,
                     "a tick that sweeps", interval=0.01)
        starts.append(s.clock.now())
        s.tick()

    first = wait_for(lambda: occurrences_sent(broker), 40, "a run sent after the broker came"
                     " back", interval=0.05, between=tick)
    batch_end = max(back, *(_ms(due) for _, due in first))
    run_for(1.0, s)
    # Judged by the instant of the tick that sent the first run, not by when the broker
    # came back: under load that tick may come seconds late, and a run due within the
    # grace before it is on time. Latest: one missed run, or the on-time ones, never both.
    missed_before = starts[-1] - 1000  # catch_up_grace=1
    sent = sorted(_ms(due) for _, due in occurrences_sent(broker) if _ms(due) <= batch_end)
    missed = [due for due in sent if due < missed_before]
    on_time = [due for due in sent if due >= missed_before]
    assert len(missed) + min(1, len(on_time)) == 1, (
        f"catch_up=latest, one broker outage: sent {[iso(d) for d in sent]}; missed before"
        f" {iso(missed_before)} (broker back at {iso(back)}, first run sent by the tick"
        f" begun at {iso(starts[-1])}); history:"
        f" {[(iso(r.due), r.state.value) for r in s.store.history('e')]}")
    s.close()


def test_a_timeout_raised_for_one_task_is_that_tasks_problem_not_a_broker_outage(
        server: RedisServer) -> None:
    """A TimeoutError raised for one task (its custom apply_async asks a rate-limit service
    that does not answer) is counted as a failed publish of that run, not taken for a
    broker outage: the other entries go on being sent, and the run is recorded failed
    (publish_error) after its retries."""
    app = make_app(server, {
        "bad": {"task": "t.bad", "schedule": timedelta(seconds=1)},
        "good": {"task": "t.good", "schedule": timedelta(seconds=1)}},
        beat_claims_publish_retries=2)

    class Guarded(app.Task):
        def apply_async(self, *args: Any, **kwargs: Any) -> Any:
            raise TimeoutError("the rate-limit service did not answer")

    @app.task(name="t.bad", base=Guarded)
    def bad_task() -> None:
        return None

    s = make(app)

    def both() -> bool:
        good = [d for e, d in occurrences_sent(server) if e == "good"]
        failed = [r for r in s.store.history("bad") if r.state is RunState.FAILED]
        return len(good) >= 4 and bool(failed)

    wait_for(both, 15, "'good' sent 4 times and a run of 'bad' recorded failed",
             interval=0.05, between=s.tick)
    [failed, *_] = [r for r in s.store.history("bad") if r.state is RunState.FAILED]
    assert failed.reason is Reason.PUBLISH_ERROR and failed.exc_type == "TimeoutError"
    assert failed.attempts == 3
    s.close()


def test_a_publish_error_without_a_message_is_counted_too(server: RedisServer) -> None:
    """The store counts a failed publish by its error text: an exception without a message
    (or whose message is not kept, beat_claims_exception_messages being off) is recorded
    by its type, so the run is failed after its retries instead of being tried for ever."""
    app = make_app(server, {"bad": {"task": "t.silent", "schedule": timedelta(seconds=1)}},
                   beat_claims_publish_retries=1, beat_claims_catch_up="all")

    class Silent(app.Task):
        def apply_async(self, *args: Any, **kwargs: Any) -> Any:
            raise TimeoutError()

    @app.task(name="t.silent", base=Silent)
    def silent_task() -> None:
        return None

    s = make(app)
    [failed, *_] = wait_for(
        lambda: [r for r in s.store.history("bad") if r.state is RunState.FAILED], 15,
        "a run of 'bad' recorded failed", interval=0.05, between=s.tick)
    assert (failed.reason, failed.exc_type, failed.attempts) == (
        Reason.PUBLISH_ERROR, "TimeoutError", 2)
    s.close()


def test_a_slow_result_backend_lookup_does_not_stall_the_loop(
        server: RedisServer, broker: RedisServer) -> None:
    """Result-backend recovery against a backend whose every reply takes 1 s (overloaded,
    or partitioned): one pass holds the beat's loop for at most half a heartbeat interval,
    never for a whole lookup, so the beat never looks dead (TTL 3 intervals)."""
    interval = 0.5
    with proxy(broker.port) as slow:
        app = make_app(server, {"e": {"task": "t.noop",
                                      "schedule": timedelta(milliseconds=200),
                                      "options": {"ignore_result": True}}},
                       broker=broker, result_backend=slow.url(3),
                       beat_claims_heartbeat_interval=interval)
        s = make(app)
        real_run = s.recovery.run
        spent: list[float] = []  # passes that had sent runs to look up

        def timed_run() -> None:
            settled = s.clock.now() - int(2 * interval * 1000)
            looks_up = bool(s.store.open_runs(before=settled, limit=1))
            started = time.monotonic()
            try:
                real_run()
            finally:
                if looks_up:
                    spent.append(time.monotonic() - started)

        s.recovery.run = timed_run  # type: ignore[method-assign]
        slow.delay = 1.0
        wait_for(lambda: spent, 20, "a recovery pass with runs to look up", interval=0.02,
                 between=s.tick)
        s.close()
    assert max(spent) < 3 * interval, (f"one recovery pass took {max(spent):.1f}s (heartbeat"
                                       f" TTL {3 * interval}s): the beat looked dead")
