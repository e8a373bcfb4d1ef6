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

import inspect
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from beat_claims.beat.claimer import CLAIM_CHUNK, REGISTER_CHUNK
from beat_claims.beat.sender import SEND_BATCH
from beat_claims.beat.stored import PAGE
from beat_claims.entry_changes import CHUNK as WRITE_CHUNK
from beat_claims.scheduler import Scheduler
from beat_claims.stores.base import Store

from .conftest import RedisServer, seed_settled_epoch
from .inprocess import make, make_app, occurrences_sent
from .processes import wait_for

N = 5_000
INTERVAL = 0.4
#: Each entry falls due a period after it is registered: after the stall and the
#: registration again, on a loaded VM too (and once only during the test).
PERIOD = timedelta(seconds=30)

#: The store calls that do a chunk of the beat's work (registering, writing and reading
#: definitions, claiming, the check before publish and the sent marks), the most items
#: each may handle, and what it handled.
CHUNKED: dict[str, int] = {
    "register": REGISTER_CHUNK, "write_definitions": WRITE_CHUNK, "definitions": PAGE,
    "changes": PAGE, "claim": CLAIM_CHUNK, "check": SEND_BATCH, "record_sent": SEND_BATCH,
}
#: Chunked calls each seen in this test: renamed, they would be timed on nothing.
SEEN = ("register", "write_definitions", "claim", "check", "record_sent")
#: Every store call the beat makes but its heartbeat: each is work done between two
#: heartbeats (the Store API's public methods; a call made inside another is its part).
TIMED = sorted(name for name, _ in inspect.getmembers(Store, inspect.isfunction)
               if not name.startswith("_") and name != "heartbeat")
#: Chunked store calls begun once the heartbeat was due (an interval after the last one,
#: as the beat reckons it), before it was renewed: the call the beat had started when it
#: fell due, and one that follows it with no chunk boundary between (the read of what was
#: just written, the next phase's first chunk, the sent marks of the batch just
#: published). A beat that does not renew its heartbeat between chunks does every chunk
#: left in that gap: several (25 checks and 50 sent marks for 5,000 entries).
OVERDUE_CALLS = 2
#: Store calls of any kind begun once the heartbeat was due, before it was renewed: those
#: two, and a tick's own few calls that follow them before the next tick heartbeats (a
#: page of the due index, the sweep's reads, the index kept, the pauses checked).
OVERDUE_ANY = 10
#: Messages published once the heartbeat was due, before it was renewed: one send batch
#: at most (each batch begins with the heartbeat renewed if half an interval old).
OVERDUE_PUBLISHES = SEND_BATCH


@dataclass
class Call:
    kind: str
    items: int
    began: float  # monotonic
    since_heartbeat: float  # seconds since the beat's last heartbeat was answered
    heartbeats: int  # heartbeats before it
    took: float = 0.0  # seconds


def items(kind: str, args: tuple[Any, ...], result: Any) -> int:
    if kind not in CHUNKED:
        return 0
    if kind in ("claim", "check", "record_sent"):
        return len(args[1])
    if kind == "definitions":
        return len(result)
    if kind == "changes":
        return len(result.changed)
    return len(args[0])


@dataclass
class Work:
    """What the beat did, as the test saw it."""
    calls: list[Call]  # every store call but the heartbeat's (the outer one of nested)
    heartbeats: list[Call]  # each heartbeat (Liveness.beat), and how long it took
    publishes: list[Call]  # each message published
    registered: list[list[str]]  # the entries each registration call named


def record_work(s: Scheduler) -> Work:
    """Every store call of ``s`` (on the store object its parts hold) but its heartbeat,
    and every publish, each with how many heartbeats came before it."""
    work = Work([], [], [], [])
    liveness = s.liveness
    depth = threading.local()

    def wrap(kind: str, real: Any) -> Any:
        def wrapped(*args: Any, **kw: Any) -> Any:
            outer = getattr(depth, "n", 0) == 0
            depth.n = getattr(depth, "n", 0) + 1
            began = time.monotonic()
            since = began - liveness.last
            count = len(work.heartbeats)
            try:
                result = real(*args, **kw)
            finally:
                depth.n -= 1
            if outer and kind != "heartbeat":
                work.calls.append(Call(kind, items(kind, args, result), began, since, count,
                                       time.monotonic() - began))
                if kind == "register":
                    work.registered.append([seed.name for seed in args[0]])
            return result
        return wrapped

    for kind in [*TIMED, "heartbeat"]:
        setattr(s.store, kind, wrap(kind, getattr(s.store, kind)))
    real_beat = liveness.beat

    def beat(*args: Any, **kwargs: Any) -> bool:
        began = time.monotonic()
        call = Call("heartbeat", 0, began, began - liveness.last, len(work.heartbeats))
        work.heartbeats.append(call)
        try:
            return real_beat(*args, **kwargs)
        finally:
            call.took = time.monotonic() - began

    liveness.beat = beat  # type: ignore[method-assign]
    real_publish = s._publish

    def publish(*args: Any, **kwargs: Any) -> Any:
        began = time.monotonic()
        work.publishes.append(Call("publish", 1, began, began - liveness.last,
                                   len(work.heartbeats)))
        return real_publish(*args, **kwargs)

    s._publish = publish  # type: ignore[method-assign]
    return work


def overdue(calls: list[Call], most: int) -> dict[int, list[Call]]:
    """Those of ``calls`` begun once the heartbeat was due, by the heartbeat they followed,
    where there were more than ``most``."""
    found: dict[int, list[Call]] = {}
    for c in calls:
        if c.since_heartbeat >= INTERVAL:
            found.setdefault(c.heartbeats, []).append(c)
    return {n: cs for n, cs in found.items() if len(cs) > most}


def test_a_beat_with_more_entries_than_it_registers_in_a_ttl_keeps_its_heartbeat(
        server: RedisServer) -> None:
    """Registered, claimed and sent: every entry, each occurrence once; every store call
    a chunk at most, and the heartbeat renewed between chunks once due: while the beat
    writes its definitions and registers its entries (its first tick), while it claims
    and sends what falls due, and after a stall of a TTL (its heartbeat lapsed), while it
    registers its entries again: a chunk a tick, the heartbeat renewed between, each entry
    once more (no registration in one go, no lapse again)."""
    seed_settled_epoch(server)
    # Every other entry with an overlap policy: checked before publish by the sender's
    # own store call (``check``), the others by their claim (SendAtOnce).
    entries = {f"e{i:05d}": {"task": "t.noop", "schedule": PERIOD,
                             **({"claims": {"overlap": "skip"}} if i % 2 else {})}
               for i in range(N)}
    app = make_app(server, entries, beat_claims_heartbeat_interval=INTERVAL,
                   beat_claims_catch_up_grace=60)
    s = make(app, settle=False)
    work = record_work(s)
    calls, registered = work.calls, work.registered
    broker = server.client(db=1)
    lapses: list[float] = []  # when the beat found its heartbeat lapsed
    real_register_again = s.claimer.register_again

    def register_again() -> None:
        lapses.append(time.monotonic())
        real_register_again()

    s.claimer.register_again = register_again  # type: ignore[method-assign]
    stalled: list[float] = []
    #: Pauses between two ticks longer than a TTL (this test's own polling, a loaded VM),
    #: besides the stall: (from, to), monotonic.
    idle: list[tuple[float, float]] = []
    ticked = [time.monotonic()]

    def tick() -> None:
        if s._registered_once and not stalled:
            # A stall: nothing ticks for longer than a TTL (the beat's own heartbeat
            # lapses; it finds out at its next one, and registers its entries again).
            wait_for(lambda: time.monotonic() - s.liveness.renewed > s.liveness.ttl + 0.1,
                     10, "the beat's heartbeat to lapse", interval=0.02)
            stalled.append(time.monotonic())
        elif time.monotonic() - ticked[0] > s.liveness.ttl:
            idle.append((ticked[0], time.monotonic()))
        s.tick()
        ticked[0] = time.monotonic()

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

    seen = {c.kind for c in calls}
    assert set(SEEN) <= seen, f"store calls never made (renamed?): {set(SEEN) - seen}"
    too_large = [show(c) for c in calls if c.items > CHUNKED.get(c.kind, 0)]
    assert not too_large, f"store calls of more than a chunk: {too_large[:10]}"
    # Begun once the heartbeat was due, by heartbeat they followed: renewed between chunks
    # (and between the beat's other store calls), at most OVERDUE_CALLS each.
    chunked = [c for c in calls if c.kind in CHUNKED]
    unrenewed = {n: [show(c) for c in cs]
                 for n, cs in [*overdue(chunked, OVERDUE_CALLS).items(),
                               *overdue(calls, OVERDUE_ANY).items()]}
    assert not unrenewed, (
        f"store calls made one after another with the heartbeat due ({INTERVAL}s after the"
        f" last) and not renewed between (by the heartbeat they followed; at most"
        f" {OVERDUE_CALLS} of a chunk of work, {OVERDUE_ANY} in all): {unrenewed}")
    # A backstop for what is not a store call: messages published with the heartbeat due,
    # a send batch at most before it is renewed.
    assert len(work.publishes) >= N, f"{len(work.publishes)} publishes seen, {N} sent"
    unrenewed = {n: f"{len(cs)} from {show(cs[0])} to {show(cs[-1])}"
                 for n, cs in overdue(work.publishes, OVERDUE_PUBLISHES).items()}
    assert not unrenewed, (
        f"more than {OVERDUE_PUBLISHES} messages published with the heartbeat due"
        f" ({INTERVAL}s after the last) and not renewed between: {unrenewed}")
    # The stall's lapse, and no other but where a single store call (or the heartbeat's),
    # or a pause between two ticks, lasted longer than a TTL: then the beat could not
    # renew in time, whatever it did.
    ttl = s.liveness.ttl
    beats = work.heartbeats
    unexplained = []
    for at in lapses[1:]:
        k = max(i for i, h in enumerate(beats) if h.began <= at)
        gap = (beats[k - 1].began if k else float("-inf"), beats[k].began)
        slow = [show(c) + f" took {c.took:.2f}s" for c in [*calls, *beats]
                if gap[0] <= c.began < gap[1] and c.took > ttl]
        paused = [f"no tick for {b - a:.2f}s" for a, b in idle if a < gap[1] and b > gap[0]]
        if not slow and not paused:
            unexplained.append(
                f"lapse at {at - calls[0].began:.2f}s: heartbeats {gap[1] - gap[0]:.2f}s apart,"
                f" the longest store call between took"
                f" {max([c.took for c in calls if gap[0] <= c.began < gap[1]], default=0):.2f}s")
    assert not unexplained, (
        f"{len(lapses)} lapses (the stall's, at {stalled[0] - calls[0].began:.2f}s, and these"
        f" with no store call nor pause between ticks longer than the TTL {ttl}s):"
        f" {unexplained}")
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
