"""What operators see: every entry's next run, last outcome, current claim and history.

Shared by ``celery claims`` and the Django management command. The field names of these
documents are a documented interface (README, "Inspecting runs").
"""

from __future__ import annotations

import time
from typing import Any

from celery import Celery
from celery.beat import ScheduleEntry

from . import occurrences
from .runs import Run, RunState, iso
from .settings import Settings
from .stores.base import Store
from .stores.redis import RedisStore


def open_store(app: Celery) -> Store:
    settings = Settings.from_app(app)
    return RedisStore.from_url(settings.url, settings.key_prefix,
                               sentinel_master=settings.sentinel_master)


def beat_schedules(app: Celery) -> dict[str, Any]:
    """Entry name -> Celery schedule of ``beat_schedule`` (entries that do not parse are
    left out: a status page must not fail on one bad entry)."""
    out = {}
    for name, spec in (app.conf.beat_schedule or {}).items():
        try:
            spec = {k: v for k, v in dict(spec).items() if k != "claims"}
            out[name] = ScheduleEntry(**dict(spec, name=name, app=app)).schedule
        except Exception:
            continue
    return out


def status(app: Celery, store: Store | None = None,
           schedules: dict[str, Any] | None = None) -> dict[str, Any]:
    """One JSON-ready document describing every entry the store knows.

    ``schedules`` (entry name -> Celery schedule) gives the next occurrences; by default
    they are read from ``beat_schedule``. A database schedule source passes its own.
    """
    store = store or open_store(app)
    schedules = beat_schedules(app) if schedules is None else schedules
    owners = store.owners()
    alive = {owner.id: is_alive for owner, is_alive, _ in owners}
    entries = []
    for name in sorted(set(store.entry_names()) | set(schedules)):
        info = store.entry_info(name)
        runs = store.history(name)
        next_due = None
        sched = schedules.get(name)
        if sched is not None and info["anchor"] is not None:
            after = info["checkpoint"] if info["checkpoint"] is not None else info["anchor"]
            try:
                next_due = occurrences.next_after(sched, info["anchor"], after)
            except Exception:
                next_due = None
        finished = [r for r in runs if r.state not in (RunState.CLAIMED, RunState.DUE)]
        claims = [r for r in runs if r.state in (RunState.CLAIMED, RunState.SENDING,
                                                 RunState.DUE)]
        counts = {state.value: 0 for state in RunState}
        for run in runs:
            counts[run.state.value] += 1
        entries.append({
            "name": name,
            "schedule": info["schedule"] or (occurrences.describe(sched) if sched else None),
            "in_schedule": sched is not None,
            "next_due": iso(next_due),
            "checkpoint": iso(info["checkpoint"]),
            "anchor": iso(info["anchor"]),
            "last_run": finished[0].as_dict() if finished else None,
            "claims": [dict(r.as_dict(), owner_alive=alive.get(r.owner or "", False))
                       for r in claims],
            "counts": counts,
        })
    return {
        "generated_at": iso(int(time.time() * 1000)),
        "owners": [{**o.as_dict(), "alive": is_alive, "claiming": sorted(names)}
                   for o, is_alive, names in owners],
        "entries": entries,
    }


def history(app: Celery, entry: str, limit: int | None = None,
            store: Store | None = None) -> dict[str, Any]:
    store = store or open_store(app)
    runs: list[Run] = store.history(entry, limit)
    return {"entry": entry, "runs": [r.as_dict() for r in runs]}
