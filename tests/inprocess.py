"""Schedulers driven tick by tick in this process, against the test's redis-server.

The broker is the same server's db 1: published messages are real and can be counted.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

from celery import Celery

from beat_claims.inspect import open_store
from beat_claims.runs import Owner
from beat_claims.scheduler import Scheduler

from .conftest import RedisServer

#: The beat that made a store's epoch before a test's beats started (:func:`settled_epoch`),
#: and its TTL: the new epoch's settle period.
SETTLER = Owner("settler", "test", 1, 0.0)
SETTLER_TTL = 0.3


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


def settled_epoch(app: Celery) -> None:
    """The store of ``app`` has run a while: its epoch exists and has settled, as after a
    beat with a short TTL that heartbeated a moment ago and stopped (it left). A beat made
    then joins at its first heartbeat (a recent heartbeat, no live beat), rather than
    after a new epoch's settle period of one of its TTLs (1.5 s at make_app's interval, 15 s
    at the default). For the tests that are not about a new store's start (its epoch, its
    settle period, its first registrations): call it on the fresh store, before the beats.
    """
    store = open_store(app)
    try:
        hb = store.heartbeat(SETTLER, SETTLER_TTL)
        store.leave(SETTLER)
        deadline = time.monotonic() + 10
        while store.now() < (hb.settle_until or 0):
            if time.monotonic() > deadline:
                raise AssertionError("the seeded epoch did not settle within 10s")
            time.sleep(0.02)
    finally:
        store.close()


def settled_epoch_at(url: str) -> None:
    """:func:`settled_epoch` of the store at ``url`` (any kind), as a beat of an app with
    that ``beat_claims_url`` opens it."""
    app = Celery("settler", set_as_current=False)
    app.conf.beat_claims_url = url
    settled_epoch(app)


def make(app: Celery, settle: bool = True) -> Scheduler:
    """A scheduler, ticked until the store has settled (a new store's epoch starts with a
    settling time of one heartbeat TTL) and its entries are registered."""
    s = Scheduler(app=app)
    if settle:
        settled(s)
    return s


def joined(app: Celery, *running: Scheduler) -> Scheduler:
    """A scheduler that joins ``running`` ones on the same store, ticked until it claims.

    A beat that joins claims nothing until every beat alive in the store has heartbeated
    since its first heartbeat, then heartbeats once more (beat/liveness.py, Joining). The
    running ones heartbeat at once (as each would within its interval), and then the new
    one: it joins within JOIN_CONFIRM whatever the interval, and none of the running ones
    lapses meanwhile (made one after the other without this, the new one waits until the
    others' heartbeats lapse, and takes them for dead)."""
    s = Scheduler(app=app)
    settled(s, running=running)
    return s


def beats(*apps: Celery) -> list[Scheduler]:
    """One scheduler per app, on one store, made one after another as a fleet's beats
    start: each joins the ones made before it (:func:`joined`)."""
    made: list[Scheduler] = []
    for app in apps:
        made.append(joined(app, *made))
    return made


def settled(*schedulers: Scheduler, timeout: float = 60,
            running: tuple[Scheduler, ...] = ()) -> None:
    """Tick each scheduler until the store has settled and it claims; the ``running`` ones
    are made to heartbeat whenever one waits to join (see :func:`joined`)."""
    deadline = time.monotonic() + timeout
    for s in schedulers:
        while not (s._ready and s.liveness.settling_for() == 0):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the store did not settle within {timeout}s: ready={s._ready},"
                    f" settling for {s.liveness.settling_for()}s, joined={s.liveness.join.joined}"
                    f" (waiting for {sorted(s.liveness.join.waiting_for)})")
            wait = s.tick()
            waited = [o for o in running if o.owner.id in s.liveness.join.waiting_for]
            for other in waited:
                other.liveness.lapse()
                other.tick()
            if waited:
                s.liveness.lapse()
            time.sleep(min(0.05, max(0.0, wait)))


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
