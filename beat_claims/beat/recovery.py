"""Outcomes no worker reported, read from the result backend by task id.

Workers without beat-claims' hooks (or whose outcome could not be recorded) still report
to the result backend; runs still sent or started are looked up there, a bounded number
per pass and within half a heartbeat interval, keeping the heartbeat alive between lookups.
"""

from __future__ import annotations

import logging
import time

from celery import Celery
from celery.backends.base import DisabledBackend
from celery.backends.rpc import RPCBackend

from ..enums import RunState
from ..runs import iso
from ..settings import Settings
from ..stores.base import Outcome, Store
from .clock import StoreClock
from .liveness import Liveness
from .sweeper import next_cursor

#: Result backend states that settle a run.
BACKEND_STATES = {"SUCCESS": RunState.DONE, "FAILURE": RunState.FAILED,
                  "REVOKED": RunState.CANCELLED}
#: Passes are this many heartbeat intervals apart.
EVERY_INTERVALS = 10


class Recovery:
    def __init__(self, app: Celery, store: Store, settings: Settings, liveness: Liveness,
                 clock: StoreClock, logger: logging.Logger) -> None:
        self.app = app
        self.store = store
        self.settings = settings
        self.liveness = liveness
        self.clock = clock
        self.logger = logger
        self.last = float("-inf")
        self.cursor: int | None = None

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
        settle = self.clock.now() - int(2 * self.settings.heartbeat_interval * 1000)
        limit = self.settings.recovery_batch
        runs = self.store.open_runs(before=settle, after=self.cursor, limit=limit)
        self.cursor = next_cursor(runs, limit)
        deadline = time.monotonic() + self.settings.heartbeat_interval / 2
        outcomes = []
        for run in runs:
            if time.monotonic() > deadline:
                self.cursor = run.since - 1  # go on from here (ties included) next time
                break
            self.liveness.keep_alive()
            if not run.task_id:
                continue
            try:
                result = self.app.AsyncResult(run.task_id)
                outcome = BACKEND_STATES.get(result.state)
                if outcome is None:
                    continue
                exc = result.result if outcome is RunState.FAILED else None
            except Exception as exc2:
                self.logger.debug("beat-claims: result backend lookup failed: %r", exc2)
                break
            outcomes.append(Outcome(
                run.entry, run.due, run.token, outcome,
                exc_type=type(exc).__name__ if exc is not None else "",
                exc_message=str(exc)[:500] if exc is not None else ""))
        if not outcomes:
            return
        for done, recorded in zip(outcomes, self.store.finish(outcomes)):
            if recorded:
                self.logger.info("beat-claims: %s due %s: %s (from the result backend)",
                                 done.entry, iso(done.due), done.state.value)
