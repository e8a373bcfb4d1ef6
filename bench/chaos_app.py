"""The Celery app the chaos run (``bench/chaos.py``) starts in real beat and worker processes.

Why a separate app: the chaos run must judge beat-claims by what actually executed, not by
what beat-claims recorded. So the task itself writes the ledger: one JSON line per execution
of its body, appended (``O_APPEND``, one ``write``) to a file that no chaos touches. A
delivery the worker's fencing refuses never reaches the body, so it is not in the ledger.

Configured from the environment by the chaos run:

``CHAOS_STORE_URL``   the beat-claims store (a redis-server, a SQLite file or a PostgreSQL
                      database: the chaos run's ``--store``);
``CHAOS_BROKER_URL``  the broker (another redis-server, never restarted);
``CHAOS_LEDGER``      the ledger file;
``CHAOS_SCHEDULE``    JSON ``{entry name: period in seconds}``;
``CHAOS_HEARTBEAT``, ``CHAOS_RECLAIM_AFTER``  beat-claims' timings;
``CHAOS_NO_FENCE=1``  workers without ``beat_claims.install(app)`` (a demonstration);
``CHAOS_PAUSE_FILE``  the pause trigger: the first beat to remove this file inside a publish
                      (after its check before publish) stops itself with SIGSTOP, as a VM
                      paused in the middle of a publish would.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from datetime import timedelta
from typing import Any

from celery import Celery, signals

import beat_claims

STORE_URL = os.environ.get("CHAOS_STORE_URL", "redis://127.0.0.1:6379/0")

app = Celery("chaos")
app.conf.update(
    broker_url=os.environ.get("CHAOS_BROKER_URL", STORE_URL),
    result_backend=None,
    task_ignore_result=True,
    beat_scheduler="beat_claims.Scheduler",
    beat_max_loop_interval=1,
    beat_claims_url=STORE_URL,
    beat_claims_heartbeat_interval=float(os.environ.get("CHAOS_HEARTBEAT", "1")),
    beat_claims_reclaim_after=float(os.environ.get("CHAOS_RECLAIM_AFTER", "10")),
    # Occurrences held through an outage (store down, beats dead or paused) run late rather
    # than being skipped: every due occurrence must show up in the ledger.
    beat_claims_catch_up="all",
    # Keep every run's record for the whole run, so a miss can be explained from the store.
    beat_claims_history_limit=int(os.environ.get("CHAOS_HISTORY_LIMIT", "5000")),
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    timezone="UTC",
)
app.conf.beat_schedule = {
    name: {"task": "chaos.record", "schedule": timedelta(seconds=float(period))}
    for name, period in json.loads(os.environ.get("CHAOS_SCHEDULE", "{}")).items()
}
if os.environ.get("CHAOS_NO_FENCE") != "1":  # --no-fence: what the fencing prevents
    beat_claims.install(app)

_LEDGER = os.environ.get("CHAOS_LEDGER", "chaos-ledger.jsonl")
_PAUSE_FILE = os.environ.get("CHAOS_PAUSE_FILE", "")


@signals.before_task_publish.connect
def _pause_inside_publish(**kwargs: Any) -> None:
    """In a beat: if the pause is armed, the first beat to disarm it stops dead here, after
    its check before publish (its claim is ``sending``) and before the message leaves."""
    if not _PAUSE_FILE:
        return
    try:
        os.unlink(_PAUSE_FILE)
    except FileNotFoundError:
        return
    os.kill(os.getpid(), signal.SIGSTOP)


@app.task(bind=True, name="chaos.record")
def record(self: Any) -> None:
    """One ledger line per execution of the body: (entry, due, token) from the
    ``beat_claims`` header, the executing process and the wall time it started."""
    at = time.time()
    meta = getattr(self.request, "beat_claims", None) or {}
    line = json.dumps({
        "entry": meta.get("entry"), "due": meta.get("due"), "token": meta.get("token"),
        "task_id": self.request.id, "worker": self.request.hostname or socket.gethostname(),
        "pid": os.getpid(), "at": at,
    }, separators=(",", ":")) + "\n"
    fd = os.open(_LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
