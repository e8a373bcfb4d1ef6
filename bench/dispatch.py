#!/usr/bin/env python
"""Dispatch benchmark: Celery's PersistentScheduler, RedBeat and beat-claims in one run.

Workloads
---------
* ``due_<N>``: N interval entries (``--entries 1000,5000,10000``) all due at the same
  instant T. Figures: T until the last of the N messages is published, the p50/p99 of the
  per-message lag (publish time - T), Redis commands and client round trips, CPU seconds
  and peak RSS of the beat processes.
* ``idle_<N>``: N entries (``--idle-entries``, 10,000; 50,000 for the large idle case)
  none of which is due for an hour. Figures: CPU seconds per minute of the beat processes
  over ``--idle-seconds`` (60), peak RSS (setup included) and RSS at the end of the window.
* ``dynamic_<N>``: N entries created through each scheduler's run-time API before one beat
  starts (``--dynamic-entries 10000,100000``; ``bench/dynamic.py``, whose docstring has the
  method): RedBeat's ``RedBeatSchedulerEntry(...).save()``, beat-claims'
  ``Entries(app).bulk_create`` (``beat_claims_1`` on each ``--store``), none due for an
  hour, and a few due soon that the beat must send once. Figures: create seconds, the
  store's bytes per entry, the beat's startup (spawn until ready to claim), peak RSS and
  idle CPU per minute over ``--idle-seconds``; ratios beat-claims / RedBeat.
* ``steady_<N>``: N entries of a one-minute crontab created through each scheduler's API
  as for ``dynamic_<N>`` (``--steady-entries 100000``; ``bench/steady.py``, whose
  docstring has the method), beat-claims' with the claims policy ``jitter`` of 60 s, so
  that the minute's N occurrences are sent evenly through it (Celery's crontab has a
  resolution of a minute: without a jitter they are a burst at hh:mm:00, measured by
  ``due_<N>``), sent for ``--steady-minutes`` whole minutes by ``--beats`` beats of
  beat-claims (``beat_claims_K`` on each ``--store``) and by one RedBeat beat (no jitter:
  its minute-start burst). Figures, per minute and overall: the (entry, due) pairs at
  the broker, missing and duplicate ones, the lateness (publish - (due + the
  occurrence's jitter offset)) p50/p99/max, each beat's CPU seconds per minute and peak
  RSS; ratios beat-claims / RedBeat, and issue 22's goals (two beats: every occurrence
  once, lateness p99 at most 1 s).

Schedulers (``--schedulers``, ``--beats``, ``--at-commit``)
-----------------------------------------------------------
``persistent`` (``celery.beat.PersistentScheduler``, one beat), ``redbeat``
(``redbeat.RedBeatScheduler``, one beat, the one holding RedBeat's lock), ``send_task``
(``bench/bare.py``: a bare ``app.send_task`` loop on one reused producer, the floor of a
publish with Celery; the goal ``beat_claims_1_cpu_at_most_1.5x_send_task_due_N`` compares
the CPU per run of one beat-claims beat with it) and
``beat_claims`` with 1, 2 and 4 beats (separate processes on one store; the check is that
exactly N messages are published, each entry once). ``--at-commit REV`` runs beat-claims
of another commit too, in the same run (cases ``beat_claims_K@<short hash>``, round-robin
with the others): its ``beat_claims/`` is extracted with ``git archive`` to a temporary
directory, which those beats put first on ``sys.path``. Every scheduler runs with
``beat_max_loop_interval = 5`` and its default settings otherwise.

beat-claims' store (``--store redis,sqlite,postgres,mysql``; Redis only by default): each
store is a case of its own (``beat_claims_K`` on Redis, ``beat_claims_K+sqlite``,
``beat_claims_K+postgres``, ``beat_claims_K+mysql``), and every run starts on an empty one:
the private store redis-server (flushed), a new SQLite file in the run's temporary
directory, or a database of the benchmark's own on the machine's PostgreSQL
(``BC_PGHOST``, ``BC_PGPORT``, ``BC_PGUSER``; 127.0.0.1:5432, postgres) or MySQL / MariaDB
(``BC_MYHOST``, ``BC_MYPORT``, ``BC_MYUSER``, ``BC_MYPASSWORD``; 127.0.0.1:3306, root),
created at the start, every store schema (or table) in it dropped before each run, dropped
at the end. Another store is compared with Redis by the
ratio of their times to the last publish (``beat_claims_K+<store>/beat_claims_K``; the goal:
at most 2). Its setup is known to be done when its tables hold at least one row per entry;
a PostgreSQL statement (psycopg's ``Cursor.execute``) and a MySQL query (one statement or
a batch of them) or commit (PyMySQL's or mysqlclient's ``Connection.query``, ``commit``)
count as a store round trip; SQLite
has none (the file is read in the beat's process), nor has any store but Redis store
commands. PersistentScheduler and RedBeat keep their own state as always (a file; the
store redis-server).

Every scheduler is used only as ``celery beat -S <class>`` uses it, so that any version
of beat-claims can be measured: ``celery.beat.Service`` loads the class by name and builds
it, ``beat_init`` is sent (RedBeat takes its lock there), and the beat is driven by
``tick()``, ``should_sync()``/``_do_sync()`` and, at the end, ``Service.sync()`` (the
scheduler's ``close()``). beat-claims is configured only by ``app.conf``
(``beat_claims_url``, ``beat_claims_key_prefix``), and nothing reads its store: what was
sent is counted and decoded at the broker (the ``beat_claims`` header gives each message's
due instant), and its setup is known to be done when the store holds at least one key per
entry (``DBSIZE``, whatever the key layout).

Method
------
The benchmark starts two private ``redis-server`` processes on free ports (``--save ""
--appendonly no``): the *store* (beat-claims' store, RedBeat's keys) and the *broker*
(queue ``celery``). Both are flushed before every run, so every beat-claims run starts on
a fresh store: a new store epoch, on which beat-claims since ``dc23230`` registers nothing
and claims nothing for one heartbeat TTL (15 s with the default 5 s heartbeat). That wait
is part of the setup (``settle_seconds``), never of the burst. No worker runs: messages
stay in the queue, where the parent counts them (``LLEN``) and decodes them at the end of
the run.

Each beat is a child process (``spawn``). It imports Celery, kombu, redis-py and the
scheduler first, then receives the configuration, builds the scheduler and ticks it while
nothing is due until it is ready (setup: one tick for Celery and RedBeat; for beat-claims,
until its entries are registered, then one more tick), and then, once every beat of the
run is ready, is driven the way ``celery beat``'s ``Service.start`` drives it: ``tick()``,
sleep what it returns, ``_do_sync()`` when ``should_sync()``. In each beat process,
kombu's ``Producer.publish`` is wrapped to record the time of every publish (and the due
instant of the ``beat_claims`` header); redis-py's ``send_packed_command`` is wrapped to
count client round trips (a pipeline or a Lua call is one), attributed to the store or the
broker by the connection's port; and every tick records its wall-clock and CPU times and
the round-trip counters, so the figures of a window are exact sums over the ticks in it.

The due instant T: Celery and RedBeat entries get ``last_run_at = A`` (when the
configuration is sent) and an interval of one hour, so T = A + lead. beat-claims anchors
interval entries in its store when it registers them (the first run is one period after
the anchor), so its entries have an interval equal to the lead and T is the anchor + lead,
read exactly from the ``due`` of the ``beat_claims`` header of each message. The lead is
long enough for every beat to be ready before T (``--lead``; a run whose beats were not
ready in time is run again with twice the lead). For beat-claims the next occurrence is
one lead after T, so a burst must end within the lead (messages of a later occurrence are
counted and flagged, never mixed in).

Redis commands per run are the ``INFO commandstats`` deltas of each server between just
before T and the moment the parent sees the N-th message (the parent's own ``LLEN`` polls
and ``INFO`` calls are subtracted; commands run inside Lua scripts count); the store
server's time in script calls (FCALL and EVALSHA, their commands included) over the same
span is ``store_script_ms``, and per call ``store_script_usec_per_call``. Round trips and
CPU seconds are summed over the ticks of every beat that end after T and start before the
last publish (``time.process_time`` of the beat, nanosecond resolution). Peak RSS is
``VmHWM`` of each beat process (the whole life of the process); the idle workload also
reports ``VmRSS`` when the window ends. Idle CPU is ``time.process_time`` of each beat,
read at both ends of the window by a helper thread of the beat that sleeps on a queue
otherwise.

Cases run round-robin (each repeat runs every workload and scheduler once before the next
repeat starts), so slow drifts in machine load spread over all of them; medians over
``--repeat`` runs are reported. A run not done after ``--timeout`` seconds is stopped and
reported as ``timeout`` with the number of messages it had sent.

Usage::

    python bench/dispatch.py                                   # everything (long)
    python bench/dispatch.py --entries 1000,5000 --repeat 3 --idle-seconds 30
    python bench/dispatch.py --schedulers beat_claims --beats 1,2 --idle-seconds 0
    python bench/dispatch.py --entries 1000 --beats 1 --idle-seconds 0 \\
        --store redis,sqlite,postgres,mysql                    # beat-claims on each store
    python bench/dispatch.py --entries 0 --idle-entries 50000 --schedulers redbeat,beat_claims \\
        --beats 1 --at-commit 1bad067                          # the large idle case
    python bench/dispatch.py --entries 0 --idle-entries 0 --dynamic-entries 10000,100000 \\
        --schedulers redbeat,beat_claims --beats 1 --redbeat-create both  # run-time entries
    python bench/dispatch.py --entries 0 --idle-entries 0 --steady-entries 100000 \\
        --steady-minutes 3 --schedulers redbeat,beat_claims --beats 1,2 --repeat 1  # steady

The last line printed is one JSON document with every figure (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

if __package__ in (None, ""):  # run as a script: bench/ (bench.dynamic) from this checkout
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

QUEUE = "celery"
TASK = "bench.noop"
KEY_PREFIX = "bench-claims"
MAX_LOOP_INTERVAL = 5.0
IDLE_INTERVAL = 3600.0  # idle entries are due in an hour
ONE_HOUR = 3600.0  # Celery's and RedBeat's interval in the burst (no second occurrence)
SCHEDULERS = ("persistent", "redbeat", "beat_claims", "send_task")
LABELS = {
    "persistent": "celery.beat.PersistentScheduler",
    "redbeat": "redbeat.RedBeatScheduler",
    "beat_claims": "beat_claims.Scheduler",
    "send_task": "bench.bare:BareSender",
}
#: The schedulers beat-claims is compared with, as ratios of each workload's figures.
OTHERS = ("persistent", "redbeat", "send_task")
#: beat-claims' stores (``--store``): Redis is the private store redis-server; SQLite a new
#: file per run; PostgreSQL and MySQL a database of the run's own on the machine's server.
STORES = ("redis", "sqlite", "postgres", "mysql")
READY_MARGIN = 0.3  # every beat must be ready this long before T
POLL = 0.01  # parent's LLEN poll period during a burst


# -- private redis-server processes ------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A throw-away redis-server without persistence, stopped by ``stop()``."""

    def __init__(self, name: str) -> None:
        import redis

        exe = shutil.which("redis-server")
        if not exe:
            sys.exit("redis-server not found on PATH")
        self.name = name
        self.dir = tempfile.mkdtemp(prefix=f"bench-{name}-")
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(port=self.port)
        deadline = time.time() + 10
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.time() > deadline or self.proc.poll() is not None:
                    self.stop()
                    sys.exit(f"redis-server ({name}) did not start")
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def commandstats(self) -> dict[str, int]:
        return {k.removeprefix("cmdstat_"): int(v["calls"])
                for k, v in self.client.info("commandstats").items()}

    def script_time(self) -> tuple[int, int]:
        """Script calls (FCALL and EVALSHA) so far, and the server's microseconds in them
        (INFO commandstats: the commands they ran included)."""
        stats = self.client.info("commandstats")
        calls = usec = 0
        for name in ("cmdstat_fcall", "cmdstat_evalsha"):
            calls += int(stats.get(name, {}).get("calls", 0))
            usec += int(stats.get(name, {}).get("usec", 0))
        return calls, usec

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _busy_cpu(servers: tuple[RedisServer, ...]) -> tuple[float, float]:
    """(CPU seconds the whole machine has been busy, of which the redis-servers and this
    process): the difference over a window shows other load on the machine."""
    import psutil

    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    ours = sum(sum(psutil.Process(s.proc.pid).cpu_times()[:2]) for s in servers)
    return busy, ours + time.process_time()


def _server_cpu(servers: tuple[RedisServer, ...]) -> tuple[float, ...]:
    """CPU seconds (user and system) each redis-server has used so far, then the seconds
    the hypervisor has kept this VM's CPUs from running so far (steal)."""
    import psutil

    steal = getattr(psutil.cpu_times(), "steal", 0.0)
    return (*(sum(psutil.Process(s.proc.pid).cpu_times()[:2]) for s in servers), steal)


def _other_cpu(before: tuple[float, float], after: tuple[float, float],
               beats_cpu: float) -> float:
    """Busy CPU seconds of the machine in a window not spent by the benchmark."""
    return round(max(0.0, (after[0] - before[0]) - (after[1] - before[1]) - beats_cpu), 2)


def _command_delta(before: dict[str, int], after: dict[str, int],
                   own: dict[str, int]) -> dict[str, int]:
    """Commands run between two snapshots, minus the parent's own (``own``) and INFO."""
    out = {}
    for name, calls in after.items():
        n = calls - before.get(name, 0) - own.get(name, 0)
        if n > 0 and name != "info":
            out[name] = n
    return out


# -- beat-claims' stores other than the store redis-server --------------------------------
def _pg_params() -> tuple[str, str, str]:
    return (os.environ.get("BC_PGHOST", "127.0.0.1"), os.environ.get("BC_PGPORT", "5432"),
            os.environ.get("BC_PGUSER", "postgres"))


def _pg_url(dbname: str) -> str:
    host, port, user = _pg_params()
    return f"postgresql://{user}@{host}:{port}/{dbname}"


#: The schemas of a database that are never a store's.
_PG_SYSTEM = "nspname NOT LIKE 'pg\\_%' AND nspname NOT IN ('public', 'information_schema')"


class PostgresDatabase:
    """A database of the run's own on the machine's PostgreSQL (``BC_PGHOST``,
    ``BC_PGPORT``, ``BC_PGUSER``; 127.0.0.1:5432, postgres), dropped by ``stop()``. Each
    run starts on an empty one: every schema a store made is dropped (whatever its name,
    for any version of beat-claims)."""

    def __init__(self) -> None:
        import psycopg

        self.name = f"beat_claims_bench_{os.urandom(5).hex()}"
        try:
            self._admin(f'CREATE DATABASE "{self.name}"')
        except psycopg.OperationalError as exc:
            sys.exit(f"--store postgres: PostgreSQL at {_pg_url('postgres')} is needed: {exc}")
        self.url = _pg_url(self.name)

    @staticmethod
    def _admin(statement: str) -> None:
        import psycopg

        with psycopg.connect(_pg_url("postgres"), autocommit=True, connect_timeout=5) as c:
            c.execute(statement)

    def flush(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE datname = current_database() AND pid <> pg_backend_pid()")
            for (schema,) in conn.execute(
                    f"SELECT nspname FROM pg_namespace WHERE {_PG_SYSTEM}").fetchall():
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')

    def server_version(self) -> str:
        import psycopg

        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else ""

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


class MySQLDatabase:
    """A database of the run's own on the machine's MySQL or MariaDB (``BC_MYHOST``,
    ``BC_MYPORT``, ``BC_MYUSER``, ``BC_MYPASSWORD``; 127.0.0.1:3306, root), dropped by
    ``stop()``. Each run starts on an empty one: every table in it is dropped."""

    def __init__(self) -> None:
        import pymysql

        self.host = os.environ.get("BC_MYHOST", "127.0.0.1")
        self.port = int(os.environ.get("BC_MYPORT", "3306"))
        self.user = os.environ.get("BC_MYUSER", "root")
        self.password = os.environ.get("BC_MYPASSWORD", "")
        self.name = f"beat_claims_bench_{os.urandom(5).hex()}"
        try:
            self._admin(f"CREATE DATABASE `{self.name}`")
        except pymysql.err.MySQLError as exc:
            sys.exit(f"--store mysql: MySQL at {self.host}:{self.port} is needed: {exc}")
        auth = f"{self.user}:{self.password}" if self.password else self.user
        self.url = f"mysql://{auth}@{self.host}:{self.port}/{self.name}"

    def _admin(self, statement: str, dbname: str | None = None) -> list[Any]:
        import pymysql

        conn = pymysql.connect(host=self.host, port=self.port, user=self.user,
                               password=self.password, database=dbname, autocommit=True,
                               connect_timeout=5)
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
                return list(cur.fetchall())
        finally:
            conn.close()

    def flush(self) -> None:
        for (session,) in self._admin("SELECT ID FROM information_schema.PROCESSLIST"
                                      f" WHERE DB = '{self.name}' AND ID <> CONNECTION_ID()"):
            with contextlib.suppress(Exception):
                self._admin(f"KILL {int(session)}")
        for (table,) in self._admin("SHOW TABLES", self.name):
            self._admin(f"DROP TABLE IF EXISTS `{table}`", self.name)

    def server_version(self) -> str:
        rows = self._admin("SELECT VERSION()")
        return str(rows[0][0]) if rows else ""

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._admin(f"DROP DATABASE IF EXISTS `{self.name}`")


Database = PostgresDatabase | MySQLDatabase


def _store_url(case_store: str, store: RedisServer, databases: dict[str, Database],
               workdir: str) -> str:
    """beat-claims' store of a run, empty: the (flushed) store redis-server, a new SQLite
    file, or the run's PostgreSQL or MySQL database with every store schema (or table)
    dropped."""
    if case_store == "sqlite":
        return f"sqlite:///{tempfile.mkdtemp(dir=workdir)}/claims.db"
    if case_store in ("postgres", "mysql"):
        database = databases[case_store]
        database.flush()
        return database.url
    return store.url


def _store_size(cfg: dict[str, Any]) -> int:
    """Rows or keys in beat-claims' store: how the beats' setup knows that beat-claims
    registered the entries, whatever its version's layout (at least one per entry)."""
    kind = cfg["store_kind"]
    if kind == "redis":
        return _store_keys(cfg["store_port"])
    if kind == "sqlite":
        import sqlite3

        path = cfg["store_url"].partition(":///")[2]
        if not os.path.exists(path):
            return 0
        db = sqlite3.connect(path, timeout=5)
        try:
            tables = [r[0] for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")]
            return sum(int(db.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0])
                       for t in tables)
        finally:
            db.close()
    if kind == "mysql":
        import pymysql

        from beat_claims.stores.mysql import parse_url

        conn = pymysql.connect(**parse_url(cfg["store_url"]), autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW TABLES")
                tables = [str(r[0]) for r in cur.fetchall()]
                total = 0
                for table in tables:
                    cur.execute(f"SELECT count(*) FROM `{table}`")
                    total += int(cur.fetchone()[0])
                return total
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(cfg["store_url"], autocommit=True, connect_timeout=5) as conn:
        tables = conn.execute(
            "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            f" WHERE c.relkind = 'r' AND {_PG_SYSTEM}").fetchall()
        total = 0
        for (table,) in tables:
            row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            total += int(row[0]) if row else 0
        return total


# -- the beat process ----------------------------------------------------------------------
class _Counters:
    """Publishes (time, due header) and redis-py round trips, the same for every scheduler."""

    def __init__(self) -> None:
        import kombu.messaging
        import redis.connection

        self.publishes: list[tuple[float, str | None]] = []
        #: Records every publish instead of ``publishes`` when set (the steady workload:
        #: bench/steady.py's ``Recorder``, compact for hundreds of thousands of them).
        self.recorder: Any = None
        self.store = 0
        self.broker = 0
        self.other = 0
        self.broker_port: int | None = None
        self.store_port: int | None = None
        publish = kombu.messaging.Producer.publish
        send = redis.connection.AbstractConnection.send_packed_command
        counters = self

        def counted_publish(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = publish(self, *args, **kwargs)
            if counters.recorder is not None:
                counters.recorder.add(time.time(), args, kwargs)
                return result
            header = (kwargs.get("headers") or {}).get("beat_claims")
            counters.publishes.append(
                (time.time(), header.get("due") if isinstance(header, dict) else None))
            return result

        def counted_send(self: Any, *args: Any, **kwargs: Any) -> Any:
            port = getattr(self, "port", None)
            if port == counters.broker_port:
                counters.broker += 1
            elif port == counters.store_port:
                counters.store += 1
            else:
                counters.other += 1
            return send(self, *args, **kwargs)

        kombu.messaging.Producer.publish = counted_publish  # type: ignore[method-assign]
        redis.connection.AbstractConnection.send_packed_command = counted_send  # type: ignore

    def count_postgres(self) -> None:
        """Each statement a psycopg cursor sends is one round trip to the store (the
        PostgreSQL store sends one statement per call)."""
        import psycopg

        execute = psycopg.Cursor.execute
        counters = self

        def counted_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
            counters.store += 1
            return execute(self, *args, **kwargs)

        psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]

    def count_mysql(self) -> None:
        """Each query a PyMySQL or mysqlclient connection sends (one statement, or a batch
        of them in one text) and each commit is one round trip to the store."""
        import importlib

        counters = self
        for module in ("pymysql.connections", "MySQLdb.connections"):
            try:
                connection = importlib.import_module(module).Connection
            except ImportError:
                continue
            for method in ("query", "commit"):
                real = getattr(connection, method)

                def counted(self: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
                    counters.store += 1
                    return _real(self, *args, **kwargs)

                setattr(connection, method, counted)


def _peak_rss_kib() -> int:
    """Peak RSS of this process: ``VmHWM`` (Linux), else ``ru_maxrss``.

    ``ru_maxrss`` is not used on Linux: it keeps the high-water mark of the process before
    ``exec``, so a spawned child reports at least the parent's RSS at the time of the fork.
    """
    peak = _vm_kib("VmHWM")
    if peak is not None:
        return peak
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _make_app(cfg: dict[str, Any]) -> Any:
    from celery import Celery

    app = Celery("bench_dispatch", set_as_current=True)
    kind = cfg["scheduler"]
    if kind == "beat_claims":
        # The first occurrence is one period after the anchor the first beat sets.
        entry_extra: dict[str, Any] = {}
        every = cfg["interval"]
    else:
        entry_extra = {"last_run_at": datetime.fromtimestamp(cfg["last_run_at"], timezone.utc)}
        every = cfg["interval"] if cfg["idle"] else ONE_HOUR
    app.conf.update(
        broker_url=cfg["broker_url"],
        beat_max_loop_interval=MAX_LOOP_INTERVAL,
        beat_claims_url=cfg["store_url"],
        beat_claims_key_prefix=KEY_PREFIX,
        redbeat_redis_url=cfg["store_url"],
        timezone="UTC",
        beat_schedule={
            name: {"task": TASK, "schedule": timedelta(seconds=every), "args": (name,),
                   **entry_extra}
            for name in cfg["names"]
        },
    )
    app.conf.update(cfg.get("extra_conf") or {})

    @app.task(name=TASK)
    def noop(name: str) -> None:  # never runs: there is no worker
        return None

    return app


def _build(kind: str, app: Any, workdir: str, index: int) -> Any:
    """The scheduler as ``celery beat -S <class>`` builds it: ``celery.beat.Service`` loads
    the class by name, and ``beat_init`` is sent (RedBeat takes its lock there)."""
    import inspect

    from celery import signals
    from celery.beat import Service

    extra = {}
    if "remote_control" in inspect.signature(Service).parameters:  # Celery 5.7: no pidbox
        extra["remote_control"] = False
    # (a file of its own for PersistentScheduler; the others are given Celery's default,
    # as `celery beat` gives it: beat-claims names a schedule file set, which it ignores)
    filename = (os.path.join(workdir, f"celerybeat-schedule-{index}") if kind == "persistent"
                else app.conf.beat_schedule_filename)
    service = Service(app, max_interval=MAX_LOOP_INTERVAL, scheduler_cls=LABELS[kind],
                      schedule_filename=filename, **extra)
    sched = service.scheduler
    for receiver, response in signals.beat_init.send_robust(sender=service):
        if isinstance(response, Exception):  # celery beat logs and goes on; we cannot
            raise RuntimeError(f"beat_init receiver {receiver!r} failed: {response!r}")
    if kind == "redbeat" and getattr(sched, "lock", None) is None:
        raise RuntimeError("RedBeat did not take its lock")
    return service, sched


def _store_keys(port: int) -> int:
    """Keys in the store (DBSIZE): how the beats' setup knows that beat-claims registered
    the entries, whatever its version's key layout (at least one key per entry)."""
    import redis

    client = redis.Redis(port=port)
    try:
        return int(client.dbsize())
    finally:
        client.close()


def _vm_kib(field: str, pid: int | str = "self") -> int | None:
    """A ``Vm*`` field of /proc/<pid>/status in KiB (this process by default)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def _setup(kind: str, sched: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Tick while nothing is due until the scheduler is ready to send: Celery and RedBeat
    after one tick; beat-claims once the entries are registered in its store, however long
    its version takes (a fresh store is a new epoch: no beat registers or claims for one
    heartbeat TTL). Returns the setup's times."""
    t0 = time.time()
    wait = sched.tick()
    t1 = time.time()
    out: dict[str, Any] = {"first_tick": (t0, t1), "registered_tick": (t0, t1),
                           "setup_ticks": 1}
    if kind == "beat_claims":
        deadline = t0 + cfg["setup_timeout"]
        need = len(cfg["names"])
        while _store_size(cfg) < need:
            if time.time() > deadline:
                raise RuntimeError(f"the entries were not registered within"
                                   f" {cfg['setup_timeout']:g}s")
            time.sleep(min(max(wait or 0.0, 0.01), 0.2))
            r0 = time.time()
            wait = sched.tick()
            out["registered_tick"] = (r0, time.time())
            out["setup_ticks"] += 1
        # Another beat may have registered them while this one still waited: one more
        # tick, so that this beat registers (or has registered) too before T.
        time.sleep(0.1)
        sched.tick()
        out["setup_ticks"] += 1
    if sched.should_sync():  # the first sync of a beat that has been running
        sched._do_sync()
    return out


def _child(kind: str, store_kind: str, index: int, src: str | None, cfg_q: Any, out_q: Any,
           cpu_q: Any, go: Any, stop: Any) -> None:
    """One beat: import, configure, set up, then tick like ``Service.start`` until stopped.

    ``src``: a directory holding the ``beat_claims`` package of another commit, imported
    instead of the working tree's.
    """
    import logging
    import threading

    if src:
        sys.path.insert(0, src)

    def answer_cpu() -> None:  # the parent asks for this process's CPU time (idle window)
        while cpu_q.get() is not None:
            out_q.put(("cpu", index, time.process_time()))

    threading.Thread(target=answer_cpu, daemon=True, name="bench-cpu").start()

    logging.basicConfig(level=logging.WARNING,
                        format=f"%(asctime)s {kind}[{index}] %(levelname)s %(name)s:"
                               " %(message)s")
    warnings: collections.Counter[str] = collections.Counter()

    class _CountWarnings(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings[" ".join(str(record.msg).split()[:6])] += 1

    logging.getLogger().addHandler(_CountWarnings(level=logging.WARNING))
    try:
        counters = _Counters()
        import celery.beat  # noqa: F401  (imported before the clock starts)

        if kind == "redbeat":
            import redbeat  # noqa: F401
        if store_kind == "postgres":
            counters.count_postgres()
        elif store_kind == "mysql":
            counters.count_mysql()
        from bench.dynamic import setup as dynamic_setup  # (before the clock starts)
        from bench.steady import Recorder

        module = version = None
        if kind == "beat_claims":
            import beat_claims

            module = os.path.dirname(os.path.abspath(beat_claims.__file__))
            version = getattr(beat_claims, "__version__", None)
        out_q.put(("imported", index, (os.getpid(), module, version)))
        cfg = cfg_q.get()
        counters.broker_port, counters.store_port = cfg["broker_port"], cfg["store_port"]
        if cfg.get("steady"):
            counters.recorder = Recorder(kind, cfg.get("steady_period"))
        t_setup = time.time()
        app = _make_app(cfg)
        service, sched = _build(kind, app, cfg["workdir"], index)
        if cfg.get("dynamic"):  # entries created at run time: ready when it can claim
            setup = dynamic_setup(kind, sched, cfg)
        else:
            setup = _setup(kind, sched, cfg)
        out_q.put(("ready", index, {
            **setup, "setup_started": t_setup, "ready": time.time(),
            "sent_during_setup": len(counters.publishes)}))
    except Exception:
        out_q.put(("error", index, traceback.format_exc()))
        return
    counters.publishes = []  # (a steady run's recorder keeps the setup's: all are queued)
    go.wait()
    gc_pauses = _GcPauses()
    profiler = None
    if cfg["profile_dir"]:
        import cProfile

        # "cpu": this thread's CPU time (what the benchmark's figure is), without the waits
        # for the next tick or for a reply; "wall": the time elapsed.
        profiler = cProfile.Profile(time.thread_time) if cfg.get("profile_clock") == "cpu" \
            else cProfile.Profile()
        profiler.enable()
    ticks: list[tuple[float, float, float, float, int, int, int, int]] = []
    error = None
    try:
        while not stop.is_set():
            w0, c0, s0, b0 = time.time(), time.process_time(), counters.store, counters.broker
            interval = sched.tick()
            ticks.append((w0, time.time(), c0, time.process_time(), s0, counters.store, b0,
                          counters.broker))
            if interval and interval > 0:
                stop.wait(interval)
                if sched.should_sync():
                    sched._do_sync()
    except Exception:
        error = traceback.format_exc()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(os.path.join(cfg["profile_dir"], f"{cfg['run_id']}-{index}.prof"))
    out_q.put(("result", index, {
        "publishes": counters.publishes, "ticks": ticks, "error": error,
        "recorded": counters.recorder.result() if counters.recorder is not None else None,
        "warnings": dict(warnings), "other_round_trips": counters.other,
        "maxrss_kib": _peak_rss_kib(), "rss_kib": _vm_kib("VmRSS") or 0,
        "gc_full_collections": gc_pauses.full_collections,
        "gc_seconds": gc_pauses.stop()}))
    with contextlib.suppress(Exception):
        service.sync()  # what celery beat does on its way out: the scheduler's close()


def _stolen(run: dict[str, Any], max_steal: float | None) -> bool:
    """Whether the host kept more than ``max_steal`` of the VM's CPU time from it over a
    burst that went through (steal, from /proc/stat)."""
    if max_steal is None or run.get("status") != "ok" or not run.get("seconds"):
        return False
    capacity = run["seconds"] * (os.cpu_count() or 1)
    return run.get("steal_seconds", 0.0) > max_steal * capacity


class _GcPauses:
    """The time the beat spent in the garbage collector since it was made."""

    def __init__(self) -> None:
        import gc

        self.seconds = 0.0
        self.full_collections = 0  # of the oldest generation: they walk the whole heap
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.full_collections += info.get("generation") == 2

    def stop(self) -> float:
        import gc

        gc.callbacks.remove(self._on_gc)
        return round(self.seconds, 3)


# -- the parent: one run ------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    """Where the beats import ``beat_claims`` from: the working tree (``tag`` "") or a
    snapshot of another commit's ``beat_claims/`` (``--at-commit``)."""

    tag: str = ""  # "" or the commit's short hash
    commit: str | None = None  # full hash (None: the working tree)
    path: str | None = None  # the directory to put first on sys.path (None: as installed)


@dataclass(frozen=True)
class Case:
    scheduler: str
    beats: int
    source: Source = Source()
    store: str = "redis"  # beat-claims' store (the others use Redis, as they do)

    @property
    def key(self) -> str:
        if self.scheduler != "beat_claims":
            return self.scheduler
        return bc_case_key(self.beats, self.source.tag, self.store)

    @property
    def label(self) -> str:
        if self.scheduler != "beat_claims":
            return LABELS[self.scheduler]
        at = f" @{self.source.tag}" if self.source.tag else ""
        on = f" [{self.store}]" if self.store != "redis" else ""
        return f"{LABELS[self.scheduler]} x{self.beats}{on}{at}"


def bc_case_key(beats: int, tag: str = "", store: str = "redis") -> str:
    """``beat_claims_<beats>[+<store>][@<tag>]``: the store is named unless it is Redis."""
    return (f"beat_claims_{beats}" + (f"+{store}" if store != "redis" else "")
            + (f"@{tag}" if tag else ""))


class Beats:
    """The beat processes of one run, and the messages they send to the parent."""

    def __init__(self, case: Case) -> None:
        ctx = mp.get_context("spawn")
        self.cfg_q, self.out_q = ctx.Queue(), ctx.Queue()
        self.cpu_qs = [ctx.Queue() for _ in range(case.beats)]
        self.go, self.stop_event = ctx.Event(), ctx.Event()
        self.procs = [ctx.Process(target=_child, args=(case.scheduler, case.store, i,
                                                       case.source.path, self.cfg_q,
                                                       self.out_q, self.cpu_qs[i], self.go,
                                                       self.stop_event),
                                  daemon=True)
                      for i in range(case.beats)]
        for p in self.procs:
            p.start()
        self.pids: dict[int, int] = {}
        self.module: str | None = None  # where the beats imported beat_claims from
        self.version: str | None = None  # and its __version__
        #: The "result" of a beat that stopped while another message was awaited: kept
        #: for :meth:`finish` (its error says why it stopped).
        self.results: dict[int, Any] = {}

    def collect(self, what: str, deadline: float) -> tuple[dict[int, Any], str | None]:
        """The ``what`` message of every beat that sent one by ``deadline``, and why some
        are missing (a beat failed, or the deadline passed), or None."""
        got: dict[int, Any] = dict(self.results) if what == "result" else {}
        while len(got) < len(self.procs):
            try:
                kind, index, payload = self.out_q.get(timeout=max(0.05, deadline - time.time()))
            except Exception:
                missing = sorted(set(range(len(self.procs))) - set(got))
                return got, f"no '{what}' from beat(s) {missing}"
            if kind == "error":
                return got, f"beat {index} failed:\n{payload}"
            if kind == "imported":
                self.pids[index], self.module, self.version = payload
            if kind == what:
                got[index] = payload
            elif kind == "result":  # a beat stopped: it answers nothing more
                self.results[index] = payload
                error = (payload.get("error") or "").strip().splitlines()
                return got, f"beat {index} stopped: {error[-1] if error else 'no error'}"
        return got, None

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by all the beats (``time.process_time`` in each)."""
        return float(sum(self.cpu_by_beat().values()))

    def cpu_by_beat(self) -> dict[int, float]:
        """CPU seconds used so far by each beat (``time.process_time``), by its index."""
        for q in self.cpu_qs:
            q.put(True)
        got, problem = self.collect("cpu", time.time() + 10)
        if problem:
            raise RuntimeError(problem)
        return {index: float(cpu) for index, cpu in got.items()}

    def configure(self, cfg: dict[str, Any]) -> None:
        for _ in self.procs:
            self.cfg_q.put(cfg)

    def finish(self, wait: float) -> dict[int, Any]:
        """Stop the beats; their results (those that could report within ``wait``)."""
        self.stop_event.set()
        self.go.set()
        results, _ = self.collect("result", time.time() + wait)
        for p in self.procs:
            p.join(5)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
        return results


def _decode_queue(client: Any, chunk: int = 20000) -> list[dict[str, Any]]:
    """Every queued message: entry (its only argument), task id, ``beat_claims`` due (read
    ``chunk`` messages a round trip: a steady run leaves hundreds of thousands)."""
    out = []
    for start in range(0, client.llen(QUEUE), chunk):
        for raw in client.lrange(QUEUE, start, start + chunk - 1):
            msg = json.loads(raw)
            body = msg["body"]
            if msg.get("properties", {}).get("body_encoding") == "base64":
                body = base64.b64decode(body)
            header = msg["headers"].get("beat_claims")
            out.append({"entry": json.loads(body)[0][0], "id": msg["headers"].get("id"),
                        "due": header.get("due") if isinstance(header, dict) else None})
    return out


def _iso_to_epoch(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _pct(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of ``values``."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _window(ticks: list[tuple[float, ...]], start: float, end: float) -> dict[str, float]:
    """Sums over one beat's ticks that end after ``start`` and begin before ``end``."""
    inside = [t for t in ticks if t[1] >= start and t[0] <= end]
    if not inside:
        return {"ticks": 0, "cpu": 0.0, "store_rt": 0, "broker_rt": 0}
    first, last = inside[0], inside[-1]
    return {"ticks": len(inside), "cpu": last[3] - first[2], "store_rt": last[5] - first[4],
            "broker_rt": last[7] - first[6]}


def _setup_fields(ready: dict[int, Any], started: float) -> dict[str, Any]:
    """``setup_seconds``: configuration until the last beat was ready; ``settle_seconds``:
    from the first tick until the entries were registered (beat-claims on a fresh store:
    the new epoch's settle period); ``ready_after_register_seconds``: from the first
    registration until the last beat was ready."""
    last_ready = max(r["ready"] for r in ready.values())
    first_tick = min(r["first_tick"][0] for r in ready.values())
    registered = min(r["registered_tick"][0] for r in ready.values())
    return {"setup_seconds": round(last_ready - started, 3),
            "settle_seconds": round(registered - first_tick, 3),
            "ready_after_register_seconds": round(last_ready - registered, 3)}


#: What --profile times (--profile-clock), passed to each beat in its configuration.
PROFILE_CLOCK = "wall"


def _base_cfg(case: Case, names: list[str], store: RedisServer, broker: RedisServer,
              workdir: str, profile_dir: str | None, run_id: str,
              setup_timeout: float, databases: dict[str, Database] | None = None
              ) -> dict[str, Any]:
    on_redis = case.store == "redis"
    return {"scheduler": case.scheduler, "names": names,
            "store_url": _store_url(case.store, store, databases or {}, workdir),
            "store_kind": case.store, "broker_url": broker.url,
            "store_port": store.port if on_redis else None, "broker_port": broker.port,
            "workdir": tempfile.mkdtemp(dir=workdir), "profile_dir": profile_dir,
            "run_id": run_id, "setup_timeout": setup_timeout, "profile_clock": PROFILE_CLOCK}


def _tree_conf(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    """``--tree-conf`` settings: for the working tree's beat-claims beats only (a commit's
    code may not know them)."""
    if case.scheduler != "beat_claims" or case.source.commit is not None:
        return {}
    return dict(args.tree_conf)


def _start_beats(case: Case, args: argparse.Namespace,
                 servers: tuple[RedisServer, ...]) -> Beats | str:
    """Flush the servers and start the beats of a run; they wait for their configuration
    with everything imported. A string says why they could not start."""
    for server in servers:
        server.client.flushall()
    beats = Beats(case)
    _, problem = beats.collect("imported", time.time() + 60)
    if problem:
        beats.finish(3)
        return problem
    check_import(case, args, beats)
    return beats


def check_import(case: Case, args: argparse.Namespace, beats: Beats) -> None:
    """Stop the run if the beats did not import the expected copy of beat_claims; note
    where they imported it from."""
    expected = (os.path.join(case.source.path, "beat_claims") if case.source.path
                else args.beat_claims_path)
    if beats.module and os.path.realpath(beats.module) != os.path.realpath(expected):
        beats.finish(3)
        sys.exit(f"the beats imported beat_claims from {beats.module}, not {expected}")
    if beats.module:
        args.imported[case.source.tag] = {"path": beats.module, "version": beats.version}


def run_burst(case: Case, n: int, lead: float, args: argparse.Namespace, store: RedisServer,
              broker: RedisServer, workdir: str, run_id: str) -> dict[str, Any]:
    """N entries due at T; the run ends when the N-th message is queued (plus ``--grace``)."""
    names = [f"entry-{i:05d}" for i in range(n)]
    out: dict[str, Any] = {"entries": n, "beats": case.beats, "lead": round(lead, 2),
                           "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    beats = _start_beats(case, args, (store, broker))
    if isinstance(beats, str):
        return {**out, "status": "error", "error": beats}
    started = time.time()
    due_at = started + lead  # Celery's and RedBeat's T; beat-claims' T is at least this
    profile = args.profile if case.scheduler in args.profile_schedulers else None
    beats.configure({**_base_cfg(case, names, store, broker, workdir, profile, run_id,
                                 args.setup_timeout, args.databases),
                     "interval": lead, "last_run_at": due_at - ONE_HOUR, "idle": False,
                     "extra_conf": _tree_conf(case, args)})
    # beat-claims anchors the entries when it registers them (T = anchor + lead), after
    # the settle period of a fresh store at some versions: its setup may take longer than
    # the lead; Celery's and RedBeat's T is fixed.
    bc = case.scheduler == "beat_claims"
    ready, problem = beats.collect(
        "ready", started + args.setup_timeout if bc else due_at - READY_MARGIN)
    if problem:
        beats.finish(3)
        status = "setup-too-slow" if problem.startswith("no 'ready'") else "error"
        return {**out, "status": status, "error": problem}
    out.update(_setup_fields(ready, started))
    # beat-claims anchors in the tick that registers: T is at least its start + lead.
    t_lo = min(r["registered_tick"][0] for r in ready.values()) + lead if bc else due_at
    last_ready = max(r["ready"] for r in ready.values())
    early = broker.client.llen(QUEUE)
    if early or any(r["sent_during_setup"] for r in ready.values()):
        beats.finish(3)
        return {**out, "status": "setup-too-slow", "error": f"{early} sent before T"}
    if last_ready > t_lo - READY_MARGIN:
        beats.finish(3)
        return {**out, "status": "setup-too-slow",
                "error": f"the last beat was ready {last_ready - t_lo:+.2f}s from T"}
    beats.go.set()
    time.sleep(max(0.0, t_lo - 0.1 - time.time()))
    stats_before = {s.name: s.commandstats() for s in (store, broker)}
    scripts_before = store.script_time()
    scripts_at_end = scripts_before
    busy_before = _busy_cpu((store, broker))
    busy_after = busy_before
    servers_before = _server_cpu((store, broker))
    servers_after = servers_before
    polls, reached, status = 0, None, "ok"
    stats_at_end: dict[str, dict[str, int]] | None = None
    polls_at_end = 0
    while True:
        time.sleep(POLL)
        now = time.time()
        length = broker.client.llen(QUEUE)
        polls += 1
        if reached is None and (length >= n or now > t_lo + args.timeout):
            stats_at_end = {s.name: s.commandstats() for s in (store, broker)}
            scripts_at_end = store.script_time()
            busy_after = _busy_cpu((store, broker))
            servers_after = _server_cpu((store, broker))
            polls_at_end = polls
            if length < n:
                status = "timeout"
                break
            reached = now
        if reached is not None and now >= reached + args.grace:
            break
        if not any(p.is_alive() for p in beats.procs):
            status = "died" if reached is None else status
            break
    results = beats.finish(10 if status == "ok" else 3)
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    messages = _decode_queue(broker.client)
    out.update(_burst_figures(case, n, due_at, lead, messages, results, status))
    if out.get("later_occurrences"):
        # beat-claims' next occurrence (one lead after T) came before the burst was sent:
        # the figures would mix two occurrences. Run again with a longer lead (period).
        out["status"] = "overlap"
    if args.dump:
        name = f"{run_id}-lead{lead:g}.json"
        with open(os.path.join(args.dump, name), "w") as f:
            json.dump({"due_instant": out.get("due_instant"), "lead": lead,
                       "results": results}, f)
    if out["status"] == "ok" and out.get("cpu_seconds") is not None:
        out["other_cpu_seconds"] = _other_cpu(busy_before, busy_after, out["cpu_seconds"])
        # The store's and the broker's redis-servers: what a beat's publishes and store
        # calls cost the servers that share this VM's cores.
        out["store_server_cpu_seconds"] = round(servers_after[0] - servers_before[0], 3)
        out["broker_server_cpu_seconds"] = round(servers_after[1] - servers_before[1], 3)
        # A VM's CPUs taken by its host: runs of one commit differ most by this.
        out["steal_seconds"] = round(servers_after[2] - servers_before[2], 3)
    if stats_at_end is not None:
        for server in (store, broker) if case.store == "redis" else (broker,):
            own = {"llen": polls_at_end} if server is broker else {}
            delta = _command_delta(stats_before[server.name], stats_at_end[server.name], own)
            out[f"{server.name}_commands"] = sum(delta.values())
            out[f"{server.name}_commands_by_name"] = dict(sorted(delta.items()))
        calls, usec = (end - start for end, start in zip(scripts_at_end, scripts_before))
        if case.store == "redis" and calls:
            out["store_script_ms"] = round(usec / 1000, 1)
            out["store_script_usec_per_call"] = round(usec / calls, 1)
    return out


def _burst_figures(case: Case, n: int, due_at: float, lead: float,
                   messages: list[dict[str, Any]], results: dict[int, Any],
                   status: str) -> dict[str, Any]:
    """Figures of a burst from the queued messages and the beats' publish records.

    Each message is due at T (Celery, RedBeat) or at the ``due`` of its ``beat_claims``
    header. The burst is the occurrences due less than half a lead after the earliest
    (beat-claims entries anchored by different beats at the same moment may be due a few
    milliseconds apart: ``due_spread_ms``); a later occurrence is counted apart.
    """
    epochs: dict[str | None, float] = {None: due_at}

    def due_of(header_due: str | None) -> float:
        if case.scheduler != "beat_claims":
            return due_at
        if header_due not in epochs:
            epochs[header_due] = _iso_to_epoch(header_due) if header_due else math.inf
        return epochs[header_due]

    ours = [m for m in messages if str(m["entry"]).startswith("entry-")]
    t_due = min((due_of(m["due"]) for m in ours), default=due_at)
    if math.isinf(t_due):
        t_due = due_at

    def in_burst(header_due: str | None) -> bool:
        return due_of(header_due) < t_due + lead / 2

    burst = [m for m in ours if in_burst(m["due"])]
    per_entry = collections.Counter(m["entry"] for m in burst)
    out: dict[str, Any] = {
        "status": status,
        "queued": len(messages),
        "entries_sent": len(per_entry),
        "duplicates": sum(c - 1 for c in per_entry.values() if c > 1),
        "later_occurrences": len(ours) - len(burst),
        "exactly_n": len(burst) == n and len(per_entry) == n,
        "due_instant": t_due,
        "due_spread_ms": round(1000 * (max((due_of(m["due"]) for m in burst),
                                           default=t_due) - t_due), 1),
        "errors": [r["error"] for r in results.values() if r.get("error")],
        "warnings": dict(sum((collections.Counter(r["warnings"]) for r in results.values()),
                             collections.Counter())),
    }
    if len(results) < case.beats:
        out["errors"].append(f"only {len(results)} of {case.beats} beats reported")
    if status != "ok":
        out["sent_by_timeout"] = len(burst)
    if not results:
        return out
    per_beat = {i: [(t, due_of(due)) for t, due in r["publishes"] if in_burst(due)]
                for i, r in results.items()}
    stamps = sorted(p for beat in per_beat.values() for p in beat)
    lags = [t - due for t, due in stamps[:n]]
    last = stamps[min(n, len(stamps)) - 1][0] if stamps else t_due
    windows = [_window(r["ticks"], t_due, last) for r in results.values()]
    store_rt = sum(w["store_rt"] for w in windows)
    broker_rt = sum(w["broker_rt"] for w in windows)
    out.update({
        "seconds": round(last - t_due, 4) if status == "ok" and len(stamps) >= n else None,
        "lag_p50_ms": round(1000 * (_pct(lags, 0.50) or 0.0), 1) if lags else None,
        "lag_p99_ms": round(1000 * (_pct(lags, 0.99) or 0.0), 1) if lags else None,
        "published": len(stamps),
        # From the go to the end of the run (the burst, and the grace after it).
        "gc_seconds": round(sum(r.get("gc_seconds", 0.0) for r in results.values()), 3),
        "gc_full_collections": sum(r.get("gc_full_collections", 0) for r in results.values()),
        "published_per_beat": [len(per_beat[i]) if i in per_beat else None
                               for i in range(case.beats)],
        # when each beat published its first and its last message of the burst, ms after T
        "first_last_ms_per_beat": [
            [round(1000 * (per_beat[i][0][0] - t_due)),
             round(1000 * (per_beat[i][-1][0] - t_due))] if per_beat.get(i) else None
            for i in range(case.beats)],
        "cpu_seconds": round(sum(w["cpu"] for w in windows), 3),
        "ticks": sum(w["ticks"] for w in windows),
        "store_round_trips": store_rt,
        "broker_round_trips": broker_rt,
        "round_trips_per_task": round((store_rt + broker_rt) / max(1, len(stamps)), 3),
        "peak_rss_mib": round(max(r["maxrss_kib"] for r in results.values()) / 1024, 1),
        "rss_sum_mib": round(sum(r["maxrss_kib"] for r in results.values()) / 1024, 1),
    })
    if case.store == "sqlite":  # the file is read in the beat's process: no round trips
        out["store_round_trips"] = None
        out["round_trips_per_task"] = round(broker_rt / max(1, len(stamps)), 3)
    return out


def run_idle(case: Case, n: int, seconds: float, args: argparse.Namespace,
             store: RedisServer, broker: RedisServer, workdir: str,
             run_id: str) -> dict[str, Any]:
    """N entries due in an hour; CPU, commands and round trips over ``seconds``."""
    names = [f"entry-{i:05d}" for i in range(n)]
    out: dict[str, Any] = {"entries": n, "beats": case.beats, "window_seconds": seconds,
                           "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    beats = _start_beats(case, args, (store, broker))
    if isinstance(beats, str):
        return {**out, "status": "error", "error": beats}
    started = time.time()
    profile = args.profile if case.scheduler in args.profile_schedulers else None
    beats.configure({**_base_cfg(case, names, store, broker, workdir, profile, run_id,
                                 args.setup_timeout, args.databases),
                     "interval": IDLE_INTERVAL, "last_run_at": started, "idle": True,
                     "extra_conf": _tree_conf(case, args)})
    ready, problem = beats.collect("ready", started + args.setup_timeout + 10)
    if problem:
        beats.finish(3)
        return {**out, "status": "error", "error": problem}
    out.update(_setup_fields(ready, started))
    beats.go.set()
    time.sleep(args.settle)
    try:
        w0, c0 = time.time(), beats.cpu_seconds()
        stats_before = {s.name: s.commandstats() for s in (store, broker)}
        busy_before = _busy_cpu((store, broker))
        time.sleep(seconds)
        w1, c1 = time.time(), beats.cpu_seconds()
        busy_after = _busy_cpu((store, broker))
        stats_after = {s.name: s.commandstats() for s in (store, broker)}
    except RuntimeError as exc:  # a beat died or stopped answering
        beats.finish(3)
        return {**out, "status": "error", "error": str(exc)}
    results = beats.finish(10)
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    per_minute = 60.0 / (w1 - w0)
    windows = [_window([t for t in r["ticks"] if t[0] >= w0 and t[1] <= w1], w0, w1)
               for r in results.values()]
    queued = broker.client.llen(QUEUE)
    out.update({
        "status": "ok" if len(results) == case.beats and not queued else "error",
        "queued": queued,
        "cpu_seconds": round(c1 - c0, 4),
        "other_cpu_seconds": _other_cpu(busy_before, busy_after, c1 - c0),
        "cpu_seconds_per_minute": round((c1 - c0) * per_minute, 4),
        "ticks_per_minute": round(sum(w["ticks"] for w in windows) * per_minute, 1),
        "store_round_trips_per_minute": round(
            sum(w["store_rt"] for w in windows) * per_minute, 1),
        "broker_round_trips_per_minute": round(
            sum(w["broker_rt"] for w in windows) * per_minute, 1),
        "peak_rss_mib": round(max((r["maxrss_kib"] for r in results.values()),
                                  default=0) / 1024, 1),
        "rss_sum_mib": round(sum(r["maxrss_kib"] for r in results.values()) / 1024, 1),
        # resident at the end of the window (the peak includes the setup)
        "rss_end_mib": round(max((r.get("rss_kib", 0) for r in results.values()),
                                 default=0) / 1024, 1),
        "errors": [r["error"] for r in results.values() if r.get("error")],
        "warnings": dict(sum((collections.Counter(r["warnings"]) for r in results.values()),
                             collections.Counter())),
    })
    if case.store == "sqlite":  # the file is read in the beat's process: no round trips
        out["store_round_trips_per_minute"] = None
    for server in (store, broker) if case.store == "redis" else (broker,):
        delta = _command_delta(stats_before[server.name], stats_after[server.name], {})
        out[f"{server.name}_commands_per_minute"] = round(sum(delta.values()) * per_minute, 1)
        out[f"{server.name}_commands_by_name"] = dict(sorted(delta.items()))
    return out


# -- medians, ratios, goals -----------------------------------------------------------------
BURST_FIGURES = ("seconds", "lag_p50_ms", "lag_p99_ms", "cpu_seconds", "peak_rss_mib",
                 "rss_sum_mib", "store_commands", "broker_commands", "store_round_trips",
                 "broker_round_trips", "round_trips_per_task", "ticks", "setup_seconds",
                 "settle_seconds", "store_script_ms", "store_script_usec_per_call",
                 "store_server_cpu_seconds", "broker_server_cpu_seconds", "gc_seconds",
                 "gc_full_collections", "steal_seconds")
IDLE_FIGURES = ("cpu_seconds_per_minute", "store_commands_per_minute",
                "broker_commands_per_minute", "store_round_trips_per_minute",
                "broker_round_trips_per_minute", "ticks_per_minute", "peak_rss_mib",
                "rss_sum_mib", "rss_end_mib", "setup_seconds", "settle_seconds")
RUN_FIELDS = ("status", "seconds", "lag_p50_ms", "lag_p99_ms", "cpu_seconds",
              "cpu_seconds_per_minute", "published_per_beat", "first_last_ms_per_beat",
              "exactly_n", "duplicates", "later_occurrences", "due_spread_ms",
              "sent_by_timeout",
              "store_round_trips", "broker_round_trips", "store_commands", "broker_commands",
              "store_script_ms", "store_script_usec_per_call", "store_server_cpu_seconds",
              "broker_server_cpu_seconds", "gc_seconds", "gc_full_collections",
              "steal_seconds", "lead", "setup_seconds",
              "settle_seconds", "ready_after_register_seconds",
              "peak_rss_mib", "rss_end_mib", "other_cpu_seconds", "loadavg_before",
              "loadavg_after", "error", "errors", "warnings", "attempts", "discarded")
DISCARDED_FIELDS = ("status", "lead", "setup_seconds", "error", "published",
                    "published_per_beat", "first_last_ms_per_beat", "later_occurrences",
                    "lag_p99_ms")


def _median(values: list[Any]) -> float | None:
    """Median; a run without the figure (timeout) counts as +infinity for times."""
    if not values:
        return None
    m = statistics.median(math.inf if v is None else v for v in values)
    return None if math.isinf(m) else round(m, 4)


def runs_status(runs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A case's ok runs, and its summary's first fields: "ok", or each status counted."""
    ok = [r for r in runs if r.get("status") == "ok"]
    statuses = collections.Counter(r.get("status") for r in runs)
    return ok, {"status": "ok" if len(ok) == len(runs) else
                ",".join(f"{k}:{v}" for k, v in sorted(statuses.items())),
                "repeats": len(runs)}


def summarise(runs: list[dict[str, Any]], idle: bool) -> dict[str, Any]:
    figures = IDLE_FIGURES if idle else BURST_FIGURES
    ok, out = runs_status(runs)
    for name in figures:
        # Times of runs that timed out count as infinite; other figures only from ok runs.
        if name == "seconds":
            out[name] = _median([r.get(name) for r in runs if r.get("status") in
                                 ("ok", "timeout")])
        else:
            out[name] = _median([r[name] for r in ok if r.get(name) is not None])
    if not idle:
        out["all_exactly_n"] = bool(runs) and all(r.get("exactly_n") for r in runs)
        out["duplicates"] = sum(r.get("duplicates", 0) for r in runs)
        times = [r["seconds"] for r in ok if r.get("seconds") is not None]
        out["seconds_min"] = min(times) if times else None
        out["seconds_max"] = max(times) if times else None
        sent = [r["sent_by_timeout"] for r in runs if "sent_by_timeout" in r]
        if sent:
            out["sent_by_timeout"] = sent
        n = runs[0]["entries"] if runs else 0
        if out["store_round_trips"] is not None and out["broker_round_trips"] is not None:
            out["store_round_trips_per_task"] = round(out["store_round_trips"] / n, 3)
            out["broker_round_trips_per_task"] = round(out["broker_round_trips"] / n, 3)
        if out["store_commands"] is not None:
            out["store_commands_per_task"] = round(out["store_commands"] / n, 3)
            out["broker_commands_per_task"] = round((out["broker_commands"] or 0) / n, 3)
    out["runs"] = [{k: r[k] for k in RUN_FIELDS if k in r} for r in runs]
    if ok:  # commands by name of the median-ish run (the first ok one) for reference
        out["store_commands_by_name"] = ok[0].get("store_commands_by_name")
        out["broker_commands_by_name"] = ok[0].get("broker_commands_by_name")
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _variant(key: str) -> tuple[int, str, str]:
    """``beat_claims_2@1bad067`` -> (2, "1bad067", "redis"); ``beat_claims_1+sqlite`` ->
    (1, "", "sqlite")."""
    name, _, tag = key.partition("@")
    name, _, store = name.partition("+")
    return int(name.rsplit("_", 1)[1]), tag, store or "redis"


def ratios_and_goals(results: dict[str, dict[str, Any]], entries: list[int],
                     idle_key: str | None, timeout: float,
                     base: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """Ratios between schedulers and the goals. ``base``: the tag of the beat-claims
    source the others are compared with (the working tree, "", unless --without-tree)."""
    def fig(case: str, workload: str, name: str) -> float | None:
        return results.get(case, {}).get(workload, {}).get(name)

    def bc_key(beats: int, tag: str, store: str = "redis") -> str:
        return bc_case_key(beats, tag, store)

    ratios: dict[str, Any] = {}
    goals: dict[str, Any] = {}
    bc_cases = sorted(k for k in results if k.startswith("beat_claims_"))
    tags = sorted({_variant(k)[1] for k in bc_cases})
    for n in entries:
        w = f"due_{n}"
        r: dict[str, Any] = {}
        for bc in bc_cases:
            beats, tag, store = _variant(bc)
            for other in OTHERS:
                r[f"{bc}/{other}"] = _ratio(fig(bc, w, "seconds"), fig(other, w, "seconds"))
                if other in results and w in results[other] and fig(other, w, "seconds") \
                        is None and "timeout" in results[other][w]["status"]:
                    # the other did not finish: the ratio is below bc / timeout
                    r[f"{bc}/{other}_below"] = _ratio(fig(bc, w, "seconds"), timeout)
                r[f"{bc}/{other}_cpu"] = _ratio(fig(bc, w, "cpu_seconds"),
                                                fig(other, w, "cpu_seconds"))
            single = bc_key(1, tag, store)
            if bc != single:
                r[f"{bc}/{single}"] = _ratio(fig(bc, w, "seconds"), fig(single, w, "seconds"))
            on_redis = bc_key(beats, tag)
            if store != "redis" and on_redis in results:  # this store against Redis
                r[f"{bc}/{on_redis}"] = _ratio(fig(bc, w, "seconds"),
                                               fig(on_redis, w, "seconds"))
                r[f"{bc}/{on_redis}_cpu"] = _ratio(fig(bc, w, "cpu_seconds"),
                                                   fig(on_redis, w, "cpu_seconds"))
            ref = bc_key(beats, base, store)
            if tag != base and ref in results:  # the base (working tree) against a commit
                r[f"{ref}/{bc}"] = _ratio(fig(ref, w, "seconds"), fig(bc, w, "seconds"))
                r[f"{ref}/{bc}_cpu"] = _ratio(fig(ref, w, "cpu_seconds"),
                                              fig(bc, w, "cpu_seconds"))
        ratios[w] = r
        red = fig("redbeat", w, "seconds")
        for tag in tags:
            at = f"@{tag}" if tag else ""
            one, two = fig(bc_key(1, tag), w, "seconds"), fig(bc_key(2, tag), w, "seconds")
            if n in (1000, 5000) and one and red:
                goals[f"beat_claims_1{at}_2x_faster_than_redbeat_{w}"] = {
                    "speedup": round(red / one, 2), "met": red / one >= 2.0}
            if one and two:
                goals[f"beat_claims_2{at}_1.6x_faster_than_1_{w}"] = {
                    "speedup": round(one / two, 2), "met": one / two >= 1.6}
            mine_cpu, bare_cpu = (fig(bc_key(1, tag), w, "cpu_seconds"),
                                  fig("send_task", w, "cpu_seconds"))
            if mine_cpu and bare_cpu:
                # The publish path: CPU per sent run against Celery's publish alone.
                goals[f"beat_claims_1{at}_cpu_at_most_1.5x_send_task_{w}"] = {
                    "ratio": round(mine_cpu / bare_cpu, 2),
                    "ms_per_run": round(1000 * mine_cpu / n, 3),
                    "send_task_ms_per_run": round(1000 * bare_cpu / n, 3),
                    "met": mine_cpu / bare_cpu <= 1.5}
        for bc in bc_cases:
            beats, tag, store = _variant(bc)
            mine, redis_s = fig(bc, w, "seconds"), fig(bc_key(beats, tag), w, "seconds")
            if store != "redis" and mine and redis_s:
                # Another store may cost more per transition, within twice Redis' time.
                goals[f"{bc}_at_most_2x_the_redis_store_{w}"] = {
                    "ratio": round(mine / redis_s, 2), "met": mine / redis_s <= 2.0}
        for bc in bc_cases:
            store_rt, broker_rt = fig(bc, w, "store_round_trips"), fig(bc, w,
                                                                     "broker_round_trips")
            ticks = fig(bc, w, "ticks")
            if store_rt is None or broker_rt is None or ticks is None:
                continue
            # At most 2 per run (one to the store, one to the broker), plus one batched
            # round trip per tick (the claim of everything due in that tick).
            allowed = 2 * n + ticks
            goals[f"at_most_2_round_trips_per_run_{bc}_{w}"] = {
                "round_trips": store_rt + broker_rt, "allowed": allowed,
                "per_run": round((store_rt + broker_rt) / n, 3),
                "met": store_rt + broker_rt <= allowed}
    if idle_key:
        r = {}
        for bc in bc_cases:
            beats, tag, store = _variant(bc)
            for other in ("persistent", "redbeat"):
                r[f"{bc}/{other}"] = _ratio(fig(bc, idle_key, "cpu_seconds_per_minute"),
                                            fig(other, idle_key, "cpu_seconds_per_minute"))
                r[f"{bc}/{other}_rss"] = _ratio(fig(bc, idle_key, "peak_rss_mib"),
                                                fig(other, idle_key, "peak_rss_mib"))
            ref = bc_key(beats, base, store)
            if tag != base and ref in results:
                r[f"{ref}/{bc}"] = _ratio(fig(ref, idle_key, "cpu_seconds_per_minute"),
                                          fig(bc, idle_key, "cpu_seconds_per_minute"))
                r[f"{ref}/{bc}_rss"] = _ratio(fig(ref, idle_key, "peak_rss_mib"),
                                              fig(bc, idle_key, "peak_rss_mib"))
                r[f"{ref}/{bc}_rss_end"] = _ratio(fig(ref, idle_key, "rss_end_mib"),
                                                  fig(bc, idle_key, "rss_end_mib"))
        ratios[idle_key] = r
        red = fig("redbeat", idle_key, "cpu_seconds_per_minute")
        for tag in tags:
            one = fig(bc_key(1, tag), idle_key, "cpu_seconds_per_minute")
            if one is not None and red is not None:
                at = f"@{tag}" if tag else ""
                goals[f"idle_cpu_not_above_redbeat_{idle_key}{at}"] = {
                    "beat_claims_1": one, "redbeat": red, "met": one <= red}
    return ratios, goals


# -- versions and machine ---------------------------------------------------------------------
def _git(*argv: str, cwd: str) -> str | None:
    try:
        return subprocess.run(["git", *argv], cwd=cwd, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
    except Exception:
        return None


def versions(sources: list[Source]) -> dict[str, Any]:
    """Versions of everything measured. ``beat_claims_*`` describe the working tree's
    package (``beat_claims_measured``: whether its beats ran); ``beat_claims_at_commits``
    each ``--at-commit`` snapshot by its tag (``version`` and ``path`` as its beats
    reported them, filled in after the runs)."""
    import sqlite3
    from importlib.metadata import version

    import celery
    import kombu
    import redis

    import beat_claims

    try:  # the PostgreSQL store's driver (beat-claims[postgres]): only --store postgres needs it
        import psycopg

        psycopg_version: str | None = psycopg.__version__
    except ImportError:
        psycopg_version = None

    pkg_dir = os.path.dirname(os.path.abspath(beat_claims.__file__))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commit = _git("rev-parse", "HEAD", cwd=pkg_dir)
    dirty = bool(_git("status", "--porcelain", "--", ".", cwd=pkg_dir)) if commit else None

    def last_change(rev: str | None) -> str | None:
        return _git("log", "-1", "--format=%H", rev, "--", "beat_claims",
                    cwd=repo) if rev else None

    server = subprocess.run(["redis-server", "--version"], capture_output=True,
                            text=True).stdout
    server_version = next((w[2:] for w in server.split() if w.startswith("v=")), server)
    return {
        "python": platform.python_version(),
        "celery": celery.__version__,
        "kombu": kombu.__version__,
        "redis_py": redis.__version__,
        "sqlite": sqlite3.sqlite_version,
        "psycopg": psycopg_version,
        "redis_server": server_version,
        "celery_redbeat": version("celery-redbeat"),
        "beat_claims": beat_claims.__version__,
        "beat_claims_commit": commit,
        "beat_claims_dirty": dirty,
        "beat_claims_last_change": last_change(commit),
        "beat_claims_path": pkg_dir,
        "beat_claims_measured": any(not src.tag for src in sources),
        "beat_claims_digest": next((_digest(os.path.join(src.path, "beat_claims"))
                                    for src in sources if not src.tag and src.path), None),
        "beat_claims_at_commits": {
            src.tag: {"commit": src.commit, "last_change": last_change(src.commit),
                      "digest": _digest(os.path.join(src.path, "beat_claims")),
                      "snapshot": src.path, "version": None, "path": None}
            for src in sources if src.tag and src.path},
    }


def machine() -> dict[str, Any]:
    import psutil

    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "machine": platform.machine(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}


def snapshot_commit(rev: str, workdir: str) -> Source:
    """Extract ``beat_claims/`` of commit ``rev`` (``git archive``: the package as that
    commit has it, Lua scripts and all; no checkout, the working tree is not touched) into
    a directory of its own under ``workdir``."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    full = _git("rev-parse", "--verify", f"{rev}^{{commit}}", cwd=repo)
    if not full:
        sys.exit(f"--at-commit: {rev!r} is not a commit of {repo}")
    tag = _git("rev-parse", "--short=7", full, cwd=repo) or full[:7]
    into = os.path.join(workdir, f"src-{tag}")
    os.makedirs(into, exist_ok=True)
    archive = subprocess.run(["git", "archive", full, "beat_claims"], cwd=repo,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return Source(tag=tag, commit=full, path=into)


def snapshot_tree(workdir: str) -> Source:
    """Copy the working tree's ``beat_claims/`` (as imported by this process) into a
    directory of its own under ``workdir``: every beat of the run imports the same code,
    even if the tree is edited while the run lasts."""
    import beat_claims

    into = os.path.join(workdir, "src-tree")
    shutil.copytree(os.path.dirname(os.path.abspath(beat_claims.__file__)),
                    os.path.join(into, "beat_claims"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return Source(tag="", commit=None, path=into)


def _digest(package: str) -> str:
    """A digest of a package's files (names and contents), to tell snapshots apart."""
    import hashlib

    h = hashlib.sha256()
    names = sorted(os.path.relpath(os.path.join(root, name), package).replace(os.sep, "/")
                   for root, dirs, files in os.walk(package) if "__pycache__" not in root
                   for name in files if not name.endswith(".pyc"))
    for name in names:  # the same digest as bench/chaos.py's
        with open(os.path.join(package, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()[:12]


# -- output -------------------------------------------------------------------------------------
def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and spec:
        return format(value, spec)
    return str(value)


def print_tables(summary: dict[str, Any], cases: list[Case]) -> None:
    results = summary["results"]
    hdr = (f"{'workload':11} {'scheduler':38} {'status':>9} {'time s':>8} {'min..max':>15}"
           f" {'p50 ms':>8} {'p99 ms':>8} {'CPU s':>7} {'RSS MiB':>8} {'cmds st/br':>13}"
           f" {'RT st/br':>13} {'RT/run':>7} {'sends per beat':>16} {'exact':>5}")
    if summary["options"]["entries"]:
        print(hdr)
        print("-" * len(hdr))
    for n in summary["options"]["entries"]:
        w = f"due_{n}"
        for case in cases:
            r = results.get(case.key, {}).get(w)
            if r is None:
                continue
            spread = (f"{r['seconds_min']:.2f}..{r['seconds_max']:.2f}"
                      if r.get("seconds_min") is not None else "-")
            status = r["status"] if r["status"] == "ok" else (
                "timeout" if "timeout" in r["status"] else r["status"][:9])
            secs = _fmt(r["seconds"], ".3f") if r["seconds"] is not None or status == "ok" \
                else f">{summary['options']['timeout']:.0f}"
            per_beat = "/".join("-" if x is None else str(x) for x in
                                (r["runs"][0].get("published_per_beat") or []))
            if status == "timeout":
                per_beat = "sent " + ",".join(str(x) for x in r.get("sent_by_timeout", []))
            cmds = f"{_fmt(r['store_commands'], '.0f')}/{_fmt(r['broker_commands'], '.0f')}"
            rts = (f"{_fmt(r['store_round_trips'], '.0f')}/"
                   f"{_fmt(r['broker_round_trips'], '.0f')}")
            print(f"{w:11} {case.label:38} {status:>9} {secs:>8} {spread:>15}"
                  f" {_fmt(r['lag_p50_ms'], '.0f'):>8} {_fmt(r['lag_p99_ms'], '.0f'):>8}"
                  f" {_fmt(r['cpu_seconds'], '.2f'):>7} {_fmt(r['peak_rss_mib'], '.0f'):>8}"
                  f" {cmds:>13} {rts:>13}"
                  f" {_fmt(r['round_trips_per_task'], '.2f'):>7} {per_beat:>16}"
                  f" {'yes' if r['all_exactly_n'] else 'NO':>5}")
    idle = summary["options"]["idle_workload"]
    if idle:
        print()
        hdr = (f"{'workload':11} {'scheduler':38} {'status':>9} {'CPU s/min':>10}"
               f" {'cmds/min st/br':>15} {'RT/min st/br':>14} {'ticks/min':>10}"
               f" {'RSS MiB':>8} {'RSS end':>8} {'setup s':>8}")
        print(hdr)
        print("-" * len(hdr))
        for case in cases:
            r = results.get(case.key, {}).get(idle)
            if r is None:
                continue
            cmds = (f"{_fmt(r['store_commands_per_minute'], '.0f')}/"
                    f"{_fmt(r['broker_commands_per_minute'], '.0f')}")
            rts = (f"{_fmt(r['store_round_trips_per_minute'], '.0f')}/"
                   f"{_fmt(r['broker_round_trips_per_minute'], '.0f')}")
            print(f"{idle:11} {case.label:38} {r['status'][:9]:>9}"
                  f" {_fmt(r['cpu_seconds_per_minute'], '.3f'):>10} {cmds:>15} {rts:>14}"
                  f" {_fmt(r['ticks_per_minute'], '.1f'):>10}"
                  f" {_fmt(r['peak_rss_mib'], '.0f'):>8} {_fmt(r.get('rss_end_mib'), '.0f'):>8}"
                  f" {_fmt(r.get('setup_seconds'), '.1f'):>8}")
    from bench.dynamic import print_table

    print_table(summary, cases)
    from bench.steady import print_table as print_steady

    print_steady(summary, cases)
    print()
    print("ratios (beat-claims / other; time unless marked _cpu; below 1: beat-claims is"
          " faster):")
    for w, r in summary["ratios"].items():
        shown = ", ".join(f"{k} {_fmt(v)}" for k, v in r.items())
        print(f"  {w}: {shown}")
    print("goals:")
    for name, g in summary["goals"].items():
        detail = ", ".join(f"{k}={v}" for k, v in g.items() if k != "met")
        print(f"  {'MET    ' if g['met'] else 'NOT MET'} {name} ({detail})")
    for case in cases:
        for w, r in results.get(case.key, {}).items():
            for run in r["runs"]:
                for err in [run.get("error"), *(run.get("errors") or [])]:
                    if err:
                        print(f"{case.key} {w}: {err.strip().splitlines()[-1]}")
            warned: collections.Counter[str] = collections.Counter()
            for run in r["runs"]:
                warned.update(run.get("warnings") or {})
            if warned:
                print(f"{case.key} {w}: warnings logged by the beats: {dict(warned)}")
    print()


def _print_profiles(directory: str, top: int) -> None:
    import pstats

    for name in sorted(os.listdir(directory)):
        if name.endswith(".prof"):
            print(f"\n--- cProfile {name} (top {top} by cumulative time) ---", file=sys.stderr)
            stats = pstats.Stats(os.path.join(directory, name), stream=sys.stderr)
            stats.sort_stats("cumulative").print_stats(top)


# -- main -----------------------------------------------------------------------------------------
def _setting(text: str) -> tuple[str, Any]:
    import ast

    name, sep, value = text.partition("=")
    if not sep or not name.startswith("beat_claims_"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected beat_claims_NAME=VALUE")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value


def _int_list(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def default_lead(n: int, beats: int) -> float:
    """Seconds from sending the configuration to T: setup time with room to spare.

    For beat-claims it is also the period, so a burst must fit in it: about 1.5 ms per
    entry covers both on the 2-core machine the results were measured on.
    """
    return 3.0 + 1.5e-3 * n * (1.0 + 0.25 * (beats - 1))


def next_lead(case: Case, run: dict[str, Any], grace: float) -> float:
    """The lead of the next run of a case, from this run's setup (and burst) time.

    For beat-claims T is one lead after the registration (the settle period of a fresh
    store comes before it), and the lead is also the period: the burst must fit in it.
    """
    if case.scheduler != "beat_claims":
        return round(max(2.0, 1.5 * run["setup_seconds"] + 1.5), 2)
    lead = max(2.0, 1.5 * run.get("ready_after_register_seconds", 0.0) + 1.5,
               3.0 * (run.get("seconds") or 0.0) + grace + 2.0)
    return round(lead, 2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--entries", type=_int_list, default=[1000, 5000, 10000],
                    help="due-burst sizes, comma-separated (1000,5000,10000); 0: no burst")
    ap.add_argument("--idle-entries", type=int, default=10000,
                    help="entries of the idle schedule (10000); 0: no idle workload")
    ap.add_argument("--idle-seconds", type=float, default=60.0,
                    help="idle measurement window; 0 skips the idle workload (60)")
    ap.add_argument("--dynamic-entries", type=_int_list, default=[],
                    help="dynamic_<N>: N entries created through each scheduler's run-time"
                         " API before one beat starts (beat_claims_1 on each --store,"
                         " RedBeat), comma-separated (none); the beat's idle window is"
                         " --idle-seconds (bench/dynamic.py)")
    ap.add_argument("--dynamic-soon", type=int, default=3,
                    help="dynamic: entries due once soon after the beat is ready, which it"
                         " must send (3)")
    ap.add_argument("--dynamic-soon-lead", type=float, default=None,
                    help="dynamic: seconds from the end of the bulk create to the soon"
                         " entries' instant (default: a guess, then 1.5 x the startup"
                         " measured + 5 s)")
    ap.add_argument("--dynamic-beat-max", type=int, default=10**9,
                    help="dynamic: above this N no beat is started (only the create time and"
                         " the store's bytes per entry are measured)")
    ap.add_argument("--redbeat-create", choices=("save", "both"), default="save",
                    help="dynamic: RedBeat's entries are saved one by one as its API does;"
                         " 'both' also times the same commands pipelined 500 entries a"
                         " round trip (save)")
    ap.add_argument("--dynamic-start", choices=("restarted", "cold"), default="restarted",
                    help="dynamic: the beat-claims beat starts as a restarted beat does (the"
                         " store heartbeated just before by a process that is gone), or"
                         " 'cold': on a store without a heartbeat since the bulk create"
                         " (restarted)")
    ap.add_argument("--dynamic-create-timeout", type=float, default=3600.0,
                    help="dynamic: seconds the creation of the N entries may take (3600)")
    ap.add_argument("--dynamic-soon-timeout", type=float, default=60.0,
                    help="dynamic: seconds after the soon entries' instant (or the beat's"
                         " readiness) to wait for them (60)")
    ap.add_argument("--steady-entries", type=_int_list, default=[],
                    help="steady_<N>: N entries of a one-minute crontab with a jitter of a"
                         " minute, created through each scheduler's run-time API, sent for"
                         " --steady-minutes by --beats beat-claims beats on each --store and"
                         " one RedBeat beat; comma-separated (none; bench/steady.py)")
    ap.add_argument("--steady-minutes", type=int, default=3,
                    help="steady: whole minutes measured (3)")
    ap.add_argument("--steady-period", type=float, default=None, metavar="SECONDS",
                    help="steady: an interval of SECONDS instead of the one-minute crontab,"
                         " its periods measured instead of minutes (the test suite's)")
    ap.add_argument("--steady-jitter", type=float, default=None, metavar="SECONDS",
                    help="steady: beat-claims' claims jitter of every entry (the period:"
                         " 60 s for the crontab)")
    ap.add_argument("--steady-warmup", type=float, default=None, metavar="SECONDS",
                    help="steady: the least time from the beats' readiness to the first"
                         " measured minute (one period: 60 s)")
    ap.add_argument("--steady-redbeat-lock-timeout", type=float, default=None,
                    metavar="SECONDS",
                    help="steady: RedBeat's redbeat_lock_timeout (its own default: 5 x"
                         " beat_max_loop_interval, 25 s, shorter than its tick of a burst"
                         " of 100,000)")
    ap.add_argument("--steady-grace", type=float, default=10.0,
                    help="steady: seconds after the last measured minute (its last planned"
                         " send) before the beats stop; later sends count as missing (10)")
    ap.add_argument("--schedulers", default=",".join(SCHEDULERS),
                    help=f"comma-separated subset of {','.join(SCHEDULERS)}")
    ap.add_argument("--beats", type=_int_list, default=[1, 2, 4],
                    help="beat-claims beat counts, comma-separated (1,2,4)")
    ap.add_argument("--store", default="redis",
                    help="beat-claims' stores, comma-separated, of " + ",".join(STORES)
                         + " (redis): each is a case of its own (beat_claims_K+<store>);"
                         " PersistentScheduler and RedBeat keep theirs. Redis is the"
                         " private store redis-server, SQLite a new file per run,"
                         " PostgreSQL a database of the run's own on the machine's server"
                         " (BC_PGHOST, BC_PGPORT, BC_PGUSER: 127.0.0.1:5432, postgres),"
                         " emptied before every run")
    ap.add_argument("--repeat", type=int, default=3, help="runs of every case (3)")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds after T before a burst is reported as timeout (300)")
    ap.add_argument("--lead", type=float, default=None,
                    help="seconds from configuration to T (default: 3 s + 1.5 ms per entry,"
                         " more with more beats, then adapted to the setup and burst times"
                         " measured; doubled and re-run if too short)")
    ap.add_argument("--grace", type=float, default=1.0,
                    help="after the N-th message, keep watching this long for duplicates (1)")
    ap.add_argument("--settle", type=float, default=2.0,
                    help="idle: seconds between the start of ticking and the window (2)")
    ap.add_argument("--at-commit", metavar="REV", action="append", default=[],
                    help="also benchmark beat_claims/ as of this git commit (extracted to a"
                         " temp dir), in the same run as the working tree's; cases"
                         " beat_claims_K@<short hash>. Repeat it or give a comma-separated"
                         " list for several commits")
    ap.add_argument("--tree-conf", metavar="SETTING=VALUE", action="append", default=[],
                    type=_setting,
                    help="a beat_claims_* setting for the working tree's beats only (to"
                         " measure it against the same code at --at-commit HEAD); the"
                         " value is read as a Python literal, else as a string")
    ap.add_argument("--without-tree", action="store_true",
                    help="with --at-commit: do not run the working tree's beat_claims")
    ap.add_argument("--max-steal", type=float, default=0.05, metavar="FRACTION",
                    help="run a burst again (twice at most) when the VM's host took more"
                         " than this fraction of its CPU time during it (steal; 0.05)."
                         " A negative value keeps every run")
    ap.add_argument("--setup-timeout", type=float, default=300.0,
                    help="seconds a beat may take to be ready (300); beat-claims on a fresh"
                         " store waits one heartbeat TTL (15 s) before it registers")
    ap.add_argument("--profile", metavar="DIR", default=None,
                    help="cProfile each beat of a burst, an idle window or a dynamic run"
                         " from the start of ticking (a dynamic run: once ready); writes"
                         " DIR/<run>-<beat>.prof and prints the top functions to stderr")
    ap.add_argument("--profile-clock", choices=("wall", "cpu"), default="wall",
                    help="what --profile times: the time elapsed (wall), or the beat's main"
                         " thread's CPU time (cpu: what the CPU figures count, without the"
                         " waits for a reply or the next tick; a claim thread is not in it)")
    ap.add_argument("--profile-schedulers", default="beat_claims",
                    help="schedulers to profile with --profile (beat_claims)")
    ap.add_argument("--dump", metavar="DIR", default=None,
                    help="write each burst's raw data (publish times, ticks) to"
                         " DIR/<run>-lead<lead>.json")
    ap.add_argument("--quiet", action="store_true", help="print only the JSON line")
    args = ap.parse_args(argv)
    global PROFILE_CLOCK
    PROFILE_CLOCK = args.profile_clock
    from bench import dynamic, steady

    if args.max_steal < 0:
        args.max_steal = None
    kinds = [k.strip() for k in args.schedulers.split(",") if k.strip()]
    for k in kinds:
        if k not in SCHEDULERS:
            ap.error(f"unknown scheduler {k!r}")
    stores = [k.strip() for k in args.store.split(",") if k.strip()]
    for k in stores:
        if k not in STORES:
            ap.error(f"--store: unknown store {k!r} (one of {','.join(STORES)})")
    if not stores:
        ap.error("--store: name at least one store")
    args.entries = [n for n in args.entries if n != 0]
    if args.repeat < 1 or any(b < 1 for b in args.beats) or any(n < 1 for n in args.entries):
        ap.error("--repeat, --beats and --entries must be positive")
    if any(n < 1 for n in args.steady_entries) or args.steady_minutes < 1 or (
            args.steady_period is not None and args.steady_period <= 0):
        ap.error("--steady-entries, --steady-minutes and --steady-period must be positive")
    if any(n < 1 for n in args.dynamic_entries) or args.dynamic_soon < 0:
        ap.error("--dynamic-entries must be positive, --dynamic-soon not negative")
    if args.dynamic_entries and args.idle_seconds <= 0 and \
            min(args.dynamic_entries) <= args.dynamic_beat_max:
        ap.error("--dynamic-entries: the beat's idle window (--idle-seconds) must be positive")
    revs = [r.strip() for text in args.at_commit for r in text.split(",") if r.strip()]
    if args.without_tree and not revs:
        ap.error("--without-tree needs --at-commit")
    args.profile_schedulers = [k for k in args.profile_schedulers.split(",") if k]
    for option in ("profile", "dump"):
        if getattr(args, option):
            setattr(args, option, os.path.abspath(getattr(args, option)))
            os.makedirs(getattr(args, option), exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="bench-dispatch-")
    sources = [] if args.without_tree else [snapshot_tree(workdir)]
    for rev in revs:
        src = snapshot_commit(rev, workdir)
        if all(src.tag != other.tag for other in sources):
            sources.append(src)
    cases = [Case(k, b, src, on) for k in kinds
             for on in (stores if k == "beat_claims" else ["redis"])
             for src in (sources if k == "beat_claims" else [Source()])
             for b in (args.beats if k == "beat_claims" else [1])]
    idle_key = (f"idle_{args.idle_entries}" if args.idle_seconds > 0 and args.idle_entries > 0
                else None)
    if not args.entries and not idle_key and not args.dynamic_entries \
            and not args.steady_entries:
        ap.error("nothing to run: --entries 0, no idle workload, no --dynamic-entries and"
                 " no --steady-entries")
    import beat_claims

    args.beat_claims_path = os.path.dirname(os.path.abspath(beat_claims.__file__))
    args.imported = {}  # source tag -> where its beats imported beat_claims from
    summary: dict[str, Any] = {
        "benchmark": "dispatch",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "versions": versions(sources),
        "options": {"entries": args.entries, "idle_entries": args.idle_entries,
                    "idle_seconds": args.idle_seconds, "idle_workload": idle_key,
                    "dynamic_entries": args.dynamic_entries,
                    "dynamic_soon": args.dynamic_soon,
                    "dynamic_beat_max": args.dynamic_beat_max,
                    "redbeat_create": args.redbeat_create,
                    "dynamic_start": args.dynamic_start,
                    "steady_entries": args.steady_entries,
                    "steady_minutes": args.steady_minutes,
                    "steady_period": args.steady_period,
                    "steady_jitter": args.steady_jitter,
                    "steady_grace": args.steady_grace,
                    "steady_warmup": args.steady_warmup,
                    "steady_redbeat_lock_timeout": args.steady_redbeat_lock_timeout,
                    "schedulers": kinds, "beats": args.beats, "repeat": args.repeat,
                    "stores": stores,
                    "at_commits": [src.tag for src in sources if src.tag],
                    "working_tree": not args.without_tree,
                    "timeout": args.timeout, "setup_timeout": args.setup_timeout,
                    "grace": args.grace, "settle": args.settle,
                    "beat_max_loop_interval": MAX_LOOP_INTERVAL,
                    "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])},
    }
    workloads: list[tuple[str, int]] = [("due", n) for n in args.entries]
    if idle_key:
        workloads.append(("idle", args.idle_entries))
    workloads += [("dynamic", n) for n in args.dynamic_entries]
    workloads += [("steady", n) for n in args.steady_entries]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    leads: dict[tuple[str, int], float] = {}
    soon_leads: dict[tuple[str, int], float] = {}
    store, broker = RedisServer("store"), RedisServer("broker")
    args.databases = {}
    if "postgres" in stores and "beat_claims" in kinds:
        args.databases["postgres"] = PostgresDatabase()
        summary["versions"]["postgresql_server"] = args.databases["postgres"].server_version()
    if "mysql" in stores and "beat_claims" in kinds:
        args.databases["mysql"] = MySQLDatabase()
        summary["versions"]["mysql_server"] = args.databases["mysql"].server_version()
    t_start = time.time()
    try:
        for rep in range(args.repeat):  # round-robin: every case once per repeat
            for kind, n in workloads:
                w = f"{kind}_{n}"
                for case in cases:
                    if kind in ("dynamic", "steady") and not {
                            "dynamic": dynamic, "steady": steady}[kind].runs_case(case):
                        continue
                    run_id = f"{case.key}-{w}-{rep + 1}"
                    if not args.quiet:
                        print(f"[{rep + 1}/{args.repeat} {time.time() - t_start:6.0f}s]"
                              f" {w} {case.label} ...", file=sys.stderr, flush=True)
                    if kind == "dynamic":
                        lead = (args.dynamic_soon_lead or soon_leads.get((case.key, n))
                                or dynamic.first_soon_lead(case, n))
                        run = dynamic.run_dynamic(case, n, lead, args, store, broker, workdir,
                                                  run_id)
                        soon_leads[(case.key, n)] = dynamic.next_soon_lead(run) or lead
                    elif kind == "steady":
                        run = steady.run_steady(case, n, args, store, broker, workdir, run_id)
                    elif kind == "idle":
                        run = run_idle(case, n, args.idle_seconds, args, store, broker,
                                       workdir, run_id)
                    else:
                        lead = leads.get((case.key, n)) or args.lead or default_lead(
                            n, case.beats)
                        discarded: list[dict[str, Any]] = []
                        for attempt in range(1, 4):
                            run = run_burst(case, n, lead, args, store, broker, workdir,
                                            run_id)
                            run["attempts"] = attempt
                            run["discarded"] = discarded
                            stolen = _stolen(run, args.max_steal)
                            if stolen and attempt < 3:
                                # The host took the VM's CPUs for part of the burst: its
                                # time says more about the host than about the scheduler.
                                discarded.append({**{k: run[k] for k in DISCARDED_FIELDS
                                                     if k in run}, "status": "steal",
                                                  "steal_seconds": run["steal_seconds"]})
                                if not args.quiet:
                                    print(f"    steal {run['steal_seconds']:.2f} s: again",
                                          file=sys.stderr, flush=True)
                                continue
                            if run["status"] not in ("setup-too-slow", "overlap"):
                                break
                            discarded.append({k: run[k] for k in DISCARDED_FIELDS if k in run})
                            if not args.quiet:
                                print(f"    {run['status']}: again with a lead of"
                                      f" {2 * lead:.1f} s", file=sys.stderr, flush=True)
                            lead *= 2
                        if args.lead is None and run["status"] == "ok":
                            leads[(case.key, n)] = next_lead(case, run, args.grace)
                    runs[(case.key, w)].append(run)
                    if not args.quiet:
                        shown = {k: run.get(k) for k in (
                            "status", "seconds", "setup_seconds", "settle_seconds", "lead",
                            "cpu_seconds", "other_cpu_seconds", "cpu_seconds_per_minute",
                            "store_server_cpu_seconds", "broker_server_cpu_seconds",
                            "gc_seconds", "gc_full_collections", "steal_seconds",
                            "peak_rss_mib", "rss_end_mib",
                            "published_per_beat", "exactly_n", "create_seconds",
                            "create_seconds_pipeline", "store_bytes_per_entry",
                            "store_bytes_per_entry_running", "startup_seconds",
                            "rss_ready_mib", "soon_sent", "soon_due_before_ready",
                            "sent", "missing", "duplicates", "lateness_p50_ms",
                            "lateness_p99_ms", "lateness_max_ms", "cpu_per_minute_by_beat",
                            "peak_rss_mib_by_beat", "wait_seconds", "error") if k in run}
                        print(f"    {shown}", file=sys.stderr, flush=True)
    finally:
        store.stop()
        broker.stop()
        for database in args.databases.values():
            database.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    results: dict[str, dict[str, Any]] = collections.defaultdict(dict)
    for (key, w), case_runs in runs.items():
        results[key][w] = (dynamic.summarise(case_runs) if w.startswith("dynamic")
                           else steady.summarise(case_runs) if w.startswith("steady")
                           else summarise(case_runs, idle=w.startswith("idle")))
    summary["results"] = dict(results)
    for tag, seen in args.imported.items():
        if tag in summary["versions"]["beat_claims_at_commits"]:
            summary["versions"]["beat_claims_at_commits"][tag].update(seen)
    summary["ratios"], summary["goals"] = ratios_and_goals(
        results, args.entries, idle_key, args.timeout, sources[0].tag if sources else "")
    dynamic_ratios, dynamic_goals = dynamic.ratios_and_goals(results, args.dynamic_entries)
    summary["ratios"].update(dynamic_ratios)
    summary["goals"].update(dynamic_goals)
    steady_ratios, steady_goals = steady.ratios_and_goals(results, args.steady_entries)
    summary["ratios"].update(steady_ratios)
    summary["goals"].update(steady_goals)
    summary["wall_seconds"] = round(time.time() - t_start, 1)
    summary["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if not args.quiet:
        print_tables(summary, cases)
        if args.profile:
            _print_profiles(args.profile, 30)
    print(json.dumps(summary, sort_keys=True))
    return 0 if all(r["status"] == "ok" for c in results.values() for r in c.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
