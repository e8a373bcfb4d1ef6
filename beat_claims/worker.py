"""The worker side: fencing before a delivery runs, and outcomes from Celery's signals.

Fencing happens in ``Task.before_start`` raising :class:`celery.exceptions.Ignore`, the one
place Celery lets a task be skipped (a ``task_prerun`` handler cannot stop it). It is added
to every registered task's class when the worker starts, so users change no task class.
Outcome handlers are idempotent: a final state is never overwritten, a superseded token's
outcome is ignored, and nothing here moves an entry's checkpoint.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import datetime
from typing import Any

from celery import Celery, Task, signals
from celery.app.trace import task_has_custom
from celery.exceptions import Ignore
from celery.utils.log import get_logger

from .enums import RunState
from .runs import HEADER, process_identity, process_is_gone, to_ms
from .settings import ConfigurationError, Settings
from .stores import StoreConfigurationError, open_store
from .stores.base import Delivery, Outcome, Store, StoreError, WorkerProcess

logger = get_logger("celery.worker.claims")

_MARK = "_beat_claims_fenced"
_MESSAGE_LIMIT = 500
#: How long a worker waits for the store on a delivery (a beat waits longer).
STORE_TIMEOUT = 2.0


class _Context:
    """Per-process store, created lazily after fork."""

    def __init__(self) -> None:
        self.app: Celery | None = None
        self.store: Store | None = None
        self.pid = 0
        self.broken = False

    def get(self) -> Store | None:
        if self.app is None or self.broken:
            return None
        if self.store is None or self.pid != os.getpid():
            try:
                settings = Settings.from_app(self.app)
                self.store = open_store(settings, timeout=STORE_TIMEOUT)
            except (ConfigurationError, StoreConfigurationError) as exc:
                logger.error("beat-claims: worker side disabled: %s", exc)
                self.broken = True
                return None
            self.pid = os.getpid()
        return self.store


_context = _Context()


class _Outage:
    """Log a store outage once per outage in this process, not once per task."""

    def __init__(self) -> None:
        self.since: float | None = None

    def down(self, what: str, exc: Exception) -> None:
        if self.since is None:
            self.since = time.monotonic()
            logger.error("beat-claims: store unreachable (%s: %s): %s; further failures are"
                         " logged at debug level until it returns", type(exc).__name__, exc,
                         what)
        else:
            logger.debug("beat-claims: store still unreachable: %s", what)

    def up(self) -> None:
        if self.since is not None:
            logger.warning("beat-claims: store reachable again after %.1fs",
                           time.monotonic() - self.since)
            self.since = None


_outage = _Outage()


def install(app: Celery) -> None:
    """Record outcomes and refuse duplicate deliveries on this app's workers.

    Call it once in the module that creates the Celery app; the Django integration calls
    it for you. Tasks need no change of base class.
    """
    _context.app = app
    if getattr(install, "_connected", False):
        return
    signals.worker_init.connect(_patch_tasks_on_start, weak=False)
    signals.worker_process_init.connect(_patch_tasks_on_start, weak=False)
    signals.task_success.connect(_on_success, weak=False)
    signals.task_failure.connect(_on_failure, weak=False)
    signals.task_revoked.connect(_on_revoked, weak=False)
    signals.task_rejected.connect(_on_rejected, weak=False)
    signals.task_internal_error.connect(_on_internal_error, weak=False)
    install._connected = True  # type: ignore[attr-defined]


# -- fencing ----------------------------------------------------------------------------
def _patch_tasks_on_start(sender: Any = None, **kwargs: Any) -> None:
    app = _context.app
    if app is None:
        return
    for task in list(app.tasks.values()):
        patch_task(task)


def patch_task(task: Task) -> None:
    """Add the fencing check to the task's class ``before_start`` (once)."""
    cls = type(task)
    if cls.__dict__.get(_MARK):
        return
    original = cls.before_start if task_has_custom(task, "before_start") else None

    def before_start(self: Task, task_id: str, args: Any, kwargs: Any) -> None:
        fence(self)
        if original is not None:
            original(self, task_id, args, kwargs)

    before_start.__module__ = __name__
    cls.before_start = before_start
    setattr(cls, _MARK, True)


def claim_of(request: Any) -> tuple[str, int, int] | None:
    """(entry, due ms, token) from a request's ``beat_claims`` header, if it has one."""
    meta = getattr(request, HEADER, None)
    if meta is None:
        headers = getattr(request, "headers", None) or {}
        meta = headers.get(HEADER) if isinstance(headers, dict) else None
    return parse_header(meta)


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


def fence(task: Task) -> None:
    """Raise Ignore when this delivery must not run (see invariant 6 in the README)."""
    request = task.request
    if getattr(request, _MARK, False):
        return
    claim = claim_of(request)
    if claim is None:
        return  # not sent by beat-claims: runs untouched
    store = _context.get()
    if store is None:
        return
    entry, due, token = claim
    process = WorkerProcess(request.hostname or socket.gethostname(), os.getpid(),
                            process_identity(os.getpid()) or "")
    delivery = Delivery(entry, due, token, process, int(request.retries or 0),
                        request.id or "")
    try:
        decision = store.start(delivery)
        busy = decision.busy_with
        if not decision.ok and busy is not None and _starter_gone(task, request.id, busy):
            logger.warning("beat-claims: %s due %s: the process that started it (%s pid %d)"
                           " is gone; running this redelivery", entry, _iso(due), busy.worker,
                           busy.pid)
            decision = store.start(Delivery(entry, due, token, process, delivery.retries,
                                            takeover=busy))
    except StoreError as exc:
        _outage.down(f"running {entry} due {_iso(due)} (task {request.id}) unfenced", exc)
        return
    _outage.up()
    setattr(request, _MARK, True)
    if not decision.ok:
        logger.warning("beat-claims: refusing delivery of %s due %s token %d (task %s): %s",
                       entry, _iso(due), token, request.id, decision.why or "already started")
        raise Ignore()


def _starter_gone(task: Task, task_id: str, starter: WorkerProcess) -> bool:
    """Is the process that started this run gone? Same host: by pid and process start
    time (a pid now held by a younger process was reused); else ask its node."""
    worker = starter.worker
    here = process_is_gone(_host_of(worker), starter.pid, starter.process)
    if here is not None:
        return here
    try:
        replies = task.app.control.inspect([worker], timeout=1.0).active() or {}
    except Exception:
        return False
    if worker not in replies:
        return True  # its node does not answer: gone
    return not any(t.get("id") == task_id for t in replies[worker] or [])


def _host_of(worker: str) -> str:
    """Celery node names are ``name@host``; the process check needs the host."""
    return worker.split("@", 1)[1] if "@" in worker else worker


def _iso(due: int) -> str:
    from .runs import iso

    return iso(due) or str(due)


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
        _outage.down(f"cannot look up task {task_id}", exc)
        return None
    return (found.entry, found.due, None) if found else None


def _record(where: tuple[str, int, int | None] | None, state: RunState, exc: Any = None,
            worker: str = "") -> None:
    store = _context.get()
    if where is None or store is None:
        return
    entry, due, token = where
    exc_type = type(exc).__name__ if exc is not None else ""
    message = str(exc)[:_MESSAGE_LIMIT] if exc is not None else ""
    try:
        store.finish([Outcome(entry, due, token, state, exc_type=exc_type,
                              exc_message=message, worker=worker)])
    except StoreError as exc2:
        _outage.down(f"could not record {state.value} of {entry} due {_iso(due)}", exc2)
    else:
        _outage.up()


def _on_success(sender: Any = None, **kwargs: Any) -> None:
    # task_success carries no task id: the running request has it.
    request = getattr(sender, "request", None)
    _record(_resolve(sender, None), RunState.DONE,
            worker=getattr(request, "hostname", "") or "")


def _on_failure(sender: Any = None, task_id: str | None = None, exception: Any = None,
                **kwargs: Any) -> None:
    _record(_resolve(sender, task_id), RunState.FAILED, exception)


def _on_internal_error(sender: Any = None, task_id: str | None = None, exception: Any = None,
                       **kwargs: Any) -> None:
    _record(_resolve(sender, task_id), RunState.FAILED, exception)


def _on_revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    if request is None:
        return
    task_id = getattr(request, "id", None)
    # The signal's request is the task's Context: message headers are its attributes.
    where = claim_of(request)
    if where is None:
        headers = getattr(request, "request_dict", None) or {}
        where = parse_header(headers.get(HEADER)) if isinstance(headers, dict) else None
    _record(where or _resolve(None, task_id), RunState.CANCELLED,
            worker=getattr(request, "hostname", "") or "")


def _on_rejected(message: Any = None, exc: Any = None, **kwargs: Any) -> None:
    headers = getattr(message, "headers", None) or {}
    task_id = headers.get("id")
    where = parse_header(headers.get(HEADER)) or _resolve(None, task_id)
    _record(where, RunState.CANCELLED, exc)

