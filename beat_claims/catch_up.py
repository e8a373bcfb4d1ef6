"""Which due occurrences run and which are recorded as skipped, by catch-up policy.

An occurrence due within ``grace`` of now is on time, whatever the policy: a beat that
ticks a little late must not call that a missed run. Older ones were missed (no beat ran
when they fell due, or they were released, taken back or held through an outage) and the
entry's policy decides:

``latest``  the newest missed one runs (if nothing is on time), the others are skipped;
``all``     every missed one runs, oldest first, at most ``max_catch_up`` (the oldest
            beyond that are skipped);
``none``    missed ones are skipped; only on-time ones run.

``catch_up_window`` skips missed occurrences older than the window whatever the policy.
With ``overlap="skip"`` at most one occurrence of a batch runs (the newest): the others
would overlap it.

The same decision is made twice: when occurrences are first claimed (:func:`plan`), and
when claims that waited (released, taken back, held through an outage) are finally sent
(:func:`plan_held`), so that a one-hour outage of an every-minute entry with ``latest``
sends one run, not sixty.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .enums import CatchUp, Overlap, Reason
from .settings import Policy


@dataclass
class Plan:
    run: list[int] = field(default_factory=list)
    skip: list[tuple[int, Reason]] = field(default_factory=list)
    unrecorded: int = 0  # skipped occurrences too old to be listed one by one
    unrecorded_exact: bool = True  # False: ``unrecorded`` is a lower bound


def _decide(policy: Policy, missed: list[int], on_time: list[int], now_ms: int) -> Plan:
    """The policy on ascending ``missed`` and ``on_time`` instants."""
    result = Plan()
    if policy.catch_up_window is not None:
        cutoff = now_ms - int(policy.catch_up_window * 1000)
        result.skip += [(d, Reason.CATCH_UP_WINDOW) for d in missed if d < cutoff]
        missed = [d for d in missed if d >= cutoff]
    if policy.catch_up is CatchUp.ALL:
        result.run = missed + on_time
        if len(result.run) > policy.max_catch_up:
            over = len(result.run) - policy.max_catch_up
            result.skip += [(d, Reason.MAX_CATCH_UP) for d in result.run[:over]]
            result.run = result.run[over:]
    elif policy.catch_up is CatchUp.LATEST:
        if on_time:
            result.run = on_time
            result.skip += [(d, Reason.CATCH_UP) for d in missed]
        else:
            result.run = missed[-1:]
            result.skip += [(d, Reason.CATCH_UP) for d in missed[:-1]]
    else:
        result.run = on_time
        result.skip += [(d, Reason.CATCH_UP) for d in missed]
    if policy.overlap is Overlap.SKIP and len(result.run) > 1:
        # Sent together they would overlap: the newest runs, the others are skipped.
        result.skip += [(d, Reason.OVERLAP) for d in result.run[:-1]]
        result.run = result.run[-1:]
    result.run.sort()
    result.skip.sort()
    return result


def plan(policy: Policy, due: list[int], total: int, now_ms: int, grace_ms: int,
         record_limit: int, total_exact: bool = True) -> Plan:
    """Newly due occurrences. ``due``: the newest ones, ascending; ``total``: how many are
    due in all (a lower bound unless ``total_exact``): the older ones are counted as
    skipped, not listed."""
    on_time = [d for d in due if d >= now_ms - grace_ms]
    missed = [d for d in due if d < now_ms - grace_ms]
    result = _decide(policy, missed, on_time, now_ms)
    result.unrecorded = total - len(due)
    result.unrecorded_exact = total_exact
    if len(result.skip) > record_limit:
        result.unrecorded += len(result.skip) - record_limit
        result.skip = result.skip[-record_limit:]
    return result


def plan_held(policy: Policy, waited: list[int], fresh: list[int], now_ms: int,
              grace_ms: int) -> Plan:
    """Claims of one entry about to be sent: ``waited`` ones (released, taken back, held
    through an outage), judged by now, and ``fresh`` ones, claimed just now on time."""
    on_time = sorted(fresh + [d for d in waited if d >= now_ms - grace_ms])
    missed = sorted(d for d in waited if d < now_ms - grace_ms)
    return _decide(policy, missed, on_time, now_ms)
