"""live_runs and open_runs: what a sweep finds from the records alone."""

from __future__ import annotations

from beat_claims.enums import RunState
from beat_claims.runs import Owner
from beat_claims.stores.base import Outcome, Reclaim, Release, Store
from beat_claims.stores.redis import RedisStore

from .helpers import (
    LONG_AGO,
    A,
    B,
    C,
    after,
    claims,
    now,
    one_claim,
    process,
    query,
    register,
    run,
    send,
    sending,
    started,
    take,
)


def held(store: Store, live: tuple[Owner, ...] = (), held_before: int = LONG_AGO,
         mine_before: int = LONG_AGO, dead_before: int = LONG_AGO
         ) -> set[tuple[str, int, str]]:
    """The held claims C's sweep is told about."""
    found = store.live_runs(query(C, live, held_before, mine_before, dead_before))
    return {(h.entry, h.due, h.owner) for h in found.held}


def test_runs_due_again_are_listed_whatever_made_them_due(store: Store) -> None:
    released, reclaimed, taken = claims(store, A, 1000, 2000, 3000)
    store.release(A, [Release(released)])
    store.reclaim([Reclaim("e", reclaimed.due, reclaimed.token)], B.id)
    requested = store.request_run("e", "operator:alice")
    assert requested is not None
    found = store.live_runs(query(C))
    assert sorted((r.entry, r.due) for r in found.due) == sorted(
        [("e", released.due), ("e", reclaimed.due), ("e", requested)])
    assert found.held == () and found.complete
    # Claimed again: no longer due.
    take(store, B)
    assert store.live_runs(query(C)).due == ()
    assert taken.due not in {r.due for r in found.due}


def test_a_held_claim_is_reported_with_its_owner_token_and_since(store: Store) -> None:
    c = one_claim(store, A)
    claimed_at = run(store, c).claimed_at
    assert claimed_at is not None
    [h] = store.live_runs(query(C, held_before=after(store, claimed_at))).held
    assert (h.entry, h.due, h.token, h.owner, h.since) == ("e", c.due, c.token, A.id,
                                                           claimed_at)


def test_claims_of_an_owner_not_live_are_reported_once_older_than_dead_before(
        store: Store) -> None:
    c = one_claim(store, A)
    at = run(store, c).claimed_at
    assert at is not None
    # A is not live, but it may have registered since the caller read who is: a grace.
    assert held(store, live=(B, C), dead_before=at) == set()
    assert held(store, live=(B, C), dead_before=at + 1) == {("e", c.due, A.id)}
    # Live, it is not reported by this rule.
    assert held(store, live=(A, C), dead_before=at + 1) == set()


def test_claims_older_than_held_before_are_reported_whoever_holds_them(store: Store) -> None:
    a = one_claim(store, A, entry="a")
    c = one_claim(store, C, entry="c")
    latest = max(run(store, a).claimed_at or 0, run(store, c).claimed_at or 0)
    cutoff = after(store, latest)
    assert held(store, live=(A, C), held_before=cutoff) == {("a", a.due, A.id),
                                                           ("c", c.due, C.id)}
    assert held(store, live=(A, C), held_before=LONG_AGO) == set()


def test_the_callers_own_claims_are_reported_once_older_than_mine_before(
        store: Store) -> None:
    mine = one_claim(store, C, entry="mine")
    theirs = one_claim(store, A, entry="theirs")
    cutoff = after(store, max(run(store, mine).claimed_at or 0,
                              run(store, theirs).claimed_at or 0))
    assert held(store, live=(A, C), mine_before=cutoff) == {("mine", mine.due, C.id)}
    # The caller's own claims are never "dead": only mine_before and held_before apply.
    assert held(store, live=(), dead_before=cutoff) == {("theirs", theirs.due, A.id)}


def test_young_claims_of_live_owners_are_not_reported(store: Store) -> None:
    one_claim(store, A, entry="a")
    one_claim(store, C, entry="c")
    t = now(store)
    old = t - 60_000
    assert held(store, live=(A, C), held_before=old, mine_before=old, dead_before=t + 1) == set()


def test_a_check_restarts_the_time_a_claim_is_held_since(store: Store) -> None:
    c = one_claim(store, A)
    cutoff = after(store, run(store, c).claimed_at or 0)
    after(store, cutoff)
    sending(store, A, c)  # checked after the cutoff
    assert held(store, live=(A,), held_before=cutoff) == set()
    [h] = store.live_runs(query(C, held_before=now(store) + 1)).held
    assert h.since > cutoff


def test_a_taken_run_is_held_since_its_new_claim(store: Store) -> None:
    c = sending(store, A, one_claim(store, A))  # checked long before it is taken
    store.reclaim([Reclaim("e", c.due, c.token)], B.id)
    cutoff = after(store, now(store))
    after(store, cutoff)
    [again] = take(store, B)
    assert held(store, live=(B,), held_before=cutoff) == set()
    [h] = store.live_runs(query(C, held_before=now(store) + 1)).held
    assert (h.owner, h.token) == (B.id, again.token) and h.since > cutoff


def test_runs_no_longer_held_are_not_reported(store: Store) -> None:
    sent, finished, released = claims(store, A, 1000, 2000, 3000)
    send(store, A, sent)
    send(store, A, finished)
    started(store, finished, process(1))
    store.finish([Outcome("e", finished.due, finished.token, RunState.DONE)])
    store.release(A, [Release(released)])
    found = store.live_runs(query(C, held_before=now(store) + 1))
    assert found.held == ()
    assert [(r.entry, r.due) for r in found.due] == [("e", released.due)]


def test_a_limit_cuts_the_answer_short_and_says_so(store: Store) -> None:
    names = [f"entry-{i}" for i in range(40)]
    states = register(store, *names)
    for name in names[:20]:
        c = one_claim(store, A, entry=name)
        store.release(A, [Release(c)])
    for name in names[20:]:
        one_claim(store, A, entry=name)
    cutoff = now(store) + 1
    full = store.live_runs(query(C, held_before=cutoff))
    assert (len(full.due), len(full.held), full.complete) == (20, 20, True)
    cut = store.live_runs(query(C, held_before=cutoff, limit=5))
    assert len(cut.due) <= 5 and len(cut.held) <= 5
    assert not cut.complete
    assert {r.entry for r in cut.due} <= set(names[:20])
    assert {h.entry for h in cut.held} <= set(names[20:])
    assert len(states) == 40


# -- open runs ----------------------------------------------------------------------------
def test_open_runs_lists_sent_and_started_runs_oldest_first(store: Store) -> None:
    first, second, third, unsent, finished = claims(store, A, 1000, 2000, 3000, 4000, 5000)
    for c in (first, second, third, finished):
        after(store, now(store))  # one millisecond each: distinct instants
        send(store, A, c)
    started(store, second, process(1))
    started(store, finished, process(1))
    store.finish([Outcome("e", finished.due, finished.token, RunState.DONE)])
    sending(store, A, unsent)
    found = store.open_runs(before=now(store) + 1)
    assert [(o.entry, o.due, o.token, o.state) for o in sorted(found, key=lambda o: o.due)] == [
        ("e", first.due, first.token, RunState.SENT),
        ("e", second.due, second.token, RunState.STARTED),
        ("e", third.due, third.token, RunState.SENT)]
    assert [o.since for o in found] == sorted(o.since for o in found)
    assert {o.due: o.task_id for o in found}[first.due] == run(store, first).task_id
    assert run(store, first).task_id


def test_open_runs_is_bounded_by_after_before_and_limit_and_works_as_a_cursor(
        store: Store) -> None:
    sent = []
    for i in range(6):
        c = one_claim(store, A, 1000 * (i + 1), entry=f"e{i % 3}")
        after(store, now(store))
        sent.append(send(store, A, c))
    everything = store.open_runs(before=now(store) + 1)
    assert [(o.entry, o.due) for o in everything] == [(c.entry, c.due) for c in sent]
    since = [o.since for o in everything]
    assert since == sorted(since) and len(set(since)) == 6
    # (after, before) are both exclusive.
    inner = store.open_runs(before=since[4], after=since[1])
    assert [o.due for o in inner] == [sent[2].due, sent[3].due]
    assert store.open_runs(before=since[0]) == []
    # A cursor: each call goes on after the last one's newest.
    pages, cursor = [], None
    while True:
        page = store.open_runs(before=since[-1] + 1, after=cursor, limit=4)
        if not page:
            break
        assert len(page) <= 4
        pages.append(page)
        cursor = page[-1].since
    assert [len(p) for p in pages] == [4, 2]
    assert [o for p in pages for o in p] == everything


def test_open_runs_since_is_the_last_activity(store: Store) -> None:
    c = send(store, A, one_claim(store, A))
    [sent] = store.open_runs(before=now(store) + 1)
    assert sent.since == run(store, c).sent_at
    after(store, sent.since)
    started(store, c, process(1))
    [running] = store.open_runs(before=now(store) + 1)
    assert running.state is RunState.STARTED
    assert running.since == run(store, c).started_at and running.since > sent.since
    # A run that is no longer active is no longer open.
    store.finish([Outcome("e", c.due, c.token, RunState.FAILED, exc_type="Boom")])
    assert store.open_runs(before=now(store) + 1) == []


def test_entry_names_are_reported_exactly_as_registered(store: Store) -> None:
    names = ["a|b|c", "{tag}", "}{", "ünïcødé", "with space", "x" * 300]
    for name in names:
        due, _held, sent = claims(store, A, 1000, 2000, 3000, entry=name)
        store.release(A, [Release(due)])
        send(store, A, sent)
    found = store.live_runs(query(C, held_before=now(store) + 1))
    assert sorted(r.entry for r in found.due) == sorted(names)
    assert sorted(h.entry for h in found.held) == sorted(names)
    assert sorted(o.entry for o in store.open_runs(before=now(store) + 1)) == sorted(names)
    assert sorted(e.name for e in store.entries()) == sorted(names)


def test_a_heartbeat_asked_a_sweep_answers_it_as_live_runs_does_or_leaves_it(
        store: Store) -> None:
    """An idle beat's heartbeat and sweep are one call where the backend can make them one
    round trip: the answer is the records', read after the heartbeat was written (so the
    caller's own liveness is already renewed). A backend that cannot leaves ``live`` None
    (the caller asks apart)."""
    released, held_by_a = claims(store, A, 1000, 2000)
    store.release(A, [Release(released)])
    cutoff = after(store, run(store, held_by_a).claimed_at or 0)
    sweep = query(C, live=(C,), dead_before=cutoff)
    hb = store.heartbeat(C, 30, sweep=sweep)
    assert C.id in {o.owner.id for o in hb.owners if o.alive}
    # One Redis server makes them one round trip (a cluster, SQLite and PostgreSQL do not).
    assert (hb.live is not None) is (isinstance(store, RedisStore) and store.single_node)
    if hb.live is not None:
        assert [(r.entry, r.due) for r in hb.live.due] == [("e", released.due)]
        assert [(h.entry, h.due, h.owner) for h in hb.live.held] == [
            ("e", held_by_a.due, A.id)]
        assert hb.live == store.live_runs(sweep)
    # Without a query, the heartbeat reads no runs.
    assert store.heartbeat(C, 30).live is None
