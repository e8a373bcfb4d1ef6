"""Tokens from the store's clock: every token a claim hands out is at least the store's clock
times TOKENS_PER_MS, above every token the entry handed out before, one up within a call;
so a store whose token counter was put back to an older value (a copy restored, whatever
way) hands no token out a second time."""

from __future__ import annotations

import pytest

from beat_claims.enums import RunState
from beat_claims.stores.base import Claim, ClaimStatus, Reclaim, Release, Store

from .conftest import Backend
from .helpers import (
    A,
    B,
    after,
    claim,
    clock_tokens,
    register,
    run,
    runs,
    sending,
    take,
)


def test_a_claim_hands_out_its_first_token_from_the_clock_and_one_up_after_it(
        store: Store) -> None:
    state = register(store, "e")["e"]
    a = state.anchor
    lowest = clock_tokens(store)
    result = claim(store, A, state, a + 1000, a + 2000, a + 3000)
    highest = clock_tokens(store)
    tokens = [c.token for c in result.claims]
    # The counter was below the clock: the first token is the clock's at the call.
    assert lowest <= tokens[0] <= highest, (tokens, lowest, highest)
    assert tokens == [tokens[0], tokens[0] + 1, tokens[0] + 2]
    assert result.state is not None and result.state.token == tokens[-1]


def test_a_floor_below_the_clock_gives_the_clock_s_token(store: Store) -> None:
    state = register(store, "e")["e"]
    lowest = clock_tokens(store)
    [c] = claim(store, A, state, state.anchor + 1000, token_floor=5).claims
    assert lowest <= c.token <= clock_tokens(store), (c.token, lowest)


def test_every_kind_of_claim_hands_out_tokens_above_the_clock_and_every_earlier_token(
        store: Store) -> None:
    """New occurrences, runs released, taken back from a beat that died while sending,
    and asked for by an operator: each call's tokens are at least the clock's at the call
    and above every token handed out before."""
    state = register(store, "e")["e"]
    a = state.anchor
    handed: list[int] = []

    def check_call(lowest: int, claims: tuple[Claim, ...]) -> None:
        tokens = sorted(c.token for c in claims)
        assert tokens and tokens[0] >= lowest, (tokens, lowest)
        assert tokens[0] > max(handed, default=0), (tokens, handed)
        assert tokens == list(range(tokens[0], tokens[0] + len(tokens)))  # one up
        handed.extend(tokens)

    lowest = clock_tokens(store)
    first = claim(store, A, state, a + 1000, a + 2000, a + 3000)
    check_call(lowest, first.claims)
    released, being_sent, _ = first.claims
    assert store.release(A, [Release(released)]) == [RunState.DUE]
    sending(store, A, being_sent)
    assert store.reclaim([Reclaim("e", being_sent.due, being_sent.token)], B.id) == [True]
    assert store.request_run("e", "operator:alice") is not None
    lowest = clock_tokens(store)
    check_call(lowest, take(store, B))
    assert first.state is not None
    lowest = clock_tokens(store)
    check_call(lowest, claim(store, B, first.state, a + 4000).claims)
    # Every run's token is its own.
    tokens = [r.token for r in runs(store).values()]
    assert len(set(tokens)) == len(tokens), tokens


@pytest.mark.parametrize("back_to", ["registered", "first claim"])
def test_a_token_counter_put_back_to_an_older_value_hands_no_token_out_again(
        store: Store, backend: Backend, back_to: str) -> None:
    """As an older copy of the store would have it: the counter (the only thing a claim
    counts on from) as it was when the entry was registered, or after its first claim.
    Once the store's clock has passed the last claim, whatever comes next is above every
    token handed out: new occurrences and runs taken again alike."""
    state = register(store, "e")["e"]
    a = state.anchor
    first = claim(store, A, state, a + 1000)
    assert first.state is not None
    second = claim(store, A, first.state, a + 2000, a + 3000)
    handed = [c.token for c in (*first.claims, *second.claims)]
    released = second.claims[0]
    assert store.release(A, [Release(released)]) == [RunState.DUE]
    old = 0 if back_to == "registered" else first.claims[0].token
    backend.corrupt_entry_field(store, "e", "token", str(old))
    current = register(store, "e")["e"]  # what a beat reads of the entry
    assert current.token == old
    last = max(run(store, c).claimed_at or 0 for c in (*first.claims, *second.claims))
    after(store, last)  # (a copy that old is at least a millisecond old)
    lowest = clock_tokens(store)
    result = claim(store, B, current, a + 4000)
    assert result.status is ClaimStatus.OK, result
    [retaken] = result.taken
    assert retaken.due == released.due
    tokens = sorted(c.token for c in (*result.claims, *result.taken))
    assert len(tokens) == 2 and tokens[0] > max(handed) and tokens[0] >= lowest, (
        tokens, handed, lowest)
    assert tokens[1] == tokens[0] + 1
    recorded = [r.token for r in runs(store).values()]
    assert len(set(recorded)) == len(recorded), recorded
