"""PostgreSQL only: many beat processes at once on one database. Every transition locks the
entries it names in one order, so batches naming the same entries in any order never
deadlock, and each occurrence is claimed, and sent, by exactly one of them."""

from __future__ import annotations

import multiprocessing
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from beat_claims.stores.base import Check, CheckVerdict, ClaimPlan, ClaimStatus, EntryState
from beat_claims.stores.postgres import PostgresStore

from .backend_postgres import address, fresh_store
from .helpers import above_clock, owner, register

PROCESSES = 8
ENTRIES = 200


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> Iterator[PostgresStore]:
    with fresh_store(request) as store:
        yield store


def _beat(url: str, prefix: str, states: dict[str, EntryState], floor: int, barrier: Any,
          out: Any, n: int) -> None:
    """One beat: claims the next occurrence of every entry, in an order of its own, in one
    call; then checks and marks sent what it won."""
    try:
        store = PostgresStore.from_url(url, prefix)
        who = owner(100 + n)
        plans = [ClaimPlan(name, state, (state.anchor + 1000,), token_floor=floor)
                 for name, state in states.items()]
        random.Random(n).shuffle(plans)
        barrier.wait(30)
        results = store.claim(who, plans)
        won = [c for r in results for c in r.claims]
        checks = store.check(who, [Check(c, f"task-{c.entry}") for c in won])
        sent = store.record_sent(who, [r.claim for r in checks
                                       if r.verdict is CheckVerdict.SEND])
        out.put((n, [(r.entry, r.status.value, [c.token for c in r.claims])
                     for r in results], [r.claim.entry for r in checks
                                         if r.verdict is CheckVerdict.SEND], sent))
    except Exception as exc:  # reported to the parent, which fails the test
        out.put((n, repr(exc), [], 0))


def test_beats_claiming_the_same_entries_in_any_order_never_deadlock_and_one_wins_each(
        pg: PostgresStore) -> None:
    names = [f"entry-{i:03d}" for i in range(ENTRIES)]
    states = register(pg, *names)
    floor = above_clock(pg)  # (a second token of an entry would show as floor + 2)
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_beat,
                         args=(address(pg), pg.prefix, states, floor, barrier, out, n))
             for n in range(PROCESSES)]
    for p in procs:
        p.start()
    try:
        answers = [out.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
    errors = [answer for answer in answers if isinstance(answer[1], str)]
    assert errors == []
    wins: Counter[str] = Counter()
    sends: Counter[str] = Counter()
    for _, results, sent_entries, sent in answers:
        assert {status for _, status, _ in results} <= {ClaimStatus.OK.value,
                                                         ClaimStatus.CONFLICT.value}
        for entry, _, tokens in results:
            assert tokens in ([], [floor + 1])
            wins[entry] += len(tokens)
        sends.update(sent_entries)
        assert sent == len(sent_entries)
    assert wins == Counter({name: 1 for name in names})
    assert sends == Counter({name: 1 for name in names})
    assert {r.name: r.token for r in pg.entries()} == {name: floor + 1 for name in names}
