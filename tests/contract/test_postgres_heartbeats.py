"""PostgreSQL only: heartbeats at the same instant. Every heartbeat locks the epoch's row
first, so one that reads a beat's renewal reads the epoch that renewal began with it (a
running beat that found the store went back begins it in its heartbeat's own step): a beat
joining meanwhile never sees a running beat heartbeat without the new epoch, not even at
its first heartbeat."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from beat_claims.runs import Owner
from beat_claims.stores.base import Continuity, Heartbeat, Written
from beat_claims.stores.postgres import PostgresStore

from .backend_postgres import BACKEND, address, fresh_store
from .helpers import A, one_claim

TTL = 10.0
JOINER = Owner(id="joiner", host="contract-host", pid=9, started_at=1.0)


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> Iterator[PostgresStore]:
    with fresh_store(request) as store:
        yield store


def waiting_on_locks(conn: psycopg.Connection[Any], count: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        [(waiting,)] = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'").fetchall()
        if waiting >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"{count} sessions never waited for a lock")


def test_a_first_heartbeat_that_reads_a_renewal_reads_the_epoch_it_began(
        pg: PostgresStore) -> None:
    """The running beat's heartbeat (its claim lost: the store begins a new epoch in it)
    and a joining beat's first heartbeat both wait behind another session's lock on the
    epoch's row, the running beat's first; once it is released, the joining beat's answer
    shows the running beat renewed, and so the new epoch."""
    c = one_claim(pg, A)
    last = pg.heartbeat(A, TTL)
    BACKEND.corrupt_entry_field(pg, "e", "token", str(c.token - 1))  # an older copy's
    running, joining = BACKEND.reopen(pg), BACKEND.reopen(pg)
    answers: dict[str, Heartbeat] = {}
    holder = psycopg.connect(address(pg), autocommit=False)
    watcher = psycopg.connect(address(pg), autocommit=True)
    try:
        holder.execute(sql.SQL("SELECT 1 FROM {}.epoch FOR UPDATE").format(
            sql.Identifier(pg.schema)))
        ran = threading.Thread(target=lambda: answers.setdefault("running", running.heartbeat(
            A, TTL, written=[Written(c.entry, c.due, c.token)],
            continuity=Continuity(last.epoch, last.now, True))))
        ran.start()
        waiting_on_locks(watcher, 1)
        joined = threading.Thread(target=lambda: answers.setdefault(
            "joining", joining.heartbeat(JOINER, TTL)))
        joined.start()
        waiting_on_locks(watcher, 2)
        holder.rollback()
        ran.join(30)
        joined.join(30)
    finally:
        holder.close()
        watcher.close()
        running.close()
        joining.close()
    renewed, first = answers["running"], answers["joining"]
    assert renewed.went_back and renewed.epoch != last.epoch
    [seen] = [o.expires_at for o in first.owners if o.owner.id == A.id]
    [own] = [o.expires_at for o in renewed.owners if o.owner.id == A.id]
    assert seen == own  # (the joining beat read the renewal)
    assert first.epoch == renewed.epoch, "the renewal read without the epoch it began"
