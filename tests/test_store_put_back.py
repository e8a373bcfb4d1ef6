"""A store put back from an older copy, whatever the way, while beats run.

The ways keep what the store's epoch was made from: SQLite's backup API keeps the file (and
its inode), a PostgreSQL dump loaded again keeps the server and its identity, Redis
reloaded from an older RDB in place (``DEBUG RELOAD``) keeps its run id, keys restored one
by one (``RESTORE``) keep everything else. Two beats run across the restore, a third starts
just after it, a worker runs what they send: no occurrence is sent twice or runs twice, and
no token is handed out for two occurrences (a token is never below the store's clock, and
the running beats find at their next heartbeat that the store no longer holds what they
wrote; the third claims nothing before they have). Every way at once, on stores, brokers
and fleets of their own.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import sqlite3
import subprocess
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from .conftest import RedisServer, own_redis
from .inprocess import settled_epoch_at
from .processes import Fleet, duplicates, executions, fleet, next_due_in, wait_for
from .test_integration_fleet import (
    MY_HOST,
    MY_PASSWORD,
    MY_PORT,
    MY_USER,
    PG_HOST,
    PG_PORT,
    PG_USER,
    claims_url,
)

pytestmark = pytest.mark.integration

#: Long enough between two occurrences that the running beats do not claim one (and find
#: the store went back from its answer) before the third beat is up and claiming.
PERIOD = 8
SCHEDULE = {f"e{i}": {"every": PERIOD} for i in range(3)}
#: How soon the first occurrence of each entry comes after the test registers them (s): about
#: when the beats are up, not a whole period after they register the entries themselves.
FIRST_IN = 3.0
#: Every table of the PostgreSQL store's schema (of the default key prefix) emptied.
TRUNCATE = ("DO $$BEGIN EXECUTE (SELECT 'TRUNCATE ' || string_agg(format('%I.%I', schemaname,"
            " tablename), ', ') || ' CASCADE' FROM pg_tables WHERE schemaname ="
            " 'beat_claims'); END$$")
#: A send as the beats log it: entry, due instant, token.
SENT = re.compile(r"Sending due task (\S+) \(\S+\) due (\S+) token (\d+)")


class Copy:
    """How a store is copied, and put back from the copy."""

    def __init__(self, take: Callable[[], None], put_back: Callable[[], None]) -> None:
        self.take, self.put_back = take, put_back


def sends(f: Fleet) -> list[tuple[str, str, int]]:
    """(entry, due, token) of every message the beats of ``f`` published."""
    return [(m[1], m[2], int(m[3])) for proc in f.procs if "beat" in " ".join(
        map(str, proc.args)) for m in SENT.finditer(f.log(proc))]


def ran_before(url: str) -> None:
    """The store has run a while, as beats that ran before left it: its epoch settled (the
    beats claim at once, not after a new store's settle period), the entries registered,
    their first occurrence due FIRST_IN seconds from now rather than a whole period after
    the beats register them. (One a beat comes up too late for is skipped, caught up by
    the next.)"""
    settled_epoch_at(url)
    next_due_in(url, SCHEDULE, FIRST_IN)


def put_back_under_running_beats(url: str, copy: Callable[[str], Copy], broker: RedisServer,
                                 tmp_path: Path) -> None:
    """A copy taken just after one round of occurrences ran, put back just after the next
    round ran; a third beat starts at once: the round the copy lost is not sent again."""
    ledger = broker.client(db=2)

    def rounds() -> int:
        return len({row["due"] for row in executions(ledger)})

    with fleet(url, broker.broker_url(), tmp_path, SCHEDULE,
               BC_EXEC_URL=f"redis://127.0.0.1:{broker.port}/2") as f:
        f.worker(concurrency=2)
        ran_before(url)
        beats = [f.beat(), f.beat()]
        wait_for(lambda: rounds() >= 1 and len(executions(ledger)) >= len(SCHEDULE), 40,
                 "a round of runs before the copy")
        way = copy(url)
        way.take()
        copied = rounds()
        wait_for(lambda: rounds() > copied and len(executions(ledger)) >= 2 * len(SCHEDULE),
                 3 * PERIOD, "a round of runs the copy does not hold")
        way.put_back()
        f.beat()  # a third beat: it knows nothing of what the copy lost
        restored = rounds()
        wait_for(lambda: rounds() > restored, 4 * PERIOD, "a round after the copy was put back")
        rows = executions(ledger)
        published = sends(f)
        found_out = ["the store may have lost writes" in f.log(beat) for beat in beats]
    assert duplicates(rows) == {}, rows
    twice = {k: n for k, n in Counter((e, d) for e, d, _ in published).items() if n > 1}
    assert twice == {}, published
    dues_of: dict[tuple[str, int], set[str]] = defaultdict(set)
    for entry, due, token in published:
        dues_of[(entry, token)].add(due)
    assert {k: v for k, v in dues_of.items() if len(v) > 1} == {}, published
    assert found_out == [True, True]  # (the running beats registered again what they knew)


# -- SQLite -------------------------------------------------------------------------------
def sqlite_backup_api(url: str) -> Copy:
    """``sqlite3 claims.db ".backup copy.db"``, later ``".restore copy.db"``: SQLite's
    backup API, the usual way to copy and restore a database in use (the file and its
    inode stay)."""
    live = Path(url.removeprefix("sqlite:///"))
    saved = live.with_name("copy.db")

    def backup(source: Path, target: Path) -> None:
        src, dst = sqlite3.connect(source), sqlite3.connect(target, timeout=30)
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()

    return Copy(lambda: backup(live, saved), lambda: backup(saved, live))


# -- PostgreSQL ---------------------------------------------------------------------------
def _psql(dbname: str, *args: str) -> None:
    subprocess.run(["psql", "-h", PG_HOST, "-p", PG_PORT, "-U", PG_USER, "-d", dbname,
                    "-v", "ON_ERROR_STOP=1", "-q", *args], check=True, capture_output=True,
                   timeout=60)


def _pg_dump(dbname: str, out: Path, *args: str) -> None:
    subprocess.run(["pg_dump", "-h", PG_HOST, "-p", PG_PORT, "-U", PG_USER, "-d", dbname,
                    "--schema=beat_claims", "-f", str(out), *args], check=True,
                   capture_output=True, timeout=60)


def postgres_data_only(url: str) -> Copy:
    """``pg_dump --data-only`` of the store's schema, later its tables emptied and the dump
    loaded again, in one transaction: the server, its identity and the schema stay."""
    dbname = url.rsplit("/", 1)[1]
    out = Path(f"/tmp/bc-{dbname}-data.sql")
    return Copy(lambda: _pg_dump(dbname, out, "--data-only"),
                lambda: _psql(dbname, "--single-transaction", "-c", TRUNCATE, "-f", str(out)))


def postgres_schema_and_data(url: str) -> Copy:
    """``pg_dump --clean`` of the store's schema (its tables, functions and data), later
    loaded again in one transaction: the server and its identity stay."""
    dbname = url.rsplit("/", 1)[1]
    out = Path(f"/tmp/bc-{dbname}-all.sql")
    return Copy(lambda: _pg_dump(dbname, out, "--clean", "--if-exists"),
                lambda: _psql(dbname, "--single-transaction", "-f", str(out)))


# -- MySQL / MariaDB ----------------------------------------------------------------------
def _my_client(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(f"one of {', '.join(names)} is needed (apt-get install mariadb-client)")


def mysql_data_only(url: str) -> Copy:
    """``mariadb-dump --no-create-info`` of the store's database, later its tables emptied
    and the dump loaded again, in one transaction: the server, the tables and their
    identity stay."""
    dbname = url.rsplit("/", 1)[1]
    out = Path(f"/tmp/bc-{dbname}-data.sql")
    common = ["-h", MY_HOST, "-P", str(MY_PORT), "-u", MY_USER, "--protocol=TCP"]
    env = {"MYSQL_PWD": MY_PASSWORD, "PATH": "/usr/bin:/bin"}

    def take() -> None:
        with out.open("wb") as dump:
            subprocess.run([_my_client("mariadb-dump", "mysqldump"), *common,
                            "--no-create-info", "--skip-triggers", "--single-transaction",
                            "--skip-lock-tables", "--skip-add-locks", "--skip-disable-keys",
                            dbname], check=True, stdout=dump, stderr=subprocess.PIPE,
                           timeout=60, env=env)

    def put_back() -> None:
        # (entries before meta: the trigger of a deleted entry writes the dropped mark)
        empty = "".join(f"DELETE FROM `beat_claims_{t}`;" for t in (
            "tasks", "runs", "entries", "owners", "workers", "meta"))
        script = (f"SET autocommit = 0; {empty}\n".encode() + out.read_bytes()
                  + b"\nCOMMIT;\n")
        done = subprocess.run([_my_client("mariadb", "mysql"), *common, dbname],
                              input=script, capture_output=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr.decode(errors="replace")

    return Copy(take, put_back)


# -- Redis --------------------------------------------------------------------------------
def redis_debug_reload(server: RedisServer) -> Callable[[str], Copy]:
    """``SAVE`` and a copy of the RDB, later that copy put in place and ``DEBUG RELOAD
    NOSAVE``: the same server process (its run id) holds the older data."""
    rdb = Path(server.dir) / "dump.rdb"
    saved = Path(server.dir) / "older.rdb"

    def take() -> None:
        server.client().save()
        shutil.copy(rdb, saved)

    def put_back() -> None:
        shutil.copy(saved, rdb)
        server.client().execute_command("DEBUG", "RELOAD", "NOSAVE")

    return lambda url: Copy(take, put_back)


def redis_restore_keys(server: RedisServer) -> Callable[[str], Copy]:
    """``DUMP`` of every key, later ``RESTORE ... REPLACE`` of each (in one transaction):
    keys written since and not in the copy stay as they are."""
    dumped: dict[bytes, tuple[int, bytes]] = {}

    def take() -> None:
        client = redis.Redis(port=server.port)  # (bytes: a dump is not text)
        for key in client.scan_iter(count=1000):
            value, ttl = client.dump(key), client.pttl(key)
            if value is not None:
                dumped[key] = (max(0, ttl), value)

    def put_back() -> None:
        pipe = redis.Redis(port=server.port).pipeline(transaction=True)
        for key, (ttl, value) in dumped.items():
            pipe.execute_command("RESTORE", key, ttl, value, "REPLACE")
        pipe.execute()

    return lambda url: Copy(take, put_back)


# -- every way at once ---------------------------------------------------------------------
#: Each way: the store it puts back (made in the ExitStack, in a directory of the way's own,
#: beside the way's broker) and how it copies that store.
Way = Callable[[contextlib.ExitStack, Path, RedisServer], tuple[str, Callable[[str], Copy]]]


def on(kind: str, copy: Callable[[str], Copy]) -> Way:
    """A way that copies a fresh store of ``kind`` (tests/test_integration_fleet.py
    claims_url) with ``copy``."""
    def made(stack: contextlib.ExitStack, where: Path,
             broker: RedisServer) -> tuple[str, Callable[[str], Copy]]:
        return stack.enter_context(claims_url(kind, broker, where)), copy
    return made


def on_redis(copy: Callable[[RedisServer], Callable[[str], Copy]]) -> Way:
    """A way that copies a store on a redis-server of its own (debug commands enabled)."""
    def made(stack: contextlib.ExitStack, where: Path,
             broker: RedisServer) -> tuple[str, Callable[[str], Copy]]:
        store = stack.enter_context(own_redis(["--enable-debug-command", "yes"]))
        return store.url, copy(store)
    return made


WAYS: dict[str, Way] = {
    "sqlite, the backup API": on("sqlite", sqlite_backup_api),
    "postgres, a data-only dump": on("postgres", postgres_data_only),
    "postgres, a dump of schema and data": on("postgres", postgres_schema_and_data),
    "mysql, a data-only dump": on("mysql", mysql_data_only),
    "redis, an older RDB reloaded (DEBUG RELOAD)": on_redis(redis_debug_reload),
    "redis, every key restored (RESTORE)": on_redis(redis_restore_keys),
}


def test_a_store_put_back_any_way_under_running_beats_sends_nothing_twice(
        tmp_path: Path) -> None:
    """Every way at once, each on a store and a broker of its own with a fleet of its own
    (in a thread each: the scenario is waits on real beats and a worker), so that the
    rounds of occurrences waited for serve them all; each way is checked alone (a failure
    names it)."""
    def each(way: Way, where: Path) -> None:
        # (each way's store and broker made, and dropped, in its thread: alongside the others)
        with contextlib.ExitStack() as stack:
            broker = stack.enter_context(own_redis())
            url, copy = way(stack, where, broker)
            put_back_under_running_beats(url, copy, broker, where)

    with ThreadPoolExecutor(len(WAYS)) as pool:
        done = {}
        for n, (name, way) in enumerate(WAYS.items()):
            where = tmp_path / f"way{n}"
            where.mkdir()
            done[name] = pool.submit(each, way, where)
        failed = [f"{name}: {type(exc).__name__}: {exc}" for name, future in done.items()
                  if (exc := future.exception()) is not None]
    assert not failed, "\n".join(failed)
