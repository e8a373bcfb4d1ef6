"""A beat that joins a fleet claims nothing until every beat the store shows alive has
heartbeated since it started, or lapsed, then heartbeats once more; after a store silent
for longer than a TTL, it waits a TTL (beat/liveness.py, Joining). At those heartbeats the
running beats find out whether the store still holds what they wrote: a store put back
from an older copy keeps its epoch, and a beat that finds its newest writes lost has the
store begin a new epoch in that heartbeat's own step, in which everyone registers again
what it knows. Schedulers ticked in this process against a real redis-server."""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from datetime import timedelta
from typing import Any

import pytest

from beat_claims.scheduler import Scheduler
from beat_claims.stores.base import Reclaim

from .conftest import RedisServer
from .inprocess import make, make_app, messages, occurrences_sent, run_for
from .processes import wait_for

#: The first beat of each test starts on a store that has run a while (its epoch settled),
#: claiming at once rather than after a new store's settle period (6 s at an interval of
#: 2 s): what is tested is how the beats after it join.
pytestmark = pytest.mark.usefixtures("settled_store")


def claim_calls(s: Scheduler) -> list[float]:
    """The monotonic instants of ``s``'s claims of new occurrences from now on."""
    calls: list[float] = []
    real = s.store.claim

    def claim(owner: Any, plans: Any) -> Any:
        if any(p.claim for p in plans):
            calls.append(time.monotonic())
        return real(owner, plans)

    s.store.claim = claim  # type: ignore[method-assign]
    return calls


def joined_at(s: Scheduler) -> list[float]:
    """The monotonic instant of the heartbeat at which ``s`` joined (filled then)."""
    at: list[float] = []
    real = s.liveness.beat

    def beat(*args: Any, **kwargs: Any) -> bool:
        try:
            return real(*args, **kwargs)
        finally:
            if s.liveness.join.joined and not at:
                at.append(time.monotonic())

    s.liveness.beat = beat  # type: ignore[method-assign]
    return at


def test_a_beat_claims_nothing_until_the_running_one_has_heartbeated_since_it_started(
        server: RedisServer) -> None:
    app = make_app(server, beat_claims_heartbeat_interval=2)  # a TTL of 6 s
    a = make(app)
    b = Scheduler(app=app)
    calls, at = claim_calls(b), joined_at(b)
    try:
        b.tick()  # its first heartbeat: a is alive
        assert a.owner.id in b.liveness.join.waiting_for
        run_for(2.5, b)  # a second heartbeat of b's; a has not heartbeated (nor lapsed)
        assert not b.liveness.join.joined and calls == [], calls
        a.liveness.lapse()
        a.tick()  # a heartbeats (and checks the store still holds what it wrote)
        heartbeat = time.monotonic()
        wait_for(lambda: calls, 10, "b to claim", interval=0.02, between=b.tick)
        assert at and at[0] - heartbeat >= 0.5, "b heartbeats once more before it claims"
        assert calls[0] >= at[0]
    finally:
        a.close()
        b.close()


def test_a_beat_that_joins_beside_a_silent_one_waits_until_its_heartbeat_lapses(
        server: RedisServer) -> None:
    """A beat silent for less than its TTL is alive (late, on a loaded host): it has still
    to find out whether the store went back, so a beat that joins waits for it until its
    heartbeat lapses (a replacement for a beat killed on another host waits as long as
    that beat's claims do), and claims soon after."""
    app = make_app(server, beat_claims_heartbeat_interval=2)  # a TTL of 6 s
    a = make(app)  # then never ticked again: stalled, or killed
    b = Scheduler(app=app)
    calls = claim_calls(b)
    try:
        b.tick()
        began = b.liveness.join.began
        assert began is not None and a.owner.id in b.liveness.join.waiting_for
        [expiry] = [o.expires_at for o in b.liveness.owners if o.owner.id == a.owner.id]
        lapses_in = (expiry - b.clock.now()) / 1000
        wait_for(lambda: calls, 15, "b to claim", interval=0.02, between=b.tick)
        waited = calls[0] - began
        assert lapses_in - 0.3 <= waited < lapses_in + 2, (waited, lapses_in)
        assert a.owner.id not in {o.owner.id for o in b.liveness.owners if o.alive}
    finally:
        b.close()


def test_a_beat_that_joins_a_store_silent_for_longer_than_a_ttl_waits(
        server: RedisServer) -> None:
    """No beat alive, and the store's last heartbeat older than a TTL: a fleet that was
    stopped, or an older copy put back under running beats (the copy does not show them),
    which heartbeat within their TTL and find it out."""
    interval = 0.5  # a TTL of 1.5 s
    app = make_app(server, beat_claims_heartbeat_interval=interval)
    a = make(app)
    a.close()
    quiet_from = a.clock.now()
    wait_for(lambda: a.clock.now() > quiet_from + 1600, 5, "the store to be silent a TTL")
    b = Scheduler(app=app)
    calls, at = claim_calls(b), joined_at(b)
    try:
        b.tick()
        first = time.monotonic()
        assert not b.liveness.join.joined
        wait_for(lambda: calls, 10, "b to claim", interval=0.02, between=b.tick)
        assert at and at[0] - first >= b.liveness.ttl, (at[0] - first)
        assert calls[0] >= at[0]
    finally:
        b.close()


def test_a_beat_restarted_while_the_store_heartbeats_joins_at_its_first_heartbeat(
        server: RedisServer) -> None:
    app = make_app(server)
    a = make(app)
    a.close()  # (it left: not alive)
    b = Scheduler(app=app)
    try:
        b.tick()
        assert b.liveness.join.joined
    finally:
        b.close()


def test_keys_put_back_from_an_older_copy_are_noticed_at_the_next_heartbeat(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """Every key of the store is put back as it was a while ago (DUMP, then RESTORE on the
    same server: its epoch and identity are the copy's, the same as now). The beat finds at
    its next heartbeat that the store no longer holds its newest claim, starts a new epoch
    and registers what it knows: no occurrence it sent is sent again, no token is used for
    two occurrences."""
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=0.5)}})
    a = make(app)
    store = server.client()
    try:
        wait_for(lambda: occurrences_sent(server), 5, "a first occurrence sent",
                 interval=0.02, between=a.tick)
        copy = {key: store.dump(key) for key in store.keys("*")}
        sent = len(occurrences_sent(server))
        wait_for(lambda: len(occurrences_sent(server)) >= sent + 3, 5,
                 "three more occurrences sent", interval=0.02, between=a.tick)
        logged = put_back(server, copy, a, caplog)
        assert "no longer holds what this beat wrote" in logged, logged
        run_for(3, a)  # settled, and claiming again
        assert len(occurrences_sent(server)) > sent + 3
    finally:
        a.close()
    nothing_twice(server)


def test_a_sent_mark_the_store_lost_is_noticed_and_the_run_is_not_sent_again(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """The store is put back to just before the beat's newest sent mark: its checkpoint,
    counter and epoch are as they are now, and the run is 'sending' under the beat's own
    token again, as if the beat had died before it was published. The beat finds at its
    next heartbeat that the store lost the mark, and registers the run as sent: it never
    takes it for a claim of its own to send."""
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1)}})
    a = make(app)
    store = server.client()
    copies: list[dict[bytes, Any]] = []
    real = a.store.record_sent

    def record_sent(owner: Any, claims: Any) -> int:
        copies.append({key: store.dump(key) for key in store.keys("*")})
        return real(owner, claims)

    a.store.record_sent = record_sent  # type: ignore[method-assign]
    try:
        wait_for(lambda: len(copies) >= 2, 10, "two sent marks", interval=0.02,
                 between=a.tick)
        sent = len(occurrences_sent(server))
        logged = put_back(server, copies[-1], a, caplog)
        assert "its sent mark" in logged, logged
        run_for(3, a)  # settled, and claiming again
        assert len(occurrences_sent(server)) > sent
    finally:
        a.close()
    nothing_twice(server)


def test_a_sent_mark_the_store_refused_is_not_taken_for_one_it_lost(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """Another beat takes the run back (due again, with the same token) while this one
    publishes it: the store refuses its sent mark. That mark was never the store's to
    lose: the next heartbeat must not take the store for an older copy (a new epoch for
    the whole fleet, every beat registering again what it knows)."""
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1)}})
    a = make(app)
    real = a._publish
    taken_back: list[Any] = []

    def publish(entry: Any, claim: Any, task_id: str) -> Any:
        if not taken_back:  # as a beat that took this one for dead would
            taken_back.extend(a.store.reclaim([Reclaim(claim.entry, claim.due, claim.token)],
                                              "another-beat"))
        return real(entry, claim, task_id)

    a._publish = publish  # type: ignore[method-assign]
    try:
        wait_for(lambda: taken_back, 10, "a publish", interval=0.02, between=a.tick)
        assert taken_back == [True]
        epoch = a.liveness.epoch
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="celery.beat.claims"):
            a.liveness.lapse()
            a.tick()  # its heartbeat first: the run is still due, with its token
        assert a.liveness.epoch == epoch, caplog.text
        assert "no longer holds" not in caplog.text, caplog.text
    finally:
        a.close()


def put_back(server: RedisServer, copy: dict[bytes, Any], s: Scheduler,
             caplog: pytest.LogCaptureFixture) -> str:
    """Every key of the store as in ``copy`` (DUMPed); ``s`` heartbeats at its next tick,
    and starts a new epoch. Returns what it logged meanwhile."""
    store = server.client()
    epoch = s.liveness.epoch
    store.flushdb()
    for key, value in copy.items():
        store.restore(key, 0, value, replace=True)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="celery.beat.claims"):
        s.liveness.lapse()
        wait_for(lambda: s.liveness.epoch != epoch, 5, "a new epoch", interval=0.02,
                 between=s.tick)
    return caplog.text


def nothing_twice(server: RedisServer) -> None:
    """No occurrence was published twice, no token for two occurrences."""
    sent_twice = {k: n for k, n in Counter(occurrences_sent(server)).items() if n > 1}
    assert sent_twice == {}
    dues_of: dict[Any, set[str]] = defaultdict(set)
    for m in messages(server):
        if m["claims"]:
            dues_of[m["claims"]["token"]].add(m["claims"]["due"])
    assert {t: d for t, d in dues_of.items() if len(d) > 1} == {}
