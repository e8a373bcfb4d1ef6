"""``celery claims exporter``: the fleet's metrics read from the store, scraped over HTTP
from a real ``celery`` process; scrapes within the cache share one read."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from beat_claims import exporter
from beat_claims.enums import RunState
from beat_claims.runs import Owner, process_identity
from beat_claims.settings import Policy
from beat_claims.stores.base import (
    Check,
    ClaimPlan,
    Delivery,
    EntrySeed,
    Outcome,
    WorkerProcess,
)

from .conftest import RedisServer, free_port
from .processes import ROOT, wait_for
from .test_cli import Ran, one_line
from .test_cli_operations import STUCK, Target, hold_a_claim, targets

pytestmark = pytest.mark.integration

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]
WORKER = WorkerProcess("w1@host", 99, "boot:1")


@pytest.fixture(params=["redis", "sqlite"])
def target(request: pytest.FixtureRequest, server: RedisServer,
           tmp_path: Path) -> Iterator[Target]:
    yield from targets(request.param, server, tmp_path)


def parse(text: str) -> Series:
    out: Series = {}
    for line in text.splitlines():
        if not line.startswith("beat_claims_"):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        pairs = re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels)
        out[(name, frozenset(pairs))] = float(value)
    return out


def scrape(port: int) -> Series:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        return parse(reply.read().decode())


def get(series: Series, name: str, **labels: str) -> float | None:
    return series.get((f"beat_claims_{name}", frozenset(labels.items())))


def send_unstarted(t: Target, who: Owner, entry: str) -> tuple[int, int]:
    """A beat claims, checks and sends the entry's next occurrence (due, token)."""
    [found] = t.store.entries([entry])
    assert found.anchor is not None
    due = (found.checkpoint or found.anchor) + 1000
    [result] = t.store.claim(who, [ClaimPlan(entry, t.state(entry), (due,))])
    [claim] = result.claims
    t.store.check(who, [Check(claim, f"task-{entry}-{due}")])
    assert t.store.record_sent(who, [claim]) == 1
    return due, claim.token


def run_to_the_end(t: Target, who: Owner, entry: str, outcome: RunState) -> None:
    """A beat sends the entry's next occurrence; a worker starts it and records
    ``outcome``."""
    due, token = send_unstarted(t, who, entry)
    assert t.store.start(Delivery(entry, due, token, WORKER)).ok
    assert t.store.finish([Outcome(entry, due, token, outcome)]) == [True]


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """The metric selectors of a PromQL expression (name{label="value", ...})."""
    return [(name, dict(re.findall(r'(\w+)="([^"]*)"', labels)))
            for name, labels in re.findall(r"(beat_claims_\w+)\{([^}]*)\}", expr)]


Serve = Callable[..., "subprocess.Popen[bytes]"]


@pytest.fixture
def serve() -> Iterator[Serve]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(t: Target, port: int, *args: str, **env: str) -> subprocess.Popen[bytes]:
        environ = {**os.environ, "PYTHONPATH": str(ROOT), "BC_REDIS_URL": t.server.url,
                   "BC_BROKER_URL": t.server.broker_url(), "BC_SCHEDULE": "{}",
                   **t.conf(), **env}
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.proj.app", "claims", "exporter",
             "--port", str(port), "--addr", "127.0.0.1", *args], cwd=ROOT, env=environ,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)


def answering(port: int) -> Series | None:
    try:
        return scrape(port)
    except (urllib.error.URLError, ConnectionError):
        return None


def test_the_fleet_as_scraped_over_http(target: Target, serve: Serve) -> None:
    t = target
    t.store.heartbeat(STUCK, 120)
    t.store.register([EntrySeed(name, "every 1s") for name in (
        "nightly-billing", "reports", "stuck", "never-ran", "not-started")])
    run_to_the_end(t, STUCK, "nightly-billing", RunState.FAILED)
    run_to_the_end(t, STUCK, "nightly-billing", RunState.DONE)
    run_to_the_end(t, STUCK, "reports", RunState.FAILED)
    t.store.pause("reports", "ops", "quarter end")
    t.store.request_run("nightly-billing", "ops")  # manual: not the schedule's lateness
    hold_a_claim(t, "stuck")
    send_unstarted(t, STUCK, "not-started")  # no worker ever starts it
    port = free_port()
    proc = serve(t, port, "--cache", "0.5", BC_RECLAIM_AFTER="1", BC_CONF=json.dumps(
        {"beat_claims_url": t.url, "beat_claims_unstarted_after": 1}))
    wait_for(lambda: proc.poll() is not None or answering(port), 30, "the exporter")
    assert proc.poll() is None, proc.communicate()
    # The claim of "stuck" becomes older than reclaim_after (1 s) a second after it was made;
    # the run of "not-started" is sent and not started for more than 1 s then too.
    m = wait_for(lambda: (s := scrape(port)) and get(s, "fleet_stale_claims") == 1
                 and get(s, "fleet_unstarted_runs") == 1 and s, 15,
                 "the stale claim and the run sent and not started to be counted")
    assert get(m, "fleet_up") == 1
    assert (get(m, "fleet_beats_alive"), get(m, "fleet_beats_registered")) == (1, 1)
    assert (get(m, "fleet_entries"), get(m, "fleet_entries_not_exported")) == (5, 0)
    assert get(m, "entry_unstarted_runs", entry="not-started") == 1
    assert get(m, "entry_unstarted_runs", entry="nightly-billing") == 0

    runs = {r.due: r for r in t.store.history("nightly-billing")}
    done = next(r for r in runs.values() if r.state is RunState.DONE)
    assert done.sent_at and done.started_at and done.finished_at
    assert get(m, "entry_runs", entry="nightly-billing", state="done") == 1
    assert get(m, "entry_runs", entry="nightly-billing", state="failed") == 1
    assert get(m, "entry_runs", entry="nightly-billing", state="due") == 1
    assert get(m, "entry_runs", entry="nightly-billing", state="lost") == 0
    assert get(m, "entry_last_outcome_timestamp_seconds", entry="nightly-billing",
               state="done") == done.finished_at / 1000
    assert get(m, "entry_last_outcome_timestamp_seconds", entry="reports",
               state="failed") is not None
    assert get(m, "entry_last_finished_timestamp_seconds", entry="nightly-billing",
               state="done") == done.finished_at / 1000
    assert get(m, "entry_send_lateness_seconds", entry="nightly-billing") == pytest.approx(
        (done.sent_at - done.due) / 1000)
    assert get(m, "entry_start_lateness_seconds", entry="nightly-billing") == pytest.approx(
        (done.started_at - done.due) / 1000)
    assert get(m, "entry_paused", entry="reports") == 1
    assert get(m, "entry_paused", entry="nightly-billing") == 0
    assert get(m, "entry_send_lateness_seconds", entry="never-ran") is None

    # The README's alert uses these names: each selector finds its series, and it fires
    # for an entry without a success that is not paused, not for one that just succeeded.
    for name, labels in selectors(exporter.ALERT_EXAMPLE):
        assert any(n == name and set(labels.items()) <= set(ls) for n, ls in m), (name, labels)

    def fires(entry: str) -> bool:
        last = get(m, "entry_last_finished_timestamp_seconds", entry=entry, state="done")
        if last is not None:
            return time.time() - last > 26 * 3600
        return get(m, "entry_paused", entry=entry) == 0

    assert [e for e in ("nightly-billing", "reports", "never-ran") if fires(e)] == [
        "never-ran"]

    if t.kind == "redis":  # the store goes away: the exporter still answers, up is 0
        t.server.stop()
        down = wait_for(lambda: (s := scrape(port)) and get(s, "fleet_up") == 0 and s, 20,
                        "fleet_up to be 0")
        assert get(down, "entry_paused", entry="reports") is None
        taken = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.proj.app", "claims", "exporter",
             "--port", str(port), "--addr", "127.0.0.1"], cwd=ROOT, capture_output=True,
            text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT),
                                        "BC_REDIS_URL": t.server.url})
        line = one_line(Ran(taken.returncode, taken.stdout, taken.stderr))
        assert f"--port {port}: cannot serve" in line


def test_scrapes_within_the_cache_share_one_read() -> None:
    reads: list[float] = []
    gate = threading.Event()

    def read() -> exporter.Snapshot:
        gate.wait(5)
        reads.append(time.monotonic())
        return exporter.Snapshot(True, 0.01, entries=[exporter.entry_stats("e", False, [])])

    shared = exporter.FleetCollector(read, cache_seconds=3600)
    scrapes = [threading.Thread(target=lambda: list(shared.collect())) for _ in range(8)]
    for s in scrapes:
        s.start()
    gate.set()
    for s in scrapes:
        s.join(10)
    assert len(reads) == 1 and shared.reads == 1
    fresh = exporter.FleetCollector(read, cache_seconds=0)
    for _ in range(3):
        list(fresh.collect())
    assert fresh.reads == 3


def test_the_operating_page_shows_the_alert_this_test_file_checks() -> None:
    """The alert of docs/operating.md is ``exporter.ALERT_EXAMPLE``, the one checked above
    against real metrics (whitespace aside)."""
    page = (ROOT / "docs" / "operating.md").read_text()
    block = re.search(r"```promql\n(.*?)```", page, re.S)
    assert block is not None, "docs/operating.md has no promql block"
    assert block.group(1).split() == exporter.ALERT_EXAMPLE.split()


def test_a_beat_whose_process_is_gone_on_this_host_is_not_counted_alive(
        target: Target) -> None:
    # Its heartbeat has two minutes to run; its process (on this host) is gone.
    t = target
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    identity = process_identity(proc.pid)
    proc.kill()
    proc.wait()
    gone = Owner("d" * 16, socket.gethostname(), proc.pid, time.time(), identity or "")
    t.store.heartbeat(gone, 120)
    t.store.heartbeat(STUCK, 120)
    assert all(o.alive for o in t.store.owners())
    snap = exporter.read(t.store, lambda names: {}, Policy())
    assert (snap.beats_alive, snap.beats_registered) == (1, 2)
