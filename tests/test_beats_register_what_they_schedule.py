"""A beat records in the store the entries it schedules (it is their registrant): what an
operator's prune and run now go by. It withdraws one its schedule drops, and registers its
entries again when its heartbeat lapsed (another beat's registration may then have dropped
it as a dead one). Schedulers ticked in this process against the test's redis-server."""

from __future__ import annotations

from datetime import timedelta

from beat_claims.runs import Owner
from beat_claims.stores.base import EntrySeed, Store

from .conftest import RedisServer
from .inprocess import make, make_app
from .processes import wait_for

OTHER = Owner("0ther0beat0000000", "other-host", 4242, 1_796_000_000.0)
SCHEDULE = {name: {"task": "t.noop", "schedule": timedelta(hours=1)} for name in ("a", "b")}


def registrants(store: Store, name: str) -> set[str]:
    [found] = store.entries([name])
    return {r.owner for r in found.registrants or ()}


def test_a_beat_registers_its_entries_and_withdraws_one_its_schedule_drops(
        server: RedisServer) -> None:
    s = make(make_app(server, dict(SCHEDULE)))
    assert registrants(s.store, "a") == registrants(s.store, "b") == {s.owner.id}
    s.merge_inplace({"a": SCHEDULE["a"]})  # as a schedule source that changed does
    s.entries_changed()
    wait_for(lambda: registrants(s.store, "b") == set(), 10, "b to be withdrawn",
             between=s.tick)
    assert registrants(s.store, "a") == {s.owner.id}
    s.close()


def test_a_beat_whose_heartbeat_lapsed_registers_its_entries_again(
        server: RedisServer) -> None:
    s = make(make_app(server, dict(SCHEDULE), beat_claims_heartbeat_interval=0.2))
    # The beat stalls (no tick) until it looks dead; meanwhile another beat registers "a".
    wait_for(lambda: not any(o.alive for o in s.store.owners() if o.owner.id == s.owner.id),
             10, "the beat's heartbeat to lapse")
    s.store.heartbeat(OTHER, 60)
    s.store.register([EntrySeed("a", "every 1h")], OTHER)
    assert registrants(s.store, "a") == {OTHER.id}  # the stalled beat was dropped
    wait_for(lambda: registrants(s.store, "a") == {OTHER.id, s.owner.id}, 10,
             "the beat to register its entries again", between=s.tick)
    assert s.owner.id in registrants(s.store, "b")
    s.close()


def test_a_beat_reads_its_entries_definitions_again_once_registered_not_at_its_first_claim(
        server: RedisServer) -> None:
    """Registering tells a beat each entry's state, which goes with the definition in force
    at it: the definitions are read again right after, while the beat gets ready, so that
    the first burst after a start does not wait on every entry's definition."""
    s = make(make_app(server, dict(SCHEDULE)))
    assert s.claimer.states.keys() == {"a", "b"}
    assert not s.claimer.moved, sorted(s.claimer.moved)  # (nothing left to read at a claim)
    s.close()
