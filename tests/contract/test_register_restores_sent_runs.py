"""Register's restore of sent runs over runs that ended without
running (4e1f88f), and of a pause whose instant cannot be read (7c9e29d), at the contract.

Tests once marked ``xfail(strict=True, reason="review: ...")`` reproduced a problem found in the
review; the others pin a property that holds and was not pinned elsewhere.
"""

from __future__ import annotations

import json

import pytest

from beat_claims.beat.knowledge import Knowledge
from beat_claims.enums import Reason, RunState, StartVerdict
from beat_claims.runs import Run
from beat_claims.stores.base import Claim, EntrySeed, Outcome, Pause, Store

from .backend import Backend
from .helpers import A, claims, delivery, process, run, send, take


def _ended(store: Store, how: RunState = RunState.CANCELLED) -> tuple[int, int]:
    """Entry "e" with its run at one instant sent and then ended without running
    (cancelled before any start, or skipped): what an older copy of the store holds at an
    instant a backfill later replaced. Returns (due, token)."""
    c = claims(store, A, 1000)[0]
    send(store, A, c, task_id="t-old")
    store.finish([Outcome("e", c.due, c.token, how, reason=Reason.PAUSED)
                  if how is RunState.SKIPPED else Outcome("e", c.due, c.token, how)])
    assert run(store, c).state is how, f"the store did not record {how.value}"
    return c.due, c.token


def _sent(due: int, token: int, task_id: str) -> Run:
    """A sent run as a live beat knows it (what Knowledge.sent keeps)."""
    return Run("e", due, RunState.SENT, token=token, task_id=task_id, manual=True,
               extra={"reseeded": True})


def _starts(store: Store, due: int, token: int, task_id: str, n: int = 1) -> bool:
    verdict = store.start(delivery(Claim("e", due, token), process(n), task_id=task_id))
    return verdict.verdict is StartVerdict.RUN


# -- findings --------------------------------------------------------------------------------
def test_the_latest_of_two_sent_runs_a_beat_knows_at_one_instant_is_restored(
        store: Store) -> None:
    due, token = _ended(store)
    first, second = _sent(due, token + 3, "t-backfill-1"), _sent(due, token + 5, "t-backfill-2")
    store.register([EntrySeed("e", "every 1s", runs=(first, second))])
    restored = run(store, ("e", due))
    assert (restored.token, restored.task_id) == (token + 5, "t-backfill-2"), restored
    assert _starts(store, due, token + 5, "t-backfill-2")


def test_two_beats_knowing_successive_sends_at_one_instant_end_with_the_latest(
        store: Store) -> None:
    due, token = _ended(store)
    store.register([EntrySeed("e", "every 1s", runs=(_sent(due, token + 3, "t-b1"),))])
    store.register([EntrySeed("e", "every 1s", runs=(_sent(due, token + 5, "t-b2"),))])
    restored = run(store, ("e", due))
    assert (restored.token, restored.task_id) == (token + 5, "t-b2"), restored
    assert _starts(store, due, token + 5, "t-b2")


# -- register: what held ------------------------------------------------------------------
def test_the_newer_beat_registering_first_keeps_the_latest(store: Store) -> None:
    """The same two beats, the one that sent the later backfill first: the later run stays
    (the older beat's stale knowledge never replaces a sent run with a higher token)."""
    due, token = _ended(store)
    store.register([EntrySeed("e", "every 1s", runs=(_sent(due, token + 5, "t-b2"),))])
    store.register([EntrySeed("e", "every 1s", runs=(_sent(due, token + 3, "t-b1"),))])
    restored = run(store, ("e", due))
    assert (restored.token, restored.task_id) == (token + 5, "t-b2"), restored
    assert not _starts(store, due, token + 3, "t-b1")
    assert _starts(store, due, token + 5, "t-b2")


@pytest.mark.parametrize("how", [RunState.CANCELLED, RunState.SKIPPED])
def test_register_again_after_a_lost_reply_changes_nothing(store: Store, how: RunState
                                                           ) -> None:
    """The reply of the register that replaced the old run was lost and the beat registers
    the same knowledge again: the restored run is the same (token, task id), the counter
    does not move, the delivery starts once, and a second delivery does not."""
    due, token = _ended(store, how)
    known = _sent(due, token + 5, "t-new")
    first = store.register([EntrySeed("e", "every 1s", runs=(known,))])["e"]
    again = store.register([EntrySeed("e", "every 1s", runs=(known,))])["e"]
    assert again.token == first.token >= token + 5
    restored = run(store, ("e", due))
    assert (restored.state, restored.token, restored.task_id) == (
        RunState.SENT, token + 5, "t-new")
    assert _starts(store, due, token + 5, "t-new", 1)
    assert not _starts(store, due, token + 5, "t-new", 2)
    # And once it ran, registering it once more never makes it sent again.
    store.finish([Outcome("e", due, token + 5, RunState.DONE)])
    store.register([EntrySeed("e", "every 1s", runs=(known,))])
    assert run(store, ("e", due)).state is RunState.DONE


def test_a_stale_beat_never_replaces_a_later_cancel(store: Store) -> None:
    """A beat remembers it sent token t at an instant; the store since cancelled a later
    run there (a backfill's, token > t): the cancel, with its higher token, is kept, and no
    token is handed out again."""
    c = claims(store, A, 1000)[0]
    send(store, A, c, task_id="t-old")
    store.finish([Outcome("e", c.due, c.token, RunState.CANCELLED)])
    made = store.backfill("e", [c.due], "alice@ops")
    assert made is not None and made.created == (c.due,), made
    [later] = [x for x in take(store, A) if x.due == c.due]
    send(store, A, later, task_id="t-backfill")
    store.finish([Outcome("e", c.due, later.token, RunState.CANCELLED)])
    assert later.token > c.token
    state = store.register([EntrySeed("e", "every 1s",
                                      runs=(_sent(c.due, c.token, "t-old"),))])["e"]
    kept = run(store, c)
    assert (kept.state, kept.token) == (RunState.CANCELLED, later.token), kept
    assert state.token >= later.token
    assert not _starts(store, c.due, c.token, "t-old")


def test_a_known_sent_run_never_replaces_a_run_that_ran(store: Store) -> None:
    """A run that a worker started (then presumed lost, or failed) is never replaced, however
    high the known token: it ran."""
    c = claims(store, A, 1000)[0]
    send(store, A, c, task_id="t-old")
    assert _starts(store, c.due, c.token, "t-old")
    store.finish([Outcome("e", c.due, c.token, RunState.FAILED)])
    store.register([EntrySeed("e", "every 1s", runs=(_sent(c.due, c.token + 9, "t-x"),))])
    kept = run(store, c)
    assert (kept.state, kept.token) == (RunState.FAILED, c.token), kept


# -- a pause read at instant 0 ------------------------------------------------------------
def test_a_beat_that_knows_a_pause_at_instant_0_forgets_it_at_the_resume(store: Store
                                                                         ) -> None:
    """A pause shown at instant 0 (its instant could not be read) is forgotten by a beat
    at the resume (resumed_at >= 0), and a later pause replaces it: 0 is never kept as a
    pause that "began earlier" and blocks forgetting."""
    knowledge = Knowledge()
    zero = Pause(at=0, by="alice@ops", note="")
    knowledge.paused["e"] = zero
    claims(store, A, 1000)
    assert store.pause("e", "alice@ops") is not None
    [record] = store.entries(["e"])
    assert knowledge.check_pause("e", record) in ("updated", None)
    assert record.paused is not None and knowledge.paused["e"].at >= zero.at
    knowledge.paused["e"] = zero
    resumed = store.resume("e", "bob@ops")
    assert resumed is not None and resumed.resumed_at is not None
    assert knowledge.check_pause("e", resumed) == "resumed"
    assert "e" not in knowledge.paused


def test_a_cancelled_run_whose_token_cannot_be_read_never_breaks_register(
        store: Store, backend: Backend) -> None:
    """A cancelled record whose token field is of the wrong type: registering a sent run
    the beat knows there neither raises nor hands out a token the entry held."""
    due, token = _ended(store)
    record = run(store, ("e", due))
    raw = {"entry": "e", "due": due, "state": "cancelled", "token": "seven",
           "task_id": record.task_id}
    backend.corrupt_run(store, "e", due, json.dumps(raw))
    state = store.register([EntrySeed("e", "every 1s",
                                      runs=(_sent(due, token + 5, "t-new"),))])["e"]
    assert state.token >= token + 5
