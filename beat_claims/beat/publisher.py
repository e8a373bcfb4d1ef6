"""Publishing a claimed occurrence: the message Celery's beat would send, with the claim's
header, and the entry's arguments as evaluated for it (masked in any exception message).

The scheduler's ``_publish`` stays the hook a subclass or a test wraps: each claim is
published through it, then the schedule source's ``on_sent`` is told.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery import Celery
from celery.beat import ScheduleEntry, _evaluate_entry_args, _evaluate_entry_kwargs

from ..exception_text import entry_exception, frames
from ..runs import HEADER, from_ms, iso
from ..settings import Settings
from ..stores.base import Claim, RunRef
from .liveness import Liveness

#: Publishes one claimed occurrence of an entry with a task id: the message, or an error.
PublishHook = Callable[[ScheduleEntry, Claim, str], Any]


class Publisher:
    def __init__(self, app: Celery, settings: Settings, liveness: Liveness,
                 pinned: dict[RunRef, Any], logger: logging.Logger, *,
                 schedule: Callable[[], dict[str, Any]], entry_for: Callable[[Claim], Any],
                 hook: PublishHook, on_sent: Callable[[ScheduleEntry, Claim], None],
                 producer: Callable[[], Any], send_task: Callable[..., Any]) -> None:
        self.app = app
        self.settings = settings
        self.liveness = liveness
        self.pinned = pinned  # (the scheduler's: claims sent with the entry they were made with)
        self.logger = logger
        self.schedule = schedule
        self.entry_for = entry_for
        self.hook = hook
        self.on_sent = on_sent
        self.producer = producer
        self.send_task = send_task
        #: The entry last published, with its arguments as evaluated for that publish.
        self.evaluated: tuple[str, Any, Any] | None = None
        #: The instant last published (UTC ms), as its header and ``last_run_at`` give it:
        #: the runs of a burst mostly share it.
        self._instant: tuple[int, str | None, datetime] = (-1, None, from_ms(0))

    def publish_claim(self, claim: Claim, task_id: str) -> Any:
        entry = self.entry_for(claim)
        result = self.hook(entry, claim, task_id)
        self.pinned.pop(claim.ref, None)
        try:
            self.on_sent(entry, claim)
        except Exception as exc:
            # A schedule source's error may quote the entry's arguments (a database's
            # error echoing the row it could not write): logged as a publish error is.
            self.logger.error("beat-claims: on_sent(%r) failed: %s\n%s", claim.entry,
                              entry_exception(exc, self.arguments(claim.entry),
                                              self.settings),
                              frames(exc))
        return result

    def arguments(self, name: str) -> tuple[Any, Any] | None:
        """The entry's (args, kwargs), for masking them in exception messages: as
        scheduled, and as last evaluated for a publish (a lazy argument's value); None for
        an entry this beat does not have. A claim held from an older definition of the
        entry (pinned) may carry other arguments: those are masked too."""
        entry = self.schedule().get(name)
        older = list({id(e): e for r, e in self.pinned.items() if r.entry == name}.values())
        if entry is None and not older:
            return None
        if entry is None:
            entry, older = older[0], older[1:]
        args: list[Any] = [entry.args, *(e.args for e in older)]
        kwargs: list[Any] = [list((e.kwargs or {}).values()) for e in older]
        evaluated = self.evaluated
        if evaluated is not None and evaluated[0] == name:
            args += [evaluated[1], list((evaluated[2] or {}).values())]
        if len(args) == 1:
            return entry.args, entry.kwargs
        return args, [list((entry.kwargs or {}).values()), *kwargs]

    def publish(self, entry: ScheduleEntry, claim: Claim, task_id: str) -> Any:
        """The message for one claimed occurrence, through the task's own ``apply_async``
        when this app has the task (its routing and options), else ``send_task``."""
        if self._instant[0] != claim.due:
            self._instant = (claim.due, iso(claim.due), from_ms(claim.due))
        _, due_text, due_at = self._instant
        if self.logger.isEnabledFor(logging.INFO):
            self.logger.info("Scheduler: Sending due task %s (%s) due %s token %d",
                             entry.name, entry.task, due_text, claim.token)
        # Copy, never mutate, the entry's options and headers (apply_async copies shallowly).
        options = dict(entry.options)
        headers = dict(options.get("headers") or {})
        headers["celery_beat_task"] = True
        headers["periodic_task_name"] = entry.name  # django-celery-results records it
        headers[HEADER] = {"entry": entry.name, "due": due_text, "token": claim.token,
                           "prefix": self.settings.key_prefix,
                           "store": self.liveness.store_id}
        options["headers"] = headers
        options["task_id"] = task_id
        args = _evaluate_entry_args(entry.args)
        kwargs = _evaluate_entry_kwargs(entry.kwargs)
        self.evaluated = (entry.name, args, kwargs)  # should the publish fail
        task = self.app.tasks.get(entry.task)
        if task is not None:
            result = task.apply_async(args, kwargs, producer=self.producer(), **options)
        else:
            result = self.send_task(entry.task, args, kwargs, producer=self.producer(),
                                    **options)
        entry.last_run_at = due_at
        entry.total_run_count += 1
        return result
