"""A delivery that meets its store down waits for it (``beat_claims_worker_store_wait``),
then asks it again: what that second asking may find. Real worker processes, a real
redis-server behind a TCP proxy that loses replies (``tests/faults.py``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from celery import Celery

from beat_claims.enums import RunState
from beat_claims.stores.redis import RedisStore, function_name

from .conftest import RedisServer
from .faults import proxy
from .processes import fleet, wait_for
from .test_redis_client import SilentServer
from .test_worker_off_the_happy_path import Sent, _ready, _runs, client_app, store

pytestmark = pytest.mark.integration

__all__ = ["client_app", "store"]  # (fixtures)


@pytest.mark.parametrize("pool", ["solo", "threads", "prefork", "gevent"])
def test_a_start_whose_reply_was_lost_runs_its_delivery_once(
        server: RedisServer, tmp_path: Path, client_app: Celery, store: RedisStore,
        pool: str) -> None:
    """The store started the run and its reply was lost: asked again once it answers, the
    store says this process started it already. That process is the delivery itself: it
    runs (once), it is not refused as its own duplicate."""
    if pool == "gevent":
        pytest.importorskip("gevent")
    sent = Sent(store, f"start-reply-lost-{pool}")
    with proxy(server.port) as lossy:
        conf = {"beat_claims_url": lossy.url(), "beat_claims_worker_store_wait": 30.0}
        with fleet(server.url, server.broker_url(), tmp_path, {},
                   BC_CONF=json.dumps(conf)) as f:
            worker = f.worker(pool=pool)
            _ready(f, worker)
            lossy.drop_reply_to(function_name("start"))
            sent.publish(client_app, "proj.record")
            wait_for(lambda: sent.record().state.final or "refusing" in f.log(worker), 30,
                     "the delivery to run and finish, or to be refused")
            wait_for(lambda: sent.record().state.final, 10, "the run to finish")
            log = f.log(worker)
        assert lossy.dropped, log
    assert "refusing" not in log, log
    assert sent.record().state is RunState.DONE, (sent.record(), log)
    assert len(_runs(server, sent.entry)) == 1, log


def test_a_store_that_answers_the_probe_and_fails_starts_costs_one_wait_not_one_per_delivery(
        server: RedisServer, tmp_path: Path, client_app: Celery, store: RedisStore) -> None:
    """Every start's reply is lost (the store answers reads: the probe finds it up, and
    the next start fails again): the outages that follow each other are one, and its
    wait is paid once; the deliveries after it run at once, not each after a wait of its
    own (a solo worker would hold its one slot that long for every task)."""
    runs = [Sent(store, f"flapping-{n}") for n in range(4)]
    wait = 4.0
    with proxy(server.port) as lossy:
        conf = {"beat_claims_url": lossy.url(), "beat_claims_worker_store_wait": wait}
        with fleet(server.url, server.broker_url(), tmp_path, {},
                   BC_CONF=json.dumps(conf)) as f:
            worker = f.worker(pool="solo")
            _ready(f, worker)
            lossy.drop_reply_to(function_name("start"), times=1000)
            started = time.monotonic()
            for sent in runs:
                sent.publish(client_app, "proj.record")
            wait_for(lambda: all(_runs(server, s.entry) for s in runs), 60,
                     "every delivery to run")
            took = time.monotonic() - started
            log = f.log(worker)
    assert lossy.dropped, log
    # One wait, and a failed start and a probe for each delivery: not a wait each.
    assert took < 2 * wait + 2, (took, log)
    assert log.count("store still unreachable after") == 1, log



def test_a_duplicate_whose_start_reply_was_lost_in_the_process_running_the_run_is_refused(
        server: RedisServer, tmp_path: Path, client_app: Celery, store: RedisStore) -> None:
    """The other side of the lost reply: a duplicate delivered to the very process (a pool
    of threads) whose other delivery runs the run. Its start's reply is lost, and asked
    again the store says this process started the run: another delivery here did, so
    the duplicate is refused, not taken for its own start."""
    sent = Sent(store, "duplicate-reply-lost")
    with proxy(server.port) as lossy:
        conf = {"beat_claims_url": lossy.url(), "beat_claims_worker_store_wait": 30.0}
        with fleet(server.url, server.broker_url(), tmp_path, {},
                   BC_CONF=json.dumps(conf)) as f:
            worker = f.worker(pool="threads", concurrency=2)
            _ready(f, worker)
            sent.publish(client_app, "proj.slow", kwargs={"seconds": 60, "release": "dup"})
            wait_for(lambda: sent.record().state is RunState.STARTED, 30, "the first delivery")
            lossy.drop_reply_to(function_name("start"))
            sent.publish(client_app, "proj.slow", kwargs={"seconds": 60, "release": "dup"})
            wait_for(lambda: "refusing delivery" in f.log(worker) or
                     len(_runs(server, sent.entry)) > 1, 30, "the duplicate to be refused")
            server.client().set("release:dup", "1")
            wait_for(lambda: sent.record().state.final, 30, "the run to finish")
            log = f.log(worker)
        assert lossy.dropped, log
    assert len(_runs(server, sent.entry)) == 1, log
    assert "already started by this process" in log, log


def test_a_delivery_from_beats_on_another_prefix_does_not_wait_for_the_store(
        server: RedisServer, tmp_path: Path, client_app: Celery) -> None:
    """Deliveries from beats using another key prefix run unfenced here whatever the store
    says: an outage of the store does not hold them for its wait."""
    hung = SilentServer()
    try:
        conf = {"beat_claims_url": f"redis://127.0.0.1:{hung.port}/0",
                "beat_claims_worker_timeout": 1.0, "beat_claims_worker_store_wait": 20.0}
        header = {"entry": "elsewhere", "due": "2026-12-01T00:00:00.000Z", "token": 1,
                  "prefix": "other-app"}
        with fleet(server.url, server.broker_url(), tmp_path, {},
                   BC_CONF=json.dumps(conf)) as f:
            worker = f.worker(pool="solo")
            _ready(f, worker)
            f.wait_log(worker, "store unreachable", 30)  # (its first call, at ready)
            started = time.monotonic()
            client_app.send_task("proj.record", task_id="elsewhere-1",
                                 headers={"beat_claims": header})
            wait_for(lambda: _runs(server, "elsewhere"), 40, "the delivery to run")
            took = time.monotonic() - started
            log = f.log(worker)
    finally:
        hung.close()
    assert took < 5, (took, log)
    assert "key prefix 'other-app'" in log, log
