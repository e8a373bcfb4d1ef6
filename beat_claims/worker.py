"""The worker side: fencing before a delivery runs, and outcomes from Celery's signals.

The decision is taken in ``task_prerun`` (before Celery records STARTED in the result
backend, so that a refused duplicate never writes there) and carried out in
``Task.before_start`` raising :class:`celery.exceptions.Ignore`, the one place Celery lets
a task be skipped. ``before_start`` (and ``on_replace``) are set on the app's base task
class when :func:`install` runs, and on every task class when the app is finalized and
when a worker or pool process starts: every tracer, built whenever and in whichever
process (fork, spawn, threads), sees them.

Outcome handlers are idempotent: a final state is never overwritten, a superseded token's
outcome is ignored, and nothing here moves an entry's checkpoint. Of an exception, a
record keeps what :func:`beat_claims.exception_text.recorded_exception` keeps (its type;
its message only by opt-in, the task's argument values masked). A delivery that ends
without an outcome (``Reject``, a task that ``replace``\\ s itself, the user's ``Ignore``)
gets the record that says what became of it.

Every process that executes fenced deliveries keeps its liveness record in the store; a
delivery whose run another process started judges that process by it
(:mod:`beat_claims.worker_liveness`), never by asking it.

The store is asked with a short timeout (``beat_claims_worker_timeout``); after one
failure this process treats it as down, logged once, and a background probe finds out when
it answers again (soon after a blip, at most every 5 s in a long outage). A delivery that
meets the store down waits for it, up to ``beat_claims_worker_store_wait`` from the
outage's start (and within its own time limit), then asks again: a restart or a failover
fences the deliveries that arrive meanwhile, a stale owner's message included; a start
whose reply was lost, asked again, is found to be the delivery's own (:class:`_Starts`).
Past that bound, deliveries run unfenced until the store answers (logged once): a store
that hangs costs one delivery one timeout and one wait per outage, not every task, and
outages that follow each other within PROBE_MEMORY (a store that answers the probe and
fails writes) are one, for the bound.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from celery import Celery, Task, signals, states
from celery._state import connect_on_app_finalize
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded
from celery.utils.log import get_logger
from celery.utils.objects import mro_lookup

from .enums import RunState, StartVerdict
from .exception_text import ExceptionText, recorded_exception
from .runs import HEADER, iso, process_identity, process_is_gone, to_ms
from .settings import ConfigurationError, Settings
from .stores import StoreConfigurationError, open_store
from .stores.base import Delivery, Outcome, StartDecision, Store, StoreError, WorkerProcess
from .worker_liveness import ProcessHeartbeat, StarterVerdict, judge_starter, ttl_of

logger = get_logger("celery.worker.claims")

_MARK = "_beat_claims_fenced"
#: While the store is down, a process asks it again (in the background) after PROBE_FIRST,
#: then at twice the last wait, up to PROBE_EVERY: most outages a worker meets are blips (a
#: connection cut, a failover), and each second it takes for unfenced after the store is
#: back is a second in which a message sent twice runs twice. An outage that follows the
#: last one within PROBE_MEMORY starts where that one's waits had got to: a store that
#: answers the probe (a read) and fails the deliveries' writes (writes paused, a lock) costs
#: a delivery one timeout per PROBE_EVERY, not one per PROBE_FIRST.
PROBE_FIRST = 0.25
PROBE_EVERY = 5.0
PROBE_MEMORY = 60.0
#: What the store answers a start of a run this very process started (stores' start): to a
#: delivery that asks again after its own start's reply was lost, that start was its own.
ALREADY_HERE = "already started by this process"
#: The runs this process's deliveries started that it remembers, the latest first out: a
#: start asked again after a lost reply is this delivery's own unless one of these.
STARTED_KEPT = 10_000
#: What Celery's Task.replace raises once the replacement is sent.
_REPLACED = "Replaced by new task"
#: The time limits the worker's pool puts on every task (``celery worker --time-limit``,
#: ``--soft-time-limit``): neither the task's nor the message's, so a pool process cannot
#: read them; the worker's main process passes them on in its environment, which forked
#: and spawned pool processes alike inherit ("hard soft", seconds; "-" for none).
POOL_LIMITS_ENV = "BEAT_CLAIMS_POOL_TIME_LIMITS"
#: Pools that run tasks without time limits (Celery accepts the options, and ignores them).
_UNLIMITED_POOLS = ("celery.concurrency.solo", "celery.concurrency.thread")


class _Context:
    """This process's settings and store, and whether the store answers. Created lazily
    in each process (after a fork, or in a spawned child)."""

    def __init__(self) -> None:
        self.app: Celery | None = None
        self.settings: Settings | None = None
        self.store: Store | None = None
        self.pid = 0
        self.broken: str | None = None  # a configuration error: no fencing at all
        self.down_since: float | None = None
        self._probe_wait = PROBE_FIRST  # the next probe's wait (see PROBE_MEMORY)
        self._up_at = float("-inf")  # when the last outage ended (monotonic)
        self._answers = threading.Event()  # set while the store is taken for up
        self._answers.set()
        #: Seconds the store was down in the outages before this one that followed each
        #: other within PROBE_MEMORY (a store that flaps: one outage, for the wait's bound).
        self._down_before = 0.0
        self._chain: float | None = None  # when the first of those outages began
        self._given_up: float | None = None  # the outages past their wait (their _chain)
        self._lock = threading.Lock()
        self._noted: set[str] = set()

    def get(self) -> Store | None:
        """The store, or None when it cannot be used (misconfigured, or down)."""
        if self.app is None or self.broken is not None:
            return None
        if self.store is None or self.pid != os.getpid():
            try:
                self.settings = Settings.from_app(self.app)
                self.store = open_store(self.settings, timeout=self.settings.worker_timeout)
            except (ConfigurationError, StoreConfigurationError) as exc:
                self.broken = str(exc)
                logger.error("beat-claims: the worker side is off in this process: %s", exc)
                return None
            self.pid = os.getpid()
            self.down_since = self._given_up = self._chain = None
            self._down_before = 0.0
            # (a fork may have copied them held or cleared by a thread that is not here)
            self._lock, self._answers = threading.Lock(), threading.Event()
            self._answers.set()
        return None if self.down_since is not None else self.store

    def failed(self, what: str, exc: Exception) -> None:
        """The store did not answer: down until a probe says otherwise, logged once."""
        with self._lock:
            if self.down_since is not None:
                return
            self.down_since = time.monotonic()
            self._answers.clear()
            if self.down_since - self._up_at > PROBE_MEMORY:
                self._probe_wait = PROBE_FIRST
                self._down_before, self._chain = 0.0, self.down_since
        wait = self.settings.worker_store_wait if self.settings is not None else 0.0
        logger.error("beat-claims: store unreachable (%s: %s) while %s; deliveries wait for"
                     " it up to %gs, then run unfenced until it answers, and their outcomes"
                     " are not recorded here (logged once per outage)", type(exc).__name__,
                     exc, what, wait)
        threading.Thread(target=self._probe, name="beat-claims-probe", daemon=True).start()

    def _probe(self) -> None:
        while self.down_since is not None and self.store is not None:
            time.sleep(self._probe_wait)
            self._probe_wait = min(PROBE_EVERY, 2 * self._probe_wait)
            try:
                self.store.owners()
            except Exception:
                continue
            with self._lock:
                since, self.down_since = self.down_since, None
                self._up_at = time.monotonic()
                self._down_before += self._up_at - (since or self._up_at)
                self._answers.set()
            logger.warning("beat-claims: store reachable again after %.1fs; deliveries are"
                           " fenced again", time.monotonic() - (since or time.monotonic()))
            return  # (an outage from here on is another one, with a probe of its own)

    def awaited(self, began: float, limit: float | None) -> Store | None:
        """The store, once it answers: while it is down, wait for the probe to find it up,
        until the outage is ``worker_store_wait`` old (the outages that followed each
        other within PROBE_MEMORY counted as one: their time down adds up), the delivery
        (which ``began`` then) has waited that long, or its time ``limit`` (seconds from
        ``began``) is spent. None when it did not come back in time (the delivery runs
        unfenced)."""
        while True:
            store = self.get()
            with self._lock:
                down, before = self.down_since, self._down_before
            settings = self.settings
            if store is not None or settings is None or self.broken is not None:
                return store
            if down is None:
                continue  # (the probe found it up between the two reads: ask again)
            deadline = min(down - before, began) + settings.worker_store_wait
            if limit is not None:
                deadline = min(deadline, began + limit)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._answers.wait(remaining)  # (then again: up, still down, or down again)
        self.gave_up(time.monotonic() - down + before)
        return None

    def gave_up(self, down_for: float) -> None:
        """Past the wait of this outage (and those just before it: see _down_before),
        down ``down_for`` seconds: said once for them."""
        with self._lock:
            if self._given_up == self._chain:
                return
            self._given_up = self._chain
        logger.error("beat-claims: store still unreachable after %.1fs; deliveries run"
                     " unfenced until it answers (logged once per outage)", down_for)

    def note(self, key: str, message: str, *args: Any) -> None:
        """Log a condition once per process."""
        if key not in self._noted:
            self._noted.add(key)
            logger.error(message, *args)


_context = _Context()
#: This process's liveness record in the store (a thread renews it; a forked child starts
#: its own).
_heartbeat = ProcessHeartbeat()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_heartbeat.after_fork_in_child)
#: Task ids of deliveries refused in this process, while they finish: Celery would record
#: them STARTED in the result backend over the run's real result.
_refused: set[str] = set()


def install(app: Celery) -> None:
    """Record outcomes and refuse duplicate deliveries on this app's workers.

    Call it once in the module that creates the Celery app; the Django integration calls
    it for you. Tasks need no change of base class.
    """
    _context.app = app
    _patch_app(app)
    if getattr(install, "_connected", False):
        return
    # A pool process started afresh (spawn, macOS) rebuilds the app from a pickle: that
    # app, finalized in the child before its tracers are built, is patched too.
    connect_on_app_finalize(_patch_rebuilt)
    signals.worker_init.connect(_on_worker_init, weak=False)
    signals.worker_ready.connect(_on_worker_ready, weak=False)
    signals.worker_process_init.connect(_patch_all, weak=False)
    signals.task_prerun.connect(_decide, weak=False)
    signals.task_postrun.connect(_after, weak=False)
    signals.task_success.connect(_on_success, weak=False)
    signals.task_failure.connect(_on_failure, weak=False)
    signals.task_revoked.connect(_on_revoked, weak=False)
    signals.task_rejected.connect(_on_rejected, weak=False)
    signals.task_internal_error.connect(_on_internal_error, weak=False)
    install._connected = True  # type: ignore[attr-defined]


# -- patching ---------------------------------------------------------------------------
def _patch_app(app: Celery) -> None:
    _patch_class(app.Task)
    app.on_after_finalize.connect(lambda sender=None, **kw: _patch_tasks(app), weak=False)


def _patch_rebuilt(app: Celery) -> None:
    if _context.app is not None and app is not _context.app and \
            app.main == _context.app.main:
        _patch_app(app)


def _patch_tasks(app: Celery) -> None:
    for task in list(app.tasks.values()):
        patch_task(task)
    _guard_backend(app)


def _patch_all(sender: Any = None, **kwargs: Any) -> None:
    app = _context.app
    if app is not None:
        _patch_tasks(app)
    from celery import current_app

    if current_app is not app and _context.app is not None and \
            current_app.main == _context.app.main:
        _patch_tasks(current_app)


def patch_task(task: Task) -> None:
    _patch_class(type(task))


def _patch_class(cls: type) -> None:
    """``before_start`` (carry out the fence) and ``on_replace`` (hand the run to the
    replacing task) on ``cls``, once; a class's own versions still run, and a class that
    inherits ours from a patched base is left as it is."""
    if cls.__dict__.get(_MARK):
        return
    own_start = _own(cls, "before_start")
    own_replace = _own(cls, "on_replace")
    if own_start is not _ALREADY:
        def before_start(self: Task, task_id: str, args: Any, kwargs: Any) -> None:
            fence(self)
            if own_start is not None:
                own_start(self, task_id, args, kwargs)

        before_start.__module__ = __name__
        before_start._beat_claims = True  # type: ignore[attr-defined]
        cls.before_start = before_start  # type: ignore[attr-defined]
    if own_replace is not _ALREADY:
        original = own_replace if own_replace is not None else Task.on_replace

        def on_replace(self: Task, sig: Any) -> Any:
            _hand_to_replacement(self, sig)
            return original(self, sig)

        on_replace.__module__ = __name__
        on_replace._beat_claims = True  # type: ignore[attr-defined]
        cls.on_replace = on_replace  # type: ignore[attr-defined]
    setattr(cls, _MARK, True)


_ALREADY = object()


def _own(cls: type, name: str) -> Any:
    """The class's own version of ``name`` (None: Celery's; _ALREADY: one of ours, from a
    patched base)."""
    owner = mro_lookup(cls, name, stop={Task, object}, monkey_patched=["celery.app.task"])
    if owner is None:
        return None
    value = owner.__dict__[name]
    return _ALREADY if getattr(value, "_beat_claims", False) else value


def _guard_backend(app: Celery) -> None:
    """A refused duplicate must not write STARTED over the run's result: the result
    backend's class skips that one write for the task ids refused in this process."""
    try:
        cls = type(app.backend)
    except Exception:
        return
    if cls.__dict__.get(_MARK) or not hasattr(cls, "store_result"):
        return
    original = cls.store_result

    def store_result(self: Any, task_id: str, result: Any, state: str, *args: Any,
                     **kwargs: Any) -> Any:
        if state == states.STARTED and task_id in _refused:
            return result
        return original(self, task_id, result, state, *args, **kwargs)

    cls.store_result = store_result
    setattr(cls, _MARK, True)


# -- the worker starts ------------------------------------------------------------------
def _on_worker_init(sender: Any = None, **kwargs: Any) -> None:
    """Before the worker consumes anything: a configuration error stops it (unless
    ``beat_claims_worker_unprotected``). Celery's logging is not set up yet here, so that
    one line goes to stderr itself."""
    _patch_all()
    _pass_on_pool_limits(sender)
    app = _context.app
    if app is None:
        return
    try:
        settings = Settings.from_app(app)
        open_store(settings, timeout=settings.worker_timeout).close()
    except (ConfigurationError, StoreConfigurationError) as exc:
        _refuse_to_start(app, str(exc))


def _on_worker_ready(sender: Any = None, **kwargs: Any) -> None:
    """The worker is up: say what it protects, after asking the store."""
    app = _context.app
    if app is None or _context.broken is not None:
        return
    fenced = len([name for name in app.tasks if not name.startswith("celery.")])
    store = _context.get()
    if store is None:
        return  # a configuration error, said at init
    try:
        store.owners()
    except StoreConfigurationError as exc:
        logger.critical("beat-claims: %s: %d task(s) run unfenced", exc, fenced)
        return
    except StoreError as exc:  # an outage: logged once, probed until it answers
        _context.failed(f"starting the worker ({fenced} task(s) of store"
                        f" {store.description})", exc)
        return
    logger.info("beat-claims: fencing %d task(s) with store %s", fenced, store.description)


def _pass_on_pool_limits(controller: Any) -> None:
    """The worker's own time limits (``sender`` of ``worker_init``: the WorkController),
    for its pool processes' judgements (POOL_LIMITS_ENV), when its pool enforces them."""
    from celery.concurrency import get_implementation

    limits = (getattr(controller, "time_limit", None),
              getattr(controller, "soft_time_limit", None))
    try:
        pool = get_implementation(getattr(controller, "pool_cls", None) or "prefork")
        unlimited = getattr(pool, "__module__", "") in _UNLIMITED_POOLS
    except Exception:  # a pool Celery cannot name: its limits count
        unlimited = False
    if unlimited or not any(limits):
        os.environ.pop(POOL_LIMITS_ENV, None)
        return
    os.environ[POOL_LIMITS_ENV] = " ".join(str(float(x)) if x else "-" for x in limits)


def _pool_limits() -> tuple[float | None, float | None]:
    """(hard, soft) of the worker's pool (see POOL_LIMITS_ENV)."""
    try:
        hard, soft = os.environ.get(POOL_LIMITS_ENV, "- -").split()
        return (None if hard == "-" else float(hard)), (None if soft == "-" else float(soft))
    except ValueError:
        return None, None


def _refuse_to_start(app: Celery, why: str) -> None:
    if bool(app.conf.get("beat_claims_worker_unprotected", False)):
        sys.stderr.write(f"beat-claims: {why}; beat_claims_worker_unprotected is set: this"
                         " worker runs periodic tasks unfenced and records no outcome\n")
        _context.broken = why
        return
    sys.stderr.write(f"beat-claims: {why} (the worker does not start; set"
                     " beat_claims_worker_unprotected = True to run it unfenced)\n")
    raise SystemExit(1)


# -- fencing ----------------------------------------------------------------------------
def claim_of(request: Any) -> tuple[str, int, int] | None:
    """(entry, due ms, token) from a request's ``beat_claims`` header, if it has one."""
    parsed = _header(request)
    if parsed is None:
        return None
    entry, due, token, _ = parsed
    return entry, due, token


def _header(request: Any) -> tuple[str, int, int, dict[str, Any]] | None:
    meta = getattr(request, HEADER, None)
    if meta is None:
        headers = getattr(request, "headers", None) or {}
        meta = headers.get(HEADER) if isinstance(headers, dict) else None
    parsed = parse_header(meta)
    if parsed is None or not isinstance(meta, dict):
        return None
    entry, due, token = parsed
    return entry, due, token, meta


def parse_header(meta: Any) -> tuple[str, int, int] | None:
    """(entry, due ms, token) from the value of a ``beat_claims`` header."""
    if not isinstance(meta, dict):
        return None
    try:
        due = to_ms(datetime.fromisoformat(str(meta["due"]).replace("Z", "+00:00")))
        return str(meta["entry"]), due, int(meta["token"])
    except (KeyError, TypeError, ValueError):
        logger.warning("beat-claims: ignoring a malformed %s header: %r", HEADER, meta)
        return None


def _process(request: Any) -> WorkerProcess:
    return WorkerProcess(getattr(request, "hostname", None) or socket.gethostname(),
                         os.getpid(), process_identity(os.getpid()) or "")


def _decide(sender: Any = None, task_id: str | None = None, task: Any = None,
            **kwargs: Any) -> None:
    """``task_prerun``: may this delivery run? Decided once per delivery, before Celery
    records it STARTED; carried out by before_start."""
    task = task or sender
    request = getattr(task, "request", None)
    if request is None or getattr(request, _MARK, None) is not None:
        return
    setattr(request, _MARK, "")
    parsed = _header(request)
    if parsed is None:
        return  # not sent by beat-claims: runs untouched
    entry, due, token, meta = parsed
    began, limit = time.monotonic(), _time_left(task, request)
    try:
        decision = _decision(request, entry, due, token, meta, began, limit)
    except SoftTimeLimitExceeded:
        # Its soft limit came during the wait or a store call after it (the wait leaves a
        # second for that): Celery's signal dispatch would swallow this, and the body would
        # run past its soft limit, maybe beside a starter. Refused, as a judgement cut
        # short by a known limit is.
        decision = StartDecision(StartVerdict.REFUSED, "its soft time limit ended the wait"
                                 " for the store")
    if decision is None:
        return  # unfenced
    if decision.ok:
        setattr(request, _MARK, "started")
        return
    setattr(request, _MARK, f"refused: {decision.why or 'already started'}")
    if request.id:
        _refused.add(request.id)


def _decision(request: Any, entry: str, due: int, token: int, meta: dict[str, Any],
              began: float, limit: float | None) -> StartDecision | None:
    """May this delivery run (None: it runs unfenced)?"""
    # This process's settings (read once): a delivery from beats on another key prefix
    # runs unfenced at once, never waiting for the store.
    _context.get()
    settings, prefix = _context.settings, meta.get("prefix")
    if settings is None or _context.broken is not None:
        return None
    if prefix is not None and prefix != settings.key_prefix:
        _context.note(f"prefix {prefix}", "beat-claims: deliveries come from beats using key"
                      " prefix %r; this worker uses %r (store %s): they run unfenced here."
                      " Give beats and workers the same beat_claims_url and"
                      " beat_claims_key_prefix.", prefix, settings.key_prefix,
                      _context.store.description if _context.store else "?")
        return None
    store = _context.awaited(began, limit)
    if store is None:
        return None
    delivery = Delivery(entry, due, token, _process(request), int(request.retries or 0),
                        request.id or "")
    decision = _start_awaited(store, delivery, began, limit)
    beats_store = meta.get("store")
    if decision is not None and beats_store and decision.store_id and \
            beats_store != decision.store_id:
        _context.note(f"store {beats_store}", "beat-claims: deliveries come from beats whose"
                      " store has id %s; this worker's store %s has id %s: another store (or"
                      " it was wiped since they were sent). They run unfenced here.",
                      beats_store, store.description, decision.store_id)
        return None
    return decision


def _start_awaited(store: Store, delivery: Delivery, began: float, limit: float | None
                   ) -> StartDecision | None:
    """The store's answer to starting ``delivery`` (which began then, with that time
    ``limit``), asked again while the store fails, until it answers or the wait for it is
    over (None: the delivery runs unfenced). A start whose reply was lost may have started
    the run: asked again, the store says this process started it, and unless another
    delivery of this process did, it was this one (:class:`_Starts`)."""
    assert _context.settings is not None
    interval = _context.settings.worker_heartbeat_interval
    wait = _context.settings.worker_store_wait
    deadline = began + (wait if limit is None else min(wait, limit))
    run = (delivery.entry, delivery.due, delivery.token, delivery.retries)
    lost_reply = False
    current: Store | None = store
    while current is not None:
        try:
            with _starts.one_at_a_time(run):
                decision = _start(current, delivery, interval, limit, began)
                if lost_reply and decision.verdict is StartVerdict.REFUSED and \
                        decision.why == ALREADY_HERE and not _starts.known(run):
                    logger.info("beat-claims: %s due %s: its start's reply was lost, and it"
                                " had started the run (task %s)", delivery.entry,
                                iso(delivery.due), delivery.task_id)
                    decision = dataclasses.replace(decision, verdict=StartVerdict.RUN, why="")
                if decision.ok:
                    _starts.started(run)
                return decision
        except StoreError as exc:
            lost_reply = True  # (its reply, or the request: the store may have acted)
            _context.failed(f"starting {delivery.entry} due {iso(delivery.due)} (task"
                            f" {delivery.task_id})", exc)
        current = _context.awaited(began, limit)
        if current is not None and time.monotonic() >= deadline:
            # A store that answers the probe and fails starts: bounded all the same.
            _context.gave_up(time.monotonic() - began)
            return None
    return None


def _start(store: Store, delivery: Delivery, interval: float, limit: float | None,
           began: float) -> StartDecision:
    """The store's answer to starting ``delivery``, its starter judged when another process
    started the run (within what is left of ``limit``, seconds from ``began``)."""
    _heartbeat.ensure(store, delivery.process, interval)  # (no start without a record)
    decision = store.start(delivery)
    if decision.ok or decision.busy_with is None:
        return decision
    left = None if limit is None else max(0.0, limit - (time.monotonic() - began))
    try:
        return _when_busy(store, delivery, decision, interval, left)
    except SoftTimeLimitExceeded:
        # A limit the judgement did not know of ended it: Celery's signal dispatch would
        # swallow this, and the body would run beside a starter that may be alive.
        # Refused, as a judgement cut short by a known limit is.
        return dataclasses.replace(decision, why="its soft time limit ended the judgement"
                                   " of the process that started its run")


class _Starts:
    """The runs (entry, due, token, retries) this process's deliveries started, the latest
    STARTED_KEPT, and one start of a run at a time here: what tells a delivery's own start
    whose reply was lost from a duplicate's (a pool of threads, or a delivery before it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: OrderedDict[tuple[str, int, int, int], None] = OrderedDict()
        self._starting: dict[tuple[str, int, int, int], tuple[threading.Lock, int]] = {}

    @contextmanager
    def one_at_a_time(self, run: tuple[str, int, int, int]) -> Iterator[None]:
        with self._lock:
            lock, users = self._starting.get(run) or (threading.Lock(), 0)
            self._starting[run] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._lock:
                lock, users = self._starting[run]
                if users > 1:
                    self._starting[run] = (lock, users - 1)
                else:
                    del self._starting[run]

    def known(self, run: tuple[str, int, int, int]) -> bool:
        with self._lock:
            return run in self._runs

    def started(self, run: tuple[str, int, int, int]) -> None:
        with self._lock:
            self._runs[run] = None
            self._runs.move_to_end(run)
            while len(self._runs) > STARTED_KEPT:
                self._runs.popitem(last=False)

    def handed_back(self, run: tuple[str, int, int, int]) -> None:
        """Its run goes back to the broker or to a replacement: the next delivery of its
        token starts it again."""
        with self._lock:
            self._runs.pop(run, None)

    def after_fork_in_child(self) -> None:
        """Another process: none of these are its own (and a lock may be held by a thread
        that is not here)."""
        self._lock, self._runs, self._starting = threading.Lock(), OrderedDict(), {}


_starts = _Starts()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_starts.after_fork_in_child)


def fence(task: Task) -> None:
    """before_start: raise Ignore when this delivery was refused (see invariant 6)."""
    request = task.request
    if getattr(request, _MARK, None) is None:
        _decide(task=task)  # an eager call, or a tracer without the prerun signal
    decision = getattr(request, _MARK, "") or ""
    if decision.startswith("refused"):
        claim = claim_of(request)
        entry, due, token = claim if claim is not None else ("?", 0, 0)
        logger.warning("beat-claims: refusing delivery of %s due %s token %d (task %s): %s",
                       entry, iso(due), token, request.id, decision[len("refused: "):])
        raise Ignore()


def _time_left(task: Any, request: Any) -> float | None:
    """What the delivery's time limits (the shorter of hard and soft, of the message, else
    the task, else the worker's pool, as Celery applies them) leave a judgement of its
    starter: a second less, and never below zero. A judgement ended by a soft limit would
    leave the delivery undecided (it would run); by a hard one, its failure would be
    recorded over the starter's run."""
    hard, soft = tuple(getattr(request, "timelimit", None) or (None, None))[:2]
    pool_hard, pool_soft = _pool_limits()
    limits = [float(x) for x in (hard or getattr(task, "time_limit", None) or pool_hard,
                                 soft or getattr(task, "soft_time_limit", None) or pool_soft)
              if x]
    return max(0.0, min(limits) - 1.0) if limits else None


def _when_busy(store: Store, delivery: Delivery, busy: StartDecision, interval: float,
               limit: float | None = None) -> StartDecision:
    """Another process started this delivery's run: the delivery runs only if that process
    is gone. On this host, by its pid and process identity (a pid now another process's
    was reused); elsewhere, from its heartbeat record in the store (see
    :mod:`beat_claims.worker_liveness`), never by asking it."""
    starter = busy.busy_with
    assert starter is not None
    entry, due = delivery.entry, iso(delivery.due)
    here = process_is_gone(_host_of(starter.worker), starter.pid, starter.process)
    if here is False:
        return busy
    detail = "its pid is gone on this host"
    if here is None:
        logger.info("beat-claims: %s due %s was started by %s pid %d on another host:"
                    " judging it from its heartbeat in the store (at most %.1fs)", entry, due,
                    starter.worker, starter.pid, ttl_of(interval) + interval)
        judgement = judge_starter(store, delivery, busy, interval, limit)
        if judgement.verdict is StarterVerdict.CUT_SHORT:
            logger.warning("beat-claims: %s due %s: refusing this redelivery after %.1fs: its"
                           " time limit ends the wait before the heartbeat of %s pid %d could"
                           " lapse (give workers a beat_claims_worker_heartbeat_interval below"
                           " a quarter of the task's time limit)", entry, due,
                           judgement.waited, starter.worker, starter.pid)
        if judgement.verdict is not StarterVerdict.GONE:
            return judgement.decision
        detail = f"{judgement.detail}, judged in {judgement.waited:.1f}s"
    logger.warning("beat-claims: %s due %s: the process that started it (%s pid %d) is gone"
                   " (%s); running this redelivery", entry, due, starter.worker, starter.pid,
                   detail)
    return store.start(dataclasses.replace(delivery, takeover=starter))


def _host_of(worker: str) -> str:
    """Celery node names are ``name@host``; the process check needs the host."""
    return worker.split("@", 1)[1] if "@" in worker else worker


# -- deliveries without an outcome ------------------------------------------------------
def _hand_to_replacement(task: Task, sig: Any) -> None:
    """``self.replace(sig)``: the replacement keeps the task id; it gets the header too and
    the run is handed to it before it is sent, so that it starts it and its outcome is
    the run's."""
    request = task.request
    if getattr(request, _MARK, None) != "started":
        return
    parsed = _header(request)
    store = _context.get()
    if parsed is None or store is None:
        return
    entry, due, token, meta = parsed
    target = sig.tasks[-1] if hasattr(sig, "tasks") and getattr(sig, "tasks", None) else sig
    try:
        headers = dict(target.options.get("headers") or {})
        headers[HEADER] = dict(meta)
        target.set(headers=headers)
        _starts.handed_back((entry, due, token, int(request.retries or 0)))
        store.requeue(Delivery(entry, due, token, _process(request)))
    except StoreError as exc:
        _context.failed(f"handing {entry} due {iso(due)} to its replacement", exc)
    except Exception:
        logger.exception("beat-claims: could not hand %s due %s to its replacement", entry,
                         iso(due))
    setattr(request, _MARK, "replaced")


def _after(sender: Any = None, task_id: str | None = None, task: Any = None,
           retval: Any = None, state: str | None = None, **signal: Any) -> None:
    """``task_postrun``: a delivery that ended without an outcome signal."""
    task = task or sender
    request = getattr(task, "request", None)
    decision = getattr(request, _MARK, None) if request is not None else None
    if task_id:
        _refused.discard(task_id)
    if decision != "started":
        return
    parsed = _header(request)
    store = _context.get()
    if parsed is None or store is None:
        return
    entry, due, token, _ = parsed
    args, kwargs = signal.get("args"), signal.get("kwargs")
    try:
        if state == states.REJECTED and isinstance(retval, Reject):
            if retval.requeue:  # the broker delivers it again: that delivery runs it
                _starts.handed_back((entry, due, token,
                                     int(getattr(request, "retries", 0) or 0)))
                store.requeue(Delivery(entry, due, token, _process(request)))
            else:
                text = _exception(retval, args, kwargs)
                store.finish([Outcome(entry, due, token, RunState.CANCELLED,
                                      exc_type=text.type, exc_message=text.message)])
        elif state == states.IGNORED and isinstance(retval, Ignore) and \
                str(retval) != _REPLACED:
            # The task asked Celery to record nothing; it did run, without an error.
            text = _exception(retval, args, kwargs)
            store.finish([Outcome(entry, due, token, RunState.DONE, exc_type=text.type,
                                  exc_message=text.message,
                                  worker=getattr(request, "hostname", "") or "")])
    except StoreError as exc:
        _context.failed(f"recording what became of {entry} due {iso(due)}", exc)


def _exception(exc: Any, args: Any, kwargs: Any) -> ExceptionText:
    """What the run record keeps of ``exc`` (see :mod:`beat_claims.exception_text`)."""
    settings = _context.settings
    if settings is None:  # (never with a store: it is read with the settings)
        return ExceptionText(type(exc).__name__)
    return recorded_exception(exc, args, kwargs, settings)


# -- outcomes ---------------------------------------------------------------------------
def _resolve(task: Any, task_id: str | None) -> tuple[str, int, int | None] | None:
    request = getattr(task, "request", None)
    claim = claim_of(request) if request is not None and (
        task_id is None or getattr(request, "id", None) == task_id) else None
    if claim is not None:
        return claim
    store = _context.get()
    if store is None or not task_id:
        return None
    try:
        found = store.lookup_task(task_id)
    except StoreError as exc:
        _context.failed(f"looking up task {task_id}", exc)
        return None
    return (found.entry, found.due, None) if found else None


def _record(where: tuple[str, int, int | None] | None, state: RunState, exc: Any = None,
            worker: str = "", unstarted_only: bool = False, args: Any = None,
            kwargs: Any = None) -> None:
    """Record ``state`` for the run at ``where``; of ``exc``, what the task's arguments
    (``args``, ``kwargs``; both None: unknown) let the record keep."""
    store = _context.get()
    if where is None or store is None:
        return
    entry, due, token = where
    text = _exception(exc, args, kwargs) if exc is not None else ExceptionText("")
    try:
        store.finish([Outcome(entry, due, token, state, exc_type=text.type,
                              exc_message=text.message, worker=worker,
                              unstarted_only=unstarted_only)])
    except StoreError as exc2:
        _context.failed(f"recording {state.value} of {entry} due {iso(due)}", exc2)


def _refused_here(request: Any) -> bool:
    return str(getattr(request, _MARK, "") or "").startswith("refused")


def _on_success(sender: Any = None, **kwargs: Any) -> None:
    # task_success carries no task id: the running request has it.
    request = getattr(sender, "request", None)
    if _refused_here(request):
        return
    _record(_resolve(sender, None), RunState.DONE,
            worker=getattr(request, "hostname", "") or "")


def _on_failure(sender: Any = None, task_id: str | None = None, exception: Any = None,
                args: Any = None, kwargs: Any = None, **signal: Any) -> None:
    if _refused_here(getattr(sender, "request", None)):
        return
    _record(_resolve(sender, task_id), RunState.FAILED, exception, args=args, kwargs=kwargs)


def _on_internal_error(sender: Any = None, task_id: str | None = None, exception: Any = None,
                       args: Any = None, kwargs: Any = None, **signal: Any) -> None:
    _record(_resolve(sender, task_id), RunState.FAILED, exception, args=args, kwargs=kwargs)


def _on_revoked(sender: Any = None, request: Any = None, terminated: bool = False,
                expired: bool = False, **kwargs: Any) -> None:
    """A revoked delivery: the run is cancelled if this delivery was running it
    (terminated); one revoked or expired before it ran cancels only a run nobody
    started — a duplicate that expires never changes the record of the one running."""
    if request is None:
        return
    task_id = getattr(request, "id", None)
    # The signal's request is the task's Context: message headers are its attributes.
    where = claim_of(request)
    if where is None:
        headers = getattr(request, "request_dict", None) or {}
        where = parse_header(headers.get(HEADER)) if isinstance(headers, dict) else None
    _record(where or _resolve(None, task_id), RunState.CANCELLED,
            worker=getattr(request, "hostname", "") or "", unstarted_only=not terminated)


def _on_rejected(message: Any = None, exc: Any = None, **signal: Any) -> None:
    """A message the worker could not handle at all (an unknown task): its run did not
    start here."""
    headers = getattr(message, "headers", None) or {}
    task_id = headers.get("id")
    where = parse_header(headers.get(HEADER)) or _resolve(None, task_id)
    args, kwargs = _arguments_of(message) if exc is not None else (None, None)
    _record(where, RunState.CANCELLED, exc, unstarted_only=True, args=args, kwargs=kwargs)


def _arguments_of(message: Any) -> tuple[Any, Any]:
    """The task's (args, kwargs) in a message the worker could not handle; (None, None)
    when its body cannot be read (then no exception message is kept)."""
    try:
        body = message.decode()  # (only content types the worker accepts)
    except Exception:
        return None, None
    if isinstance(body, (list, tuple)) and len(body) >= 2:  # protocol 2
        return body[0], body[1]
    if isinstance(body, dict) and ("args" in body or "kwargs" in body):  # protocol 1
        return body.get("args"), body.get("kwargs")
    return None, None
