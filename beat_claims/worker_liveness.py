"""Worker processes' liveness: each keeps a record in the store; a redelivery judges by it.

**The record.** Every process that executes fenced deliveries writes its record
(:meth:`Store.worker_heartbeat`: node name, pid, process identity — the ``WorkerProcess``
a run records as its starter) before its first start, so a run is never started by a
process without one, then renews it from a background thread every
``beat_claims_worker_heartbeat_interval`` (its TTL: three intervals) for as long as the
process lives, whatever its other threads do: a ``-P solo`` worker keeps beating while its
task runs in the main thread. In a prefork pool each child executes, so each child beats:
the thread starts lazily in the child at its first delivery (threads do not survive a
fork), and in spawned children alike. Under gevent (or eventlet) the "thread" is a
greenlet: it beats only when the running task yields to the hub; a task that never yields
(a loop without I/O or sleep, a C call that holds the GIL) for longer than the TTL lets
the record lapse, and a redelivery of its run is then taken for a process gone.

**The judgement.** A delivery whose run another process started (``StartDecision.busy_with``)
on another host cannot ask that process (it may be unable to answer: ``-P solo``, busy); it
reads the starter's record instead (:func:`judge_starter`). A record renewed after the
judgement began: the starter lives, the delivery is refused. A record that is lapsed, or
missing, at least an interval and a poll after the judgement began (no renewal
meanwhile): the starter is gone, the delivery takes the run over. A fresh record is never dropped at
once (an ``Ignore`` acknowledges the message, and the occurrence would never run if the
starter had just been killed): the process polls the store at a bounded pace until one of
those, or until the run no longer waits on that starter (finished, given back, taken by
another). The wait is bounded by the TTL plus one interval; after a ``kill -9`` of the
starter, its redelivery runs within one TTL (plus a poll) of the later of the kill and the
redelivery's arrival. The wait of an interval and a poll for a record found lapsed or
missing covers a store that went back (a wipe, a restart from an older snapshot, a
failover): it may hold no record, or an old one, of a live process, which writes it again
at its next renewal — sent an interval after the last one was, whatever their round
trips; the poll is for the jitter of a round trip.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from celery.utils.log import get_logger

from .stores.base import (
    Delivery,
    StartDecision,
    Store,
    StoreError,
    WorkerLiveness,
    WorkerLivenessRead,
    WorkerProcess,
)

logger = get_logger("celery.worker.claims")

#: A renewal that failed is tried again this soon (unless the interval is shorter): a
#: connection cut costs a second, not an interval.
RETRY_AFTER = 1.0
#: How often a judging process reads the store: a quarter interval, within these bounds.
POLL_MIN, POLL_MAX = 0.05, 1.0


def ttl_of(interval: float) -> float:
    """A worker process's record lapses after three missed renewals."""
    return 3 * interval


def poll_pace(interval: float) -> float:
    """How often a judgement reads the store: a live starter renews within an interval,
    and the store is asked a few times per interval, at most once a POLL_MIN."""
    return min(POLL_MAX, max(POLL_MIN, interval / 4))


# -- this process's record ----------------------------------------------------------------
class ProcessHeartbeat:
    """This process's record in the store, renewed by a background thread. One per
    process: after a fork the child's copy sees another pid and starts its own."""

    def __init__(self) -> None:
        self._pid = 0
        self._process: WorkerProcess | None = None
        self._lock = threading.Lock()

    def ensure(self, store: Store, process: WorkerProcess, interval: float) -> None:
        """Before this process starts a run: its record is written (StoreError when the
        store does not answer) and, the first time, renewed from then on in a thread."""
        pid = os.getpid()
        if self._pid == pid and self._process == process:
            return
        with self._lock:
            if self._pid == pid and self._process == process:
                return
            store.worker_heartbeat(process, ttl_of(interval))
            self._pid, self._process = pid, process
            threading.Thread(target=self._beat, args=(store, process, interval, pid),
                             name="beat-claims-worker-heartbeat", daemon=True).start()

    def _current(self, process: WorkerProcess, pid: int) -> bool:
        return self._pid == pid == os.getpid() and self._process == process

    def _beat(self, store: Store, process: WorkerProcess, interval: float, pid: int) -> None:
        """Renew every interval while this is the process's record, at a fixed pace (each
        renewal is sent an interval after the last was, however long its round trip took:
        the store stamps them an interval apart, not an interval and a round trip); a
        failure is logged once per streak and tried again within RETRY_AFTER."""
        failing_since: float | None = None
        renewed = time.monotonic()
        wait = interval
        while True:
            time.sleep(wait)
            if not self._current(process, pid):
                return
            sent = time.monotonic()
            try:
                store.worker_heartbeat(process, ttl_of(interval))
            except Exception as exc:  # (an outage, or anything else: the thread goes on)
                if failing_since is None:
                    failing_since = time.monotonic()
                    logger.warning(
                        "beat-claims: cannot renew this worker process's heartbeat in the"
                        " store (%s: %s); retrying. Once it is %.0fs old, a redelivery of a"
                        " run this process started is taken for a process gone and runs"
                        " elsewhere", type(exc).__name__, exc, ttl_of(interval))
                wait = min(interval, RETRY_AFTER)
                continue
            now = time.monotonic()
            if failing_since is not None:
                gap = now - renewed
                (logger.error if gap > ttl_of(interval) else logger.warning)(
                    "beat-claims: this worker process's heartbeat is renewed again, %.1fs"
                    " after the last one%s", gap,
                    " (longer than its TTL: redeliveries of runs it started may have run"
                    " elsewhere meanwhile)" if gap > ttl_of(interval) else "")
                failing_since = None
            renewed, wait = now, max(0.0, sent + interval - now)

    def stop(self) -> None:
        """No more renewals (the thread ends at its next wake): the record lapses after its
        TTL, as a process's that ended."""
        self._pid, self._process = 0, None

    def after_fork_in_child(self) -> None:
        """A forked child has no thread of its parent's: it starts its own when it first
        executes, with a lock of its own (one the parent held would never be released)."""
        self._pid, self._process, self._lock = 0, None, threading.Lock()


# -- the judgement of a starter -----------------------------------------------------------
class StarterVerdict(str, Enum):
    ALIVE = "alive"  # renewed since the judgement began: the delivery is refused
    GONE = "gone"  # lapsed or missing, not renewed for an interval: the delivery takes over
    SETTLED = "settled"  # the run no longer waits on it: the latest start's answer stands
    #: The delivery's time limit ended the wait first (a fresh record, not renewed): the
    #: delivery is refused rather than killed by its limit in the middle of the judgement.
    CUT_SHORT = "cut short"


@dataclass(frozen=True)
class Judgement:
    verdict: StarterVerdict
    decision: StartDecision  # the latest answer of the store's start (refused, or run)
    detail: str  # what the store showed, for the log
    waited: float  # seconds


def judge_starter(store: Store, delivery: Delivery, busy: StartDecision, interval: float,
                  limit: float | None = None, clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> Judgement:
    """Is the process that started this delivery's run (``busy.busy_with``) gone? Judged
    from its record in the store alone, polled every :func:`poll_pace` for at most its TTL
    plus one interval (see the module docstring), and at most ``limit`` seconds (what the
    delivery's time limit leaves it: CUT_SHORT then, unless a verdict came first).

    A read whose reply is lost is asked again at the next poll (a read changes nothing);
    StoreError when none answered by the end. A start that fails raises at once: its lost
    reply may have started the run for this very delivery (asked again, the store would
    answer "already started by this process"), so the worker treats it as any failed
    start."""
    starter = busy.busy_with
    assert starter is not None
    began = clock()
    ttl = ttl_of(interval)
    first: WorkerLiveness | None = None  # the record as the judgement first read it
    have_first = False
    failure: StoreError | None = None
    while True:
        try:
            read: WorkerLivenessRead | None = store.worker_liveness([starter])
        except StoreError as exc:
            read, failure = None, exc
        waited = clock() - began
        if read is not None:
            failure, record = None, read.records[0]
            if not have_first:
                # The starter's own TTL when its record tells it (another setting than ours).
                first, have_first, ttl = record, True, max(ttl, _ttl_of(record))
            elif record is not None and (first is None or record.renewed_at > first.renewed_at):
                return Judgement(StarterVerdict.ALIVE, _refusal(busy, "which is alive (its"
                                 " heartbeat was renewed while this delivery waited)"),
                                 "renewed", waited)
            if (record is None or not record.alive(read.now)) and \
                    waited >= ttl / 3 + poll_pace(interval):
                detail = ("it has no heartbeat record" if record is None else
                          f"its heartbeat lapsed {(read.now - record.expires_at) / 1000:.1f}s"
                          f" ago")
                return Judgement(StarterVerdict.GONE, busy, detail, waited)
        if limit is not None and waited >= limit:
            return Judgement(StarterVerdict.CUT_SHORT, _refusal(busy, "whose heartbeat was"
                             f" not renewed, nor lapsed, within the {limit:.1f}s this"
                             " delivery's time limit leaves the judgement"), "cut short",
                             waited)
        if waited >= ttl + ttl / 3:
            if failure is not None:
                raise failure
            # The store's clock disagrees with ours: it still holds the record fresh.
            return Judgement(StarterVerdict.ALIVE, _refusal(busy, "whose heartbeat the"
                             " store still holds fresh"), "fresh", waited)
        sleep(poll_pace(interval))
        decision = store.start(delivery)
        if decision.ok or decision.busy_with != starter:
            return Judgement(StarterVerdict.SETTLED, decision, "settled", clock() - began)


def _ttl_of(record: WorkerLiveness | None) -> float:
    return 0.0 if record is None else max(0, record.expires_at - record.renewed_at) / 1000


def _refusal(busy: StartDecision, why: str) -> StartDecision:
    starter = busy.busy_with
    assert starter is not None
    return dataclasses.replace(busy, why=f"started by {starter.worker} pid {starter.pid},"
                                         f" {why}")
