"""Several real ``celery beat`` processes and a real worker: every occurrence exactly once,
on every store (the core scenario on Redis, SQLite, PostgreSQL and MySQL, at once: a fleet
on each). The broker is a redis-server of the tests' own whatever the store (one a store);
each execution is recorded in a Redis list there (``BC_EXEC_URL``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from beat_claims.runs import iso
from beat_claims.settings import Settings
from beat_claims.stores import Store, open_store
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer, own_redis
from .processes import Fleet, close_all, duplicates, executions, fleet, wait_for

pytestmark = pytest.mark.integration

SCHEDULE = {
    "every-1s": {"every": 1},
    "every-2s": {"every": 2},
    "every-3s": {"every": 3},
    "each-minute": {"cron": "*"},
}
#: The machine's PostgreSQL, as the contract suite's (``BC_PGHOST``, ``BC_PGPORT``,
#: ``BC_PGUSER``): each test gets a database of its own, dropped at its end.
PG_HOST = os.environ.get("BC_PGHOST", "127.0.0.1")
PG_PORT = os.environ.get("BC_PGPORT", "5432")
PG_USER = os.environ.get("BC_PGUSER", "postgres")
#: The machine's MySQL or MariaDB, as the contract suite's (``BC_MYHOST``, ``BC_MYPORT``,
#: ``BC_MYUSER``, ``BC_MYPASSWORD``): a database of each test's own, dropped at its end.
MY_HOST = os.environ.get("BC_MYHOST", "127.0.0.1")
MY_PORT = int(os.environ.get("BC_MYPORT", "3306"))
MY_USER = os.environ.get("BC_MYUSER", "root")
MY_PASSWORD = os.environ.get("BC_MYPASSWORD", "")


def _pg_admin(statement: sql.Composable) -> None:
    try:
        with psycopg.connect(f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/postgres",
                             autocommit=True, connect_timeout=5) as conn:
            conn.execute(statement)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at {PG_HOST}:{PG_PORT} (user {PG_USER}) is needed by the"
                    f" PostgreSQL case (BC_PGHOST, BC_PGPORT, BC_PGUSER): {exc}")


def my_admin(statement: str, dbname: str | None = None) -> None:
    """One statement on the machine's MySQL or MariaDB (autocommit)."""
    import pymysql

    try:
        conn = pymysql.connect(host=MY_HOST, port=MY_PORT, user=MY_USER,
                               password=MY_PASSWORD, database=dbname, autocommit=True,
                               connect_timeout=5)
    except pymysql.err.OperationalError as exc:
        pytest.fail(f"MySQL or MariaDB at {MY_HOST}:{MY_PORT} (user {MY_USER}) is needed by"
                    f" the MySQL case (BC_MYHOST, BC_MYPORT, BC_MYUSER, BC_MYPASSWORD;"
                    f" scripts/test starts one): {exc}")
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
    finally:
        conn.close()


def my_url(dbname: str) -> str:
    auth = f"{MY_USER}:{MY_PASSWORD}" if MY_PASSWORD else MY_USER
    return f"mysql://{auth}@{MY_HOST}:{MY_PORT}/{dbname}"


@contextlib.contextmanager
def claims_url(kind: str, server: RedisServer, tmp_path: Path) -> Iterator[str]:
    """The ``beat_claims_url`` of a fresh store of ``kind``: the fixture redis-server, a
    SQLite file in the test's directory, or a new database on the machine's PostgreSQL or
    MySQL (MariaDB)."""
    if kind == "redis":
        yield server.url
    elif kind == "sqlite":
        yield f"sqlite:///{tmp_path}/claims.db"
    elif kind == "mysql":
        name = f"beat_claims_fleet_{uuid.uuid4().hex[:10]}"
        my_admin(f"CREATE DATABASE `{name}`")
        try:
            yield my_url(name)
        finally:
            my_admin(f"DROP DATABASE IF EXISTS `{name}`")
    else:
        name = f"beat_claims_fleet_{uuid.uuid4().hex[:10]}"
        _pg_admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"
        finally:
            _pg_admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


def expected(store: Store, start_ms: int, end_ms: int) -> set[tuple[str, str]]:
    """Every occurrence due in [start, end]: interval entries from their stored anchors,
    the crontab entry at each whole minute (the app runs in UTC)."""
    out = set()
    for name, spec in SCHEDULE.items():
        anchor = store.entries([name])[0].anchor
        assert anchor is not None, name
        period = spec["every"] * 1000 if "every" in spec else 60_000
        base = anchor if "every" in spec else 0
        k = max(1, -(-(max(start_ms, anchor + 1) - base) // period))
        while base + k * period <= end_ms:
            out.add((name, iso(base + k * period)))
            k += 1
    return out


def watch(seconds: float, procs: list[subprocess.Popen[bytes]]) -> None:
    """Let the fleet run for ``seconds`` (a window of the schedule, not a wait for
    something), failing at once if one of ``procs`` exits meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        gone = [p.args for p in procs if p.poll() is not None]
        assert not gone, f"exited during the window: {gone}"
        time.sleep(0.2)


def all_ran_once(client: Any, want: set[tuple[str, str]], timeout: float,
                 what: str) -> list[dict[str, Any]]:
    """Wait until every wanted occurrence ran; then none ran twice."""
    wait_for(lambda: want <= {(r["entry"], r["due"]) for r in executions(client)}, timeout,
             what)
    rows = executions(client)
    assert duplicates(rows) == {}
    return rows


KINDS = ("redis", "sqlite", "postgres", "mysql")


@dataclass
class OnStore:
    """The scenario on one store: its fleet (a worker, three beats), the redis-server that
    is its broker and holds its executions, the store read through its contract, and the
    occurrences expected to run."""

    kind: str
    url: str
    fleet: Fleet
    broker: RedisServer
    worker: subprocess.Popen[bytes]
    beats: list[subprocess.Popen[bytes]]
    store: Store | None = None  # (opened once the beats run: they make the store)
    want: set[tuple[str, str]] = field(default_factory=set)


def test_three_beats_one_worker_every_occurrence_exactly_once_on_every_store(
        server: RedisServer, tmp_path: Path) -> None:
    """The scenario on the four stores at once (a fleet of three beats and a worker on
    each, a broker each), so that its windows of real time serve them all; each store is
    checked alone (a failure names it)."""
    with contextlib.ExitStack() as stack:
        runs: list[OnStore] = []
        for kind in KINDS:
            where = tmp_path / kind
            where.mkdir()
            broker = server if kind == "redis" else stack.enter_context(own_redis())
            url = stack.enter_context(claims_url(kind, broker, where))
            f = stack.enter_context(fleet(url, broker.broker_url(), where, SCHEDULE,
                                          BC_EXEC_URL=broker.url))
            runs.append(OnStore(kind, url, f, broker, f.worker(),
                                [f.beat() for _ in range(3)]))
        # On the way out, the four fleets stop at once (then each fleet's own exit shows
        # its logs on a failure, and drops its store).
        stack.callback(close_all, [run.fleet for run in runs])
        for run in runs:
            wait_for(partial(_ran_at_least, run.broker.client(), 3), 40,
                     f"first executions ({run.kind})")
            run.store = stack.enter_context(
                contextlib.closing(open_store(Settings(url=run.url), timeout=5.0)))
        t0 = int(time.time() * 1000)
        watch(10, [p for run in runs for p in (run.worker, *run.beats)])
        t1 = int(time.time() * 1000)
        for run in runs:
            # Everything due up to t1 - 2 s has been sent and run by now (or soon).
            assert run.store is not None
            run.want = expected(run.store, t0, t1 - 2000)
            all_ran_once(run.broker.client(), run.want, 15,
                         f"every expected occurrence to run ({run.kind})")
            # The beats sent (which one wins each claim depends on timing: a beat claiming
            # ahead, on a loaded host, may win every one of these four entries' claims).
            senders = [b for b in run.beats if "Sending due task" in run.fleet.log(b)]
            assert senders, run.kind

        # SIGTERM one beat, SIGKILL another, start a new one.
        for run in runs:
            run.fleet.stop(run.beats[0], signal.SIGTERM)
            run.fleet.stop(run.beats[1], signal.SIGKILL)
            run.beats.append(run.fleet.beat())
        t2 = int(time.time() * 1000)
        watch(10, [p for run in runs for p in (run.worker, run.beats[2], run.beats[3])])
        t3 = int(time.time() * 1000)
        failed = []
        for run in runs:
            try:
                _ran_once_through_the_stop_and_the_kill(run, t0, t2, t3)
            except AssertionError as exc:
                failed.append(f"{run.kind}: {exc}")
        assert not failed, "\n".join(failed)


def _ran_at_least(client: Any, n: int) -> bool:
    return len(executions(client)) >= n


def _ran_once_through_the_stop_and_the_kill(run: OnStore, t0: int, t2: int, t3: int) -> None:
    client, store = run.broker.client(), run.store
    assert store is not None
    want = run.want | expected(store, t2, t3 - 2000)
    # Runs the killed beat had claimed are taken over once its heartbeat expires (3 s).
    rows = all_ran_once(client, want, 20, "every occurrence after the stop and the kill to run")
    got = {(r["entry"], r["due"]) for r in rows}
    print(f"fleet ({run.kind}): {len(rows)} executions, {len(want)} expected"
          f" occurrences, {len(duplicates(rows))} duplicated, {len(want - got)} missing")
    # The store agrees: every recorded run of the interval entries is done, once.
    for name in ("every-1s", "every-2s", "every-3s"):
        states = [r.state.value for r in store.history(name)
                  if t0 <= r.due <= t3 - 5000]
        assert states and set(states) == {"done"}, (name, states)


def test_worker_with_embedded_beat_releases_unsent_claims_on_shutdown(
        server: RedisServer, tmp_path: Path) -> None:
    """``worker -B``: the embedded beat is stopped with the worker and gives back what it
    claimed and did not send; a standalone beat then sends those runs, once each."""
    store = RedisStore.from_url(server.url, "beat-claims")
    client = server.client()
    schedule = {f"e{i}": {"every": 2} for i in range(4)}
    # A released run is judged by its own due time when it is taken again: with the default
    # catch_up "latest", a standalone beat that starts more than the grace (3 s) after it
    # fell due, with a newer occurrence on time, skips it ('catch_up'), as the policy says.
    # "all" makes the test about the release, not about how fast a beat starts under load.
    with fleet(server.url, server.broker_url(), tmp_path, schedule, BC_CATCH_UP="all") as f:
        embedded = f.worker("-B", "-s", str(tmp_path / "unused-schedule"),
                            BC_BLOCK_PUBLISH="1")  # blocks inside its first publish
        f.wait_log(embedded, "Sending due task", 30)
        claimed = {(r.entry, r.due): r.token for name in schedule
                   for r in store.history(name)}
        assert len(claimed) == 4
        f.stop(embedded, signal.SIGTERM, timeout=30)
        assert "released 3 unsent claim(s)" in f.log(embedded)
        # The one being published when the stop came is due again too (if its message went
        # out as well, the worker's fencing runs the occurrence once).
        assert "1 claim(s) being published when the stop came" in f.log(embedded)
        states = sorted(r.state.value for name in schedule for r in store.history(name))
        assert states == ["due", "due", "due", "due"]
        f.worker()
        f.beat()
        wait_for(lambda: {(e, iso(d)) for e, d in claimed}
                 <= {(r["entry"], r["due"]) for r in executions(client)}, 30,
                 "every claimed occurrence to run")
        assert duplicates(executions(client)) == {}
        # The store agrees: each released run was taken again (a fresh token) and is done
        # (the outcome is recorded just after the task's body wrote its execution).
        def again() -> list[tuple[str, str, bool]]:
            return sorted((r.entry, r.state.value, r.token > claimed[(e, d)])
                          for e, d in claimed for r in store.history(e) if r.due == d)
        want = sorted((e, "done", True) for e, _ in claimed)
        wait_for(lambda: again() == want, 10, "the released runs to be done")
