"""SQLite only: the file itself (its URL, schema version, permissions, prefixes), what
happens to the epoch when the file is reopened, replaced or deleted, a writer that holds the
file too long, and the store's own bounds (index-only statements, expiries)."""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import re
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from beat_claims.enums import Reason, RunState
from beat_claims.runs import Owner
from beat_claims.settings import Settings
from beat_claims.stores import open_store
from beat_claims.stores import sqlite as sqlite_module
from beat_claims.stores.base import (
    Claim,
    ClaimPlan,
    ClaimStatus,
    Delivery,
    EntrySeed,
    Outcome,
    StoreConfigurationError,
    StoreError,
)
from beat_claims.stores.sqlite import SCHEMA_VERSION, SQLiteStore

from .helpers import (
    A,
    B,
    above_clock,
    claim,
    claims,
    delivery,
    migrated_entry_is_indexed_by_the_rebuild_sweep,
    migrated_entry_takes_a_definition,
    now,
    one_claim,
    process,
    register,
    run,
    runs,
    send,
    started,
)

TTL = 10.0


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "claims.db")


@pytest.fixture
def store(db_path: str) -> Iterator[SQLiteStore]:
    s = SQLiteStore.from_url(f"sqlite:///{db_path}")
    yield s
    s.close()


def raw(path: str, sql: str, *args: Any) -> list[Any]:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


# -- URLs ---------------------------------------------------------------------------------
def test_relative_and_absolute_urls_as_sqlalchemy_spells_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rel").mkdir()
    monkeypatch.chdir(tmp_path)
    relative = SQLiteStore.from_url("sqlite:///rel/claims.db", "app")
    absolute = SQLiteStore.from_url(f"sqlite:///{tmp_path}/abs.db", "app")
    try:
        assert relative.path == str(tmp_path / "rel" / "claims.db")
        assert absolute.path == str(tmp_path / "abs.db")
        assert f"sqlite:////{str(tmp_path).lstrip('/')}/rel/claims.db" in relative.description
        assert "'app'" in relative.description
        monkeypatch.chdir("/")  # a daemon's chdir does not move the file
        register(relative, "e")
        assert os.path.exists(tmp_path / "rel" / "claims.db")
    finally:
        relative.close()
        absolute.close()


def test_open_store_builds_it_from_the_settings(db_path: str) -> None:
    store = open_store(Settings(url=f"sqlite:///{db_path}", key_prefix="myapp",
                                history_limit=7))
    try:
        assert isinstance(store, SQLiteStore)
        assert (store.prefix, store.history_limit) == ("myapp", 7)
        assert store.tables.runs == '"myapp_runs"'
    finally:
        store.close()


@pytest.mark.parametrize("url", ["sqlite://host/claims.db", "sqlite://", "sqlite:///",
                                 "sqlite:///:memory:", "sqlite:///claims.db?mode=ro"])
def test_a_url_that_names_no_shared_file_is_refused_naming_the_setting(url: str) -> None:
    with pytest.raises(StoreConfigurationError, match="beat_claims_url"):
        SQLiteStore.from_url(url)


def test_a_missing_directory_a_directory_and_a_non_database_are_refused(
        tmp_path: Path) -> None:
    with pytest.raises(StoreConfigurationError, match=r"beat_claims_url.*does not exist"):
        SQLiteStore.from_url(f"sqlite:///{tmp_path}/nowhere/claims.db")
    with pytest.raises(StoreConfigurationError, match=r"beat_claims_url.*is a directory"):
        SQLiteStore.from_url(f"sqlite:///{tmp_path}")
    (tmp_path / "notes.txt").write_bytes(b"not a database, " * 512)
    with pytest.raises(StoreConfigurationError, match="beat_claims_url"):
        SQLiteStore.from_url(f"sqlite:///{tmp_path}/notes.txt")


def _open_as_nobody(url: str, out: Any) -> None:
    import pwd

    nobody = pwd.getpwnam("nobody")
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)
    try:
        SQLiteStore.from_url(url).close()
        out.put(("opened", ""))
    except Exception as exc:
        out.put((type(exc).__name__, str(exc)))


def _open_unprivileged(url: str) -> tuple[str, str]:
    """Open the store as a user the permissions apply to (root ignores them)."""
    if os.geteuid() != 0:
        try:
            SQLiteStore.from_url(url).close()
            return ("opened", "")
        except Exception as exc:
            return (type(exc).__name__, str(exc))
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_open_as_nobody, args=(url, out))
    child.start()
    try:
        return out.get(timeout=30)  # type: ignore[no-any-return]
    finally:
        child.join(10)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user can reach (pytest's tmp_path is private to its user)."""
    path = Path(tempfile.mkdtemp(prefix="bc-sqlite-"))
    path.chmod(0o755)
    yield path
    path.chmod(0o755)
    shutil.rmtree(path, ignore_errors=True)


def test_a_read_only_file_is_an_error_at_start_naming_the_setting(shared_dir: Path) -> None:
    path = shared_dir / "claims.db"
    register(SQLiteStore.from_url(f"sqlite:///{path}"), "e")
    shared_dir.chmod(0o777)
    for name in ("claims.db", "claims.db-wal", "claims.db-shm"):
        if (shared_dir / name).exists():
            (shared_dir / name).chmod(0o444)
    kind, message = _open_unprivileged(f"sqlite:///{path}")
    assert kind == "StoreConfigurationError", message
    assert "beat_claims_url" in message and "not writable" in message and str(path) in message


def test_a_read_only_directory_is_an_error_at_start_naming_the_setting(
        shared_dir: Path) -> None:
    shared_dir.chmod(0o555)
    kind, message = _open_unprivileged(f"sqlite:///{shared_dir}/claims.db")
    assert kind == "StoreConfigurationError", message
    assert "beat_claims_url" in message and "directory" in message and "not writable" in message


# -- the schema ---------------------------------------------------------------------------
def test_the_schema_is_created_on_first_use_and_carries_its_version(db_path: str) -> None:
    SQLiteStore.from_url(f"sqlite:///{db_path}", "app").close()
    tables = {name for (name,) in raw(db_path, "SELECT name FROM sqlite_master"
                                               " WHERE type = 'table'")}
    assert tables == {f"app_{t}" for t in ("meta", "entries", "runs", "owners", "tasks",
                                                     "workers")}
    assert raw(db_path, "SELECT value FROM app_meta WHERE key = 'version'") == [
        (str(SCHEMA_VERSION),)]
    assert raw(db_path, "PRAGMA journal_mode") == [("wal",)]


def test_a_file_written_by_a_newer_version_is_refused_with_a_clear_message(
        db_path: str) -> None:
    SQLiteStore.from_url(f"sqlite:///{db_path}").close()
    raw(db_path, "UPDATE beat_claims_meta SET value = ? WHERE key = 'version'",
        str(SCHEMA_VERSION + 1))
    with pytest.raises(StoreConfigurationError) as info:
        SQLiteStore.from_url(f"sqlite:///{db_path}")
    message = str(info.value)
    assert "beat_claims_url" in message and "newer beat-claims" in message
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    # Nothing was rewritten: the newer version's file is as it left it.
    assert raw(db_path, "SELECT value FROM beat_claims_meta WHERE key = 'version'") == [
        (str(SCHEMA_VERSION + 1),)]


#: The tables beat-claims with schema version 1 made (prefix "beat-claims").
SCHEMA_1 = [
    "CREATE TABLE beat_claims_meta (key TEXT PRIMARY KEY, value TEXT) WITHOUT ROWID",
    "CREATE TABLE beat_claims_entries (name TEXT PRIMARY KEY, description TEXT NOT NULL"
    " DEFAULT '', anchor INTEGER, checkpoint INTEGER, token INTEGER) WITHOUT ROWID",
    "CREATE TABLE beat_claims_runs (entry TEXT NOT NULL, due INTEGER NOT NULL, record TEXT,"
    " kind TEXT, since INTEGER, owner TEXT, token INTEGER, busy INTEGER, place TEXT,"
    " lost_at INTEGER, PRIMARY KEY (entry, due)) WITHOUT ROWID",
    "CREATE INDEX beat_claims_runs_sweep ON beat_claims_runs (kind, since)"
    " WHERE kind IS NOT NULL",
    "CREATE INDEX beat_claims_runs_due ON beat_claims_runs (entry, due) WHERE kind = 'due'",
    "CREATE INDEX beat_claims_runs_busy ON beat_claims_runs (entry, due) WHERE busy = 1",
    "CREATE INDEX beat_claims_runs_history ON beat_claims_runs (entry, due)"
    " WHERE place = 'h'",
    "CREATE INDEX beat_claims_runs_lost ON beat_claims_runs (entry, lost_at)"
    " WHERE place = 'x'",
    "CREATE TABLE beat_claims_owners (id TEXT PRIMARY KEY, record TEXT NOT NULL,"
    " expires_at INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE INDEX beat_claims_owners_expiry ON beat_claims_owners (expires_at)",
    "CREATE TABLE beat_claims_tasks (task_id TEXT PRIMARY KEY, entry TEXT NOT NULL,"
    " due INTEGER NOT NULL, token INTEGER NOT NULL, expires_at INTEGER NOT NULL)"
    " WITHOUT ROWID",
    "CREATE INDEX beat_claims_tasks_expiry ON beat_claims_tasks (expires_at)",
]


def _schema_1_file(path: str, at: int) -> None:
    """A file as beat-claims with schema 1 left it: an entry with a started run (its task
    id indexed for a week) and the task id of a run the history trimmed since."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        for statement in SCHEMA_1:
            db.execute(statement)
        db.executemany("INSERT INTO beat_claims_meta VALUES (?, ?)", [
            ("version", "1"), ("prefix", "beat-claims"), ("epoch", "old-epoch")])
        db.execute("INSERT INTO beat_claims_entries VALUES ('e', 'every 1s', ?, ?, 2)",
                   (at - 5000, at))
        record = {"due": at, "state": "started", "token": 2, "owner": A.id,
                  "task_id": "kept", "sent_at": at, "started_at": at}
        worker = process(1)
        record.update(worker=worker.worker, worker_pid=worker.pid,
                      worker_process=worker.process)
        db.execute("INSERT INTO beat_claims_runs (entry, due, record, kind, since, busy,"
                   " place) VALUES ('e', ?, ?, 'open', ?, 1, 'h')",
                   (at, json.dumps(record), at))
        db.executemany("INSERT INTO beat_claims_tasks VALUES (?, 'e', ?, ?, ?)", [
            ("kept", at, 2, at + sqlite_module.WEEK_MS),
            ("trimmed", at - 1000, 1, at + sqlite_module.WEEK_MS)])
    finally:
        db.close()


def test_a_file_of_schema_1_is_migrated_when_opened(
        db_path: str, caplog: pytest.LogCaptureFixture) -> None:
    at = int(time.time() * 1000)
    _schema_1_file(db_path, at)
    caplog.set_level(logging.WARNING, logger="celery.beat.claims")
    store = SQLiteStore.from_url(f"sqlite:///{db_path}")
    try:
        assert raw(db_path, "SELECT value FROM beat_claims_meta WHERE key = 'version'") == [
            (str(SCHEMA_VERSION),)]
        assert any("migrated from schema version 1 to 2" in r.getMessage()
                   for r in caplog.records)
        # Its records are kept; the task id of a run gone is not.
        assert store.lookup_task("kept") == Claim("e", at, 2)
        assert store.lookup_task("trimmed") is None
        assert [(r.due, r.state) for r in store.history("e")] == [(at, RunState.STARTED)]
        assert store.heartbeat(A, TTL).store_id
        objects = {name for (name,) in raw(db_path, "SELECT name FROM sqlite_master")}
        assert {"beat_claims_tasks_run", "beat_claims_runs_tasks"} <= objects
        assert "beat_claims_tasks_expiry" not in objects
        # A process of schema 1 still connected goes on with its own statements.
        assert raw(db_path, "SELECT token FROM beat_claims_tasks WHERE task_id = ?"
                            " AND expires_at > ?", "kept", at + sqlite_module.WEEK_MS) == [(2,)]
        # The run gives its delivery back, the next one starts it, and it finishes.
        c = Claim("e", at, 2)
        assert store.requeue(delivery(c, process(1)))
        assert store.start(delivery(c, process(2), task_id="next")).verdict.value == "run"
        assert store.finish([Outcome("e", at, 2, RunState.DONE)]) == [True]
        # Opened again: nothing more to migrate.
        caplog.clear()
        SQLiteStore.from_url(f"sqlite:///{db_path}").close()
        assert not any("migrated" in r.getMessage() for r in caplog.records)
    finally:
        store.close()


def test_a_file_of_schema_3_is_migrated_and_keeps_the_last_pause_from_then_on(
        db_path: str, caplog: pytest.LogCaptureFixture) -> None:
    """Schema 4 keeps when the last pause began (last_paused_at) after its resume."""
    url = f"sqlite:///{db_path}"
    store = SQLiteStore.from_url(url)
    register(store, "e")
    paused = store.pause("e", "alice@ops", "billing is down")
    assert paused is not None and paused.paused is not None
    store.close()
    # As schema 3 left it: no last_paused_at column.
    raw(db_path, "ALTER TABLE beat_claims_entries DROP COLUMN last_paused_at")
    raw(db_path, "UPDATE beat_claims_meta SET value = '3' WHERE key = 'version'")
    caplog.set_level(logging.WARNING, logger="celery.beat.claims")
    store = SQLiteStore.from_url(url)
    try:
        [record] = store.entries(["e"])  # its pause is kept; no last pause yet
        assert (record.paused, record.last_paused_at) == (paused.paused, None)
        assert any("migrated from schema version 3 to 4" in r.getMessage()
                   for r in caplog.records)
        assert raw(db_path, "SELECT value FROM beat_claims_meta WHERE key = 'version'") == [
            (str(SCHEMA_VERSION),)]
        resumed = store.resume("e", "bob@ops")
        assert resumed is not None and resumed.resumed_at is not None
        assert resumed.last_paused_at == paused.paused.at
        # A process of schema 3 still connected resumes with its own statement: it keeps
        # no interval, and nothing breaks.
        store.pause("e", "carol@ops")
        raw(db_path, "UPDATE beat_claims_entries SET paused_by = NULL, paused_note = NULL,"
                     " paused_at = NULL, resumed_by = 'old', resumed_at = ? WHERE name = 'e'",
            now(store))
        [record] = store.entries(["e"])
        assert record.paused is None and record.resumed_by == "old"
        caplog.clear()
        SQLiteStore.from_url(url).close()
        assert not any("migrated" in r.getMessage() for r in caplog.records)
    finally:
        store.close()


def _opened_as_of_schema(db_path: str, version: int, caplog: pytest.LogCaptureFixture
                         ) -> SQLiteStore:
    """The file (its tables already made as of ``version``) marked of that schema, opened:
    it says it migrated it to the next."""
    raw(db_path, f"UPDATE beat_claims_meta SET value = '{version}' WHERE key = 'version'")
    caplog.set_level(logging.WARNING, logger="celery.beat.claims")
    store = SQLiteStore.from_url(f"sqlite:///{db_path}")
    assert any(f"migrated from schema version {version} to {version + 1}" in r.getMessage()
               for r in caplog.records)
    return store


def test_a_file_of_schema_4_is_migrated_and_records_registrants_from_then_on(
        db_path: str, caplog: pytest.LogCaptureFixture) -> None:
    """Schema 5 keeps an entry's registrants and history horizon: NULL for the entries
    registered before (none recorded: judged as before), recorded from then on."""
    url = f"sqlite:///{db_path}"
    store = SQLiteStore.from_url(url)
    anchor = register(store, "e")["e"].anchor
    store.close()
    # As schema 4 left it: neither column.
    raw(db_path, "ALTER TABLE beat_claims_entries DROP COLUMN registrants")
    raw(db_path, "ALTER TABLE beat_claims_entries DROP COLUMN horizon")
    store = _opened_as_of_schema(db_path, 4, caplog)
    try:
        [record] = store.entries(["e"])
        assert (record.anchor, record.registrants, record.history_horizon) == (
            anchor, None, None)
        store.heartbeat(A, TTL)
        store.register([EntrySeed("e")], A)
        [record] = store.entries(["e"])
        assert record.registrants is not None
        assert [r.owner for r in record.registrants] == [A.id]
        assert store.forget(["e"]) == []  # a live beat registered it
    finally:
        store.close()


def test_a_file_of_schema_5_is_migrated_and_its_entries_get_definitions_from_then_on(
        db_path: str, caplog: pytest.LogCaptureFixture) -> None:
    """Schema 6 keeps an entry's definition, version and place in the change log: the
    entries registered before have none (version 0), and can be given one."""
    url = f"sqlite:///{db_path}"
    store = SQLiteStore.from_url(url)
    state = register(store, "e")["e"]
    claim(store, A, state, state.anchor + 1000)
    store.close()
    # As schema 5 left it: none of the definition's columns, indexes or trigger.
    for index in ("changes", "defined", "gone"):
        raw(db_path, f"DROP INDEX beat_claims_entries_{index}")
    raw(db_path, "DROP TRIGGER beat_claims_entries_unlog")
    for column in ("definition", "version", "origin", "changed_by", "changed_at",
                   "change_id", "changed_seq"):
        raw(db_path, f"ALTER TABLE beat_claims_entries DROP COLUMN {column}")
    store = _opened_as_of_schema(db_path, 5, caplog)
    try:
        migrated_entry_takes_a_definition(store, state)
        caplog.clear()
        SQLiteStore.from_url(url).close()
        assert not any("migrated" in r.getMessage() for r in caplog.records)
    finally:
        store.close()


def test_a_file_of_schema_6_is_migrated_and_its_entries_wait_for_the_rebuild_sweep(
        db_path: str, caplog: pytest.LogCaptureFixture) -> None:
    """Schema 7 keeps the due index (next_due): the entries registered before have none
    (unindexed: the rebuild sweep's pass finds them), and are indexed from then on."""
    url = f"sqlite:///{db_path}"
    store = SQLiteStore.from_url(url)
    state = register(store, "e")["e"]
    claim(store, A, state, state.anchor + 1000)
    store.close()
    # As schema 6 left it: no next_due column, nor its indexes.
    for index in ("next", "unindexed"):
        raw(db_path, f"DROP INDEX beat_claims_entries_{index}")
    raw(db_path, "ALTER TABLE beat_claims_entries DROP COLUMN next_due")
    store = _opened_as_of_schema(db_path, 6, caplog)
    try:
        migrated_entry_is_indexed_by_the_rebuild_sweep(store, state)
    finally:
        store.close()


def test_the_store_id_is_kept_with_the_records_and_made_again_for_a_new_file(
        store: SQLiteStore) -> None:
    """Made with the tables: a worker that starts a run before any beat heartbeats gets it
    too."""
    c = send(store, A, one_claim(store, A))
    first = store.start(delivery(c, process(1))).store_id
    assert first and store.heartbeat(A, TTL).store_id == first
    copy = store.path + ".backup"
    source, target = sqlite3.connect(store.path), sqlite3.connect(copy)
    source.backup(target)
    source.close()
    target.close()
    store.close()
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(store.path + suffix)
    os.replace(copy, store.path)  # restored from a copy: the same records, the same id
    assert store.heartbeat(A, TTL).store_id == first
    store.close()
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(store.path + suffix)
    fresh = store.heartbeat(A, TTL).store_id  # a new file: another store
    assert fresh and fresh != first


def test_two_prefixes_share_a_file_and_a_prefix_naming_anothers_tables_is_refused(
        db_path: str) -> None:
    one = SQLiteStore.from_url(f"sqlite:///{db_path}", "app-one")
    two = SQLiteStore.from_url(f"sqlite:///{db_path}", "app-two")
    try:
        register(one, "e")
        assert [r.name for r in one.entries()] == ["e"] and two.entries() == []
        assert one.heartbeat(A, TTL).epoch != two.heartbeat(A, TTL).epoch
    finally:
        one.close()
        two.close()
    clash = re.escape("beat_claims_key_prefix='app.one'")
    with pytest.raises(StoreConfigurationError, match=clash):
        SQLiteStore.from_url(f"sqlite:///{db_path}", "app.one")


def test_tables_dropped_under_a_running_store_are_created_again(
        store: SQLiteStore) -> None:
    register(store, "e")
    raw(store.path, f"DROP TABLE {store.tables.entries}")
    assert claim(store, A, None).status is ClaimStatus.MISSING
    assert register(store, "e")["e"].checkpoint is None


def test_every_statement_searches_an_index(store: SQLiteStore) -> None:
    """Nothing a transition runs scans a table: its cost does not grow with the number of
    entries or with an entry's history. (The full reads of entries() and owners() are the
    point of those calls.)"""
    db = sqlite3.connect(store.path)
    try:
        for name, sql in store._sql.items():
            if name in ("entries_all", "owners_all"):
                continue
            plan = db.execute(f"EXPLAIN QUERY PLAN {sql}", [1] * sql.count("?")).fetchall()
            scans = [row[3] for row in plan
                     if row[3].startswith("SCAN") and "VIRTUAL TABLE" not in row[3]]
            assert not scans, (name, plan)
    finally:
        db.close()


def test_an_item_that_fails_is_rolled_back_alone_and_the_others_are_written(
        store: SQLiteStore) -> None:
    """Items of one call share a transaction (one commit per chunk), each in a savepoint:
    an instant SQLite cannot store fails its own plan only."""
    states = register(store, "e", "f", "g")
    floor = above_clock(store)  # (each written entry counts on from it)
    results = store.claim(A, [
        ClaimPlan("e", states["e"], (states["e"].anchor + 1000,), token_floor=floor),
        ClaimPlan("f", states["f"], (states["f"].anchor + 1000, 2 ** 70), token_floor=floor),
        ClaimPlan("g", states["g"], (states["g"].anchor + 1000,), token_floor=floor)])
    assert [r.status for r in results] == [ClaimStatus.OK, ClaimStatus.CORRUPT,
                                           ClaimStatus.OK]
    assert "OverflowError" in results[1].detail
    assert runs(store, "f") == {} and store.entries(["f"])[0].token == 0
    assert [r.token for r in store.history("e")] == [floor + 1]
    assert [r.token for r in store.history("g")] == [floor + 1]


# -- epochs: the file reopened, replaced, deleted ------------------------------------------
def test_reopening_the_same_file_keeps_the_epoch_and_the_records(
        store: SQLiteStore) -> None:
    first = store.heartbeat(A, TTL)
    c = one_claim(store, A)
    store.close()
    other = SQLiteStore.from_url(f"sqlite:///{store.path}")
    try:
        assert other.heartbeat(B, TTL).epoch == first.epoch
        assert runs(other)[c.due].owner == A.id
    finally:
        other.close()
    assert store.heartbeat(A, TTL).epoch == first.epoch  # the closed store reopens


def test_a_file_replaced_by_an_older_copy_is_a_new_epoch_for_a_store_still_open(
        store: SQLiteStore) -> None:
    first = store.heartbeat(A, TTL)
    old = one_claim(store, A, 1000)
    copy = store.path + ".backup"
    source, target = sqlite3.connect(store.path), sqlite3.connect(copy)
    source.backup(target)
    source.close()
    target.close()
    newer = one_claim(store, A, 2000)
    # An operator restores yesterday's backup, with the beats running. The file's -wal goes
    # with it (SQLite cannot tell whose a -wal is: a stale one is replayed into the copy).
    for suffix in ("-wal", "-shm"):
        os.remove(store.path + suffix)
    os.replace(copy, store.path)
    # Until a heartbeat has read the copy's epoch, nothing else is answered: a beat must
    # learn that the store went back before it claims from it.
    with pytest.raises(StoreError, match="epoch must be read again"):
        claim(store, A, None)
    hb = store.heartbeat(A, TTL)
    assert hb.epoch != first.epoch
    assert hb.settle_until is not None and hb.settle_until >= hb.now + int(TTL * 1000) - 5
    assert set(runs(store)) == {old.due} and newer.due not in runs(store)


def test_a_file_deleted_under_an_open_store_is_a_new_epoch_on_a_new_file(
        store: SQLiteStore) -> None:
    first = store.heartbeat(A, TTL)
    one_claim(store, A)
    for suffix in ("", "-wal", "-shm"):
        with_suffix = store.path + suffix
        if os.path.exists(with_suffix):
            os.remove(with_suffix)
    hb = store.heartbeat(B, TTL)
    assert hb.epoch != first.epoch and hb.settle_until is not None
    assert store.entries() == [] and claim(store, A, None).status is ClaimStatus.MISSING
    assert os.path.exists(store.path)


# -- a writer that holds the file ---------------------------------------------------------
def _hold_write_lock(path: str, seconds: float) -> threading.Event:
    """Another process's transaction (a connection of its own) holding the writer lock."""
    held = threading.Event()

    def hold() -> None:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(seconds)
        db.execute("ROLLBACK")
        db.close()

    threading.Thread(target=hold, daemon=True).start()
    assert held.wait(5)
    return held


def test_a_writer_holding_the_file_past_the_timeout_is_an_outage(db_path: str) -> None:
    store = SQLiteStore.from_url(f"sqlite:///{db_path}", timeout=0.2)
    try:
        state = register(store, "e")["e"]
        _hold_write_lock(db_path, 1.5)
        started_at = time.monotonic()
        with pytest.raises(StoreError, match="busy"):
            claim(store, A, state, state.anchor + 1000)
        assert time.monotonic() - started_at < 1.2
        assert store.entries()[0].checkpoint is None  # readers do not wait (WAL)
    finally:
        store.close()


def test_a_short_writer_is_waited_for(db_path: str) -> None:
    store = SQLiteStore.from_url(f"sqlite:///{db_path}", timeout=5)
    try:
        state = register(store, "e")["e"]
        _hold_write_lock(db_path, 0.2)
        assert claim(store, A, state, state.anchor + 1000).status is ClaimStatus.OK
    finally:
        store.close()


# -- bounds kept by the store's own clock --------------------------------------------------
def later(monkeypatch: pytest.MonkeyPatch, ms: int) -> None:
    real: Callable[[], int] = sqlite_module._now
    monkeypatch.setattr(sqlite_module, "_now", lambda: real() + ms)


def _tasks(store: SQLiteStore) -> list[str]:
    return sorted(t for (t,) in raw(store.path, f"SELECT task_id FROM {store.tables.tasks}"))


@pytest.mark.parametrize("history_limit", [2])
def test_task_ids_go_with_their_run_and_not_before(
        db_path: str, history_limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The task-id index is bounded by the history: an id stays as long as its run (a week
    is nothing to it), and leaves with it."""
    store = SQLiteStore.from_url(f"sqlite:///{db_path}", history_limit=history_limit)
    try:
        first, second = claims(store, A, 1000, 2000)
        for c, task in ((first, "t1"), (second, "t2")):
            send(store, A, c)
            started(store, c, process(1), task_id=task)
            store.finish([Outcome("e", c.due, c.token, RunState.DONE)])
        later(monkeypatch, sqlite_module.WEEK_MS + 1000)
        assert store.lookup_task("t1") == Claim("e", first.due, first.token)
        third = send(store, A, one_claim(store, A, 3000))  # trims the first run
        assert first.due not in runs(store)
        assert store.lookup_task("t1") is None and _tasks(store) == ["t2"]
        started(store, third, process(1), task_id="t3")
        assert run(store, third).task_id == "t3"
        assert store.lookup_task("t3") == Claim("e", third.due, third.token)
        # An operator deleting a run with the sqlite3 shell takes its task id too.
        raw(store.path, f"DELETE FROM {store.tables.runs} WHERE due = ?", second.due)
        assert _tasks(store) == ["t3"]
    finally:
        store.close()


@pytest.mark.parametrize("history_limit", [1])
def test_the_task_id_of_a_run_presumed_lost_goes_when_its_keep_expires(
        db_path: str, history_limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SQLiteStore.from_url(f"sqlite:///{db_path}", history_limit=history_limit)
    try:
        c = send(store, A, one_claim(store, A, 1000))
        started(store, c, process(1), task_id="t1")
        assert store.finish([Outcome("e", c.due, c.token, RunState.LOST,
                                     Reason.RUN_TIMEOUT)]) == [True]
        send(store, A, one_claim(store, A, 2000))  # out of the history: in the lost keep
        assert c.due not in runs(store) and store.lookup_task("t1") is not None
        later(monkeypatch, sqlite_module.WEEK_MS + 1000)
        state = register(store, "e")["e"]
        claim(store, A, state, state.anchor + 3000)  # a trim: the week has passed
        assert store.lookup_task("t1") is None and _tasks(store) == []
    finally:
        store.close()


def test_owners_are_forgotten_an_hour_after_their_heartbeat_lapsed(
        store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.heartbeat(A, TTL)
    later(monkeypatch, sqlite_module.FORGET_OWNERS_MS - 1000)
    assert A.id in {s.owner.id for s in store.heartbeat(B, TTL).owners}
    later(monkeypatch, sqlite_module.FORGET_OWNERS_MS + int(TTL * 1000) + 1000)
    assert A.id not in {s.owner.id for s in store.heartbeat(B, TTL).owners}


@pytest.mark.parametrize("history_limit", [2])
def test_runs_presumed_lost_are_kept_a_week_for_late_deliveries(
        db_path: str, history_limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SQLiteStore.from_url(f"sqlite:///{db_path}", history_limit=history_limit)
    try:
        pushed = send(store, A, one_claim(store, A, 1000))
        for offset in (2000, 3000):
            state = register(store, "e")["e"]
            claim(store, A, state, state.anchor + offset)
        assert pushed.due not in runs(store)  # out of the history, presumed lost
        later(monkeypatch, sqlite_module.WEEK_MS + 1000)
        state = register(store, "e")["e"]
        claim(store, A, state, state.anchor + 4000)  # a trim: the week has passed
        decision = store.start(Delivery("e", pushed.due, pushed.token, process(1)))
        assert decision.verdict.value == "refused"
        assert RunState.LOST not in {r.state for r in store.history("e")}
    finally:
        store.close()


# -- one host ------------------------------------------------------------------------------
def test_a_beat_of_another_host_in_the_same_file_is_warned_about_once(
        store: SQLiteStore, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="celery.beat.claims")
    store.heartbeat(Owner("far", "another-host", 1, 1.0), TTL)
    store.heartbeat(Owner("far", "another-host", 1, 1.0), TTL)
    warnings = [r.getMessage() for r in caplog.records
                if re.search("another host .another-host.", r.getMessage())]
    assert len(warnings) == 1 and "one host only" in warnings[0]
    assert now(store) > 0
