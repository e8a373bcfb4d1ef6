"""Entries at run time: create, change, enable, disable and delete entries in the store
while the beats run, from Python (``Entries(app)``); ``celery claims entries`` is its CLI.

Every beat follows the store's definitions; a change takes effect as
:mod:`beat_claims.entry_changes` says (from the first occurrence after the change; what it
skips is recorded). An edit names the version it read: a stale one is refused
(:class:`StaleVersion`), never written over another. An entry defined in a beat's
``beat_schedule`` is changed there: it is refused here (:class:`DefinedInBeatSchedule`).
Bad input is refused before anything is written (:class:`DefinitionError`, naming the
entry, the field and the value).

A schedule is given in a definition's JSON form (``{"every": 30}``, ``{"crontab": {...}}``,
``{"solar": {...}}``, ``{"clocked": "2026-12-24T18:00:00Z"}``) or as Celery gives it: a
``crontab(...)``, a ``schedule``, a ``solar``, a ``timedelta`` or a number of seconds, an
aware ``datetime`` (one instant). A crontab without a timezone takes the app's
(``timezone``), written into the definition.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from celery.schedules import BaseSchedule

from . import operations
from .definitions import Definition, DefinitionError, schedule_to_json, validate
from .entry_changes import CHUNK, EntryChange, apply_changes
from .enums import Origin
from .runs import iso, to_ms
from .settings import Settings
from .stores import open_store
from .stores.base import (
    DefinitionResult,
    EntryRecord,
    Store,
    StoredDefinition,
    WriteStatus,
)

if TYPE_CHECKING:
    from celery import Celery

#: What ``list`` answers at most per call, unless told.
DEFAULT_PAGE = 100
#: What ``show -j`` writes beside a definition's fields (an import ignores them).
EXPORT_ONLY = ("version", "origin", "changed_by", "changed_at", "problem")
#: The fields an update's own fields are checked beside, before the entry is read.
_PLACEHOLDER = {"task": "placeholder", "schedule": {"every": 60}}


class EntryError(ValueError):
    """A change of an entry that cannot be made as asked (the message says why): nothing
    of it was written."""

    def __init__(self, entry: str, message: str) -> None:
        self.entry = entry
        super().__init__(message)


class StaleVersion(EntryError):
    """The entry changed since the caller read it: its edit is refused."""

    def __init__(self, entry: str, expected: int, current: int) -> None:
        self.expected, self.current = expected, current
        super().__init__(entry, f"entry {entry!r}: version {expected} is stale, the store"
                                f" holds version {current}: nothing was written (read it"
                                " again and edit that version)")


class EntryExists(EntryError):
    """A create of an entry the store holds a definition of."""

    def __init__(self, entry: str, version: int) -> None:
        self.version = version
        super().__init__(entry, f"entry {entry!r} exists (version {version}): nothing was"
                                " written (edit it, or remove it first)")


class NoSuchEntry(EntryError, KeyError):
    """An entry the store holds no definition of (never had one, or deleted)."""

    def __init__(self, entry: str, why: str = "") -> None:
        super().__init__(entry, f"no entry {entry!r} in the store{why}")

    def __str__(self) -> str:  # (KeyError would quote the message)
        return str(self.args[0])


class DefinedInBeatSchedule(EntryError):
    """An entry a beat's ``beat_schedule`` defines: changed there, not here."""

    def __init__(self, entry: str, how: str) -> None:
        super().__init__(entry, f"entry {entry!r} is defined in beat_schedule ({how}):"
                                " change it there; nothing was written")


@dataclass(frozen=True)
class StoredEntry:
    """An entry's definition as the store holds it. ``definition`` is None when the stored
    one cannot be read (``problem`` says why)."""

    name: str
    definition: Definition | None = field(repr=False)  # (its args: not in a log line)
    version: int
    origin: Origin
    changed_by: str
    changed_at: int  # store clock, UTC ms
    problem: str = ""

    @property
    def enabled(self) -> bool:
        return self.definition is not None and self.definition.enabled

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the definition's fields (its args and kwargs too: the user's
        configuration) and the version, origin, who and when."""
        fields = self.definition.as_dict() if self.definition is not None else {}
        return {"name": self.name, **fields, "version": self.version,
                "origin": self.origin.value, "changed_by": self.changed_by,
                "changed_at": iso(self.changed_at) if self.changed_at else None,
                **({"problem": self.problem} if self.problem else {})}


@dataclass(frozen=True)
class BulkResult:
    """One item of a bulk: the entry as written, or why it was not."""

    name: str
    entry: StoredEntry | None
    error: ValueError | None = None  # an EntryError, or a DefinitionError


def stored_entry(found: StoredDefinition) -> StoredEntry:
    """A stored definition as an entry (a live one: not a tombstone)."""
    problem, definition = found.corrupt, None
    if not problem and found.definition is not None:
        try:
            definition = validate(found.name, found.definition)
        except DefinitionError as exc:
            problem = f"the stored definition cannot be read: {exc}"
    return StoredEntry(found.name, definition, found.version, found.origin, found.changed_by,
                       found.changed_at, problem)


def _written(change: EntryChange, found: StoredDefinition) -> StoredEntry:
    """The entry a write left: the definition validated on its way in when the store
    holds that same text (a million written need not be parsed and validated again,
    nor held twice), else the stored one read as any other."""
    if change.definition is None or found.definition != change.definition.to_json():
        return stored_entry(found)
    return StoredEntry(found.name, change.definition, found.version, found.origin,
                       found.changed_by, found.changed_at, found.corrupt)


def schedule_json(given: Any, app: Celery | None = None) -> Any:
    """A schedule as a definition's JSON form: Celery's objects, a ``timedelta`` or a number
    of seconds, an aware ``datetime`` converted; a JSON form as it is. A crontab without a
    timezone gets the app's (with ``app``)."""
    obj: Any = given
    if isinstance(given, bool):
        pass
    elif isinstance(given, (int, float)):
        obj = {"every": given}
    elif isinstance(given, timedelta):
        obj = {"every": given.total_seconds()}
    elif isinstance(given, datetime):
        if given.tzinfo is None or given.utcoffset() is None:
            raise DefinitionError(None, "schedule", f"{given.isoformat()!r} has no timezone:"
                                                    " give its offset (an aware datetime)")
        obj = {"clocked": iso(to_ms(given))}
    elif isinstance(given, BaseSchedule):
        obj = schedule_to_json(given)
    if (app is not None and isinstance(obj, dict) and isinstance(obj.get("crontab"), dict)
            and "timezone" not in obj["crontab"]):
        obj = {"crontab": {**obj["crontab"], "timezone": app_timezone(app)}}
    return obj


def app_timezone(app: Celery) -> str:
    """The name of the app's timezone (``timezone``; UTC when unset and ``enable_utc``)."""
    zone = app.conf.timezone
    if zone is None:
        if app.conf.enable_utc:
            return "UTC"
        raise DefinitionError(None, "schedule.crontab.timezone",
                              "not given, and the app names no timezone (its timezone"
                              " setting): name one (as Europe/Paris)")
    return str(getattr(zone, "key", zone))


class Entries:
    """The entries of the store ``app``'s settings name (``beat_claims_url``), or of
    ``store``. ``by``: who makes the changes, recorded with each (default:
    ``<OS user>@<host>``)."""

    def __init__(self, app: Celery, store: Store | None = None, by: str | None = None
                 ) -> None:
        self.app = app
        self.store = store if store is not None else open_store(Settings.from_app(app))
        self.by = operations.who(by)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Entries:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading --------------------------------------------------------------------------
    def get(self, name: str) -> StoredEntry:
        """The entry's definition; :class:`NoSuchEntry` when the store holds none."""
        found = self.store.definitions([name])
        if not found or found[0].deleted:
            raise NoSuchEntry(name, " (deleted)" if found else "")
        return stored_entry(found[0])

    def list(self, after: str = "", limit: int = DEFAULT_PAGE) -> builtins.list[StoredEntry]:
        """The entries with a definition, in name order (by code point), the first
        ``limit`` after the name ``after``: the next page starts after the last one's
        name."""
        out: builtins.list[StoredEntry] = []
        for entry in self.iterate(after):
            out.append(entry)
            if len(out) >= limit:
                break
        return out

    def iterate(self, after: str = "", page: int = DEFAULT_PAGE) -> Iterator[StoredEntry]:
        """Every entry with a definition after the name ``after``, in name order, read a
        page at a time (bounded memory)."""
        while True:
            found = self.store.definitions(after=after, limit=page)
            for d in found:
                if not d.deleted:
                    yield stored_entry(d)
            if len(found) < page:
                return
            after = found[-1].name

    # -- one entry ------------------------------------------------------------------------
    def definition(self, name: str, fields: Mapping[str, Any]) -> Definition:
        """``fields`` as a valid definition of ``name`` (the schedule as :func:`schedule_json`
        takes it); :class:`DefinitionError` naming the field and the value."""
        return validate(name, self._given(name, fields))

    def _given(self, name: str, fields: Mapping[str, Any]) -> dict[str, Any]:
        """``fields`` with the schedule, if given, in a definition's JSON form."""
        obj = dict(fields)
        if "schedule" in obj:
            try:
                obj["schedule"] = schedule_json(obj["schedule"], self.app)
            except DefinitionError as exc:
                raise exc.on(name) from None
        return obj

    def create(self, name: str, task: str, schedule: Any, args: Iterable[Any] = (),
               kwargs: Mapping[str, Any] | None = None,
               options: Mapping[str, Any] | None = None,
               claims: Mapping[str, Any] | None = None, enabled: bool = True,
               description: str = "") -> StoredEntry:
        """A new entry: :class:`EntryExists` when the store holds a definition of it."""
        fields = {"task": task, "schedule": schedule, "args": _listed(args), "kwargs": kwargs,
                  "options": options, "claims": claims, "enabled": enabled,
                  "description": description}
        [result] = self.bulk_create([{"name": name, **fields}])
        return _raised(result)

    def update(self, name: str, version: int, **fields: Any) -> StoredEntry:
        """Change the given fields of the entry's definition at ``version`` (the one the
        caller read): :class:`StaleVersion` when the store holds another."""
        [result] = self.bulk_update([{"name": name, "version": version, **fields}])
        return _raised(result)

    def enable(self, name: str, version: int | None = None) -> StoredEntry:
        """Enable the entry (from its first occurrence after now; those due while it was
        disabled are recorded skipped, ``disabled``). ``version``: the one the caller read
        (default: the one the store holds)."""
        return self._set_enabled(name, True, version)

    def disable(self, name: str, version: int | None = None) -> StoredEntry:
        """Disable the entry: no beat sends it from now on (runs already claimed go on)."""
        return self._set_enabled(name, False, version)

    def _set_enabled(self, name: str, enabled: bool, version: int | None) -> StoredEntry:
        current = self.get(name)
        if current.definition is not None and current.enabled == enabled and (
                version is None or version == current.version):
            return current
        return self.update(name, current.version if version is None else version,
                           enabled=enabled)

    def delete(self, name: str, version: int | None = None) -> int:
        """Delete the entry's definition (its runs under way finish; no beat sends it
        after): the version of its tombstone. ``version``: the one the caller read
        (default: the one the store holds)."""
        current = self.get(name)
        expected = current.version if version is None else version
        self._refuse_config([name])
        [result] = apply_changes(self.store, [EntryChange(name, None, expected)],
                                 Origin.API, self.by, self.app)
        if result.status is not WriteStatus.OK:
            raise _refusal(result, expected)
        return result.version

    # -- bulk -----------------------------------------------------------------------------
    def bulk_create(self, items: Iterable[Mapping[str, Any]], counts_from_change: bool = False
                    ) -> builtins.list[BulkResult]:
        """Create entries, each given as its definition's fields and its ``name``: every
        item is validated before anything is written (:class:`DefinitionError` naming the
        first bad one), then they are written a chunk at a time. One result per item.
        ``counts_from_change``: each counts from its creation (a one-off instant already
        past is not sent; see :class:`EntryChange`)."""
        changes = [EntryChange(name, self.definition(name, fields), 0,
                               counts_from_change=counts_from_change)
                   for name, fields in _named(items)]
        return self._write(changes)

    def bulk_update(self, items: Iterable[Mapping[str, Any]]) -> builtins.list[BulkResult]:
        """Change entries, each given as its ``name``, the ``version`` read and the fields
        to change. Every item is validated before anything is written."""
        named = [(name, dict(fields)) for name, fields in _named(items)]
        for name, fields in named:
            version = fields.pop("version", None)
            if not isinstance(version, int) or isinstance(version, bool) or version < 1:
                raise DefinitionError(name, "version", f"{version!r} is not the version"
                                                       " read (a whole number from 1)")
            self.definition(name, {**_PLACEHOLDER, **fields})  # each field checked alone
            fields["version"] = version
        out: builtins.list[BulkResult] = []
        for start in range(0, len(named), CHUNK):
            out += self._update_chunk(named[start:start + CHUNK])
        return out

    def _update_chunk(self, named: builtins.list[tuple[str, dict[str, Any]]]
                      ) -> builtins.list[BulkResult]:
        stored = {d.name: d for d in self.store.definitions([n for n, _ in named])}
        changes: builtins.list[EntryChange] = []
        early: dict[int, BulkResult] = {}
        for i, (name, fields) in enumerate(named):
            version = fields.pop("version")
            current = stored.get(name)
            if current is None or current.deleted:
                early[i] = BulkResult(name, None, NoSuchEntry(name))
                continue
            if current.version != version:
                early[i] = BulkResult(name, None, StaleVersion(name, version, current.version))
                continue
            before = stored_entry(current)
            if before.definition is None:
                early[i] = BulkResult(name, None, EntryError(
                    name, f"entry {name!r}: {before.problem}: replace it with create after"
                          " remove"))
                continue
            try:
                # Only what the caller gives is converted: a stored crontab without a
                # timezone keeps it (a description's change is not a schedule's).
                merged = validate(name, {**before.definition.as_dict(),
                                         **self._given(name, fields)})
            except DefinitionError as exc:  # (fine alone, too large together)
                early[i] = BulkResult(name, None, exc)
                continue
            changes.append(EntryChange(name, merged, version))
        written = iter(self._write(changes, stored))
        return [early[i] if i in early else next(written) for i in range(len(named))]

    def _write(self, changes: builtins.list[EntryChange],
               stored: Mapping[str, StoredDefinition] | None = None) -> builtins.list[BulkResult]:
        """The changes written, those of entries defined in beat_schedule refused."""
        out: builtins.list[BulkResult] = []
        for start in range(0, len(changes), CHUNK):
            chunk = changes[start:start + CHUNK]
            refused = self.config_entries([c.name for c in chunk], stored)
            allowed = [c for c in chunk if c.name not in refused]
            results = iter(apply_changes(self.store, allowed, Origin.API, self.by, self.app))
            for change in chunk:
                if change.name in refused:
                    out.append(BulkResult(change.name, None, DefinedInBeatSchedule(
                        change.name, refused[change.name])))
                    continue
                result = next(results)
                if result.status is WriteStatus.OK and result.current is not None:
                    out.append(BulkResult(change.name, _written(change, result.current)))
                else:
                    out.append(BulkResult(change.name, None,
                                          _refusal(result, change.expected_version)))
        return out

    def _refuse_config(self, names: builtins.list[str]) -> None:
        refused = self.config_entries(names)
        for name in names:
            if name in refused:
                raise DefinedInBeatSchedule(name, refused[name])

    def config_entries(self, names: builtins.list[str],
                       stored: Mapping[str, StoredDefinition] | None = None
                       ) -> dict[str, str]:
        """Which of ``names`` a live beat's ``beat_schedule`` defines, and how it is known:
        a definition the beats wrote from it (origin config) that a live beat registered,
        or no definition and live beats that registered it. A beat_schedule definition no
        live beat registers (its entry left every deploy) is the operators' to remove;
        one whose registrants cannot be read is refused (nothing unseen is changed)."""
        if stored is None or any(n not in stored for n in names):
            stored = {d.name: d for d in self.store.definitions(names)}
        config = {d.name for d in stored.values() if d.name in names and not d.deleted
                  and d.origin is Origin.CONFIG}
        bare = [n for n in names if n not in stored]
        out: dict[str, str] = {}
        if not bare and not config:
            return out
        records = {r.name: r for r in self.store.entries(sorted(config) + bare)}
        alive = {o.owner.id: o for o in self.store.owners() if o.alive}
        for name in sorted(config):
            record = records.get(name)
            if record is None or record.registrants is None:
                out[name] = "its definition came from a beat's beat_schedule"
            elif beats := _live_registrants(record, alive):
                out[name] = (f"its definition came from the beat_schedule of the live"
                             f" beat(s) {', '.join(beats)}")
        for name in bare:
            record = records.get(name)
            if record is not None and (beats := _live_registrants(record, alive)):
                out[name] = f"registered by the live beat(s) {', '.join(beats)}"
        return out


@dataclass(frozen=True)
class ImportPlan:
    """What an import does: the entries it creates (none in the store, or deleted), those it
    changes (at the version read: a change made meanwhile is refused, not written over),
    those the store holds as given, and those it refuses (defined in beat_schedule)."""

    create: tuple[tuple[str, Definition], ...]
    update: tuple[tuple[str, int, Definition], ...]
    unchanged: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]


def plan_import(entries: Entries, items: Iterable[Mapping[str, Any]]) -> ImportPlan:
    """What importing ``items`` (each a definition's fields and its ``name``, as
    ``export`` writes them; ``version``, ``origin``, ``changed_by`` and ``changed_at`` are
    ignored) would do. Every item is validated first (:class:`DefinitionError` naming the
    first bad one, or a name given twice); nothing is written."""
    wanted: dict[str, Definition] = {}
    for name, fields in _named(items):
        if name in wanted:
            raise DefinitionError(name, "name", "given twice")
        for key in EXPORT_ONLY:
            fields.pop(key, None)
        wanted[name] = entries.definition(name, fields)
    create: list[tuple[str, Definition]] = []
    update: list[tuple[str, int, Definition]] = []
    unchanged: list[str] = []
    refused: list[tuple[str, str]] = []
    names = list(wanted)
    for start in range(0, len(names), CHUNK):
        chunk = names[start:start + CHUNK]
        stored = {d.name: d for d in entries.store.definitions(chunk)}
        config = entries.config_entries(chunk, stored)
        for name in chunk:
            current, definition = stored.get(name), wanted[name]
            if name in config:
                refused.append((name, config[name]))
            elif current is None or current.deleted:
                create.append((name, definition))
            elif current.definition == definition.to_json():
                unchanged.append(name)
            else:
                update.append((name, current.version, definition))
    return ImportPlan(tuple(create), tuple(update), tuple(unchanged), tuple(refused))


def apply_import(entries: Entries, plan: ImportPlan) -> list[BulkResult]:
    """The plan's creates and updates written: one result each (creates first). A created
    entry counts from the import, as a changed one does: a one-off instant already past
    may have run in the store the entries were exported from, and is not sent again."""
    created = entries.bulk_create(({"name": name, **d.as_dict()} for name, d in plan.create),
                                  counts_from_change=True)
    updated = entries.bulk_update({"name": name, "version": version, **d.as_dict()}
                                  for name, version, d in plan.update)
    return created + updated


def _live_registrants(record: EntryRecord, alive: Mapping[str, Any]) -> list[str]:
    return [operations.beat_name(alive, r) for r in record.registrants or ()
            if r.owner in alive]


def _named(items: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each item's name and its other fields; an item without a name is refused."""
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise DefinitionError(None, f"item {i}", f"a {type(item).__name__} is not an"
                                                     " object of fields")
        fields = dict(item)
        name = fields.pop("name", None)
        if not isinstance(name, str):
            raise DefinitionError(None, f"item {i}.name", f"{name!r} is not an entry name")
        yield name, fields


def _listed(args: Iterable[Any]) -> Any:
    return list(args) if isinstance(args, (list, tuple)) else args


def _refusal(result: DefinitionResult, expected: int) -> EntryError:
    """Why the store did not write a change, as an error naming the entry."""
    name = result.name
    if result.status is WriteStatus.EXISTS:
        return EntryExists(name, result.version)
    if result.status is WriteStatus.MISSING:
        return NoSuchEntry(name, " (deleted)" if result.current is not None else "")
    if result.status is WriteStatus.CONFLICT and result.detail != "checkpoint":
        return StaleVersion(name, expected, result.version)
    if result.status is WriteStatus.CONFLICT:
        return EntryError(name, f"entry {name!r}: the beats kept claiming it while the"
                                " change was being written: nothing was written, try again")
    return EntryError(name, f"entry {name!r}: its record in the store cannot be read"
                            f" ({result.detail}): nothing was written")


def _raised(result: BulkResult) -> StoredEntry:
    if result.error is not None:
        raise result.error
    assert result.entry is not None
    return result.entry


__all__ = [
    "BulkResult",
    "DefinedInBeatSchedule",
    "Entries",
    "EntryError",
    "EntryExists",
    "ImportPlan",
    "NoSuchEntry",
    "StaleVersion",
    "StoredEntry",
    "app_timezone",
    "apply_import",
    "plan_import",
    "schedule_json",
    "stored_entry",
]
