"""What the store records: runs, their states, and the beats that own them."""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any

import psutil

#: Namespace for task ids derived from occurrences: the same occurrence always gets the
#: same task id, on every beat.
TASK_ID_NAMESPACE = uuid.UUID("6f1c5a52-9a0e-4d59-8a43-6d1f0c1f7b2e")

#: The message header a run is published with.
HEADER = "beat_claims"


class RunState(str, Enum):
    """The life of one occurrence, as the store records it."""

    DUE = "due"  # released by a beat that stopped: due again, claimable by anyone
    CLAIMED = "claimed"
    SENDING = "sending"  # the holder passed the check before publish; publish may have happened
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

    def __str__(self) -> str:
        return self.value


FINAL_STATES = frozenset(
    {RunState.DONE, RunState.FAILED, RunState.CANCELLED, RunState.SKIPPED, RunState.LOST}
)


def to_ms(dt: datetime) -> int:
    """An aware datetime as integer UTC milliseconds (naive datetimes are taken as UTC)."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return round(dt.timestamp() * 1000)


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def iso(ms: int | None) -> str | None:
    """Milliseconds as an ISO 8601 UTC instant with millisecond precision."""
    if ms is None:
        return None
    return from_ms(int(ms)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def task_id_for(entry: str, due_ms: int, prefix: str = "beat-claims") -> str:
    """The task id of an occurrence: stable across beats and across re-sends. The key
    prefix is part of it, so two apps sharing a result backend never share an id."""
    return str(uuid.uuid5(TASK_ID_NAMESPACE, f"{prefix}\x00{entry}\x00{due_ms}"))


@dataclass(frozen=True)
class Owner:
    """One beat process. ``id`` is random per process, so a restarted beat is a new owner."""

    id: str
    host: str
    pid: int
    started_at: float  # the process's start time (epoch seconds), to detect pid reuse

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:  # pragma: no cover - /proc unavailable
            started = time.time()
        return cls(id=uuid.uuid4().hex, host=socket.gethostname(), pid=pid, started_at=started)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "host": self.host, "pid": self.pid, "started_at": self.started_at}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Owner:
        return cls(
            id=str(data["id"]),
            host=str(data.get("host", "")),
            pid=int(data.get("pid", 0)),
            started_at=float(data.get("started_at", 0.0)),
        )

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}/{self.id[:8]}"


def process_is_gone(host: str, pid: int, started_at: float) -> bool | None:
    """Whether a process known by (host, pid, start time) is certainly gone.

    ``None`` when this host cannot tell (the process ran on another host). A pid that now
    belongs to a process started later than the recorded one was reused: the original is
    gone.
    """
    if host != socket.gethostname():
        return None
    try:
        proc = psutil.Process(pid)
        created = proc.create_time()
        if proc.status() == psutil.STATUS_ZOMBIE:
            return True
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return None
    return started_at > 0 and created > started_at + 1.0


@dataclass
class Run:
    """The record of one occurrence (entry, due instant)."""

    entry: str
    due: int
    state: RunState
    token: int = 0
    owner: str | None = None
    task_id: str | None = None
    claimed_at: int | None = None
    sent_at: int | None = None
    started_at: int | None = None
    finished_at: int | None = None
    worker: str | None = None
    worker_pid: int | None = None
    reason: str | None = None
    exc_type: str | None = None
    exc_message: str | None = None
    reclaimed_from: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _FIELDS = (
        "token", "owner", "task_id", "claimed_at", "sent_at", "started_at", "finished_at",
        "worker", "worker_pid", "reason", "exc_type", "exc_message", "reclaimed_from",
    )

    @classmethod
    def from_record(cls, entry: str, record: dict[str, Any]) -> Run:
        known = {k: record.get(k) for k in cls._FIELDS}
        extra = {
            k: v for k, v in record.items() if k not in cls._FIELDS and k not in ("due", "state")
        }
        token = known.pop("token") or 0
        return cls(
            entry=entry,
            due=int(record["due"]),
            state=RunState(record["state"]),
            token=int(token),
            extra=extra,
            **known,
        )

    def as_dict(self) -> dict[str, Any]:
        """The run as JSON-ready data, with instants in ISO 8601 UTC."""
        data: dict[str, Any] = {
            "entry": self.entry,
            "due": iso(self.due),
            "due_ms": self.due,
            "state": self.state.value,
            "token": self.token,
            "owner": self.owner,
            "task_id": self.task_id,
            "claimed_at": iso(self.claimed_at),
            "sent_at": iso(self.sent_at),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "worker": self.worker,
            "worker_pid": self.worker_pid,
            "reason": self.reason,
            "exc_type": self.exc_type,
            "exc_message": self.exc_message,
            "reclaimed_from": self.reclaimed_from,
        }
        data.update({k: v for k, v in self.extra.items()
                 if k in ("retries", "manual", "requested_by", "released_by")})
        return data
