"""A schedule so large that registering it takes longer than the heartbeat's TTL: the beat
renews its heartbeat between the chunks of its registration (from its own loop), so it
never looks dead once it claims, and a lapse is not followed by a registration in one go
that lapses again (for ever: the beat then spends its ticks registering, late on
everything that falls due).

Scaled to the 2-core CI VM: 5,000 entries took 1.5 to 2 s to register in one store call
and 3 s to write as definitions, against a TTL of 1.2 s (a 0.4 s heartbeat).

Judged by the work the beat does between two heartbeats, not by the wall-clock gaps
between them: on a loaded VM one store call of a chunk may itself take longer than a TTL
(no fault of the beat's), while a beat that does not renew its heartbeat between chunks
does many chunks in one gap, whatever the load."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from beat_claims.beat.claimer import CLAIM_CHUNK, REGISTER_CHUNK
from beat_claims.beat.stored import PAGE
from beat_claims.entry_changes import CHUNK as WRITE_CHUNK
from beat_claims.scheduler import Scheduler

from .conftest import RedisServer, seed_settled_epoch
from .inprocess import make, make_app, occurrences_sent
from .processes import wait_for

N = 5_000
INTERVAL = 0.4
#: Each entry falls due a period after it is registered: after the stall and the
#: registration again, on a loaded VM too (and once only during the test).
PERIOD = timedelta(seconds=30)

#: The store calls that do a chunk of the beat's work (registering, writing and reading
#: definitions, claiming), the most items each may handle, and what it handled.
CHUNKED: dict[str, int] = {
    "register": REGISTER_CHUNK, "write_definitions": WRITE_CHUNK, "definitions": PAGE,
    "changes": PAGE, "claim": CLAIM_CHUNK,
}
#: Calls of chunked work begun once the heartbeat was due (an interval after the last
#: one, as the beat reckons it), before it was renewed: the call the beat had started
#: when it fell due, and one that follows it with no chunk boundary between (the read of
#: what was just written, the next phase's first chunk). A beat that does not renew its
#: heartbeat between chunks does every chunk left in that gap: several.
OVERDUE_CALLS = 2


@dataclass
class Call:
    kind: str
    items: int
    began: float  # monotonic
    since_heartbeat: float  # seconds since the beat's last heartbeat was answered
    heartbeats: int  # heartbeats before it


def items(kind: str, args: tuple[Any, ...], result: Any) -> int:
    if kind in ("claim", "check", "record_sent"):
        return len(args[1])
    if kind == "definitions":
        return len(result)
    if kind == "changes":
        return len(result.changed)
    return len(args[0])


def record_work(s: Scheduler) -> tuple[list[Call], list[list[str]]]:
    """The chunked store calls of ``s`` (on the store object its parts hold), each with
    how many heartbeats came before it, and the entries each registration call named."""
    calls: list[Call] = []
    heartbeats: list[float] = []
    registered: list[list[str]] = []
    liveness = s.liveness
    for kind in CHUNKED:
        real = getattr(s.store, kind)

        def wrapped(*args: Any, _kind: str = kind, _real: Any = real, **kw: Any) -> Any:
            began = time.monotonic()
            since = began - liveness.last
            count = len(heartbeats)
            result = _real(*args, **kw)
            calls.append(Call(_kind, items(_kind, args, result), began, since, count))
            if _kind == "register":
                registered.append([seed.name for seed in args[0]])
            return result

        setattr(s.store, kind, wrapped)
    real_beat = liveness.beat

    def beat(*args: Any, **kwargs: Any) -> bool:
        heartbeats.append(time.monotonic())
        return real_beat(*args, **kwargs)

    liveness.beat = beat  # type: ignore[method-assign]
    return calls, registered


def test_a_beat_with_more_entries_than_it_registers_in_a_ttl_keeps_its_heartbeat(
        server: RedisServer) -> None:
    """Registered, claimed and sent: every entry, each occurrence once; every store call
    a chunk at most, and the heartbeat renewed between chunks once due: while the beat
    writes its definitions and registers its entries (its first tick), while it claims
    and sends what falls due, and after a stall of a TTL (its heartbeat lapsed), while it
    registers its entries again: a chunk a tick, the heartbeat renewed between, each entry
    once more (no registration in one go, no lapse again)."""
    seed_settled_epoch(server)
    entries = {f"e{i:05d}": {"task": "t.noop", "schedule": PERIOD} for i in range(N)}
    app = make_app(server, entries, beat_claims_heartbeat_interval=INTERVAL,
                   beat_claims_catch_up_grace=60)
    s = make(app, settle=False)
    calls, registered = record_work(s)
    broker = server.client(db=1)
    lapses: list[float] = []  # when the beat found its heartbeat lapsed
    real_register_again = s.claimer.register_again

    def register_again() -> None:
        lapses.append(time.monotonic())
        real_register_again()

    s.claimer.register_again = register_again  # type: ignore[method-assign]
    stalled: list[float] = []

    def tick() -> None:
        if s._registered_once and not stalled:
            # A stall: nothing ticks for longer than a TTL (the beat's own heartbeat
            # lapses; it finds out at its next one, and registers its entries again).
            wait_for(lambda: time.monotonic() - s.liveness.renewed > s.liveness.ttl + 0.1,
                     10, "the beat's heartbeat to lapse", interval=0.02)
            stalled.append(time.monotonic())
        s.tick()

    try:
        wait_for(lambda: broker.llen("celery") >= N and len(
            {entry for entry, _ in occurrences_sent(server)}) == N and bool(lapses)
            and not s.claimer.again, 120,
            f"each of the {N} entries to be sent, and registered again after a lapse",
            interval=0.01, between=tick)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}: {broker.llen('celery')} sent, {len(lapses)} lapses, stalled at"
            f" {stalled}, {len(s.claimer.again)} to register again,"
            f" {sum(map(len, registered))} registrations in {len(calls)} calls") from exc
    finally:
        s.close()
    sent: Counter[Any] = Counter(occurrences_sent(server))
    assert max(sent.values()) == 1, f"sent twice: {[o for o, n in sent.items() if n > 1][:5]}"

    def show(c: Call) -> str:
        return (f"{c.kind}({c.items}) at {c.began - calls[0].began:.2f}s,"
                f" {c.since_heartbeat:.2f}s after heartbeat {c.heartbeats}")

    too_large = [show(c) for c in calls if c.items > CHUNKED[c.kind]]
    assert not too_large, f"store calls of more than a chunk: {too_large[:10]}"
    # Begun once the heartbeat was due, by heartbeat they followed: renewed between chunks,
    # at most OVERDUE_CALLS each.
    overdue: dict[int, list[Call]] = {}
    for c in calls:
        if c.since_heartbeat >= INTERVAL:
            overdue.setdefault(c.heartbeats, []).append(c)
    unrenewed = {n: [show(c) for c in cs] for n, cs in overdue.items()
                 if len(cs) > OVERDUE_CALLS}
    assert not unrenewed, (
        f"chunks done one after another with the heartbeat due ({INTERVAL}s after the last)"
        f" and not renewed between (by the heartbeat they followed): {unrenewed}")
    # Registered once at start, and once again after each lapse: the stall's (and any a
    # loaded VM made), never in one go (each call a chunk, above).
    times: Counter[str] = Counter(name for names in registered for name in names)
    assert set(times) == set(entries), set(entries) ^ set(times)
    assert max(times.values()) <= 1 + len(lapses), (
        f"registered more often than once and once a lapse ({len(lapses)} lapses):"
        f" {times.most_common(3)}")
    again = [c for c in calls if c.kind == "register" and c.began > lapses[0]]
    assert sum(c.items for c in again) >= N, (
        f"not registered again after the lapse: {[show(c) for c in again][:10]}")
