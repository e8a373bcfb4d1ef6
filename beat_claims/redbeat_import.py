"""Entries RedBeat created at run time, read from its keys and made definitions of the store,
each anchored so that its next run is RedBeat's next run.

RedBeat (``celery-redbeat`` 2.x) keeps one hash a entry, ``<prefix><name>``, whose field
``definition`` is the entry as JSON (name, task, schedule, args, kwargs, options, enabled;
schedules and datetimes as ``{"__type__": ...}`` objects) and ``meta`` its ``last_run_at``;
the sorted set ``<prefix>:schedule`` scores each entry key with its next run (seconds since
the epoch); the set ``<prefix>:statics`` names the entries it took from ``beat_schedule``
(those stay in ``beat_schedule``: a beat-claims beat registers them itself). The keys are
read in pages (SCAN), never all at once, and only read: RedBeat's keys are left as they are.

An entry becomes a definition of origin ``redbeat`` when it has none in the store; an entry
the store already defines is left alone (``exists``), and one that cannot be a definition
(an ``rrule`` schedule, an argument that is not a JSON value, an option a definition does
not hold) is listed with the reason (``refused``). Nothing of an argument's value is shown.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import redis
from celery import Celery

from . import next_due, occurrences
from .definitions import Definition, DefinitionError, Every, validate
from .enums import ImportAction as Action
from .enums import Origin
from .runs import iso, to_ms
from .settings import Settings
from .stores.base import DefinitionWrite, EntrySeed, EntryState, Store, WriteStatus
from .urls import redact_url

#: RedBeat's default key prefix (its setting ``redbeat_key_prefix``).
DEFAULT_PREFIX = "redbeat:"
#: Keys asked for per SCAN step, and entries read and written per round trip.
PAGE = 500
#: The latest instant an entry's anchor or next run may be (UTC ms): the end of year 9999.
LATEST_MS = 253402300799999
#: Who the store records as having made the definitions.
IMPORTED_BY = "claims import redbeat"


@dataclass(frozen=True)
class RedBeatEntry:
    """One entry as RedBeat keeps it, read and converted.

    ``definition``: the definition it becomes (None: ``problem`` says why it cannot be one).
    ``anchor_ms``: where the store's entry starts (anchor and checkpoint) so that its
    first occurrence is RedBeat's next run, ``next_run_ms`` (None: at the import, as any
    new entry, and its next instant after it). ``score_ms``: the score of RedBeat's sorted
    set (when its beat looks at the entry; None: not there, a disabled entry).
    """

    name: str
    task: str
    definition: Definition | None
    problem: str
    next_run_ms: int | None
    last_run_ms: int | None
    anchor_ms: int | None
    score_ms: int | None
    static: bool


@dataclass(frozen=True)
class PlannedImport:
    """One row of the import: the entry and what is (or would be) done with it."""

    entry: RedBeatEntry
    action: Action
    detail: str = ""

    def as_json(self) -> dict[str, Any]:
        e = self.entry
        return {"name": e.name, "task": e.task, "action": self.action.value,
                "schedule": e.definition.schedule.to_json() if e.definition else None,
                "enabled": e.definition.enabled if e.definition else None,
                "next_run": iso(e.next_run_ms), "last_run": iso(e.last_run_ms),
                "detail": self.detail or e.problem}


class RedBeatReadError(RuntimeError):
    """RedBeat's keys could not be read (the message names the URL, its password masked)."""


# -- reading RedBeat's keys ---------------------------------------------------------------
def read(client: redis.Redis, prefix: str = DEFAULT_PREFIX, app_timezone: str = "UTC",
         page: int = PAGE) -> Iterator[RedBeatEntry]:
    """Every entry RedBeat keeps under ``prefix``, page by page (bounded memory: a page of
    keys at a time, plus the names of the static entries)."""
    schedule_key, statics_key = prefix + ":schedule", prefix + ":statics"
    own = {schedule_key, statics_key, prefix + ":lock"}
    statics = {_text(m) for m in client.sscan_iter(statics_key, count=page)}
    pattern = _glob_escape(prefix) + "*"
    batch: list[str] = []
    for raw in client.scan_iter(match=pattern, count=page, _type="HASH"):
        key = _text(raw)
        if key in own:
            continue
        batch.append(key)
        if len(batch) >= page:
            yield from _read_page(client, batch, prefix, schedule_key, statics, app_timezone)
            batch = []
    if batch:
        yield from _read_page(client, batch, prefix, schedule_key, statics, app_timezone)


def _read_page(client: redis.Redis, keys: list[str], prefix: str, schedule_key: str,
               statics: set[str], app_timezone: str) -> Iterator[RedBeatEntry]:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, "definition", "meta")
        pipe.zscore(schedule_key, key)
    replies = pipe.execute(raise_on_error=False)
    for i, key in enumerate(keys):
        fields, score = replies[2 * i], replies[2 * i + 1]
        if isinstance(fields, Exception) or not fields or fields[0] is None:
            continue  # not an entry of RedBeat's (another key under the prefix)
        name = key[len(prefix):]
        yield convert(name, _text(fields[0]), _text(fields[1]) if fields[1] else None,
                      None if isinstance(score, Exception) else score,
                      static=name in statics, app_timezone=app_timezone)


def convert(name: str, definition_json: str, meta_json: str | None, score: float | None,
            static: bool = False, app_timezone: str = "UTC") -> RedBeatEntry:
    """One RedBeat entry (its ``definition`` and ``meta`` fields, its schedule score) as a
    definition and the instant its store entry is anchored at."""
    task, problem, definition = "", "", None
    try:
        raw = _loads(definition_json)
        if not isinstance(raw, dict):
            raise _NotImportable("its definition is not a JSON object")
        task = str(raw["task"]) if isinstance(raw.get("task"), str) else ""
        definition = validate(name, _as_definition(raw, app_timezone))
    except _NotImportable as exc:
        problem = str(exc)
    except DefinitionError as exc:
        problem = str(exc)
    last_run = _last_run_ms(meta_json)
    score_ms = _score_ms(score)
    anchor = next_run = None
    if definition is not None:
        anchor = _anchor(definition, score_ms, last_run)
        if anchor is not None:
            next_run = occurrences.next_after(definition.schedule.celery(), anchor, anchor)
        if not all(0 <= ms <= LATEST_MS for ms in (anchor, next_run) if ms is not None):
            # (RedBeat's clock, or a hand edit: a grid the store cannot keep)
            definition, anchor, next_run = None, None, None
            problem = ("its last_run_at puts its next run outside the instants the store"
                       " keeps (1970 to 9999)")
            last_run = None
    return RedBeatEntry(name=name, task=task, definition=definition, problem=problem,
                        next_run_ms=next_run, last_run_ms=last_run, anchor_ms=anchor,
                        score_ms=score_ms, static=static)


class _NotImportable(ValueError):
    """Why a RedBeat entry cannot be a definition."""


class _Schedule:
    """A schedule object decoded from RedBeat's JSON (its ``__type__`` kept)."""

    def __init__(self, kind: str, fields: dict[str, Any]) -> None:
        self.kind, self.fields = kind, fields


class _Instant:
    """A datetime decoded from RedBeat's JSON: anywhere but ``last_run_at`` it cannot be a
    definition's value."""

    def __init__(self, when: datetime) -> None:
        self.when = when


def _loads(text: str) -> Any:
    """RedBeat's JSON, its datetimes and schedules decoded: :class:`_NotImportable` for a
    record that cannot be read (a bad record is that entry's problem, not the import's)."""
    try:
        return json.loads(text, object_hook=_decode)
    except _NotImportable:
        raise
    except RecursionError:
        raise _NotImportable("its definition is nested too deeply to read") from None
    except ValueError:
        raise _NotImportable("its definition is not valid JSON") from None


def _decode(obj: dict[str, Any]) -> Any:
    kind = obj.get("__type__")
    if kind is None:
        return obj
    fields = {k: v for k, v in obj.items() if k != "__type__"}
    if kind == "datetime":
        return _Instant(_datetime(fields))
    return _Schedule(str(kind), fields)


def _datetime(fields: dict[str, Any]) -> datetime:
    try:
        return _read_datetime(fields)
    except (ValueError, TypeError, KeyError, OverflowError):  # (an unknown zone: KeyError)
        raise _NotImportable("it holds a datetime RedBeat's encoding does not give (its"
                             " fields or its timezone cannot be read)") from None


def _read_datetime(fields: dict[str, Any]) -> datetime:
    zone = fields.pop("timezone", "UTC")
    tz: Any
    if isinstance(zone, (int, float)):
        tz = timezone(timedelta(seconds=zone))
    else:
        tz = ZoneInfo(str(zone))
    return datetime(tzinfo=tz, **{k: int(v) for k, v in fields.items()})


def _as_definition(raw: dict[str, Any], app_timezone: str) -> dict[str, Any]:
    sched = raw.get("schedule")
    if not isinstance(sched, _Schedule):
        raise _NotImportable("its schedule is not one RedBeat encodes (interval, crontab)")
    out: dict[str, Any] = {"task": raw.get("task"), "schedule": _schedule(sched, app_timezone),
                           "enabled": raw.get("enabled", True)}
    for field in ("args", "kwargs", "options"):
        value = raw.get(field)
        if value is None:
            continue
        where = _holds_instant(value)
        if where is not None:
            raise _NotImportable(f"{field}{where} holds a datetime, which a definition does"
                                 " not (JSON values only)")
        out[field] = value
    return out


def _holds_instant(value: Any, where: str = "") -> str | None:
    """Where in ``value`` a decoded datetime or schedule sits ('' : itself), or None."""
    if isinstance(value, (_Instant, _Schedule)):
        return where
    items: Any = (value.items() if isinstance(value, dict)
                  else enumerate(value) if isinstance(value, list) else ())
    for key, inner in items:
        found = _holds_instant(inner, f"{where}[{key!r}]")
        if found is not None:
            return found
    return None


def _schedule(sched: _Schedule, app_timezone: str) -> dict[str, Any]:
    if sched.kind == "interval":
        every = sched.fields.get("every")
        if isinstance(every, bool) or not isinstance(every, (int, float)):
            raise _NotImportable(f"its interval {every!r} is not a number of seconds")
        return {"every": every}
    if sched.kind == "crontab":
        fields = {k: _cron_field(sched.fields.get(k)) for k in
                  ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")}
        # RedBeat's beat reads a crontab at the app's wall times: the definition says which.
        return {"crontab": dict(fields, timezone=app_timezone)}
    raise _NotImportable(f"a {sched.kind!r} schedule is not one a definition holds"
                         " (interval, crontab, solar, clocked)")


def _cron_field(value: Any) -> str:
    if value is None:
        return "*"
    if isinstance(value, (list, tuple, set)):
        return ",".join(str(v) for v in sorted(value))
    return str(value)


def _last_run_ms(meta_json: str | None) -> int | None:
    if not meta_json:
        return None
    try:
        meta = _loads(meta_json)
    except _NotImportable:
        return None
    last = meta.get("last_run_at") if isinstance(meta, dict) else None
    return to_ms(last.when) if isinstance(last, _Instant) else None


def _score_ms(score: float | None) -> int | None:
    if score is None or not math.isfinite(score) or score <= 0:
        return None
    return round(score * 1000)


def _anchor(definition: Definition, score: int | None, last_run: int | None
            ) -> int | None:
    """The instant the entry's grid starts at (its checkpoint too), so that its first
    occurrence after it is RedBeat's next run: RedBeat counts from the last run
    (``last_run_at`` plus the interval, or the crontab's next instant after it). An entry
    RedBeat never ran is due at once there: an interval's grid then passes through its
    score (RedBeat's next run, in whole seconds); any other schedule starts at the
    import (None), its next instant after it."""
    if last_run is not None:
        return last_run
    if isinstance(definition.schedule, Every) and score is not None:
        return score - occurrences.period_ms(definition.schedule.celery())
    return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


# -- planning and importing ---------------------------------------------------------------
def plan(store: Store, entries: Sequence[RedBeatEntry]) -> list[PlannedImport]:
    """What the import does with each entry, reading the store's definitions (no write)."""
    held = {d.name: d for d in store.definitions([e.name for e in entries])} if entries else {}
    rows = []
    for e in entries:
        current = held.get(e.name)
        if e.static:
            rows.append(PlannedImport(e, Action.STATIC, "taken by RedBeat from beat_schedule:"
                                                        " it stays there"))
        elif e.definition is None:
            rows.append(PlannedImport(e, Action.REFUSED))
        elif current is not None and not current.deleted:
            rows.append(PlannedImport(e, Action.EXISTS, f"the store defines it already"
                                                        f" (origin {current.origin.value},"
                                                        f" version {current.version})"))
        else:
            rows.append(PlannedImport(e, Action.CREATE))
    return rows


def apply(store: Store, rows: Sequence[PlannedImport], by: str = IMPORTED_BY,
          app: Celery | None = None) -> list[PlannedImport]:
    """Create the definitions ``rows`` plan (action ``create``); each entry anchored first
    (an entry the store has seen keeps its anchor), then its definition written as a create
    (version 0: an entry defined meanwhile is left alone, ``exists``), indexed at its first
    instant after the state it was anchored at (computed with ``app``'s settings; without
    it, due at once: the beats compute it). Run again after a failure or a lost reply, it
    creates only what is missing. Returns the rows as done."""
    todo = [r for r in rows if r.action is Action.CREATE and r.entry.definition is not None]
    done = {r.entry.name: r for r in rows if r not in todo}
    settings = None if app is None else Settings.from_app(app)
    for start in range(0, len(todo), PAGE):
        chunk = todo[start:start + PAGE]
        states = store.register([EntrySeed(r.entry.name, anchor=r.entry.anchor_ms,
                                           checkpoint=r.entry.anchor_ms) for r in chunk])
        writes = [DefinitionWrite(name=r.entry.name, definition=r.entry.definition.to_json(),
                                  expected_version=0, origin=Origin.REDBEAT, by=by,
                                  change_id=uuid.uuid4().hex,
                                  next_due=_next_due(r.entry.name, r.entry.definition,
                                                     states.get(r.entry.name), app, settings))
                  for r in chunk if r.entry.definition is not None]
        for r, result in zip(chunk, store.write_definitions(writes)):
            if result.status is WriteStatus.OK:
                done[r.entry.name] = r
            elif result.status is WriteStatus.EXISTS:
                done[r.entry.name] = PlannedImport(r.entry, Action.EXISTS,
                                                   "defined meanwhile: left alone")
            else:
                done[r.entry.name] = PlannedImport(r.entry, Action.REFUSED,
                                                   f"the store answered {result.status.value}"
                                                   f" {result.detail}".rstrip())
    return [done[r.entry.name] for r in rows]


def _next_due(name: str, definition: Definition, state: EntryState | None,
              app: Celery | None, settings: Settings | None) -> int | None:
    """The imported entry's first instant after the state it was registered at (None:
    not known here, indexed due at once)."""
    if state is None or app is None:
        return None
    return next_due.of_definition(name, definition, app, state.anchor, state.checkpoint,
                                  settings)


def connect(url: str, timeout: float = 5.0) -> redis.Redis:
    """A client of RedBeat's Redis; an unreachable one is named, its password masked."""
    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout,
                                      socket_connect_timeout=timeout)
        client.ping()
    except (redis.RedisError, ValueError, OSError) as exc:
        raise RedBeatReadError(f"RedBeat's Redis {redact_url(url)} cannot be read:"
                               f" {type(exc).__name__}") from None
    return client
