"""The SQLite backend of the contract suite: a fresh file in the test's temporary directory.

The faults are written with ``sqlite3`` directly, as another program (or an operator with
the ``sqlite3`` shell) would: a raw record, a raw entry field, the file deleted, the file
restored from a copy of itself.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator

import pytest

from beat_claims.stores.base import Store, WorkerProcess, worker_id
from beat_claims.stores.sqlite import SQLiteStore

from .backend import Backend, counting


def _sqlite(store: Store) -> SQLiteStore:
    assert isinstance(store, SQLiteStore)
    return store


@contextlib.contextmanager
def _raw(store: SQLiteStore) -> Iterator[sqlite3.Connection]:
    """Another connection to the store's file, committing on exit."""
    db = sqlite3.connect(store.path, timeout=5, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        yield db
        db.execute("COMMIT")
    finally:
        db.close()


@contextlib.contextmanager
def _sqlite_open(request: pytest.FixtureRequest, history_limit: int) -> Iterator[Store]:
    tmp_path = request.getfixturevalue("tmp_path")
    store = SQLiteStore.from_url(f"sqlite:///{tmp_path}/claims.db",
                                 f"bc-contract-{uuid.uuid4().hex[:8]}", history_limit)
    try:
        yield store
    finally:
        store.close()


def _sqlite_reopen(store: Store) -> Store:
    s = _sqlite(store)
    return SQLiteStore.from_url(f"sqlite:///{s.path}", s.prefix, s.history_limit, s.timeout)


def _sqlite_corrupt_run(store: Store, entry: str, due: int, raw: str) -> None:
    s = _sqlite(store)
    with _raw(s) as db:
        db.execute(f"UPDATE {s.tables.runs} SET record = ? WHERE entry = ? AND due = ?",
                   (raw, entry, due))


def _sqlite_corrupt_entry_field(store: Store, entry: str, field: str, raw: str) -> None:
    s = _sqlite(store)
    assert field in ("anchor", "checkpoint", "token", "registrants", "horizon", "definition",
                     "version", "origin", "changed_by", "changed_at"), field
    with _raw(s) as db:
        db.execute(f"UPDATE {s.tables.entries} SET {field} = ? WHERE name = ?", (raw, entry))


def _sqlite_drop_next_due(store: Store, entry: str) -> None:
    s = _sqlite(store)
    with _raw(s) as db:
        db.execute(f"UPDATE {s.tables.entries} SET next_due = NULL WHERE name = ?", (entry,))


def _sqlite_drop_entry_record(store: Store, entry: str) -> None:
    s = _sqlite(store)
    with _raw(s) as db:
        db.execute(f"DELETE FROM {s.tables.entries} WHERE name = ?", (entry,))


def _sqlite_corrupt_worker_record(store: Store, process: WorkerProcess, raw: str) -> None:
    s = _sqlite(store)
    with _raw(s) as db:
        cur = db.execute(f'UPDATE "{s.tables.base}_workers" SET record = ? WHERE id = ?',
                         (raw, worker_id(process)))
        assert cur.rowcount == 1, f"no record of {process}"


def _remove(path: str) -> None:
    for name in (path, path + "-wal", path + "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)


def _sqlite_wipe(store: Store) -> None:
    """The file is deleted (with its -wal and -shm): the store starts again on a new one."""
    s = _sqlite(store)
    s.close()
    _remove(s.path)


def _sqlite_restart(store: Store) -> None:
    """The file is restored from a copy of itself taken just before (what "a restart with
    the data of a snapshot" is for a file): every record stays, and it is another file."""
    _sqlite_copy(store)()


def _sqlite_copy(store: Store) -> Callable[[], None]:
    """A copy of the file (SQLite's backup API); put back in its place, with its -wal and
    -shm gone: another file at the path."""
    s = _sqlite(store)
    copy = f"{s.path}.{uuid.uuid4().hex[:8]}.copy"
    source, target = sqlite3.connect(s.path), sqlite3.connect(copy)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()

    def put_back() -> None:
        s.close()
        _remove(s.path)
        os.replace(copy, s.path)

    return put_back


BACKEND = Backend(open=_sqlite_open, reopen=_sqlite_reopen, corrupt_run=_sqlite_corrupt_run,
                  corrupt_entry_field=_sqlite_corrupt_entry_field, wipe=_sqlite_wipe,
                  restart=_sqlite_restart,
                  corrupt_worker_record=_sqlite_corrupt_worker_record, copy=_sqlite_copy,
                  drop_next_due=_sqlite_drop_next_due,
                  drop_entry_record=_sqlite_drop_entry_record,
                  round_trips=lambda store: counting(store, "_transaction"))
