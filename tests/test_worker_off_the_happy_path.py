"""Fencing and outcomes off Celery's happy path, with real worker processes: every pool
and start method, Reject, Ignore, self.replace(), expiring duplicates, task_track_started,
a store that hangs, and beats using another store or prefix."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from beat_claims.enums import RunState
from beat_claims.runs import Owner, iso, task_id_for
from beat_claims.stores.base import Check, ClaimPlan, EntrySeed
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer, own_redis
from .processes import Fleet, executions, fleet, wait_for
from .test_redis_client import SilentServer

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("settled_store")]

BEAT = Owner("test-beat", "nowhere", 1, 1.0)


class Sent:
    """A run a beat claimed, checked and marked sent: its message is for the test to
    publish (once, or several times)."""

    def __init__(self, store: RedisStore, entry: str, prefix: str = "beat-claims") -> None:
        hb = store.heartbeat(BEAT, 60)
        [state] = store.register([EntrySeed(entry)]).values()
        due = (state.checkpoint or state.anchor) + 1000
        [result] = store.claim(BEAT, [ClaimPlan(entry, state, (due,))])
        [self.claim] = result.claims
        self.task_id = task_id_for(entry, due, prefix)
        store.check(BEAT, [Check(self.claim, self.task_id)])
        store.record_sent(BEAT, [self.claim])
        self.entry, self.due, self.store = entry, due, store
        self.header = {"entry": entry, "due": iso(due), "token": self.claim.token,
                       "prefix": prefix, "store": hb.store_id}

    def publish(self, app: Celery, task: str, times: int = 1, **options: Any) -> None:
        for _ in range(times):
            app.send_task(task, task_id=self.task_id, headers={"beat_claims": self.header},
                          **options)

    def record(self) -> Any:
        return next(r for r in self.store.history(self.entry) if r.due == self.due)


@pytest.fixture
def client_app(server: RedisServer) -> Iterator[Celery]:
    app = Celery("sender", set_as_current=False)
    app.conf.broker_url = server.broker_url()
    yield app
    app.close()


@pytest.fixture
def store(server: RedisServer) -> RedisStore:
    return RedisStore.from_url(server.url)


def _fleet(server: RedisServer, tmp_path: Path, **env: str) -> Any:
    return fleet(server.url, server.broker_url(), tmp_path, {}, **env)


def _runs(server: RedisServer, entry: str) -> list[dict[str, Any]]:
    return [r for r in executions(server.client()) if r["entry"] == entry]


def _ready(f: Fleet, worker: Any) -> None:
    f.wait_log(worker, "ready.", 60)


@pytest.mark.parametrize(("pool", "conf"), [
    ("prefork", {}),
    ("prefork", {"worker_pool_start_method": "spawn"}),
    ("solo", {}),
    ("threads", {}),
], ids=["prefork-fork", "prefork-spawn", "solo", "threads"])
def test_a_triple_delivery_runs_once_in_every_pool(
        server: RedisServer, tmp_path: Path, client_app: Celery, store: RedisStore,
        pool: str, conf: dict[str, Any]) -> None:
    sent = Sent(store, f"triple-{pool}")
    with _fleet(server, tmp_path, BC_CONF=json.dumps(conf)) as f:
        worker = f.worker(pool=pool)
        _ready(f, worker)
        sent.publish(client_app, "proj.record", times=3)
        wait_for(lambda: f.log(worker).count("refusing delivery") >= 2, 30,
                 "two of the three deliveries to be refused")
        wait_for(lambda: sent.record().state is RunState.DONE, 20, "the run to be done")
        assert len(_runs(server, sent.entry)) == 1
        assert "fencing " in f.log(worker)


def test_reject_with_requeue_runs_again_and_ends_done(
        server: RedisServer, tmp_path: Path, client_app: Celery, store: RedisStore) -> None:
    sent = Sent(store, "rejected-once")
    # Reject(requeue=True) puts the message back only when it is acknowledged late.
    with _fleet(server, tmp_path, BC_ACKS_LATE="1") as f:
        worker = f.worker()
        _ready(f, worker)
        sent.publish(client_app, "proj.reject_once")
        wait_for(lambda: sent.record().state is RunState.DONE, 30,
                 "the requeued delivery to run and finish")
    client = server.client()
    assert len([r for r in executions(client) if r["entry"] == sent.entry]) == 2
    assert len([r for r in executions(client, "end") if r["entry"] == sent.entry]) == 1


def test_reject_without_requeue_and_a_users_ignore_end_in_a_record(
        server: RedisServer, tmp_path: Path, client_app: Celery, store: RedisStore) -> None:
    rejected, ignored = Sent(store, "rejected"), Sent(store, "ignored")
    with _fleet(server, tmp_path) as f:
        worker = f.worker()
        _ready(f, worker)
        rejected.publish(client_app, "proj.reject")
        ignored.publish(client_app, "proj.ignore")
        wait_for(lambda: rejected.record().state.final and ignored.record().state.final, 30,
                 "both to be recorded")
    assert (rejected.record().state, rejected.record().exc_type) == (RunState.CANCELLED,
                                                                      "Reject")
    assert (ignored.record().state, ignored.record().exc_type) == (RunState.DONE, "Ignore")


def test_a_replaced_tasks_outcome_is_its_replacements(
        server: RedisServer, tmp_path: Path, client_app: Celery, store: RedisStore) -> None:
    sent = Sent(store, "replaced")
    with _fleet(server, tmp_path) as f:
        worker = f.worker()
        _ready(f, worker)
        sent.publish(client_app, "proj.replaced")
        wait_for(lambda: sent.record().state is RunState.DONE, 30,
                 "the replacement to finish the run")
        assert "refusing" not in f.log(worker)
    assert len(_runs(server, sent.entry)) == 2  # the task, then its replacement


def test_an_expired_duplicate_never_cancels_the_delivery_that_runs(
        server: RedisServer, tmp_path: Path, client_app: Celery, store: RedisStore) -> None:
    sent = Sent(store, "expiring")
    with _fleet(server, tmp_path) as f:
        worker = f.worker(concurrency=2)
        _ready(f, worker)
        sent.publish(client_app, "proj.slow", args=[2.0])
        wait_for(lambda: sent.record().state is RunState.STARTED, 20, "the first delivery")
        stale = datetime.now(timezone.utc) - timedelta(seconds=30)
        sent.publish(client_app, "proj.slow", args=[2.0], expires=stale)  # a stale copy
        wait_for(lambda: "expired" in f.log(worker).lower() or "revoked" in
                 f.log(worker).lower(), 20, "the copy to expire")
        assert sent.record().state is RunState.STARTED
        wait_for(lambda: sent.record().state.final, 20, "the run to finish")
    assert sent.record().state is RunState.DONE


def test_a_refused_duplicate_never_writes_over_the_result(
        server: RedisServer, tmp_path: Path, client_app: Celery, store: RedisStore) -> None:
    sent = Sent(store, "tracked")
    backend = f"redis://127.0.0.1:{server.port}/3"
    conf = {"task_track_started": True}
    with _fleet(server, tmp_path, BC_RESULT_BACKEND=backend, BC_CONF=json.dumps(conf)) as f:
        worker = f.worker()
        _ready(f, worker)
        sent.publish(client_app, "proj.record")
        wait_for(lambda: sent.record().state is RunState.DONE, 20, "the first delivery")
        sent.publish(client_app, "proj.record")  # a duplicate, after the result
        wait_for(lambda: f.log(worker).count("refusing delivery") >= 1, 20, "the refusal")
    meta = json.loads(server.client(db=3).get(f"celery-task-meta-{sent.task_id}") or "{}")
    assert meta.get("status") == "SUCCESS", meta


def test_a_store_that_hangs_costs_one_timeout_and_one_wait_per_outage(
        server: RedisServer, tmp_path: Path, client_app: Celery) -> None:
    """The worker's store accepts connections and never answers: the first delivery waits
    beat_claims_worker_timeout, then beat_claims_worker_store_wait for the store to come
    back; the others of the outage run at once (unfenced, logged once)."""
    hung = SilentServer()
    try:
        conf = {"beat_claims_url": f"redis://127.0.0.1:{hung.port}/0",
                "beat_claims_worker_timeout": 1.0, "beat_claims_worker_store_wait": 2.0}
        header = {"entry": "hangs", "due": "2026-12-01T00:00:00.000Z", "token": 1}
        with _fleet(server, tmp_path, BC_CONF=json.dumps(conf)) as f:
            worker = f.worker(pool="solo")
            _ready(f, worker)
            started = time.monotonic()
            for n in range(6):
                client_app.send_task("proj.record", task_id=f"hang-{n}",
                                     headers={"beat_claims": header})
            wait_for(lambda: len(_runs(server, "hangs")) >= 6, 30, "six deliveries to run")
            took = time.monotonic() - started
            log = f.log(worker)
            assert log.count("store unreachable") == 1, log
            assert log.count("store still unreachable after") == 1, log
        # One wait of 2 s from the outage's start (the worker's first call at ready, or the
        # first delivery's); the others ran at once: not a timeout or a wait per delivery.
        assert took < 7, took
    finally:
        hung.close()


def test_a_duplicate_delivered_while_the_store_restarts_waits_for_it_and_is_refused(
        broker: RedisServer, tmp_path: Path) -> None:
    """A delivery that meets its store down (a restart, a failover: here a redis-server
    SIGKILLed and started again on its data) waits for the store and is then fenced: a
    duplicate of a run that already ran is refused, not run unfenced."""
    with own_redis(["--appendonly", "yes", "--appendfsync", "always"]) as store_server:
        store = RedisStore.from_url(store_server.url)
        sent = Sent(store, "delivered-twice")
        app = Celery("sender", set_as_current=False)
        app.conf.broker_url = broker.url
        conf = {"beat_claims_worker_store_wait": 30.0}
        with fleet(store_server.url, broker.url, tmp_path, {}, BC_EXEC_URL=broker.url,
                   BC_CONF=json.dumps(conf)) as f:
            worker = f.worker(pool="solo")
            _ready(f, worker)
            sent.publish(app, "proj.record")
            wait_for(lambda: sent.record().state is RunState.DONE, 30, "the first delivery"
                     " to run")
            assert store_server.proc is not None
            store_server.proc.kill()  # SIGKILL: what was written is in the append-only file
            store_server.proc.wait(10)
            sent.publish(app, "proj.record")  # the duplicate, while the store is down
            f.wait_log(worker, "store unreachable", 30)
            store_server.start()
            f.wait_log(worker, "refusing delivery", 40)
            log = f.log(worker)
        app.close()
    runs = [r for r in executions(broker.client()) if r["entry"] == sent.entry]
    assert len(runs) == 1, (runs, log)
    assert "still unreachable" not in log, log


def test_deliveries_from_beats_on_another_prefix_are_named_as_such(
        server: RedisServer, tmp_path: Path, client_app: Celery, store: RedisStore) -> None:
    sent = Sent(store, "elsewhere", prefix="other-app")
    with _fleet(server, tmp_path) as f:
        worker = f.worker()
        _ready(f, worker)
        sent.publish(client_app, "proj.record")
        wait_for(lambda: _runs(server, "elsewhere"), 20, "the delivery to run")
        log = f.log(worker)
    assert "key prefix 'other-app'" in log and "'beat-claims'" in log
    assert "trimmed" not in log
