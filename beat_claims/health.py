"""``celery claims health``: is the fleet sending what is due? For probes and monitors.

Six checks, each read from the store alone (nothing is written):

* **store**: the store answers (its clock is read; every other check compares with it);
* **beats**: at least one beat is alive (its heartbeat has not lapsed and, on this host,
  its process is still there: :func:`beat_claims.beat.liveness.owner_alive`);
* **claims**: no claim is held longer than its entry's ``reclaim_after`` (a beat that
  claimed and neither sent nor gave it back, and that no sweep took it from);
* **overdue**: no entry of the app's schedule (with the entries created at run time:
  see :func:`beat_claims.inspect.dynamic_schedules`) that is not paused has its next occurrence
  after the store's checkpoint more than the grace in the past, and no run due again
  (released, taken back, requested, backfilled) of any entry, in this app's schedule or
  not, has waited longer than the grace for a beat to claim it;
* **unstarted**: no run has been ``sent`` without a worker starting it for longer than
  ``beat_claims_unstarted_after`` (:mod:`beat_claims.unstarted`).
* **schedules**: no live beat's ``beat_schedule`` has an entry whose definition differs
  from the one in the store (a rolling deploy not finished, a beat left on an old
  configuration: that beat sends the stored definition, not its own).

``--beat`` checks the store and that a beat of this host (``socket.gethostname()``) is
alive: a liveness probe for a beat's container; ``--beat PID`` (or ``HOST:PID``) that
beat.

The work is bounded: at most ``max_entries`` entries of the schedule are examined (the
first by name; the report says how many were not), live claims and runs due again are
read up to :data:`LIVE_LIMIT`, open runs page by page (:data:`beat_claims.unstarted.PAGE`
a call, until every one older than the bound was read), and the history of at most
:data:`DUE_ENTRIES` entries with runs due again is read to learn how long they have
waited.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import occurrences, unstarted
from .beat.liveness import owner_alive
from .enums import RunState
from .inspect import owner_doc
from .runs import iso
from .settings import Policy
from .stores.base import HeldRun, LiveQuery, OwnerStatus, RunRef, Store, StoreError

#: Entries of the schedule examined for overdue occurrences, unless told otherwise.
MAX_ENTRIES = 1000
#: Live claims and runs due again read in one call.
LIVE_LIMIT = 1000
#: Entries whose runs due again are looked at one by one (their history is read).
DUE_ENTRIES = 100
#: Items listed per failed check in the text output (the JSON has them all).
SHOWN = 10


@dataclass
class Finding:
    """The outcome of one check: ok or not, why, and what it found."""

    name: str
    ok: bool
    detail: str
    items: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "items": self.items}


@dataclass
class Report:
    checks: list[Finding]
    now: int | None = None
    grace: float | None = None
    unstarted_after: float | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[Finding]:
        return [c for c in self.checks if not c.ok]

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "now": iso(self.now), "grace_seconds": self.grace,
                "unstarted_after_seconds": self.unstarted_after,
                "failed": [c.name for c in self.failed],
                "checks": [c.as_dict() for c in self.checks]}

    def text(self) -> str:
        lines = []
        for c in self.checks:
            lines.append(f"{'ok  ' if c.ok else 'FAIL'}  {c.name}: {c.detail}")
            if not c.ok:
                lines.extend(f"        {_item_line(item)}" for item in c.items[:SHOWN])
                if len(c.items) > SHOWN:
                    lines.append(f"        and {len(c.items) - SHOWN} more (see --json)")
        lines.append("healthy" if self.ok else
                     f"unhealthy: {', '.join(c.name for c in self.failed)}")
        return "\n".join(lines)


def _item_line(item: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in item.items() if v is not None)


# -- the checks ---------------------------------------------------------------------------
def store_check(store: Store) -> tuple[Finding, int | None]:
    """Does the store answer? Its clock (UTC ms), or None when it does not."""
    started = time.monotonic()
    try:
        now = store.now()
    except StoreError as exc:
        return Finding("store", False, f"unreachable ({store.description}): {exc}"), None
    took = (time.monotonic() - started) * 1000
    return Finding("store", True, f"answered in {took:.0f} ms, clock {iso(now)}"), now


def beats_check(owners: Sequence[OwnerStatus], host: str | None = None,
                pid: int | None = None) -> Finding:
    """At least one beat alive (of ``host``, when given; with ``pid`` too, that beat)."""
    name = "beat" if host is not None else "beats"
    mine = [o for o in owners if (host is None or o.owner.host == host)
            and (pid is None or o.owner.pid == pid)]
    alive = [o for o in mine if owner_alive(o)]
    where = (f" with pid {pid} on host {host!r}" if pid is not None else
             f" on host {host!r}" if host is not None else "")
    shown = alive if alive else mine
    items = [owner_doc(o.owner, owner_alive(o), o.expires_at) for o in shown]
    if alive:
        return Finding(name, True, f"{len(alive)} alive{where} of {len(owners)} registered:"
                       f" {', '.join(f'{o.owner.host}:{o.owner.pid}' for o in alive)}", items)
    gone = [o for o in mine if o.alive]  # heartbeat not lapsed, process gone on this host
    lapsed = max((o.expires_at for o in mine), default=None)
    why = (f", {len(gone)} whose process is gone on this host" if gone else
           f", the last heartbeat lapsed at {iso(lapsed)}" if lapsed else "")
    return Finding(name, False, f"no beat alive{where} ({len(mine)} registered{why})", items)


def schedules_check(owners: Sequence[OwnerStatus]) -> Finding:
    """No live beat has an entry in its beat_schedule whose definition differs from the
    store's (each such beat sends the stored one: its beat_schedule is not what runs)."""
    items = [dict(owner_doc(o.owner, True, o.expires_at),
                  entries=", ".join(o.owner.schedule_differs))
             for o in owners if owner_alive(o) and o.owner.schedule_differs]
    if items:
        shown = "; ".join(f"{i['beat']}: {i['entries']}" for i in items[:SHOWN])
        return Finding("schedules", False, f"{len(items)} beat(s) whose beat_schedule differs"
                       f" from the definitions in the store (the stored ones are sent):"
                       f" {shown}", items)
    return Finding("schedules", True, "no live beat's beat_schedule differs from the"
                   " definitions in the store")


@dataclass(frozen=True)
class Live:
    """Claims held longer than their entry's ``reclaim_after``, and runs due again."""

    stale: list[HeldRun]
    due: list[RunRef]
    complete: bool


def live(store: Store, now: int, policies: Mapping[str, Policy], default: Policy,
         limit: int = LIVE_LIMIT) -> Live:
    """One read of the store's live runs: what a sweep would find, nothing taken."""
    shortest = min([p.reclaim_after for p in policies.values()] + [default.reclaim_after])
    # Only the age clause: no owner's own claims (mine_before), none for being a dead
    # owner's (dead_before), every claim held since before the shortest reclaim_after.
    query = LiveQuery(owner="", live_owners=frozenset(), held_before=now - int(shortest * 1000),
                      mine_before=0, dead_before=0, limit=limit)
    found = store.live_runs(query)
    stale = [h for h in found.held
             if h.since < now - int(policies.get(h.entry, default).reclaim_after * 1000)]
    return Live(stale, list(found.due), found.complete)


def claims_check(found: Live, now: int, policies: Mapping[str, Policy], default: Policy,
                 owners: Sequence[OwnerStatus]) -> Finding:
    names = {o.owner.id: f"{o.owner.host}:{o.owner.pid}" for o in owners}
    items = [{"entry": h.entry, "due": iso(h.due), "owner": names.get(h.owner, h.owner),
              "held_since": iso(h.since), "held_seconds": round((now - h.since) / 1000, 1),
              "reclaim_after": policies.get(h.entry, default).reclaim_after}
             for h in sorted(found.stale, key=lambda h: h.since)]
    partial = "" if found.complete else f" (the first {LIVE_LIMIT} live claims read)"
    if items:
        return Finding("claims", False, f"{len(items)} claim(s) held longer than their"
                       f" reclaim_after{partial}", items)
    return Finding("claims", True, f"no claim held longer than its reclaim_after{partial}")


def overdue_check(store: Store, now: int, schedules: Mapping[str, Any], grace: float,
                  due: Sequence[RunRef], policies: Mapping[str, Policy] | None = None,
                  max_entries: int = MAX_ENTRIES) -> Finding:
    """Entries of the schedule whose next occurrence is later than ``grace``, and runs due
    again (of any entry) that no beat claimed within ``grace``. An entry with a ``jitter``
    is sent at due + its offset (the same on every beat): it is late only after that."""
    policies = policies or {}
    cutoff = now - int(grace * 1000)
    names = sorted(schedules)
    examined = names[:max_entries]
    records = {r.name: r for r in store.entries(examined)} if examined else {}
    items: list[dict[str, Any]] = []
    unregistered: list[str] = []
    for name in examined:
        found = records.get(name)
        if found is None or found.anchor is None:
            unregistered.append(name)
            continue
        if found.paused is not None:
            continue
        sched = schedules[name]
        try:
            nxt = occurrences.next_after(sched, found.anchor, occurrences.looked_after(
                sched, found.anchor, found.checkpoint))
        except Exception:  # the beat logs why it cannot schedule this entry
            continue
        if nxt is None:
            continue
        policy = policies.get(name)
        at = nxt + (occurrences.jitter_offset(name, nxt, policy.jitter)
                    if policy is not None and policy.jitter else 0)
        if at < cutoff:
            items.append({"entry": name, "kind": "not claimed", "due": iso(nxt),
                          "late_seconds": round((now - at) / 1000, 1), "in_schedule": True})
    untaken = _waiting_too_long(store, now, cutoff, due)
    for item in untaken:
        item["in_schedule"] = item["entry"] in schedules
    items.extend(untaken)
    notes = []
    if len(names) > len(examined):
        notes.append(f"{len(names) - len(examined)} of {len(names)} entries not examined"
                     " (--max-entries)")
    if unregistered:
        notes.append(f"{len(unregistered)} not registered by any beat yet: "
                     + ", ".join(unregistered[:5]) + (" ..." if len(unregistered) > 5 else ""))
    elsewhere = sorted({i["entry"] for i in untaken if not i["in_schedule"]})
    if elsewhere:
        notes.append(f"runs due again of {len(elsewhere)} entr(ies) not in this app's"
                     f" schedule: only a beat whose schedule has them claims them:"
                     f" {', '.join(elsewhere[:5])}" + (" ..." if len(elsewhere) > 5 else ""))
    note = f" ({'; '.join(notes)})" if notes else ""
    if items:
        entries = sorted({i["entry"] for i in items})
        return Finding("overdue", False, f"{len(entries)} entr(ies) overdue by more than"
                       f" {grace:g} s: {', '.join(entries[:SHOWN])}{note}", items)
    return Finding("overdue", True, f"{len(examined)} entr(ies) examined, none overdue by more"
                   f" than {grace:g} s{note}")


def _waiting_too_long(store: Store, now: int, cutoff: int, due: Sequence[RunRef]
                      ) -> list[dict[str, Any]]:
    """Runs due again for longer than the grace, of any entry the store has (a run nobody
    claims is late whatever schedule this probe was given): how long each has waited is
    in its record (released, requested or backfilled at), read from the history of at
    most DUE_ENTRIES entries, those with the oldest due runs first."""
    oldest: dict[str, int] = {}
    for ref in due:
        oldest[ref.entry] = min(ref.due, oldest.get(ref.entry, ref.due))
    items = []
    for entry in sorted(oldest, key=lambda e: oldest[e])[:DUE_ENTRIES]:
        for run in store.history(entry):
            if run.state is not RunState.DUE:
                continue
            since = run.extra.get("released_at") or run.claimed_at or run.due
            if isinstance(since, (int, float)) and since < cutoff:
                items.append({"entry": entry, "kind": "due again", "due": iso(run.due),
                              "waiting_since": iso(int(since)),
                              "late_seconds": round((now - since) / 1000, 1)})
    return items


def unstarted_check(store: Store, now: int, after: float | None) -> Finding:
    """Runs sent that no worker started within ``after`` seconds, by entry."""
    if after is None:
        return Finding("unstarted", True, "not checked (beat_claims_unstarted_after is None)")
    found = unstarted.read(store, now, after)
    partial = "" if found.complete else (
        f" (a millisecond held more than {unstarted.INSTANT_PAGES * unstarted.PAGE} open"
        " runs: not all were read)")
    if found.entries:
        return Finding("unstarted", False, f"{len(found.entries)} entr(ies) with "
                       f"{unstarted.summary([u.entry for u in found.entries], after, SHOWN)}"
                       f"{partial}",
                       [u.as_dict(now) for u in found.entries])
    return Finding("unstarted", True, f"no run sent and not started for more than {after:g} s"
                   f"{partial}")


# -- the probes ---------------------------------------------------------------------------
def fleet(store: Store, schedules: Mapping[str, Any], policies: Mapping[str, Policy],
          default: Policy, grace: float, max_entries: int = MAX_ENTRIES,
          unstarted_after: float | None = None) -> Report:
    """Every check. Once the store does not answer, the others are not made."""
    found, now = store_check(store)
    if now is None:
        return Report([found], None, grace, unstarted_after)
    checks = [found]
    try:
        owners = store.owners()
        checks.append(beats_check(owners))
        held = live(store, now, policies, default)
        checks.append(claims_check(held, now, policies, default, owners))
        checks.append(overdue_check(store, now, schedules, grace, held.due, policies,
                                    max_entries))
        checks.append(unstarted_check(store, now, unstarted_after))
        checks.append(schedules_check(owners))
    except StoreError as exc:
        checks.append(Finding("store", False, f"stopped answering during the checks: {exc}"))
    return Report(checks, now, grace, unstarted_after)


def beat(store: Store, host: str | None = None, pid: int | None = None) -> Report:
    """The store answers and a beat of ``host`` (default: this host) is alive; with
    ``pid``, the beat of that host with that pid."""
    found, now = store_check(store)
    if now is None:
        return Report([found])
    try:
        return Report([found, beats_check(store.owners(), host or socket.gethostname(), pid)],
                      now)
    except StoreError as exc:
        return Report([found, Finding("store", False, f"stopped answering: {exc}")], now)


__all__ = ["DUE_ENTRIES", "LIVE_LIMIT", "MAX_ENTRIES", "Finding", "Live", "Report", "beat",
           "beats_check", "claims_check", "fleet", "live", "overdue_check", "schedules_check",
           "store_check", "unstarted_check"]
