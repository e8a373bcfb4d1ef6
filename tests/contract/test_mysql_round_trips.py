"""MySQL only: a chunk of claims, checks or outcomes reads its rows at once and writes them
in a few multi-row statements (beat_claims/stores/mysql_rows.py), so a burst costs a
bounded number of round trips, not a few per run; an item whose record cannot be read
sends its chunk the slow way (a savepoint per item), and the others get their answers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from beat_claims.enums import RunState
from beat_claims.stores import base
from beat_claims.stores.base import Check, CheckVerdict, ClaimPlan, EntrySeed, Store

from .backend import Backend
from .backend_mysql import BACKEND as backend_mysql
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
    """Four calls of two chunks each, some 10 statements a chunk: with histories full
    (a trim each claim) too."""
    trips = _burst(mysql_store, backend, 5)
    assert all(n <= 4 * 2 * 14 for n in trips), trips


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
