"""What operators see: every entry's next run, last outcome, current claim and history.

Shared by ``celery claims`` and the Django management command. The field names of these
documents are a documented interface (README, "Inspecting runs").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.beat import ScheduleEntry

from . import occurrences, schedule_words, unstarted
from .beat.composition import DYNAMIC
from .beat.liveness import owner_alive
from .beat.stored import PAGE
from .definitions import DefinitionError, validate
from .enums import Origin, RunState
from .runs import Owner, Run, iso
from .settings import ConfigurationError, Policy, Settings
from .stores import open_store as _open_store
from .stores.base import EntryRecord, Store, StoredDefinition

#: How long an operator's command waits for the store.
STORE_TIMEOUT = 5.0


def open_store(app: Celery, timeout: float = STORE_TIMEOUT) -> Store:
    return _open_store(Settings.from_app(app), timeout=timeout)


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
           schedules: dict[str, Any] | None = None,
           seen: Callable[[list[Run]], None] | None = None) -> dict[str, Any]:
    """One JSON-ready document describing every entry the store knows.

    ``schedules`` (entry name -> Celery schedule) gives the next occurrences; by default
    they are read from ``beat_schedule``. A database schedule source passes its own.
    Each entry's ``unstarted``: its runs sent and not started for longer than
    ``beat_claims_unstarted_after`` (null when none). ``seen`` is given each entry's runs
    as they are read (the admin's fleet timeline: no second read of every history).
    """
    unstarted_after = Settings.from_app(app).unstarted_after
    store = store or open_store(app)
    schedules = beat_schedules(app) if schedules is None else schedules
    now = store.now()
    owners = store.owners()
    alive = {o.owner.id: owner_alive(o) for o in owners}
    waiting = (unstarted.read(store, now, unstarted_after) if unstarted_after is not None
               else None)
    by_entry = {u.entry: u for u in waiting.entries} if waiting is not None else {}
    known = {record.name: record for record in store.entries()}
    missing = sorted(set(schedules) - set(known))
    known.update({record.name: record for record in store.entries(missing)})
    stored = stored_definitions(store)
    differs: dict[str, list[str]] = {}
    for o in owners:
        if alive[o.owner.id]:
            for name in o.owner.schedule_differs:
                differs.setdefault(name, []).append(f"{o.owner.host}:{o.owner.pid}")
    entries = []
    for name in sorted(set(known) | set(schedules)):
        info = known.get(name)
        anchor = info.anchor if info is not None else None
        checkpoint = info.checkpoint if info is not None else None
        runs = store.history(name)
        if seen is not None:
            seen(runs)
        next_due = None
        # Some live beat schedules it: this app's schedule has it, a live beat registered
        # it, or it is a dynamic definition (every beat schedules those).
        registered = any(alive.get(r.owner, False) for r in (info.registrants or ())) \
            if info is not None else False
        definition = stored.get(name)
        followed = _followed(app, definition, schedules.get(name) is not None or registered)
        sched = followed if followed is not None else schedules.get(name)
        if sched is not None and anchor is not None:
            try:
                next_due = occurrences.next_after(
                    sched, anchor, occurrences.looked_after(sched, anchor, checkpoint))
            except Exception:
                next_due = None
        finished = [r for r in runs if r.state not in (RunState.CLAIMED, RunState.DUE,
                                                       RunState.WAITING)]
        claims = [r for r in runs if r.state in (RunState.CLAIMED, RunState.SENDING,
                                                 RunState.DUE)]
        counts = {state.value: 0 for state in RunState}
        for run in runs:
            counts[run.state.value] += 1
        entries.append({
            "name": name,
            "schedule": (info.description if info is not None and info.description else
                         schedule_words.describe(sched) if sched else None),
            "in_schedule": sched is not None or registered,
            "definition": _definition_doc(definition),
            "beat_schedule_differs_in": differs.get(name, []),
            "next_due": iso(next_due),
            "checkpoint": iso(checkpoint),
            "anchor": iso(anchor),
            "last_run": finished[0].as_dict() if finished else None,
            "claims": [dict(r.as_dict(), owner_alive=alive.get(r.owner or "", False))
                       for r in claims],
            "counts": counts,
            "paused": _pause_doc(info),
            "unstarted": (by_entry[name].as_dict(now) if name in by_entry else None),
        })
    return {
        "generated_at": iso(now),
        "owners": [owner_doc(o.owner, alive[o.owner.id], o.expires_at) for o in owners],
        "unstarted_after": unstarted_after,
        "entries": entries,
    }


def stored_definitions(store: Store) -> dict[str, StoredDefinition]:
    """Every definition (and tombstone) the store holds, by name, read in pages."""
    out: dict[str, StoredDefinition] = {}
    after = ""
    while True:
        page = store.definitions(None, after, PAGE)
        out.update((d.name, d) for d in page)
        if len(page) < PAGE:
            return out
        after = page[-1].name


def dynamic_schedules(app: Celery, store: Store, settings: Settings, limit: int
                      ) -> tuple[dict[str, Any], dict[str, Policy]]:
    """The schedules and policies of the enabled dynamic definitions (created at run time:
    every beat sends them) among the first ``limit`` definitions by name: a probe's bounded
    look at them (at most ``limit`` definitions read, in pages)."""
    schedules: dict[str, Any] = {}
    policies: dict[str, Policy] = {}
    after = ""
    read = 0
    while read < limit:
        want = min(PAGE, limit - read)
        page = store.definitions(None, after, want)
        read += len(page)
        for stored in page:
            followed = _followed(app, stored, False)
            if followed is None:
                continue
            schedules[stored.name] = followed
            try:
                claims = validate(stored.name, stored.definition).claims
                policies[stored.name] = settings.policy_for(stored.name, claims or None,
                                                            followed)
            except (DefinitionError, ConfigurationError):
                policies[stored.name] = settings.default_policy(followed)
        if len(page) < want:
            break
        after = page[-1].name
    return schedules, policies


def _followed(app: Celery, stored: StoredDefinition | None, local: bool) -> Any:
    """The Celery schedule the beats send ``stored`` by (None: they do not): a dynamic
    definition, or a CONFIG one a live beat has in its beat_schedule (``local``), valid and
    enabled."""
    if stored is None or stored.deleted or stored.definition is None:
        return None
    if stored.origin not in DYNAMIC and not (stored.origin is Origin.CONFIG and local):
        return None
    try:
        definition = validate(stored.name, stored.definition)
        return definition.schedule.celery(app) if definition.enabled else None
    except DefinitionError:
        return None


def _definition_doc(stored: StoredDefinition | None) -> dict[str, Any] | None:
    """An entry's stored definition as operators see it (never its arguments)."""
    if stored is None:
        return None
    enabled = None
    if stored.definition is not None:
        try:
            enabled = bool(json.loads(stored.definition).get("enabled", True))
        except (ValueError, AttributeError):
            enabled = None
    return {"origin": stored.origin.value, "version": stored.version,
            "changed_by": stored.changed_by, "changed_at": iso(stored.changed_at),
            "deleted": stored.deleted, "enabled": enabled, "corrupt": bool(stored.corrupt)}


def _pause_doc(info: EntryRecord | None) -> dict[str, Any] | None:
    """An entry's pause (who, why, since when), or None when it is not paused."""
    if info is None or info.paused is None:
        return None
    return {"by": info.paused.by, "note": info.paused.note, "at": iso(info.paused.at)}


def owner_doc(owner: Owner, alive: bool, expires_at: int) -> dict[str, Any]:
    """A beat as operators see it: ``host:pid`` and its id, times in ISO 8601 UTC."""
    return {"beat": f"{owner.host}:{owner.pid}", "id": owner.id, "host": owner.host,
            "pid": owner.pid, "started_at": iso(round(owner.started_at * 1000)),
            "alive": alive, "expires_at": iso(expires_at)}


class UnknownEntry(LookupError):
    """The store has never seen this entry."""


def history(app: Celery, entry: str, limit: int | None = None,
            store: Store | None = None) -> dict[str, Any]:
    store = store or open_store(app)
    runs: list[Run] = store.history(entry, limit)
    if not runs and not any(e.anchor is not None for e in store.entries([entry])):
        known = sorted(e.name for e in store.entries())
        shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10
                                         else "")
        raise UnknownEntry(f"no entry {entry!r} in the store"
                           + (f" (its entries: {shown})" if known else " (it has none)"))
    return {"entry": entry, "runs": [r.as_dict() for r in runs]}
