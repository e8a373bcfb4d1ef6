"""SQLite only: several processes of one host on one file. Each opens the file itself, as a
beat, a worker or an operator does; every transition is one transaction, so races between
them are decided by the file's writer lock, never by luck."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from beat_claims.enums import RunState, StartVerdict
from beat_claims.stores.base import Check, CheckVerdict, Claim, ClaimPlan, ClaimStatus
from beat_claims.stores.sqlite import SQLiteStore

from .helpers import A, above_clock, delivery, owner, process, register, runs, send

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/claims.db"


@pytest.fixture
def store(url: str) -> Iterator[SQLiteStore]:
    s = SQLiteStore.from_url(url)
    yield s
    s.close()


def _fork() -> Any:
    return multiprocessing.get_context("fork")


def _race_one_occurrence(url: str, state: Any, due: int, floor: int, barrier: Any, out: Any,
                         n: int) -> None:
    """A beat of its own: opens the file, claims the occurrence, and sends it if it won."""
    mine = SQLiteStore.from_url(url)
    who = owner(20 + n)
    barrier.wait(10)
    [result] = mine.claim(who, [ClaimPlan("e", state, (due,), token_floor=floor)])
    tokens = [c.token for c in result.claims]
    verdicts = [a.verdict.value for a in mine.check(who, [Check(c, f"t{n}")
                                                          for c in result.claims])]
    sent = mine.record_sent(who, result.claims)
    out.put((who.id, result.status.value, tokens, verdicts, sent))


def test_many_processes_claim_one_occurrence_and_exactly_one_sends_it(
        store: SQLiteStore, url: str) -> None:
    state = register(store, "e")["e"]
    due = state.anchor + 1000
    floor = above_clock(store)  # (a second token would show as floor + 2)
    ctx, n = _fork(), 8
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race_one_occurrence,
                         args=(url, state, due, floor, barrier, out, i)) for i in range(n)]
    for p in procs:
        p.start()
    try:
        answers = [out.get(timeout=30) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
    assert [p.exitcode for p in procs] == [0] * n
    winners = [a for a in answers if a[2]]
    assert len(winners) == 1, answers
    assert winners[0][2:] == ([floor + 1], ["send"], 1)
    assert {a[1] for a in answers if not a[2]} == {"conflict"}
    [r] = store.history("e")
    assert (r.due, r.token, r.state, r.owner) == (due, floor + 1, RunState.SENT,
                                                  winners[0][0])


def _claim_rounds(url: str, rounds: int, floor: int, barrier: Any, out: Any, n: int
                  ) -> None:
    """A beat that claims the entry's next occurrence ``rounds`` times, retrying with the
    store's state whenever another beat moved the checkpoint first."""
    mine = SQLiteStore.from_url(url)
    who = owner(40 + n)
    won: list[tuple[int, int]] = []
    barrier.wait(10)
    state = None
    for _ in range(rounds):
        for _attempt in range(1000):
            if state is None:
                state = register(mine, "e")["e"]
            due = (state.checkpoint or state.anchor) + 1000
            [result] = mine.claim(who, [ClaimPlan("e", state, (due,), token_floor=floor)])
            state = result.state
            if result.status is ClaimStatus.OK and result.claims:
                won += [(c.due, c.token) for c in result.claims]
                break
    out.put(won)


def test_claims_racing_from_many_processes_hand_out_each_token_and_occurrence_once(
        store: SQLiteStore, url: str) -> None:
    """The checkpoint's compare-and-set and the token counter under contention: no claim
    is lost, no token or occurrence is handed out twice."""
    register(store, "e")
    # (every claim counts on from the same floor: the counter alone makes the tokens)
    floor = above_clock(store)
    ctx, n, rounds = _fork(), 4, 15
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_claim_rounds, args=(url, rounds, floor, barrier, out, i))
             for i in range(n)]
    for p in procs:
        p.start()
    try:
        won = [pair for _ in procs for pair in out.get(timeout=60)]
    finally:
        for p in procs:
            p.join(10)
    assert [p.exitcode for p in procs] == [0] * n
    assert len(won) == n * rounds
    assert sorted(token for _, token in won) == list(range(floor + 1, floor + n * rounds + 1))
    assert len({due for due, _ in won}) == n * rounds
    recorded = runs(store)
    assert {(d, r.token) for d, r in recorded.items()} == set(won)
    assert store.entries(["e"])[0].token == floor + n * rounds


def _run(code: str, url: str) -> str:
    """A fresh interpreter (nothing inherited from this one) running ``code`` with the
    store opened from ``url`` as ``store``."""
    prelude = textwrap.dedent(f"""
        from beat_claims.stores.sqlite import SQLiteStore
        from beat_claims.stores.base import *
        from beat_claims.runs import Owner
        store = SQLiteStore.from_url({url!r})
    """)
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_another_process_sees_the_writes_of_the_first(store: SQLiteStore, url: str) -> None:
    # Another process (a beat) registers, claims, checks and sends.
    printed = _run("""
        beat = Owner("other-beat", "host", 1, 1.0)
        [state] = store.register([EntrySeed("e", "every 1s")]).values()
        [result] = store.claim(beat, [ClaimPlan("e", state, (state.anchor + 1000,))])
        [c] = result.claims
        [answer] = store.check(beat, [Check(c, "task-e")])
        assert answer.verdict is CheckVerdict.SEND, answer
        assert store.record_sent(beat, [c]) == 1
        print(c.due, c.token)
    """, url)
    due, token = map(int, printed.split())
    # This process sees it: the entry, the run, and a sent run open for the sweeps.
    [r] = store.history("e")
    assert (r.due, r.token, r.state, r.owner, r.task_id) == (
        due, token, RunState.SENT, "other-beat", "task-e")
    assert [(o.entry, o.due) for o in store.open_runs(before=due + 10**9)] == [("e", due)]
    [taken] = store.claim(A, [ClaimPlan("e", None)])
    assert taken.status is ClaimStatus.OK and taken.taken == ()  # it is not due: it is sent
    # This process starts the run (a worker); a third one sees the start and is fenced.
    first = Claim("e", due, token)
    assert store.start(delivery(first, process(1), task_id="task-e")).verdict is (
        StartVerdict.RUN)
    printed = _run(f"""
        d = Delivery("e", {due}, {token}, WorkerProcess("worker9@host", 9, "boot:9"))
        print(store.start(d).verdict.value, store.lookup_task("task-e").token)
    """, url)
    assert printed == f"busy {token}"


def _use_the_inherited_store(store: SQLiteStore, out: Any) -> None:
    state = register(store, "e")["e"]
    [result] = store.claim(owner(60), [ClaimPlan("e", state, (state.anchor + 2000,))])
    send(store, owner(60), result.claims[0])
    out.put(sorted(runs(store)))


def test_a_store_used_before_a_fork_works_in_the_parent_and_the_child(
        store: SQLiteStore) -> None:
    """Its connection is closed before the fork (SQLite's locks are per process) and each
    process opens its own."""
    state = register(store, "e")["e"]
    first = send(store, A, store.claim(A, [ClaimPlan("e", state, (state.anchor + 1000,))])[0]
                 .claims[0])
    ctx = _fork()
    out = ctx.Queue()
    child = ctx.Process(target=_use_the_inherited_store, args=(store, out))
    child.start()
    seen = out.get(timeout=30)
    child.join(10)
    assert child.exitcode == 0
    assert seen == [first.due, state.anchor + 2000]
    assert sorted(runs(store)) == seen  # the parent goes on, and sees the child's run
    [answer] = store.check(A, [Check(first, "t")])
    assert answer.verdict is CheckVerdict.REFUSED  # already sent: not sent twice
