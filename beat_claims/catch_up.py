"""Which due occurrences run and which are recorded as skipped, by catch-up policy.

An occurrence due within ``grace`` of now is on time, whatever the policy: a beat that
ticks a little late must not call that a missed run. Older ones were missed (no beat ran
when they fell due) and the entry's policy decides:

``latest``  the newest missed one runs (if nothing is on time), the others are skipped;
``all``     every missed one runs, oldest first, at most ``max_catch_up`` (the oldest
            beyond that are skipped);
``none``    missed ones are skipped; only on-time ones run.

``catch_up_window`` skips missed occurrences older than the window whatever the policy.
With ``overlap="skip"`` at most one occurrence of a batch runs (the newest): the others
would overlap it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .settings import Policy


@dataclass
class Plan:
    run: list[int] = field(default_factory=list)
    skip: list[tuple[int, str]] = field(default_factory=list)
    unrecorded: int = 0  # skipped occurrences too old to be listed one by one


def plan(policy: Policy, due: list[int], total: int, now_ms: int, grace_ms: int,
         record_limit: int) -> Plan:
    """``due``: the newest due occurrences, ascending; ``total``: how many are due in all."""
    result = Plan(unrecorded=total - len(due))
    on_time = [d for d in due if d >= now_ms - grace_ms]
    missed = [d for d in due if d < now_ms - grace_ms]
    if policy.catch_up_window is not None:
        cutoff = now_ms - int(policy.catch_up_window * 1000)
        result.skip += [(d, "catch_up_window") for d in missed if d < cutoff]
        missed = [d for d in missed if d >= cutoff]
    if policy.catch_up == "all":
        result.run = missed + on_time
        if len(result.run) > policy.max_catch_up:
            over = len(result.run) - policy.max_catch_up
            result.skip += [(d, "max_catch_up") for d in result.run[:over]]
            result.run = result.run[over:]
    elif policy.catch_up == "latest":
        if on_time:
            result.run = on_time
            result.skip += [(d, "catch_up") for d in missed]
        else:
            result.run = missed[-1:]
            result.skip += [(d, "catch_up") for d in missed[:-1]]
    else:
        result.run = on_time
        result.skip += [(d, "catch_up") for d in missed]
    if policy.overlap == "skip" and len(result.run) > 1:
        # Sent together they would overlap: the newest runs, the others are skipped.
        result.skip += [(d, "overlap") for d in result.run[:-1]]
        result.run = result.run[-1:]
    result.skip.sort()
    if len(result.skip) > record_limit:
        result.unrecorded += len(result.skip) - record_limit
        result.skip = result.skip[-record_limit:]
    return result
