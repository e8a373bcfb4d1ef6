"""A burst is claimed a chunk ahead: the next chunk's claim is made in the claim thread
while this chunk is sent. Whatever that claim took is held when the send stops half way (a
stop, an outage of the broker) and is sent later or given back; never stuck, never twice.
And a conflict (another beat claimed first) costs one store call, not two."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from kombu.exceptions import OperationalError

from beat_claims.beat.claimer import CLAIM_CHUNK
from beat_claims.runs import RunState, iso
from beat_claims.scheduler import Scheduler

from .conftest import RedisServer
from .inprocess import beats, make, make_app, occurrences_sent, run_for
from .processes import wait_for

pytestmark = pytest.mark.usefixtures("settled_store")

ENTRIES = 2 * CLAIM_CHUNK + 50  # three chunks


def burst_app(server: RedisServer, every: float = 2, **conf: Any) -> Any:
    """Three chunks due at once; claimed ahead whatever this host's cores (auto would not
    on a host with fewer cores than beats: see the tests at the end)."""
    schedule = {f"e{i:03d}": {"task": "t.noop", "schedule": timedelta(seconds=every)}
                for i in range(ENTRIES)}
    return make_app(server, schedule, **{"beat_claims_catch_up": "all",
                                         "beat_claims_claim_ahead": True, **conf})


def spy_claims(s: Scheduler) -> list[tuple[str, list[Any]]]:
    """Every store.claim call of ``s``: the thread it ran in and its plans (the real store
    answers)."""
    calls: list[tuple[str, list[Any]]] = []
    real = s.store.claim

    def claim(owner: Any, plans: Any) -> Any:
        plans = list(plans)
        calls.append((threading.current_thread().name, plans))
        return real(owner, plans)

    s.claimer.store = s.store = claim_store(s.store, claim)
    return calls


def claim_store(store: Any, claim: Any) -> Any:
    store.claim = claim
    return store


def states_at(s: Scheduler, due: int) -> Counter[RunState]:
    return Counter(r.state for name in s.schedule
                   for r in s.store.history(name) if r.due == due)


def next_burst(s: Scheduler) -> int:
    """Tick until just before the entries' next shared instant; returns it."""
    due = min(at for at, _ in s.claimer.heap)
    wait_for(lambda: s.clock.now() >= due - 300, 10, "the burst's instant", 0.02, s.tick)
    return due


def until_sent(s: Scheduler, due: int, n: int, timeout: float = 15) -> None:
    wait_for(lambda: states_at(s, due)[RunState.SENT] == n, timeout,
             f"{n} runs due {iso(due)} sent", 0.02, s.tick)


def break_publish(s: Scheduler, fault: Callable[[str, int], BaseException | None]) -> None:
    """Publishing raises what ``fault(entry, due)`` returns (nothing: it publishes)."""
    real = s._publish

    def publish(entry: Any, claim: Any, task_id: str) -> Any:
        exc = fault(entry.name, claim.due)
        if exc is not None:
            raise exc
        return real(entry, claim, task_id)

    s._publish = publish  # type: ignore[method-assign]


def no_duplicates(sent: list[tuple[str, str]]) -> None:
    assert {k: n for k, n in Counter(sent).items() if n > 1} == {}


def test_a_burst_is_claimed_a_chunk_ahead_and_each_occurrence_is_sent_once(
        server: RedisServer) -> None:
    s = make(burst_app(server))
    calls = spy_claims(s)
    due = next_burst(s)
    until_sent(s, due, ENTRIES)
    sent = occurrences_sent(server)
    no_duplicates(sent)
    assert {name for name, d in sent if d == iso(due)} == set(s.schedule)
    threads = [name for name, plans in calls
               if any(p.expected is not None and p.claim for p in plans)]
    assert threads[0] != threads[1] and threads[1].startswith("beat-claims-claim"), threads
    s.close()
    assert s.claimer._pool is None  # the claim thread is gone with the beat


def test_a_stop_in_the_middle_of_a_burst_gives_back_what_was_claimed_ahead(
        server: RedisServer) -> None:
    s = make(burst_app(server))
    due = next_burst(s)
    published: list[str] = []

    def stop_at_the_tenth(entry: str, due: int) -> BaseException | None:
        if len(published) == 10:
            return SystemExit(0)  # what Celery's signal handler raises
        published.append(entry)
        return None

    break_publish(s, stop_at_the_tenth)
    with pytest.raises(SystemExit):
        wait_for(lambda: False, 10, "the stop", 0.02, s.tick)
    # The second chunk had been claimed ahead by then: held, and given back by close().
    claimed = states_at(s, due)
    assert claimed[RunState.CLAIMED] + claimed[RunState.SENDING] > CLAIM_CHUNK, claimed
    s.close()
    after = states_at(s, due)
    assert after[RunState.CLAIMED] == after[RunState.SENDING] == 0, after
    # (the third chunk was never claimed: it has no runs yet)
    assert after == Counter({RunState.SENT: 10, RunState.DUE: 2 * CLAIM_CHUNK - 10}), after
    # Another beat sends each one given back, once.
    b = make(burst_app(server))
    until_sent(b, due, ENTRIES)
    sent = [(name, d) for name, d in occurrences_sent(server) if d == iso(due)]
    no_duplicates(sent)
    assert len(sent) == ENTRIES
    b.close()


def test_a_broker_outage_in_the_middle_of_a_burst_sends_what_was_claimed_ahead_once_later(
        server: RedisServer) -> None:
    s = make(burst_app(server))
    due = next_burst(s)
    failures: list[int] = []

    def down_for_a_while(entry: str, at: int) -> BaseException | None:
        if len(failures) < 3 and (failures or (at == due and entry == "e020")):
            failures.append(1)
            return OperationalError("the broker is down")
        return None

    break_publish(s, down_for_a_while)
    until_sent(s, due, ENTRIES, timeout=30)
    assert len(failures) == 3
    sent = [(name, d) for name, d in occurrences_sent(server) if d == iso(due)]
    no_duplicates(sent)
    assert len(sent) == ENTRIES
    run_for(0.5, s)
    assert states_at(s, due) == Counter({RunState.SENT: ENTRIES})
    s.close()


def test_a_conflict_costs_one_store_call_not_a_second_with_nothing_to_write(
        server: RedisServer) -> None:
    app = burst_app(server, every=5)  # b ticks well before the next instant
    a, b = beats(app, app)
    calls = spy_claims(b)
    due = next_burst(a)
    wait_for(lambda: b.clock.now() >= due, 5, "the burst's instant", 0.02)
    # a claims and sends the whole burst before b's tick; b's view of every entry is stale.
    real_sweep = b.sweeper.sweep
    b.sweeper.sweep = lambda pick_up=True: None  # type: ignore[method-assign]
    until_sent(a, due, ENTRIES)
    del calls[:]
    started = time.monotonic()
    b.tick()
    assert time.monotonic() - started < 10
    planned = Counter(p.entry for _, plans in calls for p in plans
                      if p.expected is not None)
    assert set(planned) == set(app.conf.beat_schedule) and set(planned.values()) == {1}
    b.sweeper.sweep = real_sweep  # type: ignore[method-assign]
    sent = [(name, d) for name, d in occurrences_sent(server) if d == iso(due)]
    no_duplicates(sent)
    assert len(sent) == ENTRIES
    a.close()
    b.close()


def _claim_threads(calls: list[tuple[str, list[Any]]]) -> set[str]:
    return {name for name, plans in calls
            if any(p.expected is not None and p.claim for p in plans)}


@pytest.mark.parametrize("cores", [3, 4])
def test_auto_claims_ahead_only_with_two_cores_more_than_the_beats_of_this_host(
        server: RedisServer, monkeypatch: pytest.MonkeyPatch, cores: int) -> None:
    """beat_claims_claim_ahead="auto" (the default): a claim thread needs a core of its own
    beside one per beat and one for the rest. Two beats on three cores claim chunk after
    chunk; on four, ahead. A lone beat claims ahead from three cores."""
    monkeypatch.setattr("beat_claims.scheduler.usable_cores", lambda: cores)
    app = burst_app(server, beat_claims_claim_ahead="auto")
    a, b = beats(app, app)
    # Each has seen the other's heartbeat (a loaded host makes that later, not different).
    wait_for(lambda: a.liveness.beats_here() == b.liveness.beats_here() == 2, 10,
             "each beat to count two beats on this host", 0.02, lambda: (a.tick(), b.tick()))
    calls_a, calls_b = spy_claims(a), spy_claims(b)
    due = next_burst(a)
    wait_for(lambda: states_at(a, due)[RunState.SENT] == ENTRIES, 20,
             f"{ENTRIES} runs sent by two beats", 0.02, lambda: (a.tick(), b.tick()))
    no_duplicates(occurrences_sent(server))
    threads = _claim_threads(calls_a + calls_b)
    seen = [(name, [(p.entry, p.expected is not None, p.claim) for p in plans][:3])
            for name, plans in (calls_a + calls_b)[:12]]  # (the evidence, if it fails)
    if cores == 3:
        assert threads == {"MainThread"}, (threads, iso(due), seen)
    else:
        assert any(t.startswith("beat-claims-claim") for t in threads), (
            threads, iso(due), seen)
    a.close()
    b.close()
    lone = make(burst_app(server, beat_claims_claim_ahead="auto", beat_claims_key_prefix="x"))
    assert lone.liveness.beats_here() == 1 and lone._claim_ahead()
    monkeypatch.setattr("beat_claims.scheduler.usable_cores", lambda: 2)
    assert not lone._claim_ahead()
    lone.close()
