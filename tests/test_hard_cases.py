"""The cases where schedulers of this kind ran work twice or lost it: real beats, a real
worker, a real redis-server (issue 4). Each test names the case it pins."""

from __future__ import annotations

import itertools
import signal
import time
from pathlib import Path

import pytest

from beat_claims.runs import RunState, iso
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer, seed_settled_epoch
from .processes import duplicates, executions, fleet, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def settled_store(server: RedisServer) -> None:
    """The store on the test's redis-server has run a while (a settled epoch): the cases
    here happen to a fleet that runs, not at a new store's start (tests/test_store_went_back.py,
    tests/contract), and their beats claim at once rather than after the new epoch's settle
    period of a TTL (3 s at the fleet's heartbeat of 1 s)."""
    seed_settled_epoch(server)


def consecutive(dues: list[int], period: int) -> bool:
    return all(b - a == period for a, b in itertools.pairwise(sorted(dues)))


def test_1_out_of_order_outcomes_never_rewind_the_checkpoint(
        server: RedisServer, tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    client = server.client()
    with fleet(server.url, server.broker_url(), tmp_path,
               {"alt": {"every": 1, "task": "alternating"}}) as f:
        f.worker(concurrency=4)
        f.beat()
        f.beat()
        wait_for(lambda: len(executions(client, "end")) >= 8, 40, "eight outcomes")
        rows = executions(client)
        ends = executions(client, "end")
    assert duplicates(rows) == {}
    # Outcomes did arrive out of order: an older run finished after a newer one.
    order = [e["due"] for e in ends]
    assert order != sorted(order)
    done = [r for r in store.history("alt") if r.state is RunState.DONE]
    assert len(done) >= 8
    checkpoint = store.entries(["alt"])[0].checkpoint
    assert checkpoint >= max(r.due for r in store.history("alt"))
    assert consecutive([r.due for r in store.history("alt")], 1000)


def test_2_and_5_a_stalled_claim_is_taken_over_and_the_stale_owner_cannot_run_it(
        server: RedisServer, tmp_path: Path) -> None:
    """A beat stops dead inside a publish (SIGSTOP, past its check). A long-lived beat that
    saw the claim alive takes it over once it is abandoned, without a restart; when the
    stale owner wakes, its message carries a superseded token and the worker refuses it."""
    store = RedisStore.from_url(server.url, "beat-claims")
    client = server.client()
    with fleet(server.url, server.broker_url(), tmp_path, {"e": {"every": 2}}) as f:
        worker = f.worker()
        stalled = f.beat(BC_PAUSE_FIRST_PUBLISH="1")
        f.wait_log(stalled, "Sending due task", 20)
        stuck = next(r for r in store.history("e") if r.state is RunState.SENDING)
        # It claims nothing until the stalled beat's heartbeat lapses (a beat that joins
        # waits for every live one): its grace covers that wait and a loaded host's slow
        # start, so the run it takes over is on time beside the next occurrence, not
        # skipped for catch-up.
        survivor = f.beat(BC_GRACE="60")
        f.wait_log(survivor, "took back 1 claim(s)", 20)
        run = wait_for(lambda: next((r for r in store.history("e")
                                     if r.due == stuck.due and r.state.final), None), 20,
                       "the taken-over run to finish")
        assert run.state is RunState.DONE and run.token > stuck.token
        assert run.reclaimed_from == stuck.owner
        stalled.send_signal(signal.SIGCONT)  # the stale owner wakes and publishes
        f.wait_log(worker, "superseded", 20)
        rows = executions(client)
    assert [r["token"] for r in rows if r["due"] == iso(stuck.due)] == [run.token]
    assert duplicates(rows) == {}


def test_3_a_stopped_beat_releases_what_it_did_not_send(
        server: RedisServer, tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    client = server.client()
    schedule = {f"e{i}": {"every": 2} for i in range(5)}
    with fleet(server.url, server.broker_url(), tmp_path, schedule) as f:
        f.worker()
        stopping = f.beat(BC_BLOCK_PUBLISH="1")  # claims five, blocks in the first publish
        f.wait_log(stopping, "Sending due task", 20)
        claimed = {(r.entry, r.due) for name in schedule for r in store.history(name)}
        assert len(claimed) == 5  # entries first seen together share their anchor
        # Another beat, to send them. It claims nothing until the stopping one has left (a
        # beat that joins waits for every live one): its grace covers that wait, so the
        # runs given back are on time beside the next occurrences, not skipped for catch-up
        # (on a loaded host too: it may start seconds late).
        f.beat(BC_GRACE="60")
        time.sleep(0.5)
        f.stop(stopping, signal.SIGTERM)
        assert "released 4 unsent claim(s)" in f.log(stopping)
        wait_for(lambda: claimed <= {(r["entry"], _ms(r["due"])) for r in executions(client)},
                 20, "every claimed occurrence to run")
        rows = executions(client)
        # The one past its check is due again, and sent once with a new token.
        assert "1 claim(s) being published when the stop came" in f.log(stopping)
    assert duplicates(rows) == {}
    for entry, due in claimed:
        run = next(r for r in store.history(entry) if r.due == due)
        assert run.state is not RunState.SKIPPED


def _ms(due: str) -> int:
    from datetime import datetime

    from beat_claims.runs import to_ms

    return to_ms(datetime.fromisoformat(due.replace("Z", "+00:00")))


def test_4_catch_up_all_and_latest_after_all_beats_were_down(
        server: RedisServer, tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    client = server.client()
    schedule = {"all": {"every": 1, "claims": {"catch_up": "all"}},
                "latest": {"every": 1}}
    with fleet(server.url, server.broker_url(), tmp_path, schedule, BC_GRACE="0.5") as f:
        f.worker(concurrency=1)  # one process: runs in the order they were sent
        first = f.beat()
        wait_for(lambda: len(executions(client)) >= 2, 20, "first runs")
        f.stop(first)
        stopped_at = int(time.time() * 1000)
        time.sleep(3.6)  # three occurrences of each fall due while no beat runs
        f.beat()
        wait_for(lambda: [r for r in store.history("all") if r.due > stopped_at + 3500
                          and r.state is RunState.DONE], 20, "the next regular run")
        # (one worker process runs them in the order sent: "latest" may come after "all")
        wait_for(lambda: [r for r in store.history("latest") if r.due > stopped_at
                          and r.state is RunState.DONE], 20, "a run of latest after the stop")
        rows = executions(client)
    assert duplicates(rows) == {}
    missed_all = [r for r in store.history("all") if stopped_at < r.due <= stopped_at + 3600]
    assert len(missed_all) >= 3
    assert {r.state for r in missed_all} == {RunState.DONE}
    ran = [r["due"] for r in rows if r["entry"] == "all"]
    assert ran == sorted(ran), "caught up oldest first"
    # Marked sent in due order (a batch's marks share one instant; never out of order).
    sent_at = [r.sent_at or 0 for r in sorted(missed_all, key=lambda r: r.due)]
    assert sent_at == sorted(sent_at)
    assert consecutive([r.due for r in store.history("all")], 1000)
    after_stop = sorted((r for r in store.history("latest") if r.due > stopped_at),
                        key=lambda r: r.due)
    states = [r.state for r in after_stop]
    skipped = states.index(RunState.DONE)
    assert skipped >= 2, states  # the missed ones, recorded skipped ...
    assert RunState.SKIPPED not in states[skipped:]  # ... then the newest, and regular runs
    assert all(r.reason == "catch_up" for r in after_stop[:skipped])


def test_6_store_refuses_writes_nothing_sent_unclaimed_then_catches_up(
        server: RedisServer, broker: RedisServer, tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    execs = broker.client()
    with fleet(server.url, broker.url, tmp_path, {"e": {"every": 1,
                                                        "claims": {"catch_up": "all"}}},
               BC_EXEC_URL=broker.url, BC_GRACE="0.5") as f:
        f.worker()
        beat = f.beat()
        wait_for(lambda: len(executions(execs)) >= 2, 20, "first runs")
        admin = server.client()
        admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # read-only from now on
        try:
            outage_start = time.time()
            f.wait_log(beat, "store unreachable", 10)
            time.sleep(4)
            during = [r for r in executions(execs) if r["at"] > outage_start + 1.5]
        finally:
            admin.execute_command("REPLICAOF", "NO", "ONE")
        f.wait_log(beat, "store reachable again", 20)
        time.sleep(3)
        rows = executions(execs)
        log = f.log(beat)
    assert during == [], "nothing was sent while the store refused writes"
    assert log.count("store unreachable") == 1
    assert duplicates(rows) == {}
    dues = [r.due for r in store.history("e")]
    assert consecutive(dues, 1000), "the occurrences missed during the outage ran, in order"
    assert len(rows) >= 8


def test_7_store_wiped_does_not_rerun_what_ran(
        server: RedisServer, broker: RedisServer, tmp_path: Path) -> None:
    execs = broker.client()
    with fleet(server.url, broker.url, tmp_path, {"e": {"every": 1}, "f": {"every": 2}},
               BC_EXEC_URL=broker.url) as f:
        f.worker()
        f.beat()
        f.beat()
        wait_for(lambda: len(executions(execs)) >= 4, 20, "first runs")
        before = {(r["entry"], r["due"]) for r in executions(execs)}
        last = {name: max(d for e, d in before if e == name) for name in ("e", "f")
                if any(e == name for e, _ in before)}
        server.restart()
        wait_for(lambda: len(executions(execs)) >= len(before) + 4, 30, "runs after the wipe")
        rows = executions(execs)
    assert duplicates(rows) == {}
    after = [(r["entry"], r["due"]) for r in rows][len(before):]
    assert all(due > last[entry] for entry, due in after if entry in last)


def test_claims_of_a_killed_beat_on_this_host_are_taken_over_before_its_heartbeat_expires(
        server: RedisServer, tmp_path: Path) -> None:
    """Same host, pid gone: known dead at once, whatever its heartbeat TTL (here 90 s)."""
    store = RedisStore.from_url(server.url, "beat-claims")
    client = server.client()
    with fleet(server.url, server.broker_url(), tmp_path, {"e": {"every": 2}}) as f:
        f.worker()
        # A first beat starts the store's epoch (whose settling time is its heartbeat TTL).
        first = f.beat(BC_SCHEDULE="{}")
        f.wait_log(first, "entries registered", 20)
        f.stop(first)
        victim = f.beat(BC_HEARTBEAT="30", BC_BLOCK_PUBLISH="1")
        f.wait_log(victim, "Sending due task", 20)
        stuck = next(r for r in store.history("e") if r.state is RunState.SENDING)
        # It claims nothing until the victim is gone (a beat that joins waits for every
        # live one): its grace covers that wait and a loaded host's slow start (11 s after
        # the stuck run's instant, once, in a CI run), so the run it takes over is on time
        # beside the next occurrence, not skipped for catch-up.
        survivor = f.beat(BC_GRACE="60")
        time.sleep(1.5)
        f.stop(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        f.wait_log(survivor, "(its owner is gone)", 10)
        assert time.monotonic() - killed_at < 10  # not the 90 s heartbeat TTL
        wait_for(lambda: iso(stuck.due) in {r["due"] for r in executions(client)}, 15,
                 "the taken-over run")
        assert duplicates(executions(client)) == {}
