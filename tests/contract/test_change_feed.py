"""The change feed: each definition change puts its entry in the feed in the same atomic
step; a reader follows it from its cursor, gets each changed entry once (its newest change),
oldest change first, bounded by its limit; it is told to reload (read every definition
again) when it has no cursor, when its cursor is older than what the feed keeps (a
tombstone dropped a day after its delete, a pruned entry), or when the store went back (a
wipe, an older copy put back)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from beat_claims.enums import Origin
from beat_claims.stores.base import (
    MAX_PAGE,
    ChangeCursor,
    Changes,
    DefinitionWrite,
    Store,
    StoreError,
    WriteStatus,
)

from .conftest import Backend
from .helpers import A, after, claims, now, poll, register
from .test_definitions import create, definition, write

TTL = 10.0


def head(store: Store) -> ChangeCursor:
    """A reader's first cursor: no cursor answers reload, with the feed's head."""
    first = store.changes(None)
    assert first.reload and first.changed == () and first.complete, first
    return first.cursor


def drain(store: Store, cursor: ChangeCursor, limit: int = 1000) -> tuple[ChangeCursor,
                                                                          list[str]]:
    """Follow the feed from ``cursor`` until it is complete: the cursor, and the names read
    (in the order read)."""
    names: list[str] = []
    for _ in range(1000):
        answer = store.changes(cursor, limit)
        assert not answer.reload, answer
        names += [d.name for d in answer.changed]
        cursor = answer.cursor
        if answer.complete:
            return cursor, names
    raise AssertionError("the feed never completed")


def answered(store: Store, ask: Callable[[], Changes]) -> Changes:
    """The feed's answer once the store answers again (after a wipe or a copy put back, a
    heartbeat reads the store's epoch first)."""
    def attempt() -> Changes | None:
        try:
            store.heartbeat(A, TTL)
            return ask()
        except StoreError:
            return None

    found = poll(attempt, 30, "the store to answer again")
    assert found is not None
    return found


def tick(store: Store) -> None:
    """Until the store's clock has moved on: changes made before and after are in that
    order on every backend (within one millisecond the buckets of a Redis store, each with
    its own log, may answer them in any order)."""
    after(store, now(store))


# -- following ----------------------------------------------------------------------------
def test_no_cursor_answers_reload_with_the_feed_s_head_and_nothing_before_it(
        store: Store) -> None:
    create(store, "a")
    create(store, "b")
    cursor = head(store)
    assert store.changes(cursor) == store.changes(cursor)  # nothing new: the same answer
    nothing = store.changes(cursor)
    assert (nothing.changed, nothing.reload, nothing.complete) == ((), False, True)
    create(store, "c")
    after = store.changes(cursor)
    assert [d.name for d in after.changed] == ["c"] and after.complete and not after.reload


def test_each_changed_entry_comes_once_as_the_store_holds_it_oldest_change_first(
        store: Store) -> None:
    cursor = head(store)
    for name in ("a", "b", "c", "d"):
        create(store, name, definition(task=name))
        tick(store)
    write(store, "b", definition(task="b", every=1), 1)  # b's later change replaces its first
    tick(store)
    write(store, "a", None, 1)  # a tombstone is a change
    register(store, "registered-only")  # no definition: not in the feed
    claims(store, A, 1000, entry="c")  # a claim is no definition change
    answer = store.changes(cursor)
    assert not answer.reload and answer.complete
    assert [(d.name, d.version, d.deleted) for d in answer.changed] == [
        ("c", 1, False), ("d", 1, False), ("b", 2, False), ("a", 2, True)]
    assert answer.changed[2].definition == definition(task="b", every=1)
    assert store.changes(answer.cursor).changed == ()
    write(store, "c", definition(task="c", every=2), 1)
    again = store.changes(answer.cursor)
    assert [(d.name, d.version) for d in again.changed] == [("c", 2)]


def test_a_limit_cuts_the_answer_short_and_the_next_call_goes_on_from_there(
        store: Store) -> None:
    cursor = head(store)
    names = [f"e{i:03d}" for i in range(57)]
    for start in range(0, len(names), 10):  # (changes spread over several calls)
        store.write_definitions([DefinitionWrite(n, definition(), 0, Origin.API, "ops")
                                 for n in names[start:start + 10]])
        tick(store)
    seen: list[str] = []
    calls = 0
    while True:
        answer = store.changes(cursor, limit=10)
        calls += 1
        assert not answer.reload and len(answer.changed) <= 10
        seen += [d.name for d in answer.changed]
        cursor = answer.cursor
        if answer.complete:
            break
        assert len(answer.changed) == 10
    assert sorted(seen) == names and len(seen) == len(set(seen))
    assert calls == 6
    # Written in calls of ten: each call's changes come before the next call's.
    assert [seen.index(n) // 10 for n in names[::10]] == [0, 1, 2, 3, 4, 5]
    write(store, "e000", definition(every=3), 1)
    assert [d.name for d in store.changes(cursor, limit=10).changed] == ["e000"]


def test_a_cursor_read_to_the_head_answers_the_changes_made_while_every_definition_was_read(
        store: Store) -> None:
    """A reader that reloads takes the head first, then reads every definition: what
    changes meanwhile comes again in the feed (never lost)."""
    create(store, "a")
    cursor = head(store)
    listed = store.definitions()
    create(store, "b")  # while the reader pages
    write(store, "a", definition(every=9), 1)
    assert [d.name for d in listed] == ["a"]
    assert sorted(d.name for d in store.changes(cursor).changed) == ["a", "b"]


# -- reload -------------------------------------------------------------------------------
def test_a_tombstone_leaves_the_feed_after_its_keep_and_an_older_cursor_reloads(
        store: Store) -> None:
    assert store.tombstones_kept_ms == 24 * 3600 * 1000  # a day, unless a test says less
    store.tombstones_kept_ms = 50
    old = head(store)
    create(store, "a")
    write(store, "a", None, 1)
    current, names = drain(store, old)
    assert names == ["a"]
    deleted_at = store.definitions(["a"])[0].changed_at
    poll(lambda: store.heartbeat(A, TTL).now > deleted_at + 50, 5, "the keep to pass")
    # Later writes drop the tombstones older than the keep from the feed (on Redis, the
    # next write of the tombstone's bucket: these reach every bucket).
    later = [f"later-{i}" for i in range(200)]
    store.write_definitions([DefinitionWrite(n, definition(), 0, Origin.API, "ops")
                             for n in later])
    behind = store.changes(old)
    assert behind.reload and behind.changed == ()
    # The cursor that read the tombstone goes on; the tombstone stays on its entry.
    ahead = store.changes(current)
    assert not ahead.reload and sorted(d.name for d in ahead.changed) == sorted(later)
    [a] = store.definitions(["a"])
    assert a.deleted and a.version == 2
    # The reload's cursor follows from the head.
    assert store.changes(behind.cursor).changed == ()


def test_a_pruned_entry_leaves_the_feed_and_a_cursor_that_had_not_read_its_delete_reloads(
        store: Store) -> None:
    old = head(store)
    create(store, "a")
    create(store, "b")
    write(store, "a", None, 1)
    current, _ = drain(store, old)
    assert store.forget(["a"]) == ["a"]
    assert store.changes(old).reload
    assert store.changes(current) == Changes(current, (), False, True)


def test_entries_pruned_one_after_another_each_leave_the_feed(store: Store) -> None:
    """Each prune raises the feed's dropped mark to the number the entry had in it: the
    mark stays readable, so the next prune and the feed work as the first did."""
    old = head(store)
    names = ["a", "b", "c", "d"]
    for name in names:
        create(store, name)
        write(store, name, None, 1)
    current, _ = drain(store, old)
    for name in names:
        assert store.forget([name]) == [name], name
        assert store.changes(old).reload, name
        assert store.changes(current) == Changes(current, (), False, True), name


def test_a_wiped_store_answers_reload(store: Store, backend: Backend) -> None:
    cursor = head(store)
    create(store, "a")
    cursor, _ = drain(store, cursor)
    backend.wipe(store)
    answer = answered(store, lambda: store.changes(cursor))
    assert answer.reload and answer.changed == ()
    assert answered(store, lambda: store.changes(answer.cursor)).changed == ()


def test_a_store_put_back_from_an_older_copy_answers_reload_after_more_writes_too(
        store: Store, backend: Backend) -> None:
    cursor = head(store)
    create(store, "a")
    put_back = backend.copy(store)
    create(store, "b")
    write(store, "a", definition(every=2), 1)
    cursor, names = drain(store, cursor)
    assert names == ["b", "a"]
    put_back()
    answer = answered(store, lambda: store.changes(cursor))
    assert answer.reload, answer  # the feed is behind the cursor
    # Written again since (the copy numbers on from its clock): still behind the cursor,
    # which read a change the store no longer holds.
    assert answered(store, lambda: write(store, "c", definition(), 0)).status is (
        WriteStatus.OK)
    assert store.changes(cursor).reload
    assert [d.version for d in store.definitions(["a"])] == [1]
    fresh = store.changes(answer.cursor)
    assert [d.name for d in fresh.changed] == ["c"] and not fresh.reload


def test_a_cursor_of_another_shape_answers_reload(store: Store) -> None:
    create(store, "a")
    answer = store.changes(ChangeCursor(((5, "x", 5),) * 3))
    assert answer.reload and answer.changed == ()
    assert store.changes(answer.cursor).changed == ()


@pytest.mark.parametrize("limit", [0, -1, MAX_PAGE + 1, 2.5])
def test_a_limit_out_of_bounds_is_refused_naming_it(store: Store, limit: int) -> None:
    cursor = head(store)
    with pytest.raises(ValueError, match="limit"):
        store.changes(cursor, limit)
    if limit:  # (a page of no definitions is an empty one)
        with pytest.raises(ValueError, match="limit"):
            store.definitions(limit=limit)
    assert store.definitions(limit=0) == []
    assert len(store.changes(cursor, MAX_PAGE).changed) == 0



def test_a_reader_whose_reload_fails_midway_reads_every_definition_again_next_time(
        store: Store, backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A beat that is told to reload (the store went back) and loses a page's reply while
    it reads every definition again neither keeps the part it read as all there is nor
    moves its cursor past the reload: the next read reloads, and it knows every entry."""
    import logging

    from beat_claims.beat import stored

    monkeypatch.setattr(stored, "PAGE", 2)
    names = [f"entry-{i}" for i in range(7)]
    for name in names:
        create(store, name)
    put_back = backend.copy(store)
    create(store, "written-after-the-copy")
    reader = stored.StoredEntries(store, logging.getLogger("test"))
    reader.refresh()
    assert sorted(reader.known) == sorted([*names, "written-after-the-copy"])
    put_back()
    answered(store, lambda: store.changes(reader.cursor))
    real, lost = store.definitions, [False]

    def lose_the_second_page(*args: object, **kwargs: object) -> object:
        answer = real(*args, **kwargs)  # type: ignore[arg-type]
        if kwargs.get("after", args[1] if len(args) > 1 else "") and not lost[0]:
            lost[0] = True
            raise StoreError("the reply was lost")
        return answer

    monkeypatch.setattr(store, "definitions", lose_the_second_page)
    with pytest.raises(StoreError):
        reader.refresh()
    assert lost[0]
    reader.refresh()
    assert sorted(reader.known) == sorted(names), sorted(reader.known)
