"""Entries from django-celery-beat's tables, sent by any number of beats, each occurrence once.

``celery -A proj beat -S beat_claims.contrib.django.DatabaseScheduler``

The entries are the enabled ``PeriodicTask`` rows (interval, crontab with its own timezone,
solar, clocked), keyed by name, plus the project's ``beat_schedule`` (which wins on a name
clash). The store stays the truth: every occurrence is claimed there before it is sent, as
with the plain Scheduler; the database only says what the entries are.

All the enabled rows are read once, at start. Then, when django-celery-beat's change marker
(``PeriodicTasks``) moves (checked at most every ``max_interval`` seconds), only what
changed is read and applied (:meth:`Scheduler.change_local`: the work is in proportion to
the change, not to the number of rows): the rows whose ``date_changed`` is at or after the
newest one seen less CHANGE_MARGIN, the rows enabled or gone (the ids of the enabled rows,
compared with those known), and the rows of a schedule (interval, crontab, solar, clocked)
that changed (those tables, compared with what was read). Every FULL_READ_EVERY seconds,
whatever the marker says, every enabled row's columns are compared with what was read
(``QuerySet.update()`` moves neither the marker nor ``date_changed``), and the rows that
differ are read and applied.

Row fields map onto the scheduler's hooks: ``start_time`` and ``expires`` are ``bounds()``;
``one_off`` bounds the entry to its first occurrence (so with many beats it runs once); a
clocked row's instant is one occurrence. After a send the row's ``last_run_at`` and
``total_run_count`` are updated, in batches and best effort, for the admin; a one-off row is
disabled as django-celery-beat does. Nothing read back from those fields decides what runs,
except for one-off rows (:func:`one_off_state`): one that already ran is not run again, and
one that ran and was enabled again without a save (the admin's "Enable selected tasks"
action changes nothing else) is armed by the first beat that sees it, with a conditional
write of its ``date_changed``, so that every beat runs the same one occurrence. Rows have
no place for a ``claims`` policy: it comes from the ``beat_claims_entry_claims`` setting,
by entry name.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from json import JSONDecodeError
from typing import Any

from celery import Celery
from celery.utils.log import get_logger
from django.db import connections
from kombu.utils.json import loads

from ... import occurrences
from ...runs import from_ms, to_ms
from ...scheduler import ClaimsEntry, Scheduler
from ...settings import ConfigurationError, Settings
from ...stores.base import Claim

logger = get_logger("celery.beat.claims")

#: Every enabled row is compared with what was read this often, even when the change marker
#: did not move (a change made with ``QuerySet.update()`` does not move it), as
#: django-celery-beat reads them all: its columns only, read in full where they differ.
FULL_READ_EVERY = 300.0
#: At a move of the change marker, the rows whose ``date_changed`` is this close to the
#: newest one seen (or later) are looked at again (by id and date: read in full only when
#: their date is not the one read). ``date_changed`` is set by the clock of the process that
#: saves the row, when it saves it, and the row is seen only once its transaction commits: a
#: row saved by a host whose clock is behind another's, or committed after a later one, has
#: an older date than the newest seen. A minute covers clocks kept by NTP (milliseconds
#: apart) and a request's transaction; a row outside it is read at the next full comparison.
CHANGE_MARGIN = timedelta(seconds=60)
#: Rows read by primary key in one query.
READ_CHUNK = 1000
#: What makes a row's entry, as ``values_list`` gives it, for comparing rows without
#: reading them whole (``last_run_at`` and ``total_run_count`` last: the beats write them
#: back, so they count only for a one-off row, whose state they are).
_ROW_FIELDS = ("id", "name", "task", "args", "kwargs", "queue", "exchange", "routing_key",
               "priority", "headers", "expires", "expire_seconds", "one_off", "start_time",
               "interval_id", "crontab_id", "solar_id", "clocked_id", "date_changed",
               "last_run_at", "total_run_count")
_ONE_OFF = _ROW_FIELDS.index("one_off")
_CLOCKED = _ROW_FIELDS.index("clocked_id")
_SCHEDULE_KINDS = ("interval", "crontab", "solar", "clocked")
#: ``last_run_at``/``total_run_count`` are written back at most this often (one-off rows are
#: disabled at the next tick).
WRITE_BACK_EVERY = 5.0


@dataclass(frozen=True)
class RowBounds:
    """What the row says about when its entry may have occurrences (UTC ms)."""

    pk: Any
    not_before: int | None  # start_time
    not_after: int | None  # the instant before ``expires``
    one_off: bool  # only the first occurrence at or after ``armed_at`` (and start_time)
    armed_at: int | None  # one-off rows: when the row was last saved (a re-enable re-arms it)
    clocked: bool


class OneOffState(Enum):
    """Where a one-off row enabled in the database is in its life."""

    ARMED = "armed"  # its one occurrence is to come: scheduled
    RAN = "ran"  # it ran and is not disabled yet: disabled, not run
    ENABLED_AGAIN = "enabled again"  # it ran, was disabled, enabled again with no save: armed


@dataclass(frozen=True)
class _ToArm:
    """A one-off row enabled again without a save, as read: armed only if still so."""

    date_changed: datetime
    last_run_at: int


@dataclass(frozen=True)
class _Known:
    """An enabled row as last read (scheduled or not)."""

    name: str
    date_changed: datetime
    digest: int  # of its _ROW_FIELDS
    schedule: tuple[str, Any]  # (kind, id) of its schedule row


@dataclass
class _Changes:
    """What one read found changed: rows read whole, rows gone (pk)."""

    rows: list[Any]
    gone: set[Any]
    enabled: int  # enabled rows in the table
    how: str


def _digest(values: tuple[Any, ...]) -> int:
    """A row's _ROW_FIELDS values, as one number (compared within this process)."""
    one_off = values[_ONE_OFF] or values[_CLOCKED] is not None  # (a clocked row is one-off)
    return hash((values[:-2], values[-2:] if one_off else None))


def _row_digest(row: Any) -> int:
    return _digest(tuple(getattr(row, field) for field in _ROW_FIELDS))


def _schedule_key(row: Any) -> tuple[str, Any]:
    for kind in _SCHEDULE_KINDS:
        pk = getattr(row, f"{kind}_id")
        if pk is not None:
            return kind, pk
    return "", None


@dataclass
class _Sent:
    due: int
    count: int
    one_off: bool


def _django_ready() -> None:
    """Celery's Django fixup sets Django up before beat starts; do it if something did not."""
    from django.apps import apps

    if not apps.ready:
        import django

        django.setup()


def _models() -> tuple[Any, Any]:
    _django_ready()
    from django_celery_beat.models import PeriodicTask, PeriodicTasks

    return PeriodicTask, PeriodicTasks


def _close_stale_connections() -> None:
    """What django-celery-beat does with ``close_old_connections()`` before each use, except
    inside a caller's transaction (a test's), where dropping the connection would break it."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


def _ms(value: datetime | None) -> int | None:
    """A model datetime in UTC ms; naive ones (``USE_TZ = False``) are in Django's zone."""
    if value is None:
        return None
    if value.tzinfo is None:
        from django.utils import timezone

        value = timezone.make_aware(value, timezone.get_default_timezone())
    return to_ms(value)


def _db_datetime(ms: int) -> datetime:
    from django.conf import settings
    from django.utils import timezone

    value = from_ms(ms)
    if not getattr(settings, "USE_TZ", False):
        value = timezone.make_naive(value, timezone.get_default_timezone())
    return value


def entry_from_row(row: Any, app: Celery, claims: dict[str, Any] | None = None
                   ) -> tuple[ClaimsEntry, RowBounds]:
    """The schedule entry of one ``PeriodicTask`` row, as django-celery-beat's ``ModelEntry``
    builds it (task, JSON args/kwargs, queue/exchange/routing_key/priority, expires as a
    message option, headers with ``periodic_task_name``), and the row's bounds.

    Raises ValueError (with the reason) for a row that cannot be run.
    """
    scheduler = row.scheduler
    if scheduler is None:
        raise ValueError("no schedule (interval, crontab, solar or clocked) is set")
    sched = scheduler.schedule
    try:
        args = loads(row.args or "[]")
        kwargs = loads(row.kwargs or "{}")
        headers = loads(row.headers or "{}")
    except ValueError as exc:
        raise ValueError(f"args, kwargs or headers are not JSON ({_where(exc)})") from None
    if not isinstance(args, list) or not isinstance(kwargs, dict) or not isinstance(
            headers, dict):
        raise ValueError("args must be a JSON list, kwargs and headers JSON objects")
    try:
        occurrences.next_after(sched, 0, 0)
    except Exception as exc:
        raise ValueError(f"schedule {sched!r}: {exc}") from None
    options: dict[str, Any] = {}
    for option in ("queue", "exchange", "routing_key", "priority"):
        value = getattr(row, option)
        if value is not None:
            options[option] = value
    if row.expires_:
        options["expires"] = row.expires_
    headers["periodic_task_name"] = row.name
    options["headers"] = headers
    entry = ClaimsEntry(name=row.name, task=row.task, schedule=sched, args=args,
                        kwargs=kwargs, options=options, total_run_count=row.total_run_count,
                        last_run_at=row.last_run_at, app=app, claims=claims)
    clocked = occurrences.clocked_instant(entry.schedule) is not None
    one_off = bool(row.one_off) or clocked  # a clocked time is one occurrence anyway
    expires = _ms(row.expires)
    bounds = RowBounds(
        pk=row.pk,
        not_before=_ms(row.start_time),
        not_after=None if expires is None else expires - 1,
        one_off=one_off,
        armed_at=_ms(row.date_changed) if one_off and not clocked else None,
        clocked=clocked,
    )
    return entry, bounds


def _where(exc: ValueError) -> str:
    """Where the row's JSON could not be read, never what it holds: a decoder's error may
    quote a value (kombu's for an unknown ``__type__`` quotes the whole object), and this
    text is logged."""
    if isinstance(exc, JSONDecodeError):  # (the standard library's messages quote nothing)
        return f"{exc.msg}: line {exc.lineno} column {exc.colno}"
    return type(exc).__name__


def one_off_state(row: Any, bounds: RowBounds, sched: Any) -> OneOffState | None:
    """Where an enabled one-off row is (None: not one-off).

    RAN: django-celery-beat's mark (a run count on an enabled one-off row), or a clocked
    row whose last run is at or after its instant. ENABLED_AGAIN: an interval, crontab or
    solar row whose last run is at or after the instant it was armed for: this scheduler
    sets ``last_run_at`` only together with ``enabled = False``, and the admin's form saves
    a row enabled again (its ``date_changed`` moves past that run: ARMED), so only an
    ``update()`` made it so (the admin's "Enable selected tasks" action)."""
    if not bounds.one_off:
        return None
    if row.total_run_count > 0:
        return OneOffState.RAN
    last = _ms(row.last_run_at)
    if bounds.clocked:
        instant = occurrences.clocked_instant(sched)
        ran = last is not None and instant is not None and last >= instant
        return OneOffState.RAN if ran else OneOffState.ARMED
    if last is not None and bounds.armed_at is not None and last >= bounds.armed_at:
        return OneOffState.ENABLED_AGAIN
    return OneOffState.ARMED


def entry_claims(app: Celery, settings: Settings | None = None) -> dict[str, dict[str, Any]]:
    """``beat_claims_entry_claims``: entry name -> ``claims`` dict, for rows (which have no
    place for one). Validated like every other setting: ConfigurationError names the entry,
    the key and the value. A beat reads it once, at start."""
    settings = settings or Settings.from_app(app)
    mapping = app.conf.get("beat_claims_entry_claims") or {}
    if not isinstance(mapping, dict):
        raise ConfigurationError(
            f"beat_claims_entry_claims={mapping!r}: must be a dict of entry name -> claims dict")
    for name, claims in mapping.items():
        settings.policy_for(str(name), claims)
    return {str(name): claims for name, claims in mapping.items()}


def schedules_from_db(enabled_only: bool = True) -> dict[str, Any]:
    """Entry name -> Celery schedule of the ``PeriodicTask`` rows (for status pages: with
    ``inspect.status(app, schedules=...)`` they give the next occurrences). Rows without a
    usable schedule are left out."""
    PeriodicTask, _ = _models()
    rows = PeriodicTask.objects.enabled() if enabled_only else PeriodicTask.objects.all()
    out: dict[str, Any] = {}
    for row in rows.prefetch_related("interval", "crontab", "solar", "clocked"):
        try:
            out[row.name] = row.schedule
        except Exception:
            continue
    return out


class DatabaseScheduler(Scheduler):
    """django-celery-beat's ``PeriodicTask`` rows as entries, claimed like any other entry."""

    def __init__(self, app: Celery, *args: Any, **kwargs: Any) -> None:
        self._rows: dict[str, RowBounds] = {}  # database entries by name
        self._static: dict[str, ClaimsEntry] = {}  # beat_schedule's entries
        self._entry_claims: dict[str, dict[str, Any]] = {}
        self._stamp: Any = None  # PeriodicTasks.last_change() at the last read
        self._loaded = False
        self._known: dict[Any, _Known] = {}  # every enabled row read, by pk
        self._disabled: dict[Any, datetime] = {}  # disabled rows read lately: date_changed
        self._schedules: dict[tuple[str, Any], tuple[Any, ...]] = {}  # schedule rows read
        self._newest: datetime | None = None  # the newest date_changed read
        self._last_full_read = float("-inf")
        self._next_check = 0.0
        self._next_write = 0.0
        self._sent: dict[Any, _Sent] = {}  # row pk -> runs to write back
        self._to_disable: set[Any] = set()  # one-off rows found already run
        self._to_arm: dict[Any, _ToArm] = {}  # one-off rows enabled again without a save
        self._first: dict[str, dict[tuple[int, int | None], int | None]] = {}
        self._db_down_since: float | None = None
        self._noted: set[tuple[str, str]] = set()  # row problems already logged
        self._in_db = False
        super().__init__(app, *args, **kwargs)
        self._next_check = time.monotonic() + self.max_interval

    # -- reading the rows -------------------------------------------------------------
    def setup_schedule(self) -> None:
        _django_ready()
        self._entry_claims = entry_claims(self.app, self.settings)
        super().setup_schedule()  # beat_schedule's entries, policies, metrics
        for name, entry in self.schedule.items():
            if getattr(entry, "claims", None) is None and name in self._entry_claims:
                entry.claims = self._entry_claims[name]
        self._static = dict(self.schedule)
        self.entries_changed()
        self._refresh(force=True)

    def _refresh(self, force: bool = False) -> None:
        """Read what changed in the rows if the change marker moved (or compare them all,
        every FULL_READ_EVERY seconds); every row the first time. On a database error keep
        the last known entries and log once per outage."""
        self._next_check = time.monotonic() + self.max_interval
        PeriodicTask, PeriodicTasks = _models()
        self._in_db = True
        started = time.monotonic()
        try:
            _close_stale_connections()
            stamp = PeriodicTasks.last_change()
            full = force or time.monotonic() - self._last_full_read >= FULL_READ_EVERY
            changes: _Changes | None = None
            if not self._loaded:
                rows = list(PeriodicTask.objects.enabled().order_by("name"))
                schedules = self._schedule_rows()
            elif full or stamp != self._stamp:
                changes = self._read_changes(PeriodicTask, full)
            else:
                self._database_up()
                return
        except Exception as exc:
            self._database_down(exc)
            return
        finally:
            self._in_db = False
        self._database_up()
        self._stamp = stamp
        if full or changes is None:
            self._last_full_read = time.monotonic()
        if changes is None:
            self._load(rows, schedules)
            return
        applied = self._apply_changes(changes)
        level = logging.INFO if changes.rows or changes.gone else logging.DEBUG
        logger.log(level, "beat-claims: database rows (%s): read %d changed rows of %d"
                   " enabled, %d gone; %d entries changed (%.3fs)", changes.how,
                   len(changes.rows), changes.enabled, len(changes.gone), applied,
                   time.monotonic() - started)

    def _schedule_rows(self) -> dict[tuple[str, Any], tuple[Any, ...]]:
        """Every row of the schedule tables (interval, crontab, solar, clocked): a row
        saved there moves the marker, and changes the entries of the rows that use it."""
        PeriodicTask, _ = _models()
        out: dict[tuple[str, Any], tuple[Any, ...]] = {}
        for kind in _SCHEDULE_KINDS:
            model = PeriodicTask._meta.get_field(kind).related_model
            for values in model.objects.values_list():
                out[(kind, values[0])] = values
        return out

    def _read_changes(self, PeriodicTask: Any, full: bool) -> _Changes:
        """The rows that changed since the last read, read whole, and those gone: by
        date_changed and the enabled rows' ids at a move of the marker; by comparing every
        enabled row's columns (``full``)."""
        schedules = self._schedule_rows()
        moved = {key for key in set(schedules) | set(self._schedules)
                 if schedules.get(key) != self._schedules.get(key)}
        enabled = PeriodicTask.objects.filter(enabled=True)
        known = self._known
        if full:
            digests = {values[0]: _digest(values)
                       for values in enabled.values_list(*_ROW_FIELDS)}
            ids = set(digests)
            to_read = {pk for pk, digest in digests.items()
                       if pk not in known or known[pk].digest != digest}
            how = "compared in full"
        else:
            ids = set(enabled.values_list("id", flat=True))
            since = self._since()
            to_read = ids - set(known)  # enabled by update(), or created by bulk_create
            for pk, changed in PeriodicTask.objects.filter(
                    date_changed__gte=since).values_list("id", "date_changed"):
                seen = known[pk].date_changed if pk in known else self._disabled.get(pk)
                if seen != changed:
                    to_read.add(pk)
            self._disabled = {pk: d for pk, d in self._disabled.items() if d >= since}
            how = "the change marker moved"
        if moved:
            to_read |= {pk for pk, k in known.items() if k.schedule in moved}
        rows: list[Any] = []
        wanted = sorted(to_read, key=str)
        for start in range(0, len(wanted), READ_CHUNK):
            rows.extend(PeriodicTask.objects.filter(pk__in=wanted[start:start + READ_CHUNK])
                        .prefetch_related(*_SCHEDULE_KINDS))
        read = {row.pk for row in rows}
        self._schedules = schedules
        gone = {pk for pk in known if pk not in ids or (pk in to_read and pk not in read)}
        return _Changes(rows, gone - read, len(ids), how)

    def _since(self) -> datetime:
        """Rows changed at or after this are looked at again (CHANGE_MARGIN): the newest
        date_changed read, or now when that is later (a host whose clock is ahead)."""
        from django.conf import settings
        from django.utils import timezone

        now = timezone.now()
        if not getattr(settings, "USE_TZ", False):
            now = timezone.make_naive(now, timezone.get_default_timezone())
        newest = now if self._newest is None else min(self._newest, now)
        return newest - CHANGE_MARGIN

    def _seen(self, row: Any) -> None:
        changed = row.date_changed
        if changed is not None and (self._newest is None or changed > self._newest):
            self._newest = changed

    def _take(self, row: Any) -> tuple[ClaimsEntry, RowBounds] | None:
        """One row read whole: kept as known, and its entry when it is to be scheduled."""
        self._seen(row)
        self._to_arm.pop(row.pk, None)
        if not row.enabled:
            self._known.pop(row.pk, None)
            self._disabled[row.pk] = row.date_changed
            return None
        self._disabled.pop(row.pk, None)
        self._known[row.pk] = _Known(row.name, row.date_changed, _row_digest(row),
                                     _schedule_key(row))
        if row.name in self._static:
            self._note(row.name, "shadowed", "beat-claims: PeriodicTask %r has the name of"
                       " a beat_schedule entry: the beat_schedule entry is used", row.name)
            return None
        try:
            entry, row_bounds = entry_from_row(row, self.app, self._entry_claims.get(row.name))
        except Exception as exc:
            self._note(row.name, f"{row.date_changed}", "beat-claims: PeriodicTask %r is"
                       " not scheduled: %s", row.name, exc)
            return None
        state = one_off_state(row, row_bounds, entry.schedule)
        if state is OneOffState.RAN:
            self._to_disable.add(row.pk)  # as django-celery-beat does with such rows
            return None
        if state is OneOffState.ENABLED_AGAIN:
            # Not run until armed: every beat then reads the same instant.
            self._to_arm[row.pk] = _ToArm(row.date_changed, _ms(row.last_run_at) or 0)
            return None
        return entry, row_bounds

    def _load(self, rows: list[Any], schedules: dict[tuple[str, Any], tuple[Any, ...]]
              ) -> None:
        """Every enabled row, read at start (or once the database answers)."""
        self._loaded = True
        self._known = {}
        self._to_arm = {}
        self._schedules = schedules
        entries: dict[str, ClaimsEntry] = {}
        bounds: dict[str, RowBounds] = {}
        for row in rows:
            taken = self._take(row)
            if taken is not None:
                entries[row.name], bounds[row.name] = taken
        self._apply(entries, bounds)
        logger.info("beat-claims: read %d enabled rows of the database", len(rows))

    def _apply_changes(self, changes: _Changes) -> int:
        """Apply the rows read and those gone to the schedule, these entries alone; how
        many entries changed."""
        removed: set[str] = set()
        for pk in changes.gone:
            self._to_arm.pop(pk, None)
            known = self._known.pop(pk, None)
            if known is not None:
                removed.add(known.name)
        for row in changes.rows:
            known = self._known.get(row.pk)
            if known is not None:
                removed.add(known.name)  # (renamed, disabled: added again below if not)
        changed: dict[str, ClaimsEntry] = {}
        bounds: dict[str, RowBounds] = {}
        for row in changes.rows:
            taken = self._take(row)
            if taken is not None:
                changed[row.name], bounds[row.name] = taken
        current = self.composition.local
        for name in list(changed):
            if (name in current and self._rows.get(name) == bounds[name]
                    and current[name].editable_fields_equal(changed[name])):
                del changed[name]  # read again, the same (within CHANGE_MARGIN, say)
                removed.discard(name)
        removed = {name for name in removed - set(changed) - set(self._static)
                   if name in self._rows}
        if not changed and not removed:
            return 0
        for name in removed:
            del self._rows[name]
            self._first.pop(name, None)
        for name in changed:
            self._rows[name] = bounds[name]
            self._first.pop(name, None)
        self.change_local(changed, removed)
        return len(changed) + len(removed)

    def _apply(self, entries: dict[str, ClaimsEntry], bounds: dict[str, RowBounds]) -> None:
        """Replace the schedule's contents in place if anything differs, and tell the base
        scheduler (it anchors new entries and rebuilds its heap at the next tick)."""
        merged: dict[str, Any] = {**entries, **self._static}
        current = self.composition.local
        same = bounds == self._rows and set(merged) == set(current) and all(
            merged[name] is current[name] or (
                current[name].editable_fields_equal(merged[name]))
            for name in merged)
        if same:
            return
        self._rows = bounds
        self._first.clear()
        self.set_local(merged, set(self._static))
        if not self.stored.loaded:  # composed with the store's at the first tick
            self.schedule.clear()
            self.schedule.update(merged)
            self.entries_changed()
        logger.info("beat-claims: %d entries (%d from the database)", len(merged), len(entries))

    def _note(self, name: str, key: str, message: str, *args: Any) -> None:
        if (name, key) not in self._noted:
            self._noted.add((name, key))
            logger.warning(message, *args)

    def _database_down(self, exc: Exception) -> None:
        if self._db_down_since is None:
            self._db_down_since = time.monotonic()
            from django.db import Error

            logger.error("beat-claims: the database schedule cannot be read or written (%s:"
                         " %s); keeping the last known %d entries. Logged once per outage.",
                         type(exc).__name__, exc, len(self.schedule),
                         exc_info=not isinstance(exc, Error))

    def _database_up(self) -> None:
        if self._db_down_since is not None:
            logger.warning("beat-claims: the database is reachable again after %.1fs",
                           time.monotonic() - self._db_down_since)
            self._db_down_since = None

    # -- the row's fields as bounds ---------------------------------------------------
    def bounds(self, name: str) -> tuple[int | None, int | None]:
        """``start_time`` and ``expires``; a one-off row has its first occurrence alone.

        That occurrence is both bounds: those of its schedule before it (since the run
        before it was armed again, say) are not its, not missed ones for the catch-up
        policy. A clocked time that passed before the store first saw the entry (created
        just before it was due, or while no beat ran) is one missed, not hidden: the
        catch-up policy decides (``latest``, the default, runs it once, late)."""
        row = self._rows.get(name)
        if row is None:
            return super().bounds(name)
        lower, upper = row.not_before, row.not_after
        if row.one_off:
            first = self._first_occurrence(name, row)
            if first is None or (upper is not None and first > upper):
                return lower, -1  # nothing is due, ever
            return first, first
        return lower, upper

    def _first_occurrence(self, name: str, row: RowBounds) -> int | None:
        """The one occurrence of a one-off row: its first at or after start_time and after
        the row was last saved (re-enabling it in the admin arms it again)."""
        state = self.entry_state(name)
        if state is None:
            return None
        lower = max((t for t in (row.not_before, row.armed_at) if t is not None), default=None)
        key = (state.anchor, lower)
        firsts = self._first.setdefault(name, {})
        if key not in firsts:
            after = -1 if lower is None else lower - 1
            firsts[key] = occurrences.next_after(self.schedule[name].schedule, state.anchor,
                                                 after)
        return firsts[key]

    # -- the loop ---------------------------------------------------------------------
    def tick(self, *args: Any, **kwargs: Any) -> float:
        if time.monotonic() >= self._next_check:
            self._refresh()
        wait = super().tick(*args, **kwargs)
        if self._to_disable or self._to_arm or self._sent:
            # One-off rows are disabled and armed at once, unless the database is down (then,
            # like the rest, at most every WRITE_BACK_EVERY: a tick must not wait on it).
            urgent = bool(self._to_disable or self._to_arm) or any(
                s.one_off for s in self._sent.values())
            if time.monotonic() >= self._next_write or (
                    urgent and self._db_down_since is None):
                self._write_back()
        return max(0.0, min(wait, self._next_check - time.monotonic()))

    def on_sent(self, entry: Any, claim: Claim) -> None:
        row = self._rows.get(entry.name)
        # An operator's "Run now" is not the row's occurrence: a one-off or clocked row
        # keeps its own instant (and is disabled only after that one ran).
        if row is not None and not claim.manual:
            sent = self._sent.get(row.pk)
            if sent is None:
                self._sent[row.pk] = _Sent(claim.due, 1, row.one_off)
            else:
                sent.due, sent.count = max(sent.due, claim.due), sent.count + 1

    def _write_back(self) -> None:
        """Show the runs in the admin: ``last_run_at`` (the newest occurrence sent, never
        moved back) and ``total_run_count`` (each beat adds what it sent). A one-off row is
        disabled with its count reset, as django-celery-beat does, and the change marker moved
        so the other beats drop it at once. A one-off row enabled again without a save is
        armed for its first occurrence from now (by the store's clock, after its last run):
        its ``date_changed`` is set, if no one changed the row since it was read (another
        beat armed it first), and the marker moved so that every beat reads that instant.
        Best effort: on an error, tried again later."""
        from django.db.models import Case, DateTimeField, F, Q, Value, When

        PeriodicTask, PeriodicTasks = _models()
        self._next_write = time.monotonic() + WRITE_BACK_EVERY
        changed = False  # rows disabled or armed: the change marker moves
        self._in_db = True
        try:
            _close_stale_connections()
            for pk in sorted(self._to_disable, key=str):
                PeriodicTask.objects.filter(pk=pk).update(enabled=False, total_run_count=0)
                self._to_disable.discard(pk)
                changed = True
            if self.clock.known:  # (read at the first heartbeat)
                for pk in sorted(self._to_arm, key=str):
                    seen = self._to_arm[pk]
                    at = max(self.clock.now(), seen.last_run_at + 1)
                    PeriodicTask.objects.filter(
                        pk=pk, enabled=True, date_changed=seen.date_changed,
                    ).update(date_changed=_db_datetime(at))
                    del self._to_arm[pk]
                    changed = True
            for pk in sorted(self._sent, key=str):
                sent = self._sent[pk]
                last = _db_datetime(sent.due)
                rows = PeriodicTask.objects.filter(pk=pk)
                if sent.one_off:
                    rows.update(enabled=False, total_run_count=0, last_run_at=last)
                    changed = True
                else:
                    newer = Q(last_run_at__isnull=True) | Q(last_run_at__lt=last)
                    rows.update(
                        last_run_at=Case(When(newer, then=Value(last)),
                                         default=F("last_run_at"),
                                         output_field=DateTimeField()),
                        total_run_count=F("total_run_count") + sent.count)
                del self._sent[pk]
            if changed:
                PeriodicTasks.update_changed()
                self._next_check = 0.0  # read them again at the next tick
        except Exception as exc:
            self._database_down(exc)
        else:
            self._database_up()
        finally:
            self._in_db = False

    def sync(self) -> None:
        """Celery calls this every three minutes (its ``sync_every``; ``beat_sync_every``
        counts sends this scheduler makes its own way, so never) and at close: write back
        what is owed."""
        if (self._sent or self._to_disable or self._to_arm) and not self._in_db:
            self._write_back()

    def close(self) -> None:
        """A stop signal in the middle of a database call does nothing here: Celery calls
        close() again on its way out, once the call has unwound."""
        if self._in_db:
            return
        super().close()

    @property
    def info(self) -> str:
        return f"{super().info}, entries from django-celery-beat's PeriodicTask"


__all__ = ["DatabaseScheduler", "OneOffState", "RowBounds", "entry_claims", "entry_from_row",
           "one_off_state", "schedules_from_db"]
