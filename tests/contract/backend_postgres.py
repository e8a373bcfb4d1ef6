"""The PostgreSQL backend of the contract suite: the machine's PostgreSQL (``BC_PGHOST``,
``BC_PGPORT``, ``BC_PGUSER``, as the Django tests), in a database of its own created once
per session (``beat_claims_contract_<random>``, dropped at the end), an empty schema (key
prefix) per test: a new one, or one a test before this one left, emptied as a new store
leaves its tables (see ``_spare``).

The fault hooks write with SQL, as an operator or a broken tool would. What a typed schema
cannot hold is said where it happens: a run's record is ``jsonb`` (text that is not JSON is
stored as a JSON string, the closest a jsonb column comes to it), an entry's anchor,
checkpoint and token are ``bigint`` (text is refused by the column: those tests skip).
``restart`` cannot restart the shared server: it cuts every connection to the test
database and restores the store's schema from a backup taken just before (``pg_dump`` /
``pg_restore``), which the store must see as a new epoch (the data is another copy).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from beat_claims.stores.base import Store, WorkerProcess, worker_id
from beat_claims.stores.postgres import PostgresStore

from .backend import Backend, counting

HOST = os.environ.get("BC_PGHOST", "127.0.0.1")
PORT = os.environ.get("BC_PGPORT", "5432")
USER = os.environ.get("BC_PGUSER", "postgres")

#: The session's database and the connection the hooks use (created on first use).
_session: dict[str, Any] = {}
_urls: weakref.WeakKeyDictionary[PostgresStore, str] = weakref.WeakKeyDictionary()


def url(dbname: str) -> str:
    return f"postgresql://{USER}@{HOST}:{PORT}/{dbname}"


def _connect(dbname: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url(dbname), autocommit=True, connect_timeout=5)


def database(request: pytest.FixtureRequest) -> str:
    """The session's database, created on first use and dropped when the session ends."""
    if "name" not in _session:
        name = f"beat_claims_contract_{uuid.uuid4().hex[:10]}"
        try:
            with _connect("postgres") as admin:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.OperationalError as exc:
            pytest.fail(f"PostgreSQL at {HOST}:{PORT} (user {USER}) is needed by the"
                        f" contract suite (BC_PGHOST, BC_PGPORT, BC_PGUSER): {exc}")
        _session["name"] = name
        request.config.add_cleanup(_drop_database)
    return str(_session["name"])


def _drop_database() -> None:
    name = _session.pop("name", None)
    conn = _session.pop("conn", None)
    if conn is not None:
        conn.close()
    if name is not None:
        with _connect("postgres") as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


def admin() -> psycopg.Connection[Any]:
    """The hooks' own connection to the session's database."""
    conn = _session.get("conn")
    if conn is None or conn.closed or conn.broken:
        conn = _session["conn"] = _connect(_session["name"])
    return conn  # type: ignore[no-any-return]


def _pg(store: Store) -> PostgresStore:
    assert isinstance(store, PostgresStore)
    return store


def _table(store: Store, name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(_pg(store).schema), sql.Identifier(name))


#: Key prefixes whose schema a test's store left installed and emptied since (every table
#: truncated but the layout's version, as a new store leaves them), for the next test's
#: store (:func:`_pg_open`): a new schema is 50 ms of the server's CPU to create and drop,
#: emptying one 6 ms, and the suite opens hundreds.
_spare: list[str] = []
#: The schemas a test dropped or made again (a wipe, a restart, a copy put back): dropped
#: after it, never used again.
_remade: set[str] = set()


@contextlib.contextmanager
def _pg_open(request: pytest.FixtureRequest, history_limit: int,
             reuse: bool = True) -> Iterator[Store]:
    """A store on an empty schema of the session's database: a spare one (see ``_spare``),
    or a new one (``reuse`` False: always new). On exit its schema is emptied and spared,
    or dropped."""
    address = url(database(request))
    prefix = _spare.pop() if reuse and _spare else f"bc-contract-{uuid.uuid4().hex[:8]}"
    store = PostgresStore.from_url(address, prefix, history_limit)
    _urls[store] = address
    try:
        yield store
    finally:
        store.close()
        if reuse and _emptied(store.schema):
            _spare.append(prefix)
        else:
            admin().execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                sql.Identifier(store.schema)))


def _emptied(schema: str) -> bool:
    """The schema of a store its test closed, emptied as a new store's is: every table but
    the layout's version truncated (and the entries' ids restarted). Not when the test made
    it again or dropped it, nor while another session of the session's database is still
    open half a second after the store closed (a store the test left open could write into
    the next test's store; the server process of a session closed a moment ago may still be
    on its way out)."""
    if schema in _remade:
        _remade.discard(schema)
        return False
    conn = admin()
    deadline = time.monotonic() + 0.5
    while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname ="
                       " current_database() AND pid <> pg_backend_pid()").fetchall()[0][0]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    tables = [t for (t,) in conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s", [schema]).fetchall()]
    if "version" not in tables:
        return False
    conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY").format(sql.SQL(", ").join(
        sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(t))
        for t in tables if t != "version")))
    return True


@contextlib.contextmanager
def fresh_store(request: pytest.FixtureRequest, history_limit: int = 100
                ) -> Iterator[PostgresStore]:
    """A store on a new schema of the session's database (for the PostgreSQL-only tests,
    which may change it), its schema dropped on exit."""
    with _pg_open(request, history_limit, reuse=False) as store:
        yield _pg(store)


def address(store: Store) -> str:
    """The URL a store was opened with."""
    return _urls[_pg(store)]


def _pg_reopen(store: Store) -> Store:
    s = _pg(store)
    other = PostgresStore.from_url(_urls[s], s.prefix, s.history_limit)
    _urls[other] = _urls[s]
    return other


def _pg_corrupt_run(store: Store, entry: str, due: int, raw: str) -> None:
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw  # not JSON: a jsonb column can hold it only as a JSON string
    cur = admin().execute(
        sql.SQL("UPDATE {} SET record = %s WHERE due = %s AND entry_id ="
                " (SELECT id FROM {} WHERE name = %s)").format(
            _table(store, "runs"), _table(store, "entries")),
        [Jsonb(value), due, entry])
    assert cur.rowcount == 1, f"no run of {entry!r} at {due}"


def _pg_drop_next_due(store: Store, entry: str) -> None:
    admin().execute(sql.SQL("UPDATE {} SET next_due = NULL WHERE name = %s").format(
        _table(store, "entries")), [entry])


def _pg_drop_entry_record(store: Store, entry: str) -> None:
    pytest.skip("PostgreSQL holds no run without its entry (a foreign key)")


def _pg_corrupt_entry_field(store: Store, entry: str, field: str, raw: str) -> None:
    assert field in ("anchor", "checkpoint", "token", "registrants", "horizon", "definition",
                     "version", "origin", "changed_by", "changed_at"), field
    if field in ("definition", "origin", "changed_by"):  # text columns: any text
        admin().execute(sql.SQL("UPDATE {} SET {} = %s WHERE name = %s").format(
            _table(store, "entries"), sql.Identifier(field)), [raw, entry])
        return
    if field == "registrants":  # a jsonb column: any JSON, not only an object of numbers
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw  # not JSON: a jsonb column can hold it only as a JSON string
        admin().execute(sql.SQL("UPDATE {} SET registrants = %s WHERE name = %s").format(
            _table(store, "entries")), [Jsonb(value), entry])
        return
    if not raw.strip().lstrip("-").isdigit():
        pytest.skip(f"PostgreSQL keeps an entry's {field} in a bigint column: {raw!r} cannot"
                    " be stored there, so this corruption cannot happen")
    admin().execute(sql.SQL("UPDATE {} SET {} = %s WHERE name = %s").format(
        _table(store, "entries"), sql.Identifier(field)), [int(raw), entry])


def _pg_corrupt_worker_record(store: Store, process: WorkerProcess, raw: str) -> None:
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw  # not JSON: a jsonb column can hold it only as a JSON string
    cur = admin().execute(sql.SQL("UPDATE {} SET record = %s WHERE id = %s").format(
        _table(store, "workers")), [Jsonb(value), worker_id(process)])
    assert cur.rowcount == 1, f"no record of {process}"


def _pg_wipe(store: Store) -> None:
    _remade.add(_pg(store).schema)
    admin().execute(sql.SQL("DROP SCHEMA {} CASCADE").format(
        sql.Identifier(_pg(store).schema)))


def _terminate_others() -> None:
    admin().execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()")


def _pg_restart(store: Store) -> None:
    _terminate_others()  # every session ends, as at a restart
    _pg_copy(store)()


def _pg_copy(store: Store) -> Callable[[], None]:
    """A backup of the store's schema (``pg_dump``); put back with ``pg_restore``, the
    schema dropped first (its relations are new ones: another epoch)."""
    s = _pg(store)
    _remade.add(s.schema)
    dump, restore = shutil.which("pg_dump"), shutil.which("pg_restore")
    if dump is None or restore is None:
        pytest.skip("pg_dump and pg_restore are needed to restore the store from a backup")
    common = ["-h", HOST, "-p", str(PORT), "-U", USER, "-d", _session["name"]]
    tmp = tempfile.mkdtemp(prefix="bc-pg-")
    path = os.path.join(tmp, "store.dump")
    subprocess.run([dump, *common, "-Fc", "-n", s.schema, "-f", path], check=True,
                   capture_output=True, timeout=60)

    def put_back() -> None:
        try:
            _pg_wipe(store)
            subprocess.run([restore, *common, "--single-transaction", "--exit-on-error",
                            path], check=True, capture_output=True, timeout=60)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    return put_back


BACKEND = Backend(open=_pg_open, reopen=_pg_reopen, corrupt_run=_pg_corrupt_run,
                  corrupt_entry_field=_pg_corrupt_entry_field, wipe=_pg_wipe,
                  restart=_pg_restart,
                  corrupt_worker_record=_pg_corrupt_worker_record, copy=_pg_copy,
                  drop_next_due=_pg_drop_next_due,
                  drop_entry_record=_pg_drop_entry_record,
                  round_trips=lambda store: counting(store, "_execute"))
