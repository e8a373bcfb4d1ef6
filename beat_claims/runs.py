"""What the store records: runs, their states, and the beats that own them."""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from hashlib import sha1 as _sha1
from typing import Any

import psutil

from .enums import FINAL_STATES, Reason, RunState

#: Namespace for task ids derived from occurrences: the same occurrence always gets the
#: same task id, on every beat.
TASK_ID_NAMESPACE = uuid.UUID("6f1c5a52-9a0e-4d59-8a43-6d1f0c1f7b2e")
_NAMESPACE_BYTES = TASK_ID_NAMESPACE.bytes

#: The message header a run is published with.
HEADER = "beat_claims"


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


def _uuid5(name: str) -> str:
    """``str(uuid.uuid5(TASK_ID_NAMESPACE, name))``, in a third of its time (a run's id is
    made twice a run: with its claim, and for its check)."""
    digest = _sha1(_NAMESPACE_BYTES + name.encode()).digest()
    # (the version, 5, in the high nibble of byte 6; the RFC 4122 variant in byte 8)
    h = (digest[:6] + bytes(((digest[6] & 0x0F) | 0x50, digest[7], (digest[8] & 0x3F) | 0x80))
         + digest[9:16]).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def task_id_for(entry: str, due_ms: int, prefix: str = "beat-claims") -> str:
    """The task id of a scheduled occurrence: stable across beats and across re-sends.
    The key prefix is part of it, so two apps sharing a result backend never share an id.
    """
    return _uuid5(f"{prefix}\x00{entry}\x00{due_ms}")


def manual_task_id_for(entry: str, due_ms: int, token: int,
                       prefix: str = "beat-claims") -> str:
    """The task id of an operator's run (run now, backfill), claimed with ``token``.

    Such a run may replace, at the same instant, a run that was skipped, lost or
    cancelled: sharing that run's id, its message would be discarded by a worker told to
    revoke the old one (workers keep revoked ids for hours, ``--statedb`` across
    restarts), and the result backend would mix the two results. The claim's token makes
    it an id of its own, the same for every delivery of that claim; a scheduled run's id
    (:func:`task_id_for`) never depends on the token.
    """
    return _uuid5(f"{prefix}\x00{entry}\x00{due_ms}\x00manual\x00{token}")


@dataclass(frozen=True)
class Owner:
    """One beat process. ``id`` is random per process, so a restarted beat is a new owner."""

    id: str
    host: str
    pid: int
    started_at: float  # when the process started (epoch seconds): for people only
    process: str = ""  # the process's identity on its host, to detect pid reuse
    #: The entries of its beat_schedule whose definition differs from the store's (it
    #: sends the stored one): written with its heartbeat, for ``claims status``/``health``.
    schedule_differs: tuple[str, ...] = ()

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:  # pragma: no cover - /proc unavailable
            started = time.time()
        return cls(id=uuid.uuid4().hex, host=socket.gethostname(), pid=pid, started_at=started,
                   process=process_identity(pid) or "")

    def as_dict(self) -> dict[str, Any]:
        out = {"id": self.id, "host": self.host, "pid": self.pid,
               "started_at": self.started_at, "process": self.process}
        if self.schedule_differs:
            out["schedule_differs"] = list(self.schedule_differs)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Owner:
        return cls(
            id=str(data["id"]),
            host=str(data.get("host", "")),
            pid=int(data.get("pid", 0)),
            started_at=float(data.get("started_at", 0.0)),
            process=str(data.get("process", "")),
            schedule_differs=_names(data.get("schedule_differs")),
        )

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}/{self.id[:8]}"


#: The most entries a beat lists in ``Owner.schedule_differs``.
MAX_DIFFERS = 20


def _names(raw: Any) -> tuple[str, ...]:
    """Entry names as an owner's record holds them (anything else: none)."""
    if not isinstance(raw, list):
        return ()
    return tuple(str(name) for name in raw[:MAX_DIFFERS] if isinstance(name, str))


def process_identity(pid: int) -> str | None:
    """Who the process ``pid`` of this host is, whatever the wall clock does: on Linux the
    boot's id, the pid namespace the number ``pid`` belongs to (this process's: two
    containers that report one hostname each have a pid 1) and the process's start in
    clock ticks since boot (psutil's create_time moves with a step of the wall clock);
    elsewhere its create time. None if there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = f.read().rsplit(")", 1)[1].split()[19]
        return f"{_pid_space()}:{ticks}"
    except (OSError, IndexError):
        pass
    try:
        return f"ct:{psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return None


def _pid_space() -> str:
    """Where this process's pids are numbered: the boot's id and this process's pid
    namespace (``boot:inode``). OSError where /proc does not tell."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    namespace = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    return f"{boot}:{namespace.removeprefix('pid:[').removesuffix(']')}"


def _numbered_elsewhere(process: str) -> bool:
    """Whether a Linux identity (``boot:namespace:ticks``) was taken where pids are
    numbered otherwise than in this process: another boot (another machine of the same
    hostname), or another pid namespace (a container): its pid says nothing here."""
    parts = process.split(":")
    if len(parts) != 3 or parts[0] == "ct":
        return False  # (an identity of another form: create times, or an older version's)
    try:
        return f"{parts[0]}:{parts[1]}" != _pid_space()
    except OSError:
        return True


def process_is_gone(host: str, pid: int, process: str) -> bool | None:
    """Whether a process known by (host, pid, identity) is certainly gone.

    ``None`` when this host cannot tell (the process ran on another host, in another pid
    namespace or boot of a host of the same name, or its identity was not recorded). A
    pid that now belongs to another process was reused: the original is gone.
    """
    if host != socket.gethostname() or not process or _numbered_elsewhere(process):
        return None
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return None
    now = process_identity(pid)
    if now is None:
        return True
    parts = now.split(":")
    if len(parts) == 3 and process.count(":") == 1 and not process.startswith("ct:"):
        now = f"{parts[0]}:{parts[2]}"  # an older version's identity: boot:ticks
    return now != process


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
    reason: Reason | None = None
    exc_type: str | None = None
    exc_message: str | None = None
    reclaimed_from: str | None = None
    manual: bool = False
    requested_by: str | None = None
    released_by: str | None = None
    retries: int = 0
    attempts: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    _INTS = ("token", "claimed_at", "sent_at", "started_at", "finished_at", "worker_pid",
             "retries", "attempts")
    _STRS = ("owner", "task_id", "worker", "exc_type", "exc_message", "reclaimed_from",
             "requested_by", "released_by")

    @classmethod
    def from_record(cls, entry: str, record: dict[str, Any]) -> Run:
        """A run from its stored record. Raises ValueError for a record that cannot be a
        run (no due instant, an unknown state, a field of the wrong type)."""
        if not isinstance(record, dict):
            raise ValueError(f"not a record: {record!r}")
        values: dict[str, Any] = {}
        for name in cls._INTS:
            value = record.get(name)
            if value is not None:
                values[name] = _int(name, value)
        for name in cls._STRS:
            value = record.get(name)
            if value is not None:
                values[name] = str(value)
        reason = record.get("reason")
        known = cls._INTS + cls._STRS + ("due", "state", "reason", "manual")
        return cls(
            entry=entry,
            due=_int("due", record.get("due")),
            state=RunState(record.get("state")),
            reason=Reason(reason) if reason in Reason._value2member_map_ else None,
            manual=bool(record.get("manual")),
            extra={k: v for k, v in record.items() if k not in known},
            **values,
        )

    def to_record(self) -> dict[str, Any]:
        """The stored form: JSON-ready, without empty fields."""
        record: dict[str, Any] = dict(self.extra)
        record.update(due=self.due, state=self.state.value)
        for name in self._INTS + self._STRS:
            value = getattr(self, name)
            if value not in (None, 0, ""):
                record[name] = value
        if self.reason is not None:
            record["reason"] = self.reason.value
        if self.manual:
            record["manual"] = True
        return record

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
            "reason": self.reason.value if self.reason is not None else None,
            "exc_type": self.exc_type,
            "exc_message": self.exc_message,
            "reclaimed_from": self.reclaimed_from,
        }
        if self.retries:
            data["retries"] = self.retries
        if self.attempts:
            data["attempts"] = self.attempts
        if self.manual:
            data["manual"] = True
            data["requested_by"] = self.requested_by
        if self.released_by:
            data["released_by"] = self.released_by
        return data


def _int(name: str, value: Any) -> int:
    """An integer field of a record; floats that are whole numbers are accepted (JSON from
    Lua encodes big integers as floats), anything else is a bad record."""
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    raise ValueError(f"{name}={value!r} is not a number")


__all__ = ["FINAL_STATES", "HEADER", "Owner", "Run", "RunState", "from_ms", "iso",
           "manual_task_id_for", "process_is_gone", "task_id_for", "to_ms"]
