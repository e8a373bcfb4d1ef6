"""A beat's ``beat_schedule`` entries, written as CONFIG definitions when it starts.

Each entry that can be stored is written where the store has no definition of that name,
a tombstone, or a CONFIG definition with another digest: the beat started last wins (a
rolling deploy ends with the new ``beat_schedule`` in the store, and every beat that still
has the entry sends by it). A definition of another origin (API, REDBEAT, DJANGO) is never
overwritten: that dynamic entry shadows the ``beat_schedule`` one.

A change from a stored definition follows the change semantics: the old definition's
instants in (checkpoint, now] with no run are recorded skipped (``changed``, or
``disabled`` when the old one was disabled), and the checkpoint moves to now by a
compare-and-set, with the version's: new occurrences come from the new definition, after
the change. (A minimal private writer, until ``beat_claims.entry_changes`` is on main.)
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

from .. import occurrences
from ..definitions import Definition, DefinitionError, validate
from ..enums import Origin, Reason
from ..stores.base import DefinitionWrite, Store, StoredDefinition, WriteStatus
from .stored import Known

#: Attempts of one write that meets a conflict (a beat claimed, another beat wrote).
ATTEMPTS = 3


def needs_write(own: Definition, known: Known | None) -> bool:
    """Whether the store should take ``own`` (see the module's rule)."""
    if known is None or known.stored.deleted:
        return True
    stored = known.stored
    if stored.corrupt or stored.origin is not Origin.CONFIG:
        return False
    return known.definition is None or known.definition.digest() != own.digest()


def _valid(record: StoredDefinition) -> Definition | None:
    """The record's definition, when it holds a valid one."""
    if record.definition is None or record.corrupt:
        return None
    try:
        return validate(record.name, record.definition)
    except DefinitionError:
        return None


def change_write(store: Store, app: Celery, name: str, definition: Definition | None,
                 current: StoredDefinition | None, origin: Origin, by: str,
                 history_limit: int) -> DefinitionWrite:
    """The write that makes ``definition`` the entry's (None: deletes it), from
    ``current`` (the stored record read last; None: none), with the change semantics."""
    text = definition.to_json() if definition is not None else None
    if current is None or current.deleted:
        return DefinitionWrite(name, text, 0, origin, by)
    old = _valid(current)  # (one that is not valid was never sent: nothing to skip)
    records = store.entries([name])
    record = records[0] if records else None
    now = store.now()
    skip: tuple[tuple[int, Reason], ...] = ()
    if old is not None and record is not None and record.anchor is not None:
        after = record.checkpoint if record.checkpoint is not None else record.anchor
        window = occurrences.due_between(old.schedule.celery(app), record.anchor, after, now,
                                         history_limit)
        reason = Reason.CHANGED if old.enabled else Reason.DISABLED
        skip = tuple((due, reason) for due in window.newest)
    checkpoint = record.checkpoint if record is not None else None
    return DefinitionWrite(name, text, current.version, origin, by,
                           skip=skip, checkpoint=now if record is not None else None,
                           expected_checkpoint=checkpoint)


def write_own(store: Store, app: Celery, own: dict[str, Definition],
              known: dict[str, Known], by: str, history_limit: int,
              logger: logging.Logger) -> int:
    """Write each of ``own`` the store should take; how many were written."""
    pending = {name: known.get(name) for name, definition in own.items()
               if needs_write(definition, known.get(name))}
    written = 0
    for _ in range(ATTEMPTS):
        if not pending:
            break
        writes = [change_write(store, app, name, own[name],
                               k.stored if k is not None else None, Origin.CONFIG, by,
                               history_limit)
                  for name, k in sorted(pending.items())]
        again: dict[str, Any] = {}
        for write, result in zip(writes, store.write_definitions(writes)):
            if result.status is WriteStatus.OK:
                written += 1
                logger.info("beat-claims: entry %s: this beat's beat_schedule definition"
                            " written to the store (version %d)", write.name, result.version)
            elif result.status in (WriteStatus.CONFLICT, WriteStatus.EXISTS,
                                   WriteStatus.MISSING) and result.current is not None:
                current = Known(result.current, _valid(result.current))
                if needs_write(own[write.name], current):
                    again[write.name] = current
            elif result.status is WriteStatus.CONFLICT:  # the checkpoint moved: again
                again[write.name] = pending[write.name]
            else:
                logger.warning("beat-claims: entry %s: this beat's beat_schedule definition"
                               " could not be written (%s: %s)", write.name,
                               result.status.value, result.detail)
        pending = again
    for name in sorted(pending):
        logger.warning("beat-claims: entry %s: this beat's beat_schedule definition could not"
                       " be written (the store kept changing); the stored one is followed",
                       name)
    return written
