"""The MySQL / MariaDB store: the shared truth in the InnoDB tables of one database.

The transitions are the SQLite store's, step by step (``sqlite.RowStore``: the same records,
the same index columns, the same code), run on a MySQL or MariaDB server instead of a file:

* **One transaction per chunk of items, a savepoint per item** (as on SQLite): a bad
  record is rolled back and answered alone, the others are written.
* **Row locks instead of one writer.** SQLite serialises every writer on the file; here
  each chunk first locks the rows of the entries it names (``SELECT ... FOR UPDATE``, in
  name order, one statement): every transition of an entry reads and writes its runs
  while it holds its entry's row, so two beats, a worker and an operator on the same entry
  take turns, and those on other entries run side by side. The store's own rows (the
  ``meta`` table: the epoch, the change log's sequence, the anchoring instant) are read
  ``FOR UPDATE`` in a writing transaction. Calls that may create entries (register, a
  definition write) take the anchoring row first: they create one entry at a time.
* **READ COMMITTED**, set on each session: a locking read sees the latest committed row,
  and InnoDB takes no gap locks (REPEATABLE READ's gap and next-key locks on the run
  indexes made concurrent beats deadlock on inserts of neighbouring instants). A deadlock
  (1213) or a lock wait timeout (1205) rolls the whole transaction back: it is run again
  from the start, at most ``RETRIES`` times, and counted (``MySQLStore.retries``).
* **Sessions.** Each waits for a row lock (``innodb_lock_wait_timeout``) or a table's
  metadata lock (``lock_wait_timeout``: an operator's LOCK TABLES or ALTER) no longer than
  the store's timeout, on the server as in the client. One idle for more than
  ``IDLE_CHECK`` seconds is pinged before its next transaction (the server closes idle
  sessions: ``wait_timeout``). A statement, a COMMIT, a ROLLBACK or a ping interrupted
  while its reply was on its way (a signal's SystemExit) leaves its session to be dropped
  at the next call: the next statement would read that reply.
* **The server's clock**: "now" is read from the server once per transaction
  (``UNIX_TIMESTAMP(NOW(6))`` in a session whose time zone is UTC: microseconds, one clock
  for every beat and worker whatever their hosts' clocks).
* **Epochs.** The store is "the same" while the server and the store's tables are: the
  epoch (see ``Store.heartbeat``) changes when the server is another one (MySQL's
  ``@@server_uuid``; MariaDB has none: its ``@@hostname``, ``@@port`` and ``@@server_id``)
  or when the tables are other ones (the InnoDB table id of the meta table, which a dump
  loaded again or a restore from a backup cannot carry back; without the PROCESS privilege
  its creation time, to the second). A restart of the same server with its data is the
  same store (InnoDB keeps every commit). A session that reconnects to another server or
  other tables refuses every call but a heartbeat until one has read the new epoch.

Tables (``P`` is ``beat_claims_key_prefix`` made an identifier, as on SQLite: MySQL has no
schemas inside a database, so the prefix is part of each table's name): ``P_meta``,
``P_entries``, ``P_runs``, ``P_owners``, ``P_tasks``, ``P_workers``, with the columns of
the SQLite store (see ``sqlite.py``); names and ids are ``VARBINARY`` (compared by code
point, as the contract orders names; up to 1024 bytes, within InnoDB's index key limit),
numbers ``BIGINT``, records ``LONGTEXT``. Indexes are composite where SQLite's are partial
(MySQL has no partial index). Two triggers do what SQLite's do: a run that leaves the
store takes its task ids with it; an entry that leaves the change log raises its dropped
mark. ``LAYOUT`` is kept in ``P_meta``; tables of a newer layout are refused.

Round trips: the transitions read and write row by row within their transaction (as the
SQLite store does), so a call costs a few statements per item; a chunk costs one commit.
The calls of the hot path read a chunk's rows at once and write them in a few multi-row
statements (``mysql_rows.py``), and send their statements in batches (``mysql_driver.py``):
the clock, the entries' locks and their runs in one round trip, the writes and the COMMIT
in another (a third when a claim trims full histories). The client library is mysqlclient
when it is installed, else PyMySQL (``?driver=`` chooses).

MySQL 8 differs from MariaDB 10.11 where said: ``@@server_uuid``, the InnoDB table id
(``information_schema.INNODB_TABLES`` on MySQL 8, ``INNODB_SYS_TABLES`` on MariaDB), the
isolation variable (``transaction_isolation`` on MySQL 8, ``tx_isolation`` on MariaDB
before 11.1: set with ``SET SESSION TRANSACTION ISOLATION LEVEL``, which both know).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from celery.utils.log import get_logger

from ..urls import redact_text, redact_url
from .base import (
    CHANGES_PER_MS,
    DUE_AT_ONCE,
    Check,
    Claim,
    ClaimPlan,
    ClaimResult,
    ClaimStatus,
    DefinitionResult,
    DefinitionWrite,
    Delivery,
    EntryRecord,
    EntrySeed,
    EntryState,
    IndexWrite,
    Outcome,
    OwnerStatus,
    Reclaim,
    Release,
    StoreConfigurationError,
    StoredDefinition,
    StoreError,
    WriteStatus,
    checked_writes,
    definition_result,
    stored_definition,
    written_next_due,
)
from .mysql_driver import Driver, choose
from .mysql_rows import Cursor, ItemFailed, Rows, Statement
from .sqlite import (
    _STORES,
    ANCHOR_SHARED_MS,
    RowStore,
    Tables,
    _definition_statements,
    _entry_record,
    _maybe_int,
    _statements,
    _workers_statements,
)

logger = get_logger("celery.beat.claims")

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741

#: The layout of the tables (kept in P_meta as ``version``): tables of a newer layout are
#: refused, an older one migrated.
LAYOUT = 1
#: A transaction a deadlock or a lock wait timeout rolled back is run again this many
#: times at most (then the call fails as an outage would: StoreError).
RETRIES = 5
#: Items of one call per transaction (as on SQLite): one commit for a burst.
CHUNK = 500
#: MySQL's and MariaDB's error codes: a deadlock and a lock wait timeout (the transaction,
#: or on 1205 its statement, was rolled back: run it again); a table that does not exist.
ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT, ER_NO_SUCH_TABLE = 1213, 1205, 1146
#: Errors of a connection refused at once (not an outage that passes): a wrong password,
#: an unknown database, a missing privilege.
_REFUSED_CODES = frozenset({1044, 1045, 1049, 1142, 1227, 1698})
#: Definition writes of one transaction at most (a bulk: a few statements for all of them),
#: and the most definition text (bytes) one carries (within max_allowed_packet, 16 MiB by
#: default).
DEFINITIONS_CHUNK = 5000
DEFINITIONS_BYTES = 4 * 1024 * 1024
#: A session idle for longer than this (seconds) is pinged before its next transaction: the
#: server may have closed it (``wait_timeout``, a proxy's idle limit), and a call must not
#: fail as an outage for that. A busy session costs no ping.
IDLE_CHECK = 10.0
#: Names of one read of many entries (``entries``, ``definitions``) at most.
NAMES_PER_READ = 1000
#: A "LIMIT" that does not limit (MySQL has no LIMIT -1).
NO_LIMIT = 2 ** 62

#: The server's clock (UTC, in a session whose time zone is UTC), read first in each
#: transaction.
CLOCK = "SELECT UNIX_TIMESTAMP(NOW(6))"

#: ``mysql://`` and ``mariadb://`` (the same store).
SCHEMES = ("mysql", "mariadb")


def _schema(t: Tables) -> list[str]:
    """The tables of LAYOUT (created when missing)."""
    name = "VARBINARY(1024)"
    engine = " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin ROW_FORMAT=DYNAMIC"
    b = t.base
    return [
        f"CREATE TABLE IF NOT EXISTS {t.meta} (`key` VARBINARY(255) NOT NULL PRIMARY KEY,"
        f" value LONGTEXT){engine}",
        f"CREATE TABLE IF NOT EXISTS {t.entries} (name {name} NOT NULL PRIMARY KEY,"
        " description LONGTEXT NOT NULL, anchor BIGINT, checkpoint BIGINT,"
        " token BIGINT, paused_by LONGTEXT, paused_note LONGTEXT, paused_at BIGINT,"
        " resumed_by LONGTEXT, resumed_at BIGINT, last_paused_at BIGINT,"
        " registrants LONGTEXT, horizon BIGINT, definition LONGTEXT,"
        " version BIGINT NOT NULL DEFAULT 0, origin LONGTEXT, changed_by LONGTEXT,"
        " changed_at BIGINT, change_id LONGTEXT, changed_seq BIGINT, next_due BIGINT,"
        f" KEY `{b}_entries_changes` (changed_seq),"
        f" KEY `{b}_entries_gone` (changed_at),"
        f" KEY `{b}_entries_next` (next_due, name)){engine}",
        f"CREATE TABLE IF NOT EXISTS {t.runs} (entry {name} NOT NULL, due BIGINT NOT NULL,"
        " record LONGTEXT, kind VARCHAR(16), since BIGINT, owner VARBINARY(1024),"
        " token BIGINT, busy TINYINT, place CHAR(1), lost_at BIGINT,"
        " PRIMARY KEY (entry, due),"
        f" KEY `{b}_runs_sweep` (kind, since),"
        f" KEY `{b}_runs_kind` (entry, kind, due),"
        f" KEY `{b}_runs_busy` (entry, busy, due),"
        f" KEY `{b}_runs_history` (entry, place, due),"
        f" KEY `{b}_runs_lost` (entry, place, lost_at)){engine}",
        f"CREATE TABLE IF NOT EXISTS {t.owners} (id {name} NOT NULL PRIMARY KEY,"
        " record LONGTEXT NOT NULL, expires_at BIGINT NOT NULL,"
        f" KEY `{b}_owners_expiry` (expires_at)){engine}",
        f"CREATE TABLE IF NOT EXISTS {t.tasks} (task_id {name} NOT NULL PRIMARY KEY,"
        f" entry {name} NOT NULL, due BIGINT NOT NULL, token BIGINT NOT NULL,"
        f" expires_at BIGINT NOT NULL, KEY `{b}_tasks_run` (entry, due)){engine}",
        f"CREATE TABLE IF NOT EXISTS {_workers(t)} (id {name} NOT NULL PRIMARY KEY,"
        " record LONGTEXT NOT NULL, expires_at BIGINT NOT NULL,"
        f" KEY `{b}_workers_expiry` (expires_at)){engine}",
    ]


def _triggers(t: Tables) -> dict[str, str]:
    """What SQLite's triggers do: a run that leaves the store (a trim, a forget, an
    operator's DELETE) takes the task ids it was started under with it; an entry that
    leaves the store leaves the change log (its number becomes the dropped mark)."""
    return {
        f"{t.base}_runs_tasks": f"CREATE TRIGGER `{t.base}_runs_tasks` AFTER DELETE ON"
                                f" {t.runs} FOR EACH ROW DELETE FROM {t.tasks}"
                                " WHERE entry = OLD.entry AND due = OLD.due",
        f"{t.base}_entries_unlog": f"CREATE TRIGGER `{t.base}_entries_unlog` AFTER DELETE ON"
                                   f" {t.entries} FOR EACH ROW INSERT INTO {t.meta}"
                                   " (`key`, value) SELECT 'changes_dropped',"
                                   " OLD.changed_seq FROM DUAL WHERE OLD.changed_seq IS"
                                   " NOT NULL ON DUPLICATE KEY UPDATE value = CONCAT(IF("
                                   "value REGEXP '^-?[0-9]+$', GREATEST(CAST(value AS"
                                   " SIGNED), OLD.changed_seq), OLD.changed_seq))",
    }


def _workers(t: Tables) -> str:
    return f"`{t.base}_workers`"


def _mysql(statement: str) -> str:
    """A statement of the SQLite store in MySQL's dialect."""
    out = re.sub(r' INDEXED BY "[^"]*"', "", statement)
    out = re.sub(r'"([^"]*)"', r"`\1`", out)
    out = out.replace("?", "%s")
    out = re.sub(r"ON CONFLICT \([^)]*\) DO NOTHING",
                 "ON DUPLICATE KEY UPDATE `key` = `key`", out)

    def update(match: re.Match[str]) -> str:
        sets = re.sub(r"excluded\.(\w+)", r"VALUES(\1)", match.group(1))
        return f"ON DUPLICATE KEY UPDATE {sets}"

    out = re.sub(r"ON CONFLICT \([^)]*\) DO UPDATE SET (.*)$", update, out)
    return out


def _mysql_statements(t: Tables) -> dict[str, str]:
    out = {name: _mysql(text) for name, text in
           {**_statements(t), **_definition_statements(t)}.items()}
    m = t.meta
    out.update({
        "meta_get": f"SELECT value FROM {m} WHERE `key` = %s",
        "meta_set": f"INSERT INTO {m} (`key`, value) VALUES (%s, %s)"
                    " ON DUPLICATE KEY UPDATE value = VALUES(value)",
        "meta_add": f"INSERT INTO {m} (`key`, value) VALUES (%s, %s)"
                    " ON DUPLICATE KEY UPDATE `key` = `key`",
        # (the live owners as a JSON array, as on SQLite: JSON_TABLE, MariaDB 10.6 and
        # MySQL 8)
        "sweep_held": f"SELECT entry, due, owner, token, since FROM {t.runs}"
                      " WHERE kind = 'held' AND since < %s AND (since < %s"
                      " OR (owner = %s AND since < %s) OR (owner <> %s AND since < %s"
                      " AND owner NOT IN (SELECT CAST(j.v AS BINARY) FROM JSON_TABLE(%s,"
                      " '$[*]' COLUMNS (v VARCHAR(1024) PATH '$')) AS j)))"
                      " ORDER BY since LIMIT %s",
        "entry_put": f"INSERT INTO {t.entries} (name, description, anchor, checkpoint,"
                     f" token, next_due) VALUES (%s, %s, %s, %s, %s, {DUE_AT_ONCE})"
                     " ON DUPLICATE KEY UPDATE description = VALUES(description),"
                     " anchor = VALUES(anchor), checkpoint = VALUES(checkpoint),"
                     " token = VALUES(token)",
    })
    return out


def _mysql_workers_statements(t: Tables) -> dict[str, str]:
    out = {name: _mysql(text) for name, text in _workers_statements(t).items()}
    # (MariaDB has no LIMIT in an IN subquery: a DELETE with ORDER BY and LIMIT, as MySQL
    # and MariaDB both have)
    out["forget"] = (f"DELETE FROM {_workers(t)} WHERE expires_at < %s ORDER BY expires_at"
                     " LIMIT 100")
    return out


def _tables(prefix: str) -> Tables:
    """SQLite's table names of the prefix, quoted for MySQL (at most 64 characters)."""
    t = Tables.for_prefix(prefix)
    base = t.base[:48]

    def name(table: str) -> str:
        return f"`{base}_{table}`"

    return Tables(name("meta"), name("entries"), name("runs"), name("owners"),
                  name("tasks"), base)


# -- connections --------------------------------------------------------------------------
def parse_url(url: str) -> dict[str, Any]:
    """The connection parameters of a ``mysql://`` or ``mariadb://`` URL (user, password,
    host, port, database; ``?unix_socket=``, ``?charset=`` ignored, ``ssl_ca=``,
    ``connect_timeout=`` and ``driver=`` taken)."""
    where = f"beat_claims_url={redact_url(url)!r}"
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # (its message quotes the netloc: the password with it)
        raise StoreConfigurationError(f"{where}: not a URL that can be read") from None
    if parts.scheme.lower() not in SCHEMES:
        raise StoreConfigurationError(f"{where}: not a mysql:// or mariadb:// URL")
    database = urllib.parse.unquote(parts.path.lstrip("/"))
    if not database or "/" in database:
        raise StoreConfigurationError(
            f"{where}: name the database: mysql://user:password@host:3306/DATABASE")
    try:
        port = parts.port or 3306
    except ValueError:
        raise StoreConfigurationError(f"{where}: the port is not a number") from None
    params: dict[str, Any] = {
        "host": parts.hostname or "127.0.0.1", "port": port,
        "user": urllib.parse.unquote(parts.username or "") or "root",
        "password": urllib.parse.unquote(parts.password or ""), "database": database}
    for key, value in urllib.parse.parse_qsl(parts.query):
        if key == "unix_socket":
            params["unix_socket"] = value
        elif key == "connect_timeout":
            try:
                params["connect_timeout"] = float(value)
            except ValueError:
                raise StoreConfigurationError(
                    f"{where}: connect_timeout is not a number of seconds") from None
        elif key in ("ssl_ca", "ssl_cert", "ssl_key"):
            params.setdefault("ssl", {})[key.removeprefix("ssl_")] = value
        elif key == "driver":  # (the client library: see mysql_driver.py)
            params["driver"] = value
        elif key != "charset":
            raise StoreConfigurationError(f"{where}: unknown option {key!r}")
    return params


def django_params(alias: str) -> dict[str, Any] | None:
    """The MySQL database of Django's connection ``alias`` as connection parameters, or None
    when that database is not MySQL or MariaDB (another store opens it)."""
    from django.conf import settings as django_settings

    databases = getattr(django_settings, "DATABASES", {}) or {}
    config = databases.get(alias)
    if config is None or "mysql" not in str(config.get("ENGINE", "")):
        return None
    options = dict(config.get("OPTIONS") or {})
    from_file = options.get("read_default_file")
    if not config.get("NAME") and not from_file:
        raise StoreConfigurationError(
            f"beat_claims_url={redact_url('django:' + alias)!r}: Django's database"
            f" {alias!r} has no NAME")
    params: dict[str, Any]
    if from_file:  # (Django's order: the settings first, then the option file)
        params = {"read_default_file": str(from_file)}
        if options.get("read_default_group"):
            params["read_default_group"] = str(options["read_default_group"])
        for key, setting in (("host", "HOST"), ("user", "USER"), ("password", "PASSWORD"),
                             ("database", "NAME")):
            if config.get(setting):
                params[key] = config[setting]
        if config.get("PORT"):
            params["port"] = int(config["PORT"])
    else:
        params = {
            "host": config.get("HOST") or "127.0.0.1",
            "port": int(config.get("PORT") or 3306),
            "user": config.get("USER") or "root", "password": config.get("PASSWORD") or "",
            "database": config.get("NAME") or ""}
    socket_path = options.get("unix_socket")
    if not socket_path and str(params.get("host") or "").startswith("/"):
        socket_path = params["host"]
    if socket_path:
        params["unix_socket"] = socket_path
    if options.get("ssl"):
        params["ssl"] = options["ssl"]
    if options.get("connect_timeout"):
        params["connect_timeout"] = float(options["connect_timeout"])
    return params


def _innodb_name(database: str) -> str:
    """The database's name as InnoDB's dictionary writes it (as a file name: ``my-app`` is
    ``my@002dapp``). ASCII only: another character has a code of its own (then the name
    is found by none, and the tables' creation time is their identity instead)."""
    return "".join(c if c.isascii() and (c.isalnum() or c == "_") else
                   f"@{ord(c):04x}" if c.isascii() else c for c in database)


def _text(value: Any) -> Any:
    """A name or id column (VARBINARY) as text."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


class _Session:
    """A transaction on a MySQL connection, as the SQLite store's code runs statements:
    ``execute(statement, params)``. In a writing transaction, the store's own rows are
    read ``FOR UPDATE``."""

    in_transaction = True

    def __init__(self, store: MySQLStore, conn: Any, write: bool) -> None:
        self._store = store
        self._conn = conn
        self._write = write

    def execute(self, statement: str, params: Sequence[Any] = ()) -> Cursor:
        return self.execute_many([(statement, params)])[0]

    def execute_many(self, statements: Sequence[Statement]) -> list[Cursor]:
        """The statements in one round trip."""
        meta_get = self._store._meta_get
        return self._store._batch(self._conn, [
            (statement + " FOR UPDATE" if statement == meta_get and self._write else statement,
             params) for statement, params in statements])


class MySQLStore(RowStore):
    """The store in the InnoDB tables of one MySQL or MariaDB database."""

    def __init__(self, params: dict[str, Any], prefix: str = "beat-claims",
                 history_limit: int = 100, timeout: float = 5.0, url: str = "") -> None:
        self._params = dict(params)
        #: The client library (mysqlclient when installed, else PyMySQL; ``?driver=``).
        self.driver: Driver = choose(self._params.get("driver"))
        self.database = str(params.get("database") or "")
        self.path = self.database  # (what the SQLite store's messages name)
        self.prefix = prefix
        self.history_limit = history_limit
        self.timeout = max(0.001, float(timeout))
        self._url = redact_url(url) if url else (
            f"mysql://{params.get('host') or ''}:{params.get('port') or ''}/{self.database}"
            if "read_default_file" not in params else
            f"mysql:// (read_default_file {params['read_default_file']})")
        self.tables = _tables(prefix)
        self._sql = _mysql_statements(self.tables)
        self._meta_get = self._sql["meta_get"]
        self._workers_sql = _mysql_workers_statements(self.tables)
        self._lock = threading.Lock()
        self._db: Any = None
        self._db_file: tuple[str, str] | None = None  # type: ignore[assignment]
        self._pid = os.getpid()
        self._inherited: list[Any] = []
        self._foreign_hosts: set[str] = set()
        self._noted: set[tuple[str, int]] = set()
        self._heartbeat_file: tuple[str, str] | None = None  # type: ignore[assignment]
        self._ready = False
        self._now_ms = 0
        #: The connection whose reply is being read (None between statements).
        self._in_flight: Any = None
        #: When the session last answered (time.monotonic()): see IDLE_CHECK.
        self._used_at = time.monotonic()
        #: Transactions run again after a deadlock or a lock wait timeout (since opened).
        self.retries = 0
        #: Exchanges with the server since opened: a statement, a batch of statements
        #: (``_batch``), a COMMIT, a ROLLBACK or a ping is one each.
        self.round_trips = 0
        _STORES.add(self)

    @classmethod
    def from_url(cls, url: str, prefix: str = "beat-claims", history_limit: int = 100,
                 timeout: float = 5.0) -> MySQLStore:
        """The store of a ``mysql://``/``mariadb://`` URL (or ``django``/``django:ALIAS``
        naming a MySQL database), its tables created or migrated at once: a URL that
        cannot work is an error now, naming the setting."""
        scheme = url.split("://", 1)[0].lower() if "://" in url else url.split(":", 1)[0]
        if scheme == "django":
            alias = url.partition(":")[2] or "default"
            params = django_params(alias)
            if params is None:
                raise StoreConfigurationError(
                    f"beat_claims_url={url!r}: Django's database {alias!r} is not MySQL")
            store = cls(params, prefix, history_limit, timeout, "")
            store._url = f"django:{alias} ({store._url})"
        else:
            store = cls(parse_url(url), prefix, history_limit, timeout, url)
        try:
            with store._locked():
                store._connection(starting=True)
        except StoreError as exc:  # down for now: set up at the first call instead
            logger.warning("beat-claims: %s cannot be reached (%s); retried at the first"
                           " call", store.description, exc)
        return store

    @property
    def description(self) -> str:
        return f"{self._url} (prefix {self.prefix!r})"

    def _clock(self) -> int:
        """The server's clock as the current (or last) transaction read it."""
        return self._now_ms

    def now(self) -> int:
        return int(self._transaction(lambda db: self._now_ms, write=False))

    def _warn_foreign_hosts(self, owners: list[OwnerStatus]) -> None:
        """Beats of many hosts share a server: its clock is theirs (nothing to warn of)."""

    # -- connections --------------------------------------------------------------------
    def _check_path(self) -> None:
        """(no file)"""

    def _connection(self, starting: bool = False) -> Any:
        """The open connection (a new one after a fork or an outage); tables set up at the
        first; another server or other tables than at the last heartbeat are noticed."""
        if os.getpid() != self._pid:
            self._in_flight = None
            self._forget_connection()
        if self._in_flight is not None:
            # A statement was interrupted while its reply was on its way (a signal's
            # SystemExit anywhere: a heartbeat's identity, a set-up): that reply would be
            # the next statement's. The session goes (the server rolls it back).
            self._in_flight = None
            self._drop_connection()
        if self._db is not None and time.monotonic() - self._used_at > IDLE_CHECK:
            try:  # (closed by the server while idle: opened again, nothing was lost)
                self._in_flight = self._db
                self.round_trips += 1
                self.driver.ping(self._db)
                self._in_flight = None
                self._used_at = time.monotonic()
            except self.driver.Error:
                self._in_flight = None
                self._drop_connection()
        if self._db is None:
            self._db = self._open(starting)
        return self._db

    def _open(self, starting: bool) -> Any:
        params = {k: v for k, v in self._params.items() if k != "driver"}
        params.setdefault("connect_timeout", min(self.timeout, 5.0))
        try:
            conn = self.driver.connect(
                params, self.timeout,
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        except self.driver.Error as exc:
            raise self._failure(exc, starting) from exc
        try:
            if not self.database:  # (named by an option file: read_default_file)
                row = self._statement(conn, "SELECT DATABASE()").fetchone()
                self.database = self.path = str(row[0] or "") if row else ""
                if not self.database:
                    raise StoreConfigurationError(
                        f"beat_claims_url={self._url!r}: no database is named (NAME, or"
                        " database in the option file)")
            wait = max(1, round(self.timeout))
            # (lock_wait_timeout: a table's metadata lock, behind an operator's LOCK TABLES
            # or ALTER, is waited for no longer than a row's, not a day or a year on the
            # server after the client gave up)
            self._statement(conn, "SET time_zone = '+00:00', innodb_lock_wait_timeout = %s,"
                                  " lock_wait_timeout = %s,"
                                  " sql_mode = 'STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION'",
                            (wait, wait))
            conn.commit()
            if not self._ready:
                self._set_up(conn)
            identity = self._identity(conn)
            conn.commit()
        except StoreConfigurationError:
            _close(conn)
            raise
        except self.driver.Error as exc:
            _close(conn)
            raise self._failure(exc, starting) from exc
        except BaseException:
            _close(conn)
            raise
        self._db_file = identity
        return conn

    def _identity(self, conn: Any) -> tuple[str, str]:
        """(the server, the tables): MySQL's server UUID (MariaDB has none: its host name,
        port and server id); the InnoDB id of the meta table (made anew by a restore), or,
        without the PROCESS privilege, its creation time."""
        server = ""
        try:
            row = self._statement(conn, "SELECT @@server_uuid").fetchone()  # MySQL
            server = str(row[0]) if row else ""
        except self.driver.Error:
            pass
        if not server:
            row = self._statement(conn, "SELECT @@hostname, @@port, @@server_id").fetchone()
            server = ":".join(str(v) for v in row) if row else ""
        table = f"{_innodb_name(self.database)}/{self.tables.meta.strip('`')}"
        tables = ""
        for view in ("information_schema.INNODB_SYS_TABLES",  # MariaDB
                     "information_schema.INNODB_TABLES"):  # MySQL 8
            try:
                row = self._statement(conn, f"SELECT TABLE_ID FROM {view} WHERE NAME = %s",
                                      (table,)).fetchone()
            except self.driver.Error:
                continue
            if row:
                tables = f"id{row[0]}"
                break
        if not tables:
            row = self._statement(
                conn, "SELECT CREATE_TIME FROM information_schema.TABLES WHERE"
                " TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
                (self.tables.meta.strip("`"),)).fetchone()
            tables = f"at{row[0]}" if row else ""
        return server, tables

    def _set_up(self, db: Any) -> None:
        """Create the tables (if missing), check their layout and prefix, one installer
        at a time (a named lock)."""
        t = self.tables
        lock = f"beat-claims:{self.database}:{t.base}"[:64]
        row = self._statement(db, "SELECT GET_LOCK(%s, %s)",
                              (lock, max(1, round(self.timeout)))).fetchone()
        if not row or row[0] != 1:
            raise StoreError(f"{self.description}: another process is setting up the"
                             " store's tables")
        try:
            self._statement(db, _schema(t)[0])
            version = self._layout(
                cast(Any, _Session(self, db, write=False)), LAYOUT,
                f"the tables {t.base}_* in the database {self.database} were",
                "give this fleet another beat_claims_key_prefix")
            for statement in _schema(t)[1:]:
                self._statement(db, statement)
            have = {str(_text(r[0])) for r in self._statement(
                db, "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS"
                " WHERE TRIGGER_SCHEMA = DATABASE()").fetchall()}
            for name, statement in _triggers(t).items():
                if name not in have:
                    self._statement(db, statement)
            for key, value in (("version", str(max(version, LAYOUT))),
                               ("prefix", self.prefix)):
                self._statement(db, self._sql["meta_set"], (key, value))
            # The store's id: made with its tables, and kept as long as they are; the
            # anchoring row: what a call that may create entries locks first. (The
            # heartbeat's row is made by the first heartbeat: a set-up that locked it
            # after the store's id would wait for a heartbeat waiting for that id.)
            for key, value in (("store_id", os.urandom(16).hex()), ("anchoring", "0"),
                               ("anchoring_until", "0")):
                self._statement(db, self._sql["meta_add"], (key, value))
            self._end(db, commit=True)
            self._ready = True
        finally:
            with contextlib.suppress(self.driver.Error):
                self._end(db, commit=False)
            with contextlib.suppress(self.driver.Error):
                self._statement(db, "SELECT RELEASE_LOCK(%s)", (lock,))

    def _end(self, conn: Any, commit: bool) -> None:
        """COMMIT or ROLLBACK, its reply read as a statement's is (see _in_flight)."""
        self._in_flight = conn
        self.round_trips += 1
        if commit:
            conn.commit()
        else:
            conn.rollback()
        self._in_flight = None

    def _statement(self, conn: Any, statement: str, params: Sequence[Any] = ()) -> Cursor:
        """One statement, one round trip: its rows (names and ids as text)."""
        return self._batch(conn, [(statement, params)])[0]

    def _batch(self, conn: Any, statements: Sequence[Statement]) -> list[Cursor]:
        """Statements in one round trip (see mysql_driver.py): each one's rows (names and
        ids as text), in order. Text is sent as UTF-8 bytes (``_binary'...'``): names and
        ids are VARBINARY, and a utf8mb4 string compared with them costs a conversion per
        row (a batch of keys 50x slower); a text column takes the bytes as its UTF-8
        text."""
        self.round_trips += 1
        self._in_flight = conn  # (until every reply is read: see _transaction)
        found = self.driver.run(conn, [(statement, tuple(
            v.encode("utf-8", "surrogateescape") if isinstance(v, str) else v
            for v in params)) for statement, params in statements])
        self._in_flight = None
        self._used_at = time.monotonic()
        return [Cursor([tuple([v.decode("utf-8", "surrogateescape") if type(v) is bytes
                               else v for v in row]) for row in cur.fetchall()], cur.rowcount)
                for cur in found]

    def _failure(self, exc: Exception, starting: bool = False) -> Exception:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        text = redact_text(f"{type(exc).__name__}: {exc}", self._params.get("password")
                           or "")
        if starting and code in _REFUSED_CODES:
            return StoreConfigurationError(f"beat_claims_url={self._url!r}: {text}")
        return StoreError(f"{self.description}: {text}")

    def _drop_connection(self) -> None:
        if self._db is not None:
            _close(self._db)
        self._db = None

    def close(self) -> None:
        with self._locked():
            self._drop_connection()

    # -- transactions -------------------------------------------------------------------
    def _transaction(self, work: Callable[[Any], T], write: bool = True,
                     heartbeat: bool = False, lock: Callable[[Any], None] | None = None,
                     rows: bool = False, items: bool = False, *, turn: bool = False) -> T:
        """``work`` in one transaction: all of it is written, or none of it. Run again
        after a deadlock or a lock wait timeout (RETRIES times at most); a table dropped
        under it is made again (once). With ``items`` (the work of many items written in
        multi-row statements), a value the tables refuse (a name longer than its column)
        raises ItemFailed: the caller runs the items again one by one, and that item alone
        fails."""
        with self._locked():
            attempt = 0
            rebuilt = False
            while True:
                conn = self._connection()
                if heartbeat and write:  # the tables or the server may be other ones
                    try:
                        self._db_file = self._identity(conn)
                    except self.driver.Error as exc:
                        self._drop_connection()
                        raise self._failure(exc) from exc
                if not heartbeat and self._heartbeat_file not in (None, self._db_file):
                    raise StoreError(
                        f"{self.description}: the server or the store's tables are other"
                        " ones than at the last heartbeat (a failover, a restore): its"
                        " epoch must be read again before anything else")
                try:
                    try:
                        session: Any = _Session(self, conn, write)
                        if rows:  # the chunk's rows read at once (mysql_rows.py), the
                            # clock with them, in one round trip
                            session = Rows(session.execute_many, self._sql, self.tables.runs,
                                           self.tables.entries, self._savepoint, DUE_AT_ONCE,
                                           self.tables.base, (CLOCK, (), self._read_clock))
                        elif turn:
                            # Beats' heartbeats take turns, each reading the clock once it
                            # has its turn: on a new store the rows they lock (the epoch)
                            # are not there yet, and a locking read of a missing row locks
                            # nothing. (Workers' renewals take no turn: a worker paused in
                            # its renewal would hold every beat's heartbeat.)
                            self._read_clock(self._batch(conn, [
                                (self._sql["meta_add"], ("heartbeat", "")), (CLOCK, ())])[1])
                        else:
                            self._read_clock(self._statement(conn, CLOCK))
                        if lock is not None:
                            lock(session)
                        if rows:
                            session.begin()
                        result = work(session)
                        if rows:  # its writes and the COMMIT in one round trip
                            session.flush(("COMMIT", ()))
                        else:
                            self._end(conn, commit=True)
                        return result
                    except BaseException as exc:
                        if self._in_flight is conn and not _answered(self.driver, exc):
                            # Interrupted with a reply half read (a signal's SystemExit, a
                            # timeout): the next statement would read this one's reply. The
                            # session goes, and the server rolls its transaction back.
                            self._in_flight = None
                            self._drop_connection()
                        else:
                            self._in_flight = None
                            with contextlib.suppress(Exception):
                                self._end(conn, commit=False)
                        raise
                except self.driver.Error as exc:
                    code = exc.args[0] if exc.args else None
                    if code in (ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT) and attempt < RETRIES:
                        attempt += 1
                        self.retries += 1
                        logger.info("beat-claims: %s: %s; the transaction runs again"
                                    " (%d of %d)", self.description, exc, attempt, RETRIES)
                        time.sleep(0.002 * attempt)
                        continue
                    if code == ER_NO_SUCH_TABLE and not rebuilt:  # dropped under us
                        rebuilt = True
                        try:
                            self._set_up(conn)
                            # (other tables: no call but a heartbeat until one has read
                            # their epoch, as after a reconnect to them)
                            self._db_file = self._identity(conn)
                            self._end(conn, commit=True)
                        except (self.driver.Error, StoreConfigurationError) as again:
                            raise StoreError(f"{self.description}: {again}") from again
                        continue
                    if items and isinstance(exc, self.driver.item_errors):
                        raise ItemFailed(f"{type(exc).__name__}: {exc}") from exc
                    if isinstance(exc, (self.driver.OperationalError,
                                        self.driver.InterfaceError)):
                        self._drop_connection()
                    raise self._failure(exc) from exc

    def _read_clock(self, found: Cursor) -> None:
        """The server's clock, as CLOCK read it, for the transaction's transitions."""
        row = found.fetchone()
        if not row or row[0] is None:  # (never a clock of 0)
            raise StoreError(f"{self.description}: the server's clock could not be read"
                             f" ({row!r})")
        self._now_ms = int(row[0] * 1000)

    _savepoint = ("SAVEPOINT item", "ROLLBACK TO SAVEPOINT item", "RELEASE SAVEPOINT item")

    def _chunk(self, what: str, part: Sequence[I],
               run: Callable[[Any, Sequence[I]], list[T]]) -> list[T]:
        """One transaction of ``_each``: the rows of the chunk's entries locked first, in
        name order (calls that may create entries lock the anchoring row before them)."""
        def lock(db: _Session) -> None:
            if what in ("register", "write_definitions"):  # one creator at a time
                db.execute(self._meta_get, ("anchoring",))
            names = sorted({name for item in part if (name := _entry_of(item)) is not None})
            if names:
                marks = ", ".join(["%s"] * len(names))
                db.execute(f"SELECT name FROM {self.tables.entries} WHERE name IN ({marks})"
                           " ORDER BY name FOR UPDATE", names)

        if what in ROWS_READ_AT_ONCE:
            try:
                return self._transaction(lambda db: run(db, part), rows=True, items=True,
                                         lock=lambda db: _load(db, what, part,
                                                               self.history_limit,
                                                               self._meta_get))
            except ItemFailed:  # an item failed: a savepoint each, every statement sent
                pass
        return self._transaction(lambda db: run(db, part), lock=lock)

    def _outage(self, exc: BaseException) -> bool:
        return _is_outage(self.driver, exc)

    def history(self, entry: str, limit: int | None = None) -> list[Any]:
        return super().history(entry, NO_LIMIT if limit is None else limit)

    # -- reads of many entries: a statement per thousand names -------------------------
    def _by_name(self, names: Sequence[str], statement: str) -> dict[str, tuple[Any, ...]]:
        """The rows of ``statement`` (its ``WHERE name = %s`` made a list; its first column
        the name) for ``names``, by name, read in one transaction."""
        wanted = list(dict.fromkeys(names))

        def work(db: _Session) -> dict[str, tuple[Any, ...]]:
            out: dict[str, tuple[Any, ...]] = {}
            for start in range(0, len(wanted), NAMES_PER_READ):
                part = wanted[start:start + NAMES_PER_READ]
                listed = statement.replace("WHERE name = %s",
                                           f"WHERE name IN ({', '.join(['%s'] * len(part))})")
                out.update((str(row[0]), row) for row in db.execute(listed, part).fetchall())
            return out

        return self._transaction(work, write=False) if wanted else {}

    def entries(self, names: Sequence[str] | None = None) -> list[EntryRecord]:
        if names is None:
            return super().entries(None)
        found = self._by_name(names, self._sql["entry_read"])
        return [_entry_record(found[name]) for name in names if name in found]

    def definitions(self, names: Sequence[str] | None = None, after: str = "",
                    limit: int = 1000) -> list[StoredDefinition]:
        if names is None:
            return super().definitions(None, after, limit)
        found = self._by_name(names, self._sql["def_get"].replace(
            "SELECT ", "SELECT name, ", 1))
        return [stored_definition(name, *row[1:6]) for name in dict.fromkeys(names)
                if (row := found.get(name)) is not None
                and (row[2] not in (0, None) or row[1] is not None)]

    # -- claims: the check before publish in the claim's own transaction ---------------
    def _claim_one(self, db: Any, now: int, owner: str, plan: ClaimPlan) -> ClaimResult:
        """The SQLite store's claim; with ``plan.send`` (SendAtOnce), each new occurrence is
        then checked as ``check`` would check it, in due order, in the same transaction
        (not while the entry had runs due again: the caller checks those with them)."""
        result = super()._claim_one(db, now, owner, plan)
        send = plan.send
        if (send is None or result.status is not ClaimStatus.OK or not result.claims
                or result.taken or len(send.task_ids) != len(plan.claim)):
            return result
        task_ids = dict(zip(plan.claim, send.task_ids))
        checked = tuple(self._check_one(db, now, owner, Check(
            c, task_ids[c.due], None, send.overlap)) for c in sorted(
            result.claims, key=lambda c: c.due))
        return dataclasses.replace(result, checked=checked)

    # -- definitions: a bulk in a few statements ----------------------------------------
    def write_definitions(self, writes: Sequence[DefinitionWrite]
                          ) -> list[DefinitionResult]:
        """As the SQLite store's (``_define_one``, item after item, in its order), with the
        reads and writes of a chunk of items in a few statements: the store's marks and the
        entries' rows read and locked at once, every item judged here, the entries written
        in one multi-row statement. A chunk with a write that records skips, or that fails
        here for a reason that is no outage, is written item by item instead."""
        writes = checked_writes(writes, self.history_limit)
        out: list[DefinitionResult] = []
        for part in _definition_chunks(writes):
            if any(w.skip for w in part):
                out += super().write_definitions(part)
                continue
            def chunk(db: _Session, part: list[DefinitionWrite] = part
                      ) -> list[DefinitionResult]:
                return self._define_chunk(db, part)

            try:
                out += self._transaction(chunk)
            except StoreError:
                raise
            except Exception as exc:
                logger.warning("beat-claims: definition writes in %s, item by item: %s: %s",
                               self.description, type(exc).__name__, exc)
                out += super().write_definitions(part)
        return out

    def _define_chunk(self, db: _Session, part: list[DefinitionWrite]
                      ) -> list[DefinitionResult]:
        t, now = self.tables, self._clock()
        keys = ("anchoring", "anchoring_until", "changes_seq", "changes_dropped")
        meta: dict[str, Any] = {str(k): v for k, v in db.execute(
            f"SELECT `key`, value FROM {t.meta} WHERE `key` IN (%s, %s, %s, %s)"
            " ORDER BY `key` FOR UPDATE", keys).fetchall()}
        names = sorted({w.name for w in part})
        marks = ", ".join(["%s"] * len(names))
        columns = ("description", "anchor", "checkpoint", "token", "definition", "version",
                   "origin", "changed_by", "changed_at", "change_id", "changed_seq",
                   "next_due")
        rows = {str(row[0]): dict(zip(columns, row[1:])) for row in db.execute(
            f"SELECT name, {', '.join(columns)} FROM {t.entries} WHERE name IN ({marks})"
            " ORDER BY name FOR UPDATE", names).fetchall()}
        top = db.execute(self._sql["changes_top"]).fetchone()
        head = max(_maybe_int(meta.get("changes_seq")) or 0, int(top[1]) if top else 0)
        dropped = 0 if meta.get("changes_dropped") is None else _maybe_int(
            meta["changes_dropped"])
        written: dict[str, dict[str, Any]] = {}
        anchoring: list[int] = []

        def anchor() -> int:
            if not anchoring:
                instant = _maybe_int(meta.get("anchoring"))
                until = _maybe_int(meta.get("anchoring_until"))
                if instant is None or until is None or now >= until:
                    instant = now
                    meta["anchoring"], meta["anchoring_until"] = now, now + ANCHOR_SHARED_MS
                anchoring.append(instant)
            return anchoring[0]

        results = []
        for w in part:
            row = rows.get(w.name)

            def answer(status: WriteStatus, detail: str = "", row: Any = row,
                       w: DefinitionWrite = w) -> DefinitionResult:
                state = (EntryState(int(row["anchor"]), _maybe_int(row["checkpoint"]),
                                    _maybe_int(row["token"]) or 0)
                         if row is not None and row["anchor"] is not None else None)
                stored = None if row is None else (
                    row["definition"], row["version"] or None, row["origin"],
                    row["changed_by"], row["changed_at"])
                return definition_result(w, status, state, stored, detail)

            text = None if row is None else row["definition"]
            version = 0 if row is None else int(row["version"])
            if version < 0 or (version == 0 and text is not None):
                results.append(DefinitionResult(w.name, WriteStatus.CORRUPT, 0, detail=(
                    f"unreadable field 'version' ({version!r:.40})")))
                continue
            live = text is not None
            if w.change_id and row is not None and row["change_id"] == w.change_id:
                results.append(answer(WriteStatus.OK))
            elif w.expected_version == 0 and live:
                results.append(answer(WriteStatus.EXISTS))
            elif w.expected_version != 0 and not live:
                results.append(answer(WriteStatus.MISSING))
            elif w.expected_version != 0 and version != w.expected_version:
                results.append(answer(WriteStatus.CONFLICT, "version"))
            elif w.expected_checkpoint is not None and (
                    row is None or row["checkpoint"] != w.expected_checkpoint):
                results.append(answer(WriteStatus.CONFLICT, "checkpoint"))
            else:
                if row is None or row["anchor"] is None:
                    row = rows[w.name] = {
                        **dict.fromkeys(columns), **(row or {}), "description": "",
                        "anchor": anchor(), "checkpoint": None, "token": 0, "version": version}
                if w.checkpoint is not None and (row["checkpoint"] is None
                                                 or w.checkpoint > row["checkpoint"]):
                    row["checkpoint"] = w.checkpoint
                if dropped is None:  # (an unreadable mark: set to the head)
                    dropped = head
                    meta["changes_dropped"] = head
                head = max(head + 1, now * CHANGES_PER_MS)
                meta["changes_seq"] = head
                row.update(definition=w.definition, version=version + 1,
                           origin=w.origin.value, changed_by=w.by, changed_at=now,
                           change_id=w.change_id or None, changed_seq=head,
                           next_due=written_next_due(w))
                written[w.name] = row
                results.append(answer(WriteStatus.OK, row=row))
        entries = list(written.items())
        if entries:
            values = ", ".join([f"(%s, {', '.join(['%s'] * len(columns))})"] * len(entries))
            db.execute(f"INSERT INTO {t.entries} (name, {', '.join(columns)}) VALUES {values}"
                       " ON DUPLICATE KEY UPDATE "
                       + ", ".join(f"{c} = VALUES({c})" for c in columns),
                       [v for name, row in entries for v in (name, *(row[c] for c in columns))])
        if written:
            changed = [(k, str(meta[k])) for k in keys if meta.get(k) is not None]
            db.execute(f"INSERT INTO {t.meta} (`key`, value) VALUES "
                       + ", ".join(["(%s, %s)"] * len(changed))
                       + " ON DUPLICATE KEY UPDATE value = VALUES(value)",
                       [v for pair in changed for v in pair])
            self._drop_tombstones(cast(Any, db), now)
        return results

    def _workers_statements(self) -> dict[str, str]:
        return self._workers_sql


#: The calls whose chunks read their rows at once (mysql_rows.py).
ROWS_READ_AT_ONCE = ("claim", "check", "record_sent", "release", "reclaim", "finish",
                     "register", "unregister", "index")


def _load(rows: Rows, what: str, part: Sequence[Any], limit: int, meta_get: str) -> None:
    """Read (and lock) at once the rows the chunk's items are about."""
    names = sorted({name for item in part if (name := _entry_of(item)) is not None})
    if not names:
        return
    keys: list[tuple[str, int]] = []
    added: dict[str, int] | None = {} if what in ("claim", "register") else None
    if what == "register":  # one creator of entries at a time (see the module's doc)
        rows.execute(meta_get, ("anchoring",))  # (read FOR UPDATE: a writing session's)
    for item in part:
        if isinstance(item, ClaimPlan):
            dues = [*item.claim, *(due for due, _ in item.skip)]
            keys += [(item.entry, int(due)) for due in dues]
            assert added is not None
            added[item.entry] = added.get(item.entry, 0) + len(dues)
        elif isinstance(item, (Check, Release)):
            keys.append((item.claim.entry, int(item.claim.due)))
        elif isinstance(item, (Claim, Reclaim, Outcome)):
            keys.append((item.entry, int(item.due)))
        elif isinstance(item, EntrySeed) and item.runs:
            keys += [(item.name, int(run.due)) for run in item.runs]
            assert added is not None
            added[item.name] = added.get(item.name, 0) + len(item.runs)
    rows.load(names, keys, added, limit)


def _definition_chunks(writes: list[DefinitionWrite]) -> list[list[DefinitionWrite]]:
    """The writes cut in chunks of DEFINITIONS_CHUNK items and DEFINITIONS_BYTES of text at
    most (one item at least)."""
    out: list[list[DefinitionWrite]] = []
    size = 0
    for w in writes:
        n = len((w.definition or "").encode("utf-8")) + 4 * len(w.name) + 200
        if not out or len(out[-1]) >= DEFINITIONS_CHUNK or size + n > DEFINITIONS_BYTES:
            out.append([])
            size = 0
        out[-1].append(w)
        size += n
    return out


def _entry_of(item: Any) -> str | None:
    """The entry an item of a call is about (its row is locked for the transaction)."""
    if isinstance(item, str):
        return item
    if isinstance(item, (ClaimPlan, Reclaim, Delivery)):
        return item.entry
    if isinstance(item, (Check, Release)):
        return item.claim.entry
    if isinstance(item, (EntrySeed, IndexWrite)):
        return item.name
    for field in ("entry", "name"):
        value = getattr(item, field, None)
        if isinstance(value, str):
            return value
    return None


def _answered(driver: Driver, exc: BaseException) -> bool:
    """Whether ``exc`` is the server's answer (an error packet read whole: the session can
    go on), not an interruption of the reply."""
    code = exc.args[0] if exc.args else None
    # (the client's own errors are 2000 to 2999: a connection lost, a reply cut short)
    return (isinstance(exc, driver.Error) and not isinstance(exc, driver.InterfaceError)
            and isinstance(code, int) and code >= 1000 and not 2000 <= code < 3000)


def _is_outage(driver: Driver, exc: BaseException) -> bool:
    """An error of the server or the connection (the whole call fails, or runs again),
    not of one item."""
    if isinstance(exc, (driver.OperationalError, driver.InterfaceError)):
        return True
    return isinstance(exc, driver.Error) and bool(exc.args) and exc.args[0] in (
        ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT, ER_NO_SUCH_TABLE)


def _close(conn: Any) -> None:
    with contextlib.suppress(Exception):
        conn.close()


__all__ = ["LAYOUT", "SCHEMES", "MySQLStore", "django_params", "parse_url"]
