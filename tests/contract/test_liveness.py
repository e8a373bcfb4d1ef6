"""heartbeat, leave and owners: the store's clock, who is alive, and the store's epoch
(which changes whenever the store may have lost writes)."""

from __future__ import annotations

from beat_claims.stores.base import ClaimStatus, Store

from .conftest import Backend
from .helpers import A, B, C, claim, now, one_claim, poll, register, run

TTL = 10.0
TTL_MS = int(TTL * 1000)


def alive(store: Store) -> dict[str, bool]:
    return {s.owner.id: s.alive for s in store.owners()}


def test_a_heartbeat_returns_the_store_clock_the_owners_and_an_epoch(store: Store) -> None:
    before = now(store)
    hb = store.heartbeat(A, TTL)
    assert before <= hb.now <= now(store)
    assert isinstance(hb.epoch, str) and hb.epoch
    statuses = {s.owner.id: s for s in hb.owners}
    assert statuses[A.id].owner == A
    assert statuses[A.id].alive
    assert abs(statuses[A.id].expires_at - (hb.now + TTL_MS)) <= 5
    second = store.heartbeat(B, TTL)
    assert second.now >= hb.now and second.epoch == hb.epoch
    assert {A.id, B.id} <= {s.owner.id for s in second.owners if s.alive}


def test_a_fresh_store_starts_an_epoch_that_settles_for_one_ttl(store: Store) -> None:
    first = store.heartbeat(A, TTL)
    assert first.settle_until is not None
    assert abs(first.settle_until - (first.now + TTL_MS)) <= 5
    # Later heartbeats are in the same epoch, and do not move its settling instant.
    again = store.heartbeat(B, TTL)
    assert (again.epoch, again.settle_until) == (first.epoch, first.settle_until)


def test_a_resync_starts_a_new_epoch_and_settles_again(store: Store) -> None:
    first = store.heartbeat(A, TTL)
    resync = store.heartbeat(B, 2 * TTL, resync=True)
    assert resync.epoch != first.epoch
    assert resync.settle_until is not None
    assert resync.settle_until >= resync.now + 2 * TTL_MS - 5
    after = store.heartbeat(A, TTL)
    assert (after.epoch, after.settle_until) == (resync.epoch, resync.settle_until)


def test_leave_makes_an_owner_not_alive_at_once(store: Store) -> None:
    store.heartbeat(A, TTL)
    store.heartbeat(B, TTL)
    store.leave(A)
    assert alive(store)[A.id] is False and alive(store)[B.id] is True
    statuses = {s.owner.id: s for s in store.heartbeat(B, TTL).owners}
    assert statuses[A.id].alive is False and statuses[B.id].alive is True
    store.leave(A)  # again: no harm
    store.leave(C)  # an owner never seen: no harm
    assert alive(store)[A.id] is False
    assert store.heartbeat(A, TTL).epoch  # back again: alive again
    assert alive(store)[A.id] is True


def test_a_heartbeat_lapses_after_its_ttl(store: Store) -> None:
    store.heartbeat(A, 1.0)  # (long enough to be read alive on a loaded CI machine)
    assert alive(store)[A.id] is True
    poll(lambda: alive(store)[A.id] is False, 10, "the heartbeat to lapse")
    [status] = [s for s in store.owners() if s.owner.id == A.id]
    assert status.expires_at <= now(store)


def test_a_restart_starts_a_new_epoch_and_keeps_the_records(store: Store,
                                                            backend: Backend) -> None:
    first = store.heartbeat(A, TTL)
    c = one_claim(store, A)
    backend.restart(store)
    poll(lambda: _answers(store), 10, "the store to answer after the restart")
    hb = store.heartbeat(A, TTL)
    assert hb.epoch != first.epoch
    # Settling began at the heartbeat that noticed the restart (B's, in _answers): a TTL
    # from then, give or take the time between the two heartbeats on a loaded machine.
    assert hb.settle_until is not None and hb.settle_until >= hb.now + TTL_MS - 500
    # It came back with its records, and every transition works on them.
    assert run(store, c).owner == A.id
    state = register(store, "e")["e"]
    assert claim(store, A, state, c.due + 1000).status is ClaimStatus.OK


def test_a_wipe_starts_a_new_epoch_and_settles(store: Store, backend: Backend) -> None:
    first = store.heartbeat(A, 2 * TTL)
    one_claim(store, A)
    backend.wipe(store)
    hb = store.heartbeat(B, TTL)
    assert hb.epoch != first.epoch
    assert hb.settle_until is not None and abs(hb.settle_until - (hb.now + TTL_MS)) <= 500
    # Everything is gone: the entry must be registered again before it is claimed.
    assert store.entries() == [] and store.history("e") == []
    assert claim(store, A, None).status is ClaimStatus.MISSING
    assert A.id not in {s.owner.id for s in hb.owners}


def test_owners_lists_every_beat_that_had_a_heartbeat(store: Store) -> None:
    assert [s for s in store.owners() if s.owner.id in (A.id, B.id)] == []
    store.heartbeat(A, TTL)
    store.heartbeat(B, TTL)
    store.leave(B)
    listed = {s.owner: s.alive for s in store.owners()}
    assert listed[A] is True and listed[B] is False


def _answers(store: Store) -> bool:
    """Whether the store answers a beat again: a beat's first call after an outage is its
    heartbeat (the store may refuse anything else until then, when its server changed)."""
    try:
        store.heartbeat(B, TTL)
    except Exception:
        return False
    return True
