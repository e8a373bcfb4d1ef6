"""Every configuration error a newcomer makes is found before the loop starts, reported as
one clear line (two at most) naming the setting or entry, and the process exits non-zero;
no traceback for a user's mistake. A store that merely does not answer is an outage: the
beat keeps running. Real ``celery beat`` and ``celery worker`` processes; their lines are
counted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import RedisServer, free_port
from .processes import ROOT, fleet, wait_for
from .test_redis_client import SilentServer

pytestmark = pytest.mark.integration

#: Celery's own lines, not beat-claims': its banner, and the warning for running as root.
_CELERY = re.compile(r"celery beat v\\S+ .* is starting|SecurityWarning|superuser|absolutely"
                     r" not recommended|--uid option|User information|_warn_or_raise")


def run(kind: str, server: RedisServer, tmp_path: Path, conf: dict[str, Any] | None = None,
        schedule: dict[str, Any] | None = None, timeout: float = 40) -> tuple[int, list[str]]:
    """A ``celery beat`` or ``worker`` that must stop by itself: its exit code, and the
    lines of output that are not Celery's own."""
    args = (["beat", "-S", "claims", "-s", str(tmp_path / "s")] if kind == "beat" else
            ["worker", "-P", "solo", "--without-gossip", "--without-mingle"])
    env = {**os.environ, "BC_REDIS_URL": server.url, "BC_BROKER_URL": server.broker_url(),
           "BC_SCHEDULE": json.dumps(schedule or {"e": {"every": 5}}),
           "BC_CONF": json.dumps(conf or {}),
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "tests.proj.app", *args,
                           "--loglevel", "INFO"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    lines = [line for line in (done.stdout + done.stderr).splitlines()
             if line.strip() and not _CELERY.search(line)]
    return done.returncode, lines


def errors(lines: list[str]) -> list[str]:
    """What a user reads as the error: beat-claims' lines at error level or above, and any
    traceback."""
    return [line for line in lines if ("beat-claims:" in line and (
        "CRITICAL" in line or "ERROR" in line or not line.startswith("[")))
        or "Traceback" in line or line.lstrip().startswith("File \"")]


@pytest.mark.parametrize(("conf", "schedule", "names"), [
    ({"beat_claims_reclaim_afterr": 5}, None, ["beat_claims_reclaim_afterr",
                                               "did you mean beat_claims_reclaim_after"]),
    ({"beat_claims_heartbeat_interval": "soon"}, None, ["beat_claims_heartbeat_interval",
                                                        "'soon'"]),
    ({"beat_claims_catch_up_window": float("inf")}, None, ["beat_claims_catch_up_window"]),
    (None, {"x": {"every": 5, "claims": {"overlap": "sometimes"}}},
     ["entry 'x'", "overlap", "'sometimes'", "allow, skip"]),
    (None, {"x": {"every": 5, "claims": {"catchup": "all"}}}, ["entry 'x'", "catchup"]),
    ({"beat_claims_url": "redis://nosuchhost.invalid:6379/0"}, None,
     ["beat_claims_url", "cannot be resolved"]),
], ids=["typo", "not-a-number", "infinite", "bad-claims-value", "bad-claims-key",
        "unknown-host"])
def test_a_beat_misconfigured_says_what_in_one_line_and_exits(
        server: RedisServer, tmp_path: Path, conf: dict[str, Any] | None,
        schedule: dict[str, Any] | None, names: list[str]) -> None:
    code, lines = run("beat", server, tmp_path, conf, schedule)
    said = errors(lines)
    assert code != 0, lines
    assert 1 <= len(said) <= 2, said
    assert all(name in said[0] for name in names), said
    assert not any("Traceback" in line for line in lines), lines


def test_a_worker_misconfigured_refuses_to_start_in_one_line(
        server: RedisServer, tmp_path: Path) -> None:
    code, lines = run("worker", server, tmp_path, {"beat_claims_overlapp": "skip"})
    said = errors(lines)
    assert code != 0 and 1 <= len(said) <= 2, lines
    assert "beat_claims_overlapp" in said[0] and "beat_claims_worker_unprotected" in said[0]


def test_a_worker_told_to_run_unprotected_starts_and_says_so(
        server: RedisServer, tmp_path: Path) -> None:
    conf = {"beat_claims_overlapp": "skip", "beat_claims_worker_unprotected": True}
    with fleet(server.url, server.broker_url(), tmp_path, {},
               BC_CONF=json.dumps(conf)) as f:
        worker = f.worker(pool="solo")
        f.wait_log(worker, "ready.", 60)
        assert "runs periodic tasks unfenced" in f.log(worker)


def test_a_worker_says_what_it_protects_at_start(server: RedisServer, tmp_path: Path) -> None:
    with fleet(server.url, server.broker_url(), tmp_path, {}) as f:
        worker = f.worker(pool="solo")
        f.wait_log(worker, "ready.", 60)
        [line] = [line for line in f.log(worker).splitlines() if "beat-claims:" in line]
    assert "fencing" in line and f"127.0.0.1:{server.port}" in line and "'beat-claims'" in line


def test_a_store_that_does_not_answer_at_start_is_an_outage_not_an_error(
        server: RedisServer, tmp_path: Path) -> None:
    """Connection refused: the beat keeps running (fail closed), says so once."""
    port = free_port()
    conf = {"beat_claims_url": f"redis://127.0.0.1:{port}/0"}
    with fleet(server.url, server.broker_url(), tmp_path, {"e": {"every": 1}},
               BC_CONF=json.dumps(conf)) as f:
        beat = f.beat()
        f.wait_log(beat, "store unreachable", 30)
        wait_for(lambda: f.log(beat).count("Sending due task") == 0 and beat.poll() is None
                 and "beat: Starting" in f.log(beat), 5, "the beat to keep running")
        assert f.log(beat).count("store unreachable") == 1


def test_a_metrics_port_already_taken_leaves_the_beat_scheduling(
        server: RedisServer, tmp_path: Path) -> None:
    taken = SilentServer()  # listens on the port
    try:
        conf = {"beat_claims_metrics_port": taken.port}
        with fleet(server.url, server.broker_url(), tmp_path, {"e": {"every": 1}},
                   BC_CONF=json.dumps(conf)) as f:
            beat = f.beat()
            f.wait_log(beat, "Sending due task", 30)
            log = f.log(beat)
        assert f"beat_claims_metrics_port={taken.port} cannot be served" in log
        assert "one process per host" in log and "Traceback" not in log
    finally:
        taken.close()
