"""The judgement a redelivery makes of the process that started its run, from that
process's record in a real store (Redis, SQLite): alive when the record is renewed while
it waits, gone when it lapses (or stays missing) for an interval, never at once on a fresh
record, and bounded; and the setting that paces it. The processes here are records a
ProcessHeartbeat of this test keeps (or does not), as a worker process would."""

from __future__ import annotations

import signal
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery, signals
from celery.exceptions import Ignore, SoftTimeLimitExceeded

from beat_claims import worker
from beat_claims.enums import RunState, StartVerdict
from beat_claims.runs import iso
from beat_claims.settings import ConfigurationError, Settings
from beat_claims.stores.base import Claim, Outcome, Store, StoreError
from beat_claims.stores.redis import RedisStore, function_name
from beat_claims.stores.sqlite import SQLiteStore
from beat_claims.worker import _time_left
from beat_claims.worker_liveness import (
    Judgement,
    ProcessHeartbeat,
    StarterVerdict,
    judge_starter,
    poll_pace,
    ttl_of,
)

from .conftest import RedisServer, own_redis
from .contract.helpers import A, delivery, one_claim, process, send, started
from .faults import Proxy, proxy

INTERVAL = 0.2
TTL = ttl_of(INTERVAL)
POLL = poll_pace(INTERVAL)
#: What a loaded machine may add to a bound.
MARGIN = 1.0
STARTER, RECEIVER = process(1), process(2)


@pytest.fixture(params=["redis", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("server")
        s: Store = RedisStore.from_url(server.url, "bc-judgement")
    else:
        s = SQLiteStore.from_url(f"sqlite:///{tmp_path}/claims.db", "bc-judgement")
    yield s
    s.close()


@pytest.fixture
def starter_beats() -> Iterator[ProcessHeartbeat]:
    """The starter's heartbeat, renewed by its thread until the test ends."""
    beats = ProcessHeartbeat()
    yield beats
    beats.stop()


def started_by_starter(store: Store) -> Claim:
    c = send(store, A, one_claim(store, A))
    started(store, c, STARTER)
    return c


def judge(store: Store, c: Claim) -> tuple[Judgement, float]:
    """The receiver's judgement of its delivery of ``c``, and how long it took."""
    busy = store.start(delivery(c, RECEIVER))
    assert busy.verdict is StartVerdict.BUSY and busy.busy_with == STARTER, busy
    began = time.monotonic()
    judgement = judge_starter(store, delivery(c, RECEIVER), busy, INTERVAL)
    return judgement, time.monotonic() - began


def test_a_starter_that_renews_its_heartbeat_is_alive_within_an_interval(
        store: Store, starter_beats: ProcessHeartbeat) -> None:
    starter_beats.ensure(store, STARTER, INTERVAL)
    c = started_by_starter(store)
    judgement, took = judge(store, c)
    assert judgement.verdict is StarterVerdict.ALIVE, judgement
    assert judgement.decision.verdict is StartVerdict.BUSY
    assert "is alive" in judgement.decision.why, judgement
    assert took <= INTERVAL + POLL + MARGIN, judgement


def test_a_fresh_record_not_renewed_is_gone_when_it_lapses_and_not_before(
        store: Store) -> None:
    beat = store.worker_heartbeat(STARTER, TTL)  # its last renewal: then it was killed
    c = started_by_starter(store)
    judgement, took = judge(store, c)
    after = store.worker_liveness([]).now
    assert judgement.verdict is StarterVerdict.GONE, judgement
    assert after >= beat.expires_at, "taken for gone while its record was fresh"
    assert took <= TTL + POLL + MARGIN, judgement


@pytest.mark.parametrize("how", ["no-record", "lapsed-long-ago"])
def test_a_starter_lapsed_or_without_a_record_is_gone_after_one_interval_not_at_once(
        store: Store, how: str) -> None:
    if how == "lapsed-long-ago":
        beat = store.worker_heartbeat(STARTER, 0.01)
        while store.worker_liveness([]).now <= beat.expires_at:
            time.sleep(0.01)
    c = started_by_starter(store)
    judgement, took = judge(store, c)
    assert judgement.verdict is StarterVerdict.GONE, judgement
    # (a store that went back may hold no record, or an old one, of a live process: it
    # writes it again within an interval)
    assert INTERVAL <= took <= INTERVAL + POLL + MARGIN, judgement


def test_a_starter_whose_record_is_missing_then_written_again_is_alive(
        store: Store, starter_beats: ProcessHeartbeat) -> None:
    c = started_by_starter(store)  # a store that lost the live starter's record
    threading.Timer(INTERVAL / 2, starter_beats.ensure, (store, STARTER, INTERVAL)).start()
    judgement, _ = judge(store, c)
    assert judgement.verdict is StarterVerdict.ALIVE, judgement


def test_a_live_starter_whose_record_went_back_with_the_store_is_alive_when_renewals_are_slow(
        starter_beats: ProcessHeartbeat) -> None:
    """The store goes back (``DEBUG RELOAD`` of a snapshot older than the starter's TTL):
    there the live starter's record has lapsed. The starter writes it again at its next
    renewal, which a store far away (replies a while late) stamps more than one interval
    after the last. A judgement that began just after the restore must not take the live
    starter for gone for want of a renewal exactly one interval after it began."""
    with own_redis(["--enable-debug-command", "yes"]) as server, proxy(server.port) as p:
        p.delay = INTERVAL / 2  # each reply half an interval late (only the starter's)
        plain = RedisStore.from_url(server.url, "bc-judgement")
        through = RedisStore.from_url(p.url(), "bc-judgement")
        try:
            starter_beats.ensure(through, STARTER, INTERVAL)
            c = started_by_starter(plain)
            client = server.client()
            client.save()  # the snapshot: the run started, the starter's record fresh
            time.sleep(TTL + INTERVAL)  # (the snapshot's record has lapsed by now)
            last = plain.worker_liveness([STARTER]).records[0]
            deadline = time.monotonic() + 10 * INTERVAL
            while (now := plain.worker_liveness([STARTER]).records[0]) == last:
                assert time.monotonic() < deadline, "the starter stopped renewing"
                time.sleep(0.002)
            client.execute_command("DEBUG", "RELOAD", "NOSAVE")  # just after a renewal
            [back] = plain.worker_liveness([STARTER]).records
            assert back is not None and now is not None and back.renewed_at < now.renewed_at
            judgement, took = judge(plain, c)
            assert judgement.verdict is StarterVerdict.ALIVE, (judgement, took)
        finally:
            plain.close()
            through.close()


def test_a_run_that_ends_while_it_waits_refuses_the_delivery(store: Store) -> None:
    store.worker_heartbeat(STARTER, TTL)
    c = started_by_starter(store)
    threading.Timer(INTERVAL / 2, store.finish,
                    ([Outcome(c.entry, c.due, c.token, RunState.DONE)],)).start()
    judgement, took = judge(store, c)
    assert judgement.verdict is StarterVerdict.SETTLED, judgement
    assert judgement.decision.verdict is StartVerdict.REFUSED
    assert "done" in judgement.decision.why
    assert took < TTL, judgement


def test_a_run_given_back_while_it_waits_is_started_by_the_waiting_delivery(
        store: Store) -> None:
    store.worker_heartbeat(STARTER, TTL)
    c = started_by_starter(store)
    threading.Timer(INTERVAL / 2, store.requeue, (delivery(c, STARTER),)).start()
    judgement, _ = judge(store, c)
    assert judgement.verdict is StarterVerdict.SETTLED, judgement
    assert judgement.decision.verdict is StartVerdict.RUN


def test_a_time_limit_shorter_than_the_wait_cuts_it_short_and_refuses(store: Store) -> None:
    """A delivery killed by its time limit in the middle of the judgement would run (the
    judgement is made in task_prerun): the judgement ends first, and refuses."""
    store.worker_heartbeat(STARTER, TTL)
    c = started_by_starter(store)
    busy = store.start(delivery(c, RECEIVER))
    began = time.monotonic()
    judgement = judge_starter(store, delivery(c, RECEIVER), busy, INTERVAL, limit=0.1)
    assert judgement.verdict is StarterVerdict.CUT_SHORT, judgement
    assert judgement.decision.verdict is StartVerdict.BUSY
    assert "time limit" in judgement.decision.why
    assert time.monotonic() - began <= 0.1 + POLL + MARGIN


@pytest.mark.parametrize(("message", "hard", "soft", "left"), [
    (None, None, None, None),
    (None, 10, None, 9.0),
    (None, 10, 6, 5.0),
    ((4, None), 10, 6, 3.0),
    ((None, 2), None, None, 1.0),
    ((0.5, None), None, None, 0.0),
])
def test_the_time_a_judgement_may_take_is_the_shorter_time_limit_less_a_second(
        message: tuple[float | None, float | None] | None, hard: float | None,
        soft: float | None, left: float | None) -> None:
    app = Celery("t", set_as_current=False)

    @app.task(time_limit=hard, soft_time_limit=soft, shared=False)
    def limited() -> None: ...

    request = types.SimpleNamespace(timelimit=message)
    assert _time_left(limited, request) == left


def test_a_process_heartbeat_is_written_before_ensure_returns_and_renewed_after(
        store: Store, starter_beats: ProcessHeartbeat) -> None:
    starter_beats.ensure(store, STARTER, INTERVAL)
    [first] = store.worker_liveness([STARTER]).records
    assert first is not None and first.expires_at - first.renewed_at == int(TTL * 1000)
    starter_beats.ensure(store, STARTER, INTERVAL)  # again: no second write, no thread
    assert store.worker_liveness([STARTER]).records == (first,)
    deadline = time.monotonic() + INTERVAL + MARGIN
    while (r := store.worker_liveness([STARTER]).records[0]) == first:
        assert time.monotonic() < deadline, "not renewed within an interval"
        time.sleep(0.02)
    assert r is not None and r.renewed_at > first.renewed_at
    starter_beats.stop()
    time.sleep(INTERVAL + POLL)  # (one renewal may have been under way)
    [last] = store.worker_liveness([STARTER]).records
    time.sleep(INTERVAL * 2)
    assert store.worker_liveness([STARTER]).records == (last,), "renewed after stop()"


def test_a_soft_time_limit_that_ends_a_judgement_refuses_the_delivery(
        server: RedisServer, monkeypatch: pytest.MonkeyPatch,
        starter_beats: ProcessHeartbeat) -> None:
    """A soft time limit the judgement could not know of fires while it waits on a live
    starter: Celery's signal dispatch swallows an exception raised in ``task_prerun``, so
    the delivery must already stand refused, never left undecided (it would run beside
    the starter). The limit is delivered as Celery's pool delivers it: a signal whose
    handler raises SoftTimeLimitExceeded in the middle of whatever runs."""
    store = RedisStore.from_url(server.url, "bc-judgement")
    starter_beats.ensure(store, STARTER, 60)  # renewed in a minute: the judgement waits
    c = started_by_starter(store)
    app = Celery("judged", set_as_current=False)
    app.conf.update(beat_claims_url=server.url, beat_claims_key_prefix="bc-judgement",
                    beat_claims_worker_heartbeat_interval=60)
    context = worker._Context()
    context.app = app
    monkeypatch.setattr(worker, "_context", context)
    monkeypatch.setattr(worker, "_heartbeat", ProcessHeartbeat())

    @app.task(name="t.body")
    def body() -> None:
        return None

    def soft_limit(signum: int, frame: object) -> None:
        raise SoftTimeLimitExceeded()

    previous = signal.signal(signal.SIGALRM, soft_limit)
    body.push_request(id="tid-1", hostname="w2@receiving-host", retries=0,
                      beat_claims={"entry": c.entry, "due": iso(c.due), "token": c.token})
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        signals.task_prerun.send(sender=body, task_id="tid-1", task=body)  # as the tracer
        signal.setitimer(signal.ITIMER_REAL, 0)
        with pytest.raises(Ignore):
            worker.fence(body)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        body.pop_request()
        worker._heartbeat.stop()
        store.close()


# -- lost replies (Redis, through a proxy that loses the reply after the server acted) --------
@pytest.fixture
def lossy(server: RedisServer) -> Iterator[tuple[RedisStore, RedisStore, Proxy]]:
    """A store whose replies the proxy may lose, and a plain one on the same server."""
    with proxy(server.port) as p:
        through, plain = (RedisStore.from_url(url, "bc-judgement")
                          for url in (p.url(), server.url))
        yield through, plain, p
        through.close()
        plain.close()


def test_a_heartbeat_whose_reply_was_lost_was_written_and_is_written_again(
        lossy: tuple[RedisStore, RedisStore, Proxy], starter_beats: ProcessHeartbeat) -> None:
    through, plain, p = lossy
    p.drop_reply_to(function_name("worker_heartbeat"))
    with pytest.raises(StoreError):  # the worker runs that delivery unfenced, as on any failure
        starter_beats.ensure(through, STARTER, INTERVAL)
    [written] = plain.worker_liveness([STARTER]).records
    assert written is not None, "the server acted: the record is there"
    starter_beats.ensure(through, STARTER, INTERVAL)  # the next delivery: written again
    [again] = plain.worker_liveness([STARTER]).records
    assert again is not None and again.renewed_at >= written.renewed_at


def test_a_renewal_whose_reply_was_lost_is_renewed_again_and_never_lapses(
        lossy: tuple[RedisStore, RedisStore, Proxy], starter_beats: ProcessHeartbeat) -> None:
    through, plain, p = lossy
    starter_beats.ensure(through, STARTER, INTERVAL)
    p.drop_reply_to(function_name("worker_heartbeat"), times=2)
    deadline = time.monotonic() + 4 * INTERVAL + MARGIN
    while p.pending() or time.monotonic() < deadline - MARGIN:
        read = plain.worker_liveness([STARTER])
        assert read.records[0] is not None and read.records[0].alive(read.now), read
        assert time.monotonic() < deadline, "the lost replies were never asked"
        time.sleep(0.02)


def test_a_read_whose_reply_was_lost_while_judging_is_asked_again(
        lossy: tuple[RedisStore, RedisStore, Proxy], starter_beats: ProcessHeartbeat) -> None:
    through, plain, p = lossy
    starter_beats.ensure(plain, STARTER, INTERVAL)
    c = started_by_starter(plain)
    busy = through.start(delivery(c, RECEIVER))
    p.drop_reply_to(through.worker_key(STARTER))  # the judgement's first read of the record
    judgement = judge_starter(through, delivery(c, RECEIVER), busy, INTERVAL)
    assert p.pending() == 0
    assert judgement.verdict is StarterVerdict.ALIVE, judgement


# -- the setting ----------------------------------------------------------------------------
def settings(**conf: object) -> Settings:
    app = Celery("t", set_as_current=False)
    app.conf.update(beat_claims_url="redis://127.0.0.1:1/0", **conf)
    return Settings.from_app(app)


def test_the_worker_heartbeat_interval_defaults_to_five_seconds() -> None:
    assert settings().worker_heartbeat_interval == 5.0
    assert settings(beat_claims_worker_heartbeat_interval=2).worker_heartbeat_interval == 2.0


@pytest.mark.parametrize("value", [0, -1, 0.05, 61, float("nan"), "soon", True])
def test_a_worker_heartbeat_interval_out_of_range_is_refused_naming_it(value: object) -> None:
    with pytest.raises(ConfigurationError, match="beat_claims_worker_heartbeat_interval"):
        settings(beat_claims_worker_heartbeat_interval=value)
