"""Tasks of the test site: each execution is recorded in the broker's Redis (list
``executions``) so that the tests can count executions per occurrence.

Workers load it with ``-I tests.djangosite.tasks``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import shared_task

_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        from django.conf import settings

        _client = redis.Redis.from_url(settings.CELERY_BROKER_URL, decode_responses=True)
    return _client


@shared_task(bind=True, name="djangosite.record")
def record(self: Any, *args: Any, **kwargs: Any) -> str:
    meta = getattr(self.request, "beat_claims", None) or {}
    _redis().rpush("executions", json.dumps({
        "entry": meta.get("entry"), "due": meta.get("due"), "token": meta.get("token"),
        "periodic_task_name": getattr(self.request, "periodic_task_name", None),
        "task_id": self.request.id, "args": list(args), "kwargs": kwargs,
        "pid": os.getpid(), "at": time.time(),
    }))
    return "ok"
