#!/usr/bin/env python
"""Chaos run: a fleet of real beats and workers under kills, a store crash and a paused beat.

Why: the unit and integration tests pin each failure case alone; this run mixes them, for
minutes, in real ``celery beat`` / ``celery worker`` processes, and judges beat-claims only by
what actually executed (a ledger the task writes itself) against what the schedule says
was due. It fails (exit code 1) on any duplicate execution or any miss the store cannot
explain.

The fleet: ``--beats`` beats (3) and ``--workers`` prefork workers (2, two processes each)
of ``bench/chaos_app.py``, on ``--entries`` interval entries (10) with periods of 1 to 5 s,
catch-up policy ``all``, heartbeat ``--heartbeat`` (1 s), ``--reclaim-after`` (10 s). The
broker is a private redis-server (never restarted; its queue is not part of the test). The
store (``--store``) is another private redis-server (``redis``, the default: ``appendonly
yes``, ``appendfsync always``: a restart keeps the state), a SQLite file of the run's own
(``sqlite``) or a database of its own on the machine's PostgreSQL (``postgres``: created
and dropped by the run; ``BC_PGHOST``, ``BC_PGPORT``, ``BC_PGUSER``).

The chaos, seeded by ``--seed``, for ``--duration`` seconds (300; longer if the pause or
the store restart is still to come at the end of a short run):

* every 5 to 15 s a random beat is sent SIGKILL or SIGTERM, at a due instant plus 0 to
  15 ms (so it is often in the middle of a claim or a send), and a replacement is started
  at once;
* once, the store fails for ``--store-down`` seconds. SQLite: another process holds the
  file's writer lock (every write fails, busy); PostgreSQL: the database refuses
  connections and every session on it is cut (``pg_terminate_backend``), what clients see
  of a failover (the server is shared: it is not restarted). Neither is a new epoch; the
  beats log the outage and catch up. Redis: the store's redis-server is killed (SIGKILL)
  and started again ``--store-down`` seconds later on the same port with the same data
  directory. The restarted server is a
  new store epoch to the beats: each logs "the store may have lost writes", registers again
  what it knows, and no beat claims for one heartbeat TTL (the settle period, announced as
  "the store has a new epoch ... claiming starts in Xs"). Runs due during the outage and
  the settle period are sent late, by the catch-up policy ``all``;
* once, a beat is paused with SIGSTOP for ``--pause`` seconds (reclaim_after + 2 by
  default), then resumed with SIGCONT. That beat replaces a killed one and is armed in the
  app: it stops itself inside its first publish, after its check before publish (its
  claims are ``sending``), as a VM paused in the middle of a publish would (when it has not
  published within 30 s, the run stops it itself). Its heartbeat is ``--pause-heartbeat``
  (reclaim_after / 2), whose TTL outlives the pause: it stays alive to the store, so its
  claims are taken over by ``reclaim_after`` (with the fleet's 1 s heartbeat, expiry after
  3 s would come first), and when it wakes it publishes what it had checked: the workers
  must refuse those stale deliveries.

Then the chaos stops and the fleet drains: the run waits until every occurrence due before
the end of the chaos has executed, for at most the documented worst delay (reclaim_after +
heartbeat TTL) plus ``--margin``. Beats and workers are stopped, and the ledger is compared
with the schedule (interval anchors read from the store): occurrences due, executed,
duplicates (executed more than once), missed (never executed; explained when the store
records them ``skipped`` by a policy), the delay (execution start - due) and which chaos
event held each late run back: the beat its record says it was taken back from or
released by (``reclaimed_from``, ``released_by``), when that beat was killed or paused
while the run waited; else the store restart, whose window runs from the kill to the end
of the settle period the beats logged (plus one heartbeat).

Every beat and worker imports ``beat_claims`` (and the chaos app) from a snapshot taken
when the run starts (``<workdir>/src``: a copy of the working tree's package, or
``--at-commit REV``'s), so that edits made while a long run lasts never mix versions in
one fleet; the run reports the commit, ``-dirty`` and a digest of the snapshot.

The store is read only through its contract (``beat_claims.stores.open_store``:
``entries()`` for the anchors, ``history()`` for the runs' records), never by its keys.

Usage: python bench/chaos.py [--duration 300] [--seed 1] [--store redis|sqlite|postgres]
                            [--at-commit REV] [--keep] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import heapq
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: beat_claims from this checkout
    sys.path.insert(0, str(ROOT))

from beat_claims.runs import Run, iso, to_ms  # noqa: E402
from beat_claims.settings import Settings  # noqa: E402
from beat_claims.stores import Store, open_store  # noqa: E402

APP = "bench.chaos_app"
PERIODS = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0)
PAUSE_ARM_TIMEOUT = 30.0
#: Executions later than this (seconds) are attributed to a chaos event.
LATE = 0.25
#: Runs kept per entry in the store (the app's ``beat_claims_history_limit``): every run of
#: the whole chaos run, so a miss or a delay can be explained from its record.
HISTORY_LIMIT = 5000


@dataclass
class Config:
    """One chaos run. Times in seconds."""

    duration: float = 300.0
    seed: int = 1
    beats: int = 3
    workers: int = 2
    concurrency: int = 2
    entries: int = 10
    heartbeat: float = 1.0
    reclaim_after: float = 10.0
    pause: float | None = None  # default: reclaim_after + 2
    pause_heartbeat: float | None = None  # the paused beat's; default: reclaim_after / 2
    store_down: float = 2.0
    store: str = "redis"  # redis | sqlite | postgres: the beat-claims store under test
    kill_every: tuple[float, float] = (5.0, 15.0)
    margin: float = 20.0
    fence: bool = True  # False: workers without beat_claims.install(app)
    at_commit: str | None = None  # run the fleet on beat_claims/ of this commit
    workdir: Path | None = None
    verbose: bool = True
    label: str = ""  # named in each line the run says (runs at once in one process)

    @property
    def pause_seconds(self) -> float:
        return self.pause if self.pause is not None else self.reclaim_after + 2.0

    @property
    def pause_heartbeat_seconds(self) -> float:
        return self.pause_heartbeat or self.reclaim_after / 2

    @property
    def heartbeat_ttl(self) -> float:
        return 3 * self.heartbeat

    def schedule(self) -> dict[str, float]:
        """Entry name -> period: mixed periods of 1 to 5 s."""
        periods = [PERIODS[i % len(PERIODS)] for i in range(self.entries)]
        return {f"e{i:02d}-every-{p:g}s": p for i, p in enumerate(periods)}


@dataclass
class Event:
    """Something the chaos did, with the wall-clock interval it covers.

    A store restart covers the outage and then the settle period of the store's new epoch
    (no beat claims for one heartbeat TTL after it is back: ``settle_until``, read from the
    beats' logs after the chaos), plus one heartbeat for the first claims after it.
    """

    kind: str  # sigkill | sigterm | store_restart | store_outage | pause
    start: float
    end: float
    detail: str
    beat: str = ""  # the beat killed or paused
    settle_until: float | None = None  # store_restart: when claiming could start again

    def overlaps(self, lo: float, hi: float) -> bool:
        return self.start <= hi and self.end >= lo


@dataclass
class Result:
    """What the run measured. ``ok`` is False on a duplicate or an unexplained miss."""

    config: dict[str, Any]
    due: int = 0
    executed: int = 0
    executions: int = 0
    duplicates: dict[str, int] = field(default_factory=dict)
    missed: list[dict[str, Any]] = field(default_factory=list)
    missed_unexplained: int = 0
    off_schedule: list[str] = field(default_factory=list)
    reanchored: list[str] = field(default_factory=list)
    worst_delay_s: float = 0.0
    worst: dict[str, Any] = field(default_factory=dict)
    worst_by_cause: dict[str, float] = field(default_factory=dict)
    p50_delay_s: float = 0.0
    p99_delay_s: float = 0.0
    late_over_2s: int = 0
    drain_s: float = 0.0
    drain_deadline_s: float = 0.0
    events: list[Event] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    workdir: str = ""
    version: str = ""
    store_settle_s: float | None = None  # from the store's return until claiming resumed

    @property
    def ok(self) -> bool:
        return (not self.duplicates and self.missed_unexplained == 0
                and not self.off_schedule and not self.reanchored)

    def figures(self) -> dict[str, Any]:
        """The one-line JSON summary."""
        kinds = Counter(e.kind for e in self.events)
        return {
            "ok": self.ok,
            "beat_claims": self.version,
            "duration_s": self.config["duration"],
            "seed": self.config["seed"],
            "due": self.due,
            "executed": self.executed,
            "executions": self.executions,
            "duplicates": len(self.duplicates),
            "missed": len(self.missed),
            "missed_unexplained": self.missed_unexplained,
            "off_schedule": len(self.off_schedule),
            "worst_delay_s": round(self.worst_delay_s, 3),
            "worst_delay_entry": self.worst.get("entry"),
            "worst_delay_due": self.worst.get("due"),
            "worst_delay_cause": self.worst.get("cause"),
            "worst_delay_by_cause_s": self.worst_by_cause,
            "p50_delay_s": round(self.p50_delay_s, 3),
            "p99_delay_s": round(self.p99_delay_s, 3),
            "late_over_2s": self.late_over_2s,
            "drain_s": round(self.drain_s, 1),
            "sigkill": kinds["sigkill"],
            "sigterm": kinds["sigterm"],
            "store": self.config.get("store", "redis"),
            "store_restarts": kinds["store_restart"],
            "store_outages": kinds["store_outage"],
            "store_settle_s": self.store_settle_s,
            "pauses": kinds["pause"],
            **self.counts,
        }


# -- processes ----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.1) -> Any:
    """Poll until ``predicate()`` is truthy; raise after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM,
                 timeout: float = 20.0) -> None:
    """Signal the process (its whole session) and wait; SIGKILL it if it does not exit."""
    stop_processes([proc], sig, timeout)


def stop_processes(procs: list[subprocess.Popen[bytes]], sig: int = signal.SIGTERM,
                   timeout: float = 20.0) -> None:
    """Signal every process (each its whole session) at once, then wait for them all
    until one shared deadline ``timeout`` seconds on; SIGKILL each that has not exited by
    then, and wait up to 5 s for it. One that outlives that too is left (said on stderr,
    with its pid and command), and the others are stopped all the same."""
    live = [proc for proc in procs if proc.poll() is None]
    for proc in live:
        _kill_group(proc, signal.SIGCONT)
        _kill_group(proc, sig)
    deadline = time.monotonic() + timeout
    for proc in live:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGKILL)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                print(f"process {proc.pid} ({proc.args!r}) still running 5 s after"
                      " SIGKILL: left", file=sys.stderr)


class RedisServer:
    """A private redis-server on a fixed port and data directory, so it can be restarted."""

    def __init__(self, name: str, workdir: Path, persistent: bool) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server not found on PATH (apt-get install redis-server)")
        self.binary = binary
        self.name = name
        self.port = free_port()
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.persistent = persistent
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(port=self.port, db=db, decode_responses=True, socket_timeout=5)

    def start(self) -> None:
        persistence = (["--appendonly", "yes", "--appendfsync", "always"] if self.persistent
                       else ["--appendonly", "no"])
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             *persistence, "--dir", str(self.dir), "--logfile", str(self.dir / "redis.log"),
             "--loglevel", "notice"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )

        def up() -> bool:
            try:
                return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
            except redis.RedisError:
                return False

        wait_for(up, 30, f"redis-server {self.name} on port {self.port}", 0.05)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None:
            stop_process(self.proc, sig, 15)
            self.proc = None


#: What the chaos does to each store once (``Event.kind``): a crash and restart for a
#: redis-server of its own; for the others, an outage (see the classes below).
STORE_EVENTS = ("store_restart", "store_outage")


class RedisStore:
    """The store on a redis-server of the run's own (``appendonly yes``, ``appendfsync
    always``): SIGKILLed once and started again on the same port and data directory, a new
    store epoch to the beats."""

    kind = "redis"
    event = "store_restart"
    new_epoch = True  # the fault makes the beats see a new epoch (and settle)

    def __init__(self, workdir: Path) -> None:
        self.server = RedisServer("store", workdir, persistent=True)

    @property
    def url(self) -> str:
        return self.server.url(0)

    def where(self) -> str:
        return f"store redis-server port {self.server.port}"

    def start(self) -> None:
        self.server.start()

    def fault(self, down: float) -> str:
        start = time.time()
        self.server.stop(signal.SIGKILL)
        time.sleep(down)  # the outage itself: a chosen length, not a wait
        self.server.start()
        return (f"store redis-server SIGKILL, restarted after {time.time() - start:.1f}s"
                " (appendfsync always)")

    def stop(self) -> None:
        self.server.stop()


class SQLiteStore:
    """The store in a SQLite file of the run's own (``<workdir>/store/claims.db``).

    The fault: another process takes the file's writer lock (``BEGIN IMMEDIATE``) and holds
    it for ``--store-down`` seconds, as a long write of another program, an operator's
    shell left in a transaction or a stalled disk would. Every write of every beat and
    worker waits its busy timeout (the store's timeout, 1 s here) and fails: an outage, in
    which nothing may be sent unclaimed, and after which the beats catch up.

    A crash and restart has no equivalent for a file (no server; the file stays, and every
    commit was on disk, ``synchronous = FULL``), and replacing the file under live
    connections (a restore) is what SQLite documents as a way to corrupt a database (a
    connection to the old file deletes the new file's ``-wal`` when it closes), so the run
    does not do that; the contract suite restores a file from a copy with no process
    attached (``tests/contract/backend_sqlite.py``).
    """

    kind = "sqlite"
    event = "store_outage"
    new_epoch = False

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir / "store"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "claims.db"

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"

    def where(self) -> str:
        return f"store {self.path}"

    def start(self) -> None:
        import sqlite3

        for name in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
            name.unlink(missing_ok=True)
        sqlite3.connect(self.path).close()  # the processes set it up (WAL, tables)

    def fault(self, down: float) -> str:
        import sqlite3

        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            waited = time.time()
            db.execute("BEGIN IMMEDIATE")  # waits for a writer in the middle of a commit
            start = time.time()
            time.sleep(down)  # the outage itself: a chosen length, not a wait
            db.execute("ROLLBACK")
        finally:
            db.close()
        return (f"store file's writer lock held {time.time() - start:.1f}s by another"
                f" process (taken after {start - waited:.2f}s): every write failed"
                " (busy)")

    def stop(self) -> None:
        pass


def refused_for(down: float, refuse: Callable[[], Any], cut: Callable[[], int],
                allow: Callable[[], Any]) -> tuple[float, int]:
    """A database's outage as clients see a failover: new sessions refused, every session
    cut, ``down`` seconds, then sessions allowed again. The seconds it took, and the
    sessions cut."""
    start = time.time()
    refuse()
    try:
        n = cut()
        time.sleep(down)  # the outage itself: a chosen length, not a wait
        n += cut()  # none: no session could start meanwhile
    finally:
        allow()
    return time.time() - start, n


class PostgresStore:
    """The store in a database of its own on the machine's PostgreSQL
    (``beat_claims_chaos_<random>``, created at the start and dropped at the end; the server
    is ``BC_PGHOST``, ``BC_PGPORT``, ``BC_PGUSER``: 127.0.0.1:5432, postgres).

    The fault: what clients see of a failover. The server is shared, so it is not
    restarted: the database refuses new connections (``ALLOW_CONNECTIONS false``) and
    every session on it is cut (``pg_terminate_backend``: every statement in flight fails,
    its reply lost), for ``--store-down`` seconds; then it accepts connections again. The
    server is the same one, so it is not a new epoch (a restore is: the contract suite's
    ``tests/contract/backend_postgres.py``).
    """

    kind = "postgres"
    event = "store_outage"
    new_epoch = False

    def __init__(self, workdir: Path) -> None:
        self.host = os.environ.get("BC_PGHOST", "127.0.0.1")
        self.port = os.environ.get("BC_PGPORT", "5432")
        self.user = os.environ.get("BC_PGUSER", "postgres")
        self.dbname = f"beat_claims_chaos_{os.urandom(5).hex()}"
        self.created = False

    def _url(self, dbname: str) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{dbname}"

    @property
    def url(self) -> str:
        return self._url(self.dbname)

    def where(self) -> str:
        return f"store database {self.dbname} on {self.host}:{self.port}"

    def _admin(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self._url("postgres"), autocommit=True,
                             connect_timeout=5) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description is not None else []

    def start(self) -> None:
        self._admin(f'CREATE DATABASE "{self.dbname}"')
        self.created = True

    def _cut(self) -> int:
        rows = self._admin("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                           " WHERE datname = %s AND pid <> pg_backend_pid()",
                           (self.dbname,))
        return int(rows[0][0]) if rows else 0

    def fault(self, down: float) -> str:
        took, cut = refused_for(
            down, lambda: self._admin(f'ALTER DATABASE "{self.dbname}" ALLOW_CONNECTIONS false'),
            self._cut,
            lambda: self._admin(f'ALTER DATABASE "{self.dbname}" ALLOW_CONNECTIONS true'))
        return (f"store database refused connections for {took:.1f}s, its {cut} sessions"
                " cut (pg_terminate_backend)")

    def stop(self) -> None:
        if self.created:
            self._admin(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')
            self.created = False


class MySQLStore:
    """The store in a database of its own on the machine's MySQL or MariaDB
    (``beat_claims_chaos_<random>``, created at the start and dropped at the end, with a
    user of its own; the server is ``BC_MYHOST``, ``BC_MYPORT``, ``BC_MYUSER``,
    ``BC_MYPASSWORD``: 127.0.0.1:3306, root).

    The fault: what clients see of a failover, as for PostgreSQL. The server is shared, so
    it is not restarted: the store's user is locked (``ALTER USER ... ACCOUNT LOCK``: new
    connections are refused) and every session of it killed (``KILL``: every statement in
    flight fails, its reply lost), for ``--store-down`` seconds; then it is unlocked. The
    server and the tables are the same ones, so it is not a new epoch (a restore is: the
    contract suite's ``tests/contract/backend_mysql.py``).
    """

    kind = "mysql"
    event = "store_outage"
    new_epoch = False

    def __init__(self, workdir: Path) -> None:
        self.host = os.environ.get("BC_MYHOST", "127.0.0.1")
        self.port = int(os.environ.get("BC_MYPORT", "3306"))
        self.admin_user = os.environ.get("BC_MYUSER", "root")
        self.admin_password = os.environ.get("BC_MYPASSWORD", "")
        suffix = os.urandom(5).hex()
        self.dbname = f"beat_claims_chaos_{suffix}"
        self.user, self.password = f"bc_chaos_{suffix}", os.urandom(12).hex()
        self.created = False

    @property
    def url(self) -> str:
        return f"mysql://{self.user}:{self.password}@{self.host}:{self.port}/{self.dbname}"

    def where(self) -> str:
        return f"store database {self.dbname} on {self.host}:{self.port}"

    def _admin(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import pymysql

        conn = pymysql.connect(host=self.host, port=self.port, user=self.admin_user,
                               password=self.admin_password, autocommit=True,
                               connect_timeout=5)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params or None)
                return list(cur.fetchall())
        finally:
            conn.close()

    def start(self) -> None:
        self._admin(f"CREATE DATABASE `{self.dbname}`")
        self.created = True
        self._admin(f"CREATE USER '{self.user}'@'%' IDENTIFIED BY '{self.password}'")
        self._admin(f"GRANT ALL ON `{self.dbname}`.* TO '{self.user}'@'%'")

    def _cut(self) -> int:
        cut = 0
        for (session,) in self._admin("SELECT ID FROM information_schema.PROCESSLIST"
                                      " WHERE USER = %s", (self.user,)):
            try:
                self._admin(f"KILL {int(session)}")
                cut += 1
            except Exception:
                pass
        return cut

    def fault(self, down: float) -> str:
        took, cut = refused_for(
            down, lambda: self._admin(f"ALTER USER '{self.user}'@'%' ACCOUNT LOCK"),
            self._cut, lambda: self._admin(f"ALTER USER '{self.user}'@'%' ACCOUNT UNLOCK"))
        return (f"store user locked (new connections refused) for {took:.1f}s, its {cut}"
                " sessions killed")

    def stop(self) -> None:
        if self.created:
            self._admin(f"DROP DATABASE IF EXISTS `{self.dbname}`")
            self._admin(f"DROP USER IF EXISTS '{self.user}'@'%'")
            self.created = False


AnyStore = RedisStore | SQLiteStore | PostgresStore | MySQLStore
STORES: dict[str, Callable[[Path], AnyStore]] = {
    "redis": RedisStore, "sqlite": SQLiteStore, "postgres": PostgresStore,
    "mysql": MySQLStore}


@dataclass
class Proc:
    """A beat or worker of the fleet."""

    kind: str
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def state(self) -> str:
        """The kernel's state letter (``T``: stopped)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return "X"
        return stat.rsplit(")", 1)[1].split()[0]

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class Fleet:
    """Starts beats and workers of the chaos app; knows every process it ever started."""

    def __init__(self, cfg: Config, store_url: str, broker: RedisServer,
                 workdir: Path, src: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        self.src = src
        self.env = {
            **env,
            "CHAOS_STORE_URL": store_url,
            "CHAOS_BROKER_URL": broker.url(0),
            "CHAOS_LEDGER": str(workdir / "ledger.jsonl"),
            "CHAOS_SCHEDULE": json.dumps(cfg.schedule()),
            "CHAOS_HEARTBEAT": str(cfg.heartbeat),
            "CHAOS_RECLAIM_AFTER": str(cfg.reclaim_after),
            "CHAOS_PAUSE_FILE": "",
            # beat_claims and the app from the run's snapshot (see snapshot()), never from
            # a working tree that may change while the run lasts
            "PYTHONPATH": os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH")) if p),
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        self.cfg = cfg
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []
        self.counter = Counter[str]()

    def _spawn(self, kind: str, args: list[str], **env: str) -> Proc:
        self.counter[kind] += 1
        name = f"{kind}-{self.counter[kind]}"
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", APP, *args], cwd=self.src,
                env={**self.env, **env},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        proc = Proc(kind, name, popen, log)
        self.procs.append(proc)
        return proc

    def beat(self, **env: str) -> Proc:
        n = self.counter["beat"] + 1
        return self._spawn("beat", ["beat", "-S", "beat_claims.Scheduler", "--loglevel", "INFO",
                                    "-s", str(self.workdir / f"unused-schedule-{n}")], **env)

    def worker(self) -> Proc:
        n = self.counter["worker"] + 1
        return self._spawn("worker", ["worker", "--loglevel", "INFO", "-P", "prefork",
                                      "-c", str(self.cfg.concurrency), "--without-gossip",
                                      "--without-mingle", "-n", f"chaos-w{n}@%h"],
                           **({} if self.cfg.fence else {"CHAOS_NO_FENCE": "1"}))

    def live(self, kind: str) -> list[Proc]:
        return [p for p in self.procs if p.kind == kind and p.alive()]

    def close(self) -> None:
        for proc in self.procs:
            if proc.alive():
                _kill_group(proc.popen, signal.SIGCONT)
                _kill_group(proc.popen, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(10)


# -- the ledger and the schedule -------------------------------------------------------
def read_ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("entry") and row.get("due"):
            row["due_ms"] = to_ms(datetime.fromisoformat(row["due"].replace("Z", "+00:00")))
            rows.append(row)
    return rows


def due_occurrences(anchors: dict[str, int], periods: dict[str, float],
                    until_ms: int) -> set[tuple[str, int]]:
    """Every occurrence from each entry's first (anchor + period) up to ``until_ms``."""
    out = set()
    for name, anchor in anchors.items():
        period = round(periods[name] * 1000)
        due = anchor + period
        while due <= until_ms:
            out.add((name, due))
            due += period
    return out


def next_due_instant(anchors: dict[str, int], periods: dict[str, float], after_s: float
                     ) -> float:
    """The first due instant of any entry after ``after_s`` (epoch seconds)."""
    after_ms = int(after_s * 1000)
    best = None
    for name, anchor in anchors.items():
        period = round(periods[name] * 1000)
        k = max(1, (after_ms - anchor) // period + 1)
        due = anchor + k * period
        best = due if best is None else min(best, due)
    return (best if best is not None else after_ms) / 1000


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


#: "took back N claim(s) of owner X (why): e1, e2" -> the count, the owner id, why, names.
_TAKEOVER = re.compile(r"beat-claims: took back (\d+) claim\(s\) of owner (\S+) \(([^)]*)\):"
                       r" (.*)$", re.MULTILINE)
_TAKEOVER_KEYS = {
    "its owner is gone": "taken_over_dead",
    "older than reclaim_after": "taken_over_reclaim_after",
    "this beat's own, whose reply it never had": "taken_over_unanswered",
}
_OWNER = re.compile(r"beat-claims: owner \S+?:\d+/([0-9a-f]{8})")
_RELEASED = re.compile(r"beat-claims: released (\d+) unsent claim\(s\)")
_TAKEN_BACK_AT_STOP = re.compile(r"beat-claims: (\d+) claim\(s\) being published when the stop"
                               r" came")
_SKIPPED = re.compile(r"beat-claims: recorded (\d+) occurrence\(s\) skipped \((\w+)\)")
#: The lines that say when a beat may claim again after the store's epoch changed, with
#: Celery's prefix "[2026-11-30 12:08:01,123: WARNING/MainProcess]" (local time): "the store
#: has a new epoch ... claiming starts in 2.9s", and "the store may have lost writes (...)
#: ... no beat claims for 2.9s" (or "... meanwhile": then one heartbeat TTL is assumed).
_PREFIX = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}): [^\]]*\] beat-claims: "
_SETTLE = re.compile(_PREFIX + r"the store has a new epoch .*?claiming starts in ([\d.]+)s",
                     re.MULTILINE)
_LOST_WRITES = re.compile(_PREFIX + r"the store may have lost writes .*?no beat claims"
                          r"(?: for ([\d.]+)s)?", re.MULTILINE)


def _stamp(day_time: str, millis: str) -> float:
    """A Celery log timestamp (local time) as epoch seconds."""
    return time.mktime(time.strptime(day_time, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


def settle_ends(fleet: Fleet, ttl: float) -> list[float]:
    """When each beat said claiming may start again after a new store epoch (epoch
    seconds): the log line's time + the settle it announced (``ttl`` when it named none)."""
    ends = []
    for proc in fleet.procs:
        if proc.kind == "beat":
            text = proc.text()
            ends += [_stamp(day, ms) + float(secs) for day, ms, secs in _SETTLE.findall(text)]
            ends += [_stamp(day, ms) + (float(secs) if secs else ttl)
                     for day, ms, secs in _LOST_WRITES.findall(text)]
    return sorted(ends)


def log_counts(fleet: Fleet) -> dict[str, int]:
    """What the processes' logs say happened: takeovers by cause, releases, refusals,
    store outages and new epochs, skips."""
    counts: Counter[str] = Counter()
    # Beats that sweep at the same moment may each log taking back the same claims (only
    # one of them did): each (owner, why, entries) counts once.
    takeovers: dict[tuple[str, str, str], int] = {}
    for proc in fleet.procs:
        text = proc.text()
        if proc.kind == "beat":
            for n, owner, why, names in _TAKEOVER.findall(text):
                takeovers[(owner, why, names)] = int(n)
            counts["released_at_stop"] += sum(int(n) for n in _RELEASED.findall(text))
            counts["taken_back_at_stop"] += sum(
                int(n) for n in _TAKEN_BACK_AT_STOP.findall(text))
            counts["not_sent_superseded"] += text.count("beat-claims: not sending")
            counts["beat_store_outages"] += text.count("beat-claims: store unreachable")
            counts["beat_store_lost_writes"] += text.count(
                "beat-claims: the store may have lost writes")
            counts["beat_settle_waits"] += text.count("beat-claims: the store has a new epoch")
            counts["beat_tick_errors"] += text.count("beat-claims: unexpected error in a tick")
            for n, reason in _SKIPPED.findall(text):
                counts[f"skipped_{reason}"] += int(n)
        else:
            counts["refused_deliveries"] += text.count("beat-claims: refusing delivery")
            counts["redeliveries_run"] += text.count("is gone; running this redelivery")
            counts["worker_store_outages"] += text.count("beat-claims: store unreachable")
        counts["traceback_lines"] += text.count("Traceback (most recent call last)")
    for (_owner, why, _names), n in takeovers.items():
        counts[_TAKEOVER_KEYS.get(why, "taken_over_other")] += n
    return dict(counts)


def _ready(worker: Proc) -> bool:
    return "ready." in worker.text() or not worker.alive()


def _beat_started(beat: Proc) -> bool:
    """Through its start-up: Celery and the app imported, its scheduler made (it logged
    its owner), or exited."""
    return _OWNER.search(beat.text()) is not None or not beat.alive()


def _git(*argv: str) -> str:
    try:
        return subprocess.run(["git", *argv], cwd=ROOT, text=True, capture_output=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _digest(package: Path) -> str:
    """A digest of a package's files (names and contents), to tell snapshots apart."""
    h = hashlib.sha256()
    names = sorted(path.relative_to(package).as_posix() for path in package.rglob("*")
                   if path.is_file() and "__pycache__" not in path.parts
                   and path.suffix != ".pyc")
    for name in names:  # the same digest as bench/dispatch.py's
        h.update(name.encode() + b"\0" + (package / name).read_bytes())
    return h.hexdigest()[:12]


def snapshot(workdir: Path, at_commit: str | None) -> tuple[Path, str]:
    """The code every process of the run imports, fixed at its start: ``beat_claims/`` of
    the working tree (copied) or of commit ``at_commit`` (``git archive``), and the chaos
    app, in ``workdir/src``. Returns the directory and what was measured: the commit,
    ``-dirty`` when the working tree's ``beat_claims/`` differs from it, and the digest of
    the snapshot's files.
    """
    src = workdir / "src"
    if src.exists():
        shutil.rmtree(src)
    (src / "bench").mkdir(parents=True)
    for name in ("__init__.py", "chaos_app.py"):
        shutil.copy2(ROOT / "bench" / name, src / "bench" / name)
    if at_commit:
        full = _git("rev-parse", "--verify", f"{at_commit}^{{commit}}")
        if not full:
            raise SystemExit(f"--at-commit: {at_commit!r} is not a commit of {ROOT}")
        archive = subprocess.run(["git", "archive", full, "beat_claims"], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        version = _git("rev-parse", "--short", full)
    else:
        dirty = _git("status", "--porcelain", "--", "beat_claims")
        shutil.copytree(ROOT / "beat_claims", src / "beat_claims",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        version = (_git("rev-parse", "--short", "HEAD") or "unknown") + (
            "-dirty" if dirty else "")
    return src, f"{version} ({_digest(src / 'beat_claims')})"


# -- the run --------------------------------------------------------------------------------
class Chaos:
    """Runs the fleet, the chaos, the drain and the analysis of one run."""

    def __init__(self, cfg: Config, workdir: Path,
                 starting: contextlib.AbstractContextManager[Any] | None = None) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.starting = starting or contextlib.nullcontext()
        self.rng = random.Random(cfg.seed)
        if cfg.store not in STORES:
            raise SystemExit(f"--store: {cfg.store!r} is not one of {', '.join(STORES)}")
        self.store = STORES[cfg.store](workdir)
        self.broker = RedisServer("broker", workdir, persistent=False)
        self.src, self.version = snapshot(workdir, cfg.at_commit)
        self.fleet = Fleet(cfg, self.store.url, self.broker, workdir, self.src)
        self.ledger = workdir / "ledger.jsonl"
        self.periods = cfg.schedule()
        self.events: list[Event] = []
        self.anchors: dict[str, int] = {}
        self.t0 = time.time()
        self.paused: Proc | None = None

    def say(self, message: str) -> None:
        if self.cfg.verbose:
            label = f" {self.cfg.label}" if self.cfg.label else ""
            sys.stderr.write(f"[chaos{label} {time.time() - self.t0:7.1f}s] {message}\n")
            sys.stderr.flush()

    @contextlib.contextmanager
    def open_store(self) -> Iterator[Store]:
        """The store through its contract (``open_store``), as a beat of the app opens it."""
        store = open_store(Settings(url=self.store.url, history_limit=HISTORY_LIMIT),
                           timeout=5.0)
        try:
            yield store
        finally:
            store.close()

    def read_anchors(self) -> dict[str, int]:
        with self.open_store() as store:
            return {e.name: e.anchor for e in store.entries(list(self.periods))
                    if e.anchor is not None}

    # -- phases ---------------------------------------------------------------------
    def start(self) -> None:
        """The fleet up: its processes' start-up (each imports Celery and beat-claims: a
        second or so of CPU) inside ``starting``, which runs at once in one process share
        to start one after another.

        The beats start with the workers, not once the workers are ready: what they send
        before a worker is ready waits in the broker. ``starting`` ends once every process
        is through its start-up (each worker ready, each beat logging its owner: its CPU
        spent); the beats' wait before their first claims (a heartbeat TTL, to join the
        store) and the first execution are waited for after it."""
        with self.starting:
            self.store.start()
            self.broker.start()
            beats = [self.fleet.beat() for _ in range(self.cfg.beats)]
            workers = [self.fleet.worker() for _ in range(self.cfg.workers)]
            for proc, ready, what in [*((w, _ready, "ready") for w in workers),
                                      *((b, _beat_started, "started") for b in beats)]:
                wait_for(partial(ready, proc), 90, f"{proc.name} to be {what}")
                if not proc.alive():
                    raise RuntimeError(f"{proc.name} exited:\n{proc.text()[-3000:]}")
        self.anchors = wait_for(
            lambda: (a := self.read_anchors()) and len(a) == len(self.periods) and a, 60,
            "the entries to be anchored")
        wait_for(lambda: read_ledger(self.ledger), 60, "the first execution")
        self.say(f"fleet up: {self.cfg.beats} beats, {self.cfg.workers} workers x"
                 f" {self.cfg.concurrency}, {len(self.periods)} entries;"
                 f" {self.store.where()}, broker port {self.broker.port}")

    def kill_one(self, note: str = "", **replacement_env: str) -> Proc:
        """SIGKILL or SIGTERM a random beat (not the paused one); start a replacement."""
        victims = [b for b in self.fleet.live("beat") if b is not self.paused]
        if not victims:
            return self.fleet.beat(**replacement_env)
        victim = self.rng.choice(victims)
        sig = self.rng.choice((signal.SIGKILL, signal.SIGTERM))
        # At a due instant plus a few ms: the victim is often claiming or sending then.
        at = next_due_instant(self.anchors, self.periods, time.time())
        at += self.rng.uniform(0.0, 0.015)
        time.sleep(max(0.0, at - time.time()))
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim.pid, sig)
        now = time.time()
        replacement = self.fleet.beat(**replacement_env)
        kind = "sigkill" if sig == signal.SIGKILL else "sigterm"
        self.events.append(Event(kind, now, now + self.cfg.heartbeat_ttl + self.cfg.heartbeat,
                                 f"{kind.upper()} {victim.name} (pid {victim.pid}),"
                                 f" replaced by {replacement.name}{note}", beat=victim.name))
        self.say(f"{kind.upper()} {victim.name} pid {victim.pid}; started"
                 f" {replacement.name}{note}")
        return replacement

    def pause_one(self) -> float:
        """Replace a beat by one armed to stop itself (SIGSTOP) inside its first publish;
        returns when to resume it (SIGCONT).

        The armed beat's heartbeat is ``pause_heartbeat``: with a TTL longer than the pause
        it stays alive to the store while stopped, so its claims are taken over by
        ``reclaim_after`` (case 5 of the README) rather than by heartbeat expiry, which
        would come first with the fleet's own heartbeat.
        """
        cfg = self.cfg
        hb = cfg.pause_heartbeat_seconds
        armed = self.workdir / f"pause-armed-{len(self.fleet.procs)}"
        armed.touch()
        beat = self.kill_one(f" (armed to pause, heartbeat {hb:g}s)", CHAOS_PAUSE_FILE=str(armed),
                             CHAOS_HEARTBEAT=str(hb))
        self.paused = beat
        mode = "inside its first publish"
        try:
            wait_for(lambda: beat.state() == "T" or not beat.alive(), PAUSE_ARM_TIMEOUT,
                     f"{beat.name} to stop itself in a publish", 0.02)
        except TimeoutError:
            try:
                armed.unlink()
            except FileNotFoundError:  # it disarmed the pause just now: it is stopping
                wait_for(lambda: beat.state() == "T", 5, f"{beat.name} to stop", 0.02)
            else:
                os.kill(beat.pid, signal.SIGSTOP)
                mode = "between ticks (it did not publish in time)"
        start = time.time()
        self.events.append(Event("pause", start, start + cfg.pause_seconds,
                                 f"SIGSTOP {beat.name} (pid {beat.pid}) {mode}"
                                 f" for {cfg.pause_seconds:g}s", beat=beat.name))
        self.say(f"SIGSTOP {beat.name} pid {beat.pid} ({mode})")
        return start + cfg.pause_seconds

    def resume(self) -> None:
        if self.paused is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.paused.pid, signal.SIGCONT)
            self.say(f"SIGCONT {self.paused.name}")
            self.paused = None

    def restart_store(self) -> None:
        start = time.time()
        detail = self.store.fault(self.cfg.store_down)
        end = time.time()
        self.events.append(Event(self.store.event, start, end, detail))
        self.say(detail)

    def chaos(self) -> float:
        """Run the chaos for the configured duration; returns its end (epoch seconds)."""
        cfg = self.cfg
        start = time.time()
        end = start + cfg.duration
        lo, hi = cfg.kill_every
        plan: list[tuple[float, int, str]] = [
            (start + self.rng.uniform(lo, hi), 0, "kill"),
            (start + cfg.duration * self.rng.uniform(0.15, 0.35), 1, "pause"),
            (start + cfg.duration * self.rng.uniform(0.6, 0.8), 2, "store"),
        ]
        heapq.heapify(plan)
        seq = 3
        while plan:
            at, _, what = heapq.heappop(plan)
            if at >= end and what == "kill":
                continue  # the pause and the store restart happen even in a short run
            time.sleep(max(0.0, at - time.time()))
            if what == "store" and self.paused is not None:
                heapq.heappush(plan, (time.time() + 3.0, seq, "store"))  # one thing at a time
            elif what == "kill":
                self.kill_one()
                heapq.heappush(plan, (time.time() + self.rng.uniform(lo, hi), seq, "kill"))
            elif what == "pause":
                heapq.heappush(plan, (self.pause_one(), seq, "resume"))
            elif what == "resume":
                self.resume()
            elif what == "store":
                self.restart_store()
            seq += 1
        time.sleep(max(0.0, end - time.time()))
        for beat in self.fleet.procs:  # nothing stays stopped
            if beat.kind == "beat" and beat.alive() and beat.state() == "T":
                os.kill(beat.pid, signal.SIGCONT)
        self.say("chaos over")
        return max(end, time.time())

    def drain(self, end: float, result: Result) -> None:
        """Wait until every occurrence due before ``end`` has executed (bounded)."""
        end_ms = int(end * 1000)
        deadline = self.cfg.reclaim_after + self.cfg.heartbeat_ttl + self.cfg.margin
        result.drain_deadline_s = deadline
        began = time.time()
        want = due_occurrences(self.read_anchors(), self.periods, end_ms)

        def done() -> bool:
            got = {(r["entry"], r["due_ms"]) for r in read_ledger(self.ledger)}
            return want <= got

        with contextlib.suppress(TimeoutError):
            wait_for(done, deadline, "the fleet to drain", 0.2)
        result.drain_s = time.time() - began
        self.say(f"drained in {result.drain_s:.1f}s (deadline {deadline:.0f}s)")

    def stop_fleet(self) -> None:
        """The beats stopped (SIGTERM, at once), the queues emptied by the workers, then the
        workers stopped (SIGTERM, at once: each finishes what it runs)."""
        began = time.time()
        stop_processes([beat.popen for beat in self.fleet.live("beat")], signal.SIGTERM)
        broker = self.broker.client(0)
        # When something was last seen queued or reserved (epoch seconds): from now, so
        # that the quiet period is always watched for (an old ledger is no quiet).
        busy = [time.time()]

        def quiet() -> bool:
            """Nothing queued or reserved, and neither that nor a write to the ledger (its
            modification time) for 2 s."""
            if broker.llen("celery") or broker.hlen("unacked"):
                busy[0] = time.time()
                return False
            written = self.ledger.stat().st_mtime if self.ledger.exists() else 0.0
            return time.time() - max(busy[0], written) >= 2.0

        with contextlib.suppress(TimeoutError):
            wait_for(quiet, 60, "the queues to empty", 0.2)
        stop_processes([worker.popen for worker in self.fleet.live("worker")],
                       signal.SIGTERM, 30)
        self.say(f"fleet stopped in {time.time() - began:.1f}s")

    def settle_store_restarts(self, result: Result) -> None:
        """Extend each store restart by the settle period of the store's new epoch: the
        beats announce in their logs when claiming may start again; no beat claims before
        that, so runs due meanwhile are held back by the restart (and sent, late, by the
        catch-up policy ``all``)."""
        ends = settle_ends(self.fleet, self.cfg.heartbeat_ttl)
        for event in self.events:
            if event.kind not in STORE_EVENTS:
                continue
            mine = [t for t in ends if event.start <= t <= event.end + 120]
            if not mine:
                continue
            event.settle_until = max(mine)
            result.store_settle_s = round(event.settle_until - event.end, 1)
            event.detail += (f"; no claiming until {event.settle_until - event.start:.1f}s after"
                             " the kill (the new epoch's settle period)")
            event.end = max(event.end, event.settle_until + self.cfg.heartbeat)

    def analyse(self, end: float, result: Result) -> None:
        end_ms = int(end * 1000)
        self.settle_store_restarts(result)
        anchors = self.read_anchors()
        result.reanchored = sorted(n for n in self.anchors if anchors.get(n) != self.anchors[n])
        rows = read_ledger(self.ledger)
        result.executions = len(rows)
        by_key: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for row in rows:
            by_key.setdefault((row["entry"], row["due_ms"]), []).append(row)
        want = due_occurrences(anchors, self.periods, end_ms)
        result.due = len(want)
        result.executed = len(want & set(by_key))
        result.duplicates = {f"{e} due {iso(d)}": len(v) for (e, d), v in by_key.items()
                             if len(v) > 1}
        grid = due_occurrences(anchors, self.periods, max((d for _, d in by_key), default=0))
        result.off_schedule = sorted(f"{e} due {iso(d)}" for e, d in set(by_key) - grid)
        with self.open_store() as store:
            records = {name: {r.due: r for r in store.history(name)} for name in self.periods}
        # An execution whose token is not the one the store recorded for the run ran
        # without the store knowing (unfenced: the store was down when it started).
        result.counts["executions_with_other_token"] = sum(
            1 for (entry, due), execs in by_key.items() for r in execs
            if (run := records.get(entry, {}).get(due)) is not None
            and r.get("token") != run.token)
        # The truth about takeovers: runs whose record says they were taken back from a
        # beat (the logs say why; beats sweeping together may both log the same claims).
        result.counts["runs_taken_back"] = sum(
            1 for runs in records.values() for run in runs.values() if run.reclaimed_from)
        for entry, due in sorted(want - set(by_key), key=lambda k: (k[1], k[0])):
            run = records.get(entry, {}).get(due)
            state = run.state.value if run is not None else "no record"
            explained = run is not None and state == "skipped" and run.reason is not None
            result.missed.append({
                "entry": entry, "due": iso(due), "state": state,
                "reason": run.reason.value if run is not None and run.reason else None,
                "explained": explained,
                "record": run.as_dict() if run is not None else None,
            })
        result.missed_unexplained = sum(1 for m in result.missed if not m["explained"])
        delays = {key: min(r["at"] for r in by_key[key]) - key[1] / 1000
                  for key in want & set(by_key)}
        if delays:
            values = list(delays.values())
            result.p50_delay_s = percentile(values, 0.50)
            result.p99_delay_s = percentile(values, 0.99)
            result.late_over_2s = sum(1 for v in values if v > 2.0)
            owners = self.owner_names()
            for (entry, due), delay in delays.items():
                if delay < LATE:
                    continue
                run = records.get(entry, {}).get(due)
                text, events = self.cause(due, due / 1000 + delay, run, owners)
                for kind in {e.kind for e in events} or {"none"}:
                    worst_of = result.worst_by_cause
                    worst_of[kind] = round(max(worst_of.get(kind, 0.0), delay), 3)
                if delay > result.worst_delay_s:
                    result.worst_delay_s = delay
                    result.worst = {
                        "entry": entry, "due": iso(due), "delay_s": round(delay, 3),
                        "cause": text,
                        "record": run.as_dict() if run is not None else None,
                    }
            if not result.worst:
                (entry, due), delay = max(delays.items(), key=lambda kv: kv[1])
                result.worst_delay_s = delay
                result.worst = {"entry": entry, "due": iso(due),
                                "delay_s": round(delay, 3), "cause": "none (on time)"}
        result.events = list(self.events)
        result.counts.update(log_counts(self.fleet))

    def owner_names(self) -> dict[str, str]:
        """Owner id prefix (8 hex digits) -> the beat's name, from the beats' start lines."""
        names = {}
        for proc in self.fleet.procs:
            if proc.kind == "beat":
                for prefix in _OWNER.findall(proc.text()):
                    names[prefix] = proc.name
        return names

    def cause(self, due_ms: int, started: float, run: Run | None, owners: dict[str, str]
              ) -> tuple[str, list[Event]]:
        """Which chaos event held this occurrence back. Returns a description and the
        events.

        The run's record names the beat it was taken back from (``reclaimed_from``) or,
        for a claim given back at a stop, the beat that released it (``released_by``): a
        kill or the pause of that beat while the run waited, and a store restart that
        overlapped its wait (the outage, then the new epoch's settle period: claims held
        through it are taken back by their own beat, which is alive), may each have held it
        back; the cause is the one of them that ended last. Failing both, an earlier event
        of that beat, else the machine's load.
        """
        lo, hi = due_ms / 1000 - 1, started
        holder, how = None, ""
        if run is not None and run.reclaimed_from:
            holder, how = owners.get(run.reclaimed_from[:8]), "taken over from"
        elif run is not None and run.released_by:
            holder, how = owners.get(run.released_by[:8]), "released by"
        of_holder = [e for e in self.events if holder is not None and e.beat == holder
                     and e.start <= started]
        during = [e for e in of_holder if e.overlaps(lo, hi)][-1:]
        outages = [e for e in self.events if e.kind in STORE_EVENTS and e.overlaps(lo, hi)]
        if during or outages:
            # Both may have held it: the one that let go last (a claim released by a
            # stopped beat just before the store went down waited for the store).
            last = max(during + outages, key=lambda e: e.end)
            if last in during:
                return f"{how} {holder}: {last.detail}", [last]
            via = f"{how} {holder} ({during[0].detail}), then " if during else (
                f"{how} {holder}, " if holder else "")
            return via + last.detail, [last]
        if of_holder:
            return f"{how} {holder}: {of_holder[-1].detail}", of_holder[-1:]
        near = "; ".join(e.detail for e in self.events if e.overlaps(lo, hi))
        if holder is not None:
            return f"{how} {holder}: no chaos event of it" + (f" (near {near})" if near
                                                               else ""), []
        return "no chaos event held it (load" + (f"; near {near})" if near else ")"), []

    def run(self) -> Result:
        result = Result(config={**asdict(self.cfg), "workdir": str(self.workdir)},
                        workdir=str(self.workdir), version=self.version)
        try:
            self.start()
            end = self.chaos()
            self.drain(end, result)
            self.stop_fleet()
            self.analyse(end, result)
        finally:
            self.fleet.close()
            self.store.stop()
            self.broker.stop()
        self.say("judged; store and broker stopped")
        return result


def run(cfg: Config, starting: contextlib.AbstractContextManager[Any] | None = None
        ) -> Result:
    """One chaos run in ``cfg.workdir`` (a new temporary directory when None). ``starting``
    (a lock that runs at once in one process share): held while the fleet starts."""
    workdir = cfg.workdir or Path(tempfile.mkdtemp(prefix="beat-claims-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    result = Chaos(cfg, workdir, starting).run()
    # Everything the run found, beside its logs and ledger (kept with --keep).
    (workdir / "result.json").write_text(json.dumps({
        **result.figures(), "events": [asdict(e) for e in result.events],
        "worst": result.worst, "missed_runs": result.missed,
        "duplicate_runs": result.duplicates, "off_schedule_runs": result.off_schedule,
        "reanchored_entries": result.reanchored, "config": result.config,
    }, indent=1, default=str))
    return result


def summary(result: Result) -> str:
    f = result.figures()
    lines = [
        f"chaos run: {f['duration_s']:g}s, seed {f['seed']}, beat_claims {result.version},"
        f" workdir {result.workdir}",
        f"  chaos:      {f['sigkill']} SIGKILL + {f['sigterm']} SIGTERM of beats,"
        f" {f['store_restarts']} store restart(s), {f['store_outages']} store outage(s)"
        f" ({f['store']}), {f['pauses']} SIGSTOP pause(s)",
    ]
    lines += [f"    {time.strftime('%H:%M:%S', time.localtime(e.start))} {e.detail}"
              for e in result.events if e.kind in ("pause", *STORE_EVENTS)]
    if result.store_settle_s is not None:
        lines.append(f"    the store's new epoch: claiming resumed {result.store_settle_s:.1f}s"
                     " after the store was back (settle period)")
    lines += [
        f"  due:        {f['due']} occurrences (first after each anchor .. end of chaos)",
        f"  executed:   {f['executed']} ({f['executions']} executions in the ledger)",
        f"  duplicates: {f['duplicates']} {list(result.duplicates)[:5] or ''}",
        f"  missed:     {f['missed']} ({f['missed_unexplained']} unexplained)",
        f"  off-schedule executions: {f['off_schedule']}; re-anchored entries:"
        f" {len(result.reanchored)}",
        f"  delay:      p50 {f['p50_delay_s']:.3f}s, p99 {f['p99_delay_s']:.3f}s,"
        f" worst {f['worst_delay_s']:.3f}s ({f['worst_delay_entry']} due"
        f" {f['worst_delay_due']}), {f['late_over_2s']} later than 2s",
        f"  worst delay cause: {f['worst_delay_cause']}",
        "  worst delay by cause (late > 0.25 s): " + (", ".join(
            f"{k} {v:.3f}s" for k, v in sorted(result.worst_by_cause.items())) or "none"),
        f"  drain:      {f['drain_s']:.1f}s (deadline {result.drain_deadline_s:.0f}s)",
        "  logs:       " + ", ".join(f"{k}={v}" for k, v in sorted(result.counts.items())),
    ]
    for miss in result.missed[:10]:
        lines.append(f"  MISSED {miss['entry']} due {miss['due']}: {miss['state']}"
                     f" {miss['reason'] or ''} {json.dumps(miss['record'])}")
    lines.append("  result:     " + ("OK" if result.ok else "FAILED"))
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0, help="chaos seconds (300)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--beats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--entries", type=int, default=10)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--reclaim-after", type=float, default=10.0)
    parser.add_argument("--pause", type=float, default=None,
                        help="SIGSTOP length (default reclaim_after + 2)")
    parser.add_argument("--pause-heartbeat", type=float, default=None,
                        help="heartbeat of the paused beat (default reclaim_after / 2)")
    parser.add_argument("--store", choices=sorted(STORES), default="redis",
                        help="the beat-claims store: a redis-server of the run's own"
                             " (crashed and restarted once), a SQLite file (its writer lock"
                             " held once) or a database on the machine's PostgreSQL (its"
                             " sessions cut and refused once); the broker is always a"
                             " redis-server of the run's own")
    parser.add_argument("--store-down", type=float, default=2.0,
                        help="seconds the store is down (or locked, or refusing) once")
    parser.add_argument("--margin", type=float, default=20.0,
                        help="drain deadline beyond reclaim_after + heartbeat TTL")
    parser.add_argument("--no-fence", action="store_true",
                        help="workers without beat_claims.install(app): shows what the"
                             " fencing prevents (expect duplicates)")
    parser.add_argument("--at-commit", metavar="REV", default=None,
                        help="run the fleet on beat_claims/ of this commit (git archive)"
                             " instead of a copy of the working tree's; the run reads the"
                             " store through the working tree's contract, so REV must share"
                             " it")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="logs, ledger and redis data (default: a new temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the workdir after success")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    cfg = Config(duration=args.duration, seed=args.seed, beats=args.beats,
                 workers=args.workers, concurrency=args.concurrency, entries=args.entries,
                 heartbeat=args.heartbeat, reclaim_after=args.reclaim_after, pause=args.pause,
                 pause_heartbeat=args.pause_heartbeat, fence=not args.no_fence,
                 store_down=args.store_down, store=args.store, margin=args.margin,
                 workdir=args.workdir,
                 at_commit=args.at_commit,
                 verbose=not args.json)
    return cfg, args


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(argv)
    result = run(cfg)
    if not args.json:
        print(summary(result))
    print(json.dumps(result.figures()))
    if result.ok and not args.keep and cfg.workdir is None:
        shutil.rmtree(result.workdir, ignore_errors=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
