"""MySQL only: a call interrupted while it reads a reply (a signal's SystemExit in a beat
that is stopping, a KeyboardInterrupt) leaves no reply behind for the next call to read;
tables made again under a call are another epoch; a session the server closed while it was
idle is opened again. With each client library installed (PyMySQL, mysqlclient)."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any, cast

import pytest

from beat_claims.stores.base import EntrySeed, Store, StoreError
from beat_claims.stores.mysql import IDLE_CHECK, MySQLStore

from .backend_mysql import BACKEND as backend_mysql
from .backend_mysql import INSTALLED_DRIVERS, with_driver
from .backend_mysql import admin as backend_mysql_admin
from .backend_mysql import sql as backend_mysql_sql
from .helpers import owner


@pytest.fixture(params=INSTALLED_DRIVERS)
def mysql_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with backend_mysql.open(request, 100) as opened, with_driver(
            cast(MySQLStore, opened), request.param) as store:
        yield store


#: Where each library reads a reply, in Python: a result (the first statement's; PyMySQL
#: reads it in ``_read_query_result``, mysqlclient's ``query`` returns with its rows not
#: yet read) and an OK packet (a COMMIT's, a ROLLBACK's, a ping's: PyMySQL's
#: ``_read_ok_packet``; mysqlclient reads them in C, where a signal is handled once the
#: reply is in: the SystemExit comes as the call returns).
READERS = {"pymysql": {"result": [("pymysql.connections", "_read_query_result")],
                       "ok": [("pymysql.connections", "_read_ok_packet")]},
           "mysqlclient": {"result": [("MySQLdb.connections", "query")],
                           "ok": [("MySQLdb.connections", name)
                                  for name in ("commit", "rollback", "ping")]}}


def interrupt_the_next_reply(monkeypatch: pytest.MonkeyPatch, store: Store, why: str,
                             reply: str = "result") -> None:
    """The next ``reply`` (a result, or an OK packet: a COMMIT's, a ROLLBACK's, a ping's)
    the store's library reads raises SystemExit (a SIGTERM while it was on its way); the
    replies after it are read as usual."""
    driver = cast(MySQLStore, store).driver.name
    interrupted = []
    for module, name in READERS[driver][reply]:
        connection = importlib.import_module(module).Connection
        real = getattr(connection, name)

        def stopping(self: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if interrupted:
                return _real(self, *args, **kwargs)
            interrupted.append(True)
            if driver == "mysqlclient":  # (the reply comes in C: the signal after it,
                # whatever the reply was)
                with contextlib.suppress(Exception):
                    _real(self, *args, **kwargs)
            raise SystemExit(why)

        monkeypatch.setattr(connection, name, stopping)


def test_a_call_interrupted_in_its_reply_leaves_nothing_for_the_next_one_to_read(
        mysql_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    mysql_store.register([EntrySeed("a", "every 1s (a)"), EntrySeed("b", "every 2s (b)")])
    interrupt_the_next_reply(monkeypatch, mysql_store,
                             "SIGTERM while the reply was on its way")
    with pytest.raises(SystemExit):
        mysql_store.entries(["a"])
    [b] = mysql_store.entries(["b"])
    assert (b.name, b.description) == ("b", "every 2s (b)"), b
    assert [r.name for r in mysql_store.entries(["a", "b"])] == ["a", "b"]


def test_a_heartbeat_interrupted_while_it_reads_the_server_identity_leaves_no_reply_behind(
        mysql_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The heartbeat reads the server's and the tables' identity before its transaction;
    a SIGTERM there must not leave that reply for the next call."""
    mysql_store.register([EntrySeed("a", "every 1s (a)"), EntrySeed("b", "every 2s (b)")])
    interrupt_the_next_reply(monkeypatch, mysql_store,
                             "SIGTERM while the identity's reply was on its way")
    with pytest.raises(SystemExit):
        mysql_store.heartbeat(owner(1), 10.0)
    found = mysql_store.entries(["b"])
    assert [(r.name, r.description) for r in found] == [("b", "every 2s (b)")], found
    beat = mysql_store.heartbeat(owner(1), 10.0)
    assert beat.owners, beat


def test_tables_made_again_under_a_call_are_another_epoch_that_a_heartbeat_reads_first(
        mysql_store: Store) -> None:
    """The store's tables dropped under running beats (a wipe, a dump being loaded again):
    the call that finds them missing makes them again, and they are other tables, as after
    a reconnect: nothing but a heartbeat is answered until one has read the new epoch (no
    claim on an empty store before the beats have settled and seeded what they know)."""
    mysql_store.register([EntrySeed("a", "every 1s (a)")])
    before = mysql_store.heartbeat(owner(1), 10.0)
    backend_mysql.wipe(mysql_store)
    with pytest.raises(StoreError, match="epoch"):
        mysql_store.register([EntrySeed("a", "every 1s (a)")])
    after = mysql_store.heartbeat(owner(1), 10.0)
    assert after.epoch != before.epoch and after.settle_until is not None, (before, after)
    assert mysql_store.entries() == []


def test_a_session_the_server_closed_while_it_was_idle_is_opened_again_without_an_error(
        mysql_store: Store) -> None:
    """MySQL closes sessions idle for ``wait_timeout`` (a few minutes on hosted servers and
    behind proxies): a worker's first start after a quiet hour must not fail as an outage
    for it. (Here the session is killed, as the server does at its wait_timeout.)"""
    mysql_store.register([EntrySeed("a", "every 1s (a)")])
    store = cast(MySQLStore, mysql_store)
    killed = store._transaction(lambda db: db.execute("SELECT CONNECTION_ID()").fetchone()[0],
                                write=False)
    backend_mysql_sql(f"KILL {int(killed)}")
    store._used_at -= IDLE_CHECK + 1  # (idle for longer than the check's threshold)
    assert [e.name for e in mysql_store.entries(["a"])] == ["a"]
    opened = store._transaction(lambda db: db.execute("SELECT CONNECTION_ID()").fetchone()[0],
                                write=False)
    assert mysql_store.entries(["a"]) and store._transaction(
        lambda db: db.execute("SELECT CONNECTION_ID()").fetchone()[0], write=False
    ) == opened, "the session opened again is kept"


def test_a_rollback_interrupted_in_its_reply_leaves_nothing_for_the_next_call_to_read(
        mysql_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A transaction that fails is rolled back; a SIGTERM while the ROLLBACK's reply is on
    its way must not leave that reply for the next call (its clock read would find no row,
    and every statement after it would read the one before's rows)."""
    mysql_store.register([EntrySeed("a", "every 1s (a)")])
    store = cast(MySQLStore, mysql_store)

    def failing(db: Any) -> None:
        interrupt_the_next_reply(monkeypatch, store, "SIGTERM while the rollback's reply"
                                 " was on its way", "ok")
        raise ValueError("a transition that fails")

    with pytest.raises(SystemExit):
        store._transaction(failing)
    found = mysql_store.entries(["a"])
    assert [(r.name, r.description) for r in found] == [("a", "every 1s (a)")], found
    assert store.now() > 0


def test_a_statement_behind_a_table_lock_gives_up_on_the_server_too(
        request: pytest.FixtureRequest) -> None:
    """A table locked by an operator (LOCK TABLES, a dump without --single-transaction, an
    ALTER): the store's statement waits for the table's metadata lock. It must give up on
    the server within the store's timeout, as the client does, not wait on there for a day
    (MariaDB's lock_wait_timeout; a year on MySQL) holding the rows it had locked."""
    with backend_mysql.open(request, 100) as opened:
        store = cast(MySQLStore, opened)
        store.register([EntrySeed("a", "every 1s (a)")])
        running = MySQLStore(store._params, store.prefix, timeout=1.0)
        assert [e.name for e in running.entries(["a"])] == ["a"]
        starting = MySQLStore(store._params, store.prefix, timeout=1.0)
        operator = backend_mysql_admin()
        try:
            with operator.cursor() as cur:
                cur.execute(f"LOCK TABLES {store.tables.entries} WRITE")
            for which in (running, starting):  # (a transaction's read; the set-up's)
                with pytest.raises(StoreError):
                    which.entries(["a"])
            with operator.cursor() as cur:
                cur.execute("SELECT ID, STATE, INFO FROM information_schema.PROCESSLIST"
                            " WHERE DB = DATABASE() AND STATE LIKE '%metadata lock%'")
                waiting = cur.fetchall()
            assert waiting == (), f"still waiting on the server: {waiting}"
        finally:
            with operator.cursor() as cur:
                cur.execute("UNLOCK TABLES")
        for which in (running, starting):
            assert [e.name for e in which.entries(["a"])] == ["a"]
            which.close()


def test_a_ping_interrupted_in_its_reply_leaves_nothing_for_the_next_call_to_read(
        mysql_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    mysql_store.register([EntrySeed("a", "every 1s (a)")])
    store = cast(MySQLStore, mysql_store)
    store._used_at -= IDLE_CHECK + 1  # (idle: its next call pings first)
    interrupt_the_next_reply(monkeypatch, mysql_store,
                             "SIGTERM while the ping's reply was on its way", "ok")
    with pytest.raises(SystemExit):
        mysql_store.entries(["a"])
    for _ in range(3):
        found = mysql_store.entries(["a"])
        assert [(r.name, r.description) for r in found] == [("a", "every 1s (a)")], found
