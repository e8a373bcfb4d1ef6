"""A change of an entry's definition, as the store writes it: the one place that turns
"entry NAME should now have definition NEW (or be deleted, or disabled)" into a
:class:`~beat_claims.stores.base.DefinitionWrite`, for the Python API, the CLI and a beat
registering its ``beat_schedule``.

What a change means, whoever makes it:

- It takes effect at the store's clock when it is planned, ``t`` (:meth:`Store.now`): the
  new definition governs from the entry's first occurrence after ``t`` (an interval's grid
  stays anchored at the entry's anchor). The checkpoint moves to ``t``, forward only.
- An occurrence a beat already claimed keeps the definition it was claimed with: a beat
  that claimed ahead may already be past ``t`` (the checkpoint then stays where it is).
- The old definition's occurrences due in ``(checkpoint, t]`` that have no run yet are
  recorded skipped, with the reason :attr:`Reason.CHANGED` (a change of the schedule, the
  task, its arguments or options, the policy, or a delete) or :attr:`Reason.DISABLED` (a
  disable; and a re-enable, a change or a delete of a disabled entry: its instants due while
  it was disabled, computed with its definition). Bounded: at most the store's history
  limit (``beat_claims_history_limit``) of them, the newest, are recorded by one write;
  the older ones are passed over by the checkpoint alone, without a record.
- A change of the description alone sends nothing differently: no skip, the checkpoint
  is not touched.
- Each write is a compare-and-set on the version the caller read (0 creates) and on the
  checkpoint read. A beat that claimed in between moves the checkpoint: the change is
  planned again from what the store holds then, a bounded number of times
  (:data:`CHECKPOINT_RETRIES`). A version that moved is the caller's stale edit: it comes
  back as it is (:attr:`WriteStatus.CONFLICT`, ``detail`` "version"), never written over.
- Each change has its own ``change_id``: a write whose reply was lost is sent again as it
  was, and the store answers what it did the first time.

The old definition is the one the store holds. For an entry a beat registered from its
``beat_schedule`` without a definition in the store, the beat says what it ran
(:attr:`EntryChange.previous`); without it, the occurrences due since the checkpoint are
passed over unrecorded. A stored definition that cannot be read (corrupt, or written by a
later version) is treated the same way.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from . import next_due, occurrences
from .definitions import Definition, DefinitionError, validate
from .enums import Origin, Reason
from .settings import Settings
from .stores.base import (
    DefinitionResult,
    DefinitionWrite,
    Store,
    StoredDefinition,
    StoreError,
    WriteStatus,
)

if TYPE_CHECKING:
    from celery import Celery

#: Changes read and written together: one round trip for each of their definitions, their
#: entries, the store's clock and the write (the stores send a write of this many in one).
CHUNK = 500
#: How often a change is planned again after a beat moved the entry's checkpoint.
CHECKPOINT_RETRIES = 5
#: How often a write whose reply was lost is sent again (the same write, its change ids).
LOST_REPLY_RETRIES = 3
#: The ``detail`` of a CONFLICT the store answers when the checkpoint moved.
CHECKPOINT_MOVED = "checkpoint"


def new_change_id() -> str:
    """A change's id: one per logical change, kept across its retries."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class EntryChange:
    """Entry ``name`` should now have ``definition`` (None: be deleted).

    ``expected_version``: the version of the definition the caller read (0: it creates the
    entry's definition). ``previous``: what the beats ran for an entry the store holds no
    definition of (a beat's own ``beat_schedule`` entry), to record what the change skips.
    ``counts_from_change``: an entry it creates counts from the change, as an edited one
    does (a one-off instant already past is not sent), rather than from before any instant
    (one already past is missed, for its catch-up policy): an import puts back definitions
    whose one-off instants may have run in the store they were exported from.
    """

    name: str
    definition: Definition | None
    expected_version: int
    change_id: str = field(default_factory=new_change_id)
    previous: Definition | None = None
    counts_from_change: bool = False


class _Position(Protocol):
    """Where an entry is: an :class:`EntryRecord` or an :class:`EntryState`."""

    @property
    def anchor(self) -> int | None: ...

    @property
    def checkpoint(self) -> int | None: ...


def plan_change(change: EntryChange, stored: StoredDefinition | None,
                position: _Position | None, now: int, app: Celery, history_limit: int,
                origin: Origin, by: str, settings: Settings | None = None
                ) -> DefinitionWrite:
    """The write that makes ``change`` at the store's clock ``now``, from what the store
    holds of the entry: its definition (``stored``; None: never had one) and its anchor and
    checkpoint (``position``; None, or no anchor: the store has no such entry). Pure.

    Its ``next_due`` (the due index) is the new definition's first instant after the
    checkpoint the write leaves, as every beat computes it (``settings``: the app's, for
    the policy's defaults; None: not known, the entry is indexed due at once)."""
    text = None if change.definition is None else change.definition.to_json()
    exists = position is not None and position.anchor is not None
    old = _old_definition(change, stored)
    if not exists:  # created, anchored at the store's clock: at ``now`` or just after
        checkpoint = now if change.counts_from_change else None
        return DefinitionWrite(change.name, text, change.expected_version, origin, by,
                               change.change_id, checkpoint=checkpoint,
                               next_due=_next_due(change, app, now, checkpoint, settings))
    assert position is not None and position.anchor is not None
    if (old is not None and change.definition is not None
            and _sends_the_same(old, change.definition)):  # the checkpoint stays
        return DefinitionWrite(change.name, text, change.expected_version, origin, by,
                               change.change_id, next_due=_next_due(
                                   change, app, position.anchor, position.checkpoint,
                                   settings))
    skip: tuple[tuple[int, Reason], ...] = ()
    if old is not None:
        disabled = not old.enabled or (change.definition is not None
                                       and not change.definition.enabled)
        reason = Reason.DISABLED if disabled else Reason.CHANGED
        skip = tuple((due, reason) for due in _due(old, change.name, app, position.anchor,
                                                   position.checkpoint, now, history_limit))
    moved_to = now if position.checkpoint is None else max(now, position.checkpoint)
    return DefinitionWrite(change.name, text, change.expected_version, origin, by,
                           change.change_id, skip, now, position.checkpoint,
                           next_due=_next_due(change, app, position.anchor, moved_to,
                                              settings))


def _next_due(change: EntryChange, app: Celery, anchor: int, checkpoint: int | None,
              settings: Settings | None) -> int | None:
    """The changed entry's next due instant after ``checkpoint`` (None: never claimed),
    or None: a delete, which the store takes out of the index, or one that cannot be
    computed here."""
    if change.definition is None:
        return None
    return next_due.of_definition(change.name, change.definition, app, anchor, checkpoint,
                                  settings)


def _old_definition(change: EntryChange, stored: StoredDefinition | None
                    ) -> Definition | None:
    """The definition the beats follow before the change, when it can be known."""
    if stored is None or (stored.deleted and change.previous is not None):
        return change.previous
    if stored.definition is None:  # a tombstone (nothing scheduled), or unreadable
        return None
    try:
        return validate(change.name, stored.definition)
    except DefinitionError:
        return None


def _sends_the_same(old: Definition, new: Definition) -> bool:
    """Whether two definitions differ in their description at most."""
    return ({**old.as_dict(), "description": ""} == {**new.as_dict(), "description": ""})


def _due(definition: Definition, name: str, app: Celery, anchor: int,
         checkpoint: int | None, until: int, keep: int) -> list[int]:
    """The newest ``keep`` occurrences of ``definition`` after ``checkpoint`` (None: never
    claimed) up to ``until``, as every beat computes them (none when its schedule cannot be
    computed here)."""
    try:
        sched = definition.schedule.celery(app)
        after = occurrences.looked_after(sched, anchor, checkpoint)
        return occurrences.due_between(sched, anchor, after, until, keep).newest
    except (DefinitionError, occurrences.UnsupportedSchedule):
        return []


def apply_changes(store: Store, changes: Iterable[EntryChange], origin: Origin, by: str,
                  app: Celery) -> list[DefinitionResult]:
    """Make ``changes`` in the store, :data:`CHUNK` at a time (a few round trips each),
    one result per change, in order. A change the store refused comes back as it answered:
    CONFLICT with ``detail`` "version" (a stale edit), EXISTS, MISSING, CORRUPT; a CONFLICT
    because a beat kept moving the checkpoint comes back after :data:`CHECKPOINT_RETRIES`.
    Raises :class:`StoreError` when the store stays unreachable: the changes written so far
    stay written, and the same changes applied again (their change ids) answer the same."""
    results: list[DefinitionResult] = []
    chunk: list[EntryChange] = []
    for change in changes:
        chunk.append(change)
        if len(chunk) == CHUNK:
            results += _apply_chunk(store, chunk, origin, by, app)
            chunk = []
    if chunk:
        results += _apply_chunk(store, chunk, origin, by, app)
    return results


def _apply_chunk(store: Store, chunk: Sequence[EntryChange], origin: Origin, by: str,
                 app: Celery) -> list[DefinitionResult]:
    answers: dict[int, DefinitionResult] = {}
    pending = list(range(len(chunk)))
    limit = store.history_limit
    try:
        settings: Settings | None = Settings.from_app(app)
    except Exception:  # (every change is then indexed due at once)
        settings = None
    for _ in range(1 + CHECKPOINT_RETRIES):
        names = list(dict.fromkeys(chunk[i].name for i in pending))
        stored = {d.name: d for d in store.definitions(names)}
        positions = {e.name: e for e in store.entries(names)}
        now = store.now()
        writes = [plan_change(chunk[i], stored.get(chunk[i].name),
                              positions.get(chunk[i].name), now, app, limit, origin, by,
                              settings)
                  for i in pending]
        again = []
        for i, result in zip(pending, _write(store, writes)):
            answers[i] = result
            if result.status is WriteStatus.CONFLICT and result.detail == CHECKPOINT_MOVED:
                again.append(i)
        pending = again
        if not pending:
            break
    return [answers[i] for i in range(len(chunk))]


def _write(store: Store, writes: list[DefinitionWrite]) -> list[DefinitionResult]:
    """The writes, sent again as they are when a reply is lost (their change ids make the
    store answer what it did)."""
    for attempt in range(LOST_REPLY_RETRIES + 1):
        try:
            return store.write_definitions(writes)
        except StoreError:
            if attempt == LOST_REPLY_RETRIES:
                raise
    raise AssertionError("unreachable")


__all__ = [
    "CHECKPOINT_RETRIES",
    "CHUNK",
    "LOST_REPLY_RETRIES",
    "EntryChange",
    "apply_changes",
    "new_change_id",
    "plan_change",
]
