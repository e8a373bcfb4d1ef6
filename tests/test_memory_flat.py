"""A beat's memory does not grow with the runs it sends (docs/benchmarks.md, "Memory over
time"; ``bench/soak.py`` measures it for minutes)."""

from __future__ import annotations

from datetime import timedelta

from .conftest import RedisServer, own_redis
from .inprocess import make, make_app, messages, occurrences_sent
from .processes import wait_for

SENDS = 200


def test_sending_with_a_redis_result_backend_leaves_nothing_subscribed(
        server: RedisServer, broker: RedisServer) -> None:
    """With a Redis result backend, Celery subscribes the caller to each sent task's
    result channel, and redis-py keeps every channel whose unsubscribe nobody read: a beat
    would keep one per run sent. The beat waits for no result: it subscribes to none, and
    the messages still ask the worker to store the result."""
    with own_redis() as results:
        app = make_app(server, {
            f"e{i}": {"task": "t.noop", "schedule": timedelta(seconds=0.2)} for i in range(20)
        }, broker=broker, result_backend=f"redis://127.0.0.1:{results.port}/0")
        s = make(app)
        try:
            wait_for(lambda: len(occurrences_sent(broker)) >= SENDS, 60,
                     f"{SENDS} runs sent", interval=0.01, between=s.tick)
            stats = results.client().info("commandstats")
            subscribes = int(stats.get("cmdstat_subscribe", {}).get("calls", 0))
            consumer = getattr(app.backend, "result_consumer", None)
            pubsub = getattr(consumer, "_pubsub", None)
            kept = (len(pubsub.channels) + len(pubsub.pending_unsubscribe_channels)
                    if pubsub is not None else 0)
            sent = len(occurrences_sent(broker))
            assert (subscribes, kept) == (0, 0), (
                f"after {sent} runs sent: {subscribes} SUBSCRIBE(s) to the result backend,"
                f" {kept} channel(s) kept by the beat's PubSub")
            ignored = [m["id"] for m in messages(broker) if m["headers"].get("ignore_result")]
            assert not ignored, f"messages that ask the worker not to store the result: {ignored}"
        finally:
            s.close()
