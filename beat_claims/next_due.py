"""An entry's next due instant, as the due index holds it (``next_due``, see
:class:`beat_claims.stores.base.DueEntry`): what a beat puts on its heap for the entry's
checkpoint, computed the same way by every writer of the index (a beat's claim and its
sweeps, a change of a definition, an import).

The instant is the entry's next occurrence after the checkpoint; for a jittered entry the
instant a beat next wakes for it (see :func:`wake`); :data:`NOT_DUE` when the entry has no
occurrence left (a one-off time that passed, or past its ``until`` bound) or is disabled.
A writer that cannot compute it writes None (the store keeps what it has, or indexes the
entry due at once): an index earlier than the truth costs a read, one later delays an
occurrence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import occurrences
from .settings import Policy, Settings
from .stores.base import NOT_DUE

if TYPE_CHECKING:
    from celery import Celery

    from .definitions import Definition

#: Occurrences of a jittered entry looked at to find when it next wakes (and in one plan):
#: the bound of those walks. Hitting it delays occurrences (logged), never skips one.
JITTER_WALK = 1000


def horizon(policy: Policy) -> int:
    """How far ahead of its own instant (ms) a jittered entry's earlier occurrence may be
    claimed with a later one: half the entry's reclaim_after (no beat takes back a claim
    held that long), at most its jitter."""
    return int(min(policy.reclaim_after / 2, policy.jitter) * 1000)


def wake(name: str, sched: Any, anchor: int, first: int, until: int | None, policy: Policy) -> int:
    """When a jittered entry can next claim something: the first instant at which one of
    its next occurrences (``first`` and the ones after it) has come and every earlier one
    is within the horizon."""
    reach = horizon(policy)
    best: int | None = None
    latest: int | None = None  # the latest send instant of the earlier occurrences
    due: int | None = first
    for _ in range(JITTER_WALK):
        assert due is not None
        at = due + occurrences.jitter_offset(name, due, policy.jitter)
        claimable = at if latest is None else max(at, latest - reach)
        best = claimable if best is None else min(best, claimable)
        latest = at if latest is None else max(latest, at)
        due = occurrences.next_after(sched, anchor, due)
        if due is None or due >= best or (until is not None and due > until):
            break
    assert best is not None
    return best


def next_instant(
    name: str, sched: Any, anchor: int, after: int, until: int | None, policy: Policy
) -> int:
    """The entry's next due instant after ``after`` (its checkpoint, or the instant
    before its lower bound), as a beat's heap holds it: :data:`NOT_DUE` when it has none
    (or none at or before ``until``). Raises what computing the schedule raises."""
    nxt = occurrences.next_after(sched, anchor, after)
    if nxt is None or (until is not None and nxt > until):
        return NOT_DUE
    if policy.jitter:
        return wake(name, sched, anchor, nxt, until, policy)
    return nxt


def of_definition(
    name: str,
    definition: Definition,
    app: Celery,
    anchor: int,
    checkpoint: int | None,
    settings: Settings | None = None,
) -> int | None:
    """What a stored definition's entry (which has no bounds) is next due at, from its
    anchor and ``checkpoint`` (None: never claimed), as every beat scheduling it computes
    it (``settings``: the app's, for the policy's defaults): NOT_DUE when it is disabled;
    None when it cannot be computed here (no settings, its schedule or its policy
    refused)."""
    if not definition.enabled:
        return NOT_DUE
    if settings is None:
        return None
    try:
        sched = definition.schedule.celery(app)
        policy = settings.policy_for(name, dict(definition.claims) or None, sched)
        after = occurrences.looked_after(sched, anchor, checkpoint)
        return next_instant(name, sched, anchor, after, None, policy)
    except Exception:  # (a schedule this version cannot compute: the entry is due at once)
        return None
