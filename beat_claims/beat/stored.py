"""The entries' definitions the store holds that this beat looks at, as it last read them.

A beat looks at the definitions of its own entries (``beat_schedule``, a database's rows)
and of the dynamic entries it holds for now (those due soon, taken from the store's due
index by :class:`~beat_claims.beat.window.DynamicWindow`): never at every definition, so that
its start and its memory do not grow with the store's entries. At start (and whenever
the change feed answers ``reload``) those are read by name, in pages; then each heartbeat
reads the change feed from where the last read stopped, a bounded number of pages, and
keeps the changes of those (a change of another entry is counted in :attr:`unseen`: the
window looks at the index again). What is kept: each such entry's stored record (a
tombstone, a corrupt one too: a writer names its version) and, for each readable one,
its :class:`~beat_claims.definitions.Definition`. A definition that cannot be read or is not
valid is logged once per version, as an ERROR naming the entry and the field (never a
value of its arguments), and is left out: the other entries go on.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from ..definitions import Definition, DefinitionError, validate
from ..stores.base import ChangeCursor, Changes, Store, StoredDefinition

#: Definitions (or changes) one store call reads.
PAGE = 1000
#: Pages of the change feed one heartbeat reads at most; the rest waits for the next one.
CHANGE_PAGES_PER_HEARTBEAT = 10
#: Records whose reading (their definition validated) is kept, by name and version: as
#: many as a beat holds dynamic entries (about 1 KB each).
READ_LATELY = 5_000
#: The fields a corrupt record's message may name (its values are never logged).
_STORED_FIELDS = re.compile(r"\b(version|definition|origin|changed_at)\b")


@dataclass(frozen=True)
class Known:
    """One entry's stored record, and its definition when it can be read and is valid."""

    stored: StoredDefinition
    definition: Definition | None


class StoredEntries:
    """name -> what the store holds of its definition, kept current from the change feed."""

    def __init__(self, store: Store, logger: logging.Logger) -> None:
        self.store = store
        self.logger = logger
        self.known: dict[str, Known] = {}
        self.cursor: ChangeCursor | None = None
        #: Whether this beat looks at ``name``'s definition (its own, or one it holds).
        self.wanted: Callable[[str], bool] = lambda name: True
        #: The names it looks at (read by name at start and on ``reload``); None: every
        #: definition the store holds (a reader of them all, not a beat).
        self.wanted_names: Callable[[], Iterable[str]] | None = None
        #: Changes of definitions this beat does not look at, read since the caller last
        #: reset it: such an entry was indexed again by its writer.
        self.unseen = 0
        self.loaded = False
        #: Every definition this beat looks at was read again since the caller last
        #: looked (at start, or the change feed said to: the store may have gone back).
        self.reloaded = False
        self._logged: set[tuple[str, int, str]] = set()
        #: Records read lately, by name and version: a dynamic entry taken again each
        #: time it falls due is not validated again (a tenth of a millisecond each time).
        self._read_lately: dict[tuple[str, int], Known] = {}
        #: Called between two pages read (the beat renews its heartbeat: ten pages of
        #: 20,000 definitions just written took 3 s, the TTL of a 1 s heartbeat).
        self.between: Callable[[], None] = lambda: None
        #: Names changed in pages read by a refresh that ``between`` cut short (the store
        #: went back): answered by the next refresh, as the cursor has moved past them.
        self._unanswered: set[str] = set()

    def refresh(self, read: Callable[[ChangeCursor | None], Changes | None] = lambda c: None
                ) -> set[str]:
        """Read what changed since the last read (everything, the first time or when the
        feed says to); the names whose record changed. ``read(cursor)``: the page from
        ``cursor`` if it was read already (with the heartbeat), else None."""
        if not self.loaded:
            return self._reload()
        changed = self._unanswered
        for page in range(CHANGE_PAGES_PER_HEARTBEAT):
            if page:
                self.between()
            answer = (read(self.cursor) if not page else None) or self.store.changes(
                self.cursor, PAGE)
            if answer.reload:
                # The cursor moves once every definition was read: a read that fails
                # midway is told to reload again.
                changed |= self._read_all()
                self.cursor = answer.cursor
                break
            for record in answer.changed:
                if not self.wanted(record.name):
                    self.unseen += 1
                elif self._take(record):
                    changed.add(record.name)
            self.cursor = answer.cursor
            if answer.complete:
                break
        self._unanswered = set()
        return changed

    def _reload(self) -> set[str]:
        # The feed's head first: whatever changes while the pages are read is read again.
        self.cursor = self.store.changes(None, 1).cursor
        changed = self._read_all()
        self.loaded = True
        return changed

    def _read_all(self) -> set[str]:
        """The definitions of every name this beat looks at, read into a new map that
        replaces the old one only once all pages were read (a page that fails leaves what
        was known as it was)."""
        before = self.known
        known: dict[str, Known] = {}
        changed: set[str] = set()
        for page in self._pages():
            for record in page:
                old = before.get(record.name)
                known[record.name] = old if old is not None and old.stored == record \
                    else self._read(record)
                if old is None or old.stored != record:
                    changed.add(record.name)
        self.known = known
        self.reloaded = True
        return changed | (set(before) - set(known))

    def _pages(self) -> Iterator[list[StoredDefinition]]:
        """The pages of a reload: of the names wanted, or of every definition (the
        heartbeat renewed between two, :attr:`between`)."""
        if self.wanted_names is not None:
            names = sorted(set(self.wanted_names()))
            for start in range(0, len(names), PAGE):
                if start:
                    self.between()
                yield self.store.definitions(names[start:start + PAGE])
            return
        after = ""
        while True:
            if after:
                self.between()
            page = self.store.definitions(None, after, PAGE)
            yield page
            if len(page) < PAGE:
                return
            after = page[-1].name

    def fetch(self, names: Iterable[str]) -> set[str]:
        """Read the definitions of ``names`` (new names this beat looks at), in pages: the
        names whose record changed."""
        wanted = sorted(set(names))
        changed: set[str] = set()
        for start in range(0, len(wanted), PAGE):
            if start:
                self.between()
            changed |= self.take(self.store.definitions(wanted[start:start + PAGE]))
        return changed

    def forget(self, names: Iterable[str]) -> None:
        """This beat no longer looks at ``names`` (dynamic entries it held)."""
        for name in names:
            self.known.pop(name, None)

    def take(self, records: list[StoredDefinition]) -> set[str]:
        """Records read apart from the feed (the newest): the names whose record changed."""
        return {record.name for record in records if self._take(record)}

    def _take(self, record: StoredDefinition) -> bool:
        old = self.known.get(record.name)
        if old is not None and old.stored == record:
            return False
        self.known[record.name] = self._read(record)
        return True

    def read(self, record: StoredDefinition) -> Known:
        """``record`` as :attr:`known` would hold it (not kept)."""
        return self._read(record)

    def _read(self, record: StoredDefinition) -> Known:
        key = (record.name, record.version)
        lately = self._read_lately.get(key)
        if lately is not None and lately.stored == record:
            return lately
        if len(self._read_lately) >= READ_LATELY:
            self._read_lately.clear()
        known = self._read_record(record)
        self._read_lately[key] = known
        return known

    def _read_record(self, record: StoredDefinition) -> Known:
        if record.corrupt:
            fields = sorted(set(_STORED_FIELDS.findall(record.corrupt))) or ["record"]
            self._error(record, "corrupt", "beat-claims: entry %r: its stored definition"
                        " (version %d) cannot be read (%s); it is not scheduled",
                        record.name, record.version, ", ".join(fields))
            return Known(record, None)
        if record.deleted or record.definition is None:
            return Known(record, None)
        try:
            return Known(record, validate(record.name, record.definition))
        except DefinitionError as exc:
            # (a DefinitionError names an argument by its place and type, never its value)
            self._error(record, "invalid", "beat-claims: entry %r: its stored definition"
                        " (version %d, by %s) is not valid: %s: %s; it is not scheduled",
                        record.name, record.version, record.changed_by, exc.field or "record",
                        exc.problem or exc.message)
            return Known(record, None)

    def _error(self, record: StoredDefinition, kind: str, message: str, *args: object
               ) -> None:
        key = (record.name, record.version, kind)
        if key not in self._logged:
            if len(self._logged) > 10_000:
                self._logged.clear()
            self._logged.add(key)
            self.logger.error(message, *args)

    def live(self, name: str) -> Known | None:
        """The entry's record when it holds a definition (not a tombstone)."""
        known = self.known.get(name)
        if known is None or known.stored.deleted:
            return None
        return known
