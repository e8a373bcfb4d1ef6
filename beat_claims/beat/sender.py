"""The check before publish, the publish, the sent mark, and giving claims back (at stop:
all of them).

A batch of claims is checked in one store call immediately before its publishes (or, for
the new occurrences of an entry without runs due again, overlap "allow" and no jitter, by
the claim just made: SendAtOnce, whose answers count from the claim); the publishes follow,
then the sent marks. If publishing stalls for half a heartbeat interval
(a paused VM, a slow broker), the rest of the batch is checked again, so a beat that wakes
after its claims were taken back sends at most the one message that was in flight.

Claims that waited (released by a stopped beat, taken back, held through an outage of the
store or the broker) are judged again by the entry's catch-up policy before they are sent,
except a run of an ``overlap="buffer_one"`` entry due while this beat was claiming and
sending without a break: it waited for the previous run by design, and nothing was missed
(the catch-up policy is about occurrences missed while no beat could send them).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from .. import occurrences
from ..catch_up import plan_held
from ..enums import Overlap, Reason, RunState
from ..exception_text import EntryArguments, entry_exception, frames
from ..metrics import Metrics
from ..runs import Owner, iso, manual_task_id_for, task_id_for
from ..settings import Policy, Settings
from ..stores.base import (
    Check,
    CheckResult,
    CheckVerdict,
    Claim,
    LiveQuery,
    Reclaim,
    Release,
    Store,
)
from .claimer import SkipLog
from .clock import StoreClock
from .holdings import Holdings
from .knowledge import Knowledge
from .lateness import Lateness
from .liveness import Liveness, StoreWentBack

#: Claims checked before publish in one store call.
SEND_BATCH = 100
#: Later than any instant in the store's records (UTC ms, within what every store holds).
EVER = 2 ** 53 - 1

Publish = Callable[[Claim, str], Any]


def waiting_for_no_result() -> AbstractContextManager[None]:
    """Publish as a caller that never waits for the task's result (a beat never does), so
    that the result backend prepares no wait, one message at a time: a beat's memory would
    grow with every run it sends.

    The cause (Celery 5.7.0, redis-py 8.1.0): ``Celery.send_task`` calls
    ``backend.on_task_call`` for every message (celery/app/base.py:1212-1213); the Redis
    result backend's subscribes to the task's result channel there
    (celery/backends/redis.py:780-782, ``ResultConsumer._consume_from`` 405-411), and the
    returned AsyncResult's ``__del__`` unsubscribes (celery/result.py:446-449,
    backends/redis.py:413). But redis-py's PubSub forgets a channel only when it reads the
    server's confirmation of the UNSUBSCRIBE (redis/client.py:1521-1532 and 1687-1691),
    and nothing in a beat reads from that connection: ``PubSub.channels`` and
    ``PubSub.pending_unsubscribe_channels`` keep one key per run sent (about 300 bytes a
    run in ``bench/soak.py``, as much in Celery's own PersistentScheduler), and each
    publish costs two round trips to the result backend for nothing. The RPC backend's
    ``on_task_call`` declares the caller's reply queue, which a beat never reads either.

    ``celery.result.denied_join_result`` (public; Celery's eager ``Task.apply`` uses it)
    says that joining a result here would block, which every backend's ``on_task_call``
    takes as "nobody will wait": nothing is subscribed or declared. A beat embedded in a
    worker (``celery worker -B``, any pool but gevent's and eventlet's) has always
    published in that state. The message is
    unchanged (its ``ignore_result`` is the task's: workers store the result as before).
    The flag is process-wide and set while a batch of checked claims is published (once a
    batch, not once a message: its store calls between the publishes join no result
    either); the beat's other threads never join a result.
    """
    from celery.result import denied_join_result

    return denied_join_result()


class BrokerDown(Exception):
    """Publishing failed because the broker cannot be reached: not the run's fault."""


def is_broker_outage(exc: BaseException) -> bool:
    """Whether a publish error says the broker is unreachable (rather than that this one
    message cannot be sent: a serialization error, a task or an argument that raises).

    Only kombu's own word counts: it raises OperationalError when the broker connection
    fails and its retries are spent. A TimeoutError raised by a task's custom apply_async,
    or by an argument evaluated at publish, is that message's problem: counted as an
    attempt, it cannot stop the other entries."""
    from kombu.exceptions import OperationalError

    return isinstance(exc, OperationalError)


class Sender:
    def __init__(self, store: Store, owner: Owner, settings: Settings,
                 policies: dict[str, Policy], holdings: Holdings, knowledge: Knowledge,
                 liveness: Liveness, clock: StoreClock, publish: Publish, metrics: Metrics,
                 skips: SkipLog, logger: logging.Logger,
                 arguments: EntryArguments = lambda entry: None) -> None:
        self.skips = skips
        self.arguments = arguments
        self.store = store
        self.owner = owner
        self.settings = settings
        self.policies = policies
        self.holdings = holdings
        self.knowledge = knowledge
        self.liveness = liveness
        self.clock = clock
        self.publish = publish
        self.metrics = metrics
        self.logger = logger
        #: Since when (store clock, ms) this beat has claimed and sent without a break (an
        #: outage of the store or the broker, a restart, the store going back): None now.
        self.up_since: int | None = None
        self.lateness = Lateness(logger, metrics)
        #: Messages this beat has published (the scheduler's pace reads it).
        self.published = 0

    def task_id(self, claim: Claim) -> str:
        """A scheduled run's id is its occurrence's; an operator's run (which may replace
        a skipped, lost or cancelled run at the same instant) has one of its own."""
        if claim.manual:
            return manual_task_id_for(claim.entry, claim.due, claim.token,
                                      self.settings.key_prefix)
        return task_id_for(claim.entry, claim.due, self.settings.key_prefix)

    # -- deciding ---------------------------------------------------------------------
    def decide(self, claims: list[Claim], schedule: dict[str, Any]) -> list[Check]:
        """For each claim: send it, or record it skipped. Claims that waited are judged
        again by the entry's catch-up policy; a claim of an entry no longer in the schedule
        is given back for a beat that has it."""
        by_entry: dict[str, list[Claim]] = defaultdict(list)
        for claim in claims:
            by_entry[claim.entry].append(claim)
        gone = [c for name, cs in by_entry.items() if name not in schedule for c in cs]
        if gone:
            self.release(gone)
        now = self.clock.now()
        grace = int(self.settings.catch_up_grace * 1000)
        checks: list[Check] = []
        for name, entry_claims in by_entry.items():
            if name not in schedule:
                continue
            policy = self.policies[name]
            scheduled = [c for c in entry_claims if not c.manual]
            waited = {c.ref for c in scheduled if c.ref in self.holdings.waited}
            if policy.overlap is Overlap.BUFFER_ONE and self.up_since is not None:
                # Due while this beat ran without a break: it waited for its turn (the
                # previous run), or was handed over by another beat; nothing was missed.
                waited = {ref for ref in waited if ref.due < self.up_since}
            skip: dict[int, Reason] = {}
            if waited:
                # A jittered run is on time up to its jitter after its due instant.
                decided = plan_held(
                    policy, [c.due for c in scheduled if c.ref in waited],
                    [c.due for c in scheduled if c.ref not in waited], now,
                    grace + int(policy.jitter * 1000))
                skip = dict(decided.skip)
            for claim in entry_claims:
                checks.append(Check(claim, self.task_id(claim), skip.get(claim.due),
                                    policy.overlap))
        checks.sort(key=lambda c: (c.claim.due, c.claim.entry))
        return checks

    # -- sending ----------------------------------------------------------------------
    def send(self, claims: list[Claim], schedule: dict[str, Any]) -> None:
        """Decide, check, publish and mark ``claims`` (all held by this beat).

        A claim is owed its sent mark as soon as its publish returns; an exception on its
        way out (the SystemExit of a stop) leaves it owed, and close() stores it; claims
        checked and not yet published are given back by close(). Raises BrokerDown after
        giving back what it could not publish.
        """
        checks = self.decide(claims, schedule)
        for start in range(0, len(checks), SEND_BATCH):
            self.liveness.keep_alive()
            queue, checked_at = self._check(checks[start:start + SEND_BATCH])
            try:
                with waiting_for_no_result():  # (once a batch: see there)
                    while queue:
                        if time.monotonic() - checked_at > self.settings.heartbeat_interval / 2:
                            self.liveness.keep_alive()
                            queue, checked_at = self._check(list(queue))
                            continue
                        check = queue.popleft()
                        self.holdings.checked.pop(0)  # from here on, it may be published
                        self._publish_one(check, schedule)
            except BrokerDown:
                self.holdings.checked.clear()
                self.flush_marks()
                self.release([c.claim for c in queue])
                self.release(list(self.holdings.held.values()))
                raise
            self.flush_marks()

    def _check(self, checks: list[Check]) -> tuple[deque[Check], float]:
        """The check before publish for ``checks``, in one store call: those still ours and
        to be sent, in order (the others are recorded, or not ours), and when the oldest
        answer was given (monotonic)."""
        self.holdings.checked = []
        if not checks:
            return deque(), time.monotonic()
        queue: deque[Check] = deque()
        results, checked_at = self._answers(checks)
        missing = [r.claim for r in results if r.verdict is CheckVerdict.MISSING]
        if missing:
            # A run this beat claimed has no record: the store lost writes. The claims stay
            # held (they are registered again as due runs), and nothing is sent meanwhile.
            raise StoreWentBack(f"{len(missing)} run(s) this beat claimed are missing from"
                                f" the store ({missing[0].entry} due {iso(missing[0].due)})")
        # The store holds each of these handed over from here on, whatever comes of the
        # publish: asked after at the next heartbeat, before any sent mark is.
        self.knowledge.checked([r.claim for r in results if r.verdict is CheckVerdict.SEND])
        for check, result in zip(checks, results):
            claim = result.claim
            if result.verdict is CheckVerdict.SEND:
                self.holdings.checked.append(claim)
                queue.append(check)
                continue
            self.holdings.drop(claim.ref)
            if result.verdict is CheckVerdict.SKIPPED and result.reason is not None:
                self.metrics.count("skipped")
                self.skips.add(claim.entry, result.reason)  # one line per reason per tick
            elif result.verdict is CheckVerdict.WAITING:
                # overlap="buffer_one": the store keeps it waiting for the previous run;
                # whichever beat sweeps first once that run is final claims it again.
                self.metrics.count("waiting")
                self.logger.info("beat-claims: %s due %s waits for the previous run to"
                                 " finish (overlap=buffer_one)", claim.entry, iso(claim.due))
            else:
                self.metrics.count("not_sent")
                self.logger.warning("beat-claims: not sending %s due %s (token %d): %s",
                                    claim.entry, iso(claim.due), claim.token, result.why)
        return queue, checked_at

    def _answers(self, checks: list[Check]) -> tuple[list[CheckResult], float]:
        """The store's check of each of ``checks``, in order, and when the oldest answer was
        given (monotonic). A claim the store checked with its claim moments ago
        (SendAtOnce) has that answer, which asking again would get (a holder's check
        repeated has the same answer); one checked longer ago than a stall allows, or to be
        checked with a skip reason, is asked again."""
        prechecked = self.holdings.prechecked
        now = time.monotonic()
        oldest = now - self.settings.heartbeat_interval / 2
        answered_at = now
        answers: dict[int, CheckResult] = {}
        ask: list[Check] = []
        for i, check in enumerate(checks):
            found = prechecked.pop(check.claim.ref, None)
            if (found is not None and check.skip is None and found[1] >= oldest
                    and found[0].claim == check.claim):
                answers[i] = found[0]
                answered_at = min(answered_at, found[1])
            else:
                ask.append(check)
        if ask:
            asked = iter(self.store.check(self.owner, ask))
            return ([answers[i] if i in answers else next(asked) for i in range(len(checks))],
                    answered_at)
        return [answers[i] for i in range(len(checks))], answered_at

    def _publish_one(self, check: Check, schedule: dict[str, Any]) -> None:
        claim = check.claim
        try:
            self.publish(claim, check.task_id)
        except Exception as exc:
            if is_broker_outage(exc):
                self.release([claim])
                raise BrokerDown(str(exc)) from exc
            self._publish_failed(claim, exc)
        else:
            now = self.clock.now()
            self.published += 1
            self.holdings.unmarked.append(claim)
            self.knowledge.sent(claim, check.task_id, now)
            self.metrics.count("sent")
            self._judge_lateness(claim, now)
        finally:
            self.holdings.drop(claim.ref)

    def _judge_lateness(self, claim: Claim, now: int) -> None:
        """Count how late ``claim`` went out after its instant, if it fell due while this
        beat ran without a break (see :mod:`beat_claims.beat.lateness`)."""
        if claim.manual or self.up_since is None or claim.due < self.up_since or \
                claim.ref in self.holdings.due_again:
            return  # (late by design: an operator's, a catch-up, or taken due again)
        policy = self.policies.get(claim.entry)
        at = claim.due
        if policy is not None and policy.jitter:
            at += occurrences.jitter_offset(claim.entry, claim.due, policy.jitter)
        self.lateness.sent(now - at, now)

    def _publish_failed(self, claim: Claim, exc: Exception) -> None:
        """This message cannot be published: try again later, a bounded number of times.

        A serializer's error may quote an argument's value: the record and the log line
        keep what :func:`recorded_exception` keeps, and the traceback only its frames."""
        limit = self.settings.publish_retries + 1  # the first try and its retries
        text = entry_exception(exc, self.arguments(claim.entry), self.settings)
        # The store counts a failed publish by its error text, never empty: the message
        # kept, else the type (an exception without a message is counted too).
        [state] = self.store.release(
            self.owner, [Release(claim, text.message or text.type, text.type)], limit)
        self.metrics.count("publish_failed")
        if state is RunState.FAILED:
            self.logger.error("beat-claims: publishing %s due %s failed %d times; recorded"
                              " failed (publish_error): %s\n%s", claim.entry, iso(claim.due),
                              limit, text, frames(exc))
        else:
            self.logger.error("beat-claims: publishing %s due %s failed (attempt %d of %d);"
                              " it is due again: %s\n%s", claim.entry, iso(claim.due),
                              claim.attempts + 1, limit, text, frames(exc))

    def flush_marks(self) -> None:
        """Store the sent marks still owed. Until they are stored this beat does not treat
        those runs as its own forgotten claims (which would send them again)."""
        if self.holdings.unmarked:
            marked = self.store.record_sent(self.owner, self.holdings.unmarked)
            # A mark the store refused (the run taken back meanwhile) was never its to
            # lose; which one it refused is not said: the newest mark stays the last known.
            if marked == len(self.holdings.unmarked):
                self.knowledge.marked_sent(self.holdings.unmarked)
            self.holdings.unmarked.clear()

    def release(self, claims: list[Claim]) -> int:
        """Give back claims this beat will not send; they are due again."""
        if not claims:
            return 0
        states = self.store.release(self.owner, [Release(c) for c in claims])
        for claim in claims:
            self.holdings.drop(claim.ref)
        return sum(1 for s in states if s is RunState.DUE)

    def give_back_all(self) -> None:
        """At stop: every claim this beat holds and will not send, given back (due again at
        once, for a beat that runs), and this beat leaves the store's owners."""
        self.flush_marks()
        # Checked but never handed to the broker: safe to give back even though they
        # passed the check (the one being published when the stop came is not here).
        released = self.release(
            list(self.holdings.held.values()) + list(self.holdings.checked))
        # Claims of this beat it is not handling (the one being published when the stop
        # came; one whose reply was lost): found in the store's records, taken back. Every
        # claim call of this beat has returned by now (no tick runs, the claim thread is
        # stopped): each claim the store shows it holding is one it will not send, however
        # young. Not "older than now" by this beat's clock: that clock is the store's as
        # read at the last heartbeat, and lags it when that reply came late (the claim
        # being published, made since, was left held).
        forgotten = [Reclaim(h.entry, h.due, h.token) for h in self.store.live_runs(LiveQuery(
            self.owner.id, frozenset(), held_before=0, mine_before=EVER, dead_before=0)).held
            if h.owner == self.owner.id]
        taken_back = sum(self.store.reclaim(forgotten, self.owner.id)) if forgotten else 0
        self.store.leave(self.owner)
        if released:
            self.metrics.count("released", released)
            self.logger.info("beat-claims: released %d unsent claim(s)", released)
        if taken_back:
            self.logger.info("beat-claims: %d claim(s) being published when the stop came"
                             " (or whose reply was lost) are due again; if a message was"
                             " sent too, the worker's fencing runs the occurrence once",
                             taken_back)
