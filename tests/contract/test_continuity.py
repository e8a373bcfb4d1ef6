"""heartbeat(continuity=...): a store that went back begins a new epoch in the heartbeat's
own step. A running beat passes what it saw at its last heartbeat (the epoch, the store's
clock then, whether its record was renewed within a TTL) with its newest writes; a store
that no longer shows them (a write lost, the record missing, an epoch that began before
that heartbeat while the beat saw another) answers ``went_back`` with a new epoch that
settles, in the same step as the renewal: any heartbeat that reads the renewal reads the
new epoch too (a beat joining meanwhile never claims what the copy lost). A store that
shows them, a record that cannot be read, or a caller that resyncs or settles begins
nothing."""

from __future__ import annotations

import time

from beat_claims.runs import Owner
from beat_claims.stores.base import Continuity, Heartbeat, Store, StoreError, Written

from .conftest import Backend
from .helpers import A, B, at_once, claims, one_claim

TTL = 10.0


def seen(hb: Heartbeat, renewed: bool = True) -> Continuity:
    return Continuity(hb.epoch, hb.now, renewed)


def expiry_of(hb: Heartbeat, owner_id: str) -> int:
    [expiry] = [o.expires_at for o in hb.owners if o.owner.id == owner_id]
    return expiry


def test_a_store_that_shows_the_caller_s_continuity_begins_nothing(store: Store) -> None:
    c = one_claim(store, A)
    last = store.heartbeat(A, TTL)
    hb = store.heartbeat(A, TTL, written=[Written(c.entry, c.due, c.token)],
                         continuity=seen(last))
    assert not hb.went_back and hb.lost == ()
    assert hb.epoch == last.epoch and hb.epoch_since == last.epoch_since


def test_a_lost_write_begins_a_new_epoch_with_the_renewal(store: Store,
                                                          backend: Backend) -> None:
    c = one_claim(store, A)
    last = store.heartbeat(A, TTL)
    joiner = store.heartbeat(B, TTL)
    backend.corrupt_entry_field(store, "e", "token", str(c.token - 1))  # an older copy's
    hb = store.heartbeat(A, TTL, written=[Written(c.entry, c.due, c.token)],
                         continuity=seen(last))
    assert hb.went_back and hb.lost == (Written(c.entry, c.due, c.token),)
    assert hb.epoch != last.epoch and hb.epoch_since is not None
    assert hb.settle_until is not None and hb.settle_until >= hb.now + TTL * 1000
    # Another beat that reads the renewal reads the new epoch, settling, with it.
    after = store.heartbeat(B, TTL, continuity=seen(joiner))
    assert expiry_of(after, A.id) == expiry_of(hb, A.id)  # (in one ms: no later than before)
    assert after.epoch == hb.epoch and not after.went_back
    assert after.settle_until == hb.settle_until


def test_a_beat_s_record_missing_a_moment_after_its_renewal_begins_a_new_epoch(
        store: Store) -> None:
    """A copy taken before the beat started has no record of it; one renewed more than a
    TTL ago may be forgotten (it lapsed): that says nothing."""
    first = store.heartbeat(A, TTL)
    stranger = Continuity(first.epoch, first.now, owner_renewed=False)
    quiet = store.heartbeat(B, TTL, continuity=stranger)
    assert not quiet.went_back and quiet.epoch == first.epoch
    never_seen = Owner(id="never-seen", host="contract-host", pid=7, started_at=1.0)
    hb = store.heartbeat(never_seen, TTL, continuity=seen(quiet))
    assert hb.went_back and hb.epoch != first.epoch


def test_an_epoch_that_began_before_the_caller_s_last_heartbeat_begins_a_new_one(
        store: Store) -> None:
    """A copy of an earlier epoch put back: the store shows an epoch other than the one
    the beat saw, begun before the beat's last heartbeat. One begun after it (a restart, a
    failover, another beat's resync) is the store's own new epoch: it is only settled
    for."""
    earlier = store.heartbeat(A, TTL)
    later = store.heartbeat(A, TTL)
    newer = store.heartbeat(B, TTL, resync=True)
    # A saw an epoch the store does not show, and the one it shows began after A looked:
    assert newer.epoch_since is not None and newer.epoch_since >= later.now
    hb = store.heartbeat(A, TTL, continuity=Continuity("gone", later.now, True))
    assert not hb.went_back and hb.epoch == newer.epoch
    # A saw "gone" after the store's epoch began: that epoch is an earlier one put back.
    seen_after = Continuity("gone", hb.now + 1, True)
    back = store.heartbeat(A, TTL, continuity=seen_after)
    assert back.went_back and back.epoch not in (earlier.epoch, newer.epoch)


def test_a_record_that_cannot_be_read_begins_nothing(store: Store,
                                                     backend: Backend) -> None:
    c, _ = claims(store, A, 1000, 2000)
    last = store.heartbeat(A, TTL)
    backend.corrupt_run(store, "e", c.due, '{"due": 1, "state": "claimed", "tok')
    hb = store.heartbeat(A, TTL, written=[Written(c.entry, c.due, c.token)],
                         continuity=seen(last))
    assert not hb.went_back and hb.epoch == last.epoch


def test_a_caller_that_resyncs_or_settles_is_not_judged(store: Store,
                                                        backend: Backend) -> None:
    """It registers what it knows: its continuity is not the store's to check."""
    c = one_claim(store, A)
    last = store.heartbeat(A, TTL)
    backend.corrupt_entry_field(store, "e", "token", str(c.token - 1))
    lost = [Written(c.entry, c.due, c.token)]
    settling = store.heartbeat(A, TTL, settling=True, written=lost, continuity=seen(last))
    assert not settling.went_back and settling.epoch == last.epoch
    resync = store.heartbeat(A, TTL, resync=True, written=lost, continuity=seen(last))
    assert not resync.went_back and resync.epoch != last.epoch


def test_a_store_whose_last_heartbeat_is_before_the_caller_s_begins_a_new_epoch(
        store: Store) -> None:
    """A copy taken before the caller's last heartbeat, which lost nothing else of the
    caller's (its record, its writes, the epoch are in the copy): the store's last
    heartbeat of any beat (beat_at, which only moves forward) is before the caller's."""
    first = store.heartbeat(A, TTL)
    other = store.heartbeat(B, TTL)
    assert other.last_beat is not None and other.last_beat >= first.now
    in_step = store.heartbeat(A, TTL, continuity=seen(first))  # (beat_at: B's, after)
    assert not in_step.went_back and in_step.epoch == first.epoch
    later = Continuity(in_step.epoch, in_step.now + 60_000, True)  # a copy's beat_at
    hb = store.heartbeat(A, TTL, continuity=later)
    assert hb.went_back and hb.epoch != first.epoch
    assert hb.settle_until is not None and hb.settle_until >= hb.now + TTL * 1000


def test_beats_heartbeating_at_once_never_find_their_last_heartbeat_gone(
        store: Store, backend: Backend) -> None:
    """The store's last heartbeat of any beat only moves forward, whatever the order in
    which heartbeats read the clock and commit: beats heartbeating at once (some settling,
    which check nothing) never find it before their own last heartbeat."""
    clients = [backend.reopen(store) for _ in range(4)]
    found: list[str] = []

    def beat(client: Store, i: int) -> None:
        owner = Owner(id=f"beat-{i}", host="contract-host", pid=100 + i, started_at=1.0)
        last = client.heartbeat(owner, TTL)
        deadline = time.monotonic() + 3
        try:
            while time.monotonic() < deadline:
                if i % 2:
                    last = client.heartbeat(owner, TTL, settling=True)
                    continue
                hb = client.heartbeat(owner, TTL, continuity=seen(last))
                if hb.went_back:
                    found.append(f"{owner.id}: last heartbeat {hb.last_beat}, its own"
                                 f" {last.now}")
                last = hb
        except StoreError as exc:
            found.append(f"{owner.id}: {exc}")

    at_once([lambda c=c, i=i: beat(c, i) for i, c in enumerate(clients)], clients)
    assert found == []
