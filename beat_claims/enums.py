"""The named values beat-claims records and decides by: run states, reasons, policies.

These enums are the one source of their names. The Redis store's Lua scripts get the same
names from a table generated from these classes (``stores/redis.py``), so a name is never
written twice.
"""

from __future__ import annotations

from enum import Enum


class _Named(str, Enum):
    """A str enum whose str() is its value (what the store records and the CLI prints)."""

    def __str__(self) -> str:
        return str(self.value)


class RunState(_Named):
    """The life of one occurrence, as the store records it."""

    DUE = "due"  # released, reclaimed or requested: claimable by any beat that has the entry
    WAITING = "waiting"  # overlap="buffer_one": claimable once the previous run is final
    CLAIMED = "claimed"
    SENDING = "sending"  # the holder passed the check before publish; a message may exist
    SENT = "sent"
    STARTED = "started"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    LOST = "lost"

    @property
    def final(self) -> bool:
        return self in FINAL_STATES

    @property
    def held(self) -> bool:
        """Claimed by a beat that has not handed it to the broker for sure."""
        return self in (RunState.CLAIMED, RunState.SENDING)

    @property
    def open(self) -> bool:
        """Handed to the broker, no outcome yet."""
        return self in (RunState.SENT, RunState.STARTED)


FINAL_STATES = frozenset(
    {RunState.DONE, RunState.FAILED, RunState.CANCELLED, RunState.SKIPPED, RunState.LOST}
)


class Reason(_Named):
    """Why a run was skipped, failed without running, or presumed lost."""

    CATCH_UP = "catch_up"  # missed while no beat ran; the catch-up policy collapsed it
    MAX_CATCH_UP = "max_catch_up"  # catch_up="all", beyond max_catch_up
    CATCH_UP_WINDOW = "catch_up_window"  # older than the entry's catch_up_window
    OVERLAP = "overlap"  # overlap="skip" and the previous run had not finished
    PUBLISH_ERROR = "publish_error"  # the publish failed publish_retries times
    RUN_TIMEOUT = "run_timeout"  # no outcome within the entry's run_timeout
    HISTORY_LIMIT = "history_limit"  # sent, never started, and pushed out of the history
    PAUSED = "paused"  # the entry was paused by an operator when the occurrence came due
    CHANGED = "changed"  # due under the entry's old definition, before a change took effect
    DISABLED = "disabled"  # due while the entry's definition was disabled, before a change


class CatchUp(_Named):
    """Which occurrences missed while no beat ran are still sent."""

    LATEST = "latest"  # the newest one (Celery's own behaviour); the others are skipped
    ALL = "all"  # each, oldest first, at most max_catch_up
    NONE = "none"  # none; only future occurrences


class Overlap(_Named):
    """What to do with an occurrence due while the entry's previous run is unfinished."""

    ALLOW = "allow"
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"  # the newest waits for the previous run; older waiting: skipped


class Origin(_Named):
    """Where an entry's definition in the store came from (who wrote it last)."""

    API = "api"  # the Python API or the CLI (``celery claims entries``)
    CONFIG = "config"  # a beat's ``beat_schedule``
    REDBEAT = "redbeat"  # imported from RedBeat's keys
    DJANGO = "django"  # a django-celery-beat row


class ImportAction(_Named):
    """What an import (``celery claims import redbeat``) does with one entry it read."""

    CREATE = "create"  # no definition in the store yet: one is made
    EXISTS = "exists"  # the store defines it already: left alone
    REFUSED = "refused"  # it cannot be a definition (the row says why)
    STATIC = "static"  # the source took it from beat_schedule: it stays there


class StartVerdict(_Named):
    """The worker's answer for one delivery of a run."""

    RUN = "run"  # this delivery starts (or continues) the run
    UNTRACKED = "untracked"  # the store has no record and cannot tell: runs unfenced
    REFUSED = "refused"  # superseded, finished, or not sent: the task body must not run
    BUSY = "busy"  # another delivery of the current token is running it


__all__ = ["FINAL_STATES", "CatchUp", "Origin", "Overlap", "Reason", "RunState",
           "StartVerdict"]
