"""A beat with occurrences due a few ms apart (many entries, spread by jitter) sends them
together, a tick at most every ``GATHER`` seconds: one claim, one sent mark and (their
instants come) no check of its own for many, rather than each on its own tick; an
occurrence that falls due after a quiet spell is not held back. Dynamic entries falling
due all the time are taken from the due index a quarter of a second's worth at a time
(``SCAN_EVERY``), not a second's, so that reading their definitions never holds the sends
up for long. In-process beats on a real redis-server."""

from __future__ import annotations

import itertools
import time
from datetime import timedelta
from typing import Any

from beat_claims.beat.window import LOOKAHEAD, SCAN_EVERY
from beat_claims.entries import Entries
from beat_claims.scheduler import GATHER, Scheduler
from beat_claims.stores.base import Store

from .conftest import RedisServer
from .inprocess import make, make_app, occurrences_sent, run_for, settled_epoch

#: 240 entries every 4 s, each occurrence at its own offset within 4 s: one every ~17 ms.
SPREAD = {f"s{i:03d}": {"task": "t.noop", "schedule": timedelta(seconds=4),
                        "claims": {"jitter": 4}} for i in range(240)}


class StoreCalls:
    """Counts the store calls a beat makes, by name (the store itself is real)."""

    def __init__(self, store: Store, names: tuple[str, ...]) -> None:
        self.counts = dict.fromkeys(names, 0)
        for name in names:
            real = getattr(store, name)

            def counted(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
                self.counts[_name] += 1
                return _real(*args, **kw)

            setattr(store, name, counted)


def drive(beat: Scheduler, seconds: float) -> list[tuple[float, int]]:
    """Tick as Celery's beat loop does (sleep what tick() answers) for ``seconds``: for
    each tick that published, when it began (monotonic) and how many it published."""
    ticks: list[tuple[float, int]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        began, before = time.monotonic(), beat.sender.published
        wait = beat.tick()
        if beat.sender.published > before:
            ticks.append((began, beat.sender.published - before))
        time.sleep(max(0.0, wait))
    return ticks


def test_occurrences_due_a_few_ms_apart_go_out_together_each_once(
        server: RedisServer) -> None:
    app = make_app(server, SPREAD)
    settled_epoch(app)
    beat = make(app)
    calls = StoreCalls(beat.store, ("claim", "check", "record_sent"))
    try:
        ticks = drive(beat, 9)
    finally:
        beat.close()
    sent = occurrences_sent(server)
    assert len(sent) == len(set(sent)), "an occurrence was sent twice"
    published = sum(n for _, n in ticks)
    assert published >= 240, (published, ticks[:20])  # at least one period's worth
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(ticks)]
    # A tick that published is followed by the next one that does no sooner than GATHER.
    assert min(gaps) >= GATHER - 0.005, sorted(gaps)[:10]
    assert published / len(ticks) >= 2, (published, len(ticks))
    # Their instants had come when they were claimed: checked with the claim, not again.
    assert calls.counts["check"] == 0, calls.counts
    assert calls.counts["claim"] <= len(ticks) + 20, (calls.counts, len(ticks))
    assert calls.counts["record_sent"] <= len(ticks) + 20, (calls.counts, len(ticks))


def test_an_occurrence_due_after_a_quiet_spell_is_not_held_back(server: RedisServer) -> None:
    """One entry every second: after it was sent, the beat waits for the next instant
    (shorter than GATHER once it comes close), not GATHER after its last send."""
    app = make_app(server, {"one": {"task": "t.noop", "schedule": timedelta(seconds=1)}})
    settled_epoch(app)
    beat = make(app)
    try:
        drive(beat, 1.5)  # sent at least once
        assert beat.sender.published >= 1
        deadline = time.monotonic() + 10
        close: list[float] = []
        seen: list[float] = []
        while not close:
            assert time.monotonic() < deadline, ("the next instant never came within"
                                                 f" GATHER: {seen[-20:]}")
            due = beat.claimer.next_due()
            assert due is not None
            ahead = (due - beat.clock.now()) / 1000
            seen.append(round(ahead, 4))
            if 0.005 < ahead < GATHER / 2 and time.monotonic() - beat._sent_at > GATHER:
                published = beat.sender.published
                wait = beat.tick()
                if beat.sender.published == published:  # (else the instant came during
                    close.append(ahead)  # a slow tick: it was sent; on to the next)
            elif ahead <= 0.005:  # (missed this one: sent, and on to the next)
                beat.tick()
            else:
                time.sleep(min(0.004, ahead - GATHER / 4))
        assert wait <= close[0] + 0.002, (wait, close)
    finally:
        beat.close()


def test_dynamic_entries_due_all_the_time_are_taken_a_quarter_second_at_a_time(
        server: RedisServer) -> None:
    """600 dynamic entries every 4 s, spread by jitter (150 falling due a second): once
    the beat runs, each scan of the due index takes what falls due in about SCAN_EVERY
    (about 40), where a scan each half look-ahead took a second's worth (150). (A
    heartbeat interval longer than a second: a pass starts again from the first entry at
    each, as often as this at make_app's half second.)"""
    app = make_app(server, schedule={}, beat_claims_heartbeat_interval=3)
    settled_epoch(app)
    with Entries(app) as entries:
        entries.bulk_create([{"name": f"d{i:03d}", "task": "t.noop", "schedule": {"every": 4},
                              "claims": {"jitter": 4}} for i in range(600)])
    beat = make(app)
    taken: list[int] = []
    real_scan = beat.window.scan

    def scan(now: int) -> list[Any]:
        got = real_scan(now)
        if got:
            taken.append(len(got))
        return got

    beat.window.scan = scan  # type: ignore[method-assign]
    try:
        run_for(3 + LOOKAHEAD / 1000, beat)  # the first scans take the look-ahead at once
        taken.clear()
        run_for(4, beat)
    finally:
        beat.close()
    sent = occurrences_sent(server)
    assert len(sent) == len(set(sent)), "an occurrence was sent twice"
    per_second = 600 / 4
    assert len(taken) >= 8, taken  # (a scan at least every half second)
    # The median scan takes about SCAN_EVERY's worth (a tick late on a loaded machine
    # makes one scan take more: the median, not the largest).
    assert sorted(taken)[len(taken) // 2] <= per_second * SCAN_EVERY / 1000 * 2, taken
