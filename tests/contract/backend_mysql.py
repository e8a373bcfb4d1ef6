"""The MySQL / MariaDB backend of the contract suite: the machine's server (``BC_MYHOST``,
``BC_MYPORT``, ``BC_MYUSER``, ``BC_MYPASSWORD``; MariaDB on 127.0.0.1:3306 as root by
default; ``BC_MYDRIVER``: the client library, else the store's choice), in a database of
its own created once per session (``beat_claims_contract_<random>``, dropped at the end),
empty tables (a key prefix) per test: new ones, or those a test before this one left,
emptied as a new store leaves them (see ``_spare``).

The fault hooks write with SQL, as an operator or a broken tool would. A run's record is
``LONGTEXT`` (any text); an entry's anchor, checkpoint and token are ``BIGINT`` (text is
refused by the column: those tests skip). ``restart`` cannot restart the shared server: it
kills every other session of the test database and loads the store's tables from a dump
taken just before (``mariadb-dump`` / ``mysqldump``, loaded with the ``mariadb`` /
``mysql`` client), which the store must see as a new epoch (the tables are new ones).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pymysql
import pytest

from beat_claims.stores.base import Store, WorkerProcess, worker_id
from beat_claims.stores.mysql import LAYOUT, MySQLStore, _schema, _triggers
from beat_claims.stores.mysql_driver import DRIVERS

from .backend import Backend

HOST = os.environ.get("BC_MYHOST", "127.0.0.1")
PORT = int(os.environ.get("BC_MYPORT", "3306"))
USER = os.environ.get("BC_MYUSER", "root")
PASSWORD = os.environ.get("BC_MYPASSWORD", "")
#: The client library the stores use (``mysqlclient``, ``pymysql``; unset: the store's
#: choice, mysqlclient when installed).
DRIVER = os.environ.get("BC_MYDRIVER", "")

#: The client libraries installed here (``?driver=``), the store's choice first.
INSTALLED_DRIVERS = [name for name, module in DRIVERS if importlib.util.find_spec(module)]

#: The session's database and the connection the hooks use (created on first use).
_session: dict[str, Any] = {}
_urls: weakref.WeakKeyDictionary[MySQLStore, str] = weakref.WeakKeyDictionary()


def url(dbname: str) -> str:
    auth = f"{USER}:{PASSWORD}" if PASSWORD else USER
    return f"mysql://{auth}@{HOST}:{PORT}/{dbname}" + (f"?driver={DRIVER}" if DRIVER else "")


def _connect(dbname: str | None) -> Any:
    return pymysql.connect(host=HOST, port=PORT, user=USER, password=PASSWORD,
                           database=dbname, autocommit=True, connect_timeout=5,
                           charset="utf8mb4")


def database(request: pytest.FixtureRequest) -> str:
    """The session's database, created on first use and dropped when the session ends."""
    if "name" not in _session:
        name = f"beat_claims_contract_{uuid.uuid4().hex[:10]}"
        try:
            with contextlib.closing(_connect(None)) as admin_conn:
                admin_conn.cursor().execute(f"CREATE DATABASE `{name}`")
        except pymysql.err.MySQLError as exc:
            pytest.fail(f"MySQL or MariaDB at {HOST}:{PORT} (user {USER}) is needed by the"
                        f" contract suite (BC_MYHOST, BC_MYPORT, BC_MYUSER, BC_MYPASSWORD;"
                        f" scripts/test starts one): {exc}")
        _session["name"] = name
        request.config.add_cleanup(_drop_database)
    return str(_session["name"])


def _drop_database() -> None:
    name = _session.pop("name", None)
    conn = _session.pop("conn", None)
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()
    if name is not None:
        _kill_others(name)
        with contextlib.closing(_connect(None)) as admin_conn:
            admin_conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")


def admin() -> Any:
    """The hooks' own connection to the session's database."""
    conn = _session.get("conn")
    if conn is None or not conn.open:
        conn = _session["conn"] = _connect(_session["name"])
    else:
        conn.ping()
    return conn


def sql(statement: str, params: tuple[Any, ...] = ()) -> int:
    """One statement on the hooks' connection: the rows it changed."""
    with admin().cursor() as cur:
        return int(cur.execute(statement, params or None))


def _my(store: Store) -> MySQLStore:
    assert isinstance(store, MySQLStore)
    return store


def _table(store: Store, name: str) -> str:
    return f"`{_my(store).tables.base}_{name}`"


def _tables(store: Store) -> list[str]:
    with admin().cursor() as cur:
        cur.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA ="
                    " DATABASE() AND TABLE_NAME LIKE %s",
                    (_my(store).tables.base.replace("_", "\\_") + "\\_%",))
        return [str(row[0]) for row in cur.fetchall()]


#: Key prefixes whose tables a test's store left and that were emptied since (every row
#: deleted but the layout's version and the prefix, as a new store's set-up leaves them:
#: the next store's set-up writes a store id of its own), for the next test's store
#: (:func:`_my_open`): new tables cost InnoDB a file each to create and drop, emptying them
#: a few deletes, and the suite opens hundreds.
_spare: list[str] = []
#: The tables a test dropped or made again (a wipe, a restart, a copy put back): dropped
#: after it, never used again.
_remade: set[str] = set()


@contextlib.contextmanager
def _my_open(request: pytest.FixtureRequest, history_limit: int) -> Iterator[Store]:
    """A store on empty tables of the session's database: spare ones (see ``_spare``), or
    new ones. On exit its tables are emptied and spared, or dropped."""
    address = url(database(request))
    prefix = _spare.pop() if _spare else f"bc_contract_{uuid.uuid4().hex[:8]}"
    before = _sessions()
    store = MySQLStore.from_url(address, prefix, history_limit)
    _urls[store] = address
    try:
        yield store
    finally:
        store.close()
        if _emptied(_my(store), before):
            _spare.append(prefix)
        else:
            _drop_tables(store)


def _sessions() -> set[int]:
    """The sessions of the session's database but the hooks' own."""
    with admin().cursor() as cur:
        cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE()"
                    " AND ID <> CONNECTION_ID()")
        return {int(row[0]) for row in cur.fetchall()}


def _emptied(store: MySQLStore, before: set[int]) -> bool:
    """The tables of a store its test closed, emptied as a new store's are: every row
    deleted but the layout's version and the prefix. Not when the test made them again or
    dropped them, when they are not exactly a new store's tables and triggers, nor while a
    session of the session's database opened since the store was (not in ``before``) is
    still open half a second after the store closed (a store the test left open could
    write into the next test's store; a session closed a moment ago may still be on its
    way out)."""
    base = store.tables.base
    if base in _remade:
        _remade.discard(base)
        return False
    deadline = time.monotonic() + 0.5
    while _sessions() - before:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    made = [statement.split(" (", 1)[0].rsplit(" ", 1)[1].strip("`")
            for statement in _schema(store.tables)]
    if sorted(_tables(store)) != sorted(made):
        return False
    with admin().cursor() as cur:
        cur.execute("SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE"
                    " TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME LIKE %s",
                    (base.replace("_", "\\_") + "\\_%",))
        if sorted(str(row[0]) for row in cur.fetchall()) != sorted(_triggers(store.tables)):
            return False
        cur.execute(f"SELECT `key`, value FROM `{base}_meta` WHERE `key` IN"
                    " ('version', 'prefix')")
        meta = {bytes(key).decode(): value for key, value in cur.fetchall()}  # (VARBINARY)
        if meta != {"version": str(LAYOUT), "prefix": store.prefix}:
            return False
    # The runs first (their trigger deletes their task ids), then the entries (theirs
    # writes the change log's dropped mark, in the meta table), the meta table last.
    for name in ("runs", "entries", "owners", "tasks", "workers"):
        sql(f"DELETE FROM `{base}_{name}`")
    sql(f"DELETE FROM `{base}_meta` WHERE `key` NOT IN ('version', 'prefix')")
    return True


@contextlib.contextmanager
def with_driver(store: MySQLStore, driver: str) -> Iterator[MySQLStore]:
    """The same store (its tables) through the client library ``driver``."""
    if store.driver.name == driver:
        yield store
        return
    other = MySQLStore({**store._params, "driver": driver}, store.prefix, store.history_limit,
                       store.timeout)
    try:
        yield other
    finally:
        other.close()


def _my_reopen(store: Store) -> Store:
    s = _my(store)
    other = MySQLStore.from_url(_urls[s], s.prefix, s.history_limit)
    _urls[other] = _urls[s]
    return other


def _my_corrupt_run(store: Store, entry: str, due: int, raw: str) -> None:
    changed = sql(f"UPDATE {_table(store, 'runs')} SET record = %s WHERE entry = %s"
                  " AND due = %s", (raw, entry.encode(), due))
    assert changed == 1, f"no run of {entry!r} at {due}"


def _my_drop_next_due(store: Store, entry: str) -> None:
    sql(f"UPDATE {_table(store, 'entries')} SET next_due = NULL WHERE name = %s",
        (entry.encode(),))


def _my_drop_entry_record(store: Store, entry: str) -> None:
    sql(f"DELETE FROM {_table(store, 'entries')} WHERE name = %s", (entry.encode(),))


def _my_corrupt_entry_field(store: Store, entry: str, field: str, raw: str) -> None:
    assert field in ("anchor", "checkpoint", "token", "registrants", "horizon", "definition",
                     "version", "origin", "changed_by", "changed_at"), field
    if field in ("definition", "origin", "changed_by", "registrants"):  # text: any text
        sql(f"UPDATE {_table(store, 'entries')} SET {field} = %s WHERE name = %s",
            (raw, entry.encode()))
        return
    if not raw.strip().lstrip("-").isdigit():
        pytest.skip(f"MySQL keeps an entry's {field} in a BIGINT column: {raw!r} cannot"
                    " be stored there, so this corruption cannot happen")
    sql(f"UPDATE {_table(store, 'entries')} SET {field} = %s WHERE name = %s",
        (int(raw), entry.encode()))


def _my_corrupt_worker_record(store: Store, process: WorkerProcess, raw: str) -> None:
    changed = sql(f"UPDATE {_table(store, 'workers')} SET record = %s WHERE id = %s",
                  (raw, worker_id(process).encode()))
    assert changed == 1, f"no record of {process}"


def _drop_tables(store: Store) -> None:
    for name in _tables(store):
        sql(f"DROP TABLE IF EXISTS `{name}`")


def _kill_others(dbname: str) -> None:
    """Every other session of the database ends, as at a restart."""
    with contextlib.closing(_connect(None)) as conn, conn.cursor() as cur:
        cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s"
                    " AND ID <> CONNECTION_ID()", (dbname,))
        for (session,) in cur.fetchall():
            if session != getattr(_session.get("conn"), "thread_id", lambda: None)():
                with contextlib.suppress(pymysql.err.MySQLError):
                    cur.execute(f"KILL {int(session)}")


def _round_trips(store: MySQLStore) -> Callable[[], int]:
    """The store's exchanges with its server from now on (its own counter)."""
    start = store.round_trips
    return lambda: store.round_trips - start


def _my_wipe(store: Store) -> None:
    _remade.add(_my(store).tables.base)
    _drop_tables(store)


def _my_restart(store: Store) -> None:
    _kill_others(_session["name"])
    _my_copy(store)()


def _client(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(f"one of {', '.join(names)} is needed to restore the store from a dump"
                " (apt-get install mariadb-client)")


def _my_copy(store: Store) -> Callable[[], None]:
    """A dump of the store's tables (``mariadb-dump``: their rows and triggers); put back
    with the ``mariadb`` client, the tables dropped first (they are new ones: another
    epoch)."""
    _remade.add(_my(store).tables.base)
    dump, load = _client("mariadb-dump", "mysqldump"), _client("mariadb", "mysql")
    common = ["-h", HOST, "-P", str(PORT), "-u", USER, "--protocol=TCP"]
    env = {**os.environ, "MYSQL_PWD": PASSWORD}
    tmp = tempfile.mkdtemp(prefix="bc-my-")
    path = os.path.join(tmp, "store.sql")
    with open(path, "wb") as out:
        subprocess.run([dump, *common, "--single-transaction", "--skip-lock-tables",
                        _session["name"], *_tables(store)], check=True, stdout=out,
                       stderr=subprocess.PIPE, timeout=60, env=env)

    def put_back() -> None:
        try:
            _drop_tables(store)
            with open(path, "rb") as source:
                subprocess.run([load, *common, _session["name"]], check=True, stdin=source,
                               capture_output=True, timeout=60, env=env)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    return put_back


BACKEND = Backend(open=_my_open, reopen=_my_reopen, corrupt_run=_my_corrupt_run,
                  corrupt_entry_field=_my_corrupt_entry_field, wipe=_my_wipe,
                  restart=_my_restart,
                  corrupt_worker_record=_my_corrupt_worker_record, copy=_my_copy,
                  drop_next_due=_my_drop_next_due,
                  drop_entry_record=_my_drop_entry_record,
                  round_trips=lambda store: _round_trips(_my(store)))
