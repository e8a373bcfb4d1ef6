"""MySQL only: the store's epoch follows its tables, whatever the database is named.

The tables' identity is the InnoDB id of the meta table (a table made again, or another
table renamed in its place, has another one); InnoDB names a table by its database's name
encoded as a file name (``my-app`` is ``my@002dapp``), and a lookup by the plain name found
nothing: the identity fell back to the table's creation time, to the second, so that a
table put in place within the second it was made went unnoticed."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import pytest

from beat_claims.stores.mysql import MySQLStore

from ..processes import wait_for
from .backend_mysql import _connect, url
from .helpers import owner


@pytest.fixture
def dashed_database() -> Iterator[str]:
    name = f"bc-contract-{uuid.uuid4().hex[:8]}"
    with contextlib.closing(_connect(None)) as conn:
        conn.cursor().execute(f"CREATE DATABASE `{name}`")
    try:
        yield name
    finally:
        with contextlib.closing(_connect(None)) as conn:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")


def test_a_meta_table_renamed_in_place_within_its_second_is_another_epoch(
        dashed_database: str) -> None:
    wait_for(lambda: time.time() % 1 < 0.3, 3, "the start of a second", interval=0.01)
    started = int(time.time())
    store = MySQLStore.from_url(url(dashed_database), "bc")
    try:
        before = store.heartbeat(owner(1), 10.0)
        with contextlib.closing(_connect(dashed_database)) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE bc_meta_copy LIKE bc_meta")
            cur.execute("INSERT INTO bc_meta_copy SELECT * FROM bc_meta")
            cur.execute("RENAME TABLE bc_meta TO bc_meta_old, bc_meta_copy TO bc_meta")
        if int(time.time()) != started:
            pytest.skip("the swap took longer than the second it began in")
        after = store.heartbeat(owner(1), 10.0)
        assert after.epoch != before.epoch, (store._db_file, before, after)
    finally:
        store.close()
