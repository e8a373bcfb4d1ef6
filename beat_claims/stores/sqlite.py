"""The SQLite store: one file shared by the beats, workers and operators of one host.

Each transition is one transaction (``BEGIN IMMEDIATE``: one writer at a time, waiting up to
the busy timeout), with the same semantics as the Redis store's scripts, step by step. A
call with many items runs them in chunks, one transaction per chunk and a savepoint per
item, so that a burst costs one commit per chunk and an item that fails (a record that
cannot be read) is rolled back alone. WAL mode: readers never wait for the writer.

"Now" is this host's clock, read at each transition: the store is for one host only (the
beat is warned when owners from other hosts heartbeat into the same file).

Table layout (``P`` is ``beat_claims_key_prefix`` made an identifier: ``beat-claims`` gives
``beat_claims_runs``...; two apps with two prefixes share a file). The run's JSON record
is the truth; its index columns are written with it, in the same statement, so the sweeps
find every run from the records alone.

================  ======================================================================
``P_meta``        key -> value: schema ``version``, ``prefix``, the store's id
                  (``store_id``: made with the tables, kept as long as the file keeps its
                  records), the epoch (``epoch``, ``settle_until``, ``epoch_since``,
                  ``epoch_file``: the file's device and inode), the shared anchoring instant
                  (``anchoring``, ``anchoring_until``), the change log's sequence
                  (``changes_seq``: the last number handed out; ``changes_dropped``: the
                  newest number of an entry that left the log, raised by a trigger when an
                  entry with one is deleted)
``P_entries``     name -> description, anchor, checkpoint, token; an operator's pause
                  (paused_by, paused_note, paused_at: NULL when not paused) and the last
                  resume (resumed_by, resumed_at, and last_paused_at: when the pause it
                  ended began); registrants (JSON: the beats that registered it, owner id
                  -> when; NULL: none recorded); horizon (the newest instant whose run a
                  trim removed; NULL: none); its definition (definition: JSON text, NULL in
                  a tombstone; version: 0 when it never had one; origin, changed_by,
                  changed_at; change_id: the last change's) and changed_seq (its place in
                  the change log: the sequence number of its last definition change;
                  NULL: not in the log, or a tombstone past TOMBSTONE_KEPT_MS); next_due
                  (the due index: its next due instant, ms; NOT_DUE, -1: not due; NULL:
                  never indexed), written in the transaction that moves the checkpoint or
                  changes the definition
``P_runs``        (entry, due) -> record (JSON); index columns: kind (``due``,
                  ``waiting``, ``held``, ``open``; NULL once final or unreadable), since
                  (what the sweeps compare with their cutoffs), owner and token (held
                  runs), busy (1 while being sent, sent or started); place (``h``: in the
                  history, ``x``: presumed lost, kept a week; NULL: neither), lost_at
``P_owners``      owner id -> JSON (host, pid, start time), heartbeat expiry (ms)
``P_tasks``       task id -> entry, due, token of the run a delivery of it started; the
                  row goes with its run (a trigger on ``P_runs``: trimmed from the
                  history or the lost keep, forgotten), so the table is bounded by the
                  history. expires_at: schema 1's expiry, written far ahead (processes of
                  schema 1 still connected to a file migrated under them read it)
================  ======================================================================

Indexes: entries (changed_seq) where set (the change feed), (name) where it has or had a
definition (definitions in name order), (changed_at) of the tombstones still in the log,
(next_due, name) where next_due >= 0 (what falls due), (name) where next_due is NULL (a
rebuild sweep's pages); runs (kind,
since) where kind is set (the sweeps: due, waiting, held, open runs, oldest first,
whatever the number of entries); runs (entry, due) where kind is ``due``
(what a claim takes), where kind is ``waiting`` (what overlap="buffer_one" keeps for
later), where busy (what overlap="skip" and "buffer_one" wait for), where place is ``h``
(the history); runs (entry, lost_at) where place is ``x``; owners (expires_at); tasks
(entry, due).

Schema versions: 1 (task ids kept a week), 2 (task ids go with their run; the store's id),
3 (an entry's pause and last resume; waiting runs), 4 (when the pause the last resume
ended began: ``last_paused_at``), 5 (``P_workers``: worker processes' liveness, id ->
record (JSON), expires_at; removed ``worker_records_kept`` after they lapse; an entry's
registrants and history horizon), 6 (an entry's definition, its version and the change
log), 7 (the due index: next_due). A file of an older schema is migrated when it is
opened: from 1, task ids whose run is gone are removed; from 2, the entries table gets the
pause's columns; from 3, ``last_paused_at`` (NULL: no last pause); from 4, the workers
table is made, and ``registrants`` and ``horizon`` added (NULL: none recorded); from 5,
the definition's columns (version 0: none) and the change log's indexes; from 6,
``next_due`` (NULL: never indexed, until a rebuild sweep indexes it) and its indexes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import socket
import sqlite3
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from celery.utils.log import get_logger

from ..enums import FINAL_STATES, Overlap, Reason, RunState, StartVerdict
from ..runs import Owner, Run, iso
from ..urls import redact_url
from .base import (
    CHANGES_PER_MS,
    DUE_AT_ONCE,
    TOKENS_PER_MS,
    TOMBSTONES_DROPPED,
    BackfillForgotten,
    BackfillRefused,
    BackfillResult,
    ChangeCursor,
    Changes,
    Check,
    CheckResult,
    CheckVerdict,
    Claim,
    ClaimPlan,
    ClaimResult,
    ClaimStatus,
    Continuity,
    DefinitionResult,
    DefinitionWrite,
    Delivery,
    DueEntry,
    EntryRecord,
    EntrySeed,
    EntryState,
    Heartbeat,
    HeldRun,
    IndexWrite,
    LiveQuery,
    LiveRuns,
    LogRead,
    OpenRun,
    Outcome,
    OwnerStatus,
    Pause,
    Reclaim,
    Release,
    RunRef,
    StartDecision,
    Store,
    StoreConfigurationError,
    StoredDefinition,
    StoreError,
    Unindexed,
    WorkerLiveness,
    WorkerLivenessRead,
    WorkerProcess,
    WriteStatus,
    Written,
    Wrote,
    checked_index_writes,
    checked_plans,
    checked_writes,
    definition_result,
    due_cursor,
    follow,
    in_last_pause,
    page_limit,
    read_worker_record,
    registrants_from_json,
    stored_definition,
    went_back_from,
    worker_id,
    worker_ttl_ms,
    written_next_due,
)

logger = get_logger("celery.beat.claims")

#: The layout of the tables above. A file written by a newer version is refused; an older
#: one is migrated.
SCHEMA_VERSION = 7
#: Beats that register new entries within this many ms of each other share the instant.
ANCHOR_SHARED_MS = 2000
#: How long a presumed-lost run is kept (for a late delivery).
WEEK_MS = 7 * 24 * 3600 * 1000
#: Owners whose heartbeat lapsed this long ago are forgotten (an hour).
FORGET_OWNERS_MS = 3600 * 1000
#: Items of one call per transaction: one commit for a burst, the writer lock held briefly.
CHUNK = 500
#: The expiry written in P_tasks.expires_at: schema 1's processes (which drop an expired id)
#: never drop one; the id goes with its run.
TASK_NEVER_EXPIRES = 2 ** 62
#: A commit is on disk before the call returns (the check before publish must be durable
#: before the message exists, even across a power loss).
SYNCHRONOUS = "FULL"

_STATES = frozenset(s.value for s in RunState)
_FINAL = frozenset(s.value for s in FINAL_STATES)
_HELD = frozenset(s.value for s in RunState if s.held)
_OPEN = frozenset(s.value for s in RunState if s.open)
_DUE, _CLAIMED, _SENDING, _SENT = (RunState.DUE.value, RunState.CLAIMED.value,
                                   RunState.SENDING.value, RunState.SENT.value)
_STARTED, _LOST, _SKIPPED, _FAILED = (RunState.STARTED.value, RunState.LOST.value,
                                      RunState.SKIPPED.value, RunState.FAILED.value)
_WAITING, _CANCELLED = RunState.WAITING.value, RunState.CANCELLED.value
#: What a backfill records again: runs that ended without running.
_REDONE = frozenset({_SKIPPED, _LOST, _CANCELLED})
#: The entries table's columns of schema 3 (an operator's pause, the last resume).
_PAUSE_COLUMNS = (("paused_by", "TEXT"), ("paused_note", "TEXT"), ("paused_at", "INTEGER"),
                  ("resumed_by", "TEXT"), ("resumed_at", "INTEGER"))
#: The entries table's column of schema 4: when the pause the last resume ended began.
_LAST_PAUSE_COLUMNS = (("last_paused_at", "INTEGER"),)
#: The entries table's columns of schema 5: the beats that registered the entry, and its
#: history horizon.
_OPERATOR_COLUMNS = (("registrants", "TEXT"), ("horizon", "INTEGER"))
#: The entries table's columns of schema 6: the entry's definition and its change log place.
_DEFINITION_COLUMNS = (("definition", "TEXT"), ("version", "INTEGER NOT NULL DEFAULT 0"),
                       ("origin", "TEXT"), ("changed_by", "TEXT"), ("changed_at", "INTEGER"),
                       ("change_id", "TEXT"), ("changed_seq", "INTEGER"))
#: The entries table's column of schema 7: the entry's next due instant (the due index).
_INDEX_COLUMNS = (("next_due", "INTEGER"),)
_NUMBER_FIELDS = ("due", "token", "claimed_at", "sending_at", "sent_at", "started_at",
                  "finished_at", "released_at", "revived_at", "worker_pid", "retries",
                  "attempts", "reclaims", "deliveries", "waiting_at")

#: sqlite3 primary result codes.
_BUSY, _LOCKED, _READONLY, _CORRUPT, _CANTOPEN, _NOTADB, _PERM, _AUTH = 5, 6, 8, 11, 14, 26, 3, 23
#: At start these mean the path is wrong, not that the store is down for a while.
_CONFIG_CODES = frozenset({_READONLY, _CORRUPT, _CANTOPEN, _NOTADB, _PERM, _AUTH})

Record = dict[str, Any]
T = TypeVar("T")
I = TypeVar("I")  # noqa: E741


def _now() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Tables:
    """The quoted table names of one prefix."""

    meta: str
    entries: str
    runs: str
    owners: str
    tasks: str
    base: str

    @classmethod
    def for_prefix(cls, prefix: str) -> Tables:
        base = re.sub(r"[^0-9A-Za-z_]", "_", prefix) or "beat_claims"
        if base.lower().startswith("sqlite"):  # names SQLite reserves for itself
            base = f"bc_{base}"
        def name(table: str) -> str:
            return f'"{base}_{table}"'

        return cls(name("meta"), name("entries"), name("runs"), name("owners"),
                   name("tasks"), base)


def _schema(t: Tables) -> list[str]:
    b = t.base
    return [
        f"CREATE TABLE IF NOT EXISTS {t.entries} (name TEXT PRIMARY KEY,"
        " description TEXT NOT NULL DEFAULT '', anchor INTEGER, checkpoint INTEGER,"
        " token INTEGER, "
        + ", ".join(f"{name} {kind}" for name, kind
                    in _PAUSE_COLUMNS + _LAST_PAUSE_COLUMNS + _OPERATOR_COLUMNS
                    + _DEFINITION_COLUMNS + _INDEX_COLUMNS)
        + ") WITHOUT ROWID",
        f"CREATE TABLE IF NOT EXISTS {t.runs} (entry TEXT NOT NULL, due INTEGER NOT NULL,"
        " record TEXT, kind TEXT, since INTEGER, owner TEXT, token INTEGER, busy INTEGER,"
        " place TEXT, lost_at INTEGER, PRIMARY KEY (entry, due)) WITHOUT ROWID",
        f'CREATE INDEX IF NOT EXISTS "{b}_runs_sweep" ON {t.runs} (kind, since)'
        " WHERE kind IS NOT NULL",
        f'CREATE INDEX IF NOT EXISTS "{b}_runs_due" ON {t.runs} (entry, due)'
        " WHERE kind = 'due'",
        f'CREATE INDEX IF NOT EXISTS "{b}_runs_busy" ON {t.runs} (entry, due)'
        " WHERE busy = 1",
        f'CREATE INDEX IF NOT EXISTS "{b}_runs_waiting" ON {t.runs} (entry, due)'
        " WHERE kind = 'waiting'",
        f'CREATE INDEX IF NOT EXISTS "{b}_runs_history" ON {t.runs} (entry, due)'
        " WHERE place = 'h'",
        f'CREATE INDEX IF NOT EXISTS "{b}_runs_lost" ON {t.runs} (entry, lost_at)'
        " WHERE place = 'x'",
        f"CREATE TABLE IF NOT EXISTS {t.owners} (id TEXT PRIMARY KEY, record TEXT NOT NULL,"
        " expires_at INTEGER NOT NULL) WITHOUT ROWID",
        f'CREATE INDEX IF NOT EXISTS "{b}_owners_expiry" ON {t.owners} (expires_at)',
        f"CREATE TABLE IF NOT EXISTS {t.tasks} (task_id TEXT PRIMARY KEY, entry TEXT NOT NULL,"
        " due INTEGER NOT NULL, token INTEGER NOT NULL, expires_at INTEGER NOT NULL)"
        " WITHOUT ROWID",
        f'DROP INDEX IF EXISTS "{b}_tasks_expiry"',  # schema 1's
        f'CREATE INDEX IF NOT EXISTS "{b}_tasks_run" ON {t.tasks} (entry, due)',
        # A run that leaves the store takes the task ids it was started under with it,
        # whoever deletes it (a trim, a forget, an operator with the sqlite3 shell).
        f'CREATE TRIGGER IF NOT EXISTS "{b}_runs_tasks" AFTER DELETE ON {t.runs}'
        f" BEGIN DELETE FROM {t.tasks} WHERE entry = old.entry AND due = old.due; END",
    ]


Migration = str | Callable[[sqlite3.Connection], None]


def _migrations(t: Tables) -> dict[int, list[Migration]]:
    """What brings a file of schema N to N + 1, once the tables of SCHEMA_VERSION exist
    (a statement, or a function of the connection)."""
    return {
        # Task ids go with their run: those whose run is gone are removed, and the others
        # never expire (schema 1's processes still connected drop expired ids).
        1: [f"DELETE FROM {t.tasks} WHERE NOT EXISTS (SELECT 1 FROM {t.runs} r"
            f" WHERE r.entry = {t.tasks}.entry AND r.due = {t.tasks}.due)",
            f"UPDATE {t.tasks} SET expires_at = {TASK_NEVER_EXPIRES}"],
        # An entry's pause and last resume: NULL in every existing row (not paused).
        # Processes of schema 2 still connected name their columns: they go on.
        2: [lambda db: _add_columns(db, t.entries, _PAUSE_COLUMNS)],
        # When the last pause began, kept after its resume: NULL in every existing row (no
        # interval: an entry resumed before the migration skips nothing more). Processes of
        # schema 3 still connected name their columns: they go on (their resume keeps no
        # interval).
        3: [lambda db: _add_columns(db, t.entries, _LAST_PAUSE_COLUMNS)],
        # Registrants and the history horizon: NULL in every existing row (none recorded:
        # such an entry is judged as before, by the schedule, until a beat registers it).
        # The worker processes' liveness has a table of its own, made with the others
        # (processes of schema 4 still connected never read it: they fence as before).
        4: [lambda db: _add_columns(db, t.entries, _OPERATOR_COLUMNS)],
        # An entry's definition: version 0 in every existing row (none). Processes of schema
        # 5 still connected name their columns: they go on (their prune does not know a
        # definition: stop them before entries get one).
        5: [lambda db: _add_columns(db, t.entries, _DEFINITION_COLUMNS)],
        # The due index: NULL in every existing row (not indexed: a rebuild sweep pages
        # through them, Store.unindexed, and indexes each). Processes of schema 6 still
        # connected never write it: their claims leave it earlier than truth (a read), and
        # their definition writes leave it as it was (the beats following the change feed
        # index those entries again).
        6: [lambda db: _add_columns(db, t.entries, _INDEX_COLUMNS)],
    }


#: An entry that has or had a definition (or a record of one that cannot be read).
_DEFINED = "(version <> 0 OR definition IS NOT NULL)"


def _definitions_schema(t: Tables) -> list[str]:
    """The change log's indexes and trigger (schema 6), made once the columns exist."""
    b = t.base
    return [
        f'CREATE INDEX IF NOT EXISTS "{b}_entries_changes" ON {t.entries} (changed_seq)'
        " WHERE changed_seq IS NOT NULL",
        f'CREATE INDEX IF NOT EXISTS "{b}_entries_defined" ON {t.entries} (name)'
        f" WHERE {_DEFINED}",
        f'CREATE INDEX IF NOT EXISTS "{b}_entries_gone" ON {t.entries} (changed_at)'
        " WHERE definition IS NULL AND changed_seq IS NOT NULL AND version <> 0",
        # The due index (schema 7): what is due, in (next_due, name) order; and what has
        # no next_due at all, in name order (a rebuild sweep's pages).
        f'CREATE INDEX IF NOT EXISTS "{b}_entries_next" ON {t.entries} (next_due, name)'
        " WHERE next_due >= 0",
        f'CREATE INDEX IF NOT EXISTS "{b}_entries_unindexed" ON {t.entries} (name)'
        " WHERE next_due IS NULL",
        # An entry that leaves the store (a prune, an operator with the sqlite3 shell)
        # leaves the change log: its number is a dropped one (a reader behind it reloads).
        f'CREATE TRIGGER IF NOT EXISTS "{b}_entries_unlog" AFTER DELETE ON {t.entries}'
        " WHEN old.changed_seq IS NOT NULL BEGIN"
        f" INSERT INTO {t.meta} (key, value) VALUES ('changes_dropped', old.changed_seq)"
        " ON CONFLICT (key) DO UPDATE SET value = max(CAST(value AS INTEGER),"
        " excluded.value); END",
    ]


def _definition_statements(t: Tables) -> dict[str, str]:
    """The statements of definitions and the change feed (schema 6)."""
    fields = "definition, version, origin, changed_by, changed_at"
    defined = f'{t.entries} INDEXED BY "{t.base}_entries_defined"'
    changes = f'{t.entries} INDEXED BY "{t.base}_entries_changes"'
    gone = f'{t.entries} INDEXED BY "{t.base}_entries_gone"'
    return {
        "def_get": f"SELECT {fields}, change_id FROM {t.entries} WHERE name = ?",
        "def_put": f"UPDATE {t.entries} SET definition = ?, version = ?, origin = ?,"
                   " changed_by = ?, changed_at = ?, change_id = ?, changed_seq = ?"
                   " WHERE name = ?",
        "def_live": f"SELECT 1 FROM {t.entries} WHERE name = ? AND definition IS NOT NULL",
        "defs_page": f"SELECT name, {fields} FROM {defined} WHERE {_DEFINED}"
                     " AND name > ? ORDER BY name LIMIT ?",
        "changes_after": f"SELECT name, changed_seq, {fields} FROM {changes}"
                         " WHERE changed_seq > ? ORDER BY changed_seq LIMIT ?",
        "changes_top": f"SELECT name, changed_seq FROM {changes} WHERE changed_seq > 0"
                       " ORDER BY changed_seq DESC LIMIT 1",
        "changes_seen": f"SELECT changed_seq FROM {t.entries} WHERE name = ?",
        "changes_gone": f"SELECT name, changed_seq FROM {gone} WHERE definition IS NULL"
                        " AND changed_seq IS NOT NULL AND version <> 0 AND changed_at < ?"
                        " ORDER BY changed_at LIMIT ?",
        "changes_unlog": f"UPDATE {t.entries} SET changed_seq = NULL WHERE name = ?",
        "next_set": f"UPDATE {t.entries} SET next_due = ? WHERE name = ?",
        "next_state": f"SELECT anchor, checkpoint, version FROM {t.entries} WHERE name = ?",
        "next_due": f"SELECT name, next_due, anchor, checkpoint, token, version"
                    f' FROM {t.entries} INDEXED BY "{t.base}_entries_next"'
                    " WHERE next_due >= 0 AND next_due <= ? AND (next_due > ?"
                    " OR (next_due = ? AND name > ?)) ORDER BY next_due, name LIMIT ?",
        "next_missing": f"SELECT name FROM {t.entries}"
                        f' INDEXED BY "{t.base}_entries_unindexed"'
                        " WHERE next_due IS NULL AND name > ? ORDER BY name LIMIT ?",
    }


def _workers_table(t: Tables) -> str:
    return f'"{t.base}_workers"'


def _workers_schema(t: Tables) -> list[str]:
    """The worker processes' liveness (schema 5): id (``worker_id``) -> record (JSON: node
    name, pid, process identity, renewed_at, expires_at), and its expiry for the clean-up."""
    return [f"CREATE TABLE IF NOT EXISTS {_workers_table(t)} (id TEXT PRIMARY KEY,"
            " record TEXT NOT NULL, expires_at INTEGER NOT NULL) WITHOUT ROWID",
            f'CREATE INDEX IF NOT EXISTS "{t.base}_workers_expiry" ON {_workers_table(t)}'
            " (expires_at)"]


def _workers_statements(t: Tables) -> dict[str, str]:
    w = _workers_table(t)
    return {
        "put": f"INSERT INTO {w} (id, record, expires_at) VALUES (?, ?, ?)"
               " ON CONFLICT (id) DO UPDATE SET record = excluded.record,"
               " expires_at = excluded.expires_at",
        # A hundred at most a heartbeat: the clean-up is bounded, whatever the pile.
        "forget": f"DELETE FROM {w} WHERE id IN (SELECT id FROM {w} WHERE expires_at < ?"
                  " ORDER BY expires_at LIMIT 100)",
        "get": f"SELECT record FROM {w} WHERE id = ?",
    }


def _add_columns(db: sqlite3.Connection, table: str,
                 columns: Sequence[tuple[str, str]]) -> None:
    """Add the columns the table does not have yet (a table made again since has them)."""
    have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    for name, kind in columns:
        if name not in have:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")


def _statements(t: Tables) -> dict[str, str]:
    """Every statement the transitions run, once per store (sqlite3 caches them)."""
    due = f'{t.runs} INDEXED BY "{t.base}_runs_due"'
    busy = f'{t.runs} INDEXED BY "{t.base}_runs_busy"'
    waiting = f'{t.runs} INDEXED BY "{t.base}_runs_waiting"'
    pause = ", ".join(name for name, _kind
                      in _PAUSE_COLUMNS + _LAST_PAUSE_COLUMNS + _OPERATOR_COLUMNS)
    history = f'{t.runs} INDEXED BY "{t.base}_runs_history"'
    lost = f'{t.runs} INDEXED BY "{t.base}_runs_lost"'
    return {
        "meta_get": f"SELECT value FROM {t.meta} WHERE key = ?",
        "meta_set": f"INSERT INTO {t.meta} (key, value) VALUES (?, ?)"
                    " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        "meta_add": f"INSERT INTO {t.meta} (key, value) VALUES (?, ?)"
                    " ON CONFLICT (key) DO NOTHING",
        "entry_get": f"SELECT anchor, checkpoint, token FROM {t.entries} WHERE name = ?",
        # (a new entry is indexed due at once: DUE_AT_ONCE)
        "entry_put": f"INSERT INTO {t.entries} (name, description, anchor, checkpoint, token,"
                     f" next_due) VALUES (?, ?, ?, ?, ?, {DUE_AT_ONCE})"
                     " ON CONFLICT (name) DO UPDATE SET"
                     " description = excluded.description, anchor = excluded.anchor,"
                     " checkpoint = excluded.checkpoint, token = excluded.token",
        "entry_move": f"UPDATE {t.entries} SET checkpoint = ?, token = ? WHERE name = ?",
        "entry_delete": f"DELETE FROM {t.entries} WHERE name = ?",
        "entry_read": f"SELECT name, description, anchor, checkpoint, token, {pause}"
                      f" FROM {t.entries} WHERE name = ?",
        "entries_all": f"SELECT name, description, anchor, checkpoint, token, {pause}"
                       f" FROM {t.entries} ORDER BY name",
        "entry_paused": f"SELECT paused_at IS NOT NULL FROM {t.entries} WHERE name = ?",
        "entry_registrants": f"SELECT registrants FROM {t.entries} WHERE name = ?",
        "entry_registrants_set": f"UPDATE {t.entries} SET registrants = ? WHERE name = ?",
        "entry_horizon": f"SELECT horizon FROM {t.entries} WHERE name = ?",
        "entry_horizon_set": f"UPDATE {t.entries} SET horizon = ? WHERE name = ?",
        "owners_alive": f"SELECT id FROM {t.owners} WHERE expires_at > ?",
        "entry_pause_of": f"SELECT paused_at IS NOT NULL, last_paused_at, resumed_at"
                          f" FROM {t.entries} WHERE name = ?",
        # Pausing a paused entry keeps its instant, and takes the new note and who.
        "entry_pause": f"UPDATE {t.entries} SET paused_by = ?, paused_note = ?,"
                       " paused_at = COALESCE(paused_at, ?) WHERE name = ?",
        "entry_resume": f"UPDATE {t.entries} SET paused_by = NULL, paused_note = NULL,"
                        " last_paused_at = paused_at, paused_at = NULL, resumed_by = ?,"
                        " resumed_at = ? WHERE name = ? AND paused_at IS NOT NULL",
        "run_get": f"SELECT record FROM {t.runs} WHERE entry = ? AND due = ?",
        "run_insert": f"INSERT INTO {t.runs} (entry, due, record, kind, since, owner, token,"
                      " busy, place) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'h')",
        "run_update": f"UPDATE {t.runs} SET record = ?, kind = ?, since = ?, owner = ?,"
                      " token = ?, busy = ? WHERE entry = ? AND due = ?",
        "run_unindex": f"UPDATE {t.runs} SET kind = NULL, since = NULL, owner = NULL,"
                       " token = NULL, busy = NULL WHERE entry = ? AND due = ?",
        "run_delete": f"DELETE FROM {t.runs} WHERE entry = ? AND due = ?",
        "run_place": f"UPDATE {t.runs} SET place = ?, lost_at = ? WHERE entry = ? AND due = ?",
        "runs_due": f"SELECT due, record FROM {due} WHERE entry = ? AND kind = 'due'"
                    " ORDER BY due",
        "runs_busy": f"SELECT due, record FROM {busy} WHERE entry = ? AND busy = 1"
                     " ORDER BY due",
        "runs_waiting": f"SELECT due, record FROM {waiting} WHERE entry = ?"
                        " AND kind = 'waiting' ORDER BY due",
        "runs_from": f"SELECT due FROM {t.runs} WHERE entry = ? AND due >= ? ORDER BY due",
        "runs_all": f"SELECT record FROM {t.runs} WHERE entry = ?",
        "runs_live": f"SELECT 1 FROM {t.runs} WHERE entry = ? AND kind IN ('held', 'open')"
                     " LIMIT 1",
        "runs_forget": f"DELETE FROM {t.runs} WHERE entry = ?",
        "history_all": f"SELECT due, record FROM {history} WHERE entry = ?"
                       " AND place = 'h' ORDER BY due",
        "history_count": f"SELECT COUNT(*) FROM {history} WHERE entry = ? AND place = 'h'",
        "history_live": f"SELECT COUNT(*) FROM {history} WHERE entry = ? AND place = 'h'"
                        " AND kind IS NOT NULL",
        "history_oldest": f"SELECT due, record FROM {history} WHERE entry = ?"
                          " AND place = 'h' ORDER BY due LIMIT ?",
        "history_newest": f"SELECT due, record FROM {history} WHERE entry = ?"
                          " AND place = 'h' ORDER BY due DESC LIMIT ?",
        "lost_count": f"SELECT COUNT(*) FROM {lost} WHERE entry = ? AND place = 'x'",
        "lost_expired": f"SELECT due FROM {lost} WHERE entry = ? AND place = 'x'"
                        " AND lost_at < ? ORDER BY lost_at, due",
        "lost_oldest": f"SELECT due FROM {lost} WHERE entry = ? AND place = 'x'"
                       " ORDER BY lost_at, due LIMIT ? OFFSET ?",
        "sweep_due": f"SELECT since, entry, due FROM {t.runs} WHERE kind = 'due'"
                     " ORDER BY since LIMIT ?",
        "sweep_waiting": f"SELECT since, entry, due FROM {t.runs} WHERE kind = 'waiting'"
                         " ORDER BY since LIMIT ?",
        "sweep_held": f"SELECT entry, due, owner, token, since FROM {t.runs}"
                      " WHERE kind = 'held' AND since < ? AND (since < ?"
                      " OR (owner = ? AND since < ?) OR (owner <> ? AND since < ?"
                      " AND owner NOT IN (SELECT value FROM json_each(?))))"
                      " ORDER BY since LIMIT ?",
        "sweep_open": f"SELECT entry, due, record, since FROM {t.runs} WHERE kind = 'open'"
                      " AND since > ? AND since < ? ORDER BY since LIMIT ?",
        "owner_put": f"INSERT INTO {t.owners} (id, record, expires_at) VALUES (?, ?, ?)"
                     " ON CONFLICT (id) DO UPDATE SET record = excluded.record,"
                     " expires_at = excluded.expires_at",
        "owner_known": f"SELECT 1 FROM {t.owners} WHERE id = ?",
        "owner_lapse": f"UPDATE {t.owners} SET expires_at = ? WHERE id = ?",
        "owners_forget": f"DELETE FROM {t.owners} WHERE expires_at < ?",
        "owners_all": f"SELECT id, record, expires_at FROM {t.owners} ORDER BY id",
        "owners_latest": f"SELECT MAX(expires_at) FROM {t.owners}",
        "task_put": f"INSERT INTO {t.tasks} (task_id, entry, due, token, expires_at)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (task_id) DO UPDATE SET"
                    " entry = excluded.entry, due = excluded.due, token = excluded.token,"
                    " expires_at = excluded.expires_at",
        "task_get": f"SELECT entry, due, token FROM {t.tasks} WHERE task_id = ?",
    }


# -- records ------------------------------------------------------------------------------
def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _parse(raw: Any, due: int) -> Record | Literal[False]:
    """A run's record, or False when it cannot be read (bad JSON, an unknown state, a number
    field that is not a number, another due instant): a bad record is never trusted."""
    if not isinstance(raw, str):
        return False
    try:
        run = json.loads(raw)
    except ValueError:
        return False
    if not isinstance(run, dict) or not isinstance(run.get("state"), str) or (
            run["state"] not in _STATES):
        return False
    for name in _NUMBER_FIELDS:
        if name in run and not _is_number(run[name]):
            return False
    d = run.get("due")
    if not _is_number(d) or d != due or (isinstance(d, float) and not d.is_integer()):
        return False
    if "owner" in run and not isinstance(run["owner"], str):
        return False
    return run


def _encode(run: Record) -> str:
    return json.dumps(run, separators=(",", ":"))


def _first(run: Record, *names: str) -> Any:
    """The first of these fields the record has (None when it has none)."""
    for name in names:
        value = run.get(name)
        if value is not None:
            return value
    return None


def _since(run: Record) -> int:
    """The instant a run last became what it is: what the sweeps compare with cutoffs."""
    state = run["state"]
    if state == _DUE:
        value = _first(run, "released_at", "claimed_at", "due")
    elif state == _WAITING:
        value = _first(run, "waiting_at", "claimed_at", "due")
    elif state in _HELD:
        value = _first(run, "sending_at", "claimed_at")
    else:
        value = _first(run, "revived_at", "started_at", "sent_at", "sending_at")
    return int(value or 0)


Index = tuple[str | None, int | None, str | None, int | None, int | None]


def _index(run: Record) -> Index:
    """The run's index columns: kind, since, owner, token (held runs), busy."""
    state = run["state"]
    if state in _FINAL:
        return None, None, None, None, None
    since = _since(run)
    if state == _DUE:
        return "due", since, None, None, None
    if state == _WAITING:  # held by no one, no message of its token exists: not busy
        return "waiting", since, None, None, None
    if state in _HELD:
        return ("held", since, str(run.get("owner") or ""), int(run.get("token") or 0),
                1 if state == _SENDING else None)
    return "open", since, None, None, 1


def _started_by(run: Record) -> tuple[str, int, str]:
    """The process that started the run: worker, pid (-1: none), identity ('' none)."""
    pid = run.get("worker_pid")
    identity = run.get("worker_process")
    return (str(run.get("worker") or ""), -1 if pid is None else int(pid),
            "" if identity is None else str(identity))


def _token_is(run: Record, token: int | None) -> bool:
    """Whether ``token`` (None: any) is the run's current token."""
    return token is None or int(run.get("token") or 0) == token


def _holds(run: Record, owner: str, token: int | None) -> bool:
    return run["state"] in _HELD and run.get("owner") == owner and _token_is(run, token)


def _handed_over(run: Record) -> bool:
    """Whether its holder passed the check before publish (a message may exist). A waiting
    run was not: its check recorded it waiting instead of sending it."""
    return run["state"] not in (_CLAIMED, _DUE, _WAITING)


def _manual(run: Record) -> bool:
    """An operator's request (run now, backfill): sent while the entry is paused, whatever
    else of the entry is unfinished."""
    return run.get("manual") not in (None, False)


def _overlaps(other: Record) -> bool:
    """Whether this run of the entry makes the next ones overlap: being sent, sent or
    started. A run registered again after a wipe as sent, that no worker has started since,
    may well be finished: it does not."""
    return (other["state"] == _SENDING or other["state"] in _OPEN) and not (
        other.get("reseeded") not in (None, False) and other["state"] == _SENT)


def _ran(run: Record) -> bool:
    """A run presumed lost that a worker started: it ran, or runs still, and may report
    (a backfill keeps it; its late outcome is recorded)."""
    return run["state"] == _LOST and run.get("started_at") is not None


def _ended_unrun(run: Record) -> bool:
    """A run that ended without running (skipped, cancelled, lost before any start): what
    a backfill replaces."""
    return run["state"] in _REDONE and not _ran(run)


def _sent_unstarted(run: Record) -> bool:
    """A run sent that no worker has started."""
    return run["state"] == RunState.SENT.value and run.get("started_at") is None


def _to_due(run: Record, by: str | None, now: int) -> None:
    """Due again, for any beat that has the entry; its next claim gets a fresh token."""
    if by is None:
        run.pop("released_by", None)
    else:
        run["released_by"] = by
    run.pop("owner", None)
    run["state"] = _DUE
    run["released_at"] = now


def _entry_int(value: Any) -> int | None:
    """An entry field as stored; ValueError when it is not an integer."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    raise ValueError(value)


def _maybe_int(value: Any) -> int | None:
    try:
        return _entry_int(value)
    except ValueError:
        return None


# -- errors -------------------------------------------------------------------------------
def _code(exc: sqlite3.Error) -> int | None:
    """The primary result code (Python >= 3.11), else one read from the message."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF
    text = str(exc).lower()
    for words, guess in (("locked", _BUSY), ("readonly", _READONLY), ("read-only", _READONLY),
                         ("unable to open", _CANTOPEN), ("malformed", _CORRUPT),
                         ("not a database", _NOTADB)):
        if words in text:
            return guess
    return None


def _is_outage(exc: BaseException) -> bool:
    """An error of the file or the connection (the whole call fails), not of one item."""
    if isinstance(exc, sqlite3.OperationalError):
        return True
    return isinstance(exc, sqlite3.DatabaseError) and _code(exc) in (_CORRUPT, _NOTADB)


def _missing_table(exc: sqlite3.Error) -> bool:
    return "no such table" in str(exc) or "no such index" in str(exc)


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _path_from_url(url: str) -> str:
    """The file of a ``sqlite:///relative.db`` or ``sqlite:////absolute.db`` URL."""
    scheme, sep, rest = url.partition("://")
    where = f"beat_claims_url={redact_url(url)!r}"
    if scheme.lower() != "sqlite" or not sep:
        raise StoreConfigurationError(f"{where}: not a sqlite:/// URL")
    if "?" in rest or "#" in rest:
        raise StoreConfigurationError(f"{where}: query parameters are not supported")
    if not rest.startswith("/") or rest == "/":
        raise StoreConfigurationError(
            f"{where}: write sqlite:///relative/path.db or sqlite:////absolute/path.db"
            " (three slashes, then the path)")
    path = rest[1:]
    if path == ":memory:":
        raise StoreConfigurationError(
            f"{where}: an in-memory database is not shared between processes; name a file")
    return path


#: What the heartbeat's look for a confirmed write answers when its entry is gone (_kept).
_REMOVED = "removed"


class RowStore(Store):
    """The transitions on the store's rows, one transaction each: the SQLite store's, and
    the MySQL store's (``mysql.py`` runs them on its server, with its connections, its
    clock and its locks)."""

    def __init__(self, path: str, prefix: str = "beat-claims", history_limit: int = 100,
                 timeout: float = 5.0, url: str = "") -> None:
        self.path = os.path.abspath(path)  # a later chdir (a daemon's) must not move it
        self.prefix = prefix
        self.history_limit = history_limit
        self.timeout = max(0.001, float(timeout))
        self._url = redact_url(url or f"sqlite:///{path}")
        self.tables = Tables.for_prefix(prefix)
        self._sql = {**_statements(self.tables), **_definition_statements(self.tables)}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._db_file: tuple[int, int] | None = None
        self._pid = os.getpid()
        #: Connections a fork left to this process: never used nor closed here (another
        #: process owns them), only kept from the garbage collector.
        self._inherited: list[sqlite3.Connection] = []
        self._foreign_hosts: set[str] = set()
        self._noted: set[tuple[str, int]] = set()  # unreadable runs reported (once each)
        #: The file the last heartbeat read the epoch of. Another file at the path (restored
        #: from a copy, deleted and recreated) is refused to everything but a heartbeat
        #: until one has read its epoch: a beat must learn that the store went back first.
        self._heartbeat_file: tuple[int, int] | None = None
        _STORES.add(self)

    @property
    def description(self) -> str:
        return f"sqlite:///{self.path} (prefix {self.prefix!r})"

    def _clock(self) -> int:
        """The store's clock (UTC ms): this host's (a subclass on a server reads its)."""
        return _now()

    def close(self) -> None:
        with self._locked():
            self._drop_connection()

    # -- connections --------------------------------------------------------------------
    def _check_path(self) -> None:
        where = f"beat_claims_url={self._url!r}"
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            raise StoreConfigurationError(f"{where}: the directory {directory} does not exist")
        if os.path.isdir(self.path):
            raise StoreConfigurationError(f"{where}: {self.path} is a directory")
        for path, what in ((self.path, "file"), (directory, "directory")):
            if os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
                raise StoreConfigurationError(
                    f"{where}: the {what} {path} is not writable{_read_only_fs(path)}: every"
                    " beat, worker and operator writes to it (and SQLite keeps the file's"
                    " -wal and -shm next to it)")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """This store's connection, for one thread at a time (bounded by the timeout)."""
        lock = self._lock
        if not lock.acquire(timeout=self.timeout):
            raise StoreError(f"{self.description}: busy in this process for {self.timeout}s")
        try:
            yield
        finally:
            lock.release()

    def _connection(self, starting: bool = False) -> sqlite3.Connection:
        """The open connection, reopened when the file at the path is another one (deleted
        and recreated, or replaced by a copy) or after a fork."""
        if os.getpid() != self._pid:  # forked without the hook below
            self._forget_connection()
        if self._db is not None and _file_id(self.path) != self._db_file:
            self._drop_connection()
        if self._db is None:
            self._db = self._open(starting)
        return self._db

    def _open(self, starting: bool) -> sqlite3.Connection:
        for stale in (self.path + "-wal", self.path + "-shm"):
            # A -wal left by a deleted file is that file's: a new file must not replay it.
            # (Seen before the file is found missing: a new file is created before its -wal,
            # so this is not the -wal of a file another process is creating.)
            if os.path.exists(stale) and not os.path.exists(self.path):
                logger.warning("beat-claims: removing %s, left by a deleted %s", stale,
                               self.path)
                with contextlib.suppress(OSError):
                    os.remove(stale)
        try:
            db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None,
                                 check_same_thread=False, cached_statements=256)
        except sqlite3.Error as exc:
            raise self._failure(exc, starting) from exc
        try:
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()
            if not mode or str(mode[0]).lower() != "wal":
                raise StoreConfigurationError(
                    f"beat_claims_url={self._url!r}: {self.path} cannot use WAL mode"
                    f" (journal_mode is {mode[0] if mode else None!r})")
            db.execute(f"PRAGMA synchronous = {SYNCHRONOUS}")
            self._set_up(db)
            self._db_file = _file_id(self.path)
        except StoreConfigurationError as exc:
            db.close()
            if starting:
                raise
            raise StoreError(str(exc)) from exc
        except sqlite3.Error as exc:
            db.close()
            raise self._failure(exc, starting) from exc
        return db

    def _set_up(self, db: sqlite3.Connection) -> None:
        """Create the tables (if missing), check the file's schema version and prefix, and
        migrate a file of an older schema."""
        t = self.tables
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(f"CREATE TABLE IF NOT EXISTS {t.meta} (key TEXT PRIMARY KEY,"
                       " value TEXT) WITHOUT ROWID")
            version = self._layout(db, SCHEMA_VERSION, f"{self.path} (tables {t.base}_*) was",
                                   "use another file")
            for statement in _schema(t) + _workers_schema(t):
                db.execute(statement)
            migrations = _migrations(t)
            for old in range(version, SCHEMA_VERSION):
                for migration in migrations[old]:
                    if isinstance(migration, str):
                        db.execute(migration)
                    else:
                        migration(db)
                logger.warning("beat-claims: %s (tables %s_*) migrated from schema version"
                               " %d to %d", self.path, t.base, old, old + 1)
            for statement in _definitions_schema(t):
                db.execute(statement)
            db.execute(self._sql["meta_set"], ("version", str(max(version, SCHEMA_VERSION))))
            db.execute(self._sql["meta_set"], ("prefix", self.prefix))
            # The store's id: made with its tables, and kept as long as they are.
            db.execute(self._sql["meta_add"], ("store_id", uuid.uuid4().hex))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _layout(self, db: sqlite3.Connection, latest: int, written: str, advice: str
                ) -> int:
        """The tables' layout version (``latest`` for new ones), once this code knows it and
        the tables are the prefix's; else StoreConfigurationError saying what to do."""
        t, where = self.tables, f"beat_claims_url={self._url!r}"
        row = db.execute(self._sql["meta_get"], ("version",)).fetchone()
        try:
            version = latest if row is None else int(row[0])
            if version < 1:
                raise ValueError(version)
        except (TypeError, ValueError):
            raise StoreConfigurationError(
                f"{where}: the tables {t.base}_* in {self.path} have an unreadable"
                f" schema version {row[0]!r}") from None
        if version > latest:
            raise StoreConfigurationError(
                f"{where}: {written} written by a newer beat-claims (schema version"
                f" {version}; this one knows up to {latest}): upgrade beat-claims here, or"
                f" {advice}")
        row = db.execute(self._sql["meta_get"], ("prefix",)).fetchone()
        if row is not None and row[0] != self.prefix:
            raise StoreConfigurationError(
                f"beat_claims_key_prefix={self.prefix!r}: the tables {t.base}_* in"
                f" {self.path} belong to the prefix {row[0]!r}; choose another prefix")
        return version

    def _failure(self, exc: sqlite3.Error, starting: bool = False) -> Exception:
        code = _code(exc)
        text = f"{type(exc).__name__}: {exc}"
        if code in (_BUSY, _LOCKED):
            return StoreError(f"{self.description}: busy for more than {self.timeout}s"
                              f" ({text})")
        if starting and (code in _CONFIG_CODES or code is None):
            return StoreConfigurationError(
                f"beat_claims_url={self._url!r}: {self.path} cannot be opened and written"
                f"{_read_only_fs(self.path)} ({text})")
        return StoreError(f"{self.description}: {text}")

    def _drop_connection(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
        self._db = None

    def _forget_connection(self) -> None:
        """In a forked child: the parent's connection is the parent's."""
        if self._db is not None:
            self._inherited.append(self._db)
        self._db = None
        self._pid = os.getpid()

    # -- transactions -------------------------------------------------------------------
    def _transaction(self, work: Callable[[sqlite3.Connection], T], write: bool = True,
                     heartbeat: bool = False, *, turn: bool = False) -> T:
        """``work`` in one transaction: all of it is written, or none of it. (``turn``: a
        beat's heartbeat, which a server with row locks makes wait for the one before it;
        SQLite's write lock is the file's.)"""
        with self._locked():
            for attempt in (0, 1):
                db = self._connection()
                if not heartbeat and self._heartbeat_file not in (None, self._db_file):
                    raise StoreError(
                        f"{self.description}: the file is another one than at the last"
                        " heartbeat (restored from a copy, or deleted and recreated): its"
                        " epoch must be read again before anything else")
                try:
                    db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                    try:
                        result = work(db)
                        db.execute("COMMIT")
                        return result
                    except BaseException:
                        if db.in_transaction:
                            with contextlib.suppress(sqlite3.Error):
                                db.execute("ROLLBACK")
                        raise
                except sqlite3.Error as exc:
                    if attempt == 0 and _missing_table(exc):  # dropped under us: recreate
                        try:
                            self._set_up(db)
                        except (sqlite3.Error, StoreConfigurationError) as again:
                            raise StoreError(f"{self.description}: {again}") from again
                        continue
                    if _code(exc) not in (_BUSY, _LOCKED):
                        self._drop_connection()
                    raise self._failure(exc) from exc
            raise AssertionError("unreachable")  # pragma: no cover

    #: An item's savepoint: made, rolled back to, released (MySQL spells them otherwise).
    _savepoint = ("SAVEPOINT item", "ROLLBACK TO item", "RELEASE item")

    def _each(self, what: str, items: Sequence[I],
              step: Callable[[sqlite3.Connection, int, I], T],
              failed: Callable[[I, Exception], T]) -> list[T]:
        """One transition per item; CHUNK items per transaction, each in its own savepoint
        so that an item that fails (a bad record) is rolled back and answered alone."""
        make, undo, release = self._savepoint

        def chunk(db: sqlite3.Connection, part: Sequence[I]) -> list[T]:
            out = []
            for item in part:
                db.execute(make)
                try:
                    result = step(db, self._clock(), item)
                except Exception as exc:
                    if self._outage(exc):
                        raise
                    db.execute(undo)
                    db.execute(release)
                    logger.warning("beat-claims: %s failed in %s, for this item only: %s: %s",
                                   what, self.description, type(exc).__name__, exc)
                    out.append(failed(item, exc))
                    continue
                db.execute(release)
                out.append(result)
            return out

        results: list[T] = []
        for start in range(0, len(items), CHUNK):
            results += self._chunk(what, items[start:start + CHUNK], chunk)
        return results

    def _chunk(self, what: str, part: Sequence[I],
               run: Callable[[sqlite3.Connection, Sequence[I]], list[T]]) -> list[T]:
        """One transaction of ``_each``: ``run`` on a chunk of items."""
        return self._transaction(lambda db: run(db, part))

    def _workers_statements(self) -> dict[str, str]:
        """The statements of the worker processes' liveness."""
        return _workers_statements(self.tables)

    def _outage(self, exc: BaseException) -> bool:
        """An error of the store (the whole call fails), not of one item."""
        return _is_outage(exc)

    # -- helpers shared by the transitions (the Lua prelude's) ------------------------------
    def _get_run(self, db: sqlite3.Connection, entry: str, due: int
                 ) -> Record | Literal[False] | None:
        """The run's record; None when there is none, False when it cannot be read."""
        row = db.execute(self._sql["run_get"], (entry, due)).fetchone()
        return None if row is None else _parse(row[0], due)

    def _get_entry(self, db: sqlite3.Connection, entry: str
                   ) -> tuple[dict[str, int | None] | None, list[str]]:
        """The entry's anchor, checkpoint and token (None: no such entry) and the names of
        the fields that cannot be read (those are None)."""
        row = db.execute(self._sql["entry_get"], (entry,)).fetchone()
        if row is None:
            return None, []
        values: dict[str, int | None] = {}
        bad = []
        for name, raw in zip(("anchor", "checkpoint", "token"), row):
            try:
                values[name] = _entry_int(raw)
            except ValueError:
                values[name] = None
                bad.append(name)
        return values, bad

    def _paused(self, db: sqlite3.Connection, entry: str) -> bool:
        """Whether an operator paused the entry."""
        row = db.execute(self._sql["entry_paused"], (entry,)).fetchone()
        return row is not None and bool(row[0])

    def _pause_of(self, db: sqlite3.Connection, entry: str) -> Callable[[int], bool]:
        """Whether a scheduled run due at an instant is skipped for a pause: the entry is
        paused, or the instant is in its last pause [last_paused_at, resumed_at)."""
        row = db.execute(self._sql["entry_pause_of"], (entry,)).fetchone()
        if row is None:
            return lambda due: False
        paused, since, until = bool(row[0]), _maybe_int(row[1]), _maybe_int(row[2])
        return lambda due: paused or in_last_pause(due, since, until)

    def _unfinished(self, db: sqlite3.Connection, entry: str, due: int | None = None
                    ) -> bool:
        """Whether a run of the entry (other than ``due``) is being sent, sent or started:
        what overlap="skip" skips for, and overlap="buffer_one" waits for."""
        for other_due, raw in db.execute(self._sql["runs_busy"], (entry,)).fetchall():
            other = _parse(raw, other_due) if other_due != due else False
            if other and _overlaps(other):
                return True
        return False

    def _busy_newer(self, db: sqlite3.Connection, entry: str, due: int) -> bool:
        """Whether a scheduled run of the entry newer than ``due`` is being sent, sent or
        started: an occurrence older than it comes too late (overlap="buffer_one" skips
        it). An operator's request is no occurrence of the schedule."""
        for other_due, raw in db.execute(self._sql["runs_busy"], (entry,)).fetchall():
            other = _parse(raw, other_due) if other_due > due else False
            if other and _overlaps(other) and not _manual(other):
                return True
        return False

    def _insert_run(self, db: sqlite3.Connection, entry: str, run: Record) -> None:
        """A new run, in the history."""
        db.execute(self._sql["run_insert"], (entry, int(run["due"]), _encode(run),
                                             *_index(run)))

    def _put_run(self, db: sqlite3.Connection, entry: str, run: Record) -> None:
        """A run's new record and its index columns, in one statement."""
        db.execute(self._sql["run_update"], (_encode(run), *_index(run), entry,
                                             int(run["due"])))

    def _next_token(self, e: dict[str, int | None], floor: int) -> int:
        """A fresh token, above the caller's floor (the entry row is written by the caller
        before its transaction ends)."""
        token = (e["token"] or 0) + 1
        if token <= floor:
            token = floor + 1
        e["token"] = token
        return token

    def _trim(self, db: sqlite3.Connection, entry: str, limit: int, now: int) -> None:
        """Keep the history to ``limit`` runs: the oldest final runs first, wherever they
        are; a lost run moves to the lost keep (a week, at most ``limit``) for a late
        delivery; only then is the oldest run sent and never started pushed out, presumed
        lost (history_limit). Runs being claimed, sent or run are never dropped. Bounded:
        a look past at most 64 live runs."""
        q = self._sql
        gone: list[int] = []  # the instants whose run leaves the store: the horizon
        excess = db.execute(q["history_count"], (entry,)).fetchone()[0] - limit
        if excess > 0:
            unstarted: list[Record] = []
            for due, raw in db.execute(q["history_oldest"], (entry, excess + 64)).fetchall():
                if excess <= 0:
                    break
                run = _parse(raw, due)
                if run is False or (run["state"] in _FINAL and run["state"] != _LOST):
                    db.execute(q["run_delete"], (entry, due))
                    gone.append(due)
                    excess -= 1
                elif run["state"] == _LOST:
                    lost_at = _first(run, "finished_at")
                    db.execute(q["run_place"], ("x", int(now if lost_at is None else lost_at),
                                                entry, due))
                    excess -= 1
                elif run["state"] == _SENT and run.get("started_at") is None:
                    unstarted.append(run)
            for run in unstarted[:max(0, excess)]:
                run.update(state=_LOST, reason=Reason.HISTORY_LIMIT.value, finished_at=now)
                self._put_run(db, entry, run)
                db.execute(q["run_place"], ("x", now, entry, int(run["due"])))
        kept = db.execute(q["lost_count"], (entry,)).fetchone()[0]
        if not kept:
            self._raise_horizon(db, entry, gone, now)
            return
        expired = [due for (due,) in db.execute(q["lost_expired"], (entry, now - WEEK_MS))]
        over = kept - len(expired) - limit
        if over > 0:
            expired += [due for (due,) in db.execute(q["lost_oldest"],
                                                     (entry, over, len(expired)))]
        for due in expired:
            kept_run = self._get_run(db, entry, due)
            if not kept_run or kept_run["state"] == _LOST:
                db.execute(q["run_delete"], (entry, due))
                gone.append(due)
            else:
                db.execute(q["run_place"], (None, None, entry, due))
        self._raise_horizon(db, entry, gone, now)

    def _raise_horizon(self, db: sqlite3.Connection, entry: str, gone: list[int],
                       now: int) -> None:
        """The trim removed the runs at ``gone``: the entry's history horizon moves up to
        the newest of them (never back). One that cannot be read is written again at the
        later of that and ``now`` (no run after now was ever trimmed): a backfill is
        refused more, never less."""
        if not gone:
            return
        newest = max(int(due) for due in gone)
        stored = self._horizon(db, entry)
        if stored is False:
            newest = max(newest, now)
        elif stored is not None and stored >= newest:
            return
        db.execute(self._sql["entry_horizon_set"], (newest, entry))

    def _horizon(self, db: sqlite3.Connection, entry: str) -> int | Literal[False] | None:
        """The entry's history horizon; None when nothing was trimmed, False when the
        stored value cannot be read."""
        row = db.execute(self._sql["entry_horizon"], (entry,)).fetchone()
        if row is None or row[0] is None:
            return None
        try:
            return _entry_int(row[0])
        except ValueError:
            return False

    # -- beats: liveness and entries ---------------------------------------------------
    def heartbeat(self, owner: Owner, ttl: float, resync: bool = False,
                  settling: bool = False, sweep: LiveQuery | None = None,
                  written: Sequence[Written] = (), changes: ChangeCursor | None = None,
                  continuity: Continuity | None = None) -> Heartbeat:
        # (``sweep``, ``changes``: a second call here, so the caller asks apart: ``live``
        # and ``changes`` stay None)
        ttl_ms = max(1, round(ttl * 1000))

        def work(db: sqlite3.Connection) -> tuple[
                int, str, int | None, list[Any], tuple[int, int] | None, str, int | None,
                tuple[Written, ...], bool, int | None, bool, tuple[Written, ...],
                tuple[Written, ...]]:
            """heartbeat.lua: the owner is alive for ttl more (and was known before, or
            not); the caller's newest writes are looked for (kept.lua); the epoch changes
            when the file has none, is another file, on a resync, or when the store does
            not show the caller's continuity, and then no beat claims until every beat
            known alive has had its heartbeat to notice (settle_until). The last
            heartbeat's instant is kept (beat_at)."""
            q, now = self._sql, self._clock()
            # The store's own rows first (MySQL: locked), then this owner's: a heartbeat
            # that held its owner's row while it waited for them deadlocked with one that
            # held them and forgot lapsed owners (its DELETE waits for every owner's row).
            meta = {key: (row[0] if (row := db.execute(q["meta_get"], (key,)).fetchone())
                          else None) for key in ("epoch", "settle_until", "epoch_file",
                                                 "beat_at", "epoch_since")}
            known = db.execute(q["owner_known"], (owner.id,)).fetchone() is not None
            db.execute(q["owner_put"], (owner.id, json.dumps(owner.as_dict()), now + ttl_ms))
            since = _maybe_int(meta["epoch_since"])
            last_beat = _maybe_int(meta["beat_at"])
            db.execute(q["meta_set"], ("beat_at", str(max(now, last_beat or now))))
            epoch, settle = meta["epoch"], _maybe_int(meta["settle_until"])
            file = f"{self._db_file[0]}:{self._db_file[1]}" if self._db_file else ""
            judged = [(item, self._kept(db, item)) for item in written]
            lost = tuple(item for item, kept in judged if kept is False)
            removed = tuple(item for item, kept in judged if kept == _REMOVED)
            unjudged = tuple(item for item, kept in judged if kept is None)
            went_back = went_back_from(continuity, resync or settling, lost, known,
                                       epoch, since, last_beat)
            if not epoch or meta["epoch_file"] != file or resync or went_back:
                epoch = uuid.uuid4().hex
                # Long enough for every beat the store knows alive to notice: until the
                # latest of their heartbeats lapses (beats with a longer interval than the
                # caller's), within reason.
                until = now + ttl_ms
                latest = _maybe_int(db.execute(q["owners_latest"]).fetchone()[0])
                if latest is not None and latest > until:
                    until = min(latest, now + 10 * ttl_ms)
                if settle is None or settle < until:
                    settle = until
                since = now
                for key, value in (("epoch", epoch), ("settle_until", str(settle)),
                                   ("epoch_since", str(now)), ("epoch_file", file)):
                    db.execute(q["meta_set"], (key, value))
            elif settling and settle is not None and now < settle < now + ttl_ms:
                # The caller is still registering what it knows: settling lasts ttl more.
                settle = now + ttl_ms
                db.execute(q["meta_set"], ("settle_until", str(settle)))
            db.execute(q["owners_forget"], (now - FORGET_OWNERS_MS,))
            return (now, str(epoch), settle, db.execute(q["owners_all"]).fetchall(),
                    self._db_file, self._store_id(db), last_beat, lost, known, since,
                    went_back, removed, unjudged)

        (now, epoch, settle, rows, file_read, store_id, last_beat, lost, known, since,
         went_back, removed, unjudged) = self._transaction(work, heartbeat=True, turn=True)
        self._heartbeat_file = file_read
        owners = _owner_statuses(rows, now)
        self._warn_foreign_hosts(owners)
        return Heartbeat(now=now, epoch=epoch, settle_until=settle, owners=tuple(owners),
                         store_id=store_id, lost=lost, last_beat=last_beat, owner_known=known,
                         epoch_since=since, went_back=went_back, removed=removed,
                         unjudged=unjudged)

    def _kept(self, db: sqlite3.Connection, item: Written) -> bool | str | None:
        """kept.lua: whether the store still holds the caller's write (None: a record that
        cannot be read, not judged; :data:`_REMOVED`: a confirmed write of an entry the
        store no longer holds, with the write's run (a prune removes both), or holds made
        anew, removed since: see Written.confirmed)."""
        e, bad = self._get_entry(db, item.entry)
        if bad:
            return None
        if e is None:
            gone = self._get_run(db, item.entry, item.due) is None
            return _REMOVED if item.confirmed and gone else False
        if (item.confirmed and item.anchor is not None and e["anchor"] is not None
                and e["anchor"] != item.anchor):
            return _REMOVED  # (made anew)
        if e["anchor"] is None or (e["token"] or 0) < item.token:
            return False
        run = self._get_run(db, item.entry, item.due)
        if run is None or run is False:
            return None if run is False else True  # (trimmed: the counter judged it)
        token = int(run.get("token") or 0)
        if token == 0:
            return True  # never claimed (a backfill's or a request's run): the counter judged
        if token < item.token:
            return False
        if token > item.token:
            return True
        if item.kind is Wrote.CHECK:
            return run["state"] != _CLAIMED  # (due: taken back after the check)
        return not (item.kind is Wrote.SENT
                    and run["state"] in (_CLAIMED, _SENDING, _DUE, _WAITING))

    def _store_id(self, db: sqlite3.Connection) -> str:
        """The store's id (made with the tables; again if someone deleted it)."""
        q = self._sql
        row = db.execute(q["meta_get"], ("store_id",)).fetchone()
        if row is None or not isinstance(row[0], str) or not row[0]:
            db.execute(q["meta_set"], ("store_id", uuid.uuid4().hex))
            row = db.execute(q["meta_get"], ("store_id",)).fetchone()
        return str(row[0])

    def _warn_foreign_hosts(self, owners: list[OwnerStatus]) -> None:
        """This store's "now" is each host's own clock: beats of several hosts on one file
        (a network share) would disagree about it."""
        here = socket.gethostname()
        for status in owners:
            host = status.owner.host
            if status.alive and host != here and host not in self._foreign_hosts:
                self._foreign_hosts.add(host)
                logger.warning(
                    "beat-claims: a beat of another host (%s) uses %s; the SQLite store is"
                    " for the beats of one host only (their clocks are its clock): use"
                    " Redis or PostgreSQL for several hosts", host, self.description)

    def leave(self, owner: Owner) -> None:
        self._transaction(lambda db: db.execute(self._sql["owner_lapse"],
                                                (self._clock() - 1, owner.id)))

    def register(self, seeds: Sequence[EntrySeed], owner: Owner | None = None
                 ) -> dict[str, EntryState]:
        seeds = list(seeds)
        if not seeds:
            return {}
        anchoring: list[int] = []  # the call's anchoring instant, read by its first item

        def step(db: sqlite3.Connection, now: int, seed: EntrySeed
                 ) -> tuple[EntryState, list[str]] | None:
            if not anchoring:
                anchoring.append(self._anchor_instant(db, now))
            done = self._register_one(db, now, seed, anchoring[0])
            if owner is not None:
                self._note_registrant(db, now, seed.name, owner.id)
            return done

        def failed(seed: EntrySeed, exc: Exception) -> tuple[EntryState, list[str]] | None:
            logger.error("beat-claims: entry %r cannot be registered in the store: %s",
                         seed.name, exc)
            return None

        out: dict[str, EntryState] = {}
        for seed, reply in zip(seeds, self._each("register", seeds, step, failed)):
            if reply is None:
                continue
            state, repaired = reply
            if repaired:
                logger.warning("beat-claims: entry %r had unreadable field(s) %s in the"
                               " store; repaired from what this beat knows", seed.name,
                               ",".join(repaired))
            out[seed.name] = state
        return out

    def _note_registrant(self, db: sqlite3.Connection, now: int, entry: str,
                         owner: str) -> None:
        """registrant.lua: ``owner`` becomes one of the entry's registrants; those whose
        heartbeat has lapsed are dropped (the list stays bounded by the live beats). A
        field that cannot be read is replaced."""
        alive = self._alive(db, now)
        found = self._registrants(db, entry) or {}
        kept = {who: at for who, at in found.items() if who in alive}
        kept[owner] = now
        db.execute(self._sql["entry_registrants_set"], (json.dumps(kept), entry))

    def _alive(self, db: sqlite3.Connection, now: int) -> set[str]:
        """The owners whose heartbeat has not lapsed."""
        return {row[0] for row in db.execute(self._sql["owners_alive"], (now,))}

    def _registrants(self, db: sqlite3.Connection, entry: str
                     ) -> dict[str, int] | Literal[False] | None:
        """The entry's registrants (owner id -> when); None when none was ever recorded,
        False when they cannot be read."""
        row = db.execute(self._sql["entry_registrants"], (entry,)).fetchone()
        if row is None or row[0] is None:
            return None
        found = registrants_from_json(row[0])
        return False if found is None else {r.owner: r.at for r in found}

    def unregister(self, owner: Owner, entries: Sequence[str]) -> None:
        def step(db: sqlite3.Connection, now: int, name: str) -> None:
            """unregister.lua: ``owner`` no longer schedules the entry."""
            found = self._registrants(db, name)
            if found and owner.id in found:
                del found[owner.id]
                db.execute(self._sql["entry_registrants_set"], (json.dumps(found), name))

        self._each("unregister", list(entries), step, lambda name, exc: None)

    def _anchor_instant(self, db: sqlite3.Connection, now: int) -> int:
        """The instant new entries are anchored at: beats that start together (within
        ANCHOR_SHARED_MS) share it, so entries they first see together fall due together."""
        q = self._sql
        instant = db.execute(q["meta_get"], ("anchoring",)).fetchone()
        until = db.execute(q["meta_get"], ("anchoring_until",)).fetchone()
        value, expiry = (_maybe_int(instant[0]) if instant else None,
                         _maybe_int(until[0]) if until else None)
        if value is not None and expiry is not None and now < expiry:
            return value
        db.execute(q["meta_set"], ("anchoring", str(now)))
        db.execute(q["meta_set"], ("anchoring_until", str(now + ANCHOR_SHARED_MS)))
        return now

    def _register_one(self, db: sqlite3.Connection, now: int, seed: EntrySeed,
                      anchor_now: int) -> tuple[EntryState, list[str]]:
        """register.lua: anchor once, floors only raise, known runs restored where the store
        has no record at their instant (the token counter raised to their tokens),
        unreadable fields replaced (and named)."""
        e, repaired = self._get_entry(db, seed.name)
        e = e or {"anchor": None, "checkpoint": None, "token": None}
        anchor = e["anchor"]
        if anchor is None:
            anchor = seed.anchor if seed.anchor is not None else anchor_now
        checkpoint = e["checkpoint"]
        if seed.checkpoint is not None and (checkpoint is None or checkpoint < seed.checkpoint):
            checkpoint = seed.checkpoint
        # Every token of the runs the caller knows was handed out (restored or not).
        token = max([e["token"] or 0, seed.token, *(known.token for known in seed.runs)])
        if "token" in repaired:
            # The counter could not be read: no token its runs hold may be handed out again.
            token = max([token, *(self._tokens_held(db, seed.name))])
        db.execute(self._sql["entry_put"], (seed.name, seed.description, anchor, checkpoint,
                                            token))
        if seed.runs:
            for known in seed.runs:
                stored = self._get_run(db, seed.name, known.due)
                record = known.to_record()
                if stored is None:
                    self._insert_run(db, seed.name, record)
                elif stored and known.state is RunState.SENT and (
                        stored["state"] not in _FINAL and stored["state"] not in _OPEN
                        and int(stored.get("token") or 0) <= known.token
                        and (int(stored.get("token") or 0) > 0 or known.manual)):
                    # An older copy of the store still holds it claimed (or due again), and
                    # the caller sent it since: what the caller knows is newer. (Not over a
                    # run never claimed that the caller did not send as an operator's: a
                    # backfill or a request made since.)
                    self._put_run(db, seed.name, record)
                elif stored and known.state is RunState.SENT and (
                        _ended_unrun(stored) or _sent_unstarted(stored)) and (
                        (_maybe_int(stored.get("token")) or 0) < known.token):
                    # An older copy holds the run a backfill replaced (it ended without
                    # running, or an earlier send no worker started), and the caller sent a
                    # later run since: the record of an instant carries its latest token, so
                    # this copy is behind. As a backfill does, the old row (and its task
                    # ids) goes.
                    db.execute(self._sql["run_delete"], (seed.name, known.due))
                    self._insert_run(db, seed.name, record)
            self._trim(db, seed.name, self.history_limit, now)
        return EntryState(anchor, checkpoint, token), repaired

    def _tokens_held(self, db: sqlite3.Connection, entry: str) -> list[int]:
        """The tokens the entry's readable records hold (bounded: its history, its live
        runs and its lost keep)."""
        out = []
        for (raw,) in db.execute(self._sql["runs_all"], (entry,)):
            try:
                run = json.loads(raw)
            except (TypeError, ValueError):
                continue
            if isinstance(run, dict) and _is_number(run.get("token")):
                out.append(int(run["token"]))
        return out

    # -- beats: the life of a claim ----------------------------------------------------
    def claim(self, owner: Owner, plans: Sequence[ClaimPlan]) -> list[ClaimResult]:
        return self._each("claim", checked_plans(plans), lambda db, now, plan: self._claim_one(
            db, now, owner.id, plan), lambda plan, exc: ClaimResult(
            plan.entry, ClaimStatus.CORRUPT, detail=f"{type(exc).__name__}: {exc}"))

    def _claim_one(self, db: sqlite3.Connection, now: int, owner: str, plan: ClaimPlan
                   ) -> ClaimResult:
        """claim.lua: one compare-and-set on the checkpoint; a fresh token per claim; an
        instant that already has a run is left as it is; then the due runs are taken, and a
        waiting one once no run of the entry is unfinished. While the entry is paused, new
        occurrences and runs due again that are not an operator's request are recorded
        skipped (paused) instead."""
        q, name = self._sql, plan.entry
        e, bad = self._get_entry(db, name)
        if bad:
            return ClaimResult(name, ClaimStatus.CORRUPT, detail=f"unreadable field {bad[0]!r}")
        if e is None or e["anchor"] is None:
            return ClaimResult(name, ClaimStatus.MISSING)
        paused = self._pause_of(db, name)
        anchor, checkpoint = e["anchor"], e["checkpoint"]
        start_token = e["token"] or 0
        # (a token is never below the clock: a store put back from an older copy hands
        # none out twice)
        floor = max(plan.token_floor, now * TOKENS_PER_MS - 1)
        claimed: list[Claim] = []
        skipped: list[tuple[int, Reason]] = []
        existing: list[int] = []
        taken: list[Claim] = []
        unreadable: list[int] = []
        if plan.expected is not None:
            if (anchor, checkpoint) != (plan.expected.anchor, plan.expected.checkpoint):
                return ClaimResult(name, ClaimStatus.CONFLICT,
                                   EntryState(anchor, checkpoint, start_token))
            cp = checkpoint
            steps = sorted([(due, "claim") for due in plan.claim]
                           + [(due, reason.value) for due, reason in plan.skip])
            for due, action in steps:
                if cp is not None and due <= cp:
                    continue
                cp = due
                if db.execute(q["run_get"], (name, due)).fetchone() is not None:
                    existing.append(due)
                elif action == "claim" and paused(due):
                    self._insert_run(db, name, {"due": due, "state": _SKIPPED,
                                                "reason": Reason.PAUSED.value,
                                                "finished_at": now})
                    skipped.append((due, Reason.PAUSED))
                elif action == "claim":
                    token = floor = self._next_token(e, floor)
                    self._insert_run(db, name, {"due": due, "state": _CLAIMED, "token": token,
                                                "owner": owner, "claimed_at": now})
                    claimed.append(Claim(name, due, token))
                else:
                    self._insert_run(db, name, {"due": due, "state": _SKIPPED,
                                                "reason": action, "finished_at": now})
                    skipped.append((due, Reason(action)))
            checkpoint = cp
            if plan.next_due is not None and (
                    plan.version is None or plan.version == self._version(db, name)):
                db.execute(q["next_set"], (plan.next_due, name))
        if plan.take_due:
            rows = sorted([(due, raw, _DUE) for due, raw in db.execute(
                q["runs_due"], (name,)).fetchall()] + [(due, raw, _WAITING) for due, raw in
                db.execute(q["runs_waiting"], (name,)).fetchall()])
            blocked: bool | None = None  # whether a waiting run waits on (read if needed)
            for due, raw, kind in rows:  # oldest first
                run = _parse(raw, due)
                if run is False:
                    db.execute(q["run_unindex"], (name, due))
                    unreadable.append(due)
                elif run["state"] not in (_DUE, _WAITING):
                    self._put_run(db, name, run)  # indexed as its record says
                elif not _manual(run) and paused(due):
                    run.update(state=_SKIPPED, reason=Reason.PAUSED.value, finished_at=now)
                    self._put_run(db, name, run)
                    skipped.append((due, Reason.PAUSED))
                elif run["state"] == _WAITING and (blocked := (
                        self._unfinished(db, name) if blocked is None else blocked)):
                    if kind != _WAITING:
                        self._put_run(db, name, run)  # indexed as its record says
                else:  # due again, or waiting and its previous run finished
                    token = floor = self._next_token(e, floor)
                    run.update(token=token, state=_CLAIMED, owner=owner, claimed_at=now)
                    run.pop("sending_at", None)  # held since this claim, not the last check
                    run.pop("waiting_at", None)
                    run.pop("waited_by", None)
                    self._put_run(db, name, run)
                    taken.append(Claim(name, due, token,
                                       manual=_manual(run),
                                       maybe_sent=run.get("maybe_sent") not in (None, False),
                                       attempts=int(run.get("attempts") or 0)))
        if checkpoint != e["checkpoint"] or e["token"] != start_token:
            db.execute(q["entry_move"], (checkpoint, e["token"], name))
        self._trim(db, name, self.history_limit, now)
        return ClaimResult(name, ClaimStatus.OK, EntryState(anchor, checkpoint,
                                                            e["token"] or 0),
                           claims=tuple(claimed), taken=tuple(taken),
                           skipped=tuple(skipped), existing=tuple(existing),
                           unreadable=tuple(unreadable))

    def check(self, owner: Owner, checks: Sequence[Check]) -> list[CheckResult]:
        return self._each("check", list(checks), lambda db, now, item: self._check_one(
            db, now, owner.id, item), lambda item, exc: CheckResult(
            item.claim, CheckVerdict.REFUSED, why=f"unreadable record: {exc}"))

    def _check_one(self, db: sqlite3.Connection, now: int, owner: str, item: Check
                   ) -> CheckResult:
        """check.lua: only the holder of the current token may send; asked again after a
        lost reply, the same answer. An operator's request is sent whatever the pause and
        the overlap policy; another run of a paused entry is skipped (paused), and one
        whose entry has a run unfinished is skipped (overlap="skip") or waits
        (overlap="buffer_one": the newest waits, the other waiting ones are skipped)."""
        c = item.claim
        run = self._get_run(db, c.entry, c.due)
        if run is None:  # the store lost it (or it never was): the holder must know
            return CheckResult(c, CheckVerdict.MISSING, why="no such run")
        if run is False:
            return CheckResult(c, CheckVerdict.REFUSED, why="unreadable record")
        if run["state"] == _WAITING and run.get("waited_by") == owner and _token_is(
                run, c.token):
            # This holder's check, asked again (whatever overlap policy it asks with now):
            # the same answer, what the run is (see CheckVerdict.WAITING).
            return CheckResult(c, CheckVerdict.WAITING)
        if run.get("owner") != owner or not _token_is(run, c.token):
            return CheckResult(c, CheckVerdict.REFUSED, why="superseded")
        if run["state"] == _SKIPPED and run.get("reason") in Reason._value2member_map_:
            return CheckResult(c, CheckVerdict.SKIPPED, Reason(run["reason"]))
        if run["state"] not in _HELD:
            return CheckResult(c, CheckVerdict.REFUSED, why=run["state"])
        reason = item.skip
        # A holder checks a run again only before publishing it (a lost reply, a publish
        # that stalled): the pause applies to it as to a run checked the first time.
        if reason is None and not _manual(run) and self._pause_of(db, c.entry)(c.due):
            reason = Reason.PAUSED
        # The overlap policy applies to a run not checked before.
        scheduled = run["state"] == _CLAIMED and not _manual(run)
        if reason is None and scheduled and item.overlap is not Overlap.ALLOW and (
                self._unfinished(db, c.entry, c.due)):
            if item.overlap is Overlap.SKIP or (item.overlap is Overlap.BUFFER_ONE and (
                    self._busy_newer(db, c.entry, c.due))):
                reason = Reason.OVERLAP  # (buffer_one: a newer one runs, this one is late)
            elif item.overlap is Overlap.BUFFER_ONE:
                # The newest waits; the entry's other waiting runs are skipped (overlap).
                waiting = [other for due, raw in db.execute(
                    self._sql["runs_waiting"], (c.entry,)).fetchall()
                    if due != c.due and (other := _parse(raw, due))
                    and other["state"] == _WAITING]
                newest = max([c.due, *(int(other["due"]) for other in waiting)])
                for other in waiting:
                    if other["due"] != newest:
                        other.update(state=_SKIPPED, reason=Reason.OVERLAP.value,
                                     finished_at=now)
                        self._put_run(db, c.entry, other)
                if newest != c.due:
                    reason = Reason.OVERLAP  # a newer one waits
                else:
                    run.update(state=_WAITING, waited_by=owner, waiting_at=now)
                    run.pop("owner", None)
                    self._put_run(db, c.entry, run)
                    return CheckResult(c, CheckVerdict.WAITING)
        if reason is not None:
            run.update(state=_SKIPPED, reason=reason.value, finished_at=now)
            self._put_run(db, c.entry, run)
            return CheckResult(c, CheckVerdict.SKIPPED, reason)
        run.update(state=_SENDING, task_id=item.task_id, sending_at=now)
        self._put_run(db, c.entry, run)
        return CheckResult(c, CheckVerdict.SEND)

    def record_sent(self, owner: Owner, claims: Sequence[Claim]) -> int:
        def step(db: sqlite3.Connection, now: int, c: Claim) -> bool:
            """sent.lua: the worker may already have started (or finished) the run."""
            run = self._get_run(db, c.entry, c.due)
            if not run or not _token_is(run, c.token) or not _handed_over(run):
                return False
            if run["state"] == _SENDING:
                run.update(state=_SENT, sent_at=now)
                self._put_run(db, c.entry, run)
            elif run.get("sent_at") is None:
                run["sent_at"] = now
                self._put_run(db, c.entry, run)
            return True

        return sum(self._each("record_sent", list(claims), step, lambda c, exc: False))

    def release(self, owner: Owner, releases: Sequence[Release], max_attempts: int = 0
                ) -> list[RunState | None]:
        allowed = max(1, max_attempts)

        def step(db: sqlite3.Connection, now: int, item: Release) -> RunState | None:
            """release.lua: due again; with an error the attempt is counted, and at the
            limit the run is recorded failed (publish_error) so it does not come back."""
            c = item.claim
            run = self._get_run(db, c.entry, c.due)
            if not run or not _holds(run, owner.id, c.token):
                return None
            if item.error:
                run["attempts"] = int(run.get("attempts") or 0) + 1
                run["exc_type"] = item.error_type
                run["exc_message"] = item.error
                if run["attempts"] >= allowed:
                    run.update(state=_FAILED, reason=Reason.PUBLISH_ERROR.value,
                               finished_at=now)
                    self._put_run(db, c.entry, run)
                    return RunState.FAILED
            _to_due(run, run.get("owner"), now)
            self._put_run(db, c.entry, run)
            return RunState.DUE

        return self._each("release", list(releases), step, lambda item, exc: None)

    # -- sweeps -----------------------------------------------------------------------
    def live_runs(self, query: LiveQuery) -> LiveRuns:
        q = query
        top = max(q.held_before, q.mine_before, q.dead_before)
        live = json.dumps(sorted(q.live_owners))

        def work(db: sqlite3.Connection) -> tuple[list[Any], list[Any], int]:
            """Runs due again, and waiting runs a claim would take now (their entry has no
            run unfinished, or is paused: a claim records them skipped); held runs."""
            due_rows = db.execute(self._sql["sweep_due"], (q.limit + 1,)).fetchall()
            waiting_rows = db.execute(self._sql["sweep_waiting"], (q.limit + 1,)).fetchall()
            takeable: dict[str, bool] = {}
            for _since, entry, _due in waiting_rows:
                if entry not in takeable:
                    takeable[entry] = self._paused(db, entry) or not self._unfinished(
                        db, entry)
            rows = sorted([(since or 0, entry, due, True) for since, entry, due in due_rows]
                          + [(since or 0, entry, due, takeable[entry])
                             for since, entry, due in waiting_rows])
            return ([(entry, due) for _since, entry, due, report in rows if report],
                    db.execute(self._sql["sweep_held"], (
                        top, q.held_before, q.owner, q.mine_before, q.owner, q.dead_before,
                        live, q.limit + 1)).fetchall(), len(due_rows) + len(waiting_rows))

        due_rows, held_rows, found = self._transaction(work, write=False)
        complete = found <= q.limit and len(held_rows) <= q.limit
        return LiveRuns(
            tuple(RunRef(entry, due) for entry, due in due_rows[:q.limit]),
            tuple(HeldRun(entry, due, int(token or 0), owner or "", int(since))
                  for entry, due, owner, token, since in held_rows[:q.limit]),
            complete)

    def open_runs(self, before: int, after: int | None = None, limit: int = 1000
                  ) -> list[OpenRun]:
        low = -(2 ** 63) if after is None else after
        rows = self._transaction(lambda db: db.execute(
            self._sql["sweep_open"], (low, before, max(0, limit))).fetchall(), write=False)
        out = []
        for entry, due, raw, since in rows:
            run = _parse(raw, due)
            if run and run["state"] in _OPEN:
                out.append(OpenRun(entry, due, int(run.get("token") or 0),
                                   RunState(run["state"]), int(since), run.get("task_id")))
        return out

    def reclaim(self, reclaims: Sequence[Reclaim], by: str) -> list[bool]:
        def step(db: sqlite3.Connection, now: int, r: Reclaim) -> int:
            """reclaim.lua: due again, the holder fenced; a run being sent may have been
            published, and that is remembered (maybe_sent). A record that cannot be read is
            taken out of the indexes (else every sweep would find it again, for ever)."""
            run = self._get_run(db, r.entry, r.due)
            if run is False:
                db.execute(self._sql["run_unindex"], (r.entry, r.due))
                return -1
            if not run or run["state"] not in _HELD or not _token_is(run, r.token):
                return 0
            if run["state"] == _SENDING:
                run["maybe_sent"] = True
            if "owner" in run:
                run["reclaimed_from"] = run["owner"]
            else:
                run.pop("reclaimed_from", None)
            run["reclaims"] = int(run.get("reclaims") or 0) + 1
            _to_due(run, by, now)
            self._put_run(db, r.entry, run)
            return 1

        reclaims = list(reclaims)
        results = self._each("reclaim", reclaims, step, lambda r, exc: -1)
        for item, result in zip(reclaims, results):
            if result == -1 and (item.entry, item.due) not in self._noted:
                self._noted.add((item.entry, item.due))  # once, not at every sweep
                logger.error("beat-claims: %s due %s: its record in the store cannot be"
                             " read; it is left out of the store's indexes (nothing will"
                             " send it)", item.entry, iso(item.due))
        return [result == 1 for result in results]

    # -- workers ----------------------------------------------------------------------
    def start(self, delivery: Delivery) -> StartDecision:
        store_id = [""]  # read first, so that a failed start answers it too

        def step(db: sqlite3.Connection, now: int, d: Delivery) -> StartDecision:
            store_id[0] = self._store_id(db)
            return self._start_one(db, now, d)

        [decision] = self._each("start", [delivery], step, lambda d, exc: StartDecision(
            StartVerdict.UNTRACKED, f"unreadable record: {exc}"))
        return dataclasses.replace(decision, store_id=store_id[0])

    def _start_one(self, db: sqlite3.Connection, now: int, d: Delivery) -> StartDecision:
        """start.lua: the first delivery of the current token starts the run; another is
        refused, unless it is a Celery retry or the process that started it is gone; a run
        presumed lost whose delivery turns up late still runs."""
        q, proc = self._sql, d.process
        run = self._get_run(db, d.entry, d.due)
        if run is None:
            e, bad = self._get_entry(db, d.entry)
            if e is not None and not bad and e["checkpoint"] is not None and (
                    d.due <= e["checkpoint"]):
                return StartDecision(StartVerdict.REFUSED, "no record of this run (trimmed"
                                     " from history, or the store was wiped)")
            return StartDecision(StartVerdict.UNTRACKED, "no record of this run yet")
        if run is False:
            return StartDecision(StartVerdict.UNTRACKED, "corrupt record")
        if not _token_is(run, d.token):
            return StartDecision(StartVerdict.REFUSED, f"token {d.token} superseded by"
                                 f" {int(run.get('token') or 0)}")
        state = run["state"]
        if state in _FINAL and state != _LOST:
            return StartDecision(StartVerdict.REFUSED, f"already {state}")
        if state == _STARTED or (state == _LOST and run.get("started_at") is not None):
            worker, pid, identity = _started_by(run)
            same = (worker, pid, identity) == (proc.worker, proc.pid, proc.process)
            retry = d.retries > int(run.get("retries") or 0)
            takeover = d.takeover is not None and (
                d.takeover.worker, d.takeover.pid) == (worker, pid)
            if not (retry or takeover):
                if same:
                    return StartDecision(StartVerdict.REFUSED, "already started by this"
                                         " process")
                return StartDecision(StartVerdict.BUSY, "busy", WorkerProcess(
                    worker, int(run.get("worker_pid") or 0), identity))
            if takeover:
                run["deliveries"] = int(run.get("deliveries") or 1) + 1
        elif state in (_SENDING, _SENT, _LOST):
            run["deliveries"] = 1
        else:
            return StartDecision(StartVerdict.REFUSED, f"not sent ({state})")
        if state == _LOST:
            # Presumed lost, and it was not: its run_timeout counts again from now.
            run.update(revived=True, revived_at=now)
            run.pop("finished_at", None)
            run.pop("reason", None)
            db.execute(q["run_place"], ("h", None, d.entry, d.due))
        run.pop("reseeded", None)
        run.update(state=_STARTED, worker=proc.worker, worker_pid=proc.pid,
                   worker_process=proc.process, retries=d.retries)
        if run.get("started_at") is None:
            run["started_at"] = now
        if d.task_id:
            run["task_id"] = d.task_id  # what the task-id index points from
        self._put_run(db, d.entry, run)
        if d.task_id:
            # For signals that carry only the task id. Only for a delivery that runs: a
            # refused one (a superseded message has the same task id) must not replace it.
            # The id goes with the run (the trigger on the runs table).
            db.execute(q["task_put"], (d.task_id, d.entry, d.due, int(run.get("token") or 0),
                                       TASK_NEVER_EXPIRES))
        return StartDecision(StartVerdict.RUN, "")

    def requeue(self, delivery: Delivery) -> bool:
        def step(db: sqlite3.Connection, now: int, d: Delivery) -> bool:
            """requeue.lua: only the process that started the run, with the current token,
            gives it back: it is sent again, and the next delivery of its token starts it."""
            proc = d.process
            run = self._get_run(db, d.entry, d.due)
            if not run or run["state"] != _STARTED or not _token_is(run, d.token):
                return False
            if _started_by(run) != (proc.worker, proc.pid, proc.process):
                return False
            # As requeue.lua: its run_timeout counts again from now.
            run.update(state=_SENT, requeues=int(run.get("requeues") or 0) + 1,
                       revived_at=now)
            for name in ("worker", "worker_pid", "worker_process"):
                run.pop(name, None)
            self._put_run(db, d.entry, run)
            return True

        [given_back] = self._each("requeue", [delivery], step, lambda d, exc: False)
        return given_back

    def finish(self, outcomes: Sequence[Outcome]) -> list[bool]:
        def step(db: sqlite3.Connection, now: int, o: Outcome) -> bool:
            """finish.lua: a final state is never overwritten (but for a run presumed lost
            that a worker started: its late outcome), a superseded token's outcome is
            ignored; a presumption of loss applies only to a run open and not active
            since the caller's cutoff; an outcome for unstarted runs only leaves a started
            one alone."""
            run = self._get_run(db, o.entry, o.due)
            if not run or not _token_is(run, o.token) or (
                    run["state"] in _FINAL and not _ran(run)) or not _handed_over(run):
                return False
            late = _ran(run)  # presumed lost, and a worker ran it: its outcome, at last
            if o.unstarted_only and (run["state"] == _STARTED or late):
                return False  # a delivery that never ran: not the one running it
            if o.state is RunState.LOST:
                if run["state"] not in _OPEN:
                    return False
                if o.inactive_since is not None and _since(run) >= o.inactive_since:
                    return False
            if late:
                run.pop("reason", None)  # run_timeout no longer holds
                run["revived"] = True
                db.execute(self._sql["run_place"], ("h", None, o.entry, o.due))
            run["state"] = o.state.value
            run["finished_at"] = now
            if o.reason is not None:
                run["reason"] = o.reason.value
            if o.exc_type:
                run["exc_type"] = o.exc_type
            if o.exc_message:
                run["exc_message"] = o.exc_message
            if o.worker and not run.get("worker"):
                run["worker"] = o.worker
            self._put_run(db, o.entry, run)
            return True

        return self._each("finish", list(outcomes), step, lambda o, exc: False)

    def lookup_task(self, task_id: str) -> Claim | None:
        row = self._transaction(lambda db: db.execute(
            self._sql["task_get"], (task_id,)).fetchone(), write=False)
        if row is None:
            return None
        entry, due, token = row
        if not isinstance(entry, str) or _maybe_int(due) is None or _maybe_int(token) is None:
            return None
        return Claim(entry, int(due), int(token))

    # -- operators --------------------------------------------------------------------
    def request_run(self, entry: str, by: str, request_id: str = "") -> int | None:
        def step(db: sqlite3.Connection, now: int, name: str) -> int | None:
            """request.lua: a run due now (the first free millisecond), claimed by a beat
            like any other; the checkpoint is not touched. A request id seen before (asked
            again after a lost reply) records nothing more."""
            e, bad = self._get_entry(db, name)
            if e is None or bad or e["anchor"] is None:
                return None
            if request_id:
                for seen, raw in db.execute(self._sql["history_all"], (name,)).fetchall():
                    run = _parse(raw, seen)
                    if run and run.get("request_id") == request_id:
                        return int(seen)
            due = now
            for (taken,) in db.execute(self._sql["runs_from"], (name, now)).fetchall():
                if taken != due:
                    break
                due += 1
            record: Record = {"due": due, "state": _DUE, "manual": True, "requested_by": by,
                              "released_at": due}
            if request_id:
                record["request_id"] = request_id
            self._insert_run(db, name, record)
            self._trim(db, name, self.history_limit, due)
            return due

        [due] = self._each("request_run", [entry], step, lambda name, exc: None)
        return due

    def pause(self, entry: str, by: str, note: str = "") -> EntryRecord | None:
        def work(db: sqlite3.Connection) -> EntryRecord | None:
            """The entry's pause, on the entry's row: who, why, since when (a pause of a
            paused entry keeps its instant). Its runs are skipped as they come up (at
            their claim, when taken due again, at their check)."""
            q = self._sql
            if db.execute(q["entry_pause"], (by, note, self._clock(), entry)).rowcount == 0:
                return None
            return _entry_record(db.execute(q["entry_read"], (entry,)).fetchone())

        return self._transaction(work)

    def resume(self, entry: str, by: str) -> EntryRecord | None:
        def work(db: sqlite3.Connection) -> EntryRecord | None:
            """The pause ends, and who ended it when is recorded (only if paused)."""
            q = self._sql
            db.execute(q["entry_resume"], (by, self._clock(), entry))
            row = db.execute(q["entry_read"], (entry,)).fetchone()
            return None if row is None else _entry_record(row)

        return self._transaction(work)

    def backfill(self, entry: str, dues: Sequence[int], by: str) -> BackfillResult | None:
        instants = sorted({int(due) for due in dues})

        def step(db: sqlite3.Connection, now: int, name: str
                 ) -> BackfillResult | BackfillRefused | None:
            """A manual run due at each instant that has no run, or whose run ended without
            running (it is recorded again, back in the history; its next claim gets a fresh
            token, above every token of the entry); what ran, runs or is on its way is kept
            (a run presumed lost that a worker started too). The checkpoint is not touched.
            A record that cannot be read is left as it is. Refused (nothing written) when
            the history cannot hold its runs beside the entry's unfinished ones."""
            q = self._sql
            if db.execute(q["entry_get"], (name,)).fetchone() is None:
                return None
            forgotten = self._beyond_horizon(db, name, instants)
            if forgotten is not None:
                return forgotten
            kept: list[tuple[int, RunState]] = []
            redo: list[tuple[int, Record | None]] = []
            for due in instants:
                stored = self._get_run(db, name, due)
                if stored is False:
                    continue
                if stored is not None and (stored["state"] not in _REDONE or _ran(stored)):
                    kept.append((due, RunState(stored["state"])))
                else:
                    redo.append((due, stored))
            if redo:
                live = db.execute(q["history_live"], (name,)).fetchone()[0]
                if live + len(redo) > self.history_limit:
                    return BackfillRefused(name, len(redo), live, self.history_limit)
            created: list[int] = []
            for due, stored in redo:
                record: Record = {"due": due, "state": _DUE, "manual": True,
                                  "requested_by": by, "released_at": now}
                if stored is not None:
                    # A new run, as in the other stores: the old row goes (out of the lost
                    # keep), and with it the task ids it was started under (the trigger),
                    # so that a signal of the old delivery never finds the new run.
                    record["backfilled_from"] = stored["state"]
                    db.execute(q["run_delete"], (name, due))
                self._insert_run(db, name, record)
                created.append(due)
            if created:
                self._trim(db, name, self.history_limit, now)
            return BackfillResult(name, tuple(created), tuple(kept))

        [result] = self._each("backfill", [entry], step, lambda name, exc: None)
        if isinstance(result, BackfillRefused):  # (a BackfillForgotten too)
            raise result
        return result

    def _beyond_horizon(self, db: sqlite3.Connection, entry: str, instants: list[int]
                        ) -> BackfillForgotten | None:
        """The refusal of a backfill with instants that have no run recorded at or before
        the entry's history horizon (or whose horizon cannot be read): whether they ran is
        not known. None when it has none. (An instant with a record is known: that record
        is its latest run.)"""
        horizon = self._horizon(db, entry)
        if horizon is None:
            return None
        n = sum(1 for due in instants if (horizon is False or due <= horizon)
                and db.execute(self._sql["run_get"], (entry, due)).fetchone() is None)
        if not n:
            return None
        return BackfillForgotten(entry, None if horizon is False else horizon, n,
                                 self.history_limit)

    def forget(self, entries: Sequence[str]) -> list[str]:
        def step(db: sqlite3.Connection, now: int, name: str) -> bool:
            """forget.lua: an entry no schedule has any more goes with every record of its
            runs (history, lost keep, task ids: the trigger), unless a run is claimed,
            being sent, sent or started (it may still be sent, or report)."""
            q = self._sql
            if db.execute(q["entry_get"], (name,)).fetchone() is None:
                return False
            if db.execute(q["runs_live"], (name,)).fetchone() is not None:
                return False
            if db.execute(q["def_live"], (name,)).fetchone() is not None:
                return False  # a live definition: never pruned
            if self._registered_alive(db, now, name):
                return False
            db.execute(q["runs_forget"], (name,))
            db.execute(q["entry_delete"], (name,))
            return True

        names = list(entries)
        removed = self._each("forget", names, step, lambda name, exc: False)
        return [name for name, ok in zip(names, removed) if ok]

    def _registered_alive(self, db: sqlite3.Connection, now: int, entry: str) -> bool:
        """Whether a beat whose heartbeat has not lapsed registered the entry; also when
        its registrants cannot be read (nothing is removed that cannot be seen)."""
        found = self._registrants(db, entry)
        if found is False:
            return True
        return found is not None and not self._alive(db, now).isdisjoint(found)

    # -- definitions ------------------------------------------------------------------
    def write_definitions(self, writes: Sequence[DefinitionWrite]
                          ) -> list[DefinitionResult]:
        writes = checked_writes(writes, self.history_limit)
        anchoring: list[int] = []  # the call's anchoring instant, read when first needed

        def anchor(db: sqlite3.Connection, now: int) -> int:
            if not anchoring:
                anchoring.append(self._anchor_instant(db, now))
            return anchoring[0]

        return self._each("write_definitions", writes, lambda db, now, w: self._define_one(
            db, now, w, lambda: anchor(db, now)), lambda w, exc: DefinitionResult(
            w.name, WriteStatus.CORRUPT, 0, detail=f"{type(exc).__name__}: {exc}"))

    def _define_one(self, db: sqlite3.Connection, now: int, w: DefinitionWrite,
                    anchor: Callable[[], int]) -> DefinitionResult:
        """define.lua: a compare-and-set on the version (and the checkpoint, when named);
        an entry that does not exist is anchored; the skips recorded as a claim records
        them (by the claim's own code), the checkpoint moved forward only; the definition
        or its tombstone, the version, who and when written, and the change numbered in
        the change log. The last change's id answers as it did."""
        q, name = self._sql, w.name
        e, bad = self._get_entry(db, name)
        if bad:
            return DefinitionResult(name, WriteStatus.CORRUPT, 0,
                                    detail=f"unreadable field {bad[0]!r}")
        row = db.execute(q["def_get"], (name,)).fetchone()
        text, raw_version, _, _, _, change_id = row or (None, 0, None, None, None, None)
        version = _maybe_int(raw_version) if _is_number(raw_version) else None
        if version is None or version < 0 or (version == 0 and text is not None):
            return DefinitionResult(name, WriteStatus.CORRUPT, 0, detail="unreadable field"
                                    f" 'version' ({raw_version!r:.40})")

        def answer(status: WriteStatus, detail: str = "") -> DefinitionResult:
            entry, _ = self._get_entry(db, name)
            state = (EntryState(entry["anchor"], entry["checkpoint"], entry["token"] or 0)
                     if entry and entry["anchor"] is not None else None)
            stored = db.execute(q["def_get"], (name,)).fetchone()
            return definition_result(w, status, state, stored and (
                stored[0], stored[1] or None, *stored[2:5]), detail)

        live = text is not None
        if w.change_id and change_id == w.change_id:
            return answer(WriteStatus.OK)
        if w.expected_version == 0 and live:
            return answer(WriteStatus.EXISTS)
        if w.expected_version != 0 and not live:
            return answer(WriteStatus.MISSING)
        if w.expected_version != 0 and version != w.expected_version:
            return answer(WriteStatus.CONFLICT, "version")
        if w.expected_checkpoint is not None and (
                e is None or e["checkpoint"] != w.expected_checkpoint):
            return answer(WriteStatus.CONFLICT, "checkpoint")
        if e is None or e["anchor"] is None:
            e = {"anchor": anchor(), "checkpoint": None, "token": 0}
            db.execute(q["entry_put"], (name, "", e["anchor"], None, 0))
        if w.skip:  # recorded by the claim's own code: a plan of skips alone
            self._claim_one(db, now, "", ClaimPlan(name, EntryState(
                e["anchor"] or 0, e["checkpoint"], e["token"] or 0), skip=w.skip,
                take_due=False))
            e, _ = self._get_entry(db, name)
            assert e is not None
        if w.checkpoint is not None and (e["checkpoint"] is None
                                         or w.checkpoint > e["checkpoint"]):
            db.execute(q["entry_move"], (w.checkpoint, e["token"], name))
        db.execute(q["def_put"], (w.definition, version + 1, w.origin.value, w.by, now,
                                  w.change_id or None, self._next_seq(db, now), name))
        db.execute(q["next_set"], (written_next_due(w), name))
        self._drop_tombstones(db, now)
        return answer(WriteStatus.OK)

    def _version(self, db: sqlite3.Connection, entry: str) -> int | None:
        """The entry's definition version (0: none; None: no entry, or unreadable)."""
        row = db.execute(self._sql["next_state"], (entry,)).fetchone()
        return _maybe_int(row[2]) if row is not None and _is_number(row[2]) else None

    # -- the due index ------------------------------------------------------------------
    def due(self, before: int, limit: int, after: tuple[int, str] | None = None
            ) -> list[DueEntry]:
        before, limit, after = due_cursor(before, limit, after)
        low, name = after if after is not None else (-1, "")
        rows = self._transaction(lambda db: db.execute(
            self._sql["next_due"], (before, low, low, name, limit)).fetchall(), write=False)
        return [DueEntry(str(name), int(next_due), _due_state(anchor, checkpoint, token),
                         _maybe_int(version) or 0)
                for name, next_due, anchor, checkpoint, token, version in rows]

    def index(self, writes: Sequence[IndexWrite]) -> list[bool]:
        def step(db: sqlite3.Connection, now: int, w: IndexWrite) -> bool:
            row = db.execute(self._sql["next_state"], (w.name,)).fetchone()
            if row is None or _maybe_int(row[0]) is None or (
                    _maybe_int(row[0]), _maybe_int(row[1]), _maybe_int(row[2]) or 0) != (
                    w.expected.anchor, w.expected.checkpoint, w.version):
                return False
            db.execute(self._sql["next_set"], (w.next_due, w.name))
            return True

        return self._each("index", checked_index_writes(writes), step,
                          lambda w, exc: False)

    def unindexed(self, limit: int, cursor: str = "") -> Unindexed:
        limit = page_limit(limit, 1)
        names = [str(name) for (name,) in self._transaction(lambda db: db.execute(
            self._sql["next_missing"], (cursor, limit)).fetchall(), write=False)]
        return Unindexed(tuple(names), names[-1] if names else cursor, len(names) < limit)

    def _next_seq(self, db: sqlite3.Connection, now: int) -> int:
        """next_seq in the prelude: above the last number (and the newest in the log), at
        least the clock times CHANGES_PER_MS; a dropped mark that cannot be read is set to
        the head."""
        q = self._sql
        head, dropped, top = self._log_marks(db)
        head = max(head or 0, top[1])
        if dropped is None:
            db.execute(q["meta_set"], ("changes_dropped", str(head)))
        seq = max(head + 1, now * CHANGES_PER_MS)
        db.execute(q["meta_set"], ("changes_seq", str(seq)))
        return seq

    def _log_marks(self, db: sqlite3.Connection
                   ) -> tuple[int | None, int | None, tuple[str, int]]:
        """The change log's head and dropped mark (None: cannot be read; 0: none yet), and
        its newest member (name, number; ('', 0): none)."""
        q = self._sql
        marks = []
        for key in ("changes_seq", "changes_dropped"):
            row = db.execute(q["meta_get"], (key,)).fetchone()
            marks.append(0 if row is None else _maybe_int(row[0]))
        top = db.execute(q["changes_top"]).fetchone()
        return marks[0], marks[1], (str(top[0]), int(top[1])) if top else ("", 0)

    def _drop_tombstones(self, db: sqlite3.Connection, now: int) -> None:
        """Tombstones deleted more than ``tombstones_kept_ms`` ago leave the change log
        (TOMBSTONES_DROPPED at most); the dropped mark rises to their numbers."""
        q = self._sql
        rows = db.execute(q["changes_gone"], (now - self.tombstones_kept_ms,
                                              TOMBSTONES_DROPPED)).fetchall()
        if not rows:
            return
        for name, _ in rows:
            db.execute(q["changes_unlog"], (name,))
        _, dropped, _ = self._log_marks(db)
        db.execute(q["meta_set"], ("changes_dropped",
                                   str(max([dropped or 0, *(int(seq) for _, seq in rows)]))))

    def definitions(self, names: Sequence[str] | None = None, after: str = "",
                    limit: int = 1000) -> list[StoredDefinition]:
        q = self._sql
        if names is None:
            page_limit(limit, 0)

        def work(db: sqlite3.Connection) -> list[Any]:
            if names is None:
                return db.execute(q["defs_page"], (after, limit)).fetchall()
            return [(name, *row) for name in dict.fromkeys(names)
                    if (row := db.execute(q["def_get"], (name,)).fetchone()) is not None]

        return [stored_definition(name, *fields[:5]) for name, *fields
                in self._transaction(work, write=False)
                if fields[1] not in (0, None) or fields[0] is not None]

    def changes(self, cursor: ChangeCursor | None, limit: int = 1000) -> Changes:
        q, limit = self._sql, page_limit(limit, 1)
        position, name, _ = (cursor.positions[0] if cursor is not None
                             and len(cursor.positions) == 1 else (0, "", 0))

        def work(db: sqlite3.Connection) -> tuple[LogRead, list[Any]]:
            head, dropped, top = self._log_marks(db)
            seen = db.execute(q["changes_seen"], (name,)).fetchone() if name else None
            rows = db.execute(q["changes_after"], (position, limit + 1)).fetchall()
            head = max(head, top[1]) if head is not None else top[1]
            return LogRead(head, head if dropped is None else dropped, top,
                           _maybe_int(seen[0]) if seen else None,
                           tuple((row[0], int(row[1])) for row in rows)), rows

        read, rows = self._transaction(work, write=False)
        next_cursor, taken, reload, complete = follow(cursor, [read], limit)
        by_name = {row[0]: row for row in rows}
        return Changes(next_cursor, tuple(stored_definition(n, *by_name[n][2:7])
                                          for n, _ in taken), reload, complete)

    # -- reads ------------------------------------------------------------------------
    def entries(self, names: Sequence[str] | None = None) -> list[EntryRecord]:
        q = self._sql

        def work(db: sqlite3.Connection) -> list[Any]:
            if names is None:
                return db.execute(q["entries_all"]).fetchall()
            return [row for name in names
                    if (row := db.execute(q["entry_read"], (name,)).fetchone()) is not None]

        return [_entry_record(row) for row in self._transaction(work, write=False)]

    def history(self, entry: str, limit: int | None = None) -> list[Run]:
        if limit is not None and limit <= 0:
            return []
        rows = self._transaction(lambda db: db.execute(
            self._sql["history_newest"], (entry, -1 if limit is None else limit)).fetchall(),
            write=False)
        out = []
        for _due, raw in rows:
            try:
                out.append(Run.from_record(entry, json.loads(raw)))
            except (ValueError, TypeError):
                continue  # an unreadable record is shown as missing rather than failing a read
        return out

    def owners(self) -> list[OwnerStatus]:
        rows = self._transaction(lambda db: db.execute(self._sql["owners_all"]).fetchall(),
                                 write=False)
        return _owner_statuses(rows, self._clock())

    def now(self) -> int:
        """This host's clock, as every transition reads it (the store is for one host)."""
        return self._clock()

    # -- workers: liveness ------------------------------------------------------------
    def worker_heartbeat(self, process: WorkerProcess, ttl: float) -> WorkerLiveness:
        ttl_ms = worker_ttl_ms(ttl)
        q = self._workers_statements()

        def work(db: sqlite3.Connection) -> WorkerLiveness:
            """worker_heartbeat.lua: the process is alive for ttl more."""
            now = self._clock()
            db.execute(q["forget"], (now - self.worker_records_kept_ms,))
            record = WorkerLiveness(process, now, now + ttl_ms)
            db.execute(q["put"], (worker_id(process), json.dumps({
                "worker": process.worker, "pid": process.pid, "process": process.process,
                "renewed_at": now, "expires_at": now + ttl_ms}), now + ttl_ms))
            return record

        # (a liveness write is harmless in whichever file: allowed before a beat's
        # heartbeat has read the epoch, as that heartbeat is)
        return self._transaction(work, heartbeat=True)

    def worker_liveness(self, processes: Sequence[WorkerProcess]) -> WorkerLivenessRead:
        processes = list(processes)
        q = self._workers_statements()

        def work(db: sqlite3.Connection) -> list[Any]:
            return [db.execute(q["get"], (worker_id(p),)).fetchone() for p in processes]

        rows = self._transaction(work, write=False)
        return WorkerLivenessRead(self._clock(), tuple(
            read_worker_record(p, row[0] if row else None) for p, row in zip(processes, rows)))


class SQLiteStore(RowStore):
    """The store in one SQLite file, for the beats, workers and operators of one host."""

    @classmethod
    def from_url(cls, url: str, prefix: str = "beat-claims", history_limit: int = 100,
                 timeout: float = 5.0) -> SQLiteStore:
        """The store of a ``sqlite:///`` URL, opened at once: a path that cannot work is an
        error now (naming the setting), not at the first claim."""
        store = cls(_path_from_url(url), prefix, history_limit, timeout, url)
        store._check_path()
        try:
            with store._locked():
                store._connection(starting=True)
        except StoreError as exc:  # busy: set up at the first call instead
            logger.warning("beat-claims: %s is busy (%s); retried at the first call",
                           store.description, exc)
        return store


def _due_state(anchor: Any, checkpoint: Any, token: Any) -> EntryState | None:
    """An indexed entry's state as stored (None: a field cannot be read)."""
    try:
        a, c, k = _entry_int(anchor), _entry_int(checkpoint), _entry_int(token)
    except ValueError:
        return None
    return None if a is None else EntryState(a, c, k or 0)


def _entry_record(row: Sequence[Any]) -> EntryRecord:
    """An entry as operators see it, from a row of entry_read (or entries_all)."""
    (name, description, anchor, checkpoint, token, by, note, at, resumed_by, resumed_at,
     last_paused_at, registrants, horizon) = row
    # Paused is the column being set, as claims and checks read it; an instant that cannot
    # be read is reported as 0 rather than hiding the pause.
    return EntryRecord(
        name, description or "", _maybe_int(anchor), _maybe_int(checkpoint),
        _maybe_int(token) or 0,
        paused=None if at is None else Pause(str(by or ""), str(note or ""),
                                             _maybe_int(at) or 0),
        resumed_by=None if resumed_by is None else str(resumed_by),
        resumed_at=_maybe_int(resumed_at), last_paused_at=_maybe_int(last_paused_at),
        registrants=None if registrants is None else registrants_from_json(registrants),
        history_horizon=_maybe_int(horizon))


def _owner_statuses(rows: list[Any], now: int) -> list[OwnerStatus]:
    out = []
    for _id, raw, expires in rows:
        try:
            owner = Owner.from_dict(json.loads(raw))
        except (ValueError, KeyError, TypeError):
            continue
        expires_at = _maybe_int(expires) or 0
        out.append(OwnerStatus(owner, expires_at > now, expires_at))
    return out


def _read_only_fs(path: str) -> str:
    try:
        flags = os.statvfs(path if os.path.exists(path) else os.path.dirname(path)).f_flag
    except OSError:
        return ""
    return " (a read-only file system)" if flags & os.ST_RDONLY else ""


# -- fork safety --------------------------------------------------------------------------
#: Every store of this process: their connections are closed before a fork (SQLite's
#: per-process lock bookkeeping must not be inherited) and reopened on next use.
_STORES: weakref.WeakSet[RowStore] = weakref.WeakSet()


def _before_fork() -> None:
    for store in list(_STORES):
        if store._lock.acquire(blocking=False):  # one in use stays; the child forgets it
            try:
                store._drop_connection()
            finally:
                store._lock.release()


def _after_fork_in_child() -> None:
    for store in list(_STORES):
        store._lock = threading.Lock()  # a thread of the parent may have held it
        store._forget_connection()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


__all__ = ["SCHEMA_VERSION", "RowStore", "SQLiteStore", "Tables"]
