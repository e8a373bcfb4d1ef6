"""The MySQL store's client library: mysqlclient (``MySQLdb``, in C) when it is installed,
else PyMySQL (pure Python).

Both speak the same protocol and raise the same DB-API errors with the server's codes; the
store's work is the same statements either way. What differs is the client's own time:
mysqlclient parses rows and escapes values in C (a burst of 1,000 through the store's
calls: a fifth less CPU than with PyMySQL, ``bench/mysql_store.py``; docs/stores.md), and
with it a signal (a beat's SIGTERM) is handled once the reply of the statement under way
has come (within the store's timeout: ``read_timeout``) rather than at once.
``?driver=pymysql`` (or ``mysqlclient``) in the URL chooses one.

Statements go to the server a batch at a time (``run``): several statements, their values
bound here by the library's own escaping, sent as one text (the session is opened with
multi-statements on) and their results read in order, one round trip for all of them. The
server stops at the first that fails (its error is raised; those after it never ran).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Sequence
from typing import Any

from .base import StoreConfigurationError
from .mysql_rows import Cursor, Statement

#: The libraries, in the order they are tried: (the name ``?driver=`` gives, the module).
DRIVERS = (("mysqlclient", "MySQLdb"), ("pymysql", "pymysql"))
#: The capability flags both set: FOUND_ROWS (an UPDATE's rowcount counts the rows it
#: matched, as SQLite's does), MULTI_STATEMENTS and MULTI_RESULTS (a batch in one round trip).
FOUND_ROWS, MULTI_STATEMENTS, MULTI_RESULTS = 2, 1 << 16, 1 << 17


@dataclasses.dataclass(frozen=True)
class Driver:
    """One client library, and what the store needs of it."""

    name: str
    module: Any

    # (the DB-API's error classes, as the library names them)
    @property
    def Error(self) -> type[Exception]:
        return self.module.MySQLError

    @property
    def OperationalError(self) -> type[Exception]:
        return self.module.OperationalError

    @property
    def InterfaceError(self) -> type[Exception]:
        return self.module.InterfaceError

    @property
    def item_errors(self) -> tuple[type[Exception], ...]:
        """Errors of one value the tables refuse (a name longer than its column)."""
        return (self.module.DataError, self.module.IntegrityError)

    def connect(self, params: dict[str, Any], timeout: float, init_command: str) -> Any:
        """A session: UTF-8 (utf8mb4), no autocommit, replies waited for ``timeout`` + 1
        seconds at most, bytes sent as ``_binary'...'`` (names and ids are VARBINARY: a
        utf8mb4 string compared with them costs a conversion per row)."""
        wait = max(1, round(timeout + 1))
        params = dict(params)
        flags = FOUND_ROWS | MULTI_STATEMENTS | MULTI_RESULTS
        if self.name == "mysqlclient":
            # (whole seconds; its bytes are _binary'...' only when asked)
            params["connect_timeout"] = max(1, math.ceil(params.get("connect_timeout", 5)))
            params["binary_prefix"] = True
        return self.module.connect(**params, charset="utf8mb4", autocommit=False,
                                   read_timeout=wait, write_timeout=wait, client_flag=flags,
                                   init_command=init_command)

    def ping(self, conn: Any) -> None:
        """Whether the session still answers (never reconnects: the store opens anew)."""
        if self.name == "mysqlclient":
            conn.ping()
        else:
            conn.ping(reconnect=False)

    def run(self, conn: Any, statements: Sequence[Statement]) -> list[Cursor]:
        """The statements in one round trip: each one's rows (as the library gives them)
        and the rows it changed, in order."""
        # (the cursor is closed only once every reply is read: closing it with a reply
        # unread reads on, or raises over the error that stopped the reading; the store
        # drops a session whose reply was not read whole)
        cur = conn.cursor()
        if self.name == "mysqlclient":
            text: str | bytes = b";\n".join(_bound(conn, statement, params)
                                            for statement, params in statements)
        else:
            text = ";\n".join(cur.mogrify(statement, tuple(params)) if params else statement
                              for statement, params in statements)
        cur.execute(text)
        out = []
        for i in range(len(statements)):
            if i and not cur.nextset():
                raise self.InterfaceError(
                    0, f"{len(statements)} statements sent, {i} results read")
            rows = cur.fetchall() if cur.description is not None else ()
            out.append(Cursor(list(rows), cur.rowcount))
        cur.close()
        return out


def _bound(conn: Any, statement: str, params: Sequence[Any]) -> bytes:
    """mysqlclient's statement with its values, as its ``mogrify`` binds them (the same
    text, checked by the tests), at a third of its cost: the names, records and numbers of
    a chunk's multi-row statements are many (a thousand values each), and its ``literal``
    tries every type in turn for each. Bytes are ``_binary'...'``, escaped by the library
    (``string_literal``, in C); a type other than these is the library's to write."""
    text = statement.encode("utf-8")
    if not params:
        return text
    escape = conn.string_literal
    out = []
    for value in params:
        kind = type(value)
        if value is None:
            out.append(b"NULL")
        elif kind is int:
            out.append(b"%d" % value)
        elif kind is bytes:
            out.append(b"_binary" + escape(value))
        elif kind is str:
            out.append(escape(value.encode(conn.encoding)))
        else:
            out.append(conn.literal(value))
    return text % tuple(out)


def choose(name: str | None = None) -> Driver:
    """The library named (``mysqlclient`` or ``pymysql``), or the first installed."""
    wanted = [(n, m) for n, m in DRIVERS if name in (None, n)]
    if not wanted:
        raise StoreConfigurationError(
            f"beat_claims_url: driver={name!r}: one of {', '.join(n for n, _ in DRIVERS)}")
    for driver, module in wanted:
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        if driver == "mysqlclient" and not hasattr(
                importlib.import_module("MySQLdb.cursors").Cursor, "mogrify"):
            continue  # (before 2.2: no mogrify, no batch)
        return Driver(driver, found)
    if name == "mysqlclient":
        raise StoreConfigurationError(
            "beat_claims_url: driver=mysqlclient: mysqlclient 2.2 or later is not installed:"
            " pip install 'beat-claims[mysqlclient]'")
    raise StoreConfigurationError(
        "beat_claims_url: the MySQL store needs PyMySQL (or mysqlclient): pip install"
        " 'beat-claims[mysql]'")


__all__ = ["DRIVERS", "Driver", "choose"]
