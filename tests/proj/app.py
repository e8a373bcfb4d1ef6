"""The Celery app the integration tests run in real ``celery beat`` and ``worker`` processes.

Configured from the environment so each test can shape the schedule:
``BC_REDIS_URL`` (store and result backend), ``BC_BROKER_URL``, ``BC_SCHEDULE`` (JSON:
name -> {"every": seconds} or {"cron": "minute spec"}, optional "task", "claims"),
``BC_HEARTBEAT`` and ``BC_RECLAIM_AFTER``. Every task records each execution in the
Redis list ``executions`` so the tests can count them.

An entry may also give ``kwargs``, a ``queue``, ``unencodable``: a value appended to
its args inside an object the serializer cannot encode, whose error quotes the value, and
``lazy_token``: a secret appended to its args that the beat evaluates at each send.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import time
import uuid
from datetime import timedelta
from typing import Any

import redis
from celery import Celery, signals
from celery.beat import BeatLazyFunc
from celery.schedules import crontab

import beat_claims

#: A test that finds a process stuck sends it this signal: every thread's stack goes to its
#: log (the evidence of where it hangs).
STACKS_SIGNAL = signal.SIGUSR2
with contextlib.suppress(AttributeError, OSError, ValueError):  # (a stderr with no file:
    faulthandler.register(STACKS_SIGNAL, all_threads=True)      # the CLI run in a test)

REDIS_URL = os.environ.get("BC_REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("proj")
app.conf.update(
    broker_url=os.environ.get("BC_BROKER_URL", REDIS_URL),
    result_backend=os.environ.get("BC_RESULT_BACKEND") or None,
    beat_claims_url=REDIS_URL,
    beat_claims_heartbeat_interval=float(os.environ.get("BC_HEARTBEAT", "1")),
    beat_claims_reclaim_after=float(os.environ.get("BC_RECLAIM_AFTER", "300")),
    beat_claims_catch_up_grace=float(os.environ.get("BC_GRACE", "3")),
    beat_scheduler="beat_claims.Scheduler",
    beat_max_loop_interval=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    task_acks_late=os.environ.get("BC_ACKS_LATE") == "1",
    task_reject_on_worker_lost=os.environ.get("BC_ACKS_LATE") == "1",
    timezone=os.environ.get("BC_TIMEZONE", "UTC"),
)
if os.environ.get("BC_CATCH_UP"):
    app.conf.beat_claims_catch_up = os.environ["BC_CATCH_UP"]
# Any other setting, as JSON (a misconfiguration to try, a pool start method, ...).
app.conf.update(json.loads(os.environ.get("BC_CONF", "{}")))


def _schedule() -> dict[str, Any]:
    spec = json.loads(os.environ.get("BC_SCHEDULE", "{}"))
    out: dict[str, Any] = {}
    for name, item in spec.items():
        sched: Any = (timedelta(seconds=item["every"]) if "every" in item
                      else crontab(minute=item["cron"]))
        entry: dict[str, Any] = {"task": "proj." + item.get("task", "record"), "schedule": sched,
                                 "args": item.get("args", []),
                                 "kwargs": item.get("kwargs", {})}
        if "unencodable" in item:
            entry["args"] = [*entry["args"], Unencodable(item["unencodable"])]
        if item.get("lazy_token"):
            entry["args"] = [*entry["args"], BeatLazyFunc(_fresh_token)]
        if "queue" in item:
            entry["options"] = {"queue": item["queue"]}
        if "claims" in item:
            entry["claims"] = item["claims"]
        out[name] = entry
    return out


def _fresh_token() -> str:
    """A secret the beat evaluates at each send (``BeatLazyFunc``), as one fetched from a
    vault would be: another for every message."""
    return f"token-{uuid.uuid4().hex}-SECRET"


class Unencodable:
    """An argument the JSON serializer cannot encode: its encoder's error quotes its value
    (as a custom type's own encoder may)."""

    def __init__(self, value: str) -> None:
        self.value = value

    def __json__(self) -> Any:
        raise ValueError(f"cannot encode {self.value}")


app.conf.beat_schedule = _schedule()
if os.environ.get("BC_ON_SENT_FAILS") == "1":
    # A schedule source whose bookkeeping after a send fails, its error quoting the
    # entry's arguments (a database's error echoing the row it could not write).
    from beat_claims.scheduler import Scheduler

    def _failing_on_sent(self: Any, entry: Any, claim: Any) -> None:
        raise ValueError(f"cannot record {entry.name}: {entry.args} {entry.kwargs}")

    Scheduler.on_sent = _failing_on_sent  # type: ignore[method-assign]
if os.environ.get("BC_LATENESS_WINDOW_MS"):
    # A beat's lateness counts over a shorter window than a minute, for a test's time.
    from beat_claims.beat import lateness

    lateness.WINDOW_MS = int(os.environ["BC_LATENESS_WINDOW_MS"])
if os.environ.get("BC_NO_INSTALL") != "1":  # a worker without the hooks
    beat_claims.install(app)

_store = redis.Redis.from_url(os.environ.get("BC_EXEC_URL", REDIS_URL), decode_responses=True)
_paused: list[int] = []


@signals.before_task_publish.connect
def _stall_publish(**kwargs: Any) -> None:
    """Test hooks, by environment, in beat processes: a publish that stalls.

    ``BC_PAUSE_FIRST_PUBLISH=1``: the first publish stops the whole process (SIGSTOP), as a
    paused VM would; ``BC_BLOCK_PUBLISH=1``: every publish blocks until the process is
    signalled, as a broker that stopped answering would; ``BC_SLOW_PUBLISH_FILE=PATH``:
    every publish takes the seconds that file holds, as a slow broker would.
    """
    if os.environ.get("BC_PAUSE_FIRST_PUBLISH") == "1" and not _paused:
        _paused.append(1)
        os.kill(os.getpid(), signal.SIGSTOP)
    if os.environ.get("BC_BLOCK_PUBLISH") == "1":
        while True:
            time.sleep(0.1)
    slow = os.environ.get("BC_SLOW_PUBLISH_FILE")
    if slow and os.path.exists(slow):
        with open(slow) as f:
            time.sleep(float(f.read() or 0))


@signals.task_received.connect
def _received(request: Any = None, **kwargs: Any) -> None:
    """``BC_NOTE_RECEIVED=1``: each message a worker receives is noted ("received", before
    it is fenced or run), so that a test can tell when a redelivery arrived."""
    if os.environ.get("BC_NOTE_RECEIVED") != "1" or request is None:
        return
    meta = (getattr(request, "request_dict", None) or {}).get("beat_claims") or {}
    _store.rpush("executions", json.dumps({
        "what": "received", "entry": meta.get("entry"), "due": meta.get("due"),
        "token": meta.get("token"), "task_id": request.id, "pid": os.getpid(),
        "hostname": request.hostname, "at": time.time(),
    }))


def _note(task: Any, what: str, **extra: Any) -> None:
    meta = getattr(task.request, "beat_claims", None) or {}
    _store.rpush("executions", json.dumps({
        "what": what, "entry": meta.get("entry"), "due": meta.get("due"),
        "token": meta.get("token"), "task_id": task.request.id, "pid": os.getpid(),
        "retries": task.request.retries, "hostname": task.request.hostname,
        "at": time.time(), **extra,
    }))


@app.task(bind=True, name="proj.record")
def record(self: Any, *args: Any) -> str:
    _note(self, "run")
    return "ok"


@app.task(bind=True, name="proj.fail")
def fail(self: Any) -> None:
    _note(self, "run")
    raise ValueError("boom: expected failure")


@app.task(bind=True, name="proj.flaky", max_retries=5, default_retry_delay=0.2)
def flaky(self: Any) -> str:
    _note(self, "run")
    if self.request.retries < 2:
        raise self.retry(countdown=0.2)
    return "third time"


@app.task(bind=True, name="proj.slow")
def slow(self: Any, seconds: float = 5.0, release: str | None = None) -> str:
    """Busy for ``seconds`` (sleeping); with ``release``, ended sooner once the test sets
    the key ``release:<release>`` in the executions' Redis (a busy task the test ends as
    soon as it has seen what it waited for, with a long ``seconds`` as the bound)."""
    _note(self, "run")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if release is not None and _store.exists(f"release:{release}"):
            break
        time.sleep(0.05)
    _note(self, "end")
    return "slept"


@app.task(bind=True, name="proj.spin")
def spin(self: Any, seconds: float = 5.0) -> str:
    """Busy for ``seconds`` without I/O or sleep: under gevent it never yields to the hub."""
    _note(self, "run")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass
    _note(self, "end")
    return "spun"


@app.task(bind=True, name="proj.alternating")
def alternating(self: Any) -> str:
    """Occurrences due on an even second take 2.5 s: outcomes arrive out of order."""
    _note(self, "run")
    due = (getattr(self.request, "beat_claims", None) or {}).get("due", "")
    if due and int(due[17:19]) % 2 == 0:
        time.sleep(2.5)
    _note(self, "end")
    return "ok"


@app.task(bind=True, name="proj.hangs", time_limit=1)
def hangs(self: Any) -> None:
    _note(self, "run")
    while True:
        time.sleep(0.05)


@app.task(bind=True, name="proj.reject_once")
def reject_once(self: Any) -> str:
    """Rejects its first delivery (requeued by the broker), then runs."""
    from celery.exceptions import Reject

    _note(self, "run")
    if _store.incr(f"rejected:{self.request.id}") == 1:
        raise Reject("not now", requeue=True)
    _note(self, "end")
    return "ok"


@app.task(bind=True, name="proj.reject")
def reject(self: Any) -> None:
    from celery.exceptions import Reject

    _note(self, "run")
    raise Reject("never", requeue=False)


@app.task(bind=True, name="proj.ignore")
def ignore(self: Any) -> None:
    from celery.exceptions import Ignore

    _note(self, "run")
    raise Ignore()


@app.task(bind=True, name="proj.replaced")
def replaced(self: Any) -> None:
    """Replaces itself with proj.record (which keeps the task id)."""
    _note(self, "run")
    raise self.replace(record.si())


# -- tasks whose exceptions quote their arguments (tests/test_secrets_stay_in_the_task.py) --
@app.task(bind=True, name="proj.secret_fail")
def secret_fail(self: Any, *args: Any, **kwargs: Any) -> None:
    _note(self, "run")
    raise ValueError(f"bad card {args} {kwargs}")


@app.task(bind=True, name="proj.secret_retry", max_retries=1, default_retry_delay=0.1)
def secret_retry(self: Any, *args: Any, **kwargs: Any) -> None:
    """Gives up after one retry: Celery's MaxRetriesExceededError prints the arguments."""
    _note(self, "run")
    raise self.retry(countdown=0.1)


@app.task(bind=True, name="proj.secret_reject")
def secret_reject(self: Any, *args: Any, **kwargs: Any) -> None:
    from celery.exceptions import Reject

    _note(self, "run")
    raise Reject(f"refusing {args} {kwargs}", requeue=False)


@app.task(bind=True, name="proj.secret_ignore")
def secret_ignore(self: Any, *args: Any, **kwargs: Any) -> None:
    from celery.exceptions import Ignore

    _note(self, "run")
    raise Ignore(f"nothing to record for {args} {kwargs}")


@app.task(bind=True, name="proj.secret_soft_limit", soft_time_limit=0.5)
def secret_soft_limit(self: Any, *args: Any, **kwargs: Any) -> None:
    from celery.exceptions import SoftTimeLimitExceeded

    _note(self, "run")
    try:
        while True:
            time.sleep(0.05)
    except SoftTimeLimitExceeded:
        raise SoftTimeLimitExceeded(f"too slow charging {args} {kwargs}") from None


@app.task(bind=True, name="proj.secret_hard_limit", time_limit=1)
def secret_hard_limit(self: Any, *args: Any, **kwargs: Any) -> None:
    _note(self, "run")
    while True:
        time.sleep(0.05)


@app.task(bind=True, name="proj.secret_slow")
def secret_slow(self: Any, *args: Any, **kwargs: Any) -> str:
    """Runs 6 s (long enough to be revoked while it runs)."""
    _note(self, "run")
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return "slept"
