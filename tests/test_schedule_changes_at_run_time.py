"""Issue 22's acceptance: the schedule changes while three ``celery beat`` processes run.

An interval entry goes every 2 s -> every 3 s -> a crontab (each minute) -> every 2 s
again, and another entry (every second) is disabled and enabled again, by definition
writes in the store (the old definition's instants since the checkpoint recorded skipped,
the checkpoint moved to the change's instant). Then: every instant sent lies on the grid
of the definition in force at that instant (and carries that definition's arguments),
each is sent once, every instant of the grid in force was sent or recorded skipped, and
the skipped ones are recorded with the reason ``changed`` or ``disabled``. The crontab's
one instant is the first whole minute at least 10 s after the first grid was sent: the
scenario lasts 18 to 78 s from then, by when that is.
Each store: Redis, SQLite, PostgreSQL, at once (a fleet of three beats on each), so that
the one wait for a whole minute serves all three; each store's fleet has a redis-server
of its own as its broker, whose messages are counted (no worker), and each store is
checked alone (a failure names it)."""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from beat_claims.enums import Reason, RunState
from beat_claims.runs import iso
from beat_claims.settings import Settings
from beat_claims.stores import Store, open_store

from .conftest import RedisServer, own_redis
from .processes import close_all, fleet, wait_for
from .test_beats_follow_definitions import define, once_each, sent
from .test_integration_fleet import claims_url, watch

pytestmark = pytest.mark.integration

GRID = "grid"
TOGGLED = "toggled"
#: After the crontab's instant, the last phase (every 2 s again) runs this long (ms).
LAST_PHASE = 6000


def spec(schedule: dict[str, Any], tag: str, enabled: bool = True) -> dict[str, Any]:
    return {"task": "proj.record", "schedule": schedule, "args": [tag], "enabled": enabled}


def until(store: Store, at: int, procs: list[Any]) -> None:
    """Let the fleet run until the store's clock reads ``at``."""
    watch(max(0.0, (at - store.now()) / 1000), procs)


def on_grid(schedule: dict[str, Any], anchor: int, due: int) -> bool:
    if "every" in schedule:
        return (due - anchor) % int(schedule["every"] * 1000) == 0
    return due % 60_000 == 0  # crontab each minute (UTC)


def grid_instants(schedule: dict[str, Any], anchor: int, after: int, upto: int) -> set[int]:
    """The schedule's instants in (after, upto]."""
    step = int(schedule["every"] * 1000) if "every" in schedule else 60_000
    base = anchor if "every" in schedule else 0
    first = base + ((after - base) // step + 1) * step
    return set(range(first, upto + 1, step))


KINDS = ("redis", "sqlite", "postgres")


@dataclass
class Scenario:
    """The scenario on one store: its fleet's three beats, the broker whose messages are
    counted, and the instants of the changes made there (each store's own)."""

    kind: str
    broker: RedisServer
    store: Store
    beats: list[Any]
    changes: list[int] = field(default_factory=lambda: [0])  # the first: from the first send
    toggles: list[int] = field(default_factory=list)


def test_three_beats_follow_an_entry_through_four_definitions_and_a_disable(
        server: RedisServer, tmp_path: Path) -> None:
    """The scenario on the three stores at once (a fleet of three beats on each, a broker
    each), so that one wait for a whole minute serves them all; each is checked alone."""
    app = Celery("acceptance", set_as_current=False)  # UTC, as the beats' app
    phases: list[dict[str, Any]] = [{"every": 2}, {"every": 3},
                                    {"crontab": {"minute": "*"}}, {"every": 2}]
    tags = ["two", "three", "cron", "two-again"]
    with contextlib.ExitStack() as stack:
        runs, fleets = [], []
        for kind in KINDS:
            where = tmp_path / kind
            where.mkdir()
            broker = server if kind == "redis" else stack.enter_context(own_redis())
            url = stack.enter_context(claims_url(kind, broker, where))
            f = stack.enter_context(fleet(url, broker.broker_url(), where, {},
                                          BC_EXEC_URL=broker.url))
            store = open_store(Settings(url=url), timeout=5.0)
            stack.callback(store.close)
            runs.append(Scenario(kind, broker, store, [f.beat() for _ in range(3)]))
            fleets.append(f)
        procs = [proc for run in runs for proc in run.beats]
        stack.callback(close_all, fleets)  # first: the nine beats stop side by side
        for f, run in zip(fleets, runs):
            for proc in run.beats:
                f.wait_log(proc, "entries registered; claiming", 60)
        for run in runs:
            define(run.store, app, GRID, spec(phases[0], tags[0]))
            define(run.store, app, TOGGLED, spec({"every": 1}, "on"))
        for run in runs:
            wait_for(partial(_grid_sent, run.broker, 2), 20,
                     f"two sends of the first grid ({run.kind})")
        clock = runs[0].store
        began = clock.now()
        # The crontab's instant: the first whole minute at least 10 s away (the first
        # change is 8 s before it).
        minute = -(-(began + 10_000) // 60_000) * 60_000

        def at(when: int, name: str, obj: dict[str, Any], into: str) -> None:
            until(clock, when, procs)
            for run in runs:
                getattr(run, into).append(_checkpoint(define(run.store, app, name, obj)))

        at(minute - 8000, GRID, spec(phases[1], tags[1]), "changes")
        # The other entry: disabled for 2.5 s.
        at(minute - 7000, TOGGLED, spec({"every": 1}, "off", False), "toggles")
        at(minute - 4500, TOGGLED, spec({"every": 1}, "on-again"), "toggles")
        at(minute - 3000, GRID, spec(phases[2], tags[2]), "changes")
        at(minute + 2000, GRID, spec(phases[3], tags[3]), "changes")
        until(clock, minute + 2000 + LAST_PHASE, procs)
        end = clock.now() - 2500  # what is due by then has been sent (or skipped)
        for run in runs:
            wait_for(partial(_grid_sent, run.broker, 1, end), 10,
                     f"the last grid's sends ({run.kind})")

        failed = []
        for run in runs:
            try:
                _followed(run, phases, tags, minute, end)
            except AssertionError as exc:
                failed.append(f"{run.kind}: {exc}")
        assert not failed, "\n".join(failed)


def _grid_sent(broker: RedisServer, count: int, after: int = 0) -> bool:
    """At least ``count`` sends of the grid entry, the last one due after ``after``."""
    dues = [due for due, _ in sent(broker, GRID)]
    return len(dues) >= count and max(dues) > after


def _followed(run: Scenario, phases: list[dict[str, Any]], tags: list[str], minute: int,
              end: int) -> None:
    """What one store's fleet sent and recorded skipped, against the definitions in force."""
    store, changes = run.store, run.changes
    anchor = store.entries([GRID])[0].anchor
    assert anchor is not None
    bounds = [*changes[1:], None]
    got = once_each(run.broker, GRID)
    skipped = {r.due: r.reason for r in store.history(GRID) if r.state is RunState.SKIPPED}
    for due, args in got:
        i = next(k for k, upper in enumerate(bounds) if upper is None or due <= upper)
        assert on_grid(phases[i], anchor, due) and args == [tags[i]], (
            f"{iso(due)} sent with {args}, in force: {tags[i]} {phases[i]}")
    sent_at = {due for due, _ in got}
    first_sent = min(sent_at)
    for i, phase in enumerate(phases):
        lower = changes[i] if i else first_sent - 1
        upper = min(bounds[i] or end, end)
        want = grid_instants(phase, anchor, lower, upper)
        missing = sorted(want - sent_at - set(skipped))
        assert not missing, f"{tags[i]}: neither sent nor skipped: {[iso(d) for d in missing]}"
    assert set(skipped.values()) <= {Reason.CHANGED}, skipped
    assert any(iso(minute) == iso(d) for d in sent_at), "the crontab's instant was not sent"

    t_got = once_each(run.broker, TOGGLED)
    off, on = run.toggles
    assert not [iso(d) for d, _ in t_got if off < d <= on], "sent while disabled"
    t_skipped = {r.due: r.reason for r in store.history(TOGGLED)
                 if r.state is RunState.SKIPPED}
    t_anchor = store.entries([TOGGLED])[0].anchor
    assert t_anchor is not None
    while_off = grid_instants({"every": 1}, t_anchor, off, on)
    assert while_off and all(t_skipped.get(d) is Reason.DISABLED for d in while_off), (
        sorted(while_off), t_skipped)
    assert set(t_skipped.values()) <= {Reason.CHANGED, Reason.DISABLED}, t_skipped
    t_sent = {d for d, _ in t_got}
    t_want = grid_instants({"every": 1}, t_anchor, min(t_sent) - 1, end)
    t_missing = sorted(t_want - t_sent - set(t_skipped))
    assert not t_missing, [iso(d) for d in t_missing]
    counts = Counter(a[0] for _, a in t_got)
    assert counts["on"] and counts["on-again"] and not counts["off"], counts


def _checkpoint(result: Any) -> int:
    assert result.state is not None and result.state.checkpoint is not None, result
    return int(result.state.checkpoint)
