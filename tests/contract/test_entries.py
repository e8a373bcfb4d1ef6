"""register: anchors set once, seeds merged without going back, unreadable fields repaired;
entries() reads them back."""

from __future__ import annotations

from beat_claims.enums import RunState, StartVerdict
from beat_claims.runs import Run
from beat_claims.stores.base import EntrySeed, EntryState, Store

from .conftest import Backend
from .helpers import (
    A,
    B,
    above_clock,
    after,
    claim,
    delivery,
    now,
    one_claim,
    process,
    query,
    register,
    runs,
    send,
    tokens_above,
)


def test_a_new_entry_is_anchored_at_the_store_clock_without_checkpoint_or_token(
        store: Store) -> None:
    before = now(store)
    state = register(store, "e")["e"]
    assert before <= state.anchor <= now(store)
    assert state == EntryState(state.anchor, None, 0)


def test_the_anchor_is_set_once_by_the_first_caller(store: Store) -> None:
    first = register(store, "e")["e"]
    after(store, first.anchor)
    assert register(store, "e")["e"] == first
    # Even a caller that knows another anchor does not move it.
    known = store.register([EntrySeed("e", anchor=first.anchor - 12_345)])["e"]
    assert known.anchor == first.anchor


def test_entries_registered_together_share_the_anchoring_instant(store: Store) -> None:
    states = register(store, *(f"e{i}" for i in range(50)))
    assert set(states) == {f"e{i}" for i in range(50)}
    assert len({s.anchor for s in states.values()}) == 1


def test_a_known_anchor_is_used_only_where_the_store_has_none(store: Store) -> None:
    known = now(store) - 3_600_000
    states = store.register([EntrySeed("new", anchor=known), EntrySeed("plain")])
    assert states["new"].anchor == known
    assert states["plain"].anchor != known
    again = store.register([EntrySeed("new", anchor=known + 500)])
    assert again["new"].anchor == known


def test_a_checkpoint_floor_only_raises_the_checkpoint(store: Store) -> None:
    state = register(store, "e")["e"]
    a = state.anchor
    claim(store, A, state, a + 5000)
    lower = store.register([EntrySeed("e", checkpoint=a + 1000)])["e"]
    assert lower.checkpoint == a + 5000
    higher = store.register([EntrySeed("e", checkpoint=a + 9000)])["e"]
    assert higher.checkpoint == a + 9000
    assert store.register([EntrySeed("e")])["e"].checkpoint == a + 9000
    # A new entry takes the seed's checkpoint as it is.
    assert store.register([EntrySeed("f", checkpoint=a + 7000)])["f"].checkpoint == a + 7000


def test_a_token_floor_only_raises_the_token_and_later_tokens_are_above_it(
        store: Store) -> None:
    state = register(store, "e")["e"]
    a = state.anchor
    _, second = claim(store, A, state, a + 1000, a + 2000).claims
    assert store.register([EntrySeed("e", token=1)])["e"].token == second.token
    floor = above_clock(store)  # (a counter below the clock's tokens would not show)
    raised = store.register([EntrySeed("e", token=floor)])["e"]
    assert raised.token == floor
    result = claim(store, A, raised, a + 3000)
    assert [c.token for c in result.claims] == [floor + 1]
    assert store.register([EntrySeed("e", token=second.token)])["e"].token == floor + 1


def test_known_runs_are_restored_only_where_the_store_has_no_record(store: Store) -> None:
    held = one_claim(store, A, 1000)
    a = held.due - 1000
    t = above_clock(store)  # what the beat knew: tokens above the store's
    known = (
        Run("e", held.due, RunState.DONE, token=held.token, finished_at=a),  # has a record
        Run("e", a + 2000, RunState.SENT, token=t + 7, owner=A.id, task_id="t2", sent_at=a),
        Run("e", a + 3000, RunState.DUE, token=t + 8),
        Run("e", a + 500, RunState.FAILED, token=t + 3, finished_at=a, exc_type="Boom"),
    )
    state = store.register([EntrySeed("e", checkpoint=a + 3000, token=t + 8,
                                      runs=known)])["e"]
    assert (state.checkpoint, state.token) == (a + 3000, t + 8)
    found = runs(store)
    assert found[held.due].state is RunState.CLAIMED  # not overwritten
    assert found[held.due].token == held.token
    assert (found[a + 2000].state, found[a + 2000].token, found[a + 2000].task_id) == (
        RunState.SENT, t + 7, "t2")
    assert found[a + 500].state is RunState.FAILED and found[a + 500].exc_type == "Boom"
    # Restored runs are found from the records, as any other: the sent one is open, the
    # due one is due again, the claim is still held.
    assert [(o.entry, o.due) for o in store.open_runs(before=now(store) + 1)] == [
        ("e", a + 2000)]
    live = store.live_runs(query(A, held_before=now(store) + 1))
    assert [(r.entry, r.due) for r in live.due] == [("e", a + 3000)]
    assert [(h.due, h.token) for h in live.held] == [(held.due, held.token)]
    # Registering the same knowledge again changes nothing.
    assert store.register([EntrySeed("e", checkpoint=a + 3000, token=t + 8, runs=known)])[
        "e"] == state
    assert runs(store) == found


def test_an_unreadable_entry_field_is_repaired_and_the_other_seeds_answer(
        store: Store, backend: Backend) -> None:
    states = register(store, "bad-token", "bad-checkpoint", "bad-anchor", "fine")
    anchor = states["fine"].anchor
    claim(store, A, states["bad-checkpoint"], anchor + 1000, entry="bad-checkpoint")
    backend.corrupt_entry_field(store, "bad-token", "token", "not a number")
    backend.corrupt_entry_field(store, "bad-checkpoint", "checkpoint", "12.5x")
    backend.corrupt_entry_field(store, "bad-anchor", "anchor", "{}")
    floor = above_clock(store)  # (a counter below the clock's tokens would not show)
    repaired = store.register([
        EntrySeed("bad-token", token=floor),
        EntrySeed("bad-checkpoint", checkpoint=anchor + 1000),
        EntrySeed("bad-anchor", anchor=anchor),
        EntrySeed("fine"),
        EntrySeed("new"),
    ])
    assert set(repaired) == {"bad-token", "bad-checkpoint", "bad-anchor", "fine", "new"}
    assert repaired["bad-token"].token == floor
    assert repaired["bad-checkpoint"].checkpoint == anchor + 1000
    assert repaired["bad-anchor"].anchor == anchor
    assert repaired["fine"] == states["fine"]
    # Repaired for good: claims work again, with tokens above the floor.
    result = claim(store, A, repaired["bad-token"], anchor + 1000, entry="bad-token")
    assert [c.token for c in result.claims] == [floor + 1]
    assert {r.name: r.token for r in store.entries(["bad-token"])} == {"bad-token": floor + 1}


def test_entries_reads_what_register_and_claim_wrote(store: Store) -> None:
    assert store.entries() == []
    store.register([EntrySeed("e", "every 5s"), EntrySeed("f", "crontab(*)")])
    state = store.register([EntrySeed("e")])["e"]
    [c] = claim(store, A, state, state.anchor + 5000).claims
    records = {r.name: r for r in store.entries()}
    assert set(records) == {"e", "f"}
    assert (records["e"].anchor, records["e"].checkpoint, records["e"].token) == (
        state.anchor, state.anchor + 5000, c.token)
    assert records["f"].checkpoint is None and records["f"].token == 0
    assert records["f"].description == "crontab(*)"
    assert [r.name for r in store.entries()] == ["e", "f"]
    assert [r.name for r in store.entries(["f"])] == ["f"]
    # An unknown name is not an error (and has no anchor if it is listed at all).
    assert all(r.anchor is None for r in store.entries(["unknown"]))


def test_after_a_wipe_what_the_beats_know_is_seeded_back(store: Store,
                                                         backend: Backend) -> None:
    state = register(store, "e")["e"]
    a = state.anchor
    # (tokens above the clock's: the seeded counter, not the clock, must keep them unique;
    # the anchor is the clock's reading, as no heartbeat is seen before the wipe)
    result = claim(store, A, state, a + 1000, a + 2000, token_floor=tokens_above(a))
    first, second = result.claims
    send(store, A, first)
    assert result.state is not None
    backend.wipe(store)
    assert store.entries() == []
    # A beat seeds back what it knows: the anchor, the checkpoint, the token, its runs.
    sent_run = Run("e", first.due, RunState.SENT, token=first.token, owner=A.id,
                   task_id="t1", sent_at=a)
    seeded = store.register([EntrySeed("e", anchor=a, checkpoint=result.state.checkpoint,
                                       token=result.state.token, runs=(sent_run,))])["e"]
    assert seeded == result.state
    # No token is handed out again, no occurrence runs twice, the grid keeps its phase.
    later = claim(store, B, seeded, a + 3000)
    assert [(c.due, c.token) for c in later.claims] == [(a + 3000, second.token + 1)]
    assert claim(store, B, later.state, a + 2000).claims == ()
    # The known run's delivery runs; an unknown one behind the checkpoint is refused.
    assert store.start(delivery(first, process(1))).verdict is StartVerdict.RUN
    assert store.start(delivery(second, process(1))).verdict is StartVerdict.REFUSED
