"""Schedulers driven tick by tick in this process, against the test's redis-server.

The broker is the same server's db 1: published messages are real and can be counted.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

from celery import Celery

from beat_claims.scheduler import Scheduler

from .conftest import RedisServer


def make_app(server: RedisServer, schedule: dict[str, Any] | None = None,
             broker: RedisServer | None = None, **conf: Any) -> Celery:
    app = Celery("inproc", set_as_current=False)
    app.conf.update(
        broker_url=(broker or server).broker_url(),
        beat_claims_url=server.url,
        beat_claims_heartbeat_interval=0.5,
        beat_claims_catch_up_grace=2,
        beat_max_loop_interval=1,
        broker_connection_retry_on_startup=True,
    )
    app.conf.update(conf)
    app.conf.beat_schedule = schedule if schedule is not None else {
        "every-1s": {"task": "t.noop", "schedule": timedelta(seconds=1)},
    }
    return app


def make(app: Celery, settle: bool = True) -> Scheduler:
    """A scheduler, ticked until the store has settled (a new store's epoch starts with a
    settling time of one heartbeat TTL) and its entries are registered."""
    s = Scheduler(app=app)
    if settle:
        settled(s)
    return s


def settled(*schedulers: Scheduler, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    for s in schedulers:
        while not (s._ready and s.liveness.settling_for() == 0):
            if time.monotonic() > deadline:
                raise AssertionError("the store did not settle")
            time.sleep(min(0.05, max(0.0, s.tick())))


def run_for(seconds: float, *schedulers: Scheduler) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        waits = [s.tick() for s in schedulers]
        time.sleep(min([0.05, *waits]))


def messages(server: RedisServer) -> list[dict[str, Any]]:
    """``server``: the one whose db 1 is the broker."""
    """Every task message published to the broker's default queue, oldest first."""
    raw = server.client(db=1).lrange("celery", 0, -1)
    out = []
    for item in reversed(raw):  # kombu LPUSHes; consumers pop from the right
        body = json.loads(item)
        headers = body["headers"]
        out.append({"id": headers["id"], "task": headers["task"], "claims": headers.get(
            "beat_claims"), "headers": headers})
    return out


def occurrences_sent(server: RedisServer) -> list[tuple[str, str]]:
    return [(m["claims"]["entry"], m["claims"]["due"]) for m in messages(server)
            if m["claims"]]
