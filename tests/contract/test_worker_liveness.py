"""worker_heartbeat and worker_liveness: the liveness of the processes that execute
deliveries, kept in the store by each of them, read by a redelivery that must judge
whether the process that started its run is gone (never by asking that process)."""

from __future__ import annotations

import math

import pytest

from beat_claims.stores.base import Store, WorkerProcess

from .conftest import Backend
from .helpers import poll

TTL = 10.0
P1 = WorkerProcess("w1@host-a", 4242, "boot-a:1001")
P2 = WorkerProcess("w2@host-b", 4242, "boot-b:2002")
#: The same node name and pid as P1, another process (restarted, the pid reused).
P1_AGAIN = WorkerProcess("w1@host-a", 4242, "boot-a:9009")
NEVER = WorkerProcess("w9@host-z", 1, "boot-z:1")


def record_of(store: Store, process: WorkerProcess) -> object:
    return store.worker_liveness([process]).records[0]


def test_a_heartbeat_says_when_it_was_renewed_and_when_it_lapses(store: Store) -> None:
    before = store.worker_liveness([]).now
    beat = store.worker_heartbeat(P1, TTL)
    read = store.worker_liveness([P1])
    assert beat.process == P1
    assert before <= beat.renewed_at <= read.now
    assert beat.expires_at - beat.renewed_at == int(TTL * 1000)
    assert read.records == (beat,)
    assert beat.alive(read.now) and not beat.alive(beat.expires_at)


def test_each_process_asked_is_answered_in_order_none_without_a_record(store: Store) -> None:
    one, two = store.worker_heartbeat(P1, TTL), store.worker_heartbeat(P2, TTL)
    read = store.worker_liveness([P2, NEVER, P1])
    assert read.records == (two, None, one)
    assert store.worker_liveness([]).records == ()


def test_a_renewal_moves_the_record_forward(store: Store) -> None:
    first = store.worker_heartbeat(P1, TTL)
    poll(lambda: store.worker_liveness([]).now > first.renewed_at, 5,
         "the store clock to pass the first renewal")
    again = store.worker_heartbeat(P1, 2 * TTL)
    assert again.renewed_at > first.renewed_at
    assert again.expires_at == again.renewed_at + int(2 * TTL * 1000)
    assert record_of(store, P1) == again


def test_a_record_lapses_after_its_ttl_and_reads_lapsed(store: Store) -> None:
    beat = store.worker_heartbeat(P1, 0.05)
    read = poll(lambda: r if not (r := store.worker_liveness([P1])).records[0].alive(  # type: ignore[union-attr]
        r.now) else None, 5, "the record to lapse")
    assert read.records == (beat,), "a lapsed record is kept (until worker_records_kept)"
    assert read.now >= beat.expires_at


def test_another_process_with_the_same_name_and_pid_has_a_record_of_its_own(
        store: Store) -> None:
    old = store.worker_heartbeat(P1, 0.05)
    assert record_of(store, P1_AGAIN) is None
    new = store.worker_heartbeat(P1_AGAIN, TTL)
    assert store.worker_liveness([P1, P1_AGAIN]).records == (old, new)


def test_a_heartbeat_whose_reply_was_lost_renews_it_again(store: Store) -> None:
    store.worker_heartbeat(P1, TTL)
    again = store.worker_heartbeat(P1, TTL)  # the first reply was lost: sent again
    assert record_of(store, P1) == again
    # Reads are plain reads: asked again, the same records.
    assert store.worker_liveness([P1, P2]).records == store.worker_liveness([P1, P2]).records


@pytest.mark.parametrize("raw", [
    "not json at all",
    "[1, 2, 3]",
    '{"worker": "w1@host-a", "pid": 4242, "process": "boot-a:1001"}',
    '{"worker": "w1@host-a", "pid": 4242, "process": "boot-a:1001", "renewed_at": "soon",'
    ' "expires_at": 1}',
    '{"worker": "w1@host-a", "pid": 4242, "process": "boot-a:1001", "renewed_at": true,'
    ' "expires_at": 1e300}',
    # a well-formed record of another process under this one's id
    '{"worker": "w7@host-q", "pid": 7, "process": "x", "renewed_at": 1, "expires_at": 9e12}',
], ids=["not-json", "not-an-object", "no-instants", "text-instant", "bool-and-huge",
        "another-process"])
def test_a_bad_record_reads_as_none_and_the_next_heartbeat_replaces_it(
        store: Store, backend: Backend, raw: str) -> None:
    store.worker_heartbeat(P1, TTL)
    two = store.worker_heartbeat(P2, TTL)
    backend.corrupt_worker_record(store, P1, raw)
    # Never taken for a live process, and the other processes of the call are answered.
    assert store.worker_liveness([P1, P2]).records == (None, two)
    again = store.worker_heartbeat(P1, TTL)
    assert record_of(store, P1) == again


def test_records_lapsed_longer_than_kept_are_removed(store: Store) -> None:
    store.worker_records_kept = 0.2
    store.worker_heartbeat(P1, 0.05)
    store.worker_heartbeat(P2, TTL)

    def removed() -> bool:
        store.worker_heartbeat(P2, TTL)  # (a SQL store removes them at a heartbeat)
        return record_of(store, P1) is None

    poll(removed, 10, "the record lapsed long ago to be removed")
    assert record_of(store, P2) is not None  # a live process's record stays


def test_the_clean_up_is_bounded_and_clears_any_pile_over_heartbeats(store: Store) -> None:
    store.worker_records_kept = 0.05
    pile = [WorkerProcess(f"gone-{n}@host", n, f"boot:{n}") for n in range(150)]
    last = max(store.worker_heartbeat(process, 0.05).expires_at for process in pile)
    poll(lambda: store.worker_liveness([]).now > last + 200, 5,
         "the pile to lapse past its keep")
    # At most a hundred a heartbeat on a SQL store (by expiry on Redis): a few heartbeats
    # clear 150.
    for _ in range(3):
        store.worker_heartbeat(P1, TTL)
    assert [r for r in store.worker_liveness(pile).records if r is not None] == []


@pytest.mark.parametrize("ttl", [0, -1.0, math.nan, math.inf, True, "10"],
                         ids=["zero", "negative", "nan", "inf", "bool", "text"])
def test_a_ttl_that_is_no_positive_number_is_refused_and_nothing_is_written(
        store: Store, ttl: object) -> None:
    with pytest.raises(ValueError, match="ttl"):
        store.worker_heartbeat(P1, ttl)  # type: ignore[arg-type]
    assert record_of(store, P1) is None


def test_a_wiped_store_has_no_record_until_the_next_heartbeat(store: Store,
                                                              backend: Backend) -> None:
    store.worker_heartbeat(P1, TTL)
    backend.wipe(store)
    assert record_of(store, P1) is None
    again = store.worker_heartbeat(P1, TTL)
    assert record_of(store, P1) == again


def test_a_restarted_store_keeps_the_records(store: Store, backend: Backend) -> None:
    beat = store.worker_heartbeat(P1, 60)
    backend.restart(store)

    def read() -> object:
        try:
            return store.worker_liveness([P1])
        except Exception:
            return None

    answer = poll(read, 10, "the store to answer after the restart")
    assert answer.records == (beat,)  # type: ignore[attr-defined]
