"""A beat's ``beat_schedule`` entries, written as CONFIG definitions when it starts.

Each entry that can be stored is written where the store has no definition of that name,
a tombstone, or a CONFIG definition with another digest: the beat started last wins (a
rolling deploy ends with the new ``beat_schedule`` in the store, and every beat that still
has the entry sends by it). A definition of another origin (API, REDBEAT, DJANGO) is never
overwritten: that dynamic entry shadows the ``beat_schedule`` one. Each write is a change
as :mod:`beat_claims.entry_changes` makes it (the old definition's instants since the
checkpoint recorded skipped, the checkpoint moved to the change).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from celery import Celery

from ..definitions import Definition, DefinitionError, validate
from ..entry_changes import CHUNK, EntryChange, apply_changes
from ..enums import Origin
from ..stores.base import Store, StoredDefinition, WriteStatus
from .stored import Known

#: Rounds of writes: another beat may write the same entries meanwhile (each round reads
#: what the store holds then, and writes only what still differs).
ATTEMPTS = 3


def needs_write(own: Definition, known: Known | None, replace: bool = True) -> bool:
    """Whether the store should take ``own`` (see the module's rule); without ``replace``,
    only where it has none (or a tombstone)."""
    if known is None or known.stored.deleted:
        return True
    stored = known.stored
    if not replace or stored.corrupt or stored.origin is not Origin.CONFIG:
        return False
    return known.definition is None or known.definition.digest() != own.digest()


def write_own(store: Store, app: Celery, own: dict[str, Definition],
              known: dict[str, Known], by: str, logger: logging.Logger,
              replace: bool = True, between: Callable[[], None] = lambda: None) -> int:
    """Write each of ``own`` the store should take; how many were written. ``replace``
    False (the store was read again after it went back, not a start): only those it has
    no definition of, so that a beat that did not just start never undoes a newer beat's.
    ``between`` is called between two chunks of writes (the beat renews its heartbeat:
    writing 20,000 definitions took 11 s, longer than a 1 s heartbeat's TTL)."""
    pending = {name: known.get(name) for name, definition in own.items()
               if needs_write(definition, known.get(name), replace)}
    written = 0
    for _ in range(ATTEMPTS):
        if not pending:
            break
        names = sorted(pending)
        # ``previous``: what the beats ran before the store had the entry's definition
        # (their own beat_schedule entry): nothing to skip when it is the same.
        changes = [EntryChange(name, own[name], _version(pending[name]), previous=own[name])
                   for name in names]
        again: dict[str, Known | None] = {}
        results = []
        for start in range(0, len(changes), CHUNK):
            if start:
                between()
            results += apply_changes(store, changes[start:start + CHUNK], Origin.CONFIG, by,
                                     app)
        for name, result in zip(names, results):
            if result.status is WriteStatus.OK:
                written += 1
                logger.info("beat-claims: entry %s: this beat's beat_schedule definition"
                            " written to the store (version %d)", name, result.version)
            elif result.current is not None and result.status is not WriteStatus.CORRUPT:
                current = Known(result.current, _valid(result.current))
                if needs_write(own[name], current, replace):  # another beat wrote it
                    again[name] = current
            else:
                logger.warning("beat-claims: entry %s: this beat's beat_schedule definition"
                               " could not be written (%s: %s)", name, result.status.value,
                               result.detail)
        pending = again
    for name in sorted(pending):
        logger.warning("beat-claims: entry %s: this beat's beat_schedule definition could not"
                       " be written (the store kept changing); the stored one is followed",
                       name)
    return written


def _version(known: Known | None) -> int:
    """The version a write names: the stored definition's (0 creates: none, a tombstone)."""
    return 0 if known is None or known.stored.deleted else known.stored.version


def _valid(record: StoredDefinition) -> Definition | None:
    """The record's definition, when it holds a valid one."""
    if record.definition is None or record.corrupt:
        return None
    try:
        return validate(record.name, record.definition)
    except DefinitionError:
        return None
