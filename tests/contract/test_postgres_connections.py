"""PostgreSQL only: how the store talks to its server. A connection that dies in the middle
of a call, a statement that waits past the timeout and a server that cannot be reached are
outages (StoreError), never a crash; the next call connects again. A connection to another
server than the last heartbeat read is refused until a heartbeat reads its epoch."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from beat_claims.enums import StartVerdict
from beat_claims.stores.base import ClaimStatus, StoreConfigurationError, StoreError
from beat_claims.stores.postgres import PostgresStore

from ..faults import proxy
from ..processes import wait_for
from .backend_postgres import BACKEND, PORT, address, admin, fresh_store
from .helpers import A, above_clock, claim, delivery, now, process, query, register

TTL = 10.0


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> Iterator[PostgresStore]:
    with fresh_store(request) as store:
        yield store


def _backend_waiting_on_a_lock(store: PostgresStore) -> int:
    rows = admin().execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = %s AND wait_event_type = 'Lock'",
        [f"beat-claims ({store.schema})"]).fetchall()
    return int(rows[0][0]) if rows else 0


def _in_thread(call: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _entry_locked(store: PostgresStore, name: str) -> psycopg.Connection[Any]:
    """Another session holding the entry's row, as a long transition would."""
    other = psycopg.connect(address(store))
    other.execute(f'SELECT 1 FROM "{store.schema}".entries WHERE name = %s FOR UPDATE', [name])
    return other


def test_a_connection_killed_in_the_middle_of_a_call_is_an_outage_and_the_next_reconnects(
        pg: PostgresStore) -> None:
    state = register(pg, "e")["e"]
    floor = above_clock(pg)  # (tokens that count on from it show a counter that moved)
    other = _entry_locked(pg, "e")
    try:
        thread, outcome = _in_thread(lambda: claim(pg, A, state, state.anchor + 1000,
                                                   token_floor=floor))
        pid = wait_for(lambda: _backend_waiting_on_a_lock(pg), 10, "the claim to wait")
        admin().execute("SELECT pg_terminate_backend(%s)", [pid])
        thread.join(10)
    finally:
        other.rollback()
        other.close()
    assert isinstance(outcome.get("error"), StoreError), outcome
    # Its transaction died with the connection: nothing was written, and the next call
    # (a new connection) claims as if it had never been made.
    result = claim(pg, A, state, state.anchor + 1000, token_floor=floor)
    assert result.status is ClaimStatus.OK and [c.token for c in result.claims] == [floor + 1]
    assert [r.token for r in pg.history("e")] == [floor + 1]


def test_a_statement_waiting_past_the_timeout_is_an_outage_and_writes_nothing(
        pg: PostgresStore) -> None:
    store = PostgresStore.from_url(address(pg), pg.prefix, timeout=0.5)
    try:
        state = register(store, "e")["e"]
        other = _entry_locked(pg, "e")
        try:
            started = time.monotonic()
            with pytest.raises(StoreError):
                claim(store, A, state, state.anchor + 1000)
            assert time.monotonic() - started < 3
        finally:
            other.rollback()
            other.close()
        assert store.history("e") == []  # the same connection goes on
        assert claim(store, A, state, state.anchor + 1000).status is ClaimStatus.OK
    finally:
        store.close()


def test_a_server_that_cannot_be_reached_is_an_outage_not_an_error_at_start() -> None:
    store = PostgresStore.from_url("postgresql://postgres@127.0.0.1:1/nothing", "bc-down",
                                   timeout=1.0)
    started = time.monotonic()
    with pytest.raises(StoreError):
        store.heartbeat(A, TTL)
    with pytest.raises(StoreError):
        store.entries()
    assert time.monotonic() - started < 10


def test_a_reconnection_to_another_server_is_refused_until_a_heartbeat_reads_its_epoch(
        pg: PostgresStore, request: pytest.FixtureRequest) -> None:
    first = pg.heartbeat(A, TTL)
    state = register(pg, "e")["e"]
    BACKEND.restart(pg)  # every session ends; the data comes back from a backup
    refused = 0
    for _ in range(2):  # the first call finds its connection gone
        try:
            claim(pg, A, state, state.anchor + 1000)
        except StoreError as exc:
            refused += "heartbeat" in str(exc)
    assert refused == 1
    hb = pg.heartbeat(A, TTL)
    assert hb.epoch != first.epoch and hb.store_id == first.store_id
    assert pg.entries(["e"])[0].checkpoint is None  # nothing was claimed meanwhile
    assert claim(pg, A, state, state.anchor + 1000).status is ClaimStatus.OK


def test_a_worker_store_goes_on_after_the_schema_was_dropped(pg: PostgresStore) -> None:
    """A worker never heartbeats: it is not refused, and finds the store empty."""
    state = register(pg, "e")["e"]
    [c] = claim(pg, A, state, state.anchor + 1000).claims
    worker = PostgresStore.from_url(address(pg), pg.prefix)
    assert worker.start(delivery(c, process(1))).verdict is StartVerdict.REFUSED  # not sent
    BACKEND.wipe(pg)
    assert worker.start(delivery(c, process(1))).verdict is StartVerdict.UNTRACKED
    assert worker.lookup_task("t") is None
    worker.close()


def test_threads_share_one_store(pg: PostgresStore) -> None:
    names = [f"e{i}" for i in range(8)]
    states = register(pg, *names)
    floor = above_clock(pg)  # (each entry's counter counts on from it: every claim shows)
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            for i in range(20):
                pg.heartbeat(A, TTL)
                state = register(pg, name)[name]
                result = claim(pg, A, state, state.anchor + 1000 * (i + 1), entry=name,
                               token_floor=floor)
                assert result.status is ClaimStatus.OK, result
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(name,)) for name in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert {r.name: r.token for r in pg.entries()} == {name: floor + 20 for name in states}


def test_a_server_that_never_answers_is_an_outage_within_the_timeout(
        pg: PostgresStore) -> None:
    """The server got the query and answered, but nothing comes back (a proxy that
    stalls): no server-side timeout can help, the client's deadline does."""
    with proxy(int(PORT)) as p:
        url = address(pg).replace(f":{PORT}/", f":{p.port}/")
        store = PostgresStore.from_url(url, pg.prefix, timeout=1.0)
        try:
            assert store.heartbeat(A, TTL).epoch
            p.delay = 30.0
            started = time.monotonic()
            with pytest.raises(StoreError):
                store.heartbeat(A, TTL)
            assert time.monotonic() - started < 5
            p.delay = 0.0
            assert store.heartbeat(A, TTL).epoch  # a new connection
        finally:
            store.close()


def test_a_claim_whose_reply_was_lost_is_found_again_and_not_claimed_twice(
        pg: PostgresStore) -> None:
    state = register(pg, "e")["e"]
    floor = above_clock(pg)  # (a second token would show above floor + 1)
    with proxy(int(PORT)) as p:
        url = address(pg).replace(f":{PORT}/", f":{p.port}/")
        store = PostgresStore.from_url(url, pg.prefix)
        try:
            store.entries()  # connected (and the layout checked) before the fault
            p.drop_reply_to(f'"{pg.schema}".claim(')
            with pytest.raises(StoreError):
                claim(store, A, state, state.anchor + 1000, token_floor=floor)
            assert p.pending() == 0
            # The server acted: the claim is in the records, and asking again with the same
            # plan hands out no second token.
            again = claim(store, A, state, state.anchor + 1000, token_floor=floor)
            assert again.status is ClaimStatus.CONFLICT and again.state is not None
            assert again.state.token == floor + 1
            [held] = store.live_runs(query(A, live=(A,), mine_before=now(store) + 1)).held
            assert (held.entry, held.token, held.owner) == ("e", floor + 1, A.id)
        finally:
            store.close()


@pytest.mark.parametrize(("url", "why"), [
    ("postgresql://postgres@127.0.0.1:{port}/no_such_database_here", "does not exist"),
    ("postgresql://no_such_role_here@127.0.0.1:{port}/postgres", "does not exist"),
    ("postgresql://postgres@no-such-host.invalid:{port}/postgres", "resolve"),
])
def test_credentials_refused_and_hosts_that_do_not_exist_are_configuration_errors(
        url: str, why: str) -> None:
    store = PostgresStore.from_url(url.format(port=PORT), "bc-refused")
    with pytest.raises(StoreConfigurationError) as refused:
        store.heartbeat(A, TTL)
    assert "beat_claims_url" in str(refused.value) and why in str(refused.value)
