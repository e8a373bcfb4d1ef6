"""``celery claims health``: exit 0 for a fleet that sends what is due, else 1 naming each
failed check and why. Real ``celery`` processes, a real beat, real stores."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery.schedules import schedule

from beat_claims import health, occurrences
from beat_claims.definitions import validate
from beat_claims.enums import Origin, RunState
from beat_claims.settings import Policy
from beat_claims.stores.base import DefinitionWrite, EntrySeed, Reclaim, WriteStatus

from .conftest import RedisServer, free_port
from .processes import wait_for
from .test_cli import Ran, cli, step
from .test_cli_operations import STUCK, Target, hold_a_claim, targets

pytestmark = pytest.mark.integration


@pytest.fixture(params=["redis", "sqlite"])
def target(request: pytest.FixtureRequest, server: RedisServer,
           tmp_path: Path) -> Iterator[Target]:
    yield from targets(request.param, server, tmp_path)


SCHEDULE = {"tick": {"every": 1}, "hourly": {"every": 3600}}


def report(ran: Ran, code: int) -> dict[str, Any]:
    assert ran.code == code and "Traceback" not in ran.err, ran
    doc: dict[str, Any] = json.loads(ran.out)
    return doc


def items(doc: dict[str, Any], check: str) -> list[dict[str, Any]]:
    [found] = [c for c in doc["checks"] if c["name"] == check]
    return list(found["items"])


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)  # Redis: the test below
def test_a_live_beat_is_healthy_and_a_stopped_one_fails_the_probes(
        target: Target, tmp_path: Path) -> None:
    t = target
    t.settled()  # the beat claims at once, without settling first
    with t.fleet(tmp_path, SCHEDULE) as f:
        beat = f.beat()
        wait_for(lambda: any(r.state is RunState.SENT for r in t.store.history("tick")), 40,
                 "the beat to send tick")
        ran, probe = t.steps(step("health", "-j"), step("health", "--beat"), schedule=SCHEDULE)
        doc = report(ran, 0)
        assert doc["ok"] is True and doc["failed"] == []
        assert [c["name"] for c in doc["checks"]] == ["store", "beats", "claims", "overdue",
                                                   "unstarted", "schedules"]
        assert doc["grace_seconds"] == 33.0  # three heartbeats of 1 s, and 30 s
        assert probe.code == 0 and "ok    beat: 1 alive on host" in probe.out, probe

        f.stop(beat)  # SIGTERM: the beat leaves, it is known gone at once
        last = max(r.due for r in t.store.history("tick"))
        wait_for(lambda: t.store.now() > last + 2500, 10, "tick to be overdue by 1.5 s")
        probe, ran = t.steps(step("health", "--beat", "-j"), step("health", "--grace", "1", "-j"),
                             schedule=SCHEDULE)
        assert report(probe, 1)["failed"] == ["beat"]
        doc = report(ran, 1)
        assert doc["failed"] == ["beats", "overdue"]
        # tick's next occurrence, never claimed; and when the beat had claimed one ahead
        # as it stopped (a loaded host: it logs "released 1 unsent claim(s)"), that run,
        # released and due again.
        overdue = [(i["entry"], i["kind"]) for i in items(doc, "overdue")]
        assert ("tick", "not claimed") in overdue, overdue
        assert set(overdue) <= {("tick", "not claimed"), ("tick", "due again")}, overdue


@pytest.mark.parametrize("target", ["redis"], indirect=True)
def test_each_failing_check_is_named_with_why(target: Target) -> None:
    t = target
    url = f"redis://127.0.0.1:{free_port()}/0"
    down = report(cli(None, "health", "-j", BC_REDIS_URL=url, BC_BROKER_URL=url), 1)
    assert down["failed"] == ["store"] and "unreachable" in down["checks"][0]["detail"]

    # A beat that is alive but holds a claim and sends nothing: the claim gets older than
    # reclaim_after (1 s for this probe), and tick is never claimed.
    t.store.heartbeat(STUCK, 120)
    states = t.store.register([EntrySeed("tick", "every 1s"), EntrySeed("hourly", "1h")])
    held = hold_a_claim(t, "hourly")
    wait_for(lambda: t.store.now() > states["tick"].anchor + 2500, 10, "tick to be overdue")
    probe = {"BC_RECLAIM_AFTER": "1"}
    doc = report(t.cli("health", "--grace", "1", "-j", schedule=SCHEDULE, **probe), 1)
    assert doc["failed"] == ["claims", "overdue"]
    [stale] = items(doc, "claims")
    assert (stale["entry"], stale["owner"], stale["reclaim_after"]) == (
        "hourly", "stuck-host:4242", 1.0)
    assert [(i["entry"], i["kind"]) for i in items(doc, "overdue")] == [("tick", "not claimed")]

    # A paused entry is never overdue; a run due again that no beat takes is.
    t.store.pause("tick", "ops", "")
    assert t.store.reclaim([Reclaim("hourly", held, None)], "ops") == [True]
    [released] = [r for r in t.store.history("hourly") if r.due == held]
    since = int(released.extra.get("released_at") or 0)
    wait_for(lambda: t.store.now() > since + 1500, 10, "the released run to wait 1.5 s")
    ran = t.cli("health", "--grace", "1", schedule=SCHEDULE, **probe)
    assert ran.code == 1, ran
    lines = ran.out.splitlines()
    assert lines[0].startswith("ok    store: answered")
    assert lines[1].startswith("ok    beats: 1 alive of 1 registered: stuck-host:4242")
    assert lines[2].startswith("ok    claims:")
    assert lines[3].startswith("FAIL  overdue: 1 entr(ies) overdue by more than 1 s: hourly")
    assert lines[4].lstrip().startswith("entry=hourly kind=due again")
    assert lines[-1] == "unhealthy: overdue"


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
def test_an_entry_with_a_jitter_is_late_only_after_its_offset(target: Target) -> None:
    t = target
    anchor = t.store.register([EntrySeed("spread", "every 1s")])["spread"].anchor
    wait_for(lambda: t.store.now() > anchor + 2500, 10, "spread to be 1.5 s late")
    now = t.store.now()
    schedules = {"spread": schedule(timedelta(seconds=1))}
    late = health.overdue_check(t.store, now, schedules, 1.0, [])
    assert not late.ok and [i["entry"] for i in late.items] == ["spread"]
    spread = {"spread": Policy(jitter=3600)}
    offset = occurrences.jitter_offset("spread", anchor + 1000, 3600)
    jittered = health.overdue_check(t.store, now, schedules, 1.0, [], spread)
    assert jittered.ok is (anchor + 1000 + offset >= now - 1000), (offset, jittered)


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
def test_a_run_due_again_that_no_beat_takes_is_overdue_whatever_schedule_the_probe_has(
        target: Target) -> None:
    # A run requested of an entry no beat of this app schedules (another app's, or one
    # removed from the schedule): nobody claims it, and the probe says so after the grace.
    t = target
    t.store.register([EntrySeed("elsewhere", "every 60s")])
    due = t.store.request_run("elsewhere", "ops")
    assert due is not None
    wait_for(lambda: t.store.now() > due + 1500, 10, "the requested run to wait 1.5 s")
    # (one process for the probes of each schedule)
    late, within = t.steps(step("health", "--grace", "1", "-j"),
                           step("health", "--grace", "600", "-j"), schedule=SCHEDULE)
    [other] = t.steps(step("health", "--grace", "1", "-j"), schedule={"unrelated": {"every": 60}})
    for ran in (late, other):
        doc = report(ran, 1)
        assert doc["failed"] == ["beats", "overdue"], doc
        [late] = items(doc, "overdue")
        assert (late["entry"], late["kind"], late["in_schedule"]) == (
            "elsewhere", "due again", False), late
        assert late["late_seconds"] >= 1.5, late
    # Within the grace it is not late.
    doc = report(within, 1)
    assert doc["failed"] == ["beats"], doc


@pytest.mark.parametrize("target", ["redis"], indirect=True)
def test_a_beat_killed_on_this_host_is_dead_at_once_for_its_own_probe_status_and_health(
        target: Target, tmp_path: Path) -> None:
    # Two beats on this host with a 30 s heartbeat (their records lapse 90 s after the last
    # one: the probes, a CLI process, take a while on a loaded 2-core machine): one is
    # killed with SIGKILL and says nothing; its pid is gone on this host.
    t = target
    with t.fleet(tmp_path, SCHEDULE, BC_HEARTBEAT="30") as f:
        one, two = f.beat(), f.beat()
        wait_for(lambda: {o.owner.pid for o in t.store.owners() if o.alive}
                 >= {one.pid, two.pid}, 40, "both beats to heartbeat")
        assert report(t.cli("health", "--beat", str(one.pid), "-j", schedule=SCHEDULE),
                      0)["failed"] == []
        os.kill(one.pid, signal.SIGKILL)
        one.wait(5)
        killed_at = time.monotonic()
        [record] = [o for o in t.store.owners() if o.owner.pid == one.pid]
        assert record.alive  # its heartbeat has not lapsed: only its pid says it is gone

        calls = {"its": ("health", "--beat", str(one.pid), "-j"),
                 "other's": ("health", "--beat", str(two.pid), "-j"),
                 "by name": ("health", "--beat", f"{socket.gethostname()}:{one.pid}", "-j"),
                 "this host's": ("health", "--beat", "-j"),
                 "fleet": ("health", "-j"),
                 "status": ("status", "-j"),
                 # A pid no beat of this host has: not alive either.
                 "unknown": ("health", "--beat", "999999999", "-j"),
                 "bad": ("health", "--beat", "web-1:")}
        done = dict(zip(calls, t.steps(*(step(*args) for args in calls.values()),
                                       schedule=SCHEDULE)))
        took = time.monotonic() - killed_at
        assert t.store.now() < record.expires_at, "the probes ran before the heartbeat lapsed"

        its = report(done["its"], 1)
        assert its["failed"] == ["beat"], its
        [beat_check] = [c for c in its["checks"] if c["name"] == "beat"]
        assert str(one.pid) in beat_check["detail"], beat_check
        assert [i["alive"] for i in beat_check["items"]] == [False], beat_check
        assert report(done["by name"], 1)["failed"] == ["beat"]
        assert report(done["other's"], 0)["failed"] == []
        assert report(done["this host's"], 0)["failed"] == []  # the other beat is alive
        fleet_doc = json.loads(done["fleet"].out)
        [beats] = [c for c in fleet_doc["checks"] if c["name"] == "beats"]
        assert beats["ok"] and beats["detail"].startswith("1 alive of 2 registered"), beats
        status = report(done["status"], 0)
        assert {o["pid"]: o["alive"] for o in status["owners"]} == {
            one.pid: False, two.pid: True}, status["owners"]
        print(f"{len(calls)} probes, in one process, answered {took:.1f} s after the kill")
        unknown = report(done["unknown"], 1)
        assert unknown["failed"] == ["beat"], unknown
        bad = done["bad"]
        assert bad.code == 2 and "--beat" in bad.err and "HOST:PID" in bad.err, bad


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
def test_an_entry_created_at_run_time_is_overdue_like_one_of_beat_schedule(
        target: Target) -> None:
    """Every beat sends a dynamic entry, whatever its beat_schedule: the probe examines it
    too (the first --max-entries of them by name)."""
    t = target
    definition = validate("made-at-run-time", {"task": "proj.record",
                                               "schedule": {"every": 1}}).to_json()
    [made] = t.store.write_definitions([DefinitionWrite("made-at-run-time", definition, 0,
                                                        Origin.API, "ops")])
    assert made.status is WriteStatus.OK, made
    anchor = t.store.register([EntrySeed("made-at-run-time")])["made-at-run-time"].anchor
    wait_for(lambda: t.store.now() > anchor + 2500, 10, "the entry to be 1.5 s late")
    doc = report(t.cli("health", "--grace", "1", "-j", schedule={}), 1)
    assert [(i["entry"], i["kind"]) for i in items(doc, "overdue")] == [
        ("made-at-run-time", "not claimed")], doc
