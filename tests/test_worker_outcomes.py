"""What became of each run, from a real prefork worker's signals; fencing at the worker."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from beat_claims.runs import RunState, iso, task_id_for
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer, seed_settled_epoch
from .processes import executions, fleet, next_due_in, wait_for
from .test_cli import cli_steps, step

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def settled(server: RedisServer) -> None:
    """Each test's beat starts on a store that has run a while (its epoch settled), so it
    claims at once: these tests are about the worker's side, not about a new store's settle
    period of one heartbeat TTL (tests/test_store_went_back.py, tests/contract)."""
    seed_settled_epoch(server)


#: How soon the first occurrence of the tests' slow entries (every 6 or 8 s: one run
#: at a time) comes once registered (next_due_in): about when the fleet is up, not a whole
#: period after its beat registers them.
FIRST_IN = 3.0


def final_runs(store: RedisStore, entry: str) -> list[Any]:
    return [r for r in store.history(entry) if r.state.final]


def first_final(store: RedisStore, entry: str, timeout: float = 30) -> Any:
    runs = wait_for(lambda: sorted(final_runs(store, entry), key=lambda r: r.due), timeout,
                    f"a final run of {entry}")
    return runs[0]


def test_outcomes_success_failure_retry_time_limit(server: RedisServer, tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    schedule = {
        "ok": {"every": 2},
        "boom": {"every": 2, "task": "fail"},
        "flaky": {"every": 4, "task": "flaky"},
        "limit": {"every": 4, "task": "hangs"},
    }
    client = server.client()
    with fleet(server.url, server.broker_url(), tmp_path, schedule) as f:
        f.worker()
        f.beat()
        ok = first_final(store, "ok")
        assert ok.state is RunState.DONE and ok.worker and ok.worker_pid
        assert ok.sent_at and ok.started_at and ok.finished_at
        boom = first_final(store, "boom")
        assert boom.state is RunState.FAILED
        # The type is kept; the message only with beat_claims_exception_messages.
        assert boom.exc_type == "ValueError" and not boom.exc_message
        flaky = first_final(store, "flaky")
        assert flaky.state is RunState.DONE
        attempts = [r for r in executions(client) if r["entry"] == "flaky"
                    and r["due"] == iso(flaky.due)]
        assert [a["retries"] for a in attempts] == [0, 1, 2]
        limit = first_final(store, "limit")
        assert limit.state is RunState.FAILED and limit.exc_type == "TimeLimitExceeded"
        # Each occurrence is in the history once (runs are keyed by due), with one outcome.
        for name in schedule:
            dues = [r.due for r in store.history(name)]
            assert len(dues) == len(set(dues))


def test_revoked_before_it_starts_is_cancelled(server: RedisServer, tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    app = Celery("ctl", set_as_current=False, broker=server.broker_url())
    client = server.client()
    with fleet(server.url, server.broker_url(), tmp_path, {"rev": {"every": 3}}) as f:
        worker = f.worker()
        f.wait_log(worker, "ready.")
        f.beat()
        anchor = wait_for(lambda: store.entries(["rev"])[0].anchor, 20, "the anchor")
        now = int(time.time() * 1000)
        k = (now + 1500 - anchor) // 3000 + 1
        due = anchor + k * 3000
        app.control.revoke(task_id_for("rev", due))
        run = wait_for(lambda: next((r for r in store.history("rev")
                                     if r.due == due and r.state.final), None), 20,
                       "the revoked run to be recorded")
        assert run.state is RunState.CANCELLED
        assert iso(due) not in {r["due"] for r in executions(client)}
        later = wait_for(lambda: [r for r in final_runs(store, "rev") if r.due > due], 10,
                         "the next run")
        assert later[0].state is RunState.DONE


@pytest.mark.parametrize("acks_late", [False, True])
def test_worker_killed_mid_task(server: RedisServer, tmp_path: Path, acks_late: bool) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    client = server.client()
    schedule = {"slow": {"every": 8, "task": "slow", "args": [3]}}
    env = {"BC_ACKS_LATE": "1"} if acks_late else {}
    next_due_in(server.url, schedule, FIRST_IN)
    with fleet(server.url, server.broker_url(), tmp_path, schedule, **env) as f:
        f.worker()
        f.beat()
        first = wait_for(lambda: executions(client), 45, "the slow task to start")[0]
        os.kill(first["pid"], signal.SIGKILL)
        run = wait_for(lambda: next((r for r in store.history("slow")
                                     if iso(r.due) == first["due"] and r.state.final), None),
                       30, "the killed run's outcome")
        runs = [r for r in executions(client) if r["due"] == first["due"]]
        ends = [r for r in executions(client, "end") if r["due"] == first["due"]]
        if acks_late:
            # Redelivered with the same token; the process that started it is gone: runs again.
            assert run.state is RunState.DONE
            assert len(runs) == 2 and runs[1]["pid"] != first["pid"]
            assert runs[0]["token"] == runs[1]["token"]
            assert len(ends) == 1
        else:
            assert run.state is RunState.FAILED and run.exc_type == "WorkerLostError"
            assert len(runs) == 1 and ends == []


def test_same_occurrence_delivered_twice_runs_once(server: RedisServer, tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    client = server.client()
    app = Celery("dup", set_as_current=False, broker=server.broker_url())
    schedule = {"dup": {"every": 8, "task": "slow", "args": [3]}}
    next_due_in(server.url, schedule, FIRST_IN)
    with fleet(server.url, server.broker_url(), tmp_path, schedule) as f:
        worker = f.worker()
        f.beat()
        first = wait_for(lambda: executions(client), 45, "the task to start")[0]
        header = {"beat_claims": {"entry": first["entry"], "due": first["due"],
                                  "token": first["token"]}}
        # While the first delivery runs, and again after it finished: both refused.
        app.send_task("proj.slow", [3], task_id=first["task_id"], headers=header)
        f.wait_log(worker, "refusing delivery", 20)
        wait_for(lambda: [r for r in executions(client, "end") if r["due"] == first["due"]], 20,
                 "the first delivery to finish")
        app.send_task("proj.slow", [3], task_id=first["task_id"], headers=header)
        wait_for(lambda: f.log(worker).count("refusing delivery") >= 2, 20, "second refusal")
        assert len([r for r in executions(client) if r["due"] == first["due"]]) == 1
        run = next(r for r in store.history("dup") if iso(r.due) == first["due"])
        assert run.state is RunState.DONE and run.extra.get("deliveries") == 1
        # A task sent by anyone else (no claim header) runs untouched.
        app.send_task("proj.record", task_id="not-from-beat")
        wait_for(lambda: any(r["task_id"] == "not-from-beat" for r in executions(client)), 20,
                 "the plain task to run")


def test_cli_json_matches_the_store(server: RedisServer, tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    schedule = {"ok": {"every": 1}, "boom": {"every": 1, "task": "fail"}}
    with fleet(server.url, server.broker_url(), tmp_path, schedule) as f:
        f.worker()
        f.beat()
        wait_for(lambda: len(final_runs(store, "ok")) >= 2 and final_runs(store, "boom"), 30,
                 "some outcomes")
        ran = cli_steps(server, [step("status", "--json"),
                                 step("history", "boom", "--limit", "3", "--json"),
                                 step("status")], schedule=schedule)  # (one process)
        assert all(r.code == 0 for r in ran), ran
        status, history = json.loads(ran[0].out), json.loads(ran[1].out)
        text = ran[2].out
    by_name = {e["name"]: e for e in status["entries"]}
    assert set(by_name) == {"ok", "boom"}
    assert [o["alive"] for o in status["owners"]] == [True]
    ok = by_name["ok"]
    info = store.entries(["ok"])[0]
    assert ok["anchor"] == iso(info.anchor)
    assert ok["next_due"] is not None and ok["next_due"] > ok["checkpoint"]
    assert ok["counts"]["done"] >= 2
    assert set(ok["counts"]) == {s.value for s in RunState}
    # The newest run handed to the broker: read while the beat runs, it may be being sent.
    assert ok["last_run"]["state"] in ("done", "started", "sent", "sending")
    stored = [r.as_dict() for r in store.history("boom")]  # it ran on meanwhile
    assert len(history["runs"]) <= 3
    assert [r["due"] for r in history["runs"]] == sorted(
        (r["due"] for r in history["runs"]), reverse=True)
    assert {r["due"] for r in history["runs"]} & {r["due"] for r in stored}
    failed = next(r for r in history["runs"] if r["state"] == "failed")
    assert failed["exc_type"] == "ValueError" and failed["task_id"]
    assert set(failed) >= {"entry", "due", "state", "token", "owner", "task_id", "sent_at",
                           "started_at", "finished_at", "worker", "exc_type", "exc_message"}
    assert "ok" in text and "boom" in text


def test_outcomes_recovered_from_the_result_backend_when_workers_lack_the_hooks(
        server: RedisServer, tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    schedule = {"ok": {"every": 1}, "boom": {"every": 1, "task": "fail"}}
    backend = f"redis://127.0.0.1:{server.port}/2"
    # A 0.5 s heartbeat: the beat's passes over the result backend are ten heartbeat
    # intervals apart (beat_claims/beat/recovery.py), 5 s here; the test waits for two.
    with fleet(server.url, server.broker_url(), tmp_path, schedule,
               BC_RESULT_BACKEND=backend, BC_HEARTBEAT="0.5") as f:
        f.worker(BC_NO_INSTALL="1")
        beat = f.beat()
        ok = first_final(store, "ok", 40)
        boom = first_final(store, "boom", 40)
        f.wait_log(beat, "from the result backend", 10)
        # ... and the beat says, once per entry, that the workers run them unfenced.
        f.wait_log(beat, "no worker recorded their start in the store", 20)
        said = len(f.log(beat))
        wait_for(lambda: "from the result backend" in f.log(beat)[said:], 40,
                 "a later pass to recover more outcomes")
        warned = [line for line in f.log(beat).splitlines() if "WARNING" in line
                  and "no worker recorded their start" in line]
    assert ok.state is RunState.DONE
    assert boom.state is RunState.FAILED and boom.exc_type == "ValueError"
    assert ok.started_at is None  # no worker hook ran: the backend told us
    named = [name for line in warned for name in ("ok", "boom") if f" {name}" in
             line.split(" ran (")[0]]
    assert sorted(named) == ["boom", "ok"], warned
    assert "beat_claims.install(app)" in warned[0]


def test_run_without_outcome_past_run_timeout_is_lost(server: RedisServer,
                                                      tmp_path: Path) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    schedule = {"slow": {"every": 6, "task": "slow", "args": [4],
                         "claims": {"run_timeout": 1}}}
    next_due_in(server.url, schedule, FIRST_IN)
    with fleet(server.url, server.broker_url(), tmp_path, schedule) as f:
        worker = f.worker()
        beat = f.beat()
        run = first_final(store, "slow", 45)
        assert run.state is RunState.LOST
        f.wait_log(beat, "recorded lost", 5)
        f.wait_log(worker, "succeeded", 15)
        # The execution that was presumed lost reports at last: it ran, and the record says
        # so (revived), with that delivery's token; the checkpoint is untouched.
        late = wait_for(lambda: next((r for r in store.history("slow") if r.due == run.due
                                      and r.state is RunState.DONE), None), 15,
                        "the late success to be recorded")
        assert late.token == run.token and late.extra.get("revived") is True
