"""Outcomes no worker reported, read from the result backend by task id.

Workers without beat-claims' hooks (or whose outcome could not be recorded) still report
to the result backend; runs still sent or started are looked up there, a bounded number
per pass. The lookups run in a thread of their own and the beat waits for them at most
half a heartbeat interval: a backend that answers slowly, or not at all, never holds up
the beat's loop (a pass is skipped while the last one's lookup is still waiting). An
outcome found there for a run no worker recorded the start of says the workers ran it
unfenced: each such entry is named in a warning, once (each beat).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as WaitedTooLong
from typing import Any

from celery import Celery
from celery.backends.base import DisabledBackend
from celery.backends.rpc import RPCBackend

from ..enums import RunState
from ..exception_text import ExceptionText, entry_exception
from ..runs import iso
from ..settings import Settings
from ..stores.base import OpenRun, Outcome, Store
from ..unstarted import Said
from .clock import StoreClock
from .sweeper import next_cursor

#: Result backend states that settle a run.
BACKEND_STATES = {"SUCCESS": RunState.DONE, "FAILURE": RunState.FAILED,
                  "REVOKED": RunState.CANCELLED}
#: Passes are this many heartbeat intervals apart.
EVERY_INTERVALS = 10


class Recovery:
    def __init__(self, app: Celery, store: Store, settings: Settings, clock: StoreClock,
                 logger: logging.Logger) -> None:
        self.app = app
        self.store = store
        self.settings = settings
        self.clock = clock
        self.logger = logger
        self.last = float("-inf")
        self.cursor: int | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        self._slow_logged = False
        self._unfenced_said = Said()

    @property
    def enabled(self) -> bool:
        if not self.settings.result_backend_recovery or not self.app.conf.result_backend:
            return False
        # rpc:// sends results to the sender's reply queue: nothing to look up here.
        return not isinstance(self.app.backend, (DisabledBackend, RPCBackend))

    def due(self) -> bool:
        interval = self.settings.heartbeat_interval
        return time.monotonic() - self.last >= EVERY_INTERVALS * interval

    def run(self) -> None:
        self.last = time.monotonic()
        if not self.enabled:
            return
        if self._pending is not None and not self._pending.done():
            return  # the last pass is still waiting on the backend
        settle = self.clock.now() - int(2 * self.settings.heartbeat_interval * 1000)
        limit = self.settings.recovery_batch
        runs = self.store.open_runs(before=settle, after=self.cursor, limit=limit)
        self.cursor = next_cursor(runs, limit)
        if not runs:
            return
        found: list[tuple[OpenRun, Outcome]] = []
        looked = [0]
        stop = threading.Event()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="beat-claims-recovery")
        future = self._pool.submit(self._look_up, runs, found, looked, stop)
        try:
            future.result(timeout=self.settings.heartbeat_interval / 2)
        except WaitedTooLong:
            stop.set()
            self._pending = future
            if looked[0] < len(runs):  # go on from the first not looked at, next time
                self.cursor = runs[looked[0]].since - 1
            if not self._slow_logged:
                self._slow_logged = True
                self.logger.warning("beat-claims: the result backend answers slowly: %d of"
                                    " %d lookups in %.1fs; the rest at the next passes",
                                    looked[0], len(runs), self.settings.heartbeat_interval / 2)
        pairs = list(found)
        if not pairs:
            return
        never_started = set()
        for (run, done), recorded in zip(pairs, self.store.finish([o for _, o in pairs])):
            if recorded:
                self.logger.info("beat-claims: %s due %s: %s (from the result backend)",
                                 done.entry, iso(done.due), done.state.value)
                if run.state is RunState.SENT:
                    never_started.add((run.entry, run.due))
        self._warn_unfenced(never_started)

    def _warn_unfenced(self, runs: set[tuple[str, int]]) -> None:
        """Name the entries whose runs ran (the result backend has their outcome) while no
        worker recorded their start in the store: the workers run them unfenced. Judged
        from the store's record once the outcome is in it (a start recorded meanwhile is
        seen there), only for entries not named yet."""
        confirmed = [entry for entry in self._unfenced_said.unsaid(e for e, _ in runs)
                     if any(r.started_at is None and (entry, r.due) in runs
                            for r in self.store.history(entry))]
        if not confirmed:
            return
        self._unfenced_said.said(confirmed)
        self.logger.warning("beat-claims: runs of %s ran (their outcome is in the result"
                            " backend) but no worker recorded their start in the store: the"
                            " workers run them unfenced, a second delivery would run too"
                            " (likely causes: workers without beat_claims.install(app);"
                            " workers on another store or key prefix than the beats, or"
                            " that could not reach it)", ", ".join(confirmed[:10])
                            + (f" and {len(confirmed) - 10} more" if len(confirmed) > 10
                               else ""))

    def _look_up(self, runs: list[OpenRun], found: list[tuple[OpenRun, Outcome]],
                 looked: list[int], stop: threading.Event) -> None:
        """In the lookup thread: each run's state in the result backend, until told to
        stop. Only the backend is called from here, never the store."""
        try:
            self._look_up_each(runs, found, looked, stop)
        finally:
            _close_thread_connections()

    def _look_up_each(self, runs: list[OpenRun], found: list[tuple[OpenRun, Outcome]],
                      looked: list[int], stop: threading.Event) -> None:
        for run in runs:
            if stop.is_set():
                return
            if run.task_id:
                try:
                    result = self.app.AsyncResult(run.task_id)
                    outcome = BACKEND_STATES.get(result.state)
                    exc = result.result if outcome is RunState.FAILED else None
                    text = (self._text(result, exc) if exc is not None
                            else None)
                except Exception as exc2:
                    # (A result the backend cannot decode may quote the task's arguments.)
                    self.logger.debug("beat-claims: result backend lookup failed: %s",
                                      self._text(None, exc2))
                    return
                if outcome is not None:
                    found.append((run, Outcome(
                        run.entry, run.due, run.token, outcome,
                        exc_type=text.type if text is not None else "",
                        exc_message=text.message if text is not None else "")))
            looked[0] += 1

    def _text(self, result: Any, exc: Any) -> ExceptionText:
        """What the record keeps of ``exc``: the values masked are the arguments the backend
        kept with the result (``result_extended``), the delivery's own; without them, no
        message. (The entry's arguments as this beat schedules them now are not the
        delivery's: a lazy argument is evaluated again at each send, a database row may
        have been edited since.)"""
        return entry_exception(exc, _stored_arguments(result), self.settings)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _stored_arguments(result: Any) -> tuple[Any, Any] | None:
    """The (args, kwargs) a result backend kept with the result (``result_extended``)."""
    if result is None:
        return None
    try:
        args, kwargs = result.args, result.kwargs
    except Exception:  # an older or a custom backend
        return None
    return None if args is None and kwargs is None else (args, kwargs)


def _close_thread_connections() -> None:
    """Close the database connections a result backend opened in the lookup thread
    (django-celery-results uses Django's ORM, whose connections belong to the thread that
    opened them): one broken by a database restart is never reused, none outlives a pass,
    and a pass every few seconds can afford to connect again."""
    django_db = sys.modules.get("django.db")
    if django_db is None:
        return
    with contextlib.suppress(Exception):  # Django not configured, or a connection gone
        django_db.connections.close_all()
