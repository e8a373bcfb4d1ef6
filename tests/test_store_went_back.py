"""A store that comes back empty (a restart without persistence) or older (an older RDB
snapshot): real beats, a real worker, a real redis-server restarted under them (the
integration tests), and schedulers ticked in this process with the restart placed at the
worst instant (between a claim and its check, before any heartbeat). The broker and the
ledger the tasks write live on another server, which keeps its data.

No occurrence a live beat knew was handed out runs again, no token is used twice, interval
entries keep their grid, and only what fell due while the store was away is left to the
catch-up policy."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from beat_claims.enums import Reason, RunState
from beat_claims.runs import Owner, iso
from beat_claims.scheduler import Scheduler
from beat_claims.stores.base import Check, CheckResult, Claim, Delivery, Outcome, WorkerProcess
from beat_claims.stores.redis import RedisStore

from .any_store import Worker
from .conftest import RedisServer, SnapshotServer, seed_settled_epoch
from .inprocess import beats, make, make_app, messages, occurrences_sent, run_for
from .processes import duplicates, executions, fleet, wait_for


def tokens_are_never_reused(rows: list[dict[str, object]]) -> None:
    dues_of: dict[tuple[object, object], set[object]] = defaultdict(set)
    for row in rows:
        dues_of[(row["entry"], row["token"])].add(row["due"])
    reused = {key: dues for key, dues in dues_of.items() if len(dues) > 1}
    assert reused == {}, reused


def _ms(due: object) -> int:
    from datetime import datetime

    return round(datetime.fromisoformat(str(due).replace("Z", "+00:00")).timestamp() * 1000)


@pytest.mark.integration
def test_an_older_snapshot_restored_mid_run_runs_nothing_twice_and_reuses_no_token(
        store_server: SnapshotServer, broker: RedisServer, tmp_path: Path) -> None:
    ledger = broker.client(db=2)
    schedule = {f"e{i}": {"every": 1} for i in range(3)}
    seed_settled_epoch(store_server)  # (the store ran before: the beats claim at once)
    with fleet(store_server.url, broker.broker_url(), tmp_path, schedule,
               BC_EXEC_URL=f"redis://127.0.0.1:{broker.port}/2") as f:
        f.worker(concurrency=2)
        beats = [f.beat(), f.beat()]
        wait_for(lambda: len(executions(ledger)) >= 6, 30, "runs before the snapshot")
        store_server.snapshot(tmp_path / "old.rdb")
        before = len(executions(ledger))
        wait_for(lambda: len(executions(ledger)) >= before + 9, 30,
                 "runs the snapshot does not know of")
        store_server.come_back(tmp_path / "old.rdb")
        restored_at = len(executions(ledger))
        wait_for(lambda: len(executions(ledger)) >= restored_at + 9, 40,
                 "runs after the restore")
        for beat in beats:
            f.wait_log(beat, "the store may have lost writes", 5)
        rows = executions(ledger)
    assert duplicates(rows) == {}
    tokens_are_never_reused(rows)


@pytest.mark.integration
def test_a_wiped_store_keeps_interval_grids_and_catch_up_all_misses_nothing(
        store_server: SnapshotServer, broker: RedisServer, tmp_path: Path) -> None:
    ledger = broker.client(db=2)
    schedule = {"grid": {"every": 1, "claims": {"catch_up": "all"}},
                "other": {"every": 2, "claims": {"catch_up": "all"}}}
    seed_settled_epoch(store_server)  # (the store ran before: the beats claim at once)
    with fleet(store_server.url, broker.broker_url(), tmp_path, schedule,
               BC_EXEC_URL=f"redis://127.0.0.1:{broker.port}/2") as f:
        f.worker(concurrency=2)
        beats = [f.beat(), f.beat()]
        wait_for(lambda: len(executions(ledger)) >= 5, 30, "runs before the wipe")
        store_server.come_back(None)  # a restart without persistence: empty
        wiped = time.time()
        wait_for(lambda: [r for r in executions(ledger)
                          if r["entry"] == "grid" and _ms(r["due"]) > (wiped + 6) * 1000],
                 40, "runs well after the wipe")
        for beat in beats:
            f.wait_log(beat, "the store may have lost writes", 5)
        rows = executions(ledger)
    assert duplicates(rows) == {}
    tokens_are_never_reused(rows)
    for name, period in (("grid", 1000), ("other", 2000)):
        dues = sorted(_ms(r["due"]) for r in rows if r["entry"] == name)
        gaps = [b - a for a, b in itertools.pairwise(dues)]
        # The same grid before and after the wipe, and every occurrence ran (caught up).
        assert gaps and set(gaps) == {period}, (name, gaps)


# -- in this process: the restart at the worst instant -----------------------------------
WORKER = WorkerProcess("w1@test", 11, "boot:11")
OTHER_WORKER = WorkerProcess("w2@test", 22, "boot:22")


def observer(server: RedisServer) -> RedisStore:
    """A store client of the test's own (a worker's, an operator's): it never heartbeats,
    so it reads a restarted server at once, where the beat's client first waits for its
    heartbeat to read the new epoch."""
    return RedisStore.from_url(server.url)


def published(broker: RedisServer) -> list[tuple[str, int]]:
    """(due, token) of every message beat-claims published, oldest first."""
    return [(m["claims"]["due"], m["claims"]["token"]) for m in messages(broker)
            if m["claims"]]


def check_with(s: Scheduler, before_first: Callable[[list[Claim]], None]) -> list[Claim]:
    """Make ``s``'s first check before publish call ``before_first(claims)`` first (a
    snapshot or a wipe at that instant); returns the claims of that check once made."""
    real = s.store.check
    victims: list[Claim] = []

    def check(owner: Owner, checks: Sequence[Check]) -> list[CheckResult]:
        if not victims:
            victims.extend(c.claim for c in checks)
            before_first(victims)
        return real(owner, checks)

    s.store.check = check  # type: ignore[method-assign]  # the object the sender holds
    return victims


def _restored_before_any_heartbeat(store_server: SnapshotServer, broker: RedisServer,
                                   tmp_path: Path, grace: float
                                   ) -> tuple[Scheduler, int, str]:
    """Two beats with a 30 s heartbeat interval; a snapshot; beat A alone sends the next
    occurrence and a worker runs it to the end; the store comes back from the snapshot,
    and B, whose heartbeat is not due, ticks for 4 s (its first call is a claim). Returns
    B and the occurrence the snapshot does not know was sent and done."""
    seed_settled_epoch(store_server)
    app = make_app(store_server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=2)}},
                   broker=broker, beat_claims_heartbeat_interval=30,
                   beat_claims_catch_up_grace=grace)
    a, b = beats(app, app)
    wait_for(lambda: a.claimer.states["e"].checkpoint and b.claimer.states["e"].checkpoint,
             10, "both beats to see a checkpoint", interval=0.05,
             between=lambda: (a.tick(), b.tick()))
    store_server.snapshot(tmp_path / "old.rdb")
    first = len(published(broker))
    wait_for(lambda: len(published(broker)) > first, 10, "A to send the next occurrence",
             interval=0.05, between=a.tick)
    due_iso, token = published(broker)[-1]
    due = next(r.due for r in a.store.history("e") if iso(r.due) == due_iso)
    assert a.store.start(Delivery("e", due, token, WORKER)).ok
    assert a.store.finish([Outcome("e", due, token, RunState.DONE)]) == [True]
    store_server.come_back(tmp_path / "old.rdb")
    if grace < 2:  # B's first claim finds that occurrence past the short grace, as after a
        # restore that takes a while: for the catch-up policy to skip (never to send again)
        clock = observer(store_server)
        wait_for(lambda: clock.now() > due + int(grace * 1000) + 500, 10,
                 "the occurrence A sent to be past the grace", interval=0.05)
        clock.close()
    run_for(4, b)
    return b, due, due_iso


def test_a_restored_snapshot_is_noticed_before_a_claim_and_nothing_runs_twice(
        store_server: SnapshotServer, broker: RedisServer, tmp_path: Path) -> None:
    """The first call of beat B after the restore is a claim, not a heartbeat (redis-py
    reconnects without a word): B must not claim from the snapshot's checkpoint and send
    again, with the same token, the occurrence A sent and a worker ran."""
    b, due, due_iso = _restored_before_any_heartbeat(store_server, broker, tmp_path, grace=10)
    tokens = [t for d, t in published(broker) if d == due_iso]
    verdict = (b.store.start(Delivery("e", due, tokens[-1], OTHER_WORKER)).verdict
               if len(tokens) > 1 else None)
    assert len(tokens) == 1, (f"{due_iso} published {len(tokens)} times with tokens {tokens};"
                              f" the worker's verdict on the second: {verdict}")


def test_a_restored_snapshot_is_noticed_before_a_claim_and_no_token_is_reused(
        store_server: SnapshotServer, broker: RedisServer, tmp_path: Path) -> None:
    """The same restore with a short grace: B's claim must not hand out the snapshot's next
    token again for a later occurrence (nor record the sent-and-done one skipped)."""
    b, due, due_iso = _restored_before_any_heartbeat(store_server, broker, tmp_path,
                                                     grace=0.5)
    by_token: dict[int, set[str]] = defaultdict(set)
    for d, t in published(broker):
        by_token[t].add(d)
    reused = {t: ds for t, ds in by_token.items() if len(ds) > 1}
    record = {r.due: r for r in b.store.history("e")}.get(due)
    assert not reused, (f"tokens used for two occurrences: {reused}; record of {due_iso}:"
                        f" {record and (record.state, record.reason)} (it was sent and done)")


def test_a_run_claimed_in_an_older_snapshot_and_sent_since_is_not_sent_again(
        store_server: SnapshotServer, broker: RedisServer, tmp_path: Path) -> None:
    """The snapshot (a BGSAVE, a lagging replica) is taken between a claim and its check:
    it holds the run 'claimed'. The beat sends it, a worker runs it; the store comes back
    from the snapshot. The beat registers the run it sent as sent, and its sweep must not
    take the snapshot's 'claimed' record for its own forgotten claim and send it again."""
    app = make_app(store_server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1),
                                        "claims": {"catch_up": "all"}}}, broker=broker)
    s = make(app)
    s.claimer.check_with_claim = False  # a claim, then its own check
    snap = tmp_path / "old.rdb"
    victims = check_with(s, lambda claims: store_server.snapshot(snap))
    worker = Worker(observer(store_server), broker)

    def step() -> None:
        s.tick()
        worker.step()

    wait_for(lambda: victims and iso(victims[0].due) in {d for _, d, _ in worker.executed}, 10,
             "the first checked claim to be sent and run", interval=0.05, between=step)
    epoch = s.liveness.epoch
    sweeps = []  # the beat's sweeps once it has noticed, registered again and settled
    real_sweep = s.sweeper.sweep

    def sweep(pick_up: bool = True) -> None:
        real_sweep(pick_up)
        if s.liveness.epoch != epoch and s.liveness.settling_for() == 0:
            sweeps.append(pick_up)

    s.sweeper.sweep = sweep  # type: ignore[method-assign]
    store_server.come_back(snap)
    wait_for(lambda: len(sweeps) >= 3, 30, "three sweeps of the beat after it noticed the"
             " store went back and settled", interval=0.05, between=step)
    target = iso(victims[0].due)
    runs_of_it = [t for _, d, t in worker.executed if d == target]
    sends = [t for d, t in published(broker) if d == target]
    assert len(runs_of_it) == 1, (f"{target} executed {len(runs_of_it)} times (tokens"
                                  f" {runs_of_it}; published with tokens {sends})")


@pytest.mark.parametrize("wipe", ["restart", "flushall"])
def test_a_claim_whose_run_a_wipe_removed_before_its_check_is_sent_not_dropped(
        store_server: SnapshotServer, broker: RedisServer, wipe: str) -> None:
    """The store is wiped between a claim and its check before publish: restarted without
    persistence (the beat's next call finds another server), or emptied in place (the
    check finds no such run). Either is the sign the store went back, not a claim to drop:
    the claim is registered again and sent (catch_up=all), or recorded; never lost."""
    app = make_app(store_server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1),
                                        "claims": {"catch_up": "all"}}}, broker=broker)
    s = make(app)
    s.claimer.check_with_claim = False  # a claim, then its own check

    def wiped(claims: list[Claim]) -> None:
        if wipe == "restart":
            store_server.come_back(None)
        else:
            store_server.client().flushall()

    victims = check_with(s, wiped)
    wait_for(lambda: victims, 10, "a check before publish", interval=0.05, between=s.tick)
    store = observer(store_server)

    def lost() -> list[str]:
        sent = {due for _, due in occurrences_sent(broker)}
        recorded = {r.due for r in store.history("e") if r.state.final}
        return [d for c in victims if (d := iso(c.due)) not in sent and c.due not in recorded]

    wait_for(lambda: not lost(), 12, "the claims the wipe removed to be sent or recorded",
             interval=0.05, between=s.tick)
    sent = occurrences_sent(broker)
    assert len(sent) == len(set(sent)), "an occurrence was sent twice"


def test_overlap_skip_runs_again_after_a_wipe(store_server: SnapshotServer,
                                              broker: RedisServer) -> None:
    """After a wipe the runs a beat sent lately are registered again as sent, but their
    outcome was in the store that was lost and no worker reports them again: with
    overlap=skip they must not skip every later occurrence until run_timeout (a day)."""
    app = make_app(store_server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1),
                                        "claims": {"overlap": "skip"}}}, broker=broker)
    s = make(app)
    store = observer(store_server)
    worker = Worker(store, broker)

    def step() -> None:
        s.tick()
        worker.step()

    wait_for(lambda: len(worker.executed) >= 2, 10, "two runs sent and done", interval=0.05,
             between=step)
    store_server.come_back(None)  # wiped
    wiped = s.clock.now()

    def late() -> list[Any]:
        return [r for r in store.history("e") if r.due > wiped + 4000 and r.state.final]

    wait_for(lambda: len(late()) >= 2, 15, "occurrences due 4 s after the wipe to be"
             " recorded", interval=0.05, between=step)
    skipped = [iso(r.due) for r in late() if r.reason is Reason.OVERLAP]
    phantom = [iso(r.due) for r in store.history("e")
               if r.state is RunState.SENT and r.due < wiped]
    assert not skipped, (f"{len(skipped)} of {len(late())} occurrences due 4 s or more after"
                         f" the wipe skipped (overlap) because of runs registered again as"
                         f" sent that no worker will report: {phantom[-3:]}")
