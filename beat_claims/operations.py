"""What operators do to a fleet: pause, resume, trigger, backfill, release, prune.

Shared by ``celery claims`` and the Django admin: each function takes a store (and, for a
backfill, the entry's Celery schedule) and raises :class:`OperationError` or
:class:`~beat_claims.inspect.UnknownEntry` for a request that cannot be done, with a
message ready to be shown as it is. Nothing here needs Django.

Every write records who asked: ``--by`` on the command line, ``admin:<username>`` in the
admin, by default ``<OS user>@<host>`` (:func:`who`).
"""

from __future__ import annotations

import getpass
import os
import socket
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from . import occurrences
from .beat.composition import DYNAMIC
from .definitions import DefinitionError, validate
from .enums import RunState
from .inspect import UnknownEntry
from .runs import Run, iso
from .settings import ConfigurationError, Policy, Settings
from .stores.base import (
    BackfillRefused,
    BackfillResult,
    EntryRecord,
    OwnerStatus,
    Reclaim,
    Registrant,
    Store,
)

#: Held runs an operator can release (give back to be claimed again).
RELEASABLE = (RunState.CLAIMED, RunState.SENDING)


class OperationError(ValueError):
    """An operator's request that cannot be done as asked (the message says why)."""


def who(by: str | None = None) -> str:
    """Who asks: ``by`` when given, else ``<OS user>@<host>``."""
    if by is not None:
        by = by.strip()
        if not by:
            raise OperationError("--by: must not be empty")
        return by
    try:
        user = getpass.getuser()
    except Exception:  # no name for this uid (a container's random user)
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"


def parse_instant(text: str, what: str, allow_ms: bool = False) -> int:
    """An ISO 8601 instant as UTC ms; without an offset it is UTC. With ``allow_ms`` a
    whole number of 10 digits or more is taken as UTC milliseconds (``due_ms`` of the
    JSON documents)."""
    raw = text.strip()
    if allow_ms and raw.isdigit() and len(raw) >= 10:
        return int(raw)
    try:
        when = datetime.fromisoformat(raw[:-1] + "+00:00" if raw[-1:] in "zZ" and raw
                                      else raw)
    except ValueError:
        raise OperationError(
            f"{what}={text!r}: not an ISO 8601 instant (e.g. 2026-01-31T02:00:00Z;"
            " without an offset it is UTC)" + (", nor UTC milliseconds" if allow_ms else "")
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return round(when.timestamp() * 1000)


def unknown_entry(store: Store, entry: str) -> UnknownEntry:
    """The error for an entry the store has never seen, naming some it has."""
    known = sorted(e.name for e in store.entries())
    shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10
                                     else "")
    return UnknownEntry(f"no entry {entry!r} in the store"
                        + (f" (its entries: {shown})" if known else " (it has none)"))


def record(store: Store, entry: str) -> EntryRecord:
    """The entry as the store holds it; UnknownEntry when no beat has registered it."""
    for found in store.entries([entry]):
        if found.name == entry and found.anchor is not None:
            return found
    raise unknown_entry(store, entry)


def entry_doc(found: EntryRecord) -> dict[str, Any]:
    """An entry's pause as JSON-ready data, instants in ISO 8601 UTC."""
    paused = found.paused
    return {
        "entry": found.name,
        "paused": paused is not None,
        "paused_by": paused.by if paused else None,
        "paused_note": paused.note if paused else None,
        "paused_at": iso(paused.at) if paused else None,
        "resumed_by": found.resumed_by,
        "resumed_at": iso(found.resumed_at),
    }


# -- the operations -----------------------------------------------------------------------
def pause(store: Store, entry: str, by: str, note: str = "") -> EntryRecord:
    """Pause ``entry`` on every beat (see ``Store.pause``)."""
    done = store.pause(entry, by, note)
    if done is None:
        raise unknown_entry(store, entry)
    return done


def resume(store: Store, entry: str, by: str) -> tuple[EntryRecord, bool]:
    """End ``entry``'s pause (see ``Store.resume``): the entry, and whether this request
    ended a pause (False: it was not paused, nothing was recorded)."""
    before = store.now()
    done = store.resume(entry, by)
    if done is None:
        raise unknown_entry(store, entry)
    return done, done.resumed_at is not None and done.resumed_at >= before


@dataclass(frozen=True)
class Triggered:
    """A run now as recorded: its due instant, and the live beats that schedule the entry
    (``host:pid``; None when the store does not know who registered it)."""

    entry: str
    due: int
    beats: tuple[str, ...] | None


def trigger(store: Store, entry: str, by: str, request_id: str | None = None) -> Triggered:
    """Record a run of ``entry`` due now, for a beat to claim and send. Refused, before
    anything is recorded, when no live beat schedules the entry (nobody would send it).
    One request id per request: asked again after a lost reply, nothing more is
    recorded."""
    beats = senders(store, record(store, entry))
    due = store.request_run(entry, by, request_id or uuid.uuid4().hex)
    if due is None:
        raise unknown_entry(store, entry)
    return Triggered(entry, due, beats)


def senders(store: Store, found: EntryRecord) -> tuple[str, ...] | None:
    """The live beats that registered the entry (they schedule it: one of them claims and
    sends a run of it), as ``host:pid``; None when the store does not know who registered
    it (registered by an older beat-claims). :class:`OperationError` when none is alive."""
    owners = {o.owner.id: o for o in store.owners()}
    if _dynamic_and_enabled(store, found.name):
        # Every live beat schedules a dynamic entry (one takes it up when a run is due).
        alive = tuple(beat_name(owners, Registrant(o.owner.id, 0))
                      for o in owners.values() if o.alive)
        if alive:
            return alive
    if found.registrants is None:
        return None
    live = tuple(beat_name(owners, r) for r in found.registrants
                 if (o := owners.get(r.owner)) is not None and o.alive)
    if not live:
        raise OperationError(
            f"no live beat schedules {found.name} ({registered_by(owners, found.registrants)}):"
            " nobody would send a run of it, so nothing was recorded. Start a beat whose"
            f" schedule has {found.name} (or enable its row), then trigger it again")
    return live


def _dynamic_and_enabled(store: Store, name: str) -> bool:
    """Whether the store holds an enabled dynamic definition of ``name``."""
    for stored in store.definitions([name]):
        if stored.deleted or stored.corrupt or stored.definition is None or (
                stored.origin not in DYNAMIC):
            return False
        try:
            return validate(name, stored.definition).enabled
        except DefinitionError:
            return False
    return False


def beat_name(owners: Mapping[str, OwnerStatus], registrant: Registrant) -> str:
    """A beat as operators see it: ``host:pid``, or the start of its id when the store
    forgot it (its heartbeat lapsed long ago)."""
    found = owners.get(registrant.owner)
    return (f"{found.owner.host}:{found.owner.pid}" if found is not None
            else f"beat {registrant.owner[:8]}")


def registered_by(owners: Mapping[str, OwnerStatus],
                  registrants: Sequence[Registrant] | None) -> str:
    """Who registered an entry, and whether each is alive, in words."""
    if registrants is None:
        return "registered by a beat-claims older than 0.2, which did not record who"
    if not registrants:
        return "every beat that registered it no longer schedules it"
    return "registered by " + ", ".join(
        beat_name(owners, r) + (" (alive)" if (o := owners.get(r.owner)) is not None
                                and o.alive else " (stopped)")
        for r in registrants)


@dataclass(frozen=True)
class Released:
    """What a release did: ``released``, or else the run's state (None: no run there)."""

    entry: str
    due: int
    released: bool
    state: RunState | None = None

    @property
    def why_not(self) -> str:
        if self.state is None:
            return f"{self.entry} has no run due {iso(self.due)}: nothing was released"
        return (f"the run of {self.entry} due {iso(self.due)} is {self.state.value}, not"
                " claimed: nothing was released")


def release(store: Store, entry: str, due: int, by: str) -> Released:
    """Take the claim on the run of ``entry`` due at ``due`` back from whichever beat
    holds it: it is due again, and a beat sends it with a fresh token (the old holder's
    check before publish refuses it)."""
    [freed] = store.reclaim([Reclaim(entry, due, None)], by)
    if freed:
        return Released(entry, due, True, RunState.DUE)
    record(store, entry)  # an unknown entry is said as such
    state = next((r.state for r in store.history(entry) if r.due == due), None)
    return Released(entry, due, False, state)


# -- backfill -----------------------------------------------------------------------------
def backfill_dues(sched: Any, anchor: int, start: int, end: int, limit: int,
                  entry: str = "the entry") -> list[int]:
    """Every occurrence of ``sched`` in ``[start, end)`` (UTC ms), oldest first.

    These are the instants every beat computes: interval schedules count whole periods
    from the store's ``anchor``, crontab and solar schedules are Celery's own arithmetic,
    both strictly after the anchor (the store first saw the entry then: nothing was due
    before); a clocked schedule has its one instant. More than ``limit`` occurrences raise
    :class:`OperationError` naming ``beat_claims_backfill_limit``: interval schedules are
    counted without listing them, others are walked and the walk stops at ``limit + 1``.
    """
    check_range(start, end)
    try:
        instant = occurrences.clocked_instant(sched)
        if instant is not None:
            return [instant] if start <= instant < end else []
        if occurrences.is_interval(sched):
            period = occurrences.period_ms(sched)
            first = max(1, -((anchor - start) // period))  # ceil((start - anchor) / period)
            last = -((anchor - end) // period) - 1  # the last k with anchor + k*period < end
            count = max(0, last - first + 1)
            _within(count, limit, entry, start, end, exact=True)
            return [anchor + k * period for k in range(first, last + 1)]
        found: list[int] = []
        nxt = occurrences.next_after(sched, anchor, start - 1)
        while nxt is not None and nxt < end:
            found.append(nxt)
            _within(len(found), limit, entry, start, end, exact=False)
            nxt = occurrences.next_after(sched, anchor, nxt)
        return found
    except occurrences.UnsupportedSchedule as exc:
        raise OperationError(f"{entry}: cannot compute its occurrences ({exc})") from None


def check_range(start: int, end: int) -> None:
    if start >= end:
        raise OperationError(f"--from {iso(start)} is not before --to {iso(end)}:"
                             " nothing to backfill")


def _within(count: int, limit: int, entry: str, start: int, end: int, exact: bool) -> None:
    if count > limit:
        many = f"{count}" if exact else f"more than {limit}"
        raise OperationError(
            f"{entry} has {many} occurrences from {iso(start)} to {iso(end)}; one backfill"
            f" creates at most beat_claims_backfill_limit={limit}: ask for a shorter range"
            " (or raise the setting)")


@dataclass(frozen=True)
class Backfill:
    """A backfill as done: the range, who asked, and what the store did."""

    entry: str
    start: int
    end: int
    by: str
    anchor: int  # the store first saw the entry then: its occurrences come after
    dues: tuple[int, ...]  # every occurrence in the range
    result: BackfillResult

    def as_dict(self) -> dict[str, Any]:
        return {
            "entry": self.entry,
            "from": iso(self.start),
            "to": iso(self.end),
            "by": self.by,
            "anchor": iso(self.anchor),
            "occurrences": len(self.dues),
            "created": [iso(due) for due in sorted(self.result.created)],
            "kept": [{"due": iso(due), "state": state.value}
                     for due, state in sorted(self.result.kept)],
        }


def backfill(store: Store, entry: str, sched: Any, start: int, end: int, by: str,
             limit: int) -> Backfill:
    """Record a manual run at each occurrence of ``entry`` in ``[start, end)`` that has
    none or whose run ended without running; the beats send them oldest first (see
    ``Store.backfill``). ``sched`` is the entry's Celery schedule (None: the app does not
    schedule it). ``end`` must not be in the future of the store's clock."""
    check_range(start, end)
    now = store.now()
    if end > now:
        raise OperationError(
            f"--to {iso(end)} is in the future of the store's clock ({iso(now)}): a backfill"
            " runs past occurrences (for a run now, use trigger)")
    found = record(store, entry)
    if sched is None:
        raise OperationError(f"{entry} is not in this app's schedule: its occurrences cannot"
                             " be computed")
    assert found.anchor is not None
    dues = backfill_dues(sched, found.anchor, start, end, limit, entry)
    try:
        result = store.backfill(entry, dues, by) if dues else BackfillResult(entry, (), ())
    except BackfillRefused as refused:  # the history cannot keep them: nothing recorded
        raise OperationError(str(refused)) from None
    if result is None:
        raise unknown_entry(store, entry)
    return Backfill(entry, start, end, by, found.anchor, tuple(dues), result)


# -- the entries' policies ----------------------------------------------------------------
def policies(app: Any, settings: Settings, names: Sequence[str]) -> dict[str, Policy]:
    """Each entry's policy: its ``claims`` in ``beat_schedule``, else the
    ``beat_claims_entry_claims`` setting (django-celery-beat rows), else the defaults. An
    entry whose ``claims`` do not parse gets the defaults (a probe must not fail on one
    bad entry: the beat itself refuses to start with it)."""
    schedule: Mapping[str, Any] = app.conf.beat_schedule or {}
    by_name = app.conf.get("beat_claims_entry_claims") or {}
    out = {}
    for name in names:
        spec = schedule.get(name)
        options, sched = ((spec.get("claims"), spec.get("schedule"))
                          if isinstance(spec, Mapping) else (None, None))
        if options is None and isinstance(by_name, Mapping):
            options = by_name.get(name)
        try:
            out[name] = settings.policy_for(name, options, sched)
        except ConfigurationError:
            out[name] = settings.default_policy(sched)
    return out


# -- prune --------------------------------------------------------------------------------
#: Runs that keep their entry from a prune: they may still be sent, or report.
LIVE_STATES = frozenset({RunState.CLAIMED, RunState.SENDING, RunState.SENT,
                         RunState.STARTED})


#: The instants a run's record keeps apart from its fields (Run.extra): a beat's check
#: before publish, a claim given back, a run taken up again.
EXTRA_INSTANTS = ("sending_at", "released_at", "revived_at")


def last_active(run: Run) -> int:
    """The latest instant a beat or a worker wrote about a run (its due instant when its
    record shows none: a run recorded due or skipped). A claim made well ahead (held
    until its instant) is checked, and maybe given back, long after it was made."""
    instants = (run.claimed_at, run.sent_at, run.started_at, run.finished_at,
                *(run.extra.get(name) for name in EXTRA_INSTANTS))
    return max((at for at in instants if isinstance(at, int) and not isinstance(at, bool)),
               default=run.due)


def unconfirmed_by(owner: OwnerStatus | None, run: Run, ttl: float) -> bool:
    """Whether the beat that claimed ``run`` is one whose heartbeat lapsed without a
    renewal after its last write of it (a beat stalled, or cut off from the store, that
    may wake; its heartbeat lapses ``ttl`` after its last renewal): it has not had the
    store confirm that write, and would take the entry's removal for a store put back.
    Kept until the store forgets that beat (an hour after its heartbeat lapsed)."""
    return (owner is not None and not owner.alive
            and owner.expires_at - int(ttl * 1000) <= last_active(run))


@dataclass(frozen=True)
class Removable:
    """An entry a prune removes (or would), and why it may: no schedule of this app has it,
    no live beat registered it, it has no live run and has not been active since the
    cutoff."""

    entry: str
    last_active: int | None  # its newest run's end, send or due instant (None: no run)
    registered_by: str  # who registered it, in words

    def why(self, now: int) -> str:
        active = ("no run in its history" if self.last_active is None else
                  f"last active {iso(self.last_active)}"
                  f" ({max(0, now - self.last_active) / 86_400_000:.1f} days ago)")
        return f"not in this app's schedule; {self.registered_by}; {active}"


@dataclass(frozen=True)
class Prune:
    """What a prune found: the entries it removes (or would), and those it keeps and why."""

    now: int  # the store's clock when it looked
    removable: tuple[Removable, ...]
    removed: tuple[str, ...]  # removed (only when asked to remove)
    kept_scheduled: int  # in this app's schedule (or an enabled row holds them)
    kept_registered: tuple[tuple[str, tuple[str, ...]], ...]  # (entry, the live beats)
    kept_live: tuple[str, ...]  # a run claimed, being sent, sent or started
    kept_recent: tuple[str, ...]  # active since the cutoff

    def as_dict(self, dry_run: bool) -> dict[str, Any]:
        return {
            "dry_run": dry_run,
            "removable": [{"entry": r.entry, "last_active": iso(r.last_active),
                           "why": r.why(self.now)} for r in self.removable],
            "removed": list(self.removed),
            "kept_scheduled": self.kept_scheduled,
            "kept_registered": [{"entry": e, "beats": list(b)}
                                for e, b in self.kept_registered],
            "kept_live": list(self.kept_live),
            "kept_recent": list(self.kept_recent),
        }


def prune(store: Store, scheduled: Collection[str], older_than: float, remove: bool, *,
          ttl: float) -> Prune:
    """The entries of the store that may go: not in ``scheduled`` (what this app's beats
    schedule, and what enabled rows hold), registered by no live beat, without a live run,
    and not active for ``older_than`` seconds (the store's clock), nor within ``ttl`` (the
    fleet's heartbeat TTL: by then every live beat heartbeated since it last wrote about
    the entry, so that none takes the removal for a store put back; see
    ``Written.confirmed``). With ``remove`` they are removed: the store judges each again,
    atomically (``Store.forget``), and keeps one that has a live run or a live registrant
    by then (``kept_live``)."""
    now = store.now()
    cutoff = now - int(max(older_than, ttl) * 1000)
    owners = {o.owner.id: o for o in store.owners()}
    removable: list[Removable] = []
    registered: list[tuple[str, tuple[str, ...]]] = []
    live: list[str] = []
    recent: list[str] = []
    kept_scheduled = 0
    for found in store.entries():
        if found.name in scheduled:
            kept_scheduled += 1
            continue
        beats = tuple(beat_name(owners, r) for r in found.registrants or ()
                      if (o := owners.get(r.owner)) is not None and o.alive)
        if beats:
            registered.append((found.name, beats))
            continue
        runs = store.history(found.name)
        if any(r.state in LIVE_STATES for r in runs):
            live.append(found.name)
            continue
        last = max((last_active(r) for r in runs), default=None)
        if (last is not None and last > cutoff) or any(
                unconfirmed_by(owners.get(r.owner or ""), r, ttl) for r in runs):
            recent.append(found.name)
            continue
        removable.append(Removable(found.name, last,
                                   registered_by(owners, found.registrants)))
    removed: tuple[str, ...] = ()
    if remove and removable:
        removed = tuple(store.forget([r.entry for r in removable]))
        live += sorted({r.entry for r in removable} - set(removed))
    return Prune(now, tuple(removable), removed, kept_scheduled, tuple(registered),
                 tuple(live), tuple(recent))


__all__ = [
    "LIVE_STATES", "RELEASABLE", "Backfill", "OperationError", "Prune", "Released",
    "Removable", "Triggered", "UnknownEntry", "backfill", "backfill_dues", "beat_name",
    "check_range", "entry_doc", "parse_instant", "pause", "policies", "prune", "record",
    "registered_by", "release", "resume", "senders", "trigger", "unknown_entry", "who",
]
