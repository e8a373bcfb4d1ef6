"""PostgreSQL only: a definition write whose reply is lost (a real TCP proxy in front of
the server throws the reply away after the statement committed) is written once (and a
claim's next due instant with its checkpoint, once); and the
change log's numbers are committed in their order (a write waits for another one's commit
before it numbers its own changes), so a reader never passes a number a later commit
brings."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from beat_claims.enums import Origin
from beat_claims.stores.base import DefinitionWrite, WriteStatus
from beat_claims.stores.postgres import PostgresStore

from ..faults import proxy
from ..processes import wait_for
from .backend_postgres import PORT, address, admin, fresh_store
from .helpers import (
    a_claim_whose_reply_is_lost_wrote_its_next_due_once,
    a_definition_write_whose_reply_is_lost_is_written_once,
)


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> Iterator[PostgresStore]:
    with fresh_store(request) as store:
        yield store


#: Each write whose reply is lost: what must hold, and the function it calls.
LOST = {"definition write": (a_definition_write_whose_reply_is_lost_is_written_once, "define"),
        "claim's next due": (a_claim_whose_reply_is_lost_wrote_its_next_due_once, "claim")}


@pytest.mark.parametrize("write", sorted(LOST))
def test_a_write_whose_reply_was_lost_is_written_once(pg: PostgresStore, write: str) -> None:
    holds, function = LOST[write]
    with proxy(int(PORT)) as p:
        lossy = PostgresStore.from_url(address(pg).replace(f":{PORT}/", f":{p.port}/"),
                                       pg.prefix)
        try:
            holds(pg, lossy, p, f'"{pg.schema}".{function}(')
        finally:
            lossy.close()


def test_a_definition_write_numbers_its_change_only_once_the_one_before_committed(
        pg: PostgresStore) -> None:
    """Another transaction holding the change log's row (as a write that has numbered its
    change and not committed yet): a second write waits, and its number is above."""
    pg.write_definitions([DefinitionWrite("a", '{"task": "a"}', 0, Origin.API, "ops")])
    cursor = pg.changes(None).cursor
    other = psycopg.connect(address(pg))
    try:
        other.execute(f'SELECT seq FROM "{pg.schema}".changes FOR UPDATE')
        done: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: done.update(result=pg.write_definitions(
            [DefinitionWrite("b", '{"task": "b"}', 0, Origin.API, "ops")])), daemon=True)
        thread.start()
        wait_for(lambda: admin().execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = %s AND wait_event_type = 'Lock'",
            [f"beat-claims ({pg.schema})"]).fetchall(), 10, "the write to wait")
        assert thread.is_alive() and "result" not in done  # nothing numbered meanwhile
    finally:
        other.rollback()
        other.close()
    thread.join(10)
    assert [r.status for r in done["result"]] == [WriteStatus.OK]
    assert [d.name for d in pg.changes(cursor).changed] == ["b"]
