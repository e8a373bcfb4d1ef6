"""Small helpers of the contract suite: owners, worker processes, and the common steps of a
run's life, written with the contract only."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import pytest

from beat_claims.enums import Origin, Overlap, Reason, RunState, StartVerdict
from beat_claims.runs import Owner, Run
from beat_claims.stores.base import (
    TOKENS_PER_MS,
    Check,
    CheckResult,
    CheckVerdict,
    Claim,
    ClaimPlan,
    ClaimResult,
    ClaimStatus,
    DefinitionWrite,
    Delivery,
    EntrySeed,
    EntryState,
    IndexWrite,
    LiveQuery,
    Store,
    StoreError,
    Unindexed,
    WorkerProcess,
    WriteStatus,
)

from ..faults import Proxy
from ..processes import wait_for

T = TypeVar("T")

#: An instant before anything any test records (a cutoff that reports nothing).
LONG_AGO = 0


def owner(n: int) -> Owner:
    return Owner(id=f"owner-{n}", host="contract-host", pid=1000 + n, started_at=1.0)


A, B, C = owner(1), owner(2), owner(3)
#: The owner whose heartbeat reads the store's clock for the tests.
CLOCK = Owner(id="contract-clock", host="contract-host", pid=999, started_at=1.0)


def now(store: Store) -> int:
    """The store's clock (ms)."""
    return store.heartbeat(CLOCK, 60).now


def clock_tokens(store: Store) -> int:
    """The lowest token a claim made from now on may hand out: the store's clock times
    TOKENS_PER_MS (tokens come from the clock, so that a store put back from an older copy
    hands none out twice)."""
    return now(store) * TOKENS_PER_MS


#: How far above the clock's tokens :func:`above_clock` is: 100 s of the clock.
ABOVE_CLOCK = 1_000_000


def above_clock(store: Store) -> int:
    """A token (a floor, a counter) above every token the clock gives for the next 100 s:
    claims counting on from it hand out exactly it + 1, + 2, ..., whatever the clock."""
    return tokens_above(now(store))


def tokens_above(instant: int) -> int:
    """:func:`above_clock` from a reading of the store's clock taken otherwise (an anchor:
    where a heartbeat would change what the test sees)."""
    return instant * TOKENS_PER_MS + ABOVE_CLOCK


def poll(predicate: Callable[[], T], timeout: float, what: str) -> T:
    """``predicate()`` once it is truthy; fail naming ``what`` after ``timeout`` seconds."""
    return wait_for(predicate, timeout, what, interval=0.001)  # type: ignore[no-any-return]


def after(store: Store, instant: int) -> int:
    """Wait until the store's clock is past ``instant``; return its reading."""
    return poll(lambda: (t if (t := now(store)) > instant else 0), 5,
                f"the store clock to pass {instant}")


def register(store: Store, *names: str) -> dict[str, EntryState]:
    return store.register([EntrySeed(name, f"every 1s ({name})") for name in names])


def entry(store: Store, name: str = "e") -> EntryState:
    return register(store, name)[name]


def plan(state: EntryState | None, *dues: int, entry: str = "e",
         skip: tuple[tuple[int, Reason], ...] = (), take_due: bool = True,
         token_floor: int = 0) -> ClaimPlan:
    return ClaimPlan(entry, state, tuple(dues), skip, take_due, token_floor)


def claim(store: Store, who: Owner, state: EntryState | None, *dues: int, entry: str = "e",
          skip: tuple[tuple[int, Reason], ...] = (), take_due: bool = True,
          token_floor: int = 0) -> ClaimResult:
    [result] = store.claim(who, [plan(state, *dues, entry=entry, skip=skip,
                                      take_due=take_due, token_floor=token_floor)])
    return result


def take(store: Store, who: Owner, entry: str = "e") -> tuple[Claim, ...]:
    """Claim the entry's runs that are due again (no new occurrence)."""
    result = claim(store, who, None, entry=entry)
    assert result.status is ClaimStatus.OK, result
    return result.taken


def claims(store: Store, who: Owner, *offsets: int, entry: str = "e") -> list[Claim]:
    """Register ``entry`` (if new) and claim its occurrences at anchor + each offset."""
    state = register(store, entry)[entry]
    result = claim(store, who, state, *(state.anchor + o for o in offsets), entry=entry)
    assert result.status is ClaimStatus.OK, result
    assert len(result.claims) == len(offsets), result
    return list(result.claims)


def one_claim(store: Store, who: Owner, offset: int = 1000, entry: str = "e") -> Claim:
    return claims(store, who, offset, entry=entry)[0]


def check(store: Store, who: Owner, c: Claim, task_id: str | None = None,
          skip: Reason | None = None, overlap: Overlap = Overlap.ALLOW) -> CheckResult:
    [result] = store.check(who, [Check(c, task_id or f"task-{c.entry}-{c.due}", skip,
                                       overlap)])
    return result


def send(store: Store, who: Owner, c: Claim, task_id: str | None = None) -> Claim:
    """Check, publish and mark sent, as a beat does."""
    result = check(store, who, c, task_id)
    assert result.verdict is CheckVerdict.SEND, result
    assert store.record_sent(who, [c]) == 1
    return c


def sending(store: Store, who: Owner, c: Claim) -> Claim:
    result = check(store, who, c)
    assert result.verdict is CheckVerdict.SEND, result
    return c


def runs(store: Store, entry: str = "e") -> dict[int, Run]:
    """The entry's runs by due instant."""
    return {r.due: r for r in store.history(entry)}


def run(store: Store, c: Claim | tuple[str, int]) -> Run:
    entry, due = (c.entry, c.due) if isinstance(c, Claim) else c
    found = runs(store, entry)
    assert due in found, f"no run of {entry} at {due}: {sorted(found)}"
    return found[due]


def state_of(store: Store, c: Claim) -> RunState:
    return run(store, c).state


def process(n: int, identity: str | None = None) -> WorkerProcess:
    return WorkerProcess(f"worker{n}@contract-host", 2000 + n,
                         f"boot-1:{100 + n}" if identity is None else identity)


def delivery(c: Claim, proc: WorkerProcess, retries: int = 0, task_id: str = "",
             takeover: WorkerProcess | None = None, token: int | None = None) -> Delivery:
    return Delivery(c.entry, c.due, c.token if token is None else token, proc, retries,
                    task_id, takeover)


def started(store: Store, c: Claim, proc: WorkerProcess, task_id: str = "") -> None:
    decision = store.start(delivery(c, proc, task_id=task_id))
    assert decision.verdict is StartVerdict.RUN, decision


def query(who: Owner, live: tuple[Owner, ...] = (), held_before: int = LONG_AGO,
          mine_before: int = LONG_AGO, dead_before: int = LONG_AGO,
          limit: int = 10_000) -> LiveQuery:
    return LiveQuery(who.id, frozenset(o.id for o in live), held_before, mine_before,
                     dead_before, limit)


def migrated_entry_takes_a_definition(store: Store, state: EntryState) -> None:
    """An entry registered (and claimed up to anchor + 1000) before its store was migrated
    to the layout with definitions: it keeps its anchor and checkpoint, has no definition,
    is given one (with a skip and a checkpoint), is in the change feed, and a prune keeps it
    (a live beat registered it)."""
    [record] = store.entries(["e"])
    assert (record.anchor, record.checkpoint) == (state.anchor, state.anchor + 1000)
    assert store.definitions() == [] and store.definitions(["e"]) == []
    cursor = store.changes(None).cursor
    [given] = store.write_definitions([DefinitionWrite(
        "e", '{"task": "t"}', 0, Origin.CONFIG, "beat", checkpoint=state.anchor + 2000,
        skip=((state.anchor + 2000, Reason.CHANGED),))])
    assert (given.status, given.version) == (WriteStatus.OK, 1)
    assert given.state is not None and given.state.anchor == state.anchor
    assert [d.name for d in store.changes(cursor).changed] == ["e"]
    assert runs(store)[state.anchor + 2000].reason is Reason.CHANGED
    store.heartbeat(A, 60)
    assert store.forget(["e"]) == []  # a live definition



def migrated_entry_is_indexed_by_the_rebuild_sweep(store: Store, state: EntryState) -> None:
    """An entry registered (and claimed up to anchor + 1000) before its store was migrated
    to the layout with the due index: it has no next_due (not due, but found by the
    rebuild sweep's pass), until the sweep indexes it; entries made since are indexed."""
    assert store.due(2 ** 52, 10) == []
    page = store.unindexed(10)
    assert (page.names, page.complete) == (("e",), True)
    assert store.index([IndexWrite("e", EntryState(state.anchor, state.anchor + 1000), 0,
                                   state.anchor + 2000)]) == [True]
    register(store, "f")
    assert [(d.name, d.next_due) for d in store.due(state.anchor + 2000, 10)] == [
        ("f", 0), ("e", state.anchor + 2000)]
    assert store.unindexed(10).names == ()


def rebuild_pass(store: Store, limit: int) -> list[Unindexed]:
    """The pages of a whole rebuild pass (:meth:`Store.unindexed` from the start until a
    page says the pass is complete), each of ``limit`` names at most."""
    pages: list[Unindexed] = []
    while not pages or not pages[-1].complete:
        assert len(pages) < 1000, pages[-3:]
        page = store.unindexed(limit, pages[-1].cursor if pages else "")
        assert len(page.names) <= limit, page
        pages.append(page)
    return pages


def a_claim_whose_reply_is_lost_wrote_its_next_due_once(
        store: Store, lossy: Store, proxy: Proxy, pattern: str, name: str = "e") -> None:
    """Through ``lossy`` (another client of ``store``, through ``proxy``), a claim with the
    entry's next due instant whose reply is lost (its request contains ``pattern``)
    raises, and the server ran it: the instant was written with the checkpoint; the claim
    asked again conflicts, and writes nothing."""
    state = register(store, name)[name]
    item = ClaimPlan(name, state, (state.anchor + 1000,), next_due=state.anchor + 2000)
    lossy.entries([name])  # connected before the fault
    proxy.drop_reply_to(pattern)
    with pytest.raises(StoreError):
        lossy.claim(A, [item])
    assert proxy.pending() == 0
    [again] = lossy.claim(A, [item])
    assert again.status is ClaimStatus.CONFLICT
    assert again.state is not None and again.state.checkpoint == state.anchor + 1000
    [d] = store.due(state.anchor + 2000, 10)
    assert (d.name, d.next_due, d.state) == (name, state.anchor + 2000, again.state)
    assert store.due(state.anchor + 1999, 10) == []


def a_definition_write_whose_reply_is_lost_is_written_once(
        store: Store, lossy: Store, proxy: Proxy, pattern: str) -> None:
    """Through ``lossy`` (another client of ``store``, through ``proxy``), a definition
    write whose reply is lost (its request contains ``pattern``) raises, and the server ran
    it; the same write again, with its change id, answers what it did and changes nothing;
    a write without a change id is found by its version (the same write again is a stale
    one), never written twice."""
    state = register(store, "e")["e"]
    cursor = store.changes(None).cursor
    item = DefinitionWrite("e", '{"task": "t"}', 0, Origin.API, "alice@ops", "change-1",
                           ((state.anchor + 1000, Reason.CHANGED),), state.anchor + 2000)
    lossy.entries()  # connected before the fault
    proxy.drop_reply_to(pattern)
    with pytest.raises(StoreError):
        lossy.write_definitions([item])
    assert proxy.pending() == 0
    history = runs(store)
    assert list(history) == [state.anchor + 1000]  # the server ran it
    [again] = lossy.write_definitions([item])
    assert (again.status, again.version) == (WriteStatus.OK, 1)
    assert again.state is not None and again.state.checkpoint == state.anchor + 2000
    [stored] = store.definitions(["e"])
    assert stored == again.current and runs(store) == history
    assert [d.name for d in store.changes(cursor).changed] == ["e"]
    proxy.drop_reply_to(pattern)
    plain = DefinitionWrite("e", '{"task": "u"}', 1, Origin.API, "bob@ops")
    with pytest.raises(StoreError):
        lossy.write_definitions([plain])
    [refused] = lossy.write_definitions([plain])
    assert (refused.status, refused.version) == (WriteStatus.CONFLICT, 2)
    assert refused.current is not None and refused.current.changed_by == "bob@ops"


def at_once(steps: Sequence[Callable[[], None]], closing: Sequence[Store] = ()) -> None:
    """Run ``steps`` in threads of their own at the same time, wait for them, then close
    ``closing`` (the clients they used)."""
    threads = [threading.Thread(target=step) for step in steps]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        for client in closing:
            client.close()
