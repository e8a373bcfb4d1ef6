"""The claim made ahead: what it claimed is handled as
everything else this beat holds when a burst stops half way. Real redis-server, real broker (db 1);
only the publish is made to fail, and the claim thread's store call is made slow (the real
store answers)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections import Counter
from typing import Any

import pytest
from kombu.exceptions import OperationalError

from beat_claims.runs import RunState, iso
from beat_claims.scheduler import Scheduler

from .conftest import RedisServer
from .inprocess import joined, make, occurrences_sent
from .processes import wait_for
from .test_claim_ahead import ENTRIES, break_publish, burst_app, next_burst, no_duplicates

pytestmark = pytest.mark.usefixtures("settled_store")

HELD = (RunState.CLAIMED, RunState.SENDING)


def held_by(s: Scheduler, due: int, owner: str) -> int:
    return sum(1 for name in s.schedule for r in s.store.history(name)
               if r.due == due and r.state in HELD and r.owner == owner)


def test_a_broker_outage_gives_back_what_was_claimed_ahead_for_a_healthy_beat(
        server: RedisServer) -> None:
    """Beat a loses its broker in the middle of a burst; beat b's broker works. Everything a
    held is given back (``Sender.send`` on BrokerDown), so b sends it at its next sweep; so
    must be the chunk claimed ahead, which is taken into a's holdings by the generator's
    finally *after* that release (found in review: it stayed claimed by a, alive and not
    sending, until a's broker returned or reclaim_after, 300 s, passed)."""
    a = make(burst_app(server))
    due = next_burst(a)
    down: list[str] = []

    def broker_gone(entry: str, at: int) -> BaseException | None:
        if down or (at == due and entry == "e020"):
            down.append(entry)
            return OperationalError("the broker is down")
        return None

    break_publish(a, broker_gone)
    wait_for(lambda: down, 10, "a's broker outage", 0.02, a.tick)
    # Everything a held and did not publish was meant to be given back ...
    assert held_by(a, due, a.owner.id) == 0, (
        f"{held_by(a, due, a.owner.id)} runs stay claimed by a beat whose broker is down")
    # ... so that a beat whose broker works sends the whole burst now.
    b = joined(burst_app(server), a)

    def both() -> None:
        a.tick()
        b.tick()

    wait_for(lambda: len({n for n, d in occurrences_sent(server) if d == iso(due)})
             == ENTRIES, 10, "the whole burst sent by b", 0.02, both)
    no_duplicates([(n, d) for n, d in occurrences_sent(server) if d == iso(due)])
    a.close()
    b.close()


def test_a_stop_while_the_claim_made_ahead_is_in_flight_leaves_nothing_claimed(
        server: RedisServer) -> None:
    """The stop (SystemExit from the signal handler) comes while the main thread waits in
    ``_finish`` for the reply of the claim made ahead; that reply is a little slow. The
    generator's finally has nothing to settle, so close() must wait for the claim thread
    before it reads this beat's claims (live_runs) to give them back (found in review: the
    claim landed after the give-back and ``leave``, and 100 runs stayed claimed by a beat
    that was gone)."""
    s = make(burst_app(server))
    due = next_burst(s)
    main = threading.main_thread().ident
    real = s.store.claim
    stopped: list[bool] = []

    def main_waits_in_finish() -> bool:
        frame: Any = sys._current_frames().get(main)
        while frame is not None:
            if frame.f_code.co_name == "_finish":
                return True
            frame = frame.f_back
        return False

    def slow_claim(owner: Any, plans: Any) -> Any:
        if threading.current_thread().name.startswith("beat-claims-claim") and not stopped:
            stopped.append(True)
            wait_for(main_waits_in_finish, 10, "the main thread waiting for the reply", 0.005)
            os.kill(os.getpid(), signal.SIGUSR1)  # the stop
            time.sleep(0.5)  # a reply that takes a moment (a slow network, a busy server)
        return real(owner, plans)

    s.claimer.store = s.store
    s.store.claim = slow_claim  # type: ignore[method-assign]

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)  # what Celery's handler raises

    previous = signal.signal(signal.SIGUSR1, stop)
    try:
        with contextlib.suppress(SystemExit):
            wait_for(lambda: False, 10, "the stop", 0.02, s.tick)
        assert stopped, "the stop did not come during the claim made ahead"
        s.close()  # what Celery does on its way out
    finally:
        signal.signal(signal.SIGUSR1, previous)
    left = held_by(s, due, s.owner.id)
    assert left == 0, f"{left} runs left claimed by the closed beat (close() gave back first)"
    assert Counter(r.state for name in s.schedule for r in s.store.history(name)
                   if r.due == due)[RunState.CLAIMED] == 0


def test_a_beat_forked_after_a_burst_still_claims_the_next_one(server: RedisServer) -> None:
    """The stores are fork-safe (sqlite/postgres reopen, redis-py reconnects); so must be the
    claim thread's pool (found in review: in a child, the pool believed its parent's thread
    idle, the next claim made ahead never ran and ``_finish`` waited on it forever: the beat
    hung mid-burst, heartbeat stopped, holding the first chunk)."""
    s = make(burst_app(server))
    due = next_burst(s)
    wait_for(lambda: s.claimer._pool is not None and len(
        {n for n, d in occurrences_sent(server) if d == iso(due)}) == ENTRIES,
        15, "the first burst sent", 0.02, s.tick)
    # (every claim made ahead was taken in before its chunk was sent: the thread is idle)
    pid = os.fork()
    if pid == 0:  # the child: the next burst, within 20 s, or exit 3 (hung)
        signal.signal(signal.SIGALRM, lambda *_: os._exit(3))
        signal.alarm(20)
        try:
            nxt = next_burst(s)
            wait_for(lambda: len({n for n, d in occurrences_sent(server)
                                  if d == iso(nxt)}) == ENTRIES, 15, "the next burst",
                     0.02, s.tick)
        except BaseException:
            os._exit(4)
        os._exit(0)
    deadline = time.monotonic() + 30
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (
        f"the forked beat did not send the next burst (exit {status and status >> 8}:"
        " 3 = hung waiting for the claim made ahead)")
    s.close()
