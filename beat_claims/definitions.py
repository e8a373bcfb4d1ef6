"""An entry's definition: what Celery needs to send it (task, schedule, args, kwargs,
options) and beat-claims' policy for it (``claims``), ``enabled`` and a ``description``;
validated where it enters, kept in one canonical JSON form.

``validate(name, obj_or_json_text)`` is the one way in: it refuses, naming the entry, the
field and the value (``schedule.crontab.minute: '61' is not a valid minute ...``), and
writes nothing. An argument, a keyword argument or a header is named by its position or
key and its type, never by its value: task arguments may hold secrets. ``to_json()`` is
canonical (sorted keys, no spaces, every field written), so equal definitions give equal
text and equal ``digest()``s. The schedule kinds and their Celery objects:

- ``{"every": 30}``: seconds, an interval (``celery.schedules.schedule``), counted from the
  entry's anchor as every interval is;
- ``{"crontab": {"minute": "*/5", ..., "timezone": "Europe/Paris"}}``: Celery's crontab at
  the app's wall times, or, with a timezone, at that zone's
  (:class:`beat_claims.schedules.zoned_crontab`);
- ``{"solar": {"event": "sunset", "latitude": 48.85, "longitude": 2.35}}``: Celery's
  solar (needs ``ephem``: ``pip install 'beat-claims[solar]'``);
- ``{"clocked": "2026-12-24T18:00:00Z"}``: one instant
  (:class:`beat_claims.schedules.clocked`).

A ``beat_schedule`` entry becomes a definition with :meth:`Definition.from_entry` when it
can be stored (JSON arguments, a schedule of those kinds); otherwise the reason comes back
(:class:`Unstorable`) and the entry stays the beat's own, as before.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import weakref
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from celery.schedules import crontab, schedule, solar

from . import occurrences
from .runs import iso, to_ms
from .schedules import clocked, zoned_crontab
from .settings import MAX_SECONDS, ConfigurationError, Settings, entry_name_problem

if TYPE_CHECKING:
    from celery import Celery
    from celery.beat import ScheduleEntry

    from .scheduler import ClaimsEntry

#: The largest definition, as canonical JSON (UTF-8 bytes).
MAX_DEFINITION_BYTES = 64 * 1024
#: The longest task name and description, in characters.
MAX_TASK_NAME = 200
MAX_DESCRIPTION = 1000
#: How deeply args, kwargs and headers may nest.
MAX_DEPTH = 64
#: The longest crontab field and timezone name accepted, in characters.
MAX_CRON_FIELD = 100
#: The fields of a definition, in its JSON form.
FIELDS = ("task", "schedule", "args", "kwargs", "options", "claims", "enabled",
          "description")
#: The ``apply_async`` options a definition may carry.
OPTION_KEYS = ("queue", "routing_key", "exchange", "priority", "expires", "headers",
               "soft_time_limit", "time_limit")
CRON_FIELDS = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")
SCHEDULE_KINDS = ("every", "crontab", "solar", "clocked")
SOLAR_EXTRA = "pip install 'beat-claims[solar]'"

#: (size, lowest) of each crontab field, as Celery expands them.
_CRON_RANGES = {"minute": (60, 0), "hour": (24, 0), "day_of_week": (7, 0),
                "day_of_month": (31, 1), "month_of_year": (12, 1)}
#: The days of each month, in the longest year.
_DAYS_IN_MONTH = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31,
                  11: 30, 12: 31}
_TASK_NAME = re.compile(r"[^\s.]+(\.[^\s.]+)*")
#: An instant with its offset: 2026-12-24T18:00:00Z, ...T18:00:00.250+01:00.
_INSTANT = re.compile(
    r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d{3}(\d{3})?)?)?(Z|z|[+-]\d{2}:\d{2})", re.ASCII)
#: The per-entry policy's checks do not depend on the app's settings.
_POLICY_CHECKS = Settings(url="")


@lru_cache(maxsize=1)
def _check_app() -> Celery:
    """The app a schedule is checked with (in UTC): never the user's current app, whose
    configuration reading it would load."""
    from celery import Celery

    return Celery("beat-claims-definitions", set_as_current=False)


class DefinitionError(ValueError):
    """A definition that cannot be stored: names the entry, the field and the value
    (``message``: the whole message, when the beat's own check wrote one)."""

    def __init__(self, entry: Any, field: str, problem: str, message: str | None = None
                 ) -> None:
        self.entry = entry
        self.field = field
        self.problem = problem
        self.message = message
        shown = field if len(field) <= 120 else f"{field[:117]}..."
        text = f"{shown}: {problem}" if field else problem
        if entry is not None:
            text = f"entry {_show(entry, 80)}: {text}"
        super().__init__(message or text)

    def on(self, entry: Any) -> DefinitionError:
        """The same problem, naming the entry."""
        return DefinitionError(entry, self.field, self.problem, self.message)


class _Refused(DefinitionError):
    """A field's problem, found before the entry's name is known."""

    def __init__(self, field: str, problem: str, message: str | None = None) -> None:
        super().__init__(None, field, problem, message)


def _show(value: Any, limit: int = 60) -> str:
    """A value as it is named in a message: its repr, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _canonical_number(value: float) -> float:
    """30.0 is written 30, so that equal numbers give equal text."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


# -- instants ---------------------------------------------------------------------------

def _instant(value: Any, where: str) -> datetime:
    """An ISO 8601 instant with its offset, as an aware UTC datetime."""
    if not isinstance(value, str) or not _INSTANT.fullmatch(value):
        raise _Refused(where, f"{_show(value)} is not an instant (ISO 8601 with its offset,"
                              " as 2026-12-24T18:00:00Z)")
    try:
        when = datetime.fromisoformat(value[:-1] + "+00:00" if value[-1] in "Zz" else value)
    except ValueError as exc:
        raise _Refused(where, f"{_show(value)} is not an instant ({exc})") from None
    when = when.astimezone(timezone.utc)
    if when.year < 1970:
        raise _Refused(where, f"{_show(value)} is before 1970")
    return when


def _instant_text(when: datetime) -> str:
    """An instant as the canonical form writes it: UTC, milliseconds (or microseconds when
    it has them), Z."""
    when = when.astimezone(timezone.utc)
    spec = "milliseconds" if when.microsecond % 1000 == 0 else "microseconds"
    return when.isoformat(timespec=spec).replace("+00:00", "Z")


# -- schedules --------------------------------------------------------------------------

@dataclass(frozen=True)
class Every:
    """An interval of ``seconds``, counted from the entry's anchor."""

    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"every": _canonical_number(self.seconds)}

    def celery(self, app: Celery | None = None) -> Any:
        return schedule(timedelta(seconds=self.seconds), app=app)


@dataclass(frozen=True)
class Cron:
    """Celery's crontab fields; at the app's wall times, or at ``timezone``'s."""

    minute: str = "*"
    hour: str = "*"
    day_of_week: str = "*"
    day_of_month: str = "*"
    month_of_year: str = "*"
    timezone: str | None = None

    def to_json(self) -> dict[str, Any]:
        fields: dict[str, Any] = {name: getattr(self, name) for name in CRON_FIELDS}
        if self.timezone is not None:
            fields["timezone"] = self.timezone
        return {"crontab": fields}

    def celery(self, app: Celery | None = None) -> Any:
        fields = {name: getattr(self, name) for name in CRON_FIELDS}
        if self.timezone is None:
            return crontab(**fields, app=app)
        return zoned_crontab(**fields, timezone=self.timezone, app=app)


@dataclass(frozen=True)
class Solar:
    """Celery's solar event at a place."""

    event: str
    latitude: float
    longitude: float

    def to_json(self) -> dict[str, Any]:
        return {"solar": {"event": self.event,
                          "latitude": _canonical_number(self.latitude),
                          "longitude": _canonical_number(self.longitude)}}

    def celery(self, app: Celery | None = None) -> Any:
        try:
            import ephem  # noqa: F401 (celery's solar imports it; say how to get it)
        except ImportError:
            raise _Refused("schedule.solar", "a solar schedule needs the ephem package:"
                                             f" {SOLAR_EXTRA}") from None
        return solar(self.event, self.latitude, self.longitude, app=app)


@dataclass(frozen=True)
class Clocked:
    """One instant (UTC milliseconds): due once."""

    at_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"clocked": iso(self.at_ms)}

    def celery(self, app: Celery | None = None) -> Any:
        return clocked(self.at_ms, app=app)


ScheduleSpec = Every | Cron | Solar | Clocked


#: Schedules already validated, by their JSON text: a beat takes a dynamic entry's
#: definition again each time it holds it, and thousands share one schedule (parsing a
#: crontab and finding its first instant was most of that). Bounded: emptied when full.
_PARSED: dict[str, ScheduleSpec] = {}
PARSED_MAX = 4096
#: Each app's Celery schedules of the specs above (immutable once built, shared by the
#: entries of one spec: Celery builds a crontab by parsing its five fields).
_BUILT: weakref.WeakKeyDictionary[Any, dict[ScheduleSpec, Any]] = \
    weakref.WeakKeyDictionary()


def parse_schedule(obj: Any, where: str = "schedule") -> ScheduleSpec:
    """A schedule's JSON form, validated: each kind, every field, and that Celery's
    arithmetic gives it an instant (through ``occurrences``)."""
    try:
        key = json.dumps(obj, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return _parse_schedule(obj, where)
    spec = _PARSED.get(key)
    if spec is None:
        spec = _parse_schedule(obj, where)  # (a refusal raises, and is not kept)
        if isinstance(spec, Solar):
            return spec  # (it needs ephem, which is checked each time)
        if len(_PARSED) >= PARSED_MAX:
            _PARSED.clear()
        _PARSED[key] = spec
    return spec


def celery_schedule(spec: ScheduleSpec, app: Celery | None) -> Any:
    """``spec`` as Celery's schedule for ``app``, built once per app and spec."""
    if app is None or isinstance(spec, Solar):  # (a solar's observer is not shared)
        return spec.celery(app)
    built = _BUILT.get(app)
    if built is None:
        built = _BUILT[app] = {}
    sched = built.get(spec)
    if sched is None:
        sched = spec.celery(app)
        if len(built) >= PARSED_MAX:
            built.clear()
        built[spec] = sched
    return sched


def _parse_schedule(obj: Any, where: str) -> ScheduleSpec:
    if not isinstance(obj, dict) or len(obj) != 1:
        raise _Refused(where, f"{_show(obj)} is not a schedule: one of"
                              f" {', '.join(repr(k) for k in SCHEDULE_KINDS)}"
                              " ({\"every\": 30}, ...)")
    kind, body = next(iter(obj.items()))
    spec: ScheduleSpec
    where_kind = f"{where}.{kind}"
    if kind == "every":
        spec = _parse_every(body, f"{where}.every")
    elif kind == "crontab":
        spec = _parse_crontab(body, f"{where}.crontab")
    elif kind == "solar":
        spec = _parse_solar(body, f"{where}.solar")
    elif kind == "clocked":
        when = _instant(body, f"{where}.clocked")
        if when.microsecond % 1000:
            raise _Refused(f"{where}.clocked", f"{_show(body)} is finer than a millisecond")
        spec = Clocked(to_ms(when))
    else:
        raise _Refused(where, f"unknown kind {_show(kind)} (known: {', '.join(SCHEDULE_KINDS)})")
    # Every beat computes the same instants with ``occurrences``: one must come.
    try:
        occurrences.next_after(spec.celery(_check_app()), 0, 0)
    except DefinitionError:
        raise
    except Exception as exc:
        raise _Refused(where_kind, f"{_show(body)} gives no instant ({type(exc).__name__}:"
                                   f" {str(exc)[:200]})") from None
    return spec


def _parse_every(value: Any, where: str) -> Every:
    if not _number(value) or not math.isfinite(value) or value <= 0:
        raise _Refused(where, f"{_show(value)} is not a positive number of seconds")
    try:  # what every beat counts with: whole milliseconds, at most ten years
        occurrences.period_ms(schedule(timedelta(seconds=value)))
    except (OverflowError, occurrences.UnsupportedSchedule):
        span = "shorter than a millisecond" if value < 1 else "longer than ten years"
        raise _Refused(where, f"{_show(value)} seconds is {span}") from None
    return Every(_canonical_number(value))


def _parse_crontab(body: Any, where: str) -> Cron:
    if not isinstance(body, dict):
        raise _Refused(where, f"{_show(body)} is not an object of crontab fields")
    known = (*CRON_FIELDS, "timezone")
    for key in body:
        if key not in known:
            raise _Refused(where, f"unknown field {_show(key)} (known: {', '.join(known)})")
    fields: dict[str, str] = {}
    expanded: dict[str, set[int]] = {}
    for name in CRON_FIELDS:
        value = body.get(name, "*")
        if _number(value) and isinstance(value, int):
            value = str(value)
        if not isinstance(value, str) or len(value) > MAX_CRON_FIELD:
            raise _Refused(f"{where}.{name}", f"{_show(value)} is not a crontab field (a"
                                              f" string of at most {MAX_CRON_FIELD} characters)")
        size, lowest = _CRON_RANGES[name]
        try:
            expanded[name] = crontab._expand_cronspec(value, size, lowest)
        except Exception as exc:
            label = name.replace("_", " ")
            raise _Refused(f"{where}.{name}", f"{_show(value)} is not a valid {label}"
                                              f" ({str(exc)[:120]})") from None
        fields[name] = value
    zone = body.get("timezone")
    if zone is not None:
        _zone(zone, f"{where}.timezone")
    # The 30th of February: Celery 5.7 refuses it when built, older ones loop on it.
    if not any(day <= _DAYS_IN_MONTH[month] for month in expanded["month_of_year"]
               for day in expanded["day_of_month"]):
        raise _Refused(where, f"day_of_month {_show(fields['day_of_month'])} never occurs in"
                              f" month_of_year {_show(fields['month_of_year'])}")
    return Cron(**fields, timezone=zone)


def _zone(value: Any, where: str) -> ZoneInfo:
    if not isinstance(value, str) or not value or len(value) > MAX_CRON_FIELD:
        raise _Refused(where, f"{_show(value)} is not a timezone name (as Europe/Paris)")
    if value == "localtime":
        raise _Refused(where, f"{value!r} is each host's own zone: name one (as Europe/Paris)")
    try:
        return ZoneInfo(value)
    except Exception:
        raise _Refused(where, f"{_show(value)} is not a timezone zoneinfo knows"
                              " (as Europe/Paris)") from None


def _parse_solar(body: Any, where: str) -> Solar:
    if not isinstance(body, dict):
        raise _Refused(where, f"{_show(body)} is not an object (event, latitude, longitude)")
    known = ("event", "latitude", "longitude")
    for key in body:
        if key not in known:
            raise _Refused(where, f"unknown field {_show(key)} (known: {', '.join(known)})")
    for key in known:
        if key not in body:
            raise _Refused(where, f"{key!r} is missing")
    event, latitude, longitude = body["event"], body["latitude"], body["longitude"]
    events = sorted(solar._all_events)
    if event not in events:
        raise _Refused(f"{where}.event", f"{_show(event)} is not a solar event Celery knows"
                                         f" ({', '.join(events)})")
    for key, value, bound in (("latitude", latitude, 90), ("longitude", longitude, 180)):
        if not _number(value) or not math.isfinite(value) or not -bound <= value <= bound:
            raise _Refused(f"{where}.{key}", f"{_show(value)} is not a {key} (a number from"
                                             f" -{bound} to {bound})")
    return Solar(event, _canonical_number(latitude), _canonical_number(longitude))


def schedule_to_json(sched: Any) -> dict[str, Any]:
    """A Celery schedule object in the JSON form, for the kinds a definition holds; raises
    :class:`DefinitionError` (naming no entry) for any other (a custom ``BaseSchedule``
    subclass, a crontab subclass)."""
    instant = occurrences.clocked_instant(sched)
    if instant is not None:
        return {"clocked": iso(instant)}
    kind = type(sched)
    if kind is schedule:
        return {"every": _canonical_number(sched.run_every.total_seconds())}
    if kind is crontab or kind is zoned_crontab:
        fields: dict[str, Any] = {
            name: _cron_text(getattr(sched, f"_orig_{name}")) for name in CRON_FIELDS}
        if kind is zoned_crontab:
            fields["timezone"] = sched.zone_name
        return {"crontab": fields}
    if kind is solar:
        return {"solar": {"event": sched.event, "latitude": sched.lat,
                          "longitude": sched.lon}}
    raise _Refused("schedule", f"a {kind.__module__}.{kind.__qualname__} is none of the kinds"
                               f" a definition holds ({', '.join(SCHEDULE_KINDS)})")


def _cron_text(value: Any) -> Any:
    """A crontab field as Celery was given it (an int, a string, a set of ints), as text."""
    if isinstance(value, (str, bool)) or not hasattr(value, "__iter__"):
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    items = list(value)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
        return value
    return ",".join(str(i) for i in sorted(set(items)))


# -- JSON values ------------------------------------------------------------------------

class _Values:
    """Arguments, keyword arguments and headers as JSON values: a copy, checked, with a
    budget of bytes shared by the whole definition (each value spends at most what it
    takes as JSON) so that a huge one is refused before it is all walked. A bad value is
    named by where it is and its type, never by what it holds."""

    def __init__(self) -> None:
        self.budget = MAX_DEFINITION_BYTES

    def spend(self, size: int) -> None:
        self.budget -= size
        if self.budget < 0:
            raise _Refused("", f"more than {MAX_DEFINITION_BYTES} bytes as JSON")

    def value(self, value: Any, where: str, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise _Refused(where, f"nested deeper than {MAX_DEPTH} levels")
        if value is None or isinstance(value, bool):
            self.spend(4)
            return value
        if isinstance(value, int):
            if value.bit_length() > 4 * 3200:  # Python writes at most 4300 digits
                raise _Refused(where, "an int too large to write as JSON")
            self.spend(max(value.bit_length() - 1, 0) * 3 // 10 + 1)
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise _Refused(where, "a float that is not finite (NaN or Infinity) is not"
                                      " a JSON value")
            self.spend(3)
            return value
        if isinstance(value, str):
            self.text(value, where)
            return value
        if isinstance(value, (list, tuple)):
            self.spend(2)
            return [self.value(item, f"{where}[{i}]", depth + 1)
                    for i, item in enumerate(value)]
        if isinstance(value, dict):
            return self.object(value, where, depth)
        raise _Refused(where, f"a {type(value).__name__} is not a JSON value")

    def object(self, value: dict[Any, Any], where: str, depth: int = 0) -> dict[str, Any]:
        self.spend(2)
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Refused(where, f"a key of type {type(key).__name__} (keys are strings)")
            self.text(key, f"{where} (a key)")
            out[key] = self.value(item, f"{where}[{_show(key, 40)}]", depth + 1)
        return out

    def text(self, value: str, where: str) -> None:
        self.spend(len(value) + 2)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _Refused(where, "a string that is not valid Unicode text") from None


# -- the definition ---------------------------------------------------------------------

@dataclass(frozen=True)
class Unstorable:
    """Why a ``beat_schedule`` entry cannot be a definition: it stays the beat's own."""

    reason: str


@dataclass(frozen=True, eq=False)
class Definition:
    """One entry's definition, valid (build it with :func:`validate`). Two definitions are
    equal when their canonical JSON is."""

    task: str
    schedule: ScheduleSpec
    # The task's arguments and options (headers may carry tokens) are the user's: a repr in
    # a log line or a traceback's locals must not carry them.
    args: tuple[Any, ...] = field(default=(), repr=False)
    kwargs: dict[str, Any] = field(default_factory=dict, repr=False)
    options: dict[str, Any] = field(default_factory=dict, repr=False)
    claims: dict[str, Any] = field(default_factory=dict)
    enabled: bool = True
    description: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The JSON form as Python values (a copy: changing it changes nothing here)."""
        return {"task": self.task, "schedule": self.schedule.to_json(),
                "args": copy.deepcopy(list(self.args)), "kwargs": copy.deepcopy(self.kwargs),
                "options": copy.deepcopy(self.options), "claims": dict(self.claims),
                "enabled": self.enabled, "description": self.description}

    @cached_property
    def _json(self) -> str:
        return _dumps(self.as_dict())

    def to_json(self) -> str:
        """The canonical JSON text: sorted keys, no spaces, every field."""
        return self._json

    @cached_property
    def _digest(self) -> str:
        return hashlib.blake2b(self._json.encode("utf-8"), digest_size=16).hexdigest()

    def digest(self) -> str:
        """A stable digest of the canonical JSON (32 hex digits): what beats compare (at
        every heartbeat, for every entry of the beat's own schedule: computed once)."""
        return self._digest

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Definition):
            return NotImplemented
        return self._json == other._json

    def __hash__(self) -> int:
        return hash(self._json)

    def schedule_entry(self, name: str, app: Celery) -> ClaimsEntry:
        """What the scheduler runs: a ``ClaimsEntry`` sending this task with these
        arguments and options, on this schedule, with this policy."""
        from .scheduler import ClaimsEntry

        try:
            sched = celery_schedule(self.schedule, app)
        except _Refused as exc:
            raise exc.on(name) from None
        options = copy.deepcopy(self.options)
        if isinstance(options.get("expires"), str):
            options["expires"] = _instant(options["expires"], "options.expires")
        return ClaimsEntry(name=name, task=self.task, schedule=sched,
                           args=copy.deepcopy(list(self.args)),
                           kwargs=copy.deepcopy(self.kwargs), options=options, app=app,
                           claims=dict(self.claims) or None)

    @classmethod
    def from_entry(cls, name: str, entry: ScheduleEntry) -> Definition | Unstorable:
        """A ``beat_schedule`` entry as a definition, or why it cannot be one: arguments
        that are not JSON values (a ``BeatLazyFunc``, a datetime, an object), an option
        or a schedule of a kind a definition does not hold."""
        try:
            sched = schedule_to_json(entry.schedule)
        except _Refused as exc:
            return Unstorable(str(exc.on(name)))
        options = dict(entry.options or {})
        if isinstance(options.get("expires"), datetime):
            options["expires"] = _instant_text(options["expires"])
        args = entry.args
        obj = {"task": entry.task, "schedule": sched,
               "args": list(args) if isinstance(args, (list, tuple)) else args,
               "kwargs": entry.kwargs or {}, "options": options,
               "claims": getattr(entry, "claims", None)}
        try:
            return validate(name, obj)
        except DefinitionError as exc:
            return Unstorable(str(exc))


def validate(name: str, obj_or_json_text: Any) -> Definition:
    """The definition ``obj_or_json_text`` (a JSON object, as text or as Python values)
    of the entry ``name``, validated; raises :class:`DefinitionError` naming the entry,
    the field and the value."""
    problem = entry_name_problem(name)
    if problem is not None:
        raise DefinitionError(name, "", problem, problem)
    try:
        return _validate(name, obj_or_json_text)
    except _Refused as exc:
        raise exc.on(name) from None


def _validate(name: str, given: Any) -> Definition:
    obj = _parse_text(given) if isinstance(given, (str, bytes)) else given
    if not isinstance(obj, dict):
        raise _Refused("", f"a definition is a JSON object, not a {type(obj).__name__}")
    for key in obj:
        if key not in FIELDS:
            raise _Refused("", f"unknown field {_show(key)} (known: {', '.join(FIELDS)})")
    for key in ("task", "schedule"):
        if key not in obj:
            raise _Refused(key, "missing")
    values = _Values()
    task = obj["task"]
    if (not isinstance(task, str) or len(task) > MAX_TASK_NAME or not task.isprintable()
            or not _TASK_NAME.fullmatch(task)):
        raise _Refused("task", f"{_show(task)} is not a task name (a dotted name without"
                               f" spaces, at most {MAX_TASK_NAME} characters)")
    spec = parse_schedule(obj["schedule"])
    args = _or(obj.get("args"), [])
    if not isinstance(args, (list, tuple)):
        raise _Refused("args", f"a {type(args).__name__} is not a JSON array")
    checked_args = values.value(args, "args")
    kwargs = _or(obj.get("kwargs"), {})
    if not isinstance(kwargs, dict):
        raise _Refused("kwargs", f"a {type(kwargs).__name__} is not a JSON object")
    checked_kwargs = values.object(kwargs, "kwargs")
    options = _options(_or(obj.get("options"), {}), values)
    claims = _claims(name, obj.get("claims"))
    enabled = obj.get("enabled", True)
    if not isinstance(enabled, bool):
        raise _Refused("enabled", f"{_show(enabled)} is not true or false")
    description = _or(obj.get("description"), "")
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
        raise _Refused("description", f"{_show(description)} is not a text of at most"
                                      f" {MAX_DESCRIPTION} characters")
    values.text(description, "description")
    definition = Definition(task=task, schedule=spec, args=tuple(checked_args),
                            kwargs=checked_kwargs, options=options, claims=claims,
                            enabled=enabled, description=description)
    size = len(definition.to_json().encode("utf-8"))
    if size > MAX_DEFINITION_BYTES:
        raise _Refused("", f"{size} bytes as JSON: more than {MAX_DEFINITION_BYTES}")
    return definition


def _or(value: Any, default: Any) -> Any:
    """A field given as null is the field left out."""
    return default if value is None else value


def _parse_text(text: str | bytes) -> Any:
    size = len(text)  # a character is at least one byte: a long text is not encoded
    if isinstance(text, str) and size <= MAX_DEFINITION_BYTES:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise _Refused("", "the text is not valid Unicode") from None
    if size > MAX_DEFINITION_BYTES:
        raise _Refused("", f"{size} bytes of JSON text: more than {MAX_DEFINITION_BYTES}")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:  # (its messages quote nothing of the text)
        raise _Refused("", f"not JSON: {exc.msg}: line {exc.lineno} column {exc.colno}"
                           ) from None
    except RecursionError:
        raise _Refused("", "not JSON this side can read: nested too deeply") from None
    except DefinitionError:  # (a key twice)
        raise
    except ValueError as exc:  # (a number of more digits than Python reads, bad UTF-8)
        raise _Refused("", f"not JSON: {type(exc).__name__}") from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused("", f"the key {_show(key, 40)} appears twice in one object")
        out[key] = value
    return out


def _options(options: Any, values: _Values) -> dict[str, Any]:
    if not isinstance(options, dict):
        raise _Refused("options", f"a {type(options).__name__} is not a JSON object")
    out: dict[str, Any] = {}
    for key in sorted(options, key=str):
        value, where = options[key], f"options.{key}"
        if key not in OPTION_KEYS:
            raise _Refused("options", f"unknown option {_show(key)} (known:"
                                      f" {', '.join(OPTION_KEYS)})")
        if key in ("queue", "routing_key", "exchange"):
            if not isinstance(value, str) or len(value.encode("utf-8", "replace")) > 255 or (
                    key == "queue" and not value):
                raise _Refused(where, f"{_show(value)} is not a name of at most 255 bytes")
            values.text(value, where)
        elif key == "priority":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
                raise _Refused(where, f"{_show(value)} is not a priority (an integer from 0"
                                      " to 255)")
        elif key == "headers":
            if not isinstance(value, dict):
                raise _Refused(where, f"a {type(value).__name__} is not a JSON object")
            value = values.object(value, where)
        elif key == "expires" and isinstance(value, str):
            value = _instant_text(_instant(value, where))
        else:  # expires in seconds, soft_time_limit, time_limit
            if not _number(value) or not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
                raise _Refused(where, f"{_show(value)} is not a number of seconds (above 0,"
                                      " at most ten years)"
                                      + (" or an instant" if key == "expires" else ""))
            value = _canonical_number(value)
        out[key] = value
    return out


def _claims(name: str, claims: Any) -> dict[str, Any]:
    """The ``claims`` policy overrides, checked by the beat's own checks (``Settings.
    policy_for``), each key alone so that the message names it."""
    if claims is None:
        return {}
    if not isinstance(claims, dict):
        raise _Refused("claims", f"a {type(claims).__name__} is not a JSON object")
    out: dict[str, Any] = {}
    for key in sorted(claims, key=str):
        value = claims[key]
        where = f"claims.{key}" if isinstance(key, str) else "claims"
        if not isinstance(key, str):
            raise _Refused("claims", f"a key of type {type(key).__name__} (keys are strings)")
        if not (value is None or isinstance(value, (bool, int, float))
                or (isinstance(value, str) and len(value) <= 100)):
            raise _Refused(where, f"{_show(value)} is not a policy value")
        try:
            _POLICY_CHECKS.policy_for(name, {key: value})
        except ConfigurationError as exc:
            raise _Refused(where, "", str(exc)) from None
        out[key] = _canonical_number(value) if isinstance(value, float) else value
    return out


__all__ = [
    "CRON_FIELDS",
    "FIELDS",
    "MAX_DEFINITION_BYTES",
    "OPTION_KEYS",
    "SCHEDULE_KINDS",
    "Clocked",
    "Cron",
    "Definition",
    "DefinitionError",
    "Every",
    "ScheduleSpec",
    "Solar",
    "Unstorable",
    "parse_schedule",
    "schedule_to_json",
    "validate",
]
