"""The Redis store, script by script, against a real redis-server."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import redis

from beat_claims.runs import Owner, RunState
from beat_claims.stores.base import Claim, ClaimRequest, EntryState
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer


def owner(n: int = 1) -> Owner:
    return Owner(id=f"owner-{n}", host="test-host", pid=1000 + n, started_at=1.0)


@pytest.fixture
def store(server: RedisServer) -> RedisStore:
    return RedisStore.from_url(server.url, "t")


def anchored(store: RedisStore, name: str = "e") -> EntryState:
    return store.ensure_entries([(name, "every 1s")])[name]


def claim(store: RedisStore, who: Owner, state: EntryState | None, *dues: int,
          skip: tuple[tuple[int, str], ...] = (), name: str = "e", overlap: str = "allow"):
    return store.claim(who, [ClaimRequest(name, state, list(dues), list(skip), overlap)],
                       100, store.now_ms())[0]


def test_anchor_is_set_once_by_the_first_beat(store: RedisStore) -> None:
    first = anchored(store)
    time.sleep(0.01)
    again = anchored(store)
    assert first == again
    assert first.checkpoint is None
    assert abs(first.anchor - store.now_ms()) < 5000


def test_claim_returns_fresh_tokens_and_moves_checkpoint_forward(store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    result = claim(store, owner(), state, a + 1000, a + 2000)
    assert [(c.due, c.token) for c in result.claims] == [(a + 1000, 1), (a + 2000, 2)]
    assert store.entry_info("e")["checkpoint"] == a + 2000
    # A stale view of the checkpoint is refused, and nothing is written.
    stale = claim(store, owner(2), state, a + 1000)
    assert stale.conflict == EntryState(a, a + 2000)
    assert stale.claims == []
    assert store.entry_info("e")["token"] == 2


def test_checkpoint_never_moves_back(store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    claim(store, owner(), state, a + 5000)
    # Even with the right expected state, an older occurrence is not handed out again.
    result = claim(store, owner(), EntryState(a, a + 5000), a + 3000)
    assert result.claims == []
    assert store.entry_info("e")["checkpoint"] == a + 5000


def test_skips_are_recorded_and_history_is_bounded(store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    result = store.claim(owner(), [ClaimRequest("e", state, [a + 3000],
                                                [(a + 1000, "catch_up"), (a + 2000, "catch_up")])],
                         2, store.now_ms())[0]
    assert result.skipped == [(a + 1000, "catch_up"), (a + 2000, "catch_up")]
    history = store.history("e")
    # Limit 2: the oldest final run was dropped; the claimed one is never dropped.
    assert [r.due for r in history] == [a + 3000, a + 2000]
    assert history[0].state is RunState.CLAIMED and history[1].state is RunState.SKIPPED


def _race(url: str, anchor: int, barrier: object, n: int, out: object) -> None:
    store = RedisStore.from_url(url, "t")
    barrier.wait()  # type: ignore[attr-defined]
    result = store.claim(owner(n), [ClaimRequest("e", EntryState(anchor, None), [anchor + 1000])],
                         100, store.now_ms())[0]
    out.put(len(result.claims))  # type: ignore[attr-defined]


def test_concurrent_claims_of_one_occurrence_exactly_one_wins(store: RedisStore,
                                                              server: RedisServer) -> None:
    state = anchored(store)
    ctx = multiprocessing.get_context("fork")
    n = 12
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(server.url, state.anchor, barrier, i, out))
             for i in range(n)]
    for p in procs:
        p.start()
    wins = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(10)
    assert sorted(wins) == [0] * (n - 1) + [1]
    runs = store.history("e")
    assert len(runs) == 1 and runs[0].token == 1


def test_only_the_token_holder_passes_the_check_before_publish(store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    mine = claim(store, owner(1), state, a + 1000).claims[0]
    # Another beat takes it over (owner 1 looked dead); owner 1's token is superseded.
    taken = store.reclaim(["e"], owner(1).id, owner(2), None)
    assert [(c.due, c.token) for c in taken] == [(a + 1000, 2)]
    ok, why = store.check_before_send(owner(1), mine, "tid")
    assert not ok and why == "superseded"
    ok, _ = store.check_before_send(owner(2), taken[0], "tid")
    assert ok
    assert store.mark_sent(taken[0])
    assert store.history("e")[0].state is RunState.SENT
    # A stale owner can never mark it sent either.
    assert not store.mark_sent(mine)


def test_release_only_by_owner_and_released_runs_stay_due(store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    claim(store, owner(1), state, a + 1000, a + 2000)
    assert store.release(owner(2), ["e"]) == 0
    assert store.release(owner(1), ["e"]) == 2
    assert {r.state for r in store.history("e")} == {RunState.DUE}
    assert store.release(owner(1), ["e"]) == 0  # idempotent
    # Anyone's next claim call takes them, with new tokens, even with no new occurrence.
    result = store.claim(owner(3), [ClaimRequest("e", None)], 100, store.now_ms())[0]
    assert sorted((c.due, c.token) for c in result.claims) == [(a + 1000, 3), (a + 2000, 4)]


def test_reclaim_after_cutoff_spares_younger_claims(store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    claim(store, owner(1), state, a + 1000)
    now = store.now_ms()
    assert store.reclaim(["e"], owner(1).id, owner(2), now - 60_000) == []
    assert len(store.reclaim(["e"], owner(1).id, owner(2), now + 1000)) == 1


def test_worker_start_is_a_compare_and_set_on_the_token(store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    c = claim(store, owner(1), state, a + 1000).claims[0]
    store.check_before_send(owner(1), c, "tid")
    # The worker can be faster than mark_sent.
    assert store.start("e", c.due, c.token, "w1@h", 11, 0).ok
    assert store.mark_sent(c)
    assert store.history("e")[0].state is RunState.STARTED
    # A second delivery of the same token while the first process is running: busy.
    second = store.start("e", c.due, c.token, "w2@h", 22, 0)
    assert not second.ok and second.busy_with is not None and second.busy_with[:2] == ("w1@h", 11)
    # A retry (more retries than recorded) continues the same run.
    assert store.start("e", c.due, c.token, "w1@h", 11, 1).ok
    # A superseded token never starts.
    bad = store.start("e", c.due, c.token - 1, "w3@h", 33, 0)
    assert not bad.ok and "superseded" in bad.why


def test_outcomes_never_overwrite_a_final_state_nor_touch_the_checkpoint(
        store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    old, new = claim(store, owner(1), state, a + 1000, a + 2000).claims
    for c in (old, new):
        store.check_before_send(owner(1), c, "tid")
        store.mark_sent(c)
        assert store.start("e", c.due, c.token, "w@h", 1, 0).ok
    assert store.finish("e", new.due, new.token, "done")
    assert store.finish("e", old.due, old.token, "done")  # late outcome of the older run
    assert not store.finish("e", old.due, old.token, "failed", "X", "again")
    assert not store.finish("e", old.due, None, "failed")
    assert store.entry_info("e")["checkpoint"] == a + 2000
    states = {r.due: r.state for r in store.history("e")}
    assert states == {a + 1000: RunState.DONE, a + 2000: RunState.DONE}


def test_sent_runs_without_outcome_become_lost(store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    c = claim(store, owner(1), state, a + 1000).claims[0]
    store.check_before_send(owner(1), c, "tid")
    store.mark_sent(c)
    assert store.mark_lost({"e": store.now_ms() - 60_000}) == {}
    assert store.mark_lost({"e": store.now_ms() + 1}) == {"e": [a + 1000]}
    assert store.history("e")[0].state is RunState.LOST
    assert not store.finish("e", c.due, c.token, "done")  # lost is final


def test_overlap_skip_is_decided_atomically_in_the_store(store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    c = claim(store, owner(1), state, a + 1000, overlap="skip").claims[0]
    store.check_before_send(owner(1), c, "tid")
    store.mark_sent(c)
    second = claim(store, owner(2), EntryState(a, a + 1000), a + 2000, overlap="skip")
    assert second.claims == [] and second.skipped == [(a + 2000, "overlap")]
    store.finish("e", c.due, c.token, "done")
    third = claim(store, owner(2), EntryState(a, a + 2000), a + 3000, overlap="skip")
    assert [x.due for x in third.claims] == [a + 3000]


def test_corrupt_record_is_skipped_not_fatal(store: RedisStore, server: RedisServer) -> None:
    state = anchored(store)
    a = state.anchor
    claim(store, owner(1), state, a + 1000)
    runs_key = store._keys("e", "runs")[0]
    server.client().hset(runs_key, str(a + 1000), "{not json")
    result = store.claim(owner(2), [ClaimRequest("e", EntryState(a, a + 1000), [a + 2000])], 100,
                         store.now_ms())[0]
    assert [x.due for x in result.claims] == [a + 2000]
    assert [r.due for r in store.history("e")] == [a + 2000]
    assert not store.start("e", a + 1000, 1, "w", 1, 0).why.startswith("token")


def test_keys_of_one_entry_share_a_hash_slot(store: RedisStore) -> None:
    from redis.crc import key_slot

    keys = store._keys("weird {name}", "entry", "runs", "history", "live", "open")
    assert len({key_slot(k.encode()) for k in keys}) == 1


def test_unused_claim_type_is_frozen() -> None:
    c = Claim("e", 1, 1)
    with pytest.raises(AttributeError):
        c.token = 2  # type: ignore[misc]


def test_check_before_send_records_the_task_id_and_marks_the_previous_sent(
        store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    first, second = claim(store, owner(1), state, a + 1000, a + 2000).claims
    assert store.check_before_send(owner(1), first, "t1")[0]
    assert store.check_before_send(owner(1), second, "t2", sent=[first])[0]
    states = {r.due: r.state for r in store.history("e")}
    assert states == {a + 1000: RunState.SENT, a + 2000: RunState.SENDING}
    assert store.history("e")[0].task_id == "t2"
    # The worker's start indexes the task id (for signals that carry only the id).
    assert store.lookup_task("t2") is None
    assert store.start("e", a + 2000, second.token, "w@h", 1, 0, task_id="t2").ok
    assert store.lookup_task("t2") == ("e", a + 2000, second.token)


def test_batches_survive_a_script_flush(store: RedisStore, server: RedisServer) -> None:
    state = anchored(store)
    server.client().script_flush()
    result = claim(store, owner(1), state, state.anchor + 1000)
    assert [c.due for c in result.claims] == [state.anchor + 1000]


def _sent(store: RedisStore, state: EntryState, *dues: int) -> list[Claim]:
    claims = claim(store, owner(1), state, *dues).claims
    for c in claims:
        store.check_before_send(owner(1), c, f"t{c.due}")
        store.mark_sent(c)
    return claims


def test_a_delivery_whose_record_was_trimmed_is_refused(store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    c = _sent(store, state, a + 1000)[0]
    assert store.finish("e", c.due, c.token, "done")
    store.client.hdel(store._keys("e", "runs")[0], str(c.due))  # trimmed
    refused = store.start("e", c.due, c.token, "w@h", 1, 0)
    assert not refused.ok and "trimmed" in refused.why
    # Beyond the checkpoint (a wiped store), an unknown run is not ours to refuse.
    assert store.start("e", a + 99_000, 1, "w@h", 1, 0).ok


def test_a_late_delivery_of_a_run_presumed_lost_still_runs(store: RedisStore) -> None:
    state = anchored(store)
    c = _sent(store, state, state.anchor + 1000)[0]
    lost_at = store.now_ms() + 1
    assert store.mark_lost({"e": lost_at}) == {"e": [c.due]}
    time.sleep(0.01)
    assert store.start("e", c.due, c.token, "w@h", 1, 0, created=50.0).ok
    # Its run_timeout counts again from the late start: the next sweep does not re-lose it.
    assert store.mark_lost({"e": lost_at}) == {}
    # A second delivery while it runs is still a duplicate.
    assert not store.start("e", c.due, c.token, "w2@h", 2, 0, created=60.0).ok
    assert store.finish("e", c.due, c.token, "done")
    run = store.history("e")[0]
    assert run.state is RunState.DONE and run.extra.get("revived") is True


def test_a_run_lost_while_running_refuses_a_second_delivery(store: RedisStore) -> None:
    state = anchored(store)
    c = _sent(store, state, state.anchor + 1000)[0]
    assert store.start("e", c.due, c.token, "w1@h", 11, 0, created=100.0).ok
    assert store.mark_lost({"e": store.now_ms() + 1}) == {"e": [c.due]}
    second = store.start("e", c.due, c.token, "w2@h", 22, 0, created=200.0)
    assert not second.ok and second.busy_with == ("w1@h", 11, 100.0)


def test_same_node_name_and_pid_but_a_new_process_is_not_the_same_process(
        store: RedisStore) -> None:
    state = anchored(store)
    c = _sent(store, state, state.anchor + 1000)[0]
    assert store.start("e", c.due, c.token, "w1@h", 7, 0, created=100.0).ok
    again = store.start("e", c.due, c.token, "w1@h", 7, 0, created=999.0)
    assert not again.ok and again.busy_with == ("w1@h", 7, 100.0)  # judged by the caller
    same = store.start("e", c.due, c.token, "w1@h", 7, 0, created=100.0)
    assert not same.ok and "this process" in same.why


def test_a_holder_may_check_again_after_a_lost_reply(store: RedisStore) -> None:
    state = anchored(store)
    c = claim(store, owner(1), state, state.anchor + 1000).claims[0]
    assert store.check_before_send(owner(1), c, "t")[0]
    assert store.check_before_send(owner(1), c, "t")[0]  # the first reply was lost
    assert not store.check_before_send(owner(2), c, "t")[0]


def test_reclaiming_a_run_being_sent_counts_from_its_check(store: RedisStore) -> None:
    state = anchored(store)
    c = claim(store, owner(1), state, state.anchor + 1000).claims[0]
    time.sleep(0.05)
    cutoff = store.now_ms()
    time.sleep(0.05)
    store.check_before_send(owner(1), c, "t")  # checked after the cutoff
    assert store.reclaim(["e"], owner(1).id, owner(2), cutoff) == []


def test_reclaim_notes_the_new_owner_and_clears_the_dead_note(store: RedisStore) -> None:
    state = anchored(store)
    claim(store, owner(1), state, state.anchor + 1000)
    assert store.reclaim(["e"], owner(1).id, owner(2), None)
    notes = {o.id: names for o, _, names in store.owners()}
    assert notes == {} or "e" not in notes.get(owner(1).id, {})
    entries = store.client.zrange(store._global("owner", owner(2).id, "entries"), 0, -1)
    assert entries == ["e"]


def test_check_many_answers_each_claim_in_one_round_trip(store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    first, second, third = claim(store, owner(1), state, a + 1000, a + 2000, a + 3000).claims
    store.reclaim(["e"], owner(1).id, owner(2), None)  # owner 1 looked dead
    answers = store.check_many(owner(1), [(c, f"t{c.due}") for c in (first, second)])
    assert answers == [(False, "superseded"), (False, "superseded")]
    mine = [c for c in claim(store, owner(2), None).claims]  # nothing new: all held by 2
    assert mine == []
    held = {r.due: r for r in store.history("e")}
    assert {r.owner for r in held.values()} == {owner(2).id}
    ok = store.check_many(owner(2), [(Claim("e", d, held[d].token), f"t{d}")
                                     for d in (a + 1000, third.due)])
    assert ok == [(True, ""), (True, "")]
    assert store.mark_all_sent([Claim("e", a + 1000, held[a + 1000].token)]) == 1
    assert {r.due: r.state for r in store.history("e")}[a + 1000] is RunState.SENT


def test_release_leaves_a_notice_that_only_a_pickup_of_that_release_clears(
        store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    claim(store, owner(1), state, a + 1000)
    assert store.release(owner(1), ["e"]) == 1
    seen = store.released_in()
    assert seen == {"e": 1}
    # Another release comes in after the notices were read: its notice must survive.
    claim(store, owner(2), None)
    store.release(owner(2), ["e"])
    store.picked_up(seen)
    assert store.released_in() == {"e": 2}
    store.picked_up(store.released_in())
    assert store.released_in() == {}


def test_operators_request_a_run_and_free_a_stuck_claim(store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    assert store.request_run("unknown", "admin:x") is None
    due = store.request_run("e", "admin:alice")
    assert due is not None
    run = store.history("e")[0]
    assert (run.due, run.state, run.as_dict()["manual"]) == (due, RunState.DUE, True)
    assert store.entry_info("e")["checkpoint"] is None  # scheduled runs are unaffected
    assert "e" in store.released_in()
    # A beat claims the manual run like a released one, with a fresh token.
    taken = claim(store, owner(1), None).claims
    assert [c.due for c in taken] == [due]
    # That beat gets stuck: an operator frees the claim; its token no longer passes.
    assert store.free_claim("e", due, "admin:alice")
    assert not store.free_claim("e", due, "admin:alice")  # already due again
    assert not store.check_before_send(owner(1), taken[0], "t")[0]
    again = claim(store, owner(2), None).claims
    assert [(c.due, c.token > taken[0].token) for c in again] == [(due, True)]
    assert claim(store, owner(2), state, a + 1000).claims[0].due == a + 1000


def test_open_runs_are_indexed_at_the_check_and_settle_only_when_unchanged(
        store: RedisStore) -> None:
    state = anchored(store)
    a = state.anchor
    assert store.open_in() == {}
    first = claim(store, owner(1), state, a + 1000).claims[0]
    store.check_many(owner(1), [(first, "t1")])
    seen = store.open_in()
    assert seen == {"e": f"{owner(1).id}:{first.token}"}
    second = claim(store, owner(1), None).claims or claim(
        store, owner(1), EntryState(a, a + 1000), a + 2000).claims
    store.check_many(owner(1), [(second[0], "t2")])  # checked after the read
    store.settled(seen)
    assert store.open_in() == {"e": f"{owner(1).id}:{second[0].token}"}
    store.note_open(["other"])
    assert set(store.open_in()) == {"e", "other"}


def test_entries_first_seen_by_beats_starting_together_share_their_anchor(
        server: RedisServer) -> None:
    """Two beats anchoring different halves first (their batches interleave on the server)
    still give every entry first seen together the same anchor."""
    a, b = RedisStore.from_url(server.url, "t"), RedisStore.from_url(server.url, "t")
    names = [(f"e{i}", "every 1s") for i in range(10)]
    first = a.ensure_entries(names[:5])
    time.sleep(0.01)
    second = b.ensure_entries(names[5:] + names[:5])
    assert len({s.anchor for s in {**first, **second}.values()}) == 1


def test_a_round_trip_that_could_not_connect_leaves_nothing_queued(
        server: RedisServer) -> None:
    """redis-py does not reset a pipeline whose connection failed; the store's reused
    pipeline must not send those commands with the next batch (found by the chaos run: a
    beat crashed reading anchors after the store restarted)."""
    store = RedisStore.from_url(server.url, "t")
    anchored(store)
    server.stop()
    with pytest.raises(redis.exceptions.ConnectionError):
        store.sweep_view(["someone"])
    server.start()
    assert set(store.ensure_entries([("e", "every 1s"), ("f", "every 1s")])) == {"e", "f"}
