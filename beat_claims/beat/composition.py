"""Which entries a beat schedules, and by which definition.

- A stored definition of origin API or REDBEAT (a dynamic entry) is scheduled by every
  beat, while it is enabled; it shadows an entry of the same name of the beat's own
  (``beat_schedule``, or a database row), with one WARNING.
- An entry of the beat's own ``beat_schedule`` that can be stored is scheduled by the
  store's CONFIG definition of that name (the beat started last wrote it): where this
  beat's ``beat_schedule`` differs (a rolling deploy), one WARNING per stored version
  names the entry and the beat that wrote it, and the stored one is sent, so that every
  beat sends one grid. A CONFIG definition no live beat has in its ``beat_schedule`` is
  sent by none, as an entry dropped from ``beat_schedule`` always was.
- A DJANGO definition shadows a ``beat_schedule`` entry of the same name (the beats that
  read the database send it).
- Anything else of the beat's own (a ``beat_schedule`` entry that cannot be stored, a
  database row) is scheduled as it is, by this beat alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from celery import Celery

from ..definitions import Definition, DefinitionError, Unstorable
from ..enums import Origin
from .stored import Known, StoredEntries

#: The origins every beat schedules.
DYNAMIC = (Origin.API, Origin.REDBEAT)
#: Entries composed between two calls of ``Composition.between``.
COMPOSED = 1000

#: What a scheduled entry was built from: ("stored", version, the stored JSON text) or
#: ("local", id(entry), ""). The text too: a store that went back (wiped, an older copy
#: put back) may hold another definition under a version this beat read before.
Key = tuple[str, int, str]


class Composition:
    """This beat's own entries and the store's definitions, composed into its schedule.

    ``compose()`` answers name -> entry; an entry object is kept (the same object) for as
    long as what it was built from does not change, so that a caller can tell which
    entries changed by identity."""

    def __init__(self, app: Celery, stored: StoredEntries, logger: logging.Logger) -> None:
        self.app = app
        self.stored = stored
        self.logger = logger
        self.local: dict[str, Any] = {}
        #: The beat's own beat_schedule entries that can be stored, as definitions.
        self.own: dict[str, Definition] = {}
        #: The names of the beat's own entries that come from beat_schedule.
        self.configured: set[str] = set()
        self.chosen: dict[str, tuple[Key, Any]] = {}
        #: Called every :data:`COMPOSED` entries composed (the beat renews its heartbeat:
        #: building 8,000 entries took a second).
        self.between: Callable[[], None] = lambda: None
        #: This beat has written its beat_schedule to the store (at start): until then a
        #: stored definition that differs is about to be replaced, not a disagreement.
        self.own_written = False
        self._logged: set[tuple[Any, ...]] = set()

    def set_local(self, entries: dict[str, Any], configured: set[str] | None = None) -> None:
        """This beat's own entries (``configured``: those from ``beat_schedule``; all of
        them when None). Each ``beat_schedule`` entry that cannot be stored is named once:
        it stays this beat's own."""
        self.local = dict(entries)
        self.configured = set(entries) if configured is None else set(configured)
        own: dict[str, Definition] = {}
        for name in sorted(self.configured & set(entries)):
            found = Definition.from_entry(name, entries[name])
            if isinstance(found, Unstorable):
                self._once(("unstorable", name, found.reason), logging.WARNING,
                           "beat-claims: entry %r in beat_schedule cannot be shared through"
                           " the store (%s): this beat schedules it from its own"
                           " beat_schedule, as before", name, found.reason)
            else:
                own[name] = found
        self.own = own

    def change_local(self, changed: dict[str, Any], removed: Iterable[str]) -> None:
        """Some of this beat's own entries changed (``changed``: added or changed, by
        name; ``removed``: gone), none of them from ``beat_schedule``: what
        :meth:`set_local` does, for them alone."""
        for name in removed:
            self.local.pop(name, None)
        self.local.update(changed)

    def compose(self) -> dict[str, Any]:
        chosen: dict[str, tuple[Key, Any]] = {}
        names = set(self.local) | {name for name, k in self.stored.known.items()
                                   if k.stored.origin in DYNAMIC}
        for i, name in enumerate(sorted(names)):
            if i and not i % COMPOSED:
                self.between()
            picked = self._choose(name)
            if picked is not None:
                chosen[name] = picked
        self.chosen = chosen
        return {name: entry for name, (_, entry) in chosen.items()}

    def compose_some(self, names: Iterable[str]) -> dict[str, Any]:
        """What :meth:`compose` answers for ``names`` alone (those not scheduled are left
        out); the others' choices are kept as they are."""
        out: dict[str, Any] = {}
        for name in sorted(set(names)):
            picked = self._choose(name)
            if picked is None:
                self.chosen.pop(name, None)
            else:
                self.chosen[name] = picked
                out[name] = picked[1]
        return out

    def _choose(self, name: str) -> tuple[Key, Any] | None:
        """The key and entry ``name`` is scheduled by (the entry chosen before when what it
        is built from did not change); None when this beat does not schedule it."""
        picked = self._pick(name)
        if picked is None:
            return None
        key, build = picked
        previous = self.chosen.get(name)
        if previous is not None and previous[0] == key:
            return previous
        entry = build()
        return None if entry is None else (key, entry)

    def _pick(self, name: str) -> tuple[Key, Any] | None:
        """What ``name`` is scheduled by: (its key, a function building its entry); None
        when this beat does not schedule it."""
        known = self.stored.live(name)
        if known is not None and known.stored.corrupt and not known.stored.version:
            known = None  # (not even its version or origin can be read: as if absent)
        local = self.local.get(name)
        origin = known.stored.origin if known is not None else None
        if known is not None and origin in DYNAMIC:
            if local is not None:
                self._shadowed(name, known)
            return self._from_store(known)
        if local is None:
            return None
        if known is not None and name in self.configured and origin is Origin.DJANGO:
            self._shadowed(name, known)
            return None
        own = self.own.get(name)
        if known is not None and own is not None and origin is Origin.CONFIG:
            if (self.own_written and known.definition is not None
                    and known.definition.digest() != own.digest()):
                self._once(("differs", name, known.stored.version), logging.WARNING,
                           "beat-claims: entry %r: this beat's beat_schedule differs from"
                           " the definition in the store (version %d, registered by %s);"
                           " the stored one is sent (every beat sends one grid)", name,
                           known.stored.version, known.stored.changed_by)
            return self._from_store(known)
        return ("local", id(local), ""), lambda: local

    def _from_store(self, known: Known) -> tuple[Key, Any] | None:
        definition = known.definition
        if definition is None or not definition.enabled:
            return None
        name = known.stored.name

        def build() -> Any:
            try:
                return definition.schedule_entry(name, self.app)
            except DefinitionError as exc:
                self._once(("unbuilt", name, known.stored.version), logging.ERROR,
                           "beat-claims: entry %r: its stored definition (version %d)"
                           " cannot be scheduled here: %s: %s", name, known.stored.version,
                           exc.field or "record", exc.problem or exc.message)
                return None

        return ("stored", known.stored.version, known.stored.definition or ""), build

    def _shadowed(self, name: str, known: Known) -> None:
        self._once(("shadowed", name, known.stored.origin), logging.WARNING,
                   "beat-claims: entry %r in beat_schedule is shadowed by a dynamic entry of"
                   " the same name; the dynamic one is sent (origin %s, version %d)", name,
                   known.stored.origin.value, known.stored.version)

    def differing(self) -> dict[str, Known]:
        """This beat's beat_schedule entries whose stored CONFIG definition differs from
        its own (what ``claims health`` reports)."""
        out: dict[str, Known] = {}
        if not self.own_written:
            return out
        for name, own in self.own.items():
            known = self.stored.live(name)
            if (known is not None and known.stored.origin is Origin.CONFIG
                    and known.definition is not None
                    and known.definition.digest() != own.digest()):
                out[name] = known
        return out

    def _once(self, key: tuple[Any, ...], level: int, message: str, *args: Any) -> None:
        if key not in self._logged:
            if len(self._logged) > 10_000:
                self._logged.clear()
            self._logged.add(key)
            self.logger.log(level, message, *args)
