#!/usr/bin/env python
"""The due index on a large store: how long a page of what falls due takes, and what the
index costs the store per entry.

For each store (``--stores``: Redis, PostgreSQL, SQLite) it makes a fresh, empty store
(a private redis-server; a database of its own on the machine's PostgreSQL, ``BC_PGHOST``,
``BC_PGPORT``, ``BC_PGUSER``: 127.0.0.1:5432, postgres; a file in a temporary directory),
and fills it through the store's own API: ``--entries`` entries (1,000,000 on Redis and
PostgreSQL, 100,000 on SQLite) registered (``Store.register``) and indexed
(``Store.index``), ``--due`` (1,000) of them due before now at ten instants (ties), the
others an hour and more ahead. Then:

* ``due_ms``: ``Store.due(before=now, limit=--due)``, called ``--repeat`` (20) times:
  median, p90 and max in ms (each answers every due entry, with its state: checked);
* ``bytes_per_entry``: the store's memory (Redis: ``INFO memory`` ``used_memory``) or
  size (PostgreSQL: ``pg_total_relation_size`` of the entries table, its indexes
  included; SQLite: the file's pages) grown by the fill, divided by the entries: the
  whole entry as the store keeps it (record, registry, index);
* ``index_bytes_per_entry``: the index's part (Redis: ``MEMORY USAGE`` of every bucket's
  ``{P:NN}:next``; PostgreSQL: ``pg_relation_size`` of ``entries_next``; SQLite: the pages
  of its index in ``dbstat``, where SQLite has it), divided by the entries;
* ``fill_s``: how long the fill took (registering and indexing, a chunk at a time).

Usage::

    python bench/due_index.py                              # the three stores: long
    python bench/due_index.py --stores redis --entries 100000
    python bench/due_index.py --json > due_index.json      # one JSON document on stdout
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

if __package__ in (None, ""):  # run as a script: bench/ is not a package on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from beat_claims.stores.base import EntrySeed, IndexWrite, Store
from bench.dispatch import PostgresDatabase, RedisServer

#: Entries registered and indexed per call while filling.
FILL_CHUNK = 10_000
#: The entries of each store unless --entries says otherwise.
DEFAULT_ENTRIES = {"redis": 1_000_000, "postgres": 1_000_000, "sqlite": 100_000}
HOUR_MS = 3_600_000


def next_due_of(i: int, entries: int, due: int, now: int) -> int:
    """Entry i's next due instant: ``due`` entries spread evenly over the names are due
    before ``now`` (at ten instants), the others an hour and more ahead."""
    step = entries // due
    if i % step == 0 and i // step < due:
        return now - 60_000 + (i // step) % 10
    return now + HOUR_MS + i


def fill(store: Store, entries: int, due: int, now: int, say: Callable[[str], None]
         ) -> float:
    started = time.monotonic()
    for start in range(0, entries, FILL_CHUNK):
        names = [f"bench-{i:07d}" for i in range(start, min(entries, start + FILL_CHUNK))]
        states = store.register([EntrySeed(name) for name in names])
        writes = [IndexWrite(name, states[name], 0, next_due_of(start + k, entries, due, now))
                  for k, name in enumerate(names)]
        if not all(store.index(writes)):
            raise SystemExit(f"an index write of {names[0]}.. was refused")
        if (start // FILL_CHUNK) % 10 == 9:
            say(f"  {start + len(names):,} entries filled"
                f" ({time.monotonic() - started:.0f} s)")
    return time.monotonic() - started


def time_due(store: Store, now: int, due: int, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        page = store.due(now, due)
        out.append((time.perf_counter() - started) * 1000)
        if len(page) != due or any(d.state is None or d.next_due > now for d in page):
            raise SystemExit(f"due() answered {len(page)} entries, not the {due} due")
    return out


# -- the stores -----------------------------------------------------------------------
@contextlib.contextmanager
def redis_store() -> Iterator[tuple[Store, Callable[[], int], Callable[[], int]]]:
    from beat_claims.stores.redis import BUCKETS, RedisStore

    server = RedisServer("due-index")
    store = RedisStore.from_url(server.url, "bench-due")
    try:
        def memory() -> int:
            return int(server.client.info("memory")["used_memory"])

        def index_memory() -> int:
            keys = [f"{{bench-due:{b:02d}}}:next" for b in range(BUCKETS)]
            return sum(int(server.client.memory_usage(k, samples=0) or 0) for k in keys)

        yield store, memory, index_memory
    finally:
        store.close()
        server.stop()


@contextlib.contextmanager
def postgres_store() -> Iterator[tuple[Store, Callable[[], int], Callable[[], int]]]:
    import psycopg

    from beat_claims.stores.postgres import PostgresStore

    database = PostgresDatabase()
    store = PostgresStore.from_url(database.url, "bench-due", timeout=60)
    schema = store.schema

    def size(query: str) -> int:
        with psycopg.connect(database.url, autocommit=True) as conn:
            conn.execute(f'VACUUM ANALYZE "{schema}".entries')
            row = conn.execute(query).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    try:
        yield (store,
               lambda: size(f"SELECT pg_total_relation_size('\"{schema}\".entries')"),
               lambda: size(f"SELECT pg_relation_size('\"{schema}\".entries_next')"))
    finally:
        store.close()
        database.stop()


@contextlib.contextmanager
def sqlite_store() -> Iterator[tuple[Store, Callable[[], int], Callable[[], int]]]:
    import sqlite3

    from beat_claims.stores.sqlite import SQLiteStore

    with tempfile.TemporaryDirectory(prefix="bench-due-") as where:
        path = os.path.join(where, "store.db")
        store = SQLiteStore.from_url(f"sqlite:///{path}", "bench-due", timeout=60)

        def pages(query: str) -> int:
            with contextlib.closing(sqlite3.connect(path)) as db:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                try:
                    row = db.execute(query).fetchone()
                except sqlite3.OperationalError:  # (no dbstat in this SQLite)
                    return 0
            return int(row[0]) if row and row[0] is not None else 0

        try:
            yield (store,
                   lambda: pages("SELECT page_count * page_size FROM pragma_page_count,"
                                 " pragma_page_size"),
                   lambda: pages("SELECT sum(pgsize) FROM dbstat"
                                 " WHERE name = 'bench_due_entries_next'"))
        finally:
            store.close()


STORES = {"redis": redis_store, "postgres": postgres_store, "sqlite": sqlite_store}


def measure(kind: str, entries: int, due: int, repeat: int, say: Callable[[str], None]
            ) -> dict[str, Any]:
    with STORES[kind]() as (store, memory, index_memory):
        store.heartbeat(_owner(), 60)  # (connected, the layout installed)
        before = memory()
        now = store.now()
        say(f"{kind}: filling {entries:,} entries, {due:,} of them due")
        fill_s = fill(store, entries, due, now, say)
        grown = memory() - before
        index = index_memory()
        times = time_due(store, now, due, repeat)
        ordered = sorted(times)
        result = {
            "store": kind, "entries": entries, "due": due, "repeat": repeat,
            "due_ms_median": round(statistics.median(times), 2),
            "due_ms_p90": round(ordered[max(0, int(len(ordered) * 0.9) - 1)], 2),
            "due_ms_max": round(ordered[-1], 2),
            "bytes_per_entry": round(grown / entries, 1),
            "index_bytes_per_entry": round(index / entries, 1),
            "fill_s": round(fill_s, 1),
        }
        say(f"{kind}: due(before=now, limit={due:,}) with {due:,} due of {entries:,}:"
            f" median {result['due_ms_median']} ms, p90 {result['due_ms_p90']} ms,"
            f" max {result['due_ms_max']} ms; {result['bytes_per_entry']} bytes an entry"
            f" ({result['index_bytes_per_entry']} of them the index); filled in"
            f" {result['fill_s']} s")
        return result


def _owner() -> Any:
    from beat_claims.runs import Owner

    return Owner(id="bench-due-index", host="bench", pid=os.getpid(), started_at=1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="redis,postgres,sqlite",
                        help="comma-separated: redis, postgres, sqlite")
    parser.add_argument("--entries", type=int, default=0,
                        help="entries per store (0: 1,000,000 on Redis and PostgreSQL,"
                             " 100,000 on SQLite)")
    parser.add_argument("--due", type=int, default=1000, help="entries due (and the limit)")
    parser.add_argument("--repeat", type=int, default=20, help="due() calls timed")
    parser.add_argument("--json", action="store_true",
                        help="only one JSON document on stdout (progress on stderr)")
    args = parser.parse_args(argv)
    kinds = [k for k in args.stores.split(",") if k]
    unknown = set(kinds) - set(STORES)
    if unknown:
        parser.error(f"--stores: unknown {', '.join(sorted(unknown))}")

    def say(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    results = [measure(kind, args.entries or DEFAULT_ENTRIES[kind], args.due, args.repeat,
                       say) for kind in kinds]
    print(json.dumps({"due_index": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
