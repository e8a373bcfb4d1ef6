"""A bare ``app.send_task`` loop on one reused producer, run as a scheduler: the floor of
what a beat can publish with Celery (``--schedulers send_task`` in bench/dispatch.py).

It is loaded as ``celery beat -S`` loads any scheduler, and reads the same
``beat_schedule`` as PersistentScheduler and RedBeat in the benchmark (each entry's
``last_run_at`` plus its interval is its due instant T). At each tick it sends what is due
with ``app.send_task(name, args, producer=producer)``, the producer made once: no state
kept, no store, no check — Celery's publish alone, and the per-run cost of a scheduler
measured against it.
"""

from __future__ import annotations

import time
from typing import Any

from celery.beat import Scheduler


class BareSender(Scheduler):
    """Sends each ``beat_schedule`` entry once, at ``last_run_at + schedule``."""

    def setup_schedule(self) -> None:
        self._due: list[tuple[float, str, str, tuple[Any, ...]]] = sorted(
            ((spec["last_run_at"].timestamp() + spec["schedule"].total_seconds(), name,
              spec["task"], tuple(spec.get("args") or ()))
             for name, spec in (self.app.conf.beat_schedule or {}).items()),
        )
        self._next = 0
        self._producer: Any = None

    def tick(self, *args: Any, **kwargs: Any) -> float:
        now = time.time()
        due = self._due
        if self._next < len(due) and due[self._next][0] <= now:
            if self._producer is None:
                self._producer = self.app.amqp.Producer(self.app.connection_for_write(),
                                                        auto_declare=False)
            while self._next < len(due) and due[self._next][0] <= now:
                _, _, task, task_args = due[self._next]
                self.app.send_task(task, args=task_args, producer=self._producer)
                self._next += 1
        if self._next < len(due):
            return max(0.0, min(self.max_interval, due[self._next][0] - time.time()))
        return self.max_interval

    def sync(self) -> None:
        return None

    @property
    def schedule(self) -> dict[str, Any]:
        return {}

    @property
    def info(self) -> str:
        return "bare send_task"
