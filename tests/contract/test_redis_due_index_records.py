"""Redis only (one server and a cluster): the due index is read in (instant, name) order,
each entry once a pass whatever the page size, whatever its sorted sets hold: a score that
is not a whole number of ms (a record written by hand, or by another tool) is the instant
of its whole part, a member whose bytes are not UTF-8 names no entry and is left out, as is
a score that is no instant at all (not finite). A reader pages with the last entry it was
answered: what the page holds must be in the order the next page starts from."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import pytest

from beat_claims.stores.base import IndexWrite
from beat_claims.stores.redis import RedisStore

from .conftest import BACKENDS, HISTORY_LIMIT
from .helpers import now, register

#: Page sizes a reader may use: one entry, a few, and the whole index at once.
LIMITS = (1, 2, 3, 7, 1000)


@pytest.fixture(params=["redis", "redis_cluster"])
def store(request: pytest.FixtureRequest) -> Iterator[RedisStore]:
    with BACKENDS[request.param].open(request, HISTORY_LIMIT) as store:
        assert isinstance(store, RedisStore)
        yield store


def paged(store: RedisStore, before: int, limit: int) -> list[tuple[int, str]]:
    """Every (next_due, name) due by ``before``, read ``limit`` a page from the start, each
    page after the last one's last entry (as a beat reads the index)."""
    out: list[tuple[int, str]] = []
    after = None
    for _ in range(100):
        page = store.due(before, limit, after)
        assert len(page) <= limit, page
        out += [(d.next_due, d.name) for d in page]
        if len(page) < limit:
            return out
        after = (page[-1].next_due, page[-1].name)
    raise AssertionError(f"no end after 100 pages of {limit}: {out[:30]}")


def indexed_at(store: RedisStore, names: list[str], at: int) -> None:
    states = register(store, *names)
    assert store.index([IndexWrite(n, states[n], 0, at) for n in names]) == [True] * len(names)


def one_bucket(store: RedisStore, names: list[str], count: int) -> list[str]:
    """``count`` of ``names`` whose due index is the same sorted set, in name order."""
    by_key: dict[str, list[str]] = {}
    for name in names:
        by_key.setdefault(store.index_key(name), []).append(name)
    found = max(by_key.values(), key=len)
    assert len(found) >= count, by_key
    return sorted(found)[:count]


def test_a_score_that_is_no_whole_ms_is_read_as_its_instant_in_name_order(
        store: RedisStore) -> None:
    """1000.7 beside 1000.2, their names the other way round, and beside 1000 itself: each
    is the instant 1000, in name order with every other entry of that instant."""
    t = now(store) + 60_000
    names = [f"e{i:02d}" for i in range(48)]
    indexed_at(store, names, t)
    a, b, c, d = one_bucket(store, names, 4)
    for name, score in ((a, t + 0.7), (c, t + 0.2), (d, t + 0.9)):
        store.client.zadd(store.index_key(name), {name: score})  # (written by hand)
    later = "later"
    indexed_at(store, [later], t + 1)
    expected = [(t, n) for n in sorted(names)]
    for limit in LIMITS:
        assert paged(store, t, limit) == expected, limit
        assert paged(store, t + 1, limit) == [*expected, (t + 1, later)], limit
        assert paged(store, t - 1, limit) == [], limit
    # A page that ends inside the instant goes on right after its last name.
    for name in (a, b, c, d):
        assert [e.name for e in store.due(t, 3, (t, name))] == [
            n for n in sorted(names) if n > name][:3], name
    ahead = store.due_ahead(t, 1000)
    assert [(e.next_due, e.name) for e in ahead.entries] == expected
    assert ahead.beyond == t + 1


def test_a_name_that_is_not_utf_8_is_left_out_and_hides_no_entry(store: RedisStore) -> None:
    """Bytes that are not UTF-8 (written by something else) name no entry: read with
    replacement characters they would sort elsewhere than their bytes, and a page ending on
    one would go on from the wrong place, past the entries between."""
    t = now(store) + 60_000
    names = ["a", "bé", "bz", "b\U0001f389", "c", "é", "z"]
    indexed_at(store, names, t)
    key = store.index_key("bé")
    store.client.zadd(key, {b"b\x80": t, b"b\xc3": t, b"\xff": t, b"b\xed\xa0\x80": t})
    store.client.zadd(store.index_key("z"), {b"b\xc3\xa9\xff": t})
    expected = [(t, n) for n in sorted(names, key=str.encode)]
    for limit in LIMITS:
        assert paged(store, t, limit) == expected, limit


def test_a_score_that_is_no_instant_is_left_out(store: RedisStore) -> None:
    t = now(store) + 60_000
    names = ["a", "b", "c"]
    indexed_at(store, names, t)
    store.client.zadd(store.index_key("b"), {"ghost": "-inf", "far-back": -(2 ** 60)})
    for limit in LIMITS:
        assert paged(store, t, limit) == [(t, n) for n in names], limit


def test_a_page_that_ends_inside_an_instant_with_names_not_utf_8_is_full(
        store: RedisStore) -> None:
    """A page that ends inside an instant one of whose scores is not a whole number of ms
    reads that instant whole: the names that are not UTF-8 it read before are left out
    there, and the page must still hold ``limit`` entries when the bucket holds them (the
    buckets' answers are merged: one answered short, the page is filled from another, past
    the entries it left out; a page that is short is the index's end)."""
    t = now(store) + 60_000
    key = store.index_key("x")
    other = next(store.index_key(n) for n in (f"y{i}" for i in range(100))
                 if store.index_key(n) != key)
    store.client.zadd(key, {b"a": t, b"b\xff": t, b"c\xff": t, b"d": t + 0.5, b"f": t + 1})
    store.client.zadd(other, {b"g": t + 2})
    expected = [(t, "a"), (t, "d"), (t + 1, "f"), (t + 2, "g")]
    for limit in (3, 1, 2, 3, 1000):  # (the first read of the store's life first)
        assert paged(store, t + 2, limit) == expected, limit
    assert [(e.next_due, e.name) for e in store.due(t + 2, 3)] == expected[:3]


#: Names' pieces: ASCII, UTF-8 of two and four bytes, and bytes that are not UTF-8 alone.
PIECES = (b"a", b"b", b"c", b"\xc3\xa9", b"\xf0\x9f\x8e\x89", b"\xff", b"\x80", b"\xed\xa0\x80")


def read_as_entries(held: list[tuple[bytes, float]], before: int) -> list[tuple[int, str]]:
    """What the due index ``held`` (name, score) answers up to ``before``: each score's
    instant its whole part, names that are not UTF-8 and scores that are no instant left
    out, in (instant, name's bytes) order."""
    out = []
    for name, score in held:
        if not math.isfinite(score) or abs(math.floor(score)) >= 2 ** 53:
            continue
        try:
            text = name.decode()
        except UnicodeDecodeError:
            continue
        if math.floor(score) <= before:
            out.append((math.floor(score), name, text))
    return [(at, text) for at, _, text in sorted(out)]


def test_pages_of_any_size_answer_what_the_index_holds_in_its_order(
        store: RedisStore) -> None:
    """Records written by something else, at random into one bucket, a few or all of
    them: whole and fractional scores at a few instants, scores that are no instant, names
    that are not UTF-8. Read from a store's first read on, pages of 1, 2, 3, 5 and 1,000
    answer each entry once, in order, whatever the instant read up to (40 indexes, each
    read 25 ways)."""
    all_keys = sorted({store.index_key(f"n{i}") for i in range(200)})
    for seed in range(40):
        rng = random.Random(seed)
        store.client.delete(*all_keys)
        keys = rng.sample(all_keys, rng.choice([1, 2, 3, len(all_keys)]))
        t = 1_000_000
        held: dict[bytes, float] = {}
        for _ in range(40):
            name = b"".join(rng.choice(PIECES if rng.random() < 0.3 else PIECES[:3])
                            for _ in range(rng.randint(1, 3)))
            at = t + rng.randint(-2, 3)
            score = rng.choice([float(at)] * 4 + [
                at + 0.1, at + 0.5, at + 0.999, float("-inf"), float("inf"), 2.0 ** 53,
                2.0 ** 53 - 1, -0.5])
            if name not in held:
                held[name] = score
                store.client.zadd(rng.choice(keys), {name: score})
        for before in (t - 3, t, t + 1, t + 3, 2 ** 53 - 1):
            expected = read_as_entries(list(held.items()), before)
            for limit in (1, 2, 3, 5, 1000):
                store._due_careful = False  # (as a new process reads it)
                assert paged(store, before, limit) == expected, (seed, before, limit, sorted(
                    held.items(), key=lambda kv: kv[1]))
