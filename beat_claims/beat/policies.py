"""The policy of each entry a beat schedules (its ``claims`` over the beat's settings), and
the shortest windows over all of them: read when the schedule changes, so that a sweep
never walks every entry's policy.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import occurrences
from ..enums import Overlap
from ..settings import ConfigurationError, Policy, Settings
from ..stores.base import RunRef
from .claimer import PolicyBounds


def shortest(policies: list[Policy], bounds: PolicyBounds | None = None) -> PolicyBounds:
    """The shortest windows over ``policies`` (and ``bounds``, when given)."""
    reclaim = [p.reclaim_after for p in policies]
    timeouts = [p.run_timeout for p in policies if p.run_timeout is not None]
    if bounds is not None:
        reclaim.append(bounds.reclaim_after)
        if bounds.run_timeout is not None:
            timeouts.append(bounds.run_timeout)
    return PolicyBounds(min(reclaim), min(timeouts) if timeouts else None)


def _check_schedule(name: str, entry: Any) -> None:
    try:
        occurrences.next_after(entry.schedule, 0, 0)
    except occurrences.UnsupportedSchedule as exc:
        raise ConfigurationError(f"entry {name!r}: schedule {exc}") from None


class EntryPolicies:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        #: Name -> policy (shared with the parts that judge runs: updated in place).
        self.by_name: dict[str, Policy] = {}
        self.bounds = PolicyBounds(settings.policy.reclaim_after, settings.policy.run_timeout)

    def read(self, schedule: dict[str, Any], pinned: dict[RunRef, Any]) -> None:
        """Every entry's policy (a pinned claim's entry may have left the schedule: it is
        judged by its policy). An entry whose schedule cannot be planned is refused."""
        entries = {**{ref.entry: entry for ref, entry in pinned.items()}, **schedule}
        policies = {name: self.settings.policy_for(name, getattr(entry, "claims", None),
                                                   entry.schedule)
                    for name, entry in entries.items()}
        for name, entry in schedule.items():
            _check_schedule(name, entry)
        self.by_name.clear()
        self.by_name.update(policies)
        self.bounds = shortest([self.settings.policy, *policies.values()])

    def read_some(self, names: set[str], schedule: dict[str, Any],
                  pinned: dict[RunRef, Any]) -> None:
        """What :meth:`read` does, for ``names`` alone (an entry gone keeps its policy
        while a claim of it is pinned). The shortest windows over every policy are walked
        again only when one of the policies replaced held one of them."""
        pinned_here = {ref.entry: entry for ref, entry in pinned.items() if ref.entry in names}
        policies: dict[str, Policy | None] = {}
        for name in sorted(names):
            entry = schedule.get(name, pinned_here.get(name))
            if entry is None:
                policies[name] = None
                continue
            if name in schedule:
                _check_schedule(name, entry)
            policies[name] = self.settings.policy_for(name, getattr(entry, "claims", None),
                                                      entry.schedule)
        replaced = [p for p in (self.by_name.get(name) for name in policies) if p is not None]
        for name, policy in policies.items():
            if policy is None:
                self.by_name.pop(name, None)
            else:
                self.by_name[name] = policy
        default, bounds = self.settings.policy, self.bounds
        if any((p.reclaim_after == bounds.reclaim_after < default.reclaim_after)
               or (p.run_timeout is not None and p.run_timeout == bounds.run_timeout
                   and (default.run_timeout is None or p.run_timeout < default.run_timeout))
               for p in replaced):
            self.bounds = shortest([default, *self.by_name.values()])
        else:
            self.bounds = shortest(
                [default, *(p for p in policies.values() if p is not None)], bounds)

    def warn_unbounded_overlap(self, schedule: dict[str, Any], logger: logging.Logger) -> None:
        """An entry that waits for its previous run (overlap skip or buffer_one) waits for
        a run whose outcome never comes until its run_timeout: warn when that is never,
        or the default day nobody chose (workers without the hooks are the usual cause).
        One line for each of the two, naming the entries."""
        never: list[str] = []
        default: list[str] = []
        for name, policy in sorted(self.by_name.items()):
            if policy.overlap is Overlap.ALLOW:
                continue
            claims = getattr(schedule.get(name), "claims", None) or {}
            if policy.run_timeout is None:
                never.append(name)
            elif "run_timeout" not in claims and not self.settings.run_timeout_set:
                default.append(name)
        for names, held in (
                (never, "run_timeout=None: every later occurrence is held back for ever"),
                (default, f"the default run_timeout ({self.settings.policy.run_timeout:g} s,"
                          " a day, which nobody chose): every later occurrence is held back"
                          " that long")):
            if names:
                shown = ", ".join(repr(n) for n in names[:10]) + (
                    f" and {len(names) - 10} more" if len(names) > 10 else "")
                logger.warning(
                    "beat-claims: entr(ies) %s with overlap skip or buffer_one and %s by a"
                    " run whose outcome is never reported (workers without"
                    " beat_claims.install(app), or on another store or key prefix; a worker"
                    " killed without a result backend). Set claims['run_timeout'] (or"
                    " beat_claims_run_timeout) to the longest the task may take.",
                    shown, held)
