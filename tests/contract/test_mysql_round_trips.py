"""MySQL only: a chunk of claims, checks or outcomes reads its rows at once and writes them
in a few multi-row statements (beat_claims/stores/mysql_rows.py), sent in two batches (the
reads with the clock, the writes with the COMMIT), so a burst costs a bounded number of
round trips, not a few per run; an item whose record cannot be read sends its chunk the
slow way (a savepoint per item), and the others get their answers. None of them waits on
the store's own rows (the meta table) that heartbeats and registrations lock. Round trips
are counted by the store's own counter (``MySQLStore.round_trips``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest

from beat_claims.enums import RunState
from beat_claims.stores import base
from beat_claims.stores.base import (
    Check,
    CheckVerdict,
    ClaimPlan,
    EntrySeed,
    SendAtOnce,
    Store,
)
from beat_claims.stores.mysql import MySQLStore

from .backend import Backend
from .backend_mysql import BACKEND as backend_mysql
from .backend_mysql import admin as backend_mysql_admin
from .helpers import A, runs

N = 600  # more than a chunk (500): two transactions


@pytest.fixture
def backend() -> Backend:
    return backend_mysql


@pytest.fixture
def mysql_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A fresh MySQL store whose history keeps 3 runs (so that claims trim)."""
    with backend_mysql.open(request, 3) as store:
        yield store


def _burst(store: Store, backend: Backend, rounds: int) -> list[int]:
    """``rounds`` bursts of N entries due at once (claim, check, sent, done): the round
    trips of each burst."""
    states = store.register([EntrySeed(f"e{i:04d}") for i in range(N)])
    out = []
    for k in range(1, rounds + 1):
        trips = backend.round_trips(store)
        results = store.claim(A, [ClaimPlan(name, state, (state.anchor + 1000 * k,))
                                  for name, state in states.items()])
        assert {r.status for r in results} == {base.ClaimStatus.OK}, results[:3]
        claimed = [c for r in results for c in r.claims]
        assert len(claimed) == N
        checked = store.check(A, [Check(c, f"t-{c.entry}-{c.due}") for c in claimed])
        assert {c.verdict for c in checked} == {CheckVerdict.SEND}
        assert store.record_sent(A, claimed) == N
        assert store.finish([base.Outcome(c.entry, c.due, c.token, RunState.DONE)
                             for c in claimed]) == [True] * N
        out.append(trips())
        states = {r.entry: r.state for r in results}
    return out


def test_a_burst_costs_a_bounded_number_of_round_trips_whatever_its_size(
        mysql_store: Store, backend: Backend) -> None:
    """Four calls of two chunks each, two round trips a chunk (the reads, the writes with
    the COMMIT), a third for a claim that trims full histories (from the fourth burst)."""
    trips = _burst(mysql_store, backend, 5)
    assert trips[:3] == [4 * 2 * 2] * 3, trips
    assert all(n <= 4 * 2 * 2 + 2 for n in trips), trips


def _sent_at_once(store: Store, states: dict[str, base.EntryState], k: int
                  ) -> tuple[list[base.ClaimResult], int]:
    """The beat's burst of ``states``' entries, as its sender makes it: a claim checked
    before publish in the same call, then the sent marks; the round trips of both."""
    trips = backend_mysql.round_trips(store)
    results = store.claim(A, [ClaimPlan(name, state, (state.anchor + 1000 * k,),
                                        send=SendAtOnce((f"t-{name}-{k}",)))
                              for name, state in states.items()])
    claimed = [c for r in results for c in r.claims]
    assert [c.verdict for r in results for c in r.checked] == [CheckVerdict.SEND] * len(
        states), results[:3]
    assert store.record_sent(A, claimed) == len(states)
    return results, trips()


def test_a_chunk_claimed_checked_and_marked_sent_costs_four_round_trips(
        mysql_store: Store) -> None:
    """The beat's burst, 100 entries a call: the claim (checked before publish with it)
    is two round trips, the sent marks two."""
    states = mysql_store.register([EntrySeed(f"e{i:03d}") for i in range(100)])
    for k in (1, 2, 3):
        results, trips = _sent_at_once(mysql_store, states, k)
        assert trips == 4, (k, trips)
        states = {r.entry: r.state for r in results}


def test_a_burst_never_waits_on_the_rows_a_heartbeat_locks(request: pytest.FixtureRequest
                                                           ) -> None:
    """Heartbeats, registrations and definition writes lock the store's own rows (the
    epoch, the anchoring instant, the change log's marks: the meta table); claims, their
    checks and sent marks never read them, so a beat's burst is not held behind another
    beat's heartbeat (nor are two beats' bursts behind each other)."""
    with backend_mysql.open(request, 3) as opened:
        store = cast(MySQLStore, opened)
        states = store.register([EntrySeed(f"e{i:03d}") for i in range(10)])
        quick = MySQLStore(store._params, store.prefix, 3, timeout=1.0)
        assert quick.now() > 0  # (its session set up: the tables checked, once)
        other = backend_mysql_admin()
        try:
            with other.cursor() as cur:
                cur.execute("BEGIN")
                cur.execute(f"SELECT `key`, value FROM {store.tables.meta} FOR UPDATE")
            _sent_at_once(quick, states, 1)
        finally:
            other.rollback()
            quick.close()


def test_an_item_that_fails_is_answered_alone_and_the_others_are_written_once(
        mysql_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """An item whose transition raises (as on a record the code cannot handle) is rolled
    back alone: the chunk is run again with a savepoint per item."""
    states = mysql_store.register([EntrySeed(f"e{i}") for i in range(5)])
    results = mysql_store.claim(A, [ClaimPlan(name, state, (state.anchor + 1000,))
                                    for name, state in states.items()])
    claimed = [c for r in results for c in r.claims]
    real = mysql_store._check_one  # type: ignore[attr-defined]

    def failing(db: Any, now: int, owner: str, item: Check) -> Any:
        result = real(db, now, owner, item)  # (its writes are rolled back with it)
        if item.claim.entry == "e2":
            raise ValueError("a record this code cannot handle")
        return result

    monkeypatch.setattr(mysql_store, "_check_one", failing)
    checked = mysql_store.check(A, [Check(c, f"t-{c.entry}") for c in claimed])
    assert [c.verdict for c in checked] == [CheckVerdict.SEND, CheckVerdict.SEND,
                                            CheckVerdict.REFUSED, CheckVerdict.SEND,
                                            CheckVerdict.SEND], checked
    states_now = {name: runs(mysql_store, name)[c.due].state
                  for name, c in zip(states, claimed)}
    assert states_now == {"e0": RunState.SENDING, "e1": RunState.SENDING,
                          "e2": RunState.CLAIMED, "e3": RunState.SENDING,
                          "e4": RunState.SENDING}, states_now
