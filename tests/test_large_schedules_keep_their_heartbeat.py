"""A schedule so large that registering it takes longer than the heartbeat's TTL: the beat
renews its heartbeat between the chunks of its registration (from its own loop), so it
never looks dead once it claims, and a lapse is not followed by a registration in one go
that lapses again (for ever: the beat then spends its ticks registering, late on
everything that falls due).

Scaled to the 2-core CI VM: 5,000 entries took 1.5 to 2 s to register in one store call
and 3 s to write as definitions, against a TTL of 1.2 s (a 0.4 s heartbeat)."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from datetime import timedelta
from typing import Any

from .conftest import RedisServer, seed_settled_epoch
from .inprocess import make, make_app, occurrences_sent
from .processes import wait_for
from .test_scale import record_heartbeats

N = 5_000
INTERVAL = 0.4
PERIOD = timedelta(seconds=10)


def test_a_beat_with_more_entries_than_it_registers_in_a_ttl_keeps_its_heartbeat(
        server: RedisServer) -> None:
    """Registered, claimed and sent: every entry, each occurrence once, and no two
    heartbeats a TTL apart from the first on: while the beat writes its definitions and
    registers its entries (its first tick), and while it claims and sends what falls due
    (no lapse, and so no registration again)."""
    seed_settled_epoch(server)
    entries = {f"e{i:05d}": {"task": "t.noop", "schedule": PERIOD} for i in range(N)}
    app = make_app(server, entries, beat_claims_heartbeat_interval=INTERVAL,
                   beat_claims_catch_up_grace=60)
    s = make(app, settle=False)
    times = record_heartbeats(s)
    broker = server.client(db=1)
    ticks: list[tuple[float, float]] = []  # (began, took)
    ready: list[float] = []

    def tick() -> None:
        began = time.monotonic()
        s.tick()
        ticks.append((began, time.monotonic() - began))
        if not ready and s._registered_once:
            ready.append(time.monotonic())

    try:
        wait_for(lambda: broker.llen("celery") >= N and len(
            {entry for entry, _ in occurrences_sent(server)}) == N, 55,
            f"each of the {N} entries to be sent", interval=0.01, between=tick)
    finally:
        s.close()
    ttl = 3 * INTERVAL
    gaps = [(round(x - ready[0], 2), round(y - x, 2))
            for x, y in itertools.pairwise(times) if y - x >= ttl]
    longest = sorted(((round(b - ready[0], 2), round(d, 2)) for b, d in ticks),
                     key=lambda t: -t[1])[:5]
    assert not gaps, (
        f"heartbeat gaps of a TTL ({ttl}s) or more (s after the beat was ready to claim,"
        f" gap): {gaps[:10]}; the longest ticks (s after ready, took): {longest}")
    sent: Counter[Any] = Counter(occurrences_sent(server))
    assert max(sent.values()) == 1, f"sent twice: {[o for o, n in sent.items() if n > 1][:5]}"
