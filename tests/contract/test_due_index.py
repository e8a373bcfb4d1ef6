"""The due index: every entry's next due instant, written in the same atomic step as what
it follows from (a claim whose compare-and-set on the checkpoint passed, a definition
write, a sweep's conditional index write), read in (next_due, name) order a page at a
time; entries with no next_due at all (a store of the layout before the index) are found
by a rebuild sweep's pass."""

from __future__ import annotations

import pytest

from beat_claims.enums import Origin, Reason
from beat_claims.stores.base import (
    DUE_AT_ONCE,
    MAX_PAGE,
    NOT_DUE,
    ClaimPlan,
    ClaimStatus,
    DefinitionWrite,
    DueAhead,
    DueEntry,
    EntryRecord,
    EntryState,
    IndexWrite,
    Store,
    StoredDefinition,
    WriteStatus,
    rebuild_page,
)

from .backend import Backend
from .helpers import A, B, now, rebuild_pass, register, runs

#: Far enough ahead that nothing the tests index is due before it unless they say so.
LATER = 10 ** 6


def due_names(store: Store, before: int, limit: int = MAX_PAGE) -> list[tuple[int, str]]:
    return [(d.next_due, d.name) for d in store.due(before, limit)]


def indexed(store: Store, name: str, before: int = 2 ** 52) -> DueEntry | None:
    """The entry as the index holds it (None: not due before ``before``, or not indexed)."""
    found = [d for d in every_due(store, before) if d.name == name]
    return found[0] if found else None


def every_due(store: Store, before: int, limit: int = 7) -> list[DueEntry]:
    """Every indexed entry due at or before ``before``, read page by page."""
    out: list[DueEntry] = []
    after = None
    while True:
        page = store.due(before, limit, after)
        assert len(page) <= limit, page
        out += page
        if len(page) < limit:
            return out
        after = (page[-1].next_due, page[-1].name)


def define(store: Store, name: str, version: int = 0, next_due: int | None = None,
           text: str | None = '{"task": "t"}', change_id: str = "") -> WriteStatus:
    [result] = store.write_definitions([DefinitionWrite(
        name, text, version, Origin.API, "ops", change_id, next_due=next_due)])
    return result.status


# -- writers ------------------------------------------------------------------------------
def test_a_new_entry_is_indexed_due_at_once_with_its_state(store: Store) -> None:
    state = register(store, "e")["e"]
    [d] = store.due(now(store), 10)
    assert d == DueEntry("e", DUE_AT_ONCE, state, 0)
    assert store.unindexed(10).names == ()


def test_a_claim_writes_next_due_with_the_checkpoint_it_moves(store: Store) -> None:
    state = register(store, "e")["e"]
    a = state.anchor
    [r] = store.claim(A, [ClaimPlan("e", state, (a + 1000,), ((a + 500, Reason.CATCH_UP),),
                                    next_due=a + 2000)])
    assert r.status is ClaimStatus.OK
    assert due_names(store, a + 1999) == []
    [d] = store.due(a + 2000, 10)
    assert (d.next_due, d.name) == (a + 2000, "e")
    assert d.state == EntryState(a, a + 1000, r.state.token if r.state else -1)


def test_a_conflicting_claim_writes_nothing_to_the_index(store: Store) -> None:
    state = register(store, "e")["e"]
    a = state.anchor
    store.claim(A, [ClaimPlan("e", state, (a + 1000,), next_due=a + 2000)])
    [stale] = store.claim(B, [ClaimPlan("e", state, (a + 1000,), next_due=a + 9000)])
    assert stale.status is ClaimStatus.CONFLICT
    assert indexed(store, "e") is not None and indexed(store, "e").next_due == a + 2000  # type: ignore[union-attr]


def test_a_claim_without_next_due_leaves_the_index_where_it_was(store: Store) -> None:
    state = register(store, "e")["e"]
    a = state.anchor
    [r] = store.claim(A, [ClaimPlan("e", state, (a + 1000,), next_due=a + 2000)])
    store.claim(A, [ClaimPlan("e", r.state, (a + 2000,))])  # a writer that did not compute it
    d = indexed(store, "e")
    # Earlier than truth (checkpoint a + 2000): a reader computes and finds it claimed.
    assert d is not None and d.next_due == a + 2000 and d.state is not None
    assert d.state.checkpoint == a + 2000


def test_a_claim_computed_from_another_definition_version_leaves_the_index(
        store: Store) -> None:
    assert define(store, "e", 0, next_due=LATER) is WriteStatus.OK  # version 1
    [state] = [d.state for d in every_due(store, LATER) if d.name == "e"]
    assert state is not None
    a = state.anchor
    [r] = store.claim(A, [ClaimPlan("e", state, (a + 1000,), next_due=a + 2000, version=0)])
    assert r.status is ClaimStatus.OK  # the claim stands; its next_due is not written
    assert indexed(store, "e").next_due == LATER  # type: ignore[union-attr]
    [r] = store.claim(A, [ClaimPlan("e", r.state, (a + 2000,), next_due=a + 3000,
                                    version=1)])
    assert indexed(store, "e").next_due == a + 3000  # type: ignore[union-attr]


def test_a_claim_with_no_occurrence_left_takes_the_entry_out_of_the_index(
        store: Store) -> None:
    state = register(store, "e")["e"]
    store.claim(A, [ClaimPlan("e", state, (state.anchor + 1000,), next_due=NOT_DUE)])
    assert indexed(store, "e") is None
    assert store.unindexed(10).names == ()  # not due, which is not unindexed


def test_definition_writes_index_the_entry_and_a_delete_takes_it_out(store: Store) -> None:
    assert define(store, "e", 0, next_due=5000) is WriteStatus.OK
    assert [(d.name, d.next_due, d.version) for d in store.due(5000, 10)] == [("e", 5000, 1)]
    # Written without next_due: the writer does not know it, so it is due at once.
    assert define(store, "e", 1, text='{"task": "u"}') is WriteStatus.OK
    assert [(d.name, d.next_due, d.version) for d in store.due(0, 10)] == [
        ("e", DUE_AT_ONCE, 2)]
    # Disabled (the caller says it is not due at all).
    assert define(store, "e", 2, next_due=NOT_DUE, text='{"enabled": false}') is WriteStatus.OK
    assert indexed(store, "e") is None
    assert define(store, "e", 3, next_due=7000) is WriteStatus.OK
    assert indexed(store, "e").next_due == 7000  # type: ignore[union-attr]
    # A write that conflicts writes nothing; a delete takes it out whatever it says.
    assert define(store, "e", 1, next_due=1) is WriteStatus.CONFLICT
    assert indexed(store, "e").next_due == 7000  # type: ignore[union-attr]
    assert define(store, "e", 4, next_due=1, text=None) is WriteStatus.OK
    assert indexed(store, "e") is None
    assert store.unindexed(10).names == ()


def test_a_pruned_entry_leaves_the_index(store: Store) -> None:
    register(store, "e", "f")
    assert store.forget(["e"]) == ["e"]
    assert [d.name for d in store.due(now(store), 10)] == ["f"]


def test_a_refused_next_due_writes_nothing(store: Store) -> None:
    state = register(store, "e")["e"]
    with pytest.raises(ValueError, match="next_due"):
        store.claim(A, [ClaimPlan("e", state, (state.anchor + 1000,), next_due=-5)])
    with pytest.raises(ValueError, match="next_due"):
        store.write_definitions([DefinitionWrite("e", "{}", 0, Origin.API, "ops",
                                                 next_due=-2)])
    with pytest.raises(ValueError, match="next_due"):
        store.index([IndexWrite("e", state, 0, -3)])
    assert store.entries(["e"])[0].checkpoint is None
    assert store.definitions(["e"]) == []


# -- readers ------------------------------------------------------------------------------
#: Names whose code point order differs from other orders (case, accents, digits).
NAMES = ["b", "a", "Z", "z", "é", "a1", "a10", "a2", "ä", "A", "_", "e.x", "e-x", "日"]


def test_due_answers_in_next_due_then_name_order_page_by_page(store: Store) -> None:
    register(store, *NAMES)
    states = {d.name: d.state for d in store.due(now(store), MAX_PAGE)}
    # Ties: three instants for fourteen entries; one far ahead.
    instants = [1000, 3000, 2000, 1000, 3000, 2000, 1000, 3000, 2000, 1000, 3000, 2000,
                1000, LATER]
    writes = [IndexWrite(n, states[n], 0, t)  # type: ignore[arg-type]
              for n, t in zip(NAMES, instants)]
    assert store.index(writes) == [True] * len(NAMES)
    expected = sorted((t, n) for n, t in zip(NAMES, instants) if t <= 3000)
    assert due_names(store, 3000) == expected
    for limit in (1, 2, 3, 5, 13):
        assert [(d.next_due, d.name) for d in every_due(store, 3000, limit)] == expected
    assert due_names(store, 1999) == [x for x in expected if x[0] < 2000]
    assert due_names(store, 999) == []
    assert due_names(store, 3000, limit=4) == expected[:4]
    # After a tie's member that is no longer there, the page goes on from where it was.
    gone = expected[1]
    assert gone[0] == expected[2][0] and store.forget([gone[1]]) == [gone[1]]
    rest = [x for x in expected if x != gone]
    assert [(d.next_due, d.name) for d in store.due(3000, MAX_PAGE, gone)] == [
        x for x in rest if x > gone]
    assert [(d.next_due, d.name) for d in store.due(3000, MAX_PAGE, (2000, "a0"))] == [
        x for x in rest if x > (2000, "a0")]


def test_the_next_indexed_instant_after_a_cursor_is_the_one_due_would_page_to(
        store: Store) -> None:
    """What a reader that has read up to a cursor asks to know when to read again: the
    index's first instant after it, as :meth:`Store.due` would answer it next; None past
    the last. Entries not due are not in the index."""
    register(store, "a", "b", "c", "off")
    states = {d.name: d.state for d in store.due(now(store), MAX_PAGE)}
    writes = [IndexWrite(n, states[n], 0, t)  # type: ignore[arg-type]
              for n, t in (("a", 2000), ("b", 2000), ("c", LATER), ("off", NOT_DUE))]
    assert store.index(writes) == [True] * 4
    assert store.next_indexed() == 2000
    assert store.next_indexed((2000, "a")) == 2000  # ("b", the tie after it)
    assert store.next_indexed((2000, "b")) == LATER
    assert store.next_indexed((1500, "zz")) == 2000
    assert store.next_indexed((LATER, "c")) is None
    # Read with a page: the first instant after what the page could hold, once it is short.
    ahead = store.due_ahead(2000, 10)
    assert ([d.name for d in ahead.entries], ahead.beyond) == (["a", "b"], LATER)
    ahead = store.due_ahead(2000, 10, (2000, "a"))
    assert ([d.name for d in ahead.entries], ahead.beyond) == (["b"], LATER)
    assert store.due_ahead(2000, 2).beyond is None  # (a full page: more may be due)
    assert store.due_ahead(1999, 10) == DueAhead([], 2000)
    assert store.due_ahead(LATER, 10, (2000, "b")).beyond is None  # (nothing after)


def test_due_refuses_a_limit_out_of_bounds(store: Store) -> None:
    for limit in (0, -1, MAX_PAGE + 1):
        with pytest.raises(ValueError, match="limit"):
            store.due(0, limit)


# -- the rebuild sweep ------------------------------------------------------------------
def test_index_writes_only_over_the_state_and_version_it_was_computed_from(
        store: Store) -> None:
    state = register(store, "e")["e"]
    a = state.anchor
    assert store.index([IndexWrite("e", state, 0, a + 5000)]) == [True]
    assert indexed(store, "e").next_due == a + 5000  # type: ignore[union-attr]
    # Asked again (a lost reply): the same value again.
    assert store.index([IndexWrite("e", state, 0, a + 5000)]) == [True]
    assert indexed(store, "e").next_due == a + 5000  # type: ignore[union-attr]
    [r] = store.claim(A, [ClaimPlan("e", state, (a + 1000,), next_due=a + 2000)])
    # Computed before the claim moved the checkpoint: written nowhere.
    assert store.index([IndexWrite("e", state, 0, a + 9000)]) == [False]
    assert indexed(store, "e").next_due == a + 2000  # type: ignore[union-attr]
    assert r.state is not None
    # Computed from a definition version the entry no longer has: nothing either.
    assert define(store, "e", 0, next_due=a + 4000) is WriteStatus.OK
    assert store.index([IndexWrite("e", r.state, 0, a + 9000)]) == [False]
    assert store.index([IndexWrite("e", r.state, 1, NOT_DUE),
                        IndexWrite("missing", r.state, 0, 1)]) == [True, False]
    assert indexed(store, "e") is None


def test_the_rebuild_sweep_pages_through_every_entry_without_next_due(
        store: Store, backend: Backend) -> None:
    names = [f"entry-{i:02d}" for i in range(40)]
    register(store, *names)
    define(store, "defined", 0, next_due=123)
    define(store, "deleted", 0, next_due=123)
    define(store, "deleted", 1, text=None)
    states = {d.name: d for d in every_due(store, 2 ** 52, 100)}
    missing = set(names[::3]) | {"defined", "deleted"}
    for name in missing:
        backend.drop_next_due(store, name)
    assert {d.name for d in every_due(store, 2 ** 52)} == set(names) - missing
    found = [name for page in rebuild_pass(store, 4) for name in page.names]
    assert set(found) == missing, sorted(found)
    # The sweep indexes each from the state it read (a deleted one: not due).
    entries = {r.name: r for r in store.entries(sorted(missing))}
    versions = {d.name: d.version for d in store.definitions(sorted(missing))}
    writes = [IndexWrite(n, EntryState(entries[n].anchor or 0, entries[n].checkpoint),
                         versions.get(n, 0), NOT_DUE if n == "deleted" else 500)
              for n in sorted(missing)]
    assert store.index(writes) == [True] * len(writes)
    page = store.unindexed(MAX_PAGE)
    assert (page.names, page.complete) == ((), True)
    assert {d.name for d in store.due(500, MAX_PAGE)} == (missing - {"deleted"}) | {
        n for n, d in states.items() if d.next_due <= 500 and n not in missing}


def test_a_rebuild_pass_reads_each_record_once_where_most_have_no_next_due(
        store: Store, backend: Backend) -> None:
    """Where most entries have no next_due, a pass takes many pages (at most ``limit``
    names each) and each page goes on right after what the one before it read: every
    entry is answered once, and the records the pages read (``looked_at``, what the
    sweeper paces the pass by) are at most one for each entry, however the pages fall
    (on a Redis Cluster, the registry's step is read bucket by bucket)."""
    names = [f"entry-{i:03d}" for i in range(600)]
    for start in range(0, len(names), 200):
        register(store, *names[start:start + 200])
    missing = [name for i, name in enumerate(names) if i % 3]
    for name in missing:
        backend.drop_next_due(store, name)
    pages = rebuild_pass(store, 50)
    found = [name for page in pages for name in page.names]
    assert sorted(found) == missing, sorted(set(found) ^ set(missing))
    looked_at = [page.looked_at for page in pages]
    assert sum(looked_at) <= len(names), (sum(looked_at), looked_at)


@pytest.mark.parametrize("limit", [1, 7, 17])
def test_a_rebuild_pass_of_small_pages_finds_each_entry_without_next_due(
        store: Store, backend: Backend, limit: int) -> None:
    """Pages smaller than the Redis buckets (on a Redis Cluster some buckets' calls get no
    share of the page), or not a multiple of them: the pass still ends, and answers every
    entry without next_due, each once."""
    names = [f"small-{i:03d}" for i in range(120)]
    register(store, *names)
    missing = [name for i, name in enumerate(names) if i % 4]
    for name in missing:
        backend.drop_next_due(store, name)
    pages = rebuild_pass(store, limit)
    found = [name for page in pages for name in page.names]
    assert sorted(found) == missing, sorted(set(found) ^ set(missing))


@pytest.mark.parametrize("cursor", ["garbage", "12:", "0:zzz", "0:,,,",
                                    "0:" + "f" * 20, "0:" + ",".join(["0" * 20] * 3),
                                    "18446744073709551615:", "18446744073709551616:",
                                    "0:" + "f" * 20 + ":99999999999999999999999",
                                    "0::12", "7:" + "0" * 20 + ":0", "\u00b2:"])
def test_a_rebuild_pass_from_a_stale_or_garbage_cursor_ends(
        store: Store, backend: Backend, cursor: str) -> None:
    """A cursor of another version's format, of a registry since changed, or not one at
    all: the page is answered (no error), and the pass goes on to its end; a pass started
    afresh after it answers every entry without next_due."""
    names = [f"stale-{i:03d}" for i in range(60)]
    register(store, *names)
    missing = [name for i, name in enumerate(names) if i % 2]
    for name in missing:
        backend.drop_next_due(store, name)
    page = store.unindexed(10, cursor)
    for _ in range(200):
        if page.complete:
            break
        page = store.unindexed(10, page.cursor)
    assert page.complete, page
    found = [name for p in rebuild_pass(store, 10) for name in p.names]
    assert sorted(found) == missing, sorted(set(found) ^ set(missing))


def test_a_rebuild_sweep_indexes_what_it_can_compute_and_writes_nothing_over_a_move(
        store: Store, backend: Backend) -> None:
    names = ["moves", "mystery", "plain", "tombstone", "with-definition"]
    register(store, "moves", "mystery", "plain")
    define(store, "with-definition", 0, next_due=1)
    define(store, "tombstone", 0, next_due=1)
    define(store, "tombstone", 1, text=None)
    for name in names:
        backend.drop_next_due(store, name)
    seen: dict[str, tuple[int | None, int]] = {}

    def next_due_of(name: str, record: EntryRecord, definition: StoredDefinition | None
                    ) -> int | None:
        seen[name] = (record.checkpoint, definition.version if definition else 0)
        if name == "mystery":
            return None  # (not this caller's to tell: another beat's beat_schedule)
        if name == "moves":  # another beat claims it meanwhile: it writes the instant
            store.claim(B, [ClaimPlan(name, EntryState(record.anchor or 0, None),
                                      ((record.anchor or 0) + 1000,), next_due=4242)])
        if definition is not None and definition.deleted:
            return NOT_DUE
        return 777

    indexed_, moved, left = [], [], []
    cursor, complete = "", False
    while not complete:
        page = rebuild_page(store, next_due_of, cursor, limit=2)
        indexed_ += page.indexed
        moved += page.moved
        left += page.left
        cursor, complete = page.cursor, page.complete
    assert sorted(indexed_) == ["plain", "tombstone", "with-definition"]
    assert (moved, left) == (["moves"], ["mystery"])
    assert seen["with-definition"] == (None, 1) and seen["tombstone"] == (None, 2)
    assert [(d.name, d.next_due) for d in every_due(store, 5000)] == [
        ("plain", 777), ("with-definition", 777), ("moves", 4242)]
    assert store.unindexed(10).names == ("mystery",)


def test_unindexed_refuses_a_limit_out_of_bounds(store: Store) -> None:
    for limit in (0, MAX_PAGE + 1):
        with pytest.raises(ValueError, match="limit"):
            store.unindexed(limit)


# -- lost replies and a store put back ----------------------------------------------------
def test_a_claim_or_definition_write_asked_again_leaves_the_first_ones_index(
        store: Store) -> None:
    state = register(store, "e")["e"]
    a = state.anchor
    p = ClaimPlan("e", state, (a + 1000,), next_due=a + 2000)
    [first] = store.claim(A, [p])
    [again] = store.claim(A, [p])  # the first reply was lost
    assert (first.status, again.status) == (ClaimStatus.OK, ClaimStatus.CONFLICT)
    assert indexed(store, "e").next_due == a + 2000  # type: ignore[union-attr]
    assert define(store, "e", 0, next_due=a + 3000, change_id="c1") is WriteStatus.OK
    [r] = store.claim(A, [ClaimPlan("e", first.state, (a + 2000,), next_due=a + 4000,
                                    version=1)])
    assert r.status is ClaimStatus.OK
    # The definition write again with its change id (a lost reply): it writes nothing.
    assert define(store, "e", 0, next_due=a + 3000, change_id="c1") is WriteStatus.OK
    assert indexed(store, "e").next_due == a + 4000  # type: ignore[union-attr]


def test_a_store_put_back_holds_the_index_of_its_copy(store: Store, backend: Backend) -> None:
    state = register(store, "e")["e"]
    a = state.anchor
    [r] = store.claim(A, [ClaimPlan("e", state, (a + 1000,), next_due=a + 2000)])
    put_back = backend.copy(store)
    store.claim(A, [ClaimPlan("e", r.state, (a + 2000,), next_due=a + 3000)])
    put_back()
    [d] = every_due(store, 2 ** 52)
    # The copy's index with the copy's checkpoint: a claim from it is that copy's.
    assert (d.next_due, d.state) == (a + 2000, r.state)
    assert sorted(runs(store)) == [a + 1000]
