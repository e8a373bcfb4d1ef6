"""Who a process is, on its host, whatever the wall clock does.

A beat's owner record and a worker's start of a run carry ``runs.process_identity(pid)``:
on Linux the boot's id and the process's start in clock ticks since boot, read from
/proc. psutil's ``create_time()`` is ticks since boot plus ``boot_time()``, which the
kernel derives from the wall clock: after ``date -s '+1 hour'`` every process seems to
have started an hour later. The step is simulated as the kernel would make it, by shifting
psutil's ``boot_time`` (the machine's clock is not touched). A live process must not look
gone after it (a redelivery would run beside the first delivery; a live beat's claims
would be taken back), and a gone one must still look gone.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import psutil._pslinux as pslinux
import pytest
from celery import Celery
from celery.exceptions import Ignore

from beat_claims import worker
from beat_claims.runs import Owner, iso, process_identity, process_is_gone
from beat_claims.stores.base import Check, ClaimPlan, Delivery, EntrySeed, WorkerProcess
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer
from .inprocess import beats, make_app

pytestmark = pytest.mark.usefixtures("settled_store")

HOUR = 3600


def step_wall_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """What a step of the wall clock does to psutil: /proc/stat's btime moves with it."""
    real = pslinux.boot_time
    monkeypatch.setattr(pslinux, "boot_time", lambda: real() + seconds)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A live process of this host (a worker's pool process, another beat)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_live_process_is_not_gone_after_a_wall_clock_step_and_a_dead_one_is(
        monkeypatch: pytest.MonkeyPatch, child: subprocess.Popen[bytes]) -> None:
    host = socket.gethostname()
    identity = process_identity(child.pid)
    assert identity
    assert process_is_gone(host, child.pid, identity) is False
    step_wall_clock(monkeypatch, HOUR)
    assert process_identity(child.pid) == identity
    assert process_is_gone(host, child.pid, identity) is False, \
        "a live process is reported gone after the wall clock stepped +1h"
    child.kill()
    child.wait()
    assert process_is_gone(host, child.pid, identity) is True


def test_a_redelivery_is_refused_after_a_wall_clock_step_while_the_first_runs(
        server: RedisServer, monkeypatch: pytest.MonkeyPatch,
        child: subprocess.Popen[bytes]) -> None:
    """A live worker process on this host is executing a run; a redelivery of its message
    (another worker of the host) is refused as busy, before and after a step of the wall
    clock."""
    store = RedisStore.from_url(server.url)
    owner = Owner.current()
    store.heartbeat(owner, 30)
    [state] = store.register([EntrySeed("e")]).values()
    due = state.anchor + 1000
    [result] = store.claim(owner, [ClaimPlan("e", state, (due,))])
    [claim] = result.claims
    store.check(owner, [Check(claim, "tid-1")])
    store.record_sent(owner, [claim])
    host = socket.gethostname()
    first = WorkerProcess(f"w1@{host}", child.pid, process_identity(child.pid) or "")
    assert store.start(Delivery("e", due, claim.token, first, task_id="tid-1")).ok

    app = Celery("w", set_as_current=False)
    app.conf.update(beat_claims_url=server.url, broker_url=server.broker_url())
    monkeypatch.setattr(worker._context, "app", app)
    monkeypatch.setattr(worker._context, "store", None)

    @app.task(name="t.body")
    def body() -> None:
        return None

    meta = {"entry": "e", "due": iso(due), "token": claim.token}

    def redeliver() -> str:
        body.push_request(id="tid-1", hostname=f"w2@{host}", retries=0, beat_claims=meta)
        try:
            worker.fence(body)
            return "ran"
        except Ignore:
            return "refused"
        finally:
            body.pop_request()

    assert redeliver() == "refused"  # the starter is alive: busy
    step_wall_clock(monkeypatch, HOUR)  # NTP, or an operator, steps the clock forward
    assert redeliver() == "refused", \
        "after a wall-clock step the redelivery ran while the first delivery still runs"


def test_a_live_beat_on_the_same_host_stays_alive_after_a_wall_clock_step(
        server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beats on one host judge each other's process: a step of the wall clock must not
    make a live peer look gone (its claims would be taken back)."""
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1)}})
    a, b = beats(app, app)
    a.liveness.beat()
    b.liveness.beat()
    a.liveness.beat()
    assert b.owner.id in a.liveness.live_ids()
    step_wall_clock(monkeypatch, HOUR)
    a.liveness.beat()
    assert b.owner.id in a.liveness.live_ids(), \
        "a live beat on the same host is taken for dead after a wall-clock step"
    a.close()
    b.close()
