"""Who schedules an entry: the beats that registered it (its registrants). A prune
(``forget``) never removes an entry a live beat registered; a registration drops the
registrants whose heartbeat lapsed, so the list stays bounded by the live beats."""

from __future__ import annotations

import pytest

from beat_claims.runs import Owner
from beat_claims.stores.base import EntrySeed, Store

from .conftest import Backend
from .helpers import A, B, C, after, now, owner, register


def registered(store: Store, who: Owner, *names: str) -> None:
    """``who`` is alive, and registers ``names`` as a beat that schedules them does."""
    store.heartbeat(who, 60)
    store.register([EntrySeed(name, "every 1s") for name in names], who)


def stopped(store: Store, *beats: Owner) -> None:
    """``beats`` stopped (their heartbeat lapsed), and the store's clock moved on: a
    registrant recorded in the same millisecond as a read of the live beats counts as
    alive (it may have started in between), whatever its heartbeat."""
    for beat in beats:
        store.leave(beat)
    after(store, now(store))


def registrants(store: Store, name: str = "e") -> set[str] | None:
    [found] = store.entries([name])
    return None if found.registrants is None else {r.owner for r in found.registrants}


def test_a_beat_that_registers_an_entry_is_one_of_its_registrants(store: Store) -> None:
    registered(store, A, "e", "f")
    registered(store, B, "e")
    assert registrants(store, "e") == {A.id, B.id}
    assert registrants(store, "f") == {A.id}
    [found] = store.entries(["e"])
    assert found.registrants is not None
    now = store.heartbeat(A, 60).now
    assert all(0 < r.at <= now for r in found.registrants), found.registrants


def test_registering_twice_after_a_lost_reply_lists_the_beat_once(store: Store) -> None:
    registered(store, A, "e")
    registered(store, A, "e")
    [found] = store.entries(["e"])
    assert found.registrants is not None
    assert [r.owner for r in found.registrants] == [A.id]


def test_registrants_whose_heartbeat_lapsed_are_dropped_at_the_next_registration(
        store: Store) -> None:
    registered(store, A, "e")
    registered(store, B, "e")
    stopped(store, A)
    registered(store, C, "e")
    assert registrants(store) == {B.id, C.id}
    # Bounded by the live beats: a fleet restarted many times keeps the live ones only.
    for n in range(10, 20):
        beat = owner(n)
        registered(store, beat, "e")
        stopped(store, beat)
    registered(store, A, "e")
    assert registrants(store) == {A.id, B.id, C.id}


def test_an_entry_a_live_beat_registered_is_not_forgotten(store: Store) -> None:
    registered(store, A, "e")
    registered(store, B, "e")
    assert store.forget(["e"]) == []
    stopped(store, A)
    assert store.forget(["e"]) == []  # B still schedules it
    stopped(store, B)
    assert store.forget(["e"]) == ["e"]
    assert "e" not in {found.name for found in store.entries()}


def test_forget_twice_after_a_lost_reply_answers_what_it_did(store: Store) -> None:
    registered(store, A, "kept", "gone")
    store.unregister(A, ["gone"])
    assert store.forget(["kept", "gone"]) == ["gone"]
    assert store.forget(["kept", "gone"]) == []  # removed the first time: nothing more
    assert registrants(store, "kept") == {A.id}


def test_a_beat_that_no_longer_schedules_an_entry_withdraws_it(store: Store) -> None:
    registered(store, A, "e", "f")
    store.unregister(A, ["e", "never-seen"])
    store.unregister(A, ["e"])  # again, after a lost reply: no harm
    assert registrants(store, "e") == set()  # known: nobody
    assert registrants(store, "f") == {A.id}
    assert store.forget(["e", "f"]) == ["e"]


def test_an_entry_registered_without_a_beat_has_no_registrants_known(store: Store) -> None:
    """Registered as beat-claims 0.1 did (no owner): nobody is known to schedule it, and a
    prune judges it by the schedule alone, as before."""
    register(store, "e")
    assert registrants(store) is None
    registered(store, A, "f")
    assert store.forget(["e"]) == ["e"]


@pytest.mark.parametrize("raw", ['{"owner-1": "yesterday"}', "[1, 2]", "not json"])
def test_registrants_that_cannot_be_read_keep_the_entry_until_a_beat_registers_it(
        store: Store, backend: Backend, raw: str) -> None:
    registered(store, A, "e")
    register(store, "f")
    stopped(store, A)
    backend.corrupt_entry_field(store, "e", "registrants", raw)
    assert registrants(store, "e") is None
    # Nothing is destroyed that cannot be seen; the other entries are judged as usual.
    assert store.forget(["e", "f"]) == ["f"]
    registered(store, B, "e")  # repaired
    assert registrants(store, "e") == {B.id}
    stopped(store, B)
    assert store.forget(["e"]) == ["e"]
