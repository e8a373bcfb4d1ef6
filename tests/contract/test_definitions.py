"""Entries' definitions in the store: each change a compare-and-set on the version its
caller read (and on the checkpoint, when it names one), written with the skips it plans and
the checkpoint it moves, in one atomic step; a delete is a tombstone with its own version;
register and prune keep their meaning; bad items are refused where they enter, bad records
are local; a bulk goes in a bounded number of round trips."""

from __future__ import annotations

import json
import time

import pytest

from beat_claims.enums import Origin, Reason, RunState
from beat_claims.stores.base import (
    MAX_DEFINITION_BYTES,
    ClaimStatus,
    DefinitionResult,
    DefinitionWrite,
    EntrySeed,
    Outcome,
    Release,
    Store,
    StoredDefinition,
    WriteRefused,
    WriteStatus,
)

from .conftest import Backend
from .helpers import (
    A,
    B,
    claim,
    claims,
    now,
    process,
    register,
    runs,
    send,
    started,
    take,
)

TTL = 10.0


def definition(task: str = "proj.report", every: float = 30, **more: object) -> str:
    return json.dumps({"task": task, "schedule": {"every": every}, **more})


def write(store: Store, name: str, text: str | None, expected: int, *,
          origin: Origin = Origin.API, by: str = "alice@ops", change_id: str = "",
          skip: tuple[tuple[int, Reason], ...] = (), checkpoint: int | None = None,
          expected_checkpoint: int | None = None) -> DefinitionResult:
    [result] = store.write_definitions([DefinitionWrite(
        name, text, expected, origin, by, change_id, skip, checkpoint, expected_checkpoint)])
    return result


def create(store: Store, name: str, text: str | None = None, **kwargs: object
           ) -> DefinitionResult:
    result = write(store, name, text or definition(), 0, **kwargs)  # type: ignore[arg-type]
    assert result.status is WriteStatus.OK, result
    return result


def stored(store: Store, name: str) -> StoredDefinition | None:
    found = store.definitions([name])
    assert len(found) <= 1 and all(d.name == name for d in found), found
    return found[0] if found else None


# -- create, update, delete ---------------------------------------------------------------
def test_a_definition_is_created_changed_deleted_and_created_again_each_with_a_version(
        store: Store) -> None:
    before = now(store)
    first = create(store, "e", definition(every=10), by="alice@ops", origin=Origin.CONFIG)
    assert first.version == 1 and first.state is not None and first.detail == ""
    d = stored(store, "e")
    assert d is not None and d == first.current
    assert (d.definition, d.version, d.origin, d.changed_by, d.deleted, d.corrupt) == (
        definition(every=10), 1, Origin.CONFIG, "alice@ops", False, "")
    assert before <= d.changed_at <= now(store)

    second = write(store, "e", definition(every=20), 1, by="bob@ops")
    assert (second.status, second.version) == (WriteStatus.OK, 2)
    d = stored(store, "e")
    assert d is not None and (d.definition, d.version, d.origin, d.changed_by) == (
        definition(every=20), 2, Origin.API, "bob@ops")

    gone = write(store, "e", None, 2, by="carol@ops")
    assert (gone.status, gone.version) == (WriteStatus.OK, 3)
    d = stored(store, "e")
    assert d is not None and (d.definition, d.version, d.deleted, d.changed_by) == (
        None, 3, True, "carol@ops")
    assert gone.current == d

    # A tombstone is created over (expected version 0): its versions go on, never reused.
    again = write(store, "e", definition(every=5), 0)
    assert (again.status, again.version) == (WriteStatus.OK, 4)
    d = stored(store, "e")
    assert d is not None and (d.definition, d.version, d.deleted) == (
        definition(every=5), 4, False)


def test_the_definition_is_kept_as_the_text_it_was_written(store: Store) -> None:
    """Opaque JSON text: its spacing, key order and non-ASCII characters as written."""
    text = '{"task":  "t", "zeta": 1, "alpha": "été ☃", "args": [1,2]}'
    create(store, "e", text)
    d = stored(store, "e")
    assert d is not None and d.definition == text


def test_a_new_entry_is_anchored_as_register_anchors_and_an_entry_a_beat_registered_keeps_its_own(
        store: Store) -> None:
    registered = register(store, "old")["old"]
    claim(store, A, registered, registered.anchor + 1000, entry="old")
    a, b = store.write_definitions([
        DefinitionWrite("new-1", definition(), 0, Origin.API, "alice@ops"),
        DefinitionWrite("new-2", definition(), 0, Origin.API, "alice@ops")])
    assert a.state is not None and b.state is not None
    assert a.state.anchor == b.state.anchor  # new entries first seen together share it
    assert a.state.checkpoint is None and a.state.token == 0
    assert register(store, "new-1")["new-1"] == a.state  # a beat registering it finds it
    # An entry a beat registered from its beat_schedule alone has no definition: it can be
    # given one (expected version 0), and keeps its anchor, checkpoint and token.
    [before] = store.entries(["old"])
    given = create(store, "old")
    assert given.state is not None and given.state.anchor == registered.anchor
    assert (given.state.checkpoint, given.state.token) == (before.checkpoint, before.token)
    assert sorted(e.name for e in store.entries()) == ["new-1", "new-2", "old"]


def test_register_never_touches_a_definition(store: Store) -> None:
    create(store, "e", definition(every=10))
    created = stored(store, "e")
    state = store.register([EntrySeed("e", "every 99s", checkpoint=5)], A)["e"]
    assert stored(store, "e") == created
    assert state.checkpoint == 5
    write(store, "e", None, 1)
    tombstone = stored(store, "e")
    store.register([EntrySeed("e", "every 99s")], B)
    assert stored(store, "e") == tombstone  # not brought back


# -- compare-and-set ----------------------------------------------------------------------
def test_a_stale_version_is_refused_with_the_store_s_current_definition(store: Store) -> None:
    create(store, "e", definition(every=10))
    write(store, "e", definition(every=20), 1, by="bob@ops")
    current = stored(store, "e")
    stale = write(store, "e", definition(every=30), 1, by="carol@ops")
    assert (stale.status, stale.version, stale.current) == (WriteStatus.CONFLICT, 2, current)
    assert stale.state is not None
    assert stored(store, "e") == current  # nothing written
    deleting = write(store, "e", None, 1)
    assert (deleting.status, deleting.current) == (WriteStatus.CONFLICT, current)
    assert stored(store, "e") == current


def test_a_create_of_a_live_entry_answers_exists_and_an_update_of_none_missing(
        store: Store) -> None:
    create(store, "e")
    current = stored(store, "e")
    exists = write(store, "e", definition(every=1), 0)
    assert (exists.status, exists.version, exists.current) == (WriteStatus.EXISTS, 1, current)
    # No such entry: nothing is created.
    missing = write(store, "nobody", definition(), 3)
    assert (missing.status, missing.version, missing.current, missing.state) == (
        WriteStatus.MISSING, 0, None, None)
    assert store.definitions(["nobody"]) == []
    assert "nobody" not in {e.name for e in store.entries()}
    assert write(store, "nobody", None, 1).status is WriteStatus.MISSING
    # An entry a beat registered alone has no definition to change.
    register(store, "registered")
    assert write(store, "registered", definition(), 1).status is WriteStatus.MISSING
    assert store.definitions(["registered"]) == []
    # A tombstone is no definition either: it is created over, never updated.
    write(store, "e", None, 1)
    tombstone = stored(store, "e")
    for text in (definition(), None):
        refused = write(store, "e", text, 2)
        assert (refused.status, refused.version, refused.current) == (
            WriteStatus.MISSING, 2, tombstone)
    assert stored(store, "e") == tombstone


def test_a_checkpoint_that_moved_since_the_caller_read_it_is_refused(store: Store) -> None:
    state = register(store, "e")["e"]
    create(store, "e")
    moved = claim(store, A, state, state.anchor + 1000)
    assert moved.state is not None and moved.state.checkpoint == state.anchor + 1000
    refused = write(store, "e", definition(every=2), 1, expected_checkpoint=state.anchor,
                    checkpoint=state.anchor + 5000,
                    skip=((state.anchor + 2000, Reason.CHANGED),))
    assert refused.status is WriteStatus.CONFLICT and refused.detail == "checkpoint"
    assert refused.state == moved.state and refused.version == 1
    assert sorted(runs(store)) == [state.anchor + 1000]  # no skip recorded
    ok = write(store, "e", definition(every=2), 1, expected_checkpoint=state.anchor + 1000,
               checkpoint=state.anchor + 5000, skip=((state.anchor + 2000, Reason.CHANGED),))
    assert ok.status is WriteStatus.OK and ok.state is not None
    assert ok.state.checkpoint == state.anchor + 5000
    # An entry that never had a checkpoint: a caller naming one is refused too.
    fresh = register(store, "f")["f"]
    assert fresh.checkpoint is None
    assert write(store, "f", definition(), 0, expected_checkpoint=fresh.anchor).status is (
        WriteStatus.CONFLICT)


def test_the_skips_of_a_change_are_recorded_as_a_claim_s_and_the_checkpoint_moves_to_the_change(
        store: Store) -> None:
    c1, c2 = claims(store, A, 1000, 2000)
    state = register(store, "e")["e"]
    anchor = state.anchor
    create(store, "e")
    result = write(store, "e", definition(every=7), 1, expected_checkpoint=anchor + 2000,
                   checkpoint=anchor + 6000,
                   skip=((anchor + 500, Reason.CHANGED),  # at or before the checkpoint
                         (anchor + 3000, Reason.CHANGED), (anchor + 4000, Reason.DISABLED),
                         (anchor + 5000, Reason.CHANGED)))
    assert result.status is WriteStatus.OK and result.state is not None
    assert result.state.checkpoint == anchor + 6000
    found = runs(store)
    assert {d: (r.state, r.reason) for d, r in found.items()} == {
        c1.due: (RunState.CLAIMED, None), c2.due: (RunState.CLAIMED, None),
        anchor + 3000: (RunState.SKIPPED, Reason.CHANGED),
        anchor + 4000: (RunState.SKIPPED, Reason.DISABLED),
        anchor + 5000: (RunState.SKIPPED, Reason.CHANGED)}
    assert all(found[d].finished_at for d in (anchor + 3000, anchor + 4000, anchor + 5000))
    # A beat that claims by the old checkpoint is refused, and claims on from the new one.
    assert claim(store, B, state, anchor + 3000).status is ClaimStatus.CONFLICT
    after = claim(store, B, result.state, anchor + 7000)
    assert after.status is ClaimStatus.OK and [c.due for c in after.claims] == [anchor + 7000]


def test_a_skip_at_an_instant_that_has_a_run_leaves_the_run_as_it_is(store: Store) -> None:
    state = register(store, "e")["e"]
    create(store, "e")
    # Claimed by a beat after the caller computed its skips (no checkpoint named).
    [held] = claim(store, A, state, state.anchor + 1000).claims
    result = write(store, "e", definition(), 1, checkpoint=state.anchor + 2000,
                   skip=((state.anchor + 1000, Reason.CHANGED),
                         (state.anchor + 2000, Reason.CHANGED)))
    assert result.status is WriteStatus.OK
    found = runs(store)
    assert (found[held.due].state, found[held.due].token) == (RunState.CLAIMED, held.token)
    assert found[state.anchor + 2000].reason is Reason.CHANGED


def test_the_checkpoint_never_moves_back(store: Store) -> None:
    state = register(store, "e")["e"]
    claim(store, A, state, state.anchor + 5000)
    create(store, "e", checkpoint=state.anchor + 1000,
           skip=((state.anchor + 500, Reason.CHANGED),))
    [record] = store.entries(["e"])
    assert record.checkpoint == state.anchor + 5000
    assert sorted(runs(store)) == [state.anchor + 5000]
    moved = write(store, "e", definition(every=3), 1, checkpoint=state.anchor + 9000)
    assert moved.state is not None and moved.state.checkpoint == state.anchor + 9000
    assert store.entries(["e"])[0].checkpoint == state.anchor + 9000


# -- tombstones ---------------------------------------------------------------------------
def test_a_deleted_entry_s_runs_finish_nothing_brings_its_definition_back_and_prune_waits(
        store: Store) -> None:
    """Runs claimed, sent or started before the delete finish and are recorded; a run due
    again can still be taken (the beats stop planning new ones: theirs to do); neither a
    claim nor a registration brings the definition back; a prune removes the entry only
    once nothing of it is live, and never one with a live definition."""
    sent, due_again, held = claims(store, A, 1000, 2000, 3000)
    send(store, A, sent)
    started(store, sent, process(1))
    store.release(A, [Release(due_again)])
    create(store, "e")
    assert store.forget(["e"]) == []  # a live definition is never pruned
    write(store, "e", None, 1)
    tombstone = stored(store, "e")
    assert tombstone is not None and tombstone.deleted
    assert store.finish([Outcome("e", sent.due, sent.token, RunState.DONE)]) == [True]
    [taken] = take(store, B)
    assert taken.due == due_again.due
    send(store, B, taken)
    register(store, "e")
    assert stored(store, "e") == tombstone
    assert store.forget(["e"]) == []  # runs claimed and sent: kept
    assert store.finish([Outcome("e", taken.due, taken.token, RunState.DONE)]) == [True]
    assert store.forget(["e"]) == []  # a run claimed: kept
    store.release(A, [Release(held)])  # (due again: nothing of it is live)
    assert {r.state for r in runs(store).values()} == {RunState.DONE, RunState.DUE}
    assert store.forget(["e"]) == ["e"]
    assert store.definitions(["e"]) == [] and store.definitions() == []
    assert "e" not in {e.name for e in store.entries()}
    # The name is free: created again, it starts again at version 1.
    assert create(store, "e").version == 1


def test_a_prune_keeps_a_live_definition_whoever_registered_it(store: Store) -> None:
    store.heartbeat(A, TTL)
    create(store, "api-made")
    register(store, "config-made")
    create(store, "both")
    assert store.forget(["api-made", "config-made", "both"]) == ["config-made"]
    assert [d.name for d in store.definitions()] == ["api-made", "both"]


# -- reading ------------------------------------------------------------------------------
def test_definitions_by_name_in_the_order_asked_leaving_out_entries_without_one(
        store: Store) -> None:
    create(store, "b")
    create(store, "a")
    write(store, "a", None, 1)
    register(store, "registered")
    found = store.definitions(["registered", "b", "nobody", "a", "b"])
    assert [(d.name, d.version, d.deleted) for d in found] == [("b", 1, False),
                                                               ("a", 2, True)]


def test_every_definition_is_paged_in_name_order_with_the_tombstones(store: Store) -> None:
    names = [f"entry-{i:02d}" for i in range(25)] + ["Z", "a", "é", "日本", "~"]
    store.write_definitions([DefinitionWrite(n, definition(task=n), 0, Origin.API, "ops")
                             for n in names])
    store.write_definitions([DefinitionWrite(n, None, 1, Origin.API, "ops")
                             for n in names[::3]])
    register(store, "registered-only", "entry-07x")
    pages, after = [], ""
    while True:
        page = store.definitions(after=after, limit=7)
        pages.append(page)
        if len(page) < 7:
            break
        after = page[-1].name
    found = [d for page in pages for d in page]
    assert [d.name for d in found] == sorted(names)  # by code point
    assert {d.name for d in found if d.deleted} == set(names[::3])
    assert all(d.definition == definition(task=d.name) for d in found if not d.deleted)
    assert len(pages) == 5 and store.definitions(after="日本") == []
    assert [d.name for d in store.definitions(after="entry-23", limit=3)] == [
        "entry-24", "~", "é"]


# -- refused where it enters --------------------------------------------------------------
@pytest.mark.parametrize(("item", "says"), [
    (DefinitionWrite("big", "[" + "1," * (MAX_DEFINITION_BYTES // 2) + "1]", 0, Origin.API,
                     "ops"), f"larger than {MAX_DEFINITION_BYTES} bytes"),
    (DefinitionWrite("", definition(), 0, Origin.API, "ops"), "non-empty string"),
    (DefinitionWrite("x" * 2000, definition(), 0, Origin.API, "ops"), "longer than"),
    (DefinitionWrite("\ud800", definition(), 0, Origin.API, "ops"), "cannot be stored"),
    (DefinitionWrite("bad", "", 0, Origin.API, "ops"), "must be JSON text"),
    (DefinitionWrite("bad", None, 0, Origin.API, "ops"), "names the version it deletes"),
    (DefinitionWrite("bad", definition(), -1, Origin.API, "ops"), "expected_version -1"),
    (DefinitionWrite("bad", definition(), 0, "api", "ops"),  # type: ignore[arg-type]
     "origin 'api'"),
    (DefinitionWrite("bad", definition(), 0, Origin.API, "x" * 201), "by 'xxx"),
    (DefinitionWrite("bad", definition(), 0, Origin.API, "ops", "i" * 201), "change_id"),
    (DefinitionWrite("bad", definition(), 0, Origin.API, "ops",
                     skip=tuple((i, Reason.CHANGED) for i in range(101))),
     "beat_claims_history_limit"),
    (DefinitionWrite("bad", definition(), 0, Origin.API, "ops",
                     skip=((1.5, Reason.CHANGED),)), "skip (1.5"),  # type: ignore[arg-type]
    (DefinitionWrite("bad", definition(), 0, Origin.API, "ops", checkpoint=2**60),
     "checkpoint"),
], ids=["oversize", "empty-name", "long-name", "unstorable-name", "empty-definition",
        "delete-without-version", "negative-version", "origin-not-an-origin", "long-by",
        "long-change-id", "too-many-skips", "skip-not-an-instant", "checkpoint-too-large"])
def test_an_item_the_store_cannot_keep_is_refused_naming_it_and_nothing_is_written(
        store: Store, item: DefinitionWrite, says: str) -> None:
    fine = DefinitionWrite("fine", definition(), 0, Origin.API, "ops")
    with pytest.raises(WriteRefused) as refused:
        store.write_definitions([fine, item])
    assert says in str(refused.value) and repr(item.name)[:40] in str(refused.value)
    assert store.definitions() == [] and store.entries() == []


def test_a_definition_of_exactly_the_largest_size_is_kept(store: Store) -> None:
    text = json.dumps({"task": "t", "description": ""})
    text = text[:-2] + "é" * ((MAX_DEFINITION_BYTES - len(text.encode())) // 2) + '"}'
    text = text[:-2] + "a" * (MAX_DEFINITION_BYTES - len(text.encode())) + '"}'
    assert len(text.encode()) == MAX_DEFINITION_BYTES
    create(store, "e", text)
    d = stored(store, "e")
    assert d is not None and d.definition == text


# -- a bulk -------------------------------------------------------------------------------
BULK = 10_000


def test_a_bulk_of_10000_writes_goes_in_a_bounded_number_of_round_trips(
        store: Store, backend: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    """One round trip per chunk of items (and one for the anchoring instant): the rate
    goes to the report (pytest -s)."""
    writes = [DefinitionWrite(f"bulk-{i:05d}", definition(task=f"t{i}", every=60),
                              0, Origin.API, "ops", f"create-{i}") for i in range(BULK)]
    trips = backend.round_trips(store)
    started_at = time.perf_counter()
    results = store.write_definitions(writes)
    elapsed = time.perf_counter() - started_at
    assert [r.status for r in results] == [WriteStatus.OK] * BULK
    assert {r.version for r in results} == {1}
    assert trips() <= BULK // 500 + 2, trips()
    with capsys.disabled():
        print(f"\n{type(store).__name__}: {BULK} definition writes in {elapsed:.2f}s,"
              f" {BULK / elapsed:,.0f} writes/s, {trips()} round trips")
    updates = [DefinitionWrite(w.name, definition(task=w.name, every=30), 1, Origin.API,
                               "ops", f"update-{i}") for i, w in enumerate(writes)]
    trips = backend.round_trips(store)
    assert {r.version for r in store.write_definitions(updates)} == {2}
    assert trips() <= BULK // 500 + 2, trips()
    page = store.definitions(after="bulk-04999", limit=2)
    assert [(d.name, d.version) for d in page] == [("bulk-05000", 2), ("bulk-05001", 2)]


# -- a lost reply -------------------------------------------------------------------------
def test_the_same_change_again_answers_the_same_and_changes_nothing_more(
        store: Store) -> None:
    """A lost reply: the caller writes the same change again, with the same change id."""
    state = register(store, "e")["e"]
    cursor = store.changes(None).cursor
    item = DefinitionWrite("e", definition(every=4), 0, Origin.API, "alice@ops", "change-1",
                           ((state.anchor + 1000, Reason.CHANGED),), state.anchor + 2000)
    [first] = store.write_definitions([item])
    history, written = runs(store), stored(store, "e")
    [again] = store.write_definitions([item])
    assert again == first and first.status is WriteStatus.OK and first.version == 1
    assert stored(store, "e") == written and runs(store) == history
    assert [d.name for d in store.changes(cursor).changed] == ["e"]
    # A later change is another change: the first one's id is a new write then (a create
    # of a live entry).
    update = DefinitionWrite("e", definition(every=5), 1, Origin.API, "bob@ops", "change-2")
    assert store.write_definitions([update])[0].version == 2
    assert store.write_definitions([update])[0].version == 2
    assert store.write_definitions([item])[0].status is WriteStatus.EXISTS
    # Without a change id every write is a change of its own.
    plain = DefinitionWrite("e", definition(every=6), 2, Origin.API, "bob@ops")
    assert store.write_definitions([plain])[0].version == 3
    assert store.write_definitions([plain])[0].status is WriteStatus.CONFLICT


def test_a_delete_again_answers_the_same(store: Store) -> None:
    create(store, "e")
    item = DefinitionWrite("e", None, 1, Origin.API, "alice@ops", "delete-1")
    [first] = store.write_definitions([item])
    assert (first.status, first.version) == (WriteStatus.OK, 2)
    assert store.write_definitions([item]) == [first]
    assert stored(store, "e") == first.current


# -- bad records --------------------------------------------------------------------------
#: Ways an entry's definition fields can be unreadable: (field, stored value).
BAD_FIELDS = {
    "version-not-a-number": ("version", "two"),
    "version-negative": ("version", "-3"),
    "version-zero": ("version", "0"),
    "definition-not-json": ("definition", '{"task": "t", "sched'),
    "origin-unknown": ("origin", "crontab.guru"),
}


@pytest.mark.parametrize("bad", sorted(BAD_FIELDS))
def test_a_record_that_cannot_be_read_is_corrupt_for_its_entry_only(
        store: Store, backend: Backend, bad: str) -> None:
    field, raw = BAD_FIELDS[bad]
    cursor = store.changes(None).cursor
    create(store, "bad")
    create(store, "good")
    backend.corrupt_entry_field(store, "bad", field, raw)
    found = {d.name: d for d in store.definitions()}
    assert found["bad"].corrupt and field in found["bad"].corrupt
    assert (found["bad"].definition, found["bad"].deleted) == (None, False)
    assert not found["good"].corrupt and found["good"].definition == definition()
    assert store.definitions(["bad", "good"]) == [found["bad"], found["good"]]
    assert {d.name: d for d in store.changes(cursor).changed} == found
    results = store.write_definitions([
        DefinitionWrite("bad", definition(every=2), 1, Origin.API, "ops"),
        DefinitionWrite("good", definition(every=2), 1, Origin.API, "ops")])
    assert results[1].status is WriteStatus.OK
    if field == "version":  # not written: what the store holds cannot be compared
        assert results[0].status is WriteStatus.CORRUPT and "version" in results[0].detail
        assert store.definitions(["bad"]) == [found["bad"]]
    else:  # the version can be read: a write naming it replaces what cannot be read
        assert (results[0].status, results[0].version) == (WriteStatus.OK, 2)
        [repaired] = store.definitions(["bad"])
        assert not repaired.corrupt and repaired.definition == definition(every=2)


def test_entries_and_claims_go_on_beside_a_corrupt_definition(
        store: Store, backend: Backend) -> None:
    state = register(store, "e")["e"]
    create(store, "e")
    backend.corrupt_entry_field(store, "e", "version", "-1")
    result = claim(store, A, state, state.anchor + 1000)
    assert result.status is ClaimStatus.OK and len(result.claims) == 1
    assert [e.name for e in store.entries()] == ["e"]
    assert store.forget(["e"]) == []  # its definition is there: never pruned
