"""A backfill never runs an occurrence again once the history forgot it ran: each trim
raises the entry's history horizon (the newest instant whose run it removed), in the same
atomic step, and a backfill of an instant at or before it with no run recorded is refused
before anything is recorded. What the store still holds a run of stays known."""

from __future__ import annotations

import pytest

from beat_claims.enums import Reason, RunState
from beat_claims.runs import iso
from beat_claims.stores.base import BackfillForgotten, BackfillRefused, Claim, Outcome, Store

from .conftest import Backend
from .helpers import (
    A,
    B,
    after,
    claim,
    claims,
    now,
    process,
    register,
    run,
    runs,
    send,
    started,
    take,
)


def done(store: Store, *cs: Claim) -> None:
    """Sent, run and finished, as a worker reports it."""
    for c in cs:
        send(store, A, c)
        started(store, c, process(1))
    store.finish([Outcome(c.entry, c.due, c.token, RunState.DONE) for c in cs])


def claim_next(store: Store, due: int, entry: str = "e") -> Claim:
    """Claim the occurrence at ``due``: a claim trims the entry's history."""
    [c] = claim(store, A, register(store, entry)[entry], due, entry=entry).claims
    return c


def horizon(store: Store, name: str = "e") -> int | None:
    [found] = store.entries([name])
    return found.history_horizon


@pytest.mark.history_limit(3)
def test_a_backfill_of_instants_trimmed_from_the_history_is_refused(store: Store) -> None:
    cs = claims(store, A, 1000, 2000, 3000, 4000, 5000)
    done(store, *cs)
    assert horizon(store) is None  # nothing trimmed yet (the five were live when claimed)
    claim_next(store, cs[-1].due + 1000)  # trims the three oldest
    assert sorted(runs(store)) == [cs[3].due, cs[4].due, cs[4].due + 1000]
    assert horizon(store) == cs[2].due
    before = runs(store)
    with pytest.raises(BackfillForgotten) as refused:
        store.backfill("e", [c.due for c in cs], "alice@ops")
    message = str(refused.value)
    assert iso(cs[2].due) in message and "beat_claims_history_limit=3" in message, message
    assert "nothing was recorded" in message, message
    assert isinstance(refused.value, BackfillRefused) and isinstance(refused.value, ValueError)
    assert (refused.value.horizon, refused.value.created) == (cs[2].due, 3)
    assert runs(store) == before and take(store, B) == ()  # nothing was written
    # Asked again (a lost reply): the same refusal, still nothing written.
    with pytest.raises(BackfillForgotten):
        store.backfill("e", [cs[0].due], "alice@ops")
    assert runs(store) == before
    # After the horizon, what the history holds is kept (it ran): nothing runs twice.
    result = store.backfill("e", [cs[3].due, cs[4].due], "alice@ops")
    assert result is not None and result.created == ()
    assert dict(result.kept) == {cs[3].due: RunState.DONE, cs[4].due: RunState.DONE}


@pytest.mark.history_limit(4)
def test_what_the_history_still_holds_stays_known_and_the_horizon_never_goes_back(
        store: Store) -> None:
    held, *cs = claims(store, A, 1000, 2000, 3000, 4000, 5000)
    done(store, *cs)
    claim_next(store, 6000 + held.due - 1000)  # trims 2000 and 3000: 1000 is claimed
    assert horizon(store) == cs[1].due
    # Older than the horizon, but held: known (kept as it is), not refused.
    result = store.backfill("e", [held.due], "alice@ops")
    assert result is not None and result.kept == ((held.due, RunState.CLAIMED),)
    done(store, held)
    claim_next(store, 7000 + held.due - 1000)  # trims 1000, older than the horizon
    assert held.due not in runs(store)
    assert horizon(store) == cs[1].due


@pytest.mark.history_limit(2)
def test_a_run_dropped_from_the_lost_keep_raises_the_horizon(store: Store) -> None:
    """A run presumed lost leaves the history for the lost keep (it is still known: a
    backfill runs it again); dropped from the keep too, it is not."""
    cs = claims(store, A, 1000, 2000, 3000, 4000)
    for c in cs:
        send(store, A, c)
    lost_at = after(store, max(run(store, c).sent_at or 0 for c in cs))
    store.finish([Outcome("e", c.due, c.token, RunState.LOST, Reason.RUN_TIMEOUT,
                          inactive_since=lost_at) for c in cs])
    claim_next(store, cs[-1].due + 1000)  # three lost to the keep, which keeps two
    assert horizon(store) == cs[0].due
    with pytest.raises(BackfillForgotten):
        store.backfill("e", [cs[0].due], "alice@ops")
    result = store.backfill("e", [cs[1].due], "alice@ops")  # in the keep: it never ran
    assert result is not None and result.created == (cs[1].due,)


@pytest.mark.history_limit(3)
def test_a_horizon_that_cannot_be_read_refuses_what_is_not_held_and_is_written_again(
        store: Store, backend: Backend) -> None:
    cs = claims(store, A, 1000, 2000, 3000)
    done(store, *cs)
    claim_next(store, cs[-1].due + 1000)  # trims 1000
    other = claims(store, A, 1000, entry="f")[0]
    backend.corrupt_entry_field(store, "e", "horizon", "soon")
    with pytest.raises(BackfillForgotten) as refused:
        store.backfill("e", [cs[0].due, cs[-1].due + 500], "alice@ops")
    assert refused.value.horizon is None and refused.value.created == 2
    assert "cannot be read" in str(refused.value)
    kept = store.backfill("e", [cs[1].due], "alice@ops")  # held: known
    assert kept is not None and kept.kept == ((cs[1].due, RunState.DONE),)
    # Bad records are local: the other entry is backfilled as usual.
    assert store.backfill("f", [other.due - 500], "alice@ops") is not None
    # The next trim writes it again, after every run it could have removed.
    before = now(store)
    done(store, run_claim(store, cs[-1].due + 1000))
    claim_next(store, cs[-1].due + 2000)  # trims 2000
    found = horizon(store)
    assert found is not None and found >= before
    result = store.backfill("e", [found + 1], "alice@ops")
    assert result is not None and result.created == (found + 1,)


def run_claim(store: Store, due: int) -> Claim:
    """The claim of the run at ``due`` (held by A)."""
    r = run(store, ("e", due))
    return Claim("e", due, r.token)
