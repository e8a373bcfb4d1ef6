"""MySQL only: a transaction a lock wait timeout (1205) or a deadlock (1213) stopped in the
middle of a batch of statements is run again from its start (its clock, its locks, its
reads): the call answers as if it had run once, a fencing token is handed out once, a run
is claimed once. With each client library installed."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, cast

import pymysql
import pytest

from beat_claims.runs import Owner
from beat_claims.stores.base import (
    ClaimPlan,
    ClaimStatus,
    EntrySeed,
    SendAtOnce,
    StoreError,
    WorkerProcess,
)
from beat_claims.stores.mysql import MySQLStore
from beat_claims.stores.mysql_driver import Driver

from .backend_mysql import BACKEND as backend_mysql
from .backend_mysql import (
    HOST,
    INSTALLED_DRIVERS,
    PASSWORD,
    PORT,
    USER,
    _drop_tables,
    with_driver,
)
from .helpers import A, at_once


@pytest.fixture(params=INSTALLED_DRIVERS)
def quick_store(request: pytest.FixtureRequest) -> Iterator[MySQLStore]:
    """The store through each library, waiting 1 s for a row lock (not 5)."""
    with backend_mysql.open(request, 100) as opened, with_driver(
            cast(MySQLStore, opened), request.param) as chosen:
        store = MySQLStore(dict(chosen._params), chosen.prefix, chosen.history_limit, 1.0)
        try:
            yield store
        finally:
            store.close()


def _holder(store: MySQLStore) -> Any:
    return pymysql.connect(host=HOST, port=PORT, user=USER, password=PASSWORD,
                           database=store.database, autocommit=False, charset="utf8mb4")


def test_a_claim_behind_a_lock_wait_timeout_runs_again_and_claims_once(
        quick_store: MySQLStore) -> None:
    store = quick_store
    states = store.register([EntrySeed("locked", "every 1s")])
    state = states["locked"]
    holder = _holder(store)
    with contextlib.closing(holder):
        holder.cursor().execute(f"SELECT name FROM {store.tables.entries} WHERE name = %s"
                                " FOR UPDATE", (b"locked",))
        answers: list[Any] = []
        claiming = threading.Thread(target=lambda: answers.append(store.claim(A, [ClaimPlan(
            "locked", state, (state.anchor + 1000,), send=SendAtOnce(("t-1",)))])))
        claiming.start()
        deadline = time.monotonic() + 30
        while store.retries < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        holder.rollback()  # (the lock released after the first wait gave up)
        claiming.join(30)
    assert store.retries >= 1
    [result] = answers[0]
    assert result.status is ClaimStatus.OK, result
    [claim] = result.claims
    assert claim.token > state.token
    assert [run.task_id for run in store.history("locked")] == ["t-1"]
    # the next call on the same session reads its own replies
    again = store.claim(A, [ClaimPlan("locked", result.state, (state.anchor + 2000,))])
    assert [c.token > claim.token for c in again[0].claims] == [True]


def test_a_statement_failing_in_the_middle_of_a_batch_leaves_the_session_usable(
        quick_store: MySQLStore) -> None:
    store = quick_store
    store.now()
    conn = store._db
    with pytest.raises(store.driver.Error):
        store._batch(conn, [("SELECT 1", ()), ("SELECT nothing FROM no_such_table", ()),
                            ("SELECT 3", ())])
    store._end(conn, commit=False)
    found = store._batch(conn, [("SELECT 4", ()), ("SELECT %s", (5,))])
    assert [c.fetchall() for c in found] == [[(4,)], [(5,)]]


@pytest.mark.parametrize("lost", [1, 2], ids=["reads", "writes-and-commit"])
def test_a_claim_whose_batch_reply_is_lost_is_claimed_once_when_asked_again(
        quick_store: MySQLStore, monkeypatch: pytest.MonkeyPatch, lost: int) -> None:
    """The reply of the claim's first batch (its reads: nothing written) or of its second
    (its writes and the COMMIT: all written) lost after the server ran it: the call fails,
    its session goes, and the claim asked again hands out no second token."""
    store = quick_store
    state = store.register([EntrySeed("e", "every 1s")])["e"]
    plan = ClaimPlan("e", state, (state.anchor + 1000,), send=SendAtOnce(("t-1",)))
    real, batches = Driver.run, []

    def losing(self: Driver, conn: Any, statements: Any) -> Any:
        found = real(self, conn, statements)
        batches.append(statements)
        if len(batches) == lost:
            raise SystemExit("the reply was lost")
        return found

    monkeypatch.setattr(Driver, "run", losing)
    with pytest.raises(SystemExit):
        store.claim(A, [plan])
    monkeypatch.setattr(Driver, "run", real)
    assert any(s == "COMMIT" for s, _ in batches[-1]) is (lost == 2)
    [again] = store.claim(A, [plan])
    history = store.history("e")
    assert [run.task_id for run in history] == ["t-1"]
    if lost == 2:  # committed: asked again, a conflict, the same token
        assert again.status is ClaimStatus.CONFLICT and again.claims == ()
        assert store.entries(["e"])[0].token == history[0].token
    else:  # nothing written: the claim asked again is the first
        assert again.status is ClaimStatus.OK and len(again.claims) == 1


def test_heartbeats_of_beats_at_once_never_deadlock(quick_store: MySQLStore) -> None:
    """Each heartbeat locks the store's own rows (the epoch) and its owner's row, and
    forgets lapsed owners (a DELETE that waits for every owner's row): taken in one order by
    all, beats heartbeating at the same instant wait for one another and none is run again
    for a deadlock (nor fails after RETRIES of them)."""
    store = quick_store
    sessions = [MySQLStore(dict(store._params), store.prefix, store.history_limit, 5.0)
                for _ in range(4)]
    failures: list[BaseException] = []

    def beat(s: MySQLStore, i: int) -> None:
        owner = Owner(f"beat-{i}", "contract-host", 100 + i, 1.0)
        deadline = time.monotonic() + 3
        try:
            while time.monotonic() < deadline:
                s.heartbeat(owner, 3.0, settling=i % 2 == 0)
        except StoreError as exc:
            failures.append(exc)

    at_once([lambda s=s, i=i: beat(s, i) for i, s in enumerate(sessions)], sessions)
    assert failures == []
    assert sum(s.retries for s in sessions) == 0


def test_the_first_heartbeats_of_a_new_stores_beats_at_once_never_deadlock(
        quick_store: MySQLStore) -> None:
    """On a new store the rows a heartbeat locks first (the epoch's) are not there yet, and
    a locking read of a missing row locks nothing: beats heartbeating for the first time at
    the same instant each wrote the rows the others had read, and deadlocked (33 retries in
    30 new stores of four beats). Heartbeats take turns on a row of their own, made by the first."""
    retries = 0
    for _ in range(12):
        prefix = f"first-{uuid.uuid4().hex[:8]}"
        sessions = [MySQLStore(dict(quick_store._params), prefix, 100, 5.0) for _ in range(4)]
        try:
            for s in sessions:
                s.now()  # each has set up the tables and is connected
            ready = threading.Barrier(len(sessions))

            def first(s: MySQLStore, i: int, ready: threading.Barrier = ready) -> None:
                ready.wait(10)
                s.heartbeat(Owner(f"beat-{i}", "contract-host", 100 + i, 1.0), 3.0,
                            settling=i % 2 == 0)

            at_once([lambda s=s, i=i: first(s, i) for i, s in enumerate(sessions)])
            retries += sum(s.retries for s in sessions)
            epochs = {s.heartbeat(Owner(f"beat-{i}", "contract-host", 100 + i, 1.0),
                                  3.0).epoch for i, s in enumerate(sessions)}
            assert len(epochs) == 1, f"the beats of {prefix} disagree on the epoch: {epochs}"
        finally:
            _drop_tables(sessions[0])
            for s in sessions:
                s.close()
    assert retries == 0, f"{retries} heartbeats ran again after a deadlock"


def test_a_worker_paused_in_its_liveness_renewal_never_holds_a_beats_heartbeat(
        quick_store: MySQLStore) -> None:
    """Beats' heartbeats take turns on a row of their own; a worker process's liveness
    renewal (a background thread, under gevent a greenlet) takes no turn: one paused
    between its statements (its thread behind a task's C call, a stopped process) would
    otherwise hold every beat's heartbeat for lock waits and retries."""
    store = quick_store
    owner = Owner("beat-0", "contract-host", 100, 1.0)
    store.heartbeat(owner, 3.0)  # (the rows made)
    worker = MySQLStore(dict(store._params), store.prefix, store.history_limit, 5.0)
    worker.now()  # (set up, connected)
    paused, release = threading.Event(), threading.Event()
    end = worker._end

    def held(conn: Any, commit: bool) -> None:
        if commit and not paused.is_set():
            paused.set()  # the renewal's statements answered, its COMMIT not yet sent
            release.wait(10)
        end(conn, commit)

    worker._end = held  # type: ignore[method-assign]
    renewing = threading.Thread(target=lambda: worker.worker_heartbeat(
        WorkerProcess("w@host", 4242, "p-4242"), 15.0))
    renewing.start()
    try:
        assert paused.wait(10)
        threading.Timer(3.0, release.set).start()  # paused for 3 s
        store.retries = 0
        started = time.monotonic()
        store.heartbeat(owner, 3.0)
        took = time.monotonic() - started
    finally:
        release.set()
        renewing.join(30)
        worker.close()
    assert took < 1.0 and store.retries == 0, (
        f"a beat's heartbeat took {took:.1f} s and {store.retries} retries behind a"
        " worker process's paused liveness renewal")
