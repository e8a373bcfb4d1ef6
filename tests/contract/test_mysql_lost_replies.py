"""MySQL only: the reply to a batch of writes and its COMMIT (one round trip: a chunk's
claims, checks, sent marks) or to a definition write's COMMIT is lost (a real TCP proxy in
front of the server throws it away after the server committed): the call fails as an
outage, what the server did was done once, and the same call again hands out no second
token and writes nothing twice."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest

from beat_claims.enums import RunState
from beat_claims.stores.base import (
    Check,
    CheckVerdict,
    Claim,
    ClaimPlan,
    ClaimStatus,
    SendAtOnce,
    Store,
    StoreError,
)
from beat_claims.stores.mysql import MySQLStore

from ..faults import proxy
from .backend_mysql import BACKEND as backend_mysql
from .backend_mysql import PORT
from .helpers import (
    A,
    a_claim_whose_reply_is_lost_wrote_its_next_due_once,
    a_definition_write_whose_reply_is_lost_is_written_once,
    register,
    runs,
)

#: The request of a chunk's writes: its multi-row statements, then the COMMIT, one text.
WRITES_AND_COMMIT = ";\nCOMMIT"


@pytest.fixture
def mysql_store(request: pytest.FixtureRequest) -> Iterator[MySQLStore]:
    with backend_mysql.open(request, 100) as store:
        yield cast(MySQLStore, store)


def _through(store: MySQLStore, port: int) -> MySQLStore:
    """Another client of the same tables, through the proxy at ``port``."""
    return MySQLStore({**store._params, "port": port}, store.prefix, store.history_limit,
                      timeout=2.0)


#: Each write whose reply is lost: what must hold, and its request's pattern.
LOST = {"a claim's writes and COMMIT": (a_claim_whose_reply_is_lost_wrote_its_next_due_once,
                                         WRITES_AND_COMMIT),
        "a definition write's COMMIT": (a_definition_write_whose_reply_is_lost_is_written_once,
                                        "COMMIT")}


@pytest.mark.parametrize("write", sorted(LOST))
def test_a_write_whose_reply_was_lost_is_written_once(mysql_store: MySQLStore,
                                                      write: str) -> None:
    holds, pattern = LOST[write]
    with proxy(PORT) as p:
        lossy = _through(mysql_store, p.port)
        try:
            holds(mysql_store, lossy, p, pattern)
        finally:
            lossy.close()


def test_a_claim_checked_at_once_whose_reply_was_lost_holds_one_token(
        mysql_store: Store) -> None:
    """The beat's claim, checked before publish in the same call: its reply lost after the
    server committed. The run is recorded once, being sent under one token; the same plan
    again conflicts (no second token), and the holder's check of that token still says
    send (the beat that finds its claim in the store's records may send it)."""
    state = register(mysql_store, "e")["e"]
    plan = ClaimPlan("e", state, (state.anchor + 1000,), send=SendAtOnce(("t-1",)))
    with proxy(PORT) as p:
        lossy = _through(cast(MySQLStore, mysql_store), p.port)
        try:
            lossy.entries(["e"])  # (connected before the fault)
            p.drop_reply_to(WRITES_AND_COMMIT)
            with pytest.raises(StoreError):
                lossy.claim(A, [plan])
            assert p.pending() == 0
            [again] = lossy.claim(A, [plan])
        finally:
            lossy.close()
    assert again.status is ClaimStatus.CONFLICT and not again.claims, again
    [recorded] = runs(mysql_store).values()
    assert (recorded.due, recorded.state, recorded.task_id) == (
        state.anchor + 1000, RunState.SENDING, "t-1"), recorded
    assert recorded.token is not None and again.state is not None
    assert again.state.token == recorded.token, (again.state, recorded)
    [checked] = mysql_store.check(A, [_check_of(recorded.token, state.anchor + 1000)])
    assert checked.verdict is CheckVerdict.SEND, checked


def _check_of(token: int, due: int) -> Check:
    return Check(Claim("e", due, token), "t-1")
