"""The PostgreSQL store: each transition is one transaction, run by a function the store
installs, so a batch of items is one statement and one round trip.

Layout: a schema of its own, named from ``beat_claims_key_prefix`` (``beat-claims`` ->
``beat_claims``; see :func:`schema_name`), created and migrated by the store.

=============  ================================================================================
``version``    the layout's version (one row); a newer one than this code knows is refused
``epoch``      the store's epoch (one row): random id, settle_until, since, the server's identity
``anchoring``  the instant new entries are anchored at, shared for 2 s (one row)
``owners``     beats: id -> info (host, pid, start time), heartbeat expiry (database clock, ms)
``entries``    entries: id, name, description, anchor, checkpoint, token, and an operator's
               pause (paused_at, paused_by, paused_note; resumed_by, resumed_at: the last
               resume, last_paused_at: when the pause it ended began) (typed columns); the
               beats that registered it (``registrants``, jsonb: owner id -> when; NULL:
               none recorded) and its history horizon (``horizon``: the newest instant
               whose run a trim removed; NULL: none); its definition (``definition``: JSON
               text, NULL in a tombstone; ``version``: 0 when it never had one;
               ``origin``, ``changed_by``, ``changed_at``; ``change_id``: the last
               change's) and ``changed_seq`` (its place in the change log: the number of its
               last definition change; NULL: not in the log, or a tombstone past
               TOMBSTONE_KEPT_MS); ``next_due``, the due index (its next due instant, ms;
               NOT_DUE, -1: not due; NULL: never indexed), written in the transaction that
               moves the checkpoint or changes the definition
``changes``    the change log's sequence (one row, locked by every definition write until it
               commits: numbers are committed in their order): seq (the last number handed
               out), dropped (the newest number of an entry that left the log: a tombstone
               past its keep, or a pruned entry, by the trigger ``entries_unlog``)
``runs``       runs: (entry id, due) -> ``record`` (jsonb: the same record the Redis store
               keeps), ``in_history``, ``lost_at`` (left the history presumed lost: kept a
               week for a late delivery), and index columns computed from the record by a
               trigger at every write, whoever writes (``readable``, ``live_state``: its
               state unless final or unreadable, ``owner``, ``token``, ``since``), so that
               an index never disagrees with its record
``tasks``      task id -> the run it was started for (token): goes with the run (cascade)
``ident``      the store's id (one row), kept as long as the store keeps its records
``workers``    worker processes: id (``worker_id``) -> ``record`` (jsonb: node name, pid,
               process identity, renewed_at, expires_at), expires_at (removed
               ``worker_records_kept`` after it lapsed, by the heartbeats)
functions      one per transition (register, claim, check, sent, release, reclaim, start,
               requeue, finish, request, backfill, pause, resume, forget, heartbeat,
               register_as: register and note the registrant, unregister, define: a batch
               of definition writes, index: a batch of conditional next_due writes) and
               their helpers (trim, anchor_instant, busy: what the overlap policies wait
               for, paused_for: whether a pause skips an instant, index_run: the trigger
               that computes a run's index columns)
=============  ================================================================================

Partial indexes on ``runs`` (``since`` where due / waiting / held / open, ``(entry, due)`` where not
final, ``(entry, lost_at)`` where lost) keep sweeps and claims cheap whatever the number of
entries: they read only the runs that need a beat. On ``entries``, ``(next_due, name
COLLATE "C")`` where indexed (what falls due, a page at a time) and ``(name COLLATE "C")``
where ``next_due`` is NULL (a rebuild sweep's pages) do the same for the due index.

Semantics are the Lua scripts', transition by transition (``stores/lua``), with the entry's
row as the mutex of the entry and its runs: every transition first locks the rows of the
entries it names (``FOR NO KEY UPDATE``, in name order, so that two batches never deadlock),
then reads and writes their runs. "Now" is the database's ``clock_timestamp()``, read after
those locks are taken: ``now()`` is the transaction's start, which a transaction that waited
for a lock would record as the time of its claim (older than writes that committed before
it), and sweeps page through ``since`` values.

A batch is one statement, ``SELECT schema.claim(owner, items)`` over a jsonb array of up to
CHUNK items: the function reads what the whole batch needs at once (the entries, their
runs), so the items of one call name distinct entries (claims) or runs (the others), and
the client cuts a call where one repeats. Heartbeats commit without waiting for the WAL
flush: one a crash loses makes its owner look dead sooner, which is safe.

Connections: one per store and process, shared by threads under a lock; autocommit (each
call is one statement, hence one transaction); connect timeout, ``statement_timeout`` and a
client-side deadline from ``timeout``; nothing is retried, except a statement that failed
because the schema was missing (a wipe, a restore of an empty database): the schema is
installed again and that statement sent again (it did nothing).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import re
import threading
import uuid
import zlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
from celery.utils.log import get_logger
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

from ..enums import FINAL_STATES, Overlap, Reason, RunState, StartVerdict
from ..runs import Owner, Run, iso
from ..urls import raise_redacted, redact_text, redact_url
from .base import (
    CHANGES_PER_MS,
    DUE_AT_ONCE,
    NOT_DUE,
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
    page_limit,
    read_worker_record,
    registrants_from_json,
    stored_definition,
    worker_id,
    worker_ttl_ms,
    written_next_due,
    written_worker_record,
)
from .redis import ANCHOR_SHARED_MS, FORGET_OWNERS_MS, WEEK_MS

logger = get_logger("celery.beat.claims")

T = TypeVar("T")

#: The layout's version. A change to a table or a function gets a new one and a migration.
LAYOUT = 11
#: Migrations: MIGRATIONS[n] takes a schema of layout n to n + 1 (the functions are then
#: installed again whatever the version). A function whose arguments change must be dropped
#: there: CREATE OR REPLACE with other arguments adds an overload, it replaces nothing.
MIGRATIONS: dict[int, str] = {
    # 2: an operator's pause of an entry (pause, resume). The waiting state of
    # overlap="buffer_one" needs no column: the functions and the index are installed.
    1: """
ALTER TABLE {s}.entries ADD COLUMN IF NOT EXISTS paused_at bigint,
  ADD COLUMN IF NOT EXISTS paused_by text, ADD COLUMN IF NOT EXISTS paused_note text,
  ADD COLUMN IF NOT EXISTS resumed_by text, ADD COLUMN IF NOT EXISTS resumed_at bigint;
""",
    # 3: the start of the pause the last resume ended (last_paused_at: with resumed_at, the
    # last pause's interval, whose occurrences stay skipped when claimed after the resume);
    # pause() and resume() answer it too (another return type: dropped, then installed).
    # The other functions changed in place (backfill bounded by the history, late outcomes
    # of lost runs, register's token counter, a waiting run checked again).
    2: """
ALTER TABLE {s}.entries ADD COLUMN IF NOT EXISTS last_paused_at bigint;
DROP FUNCTION IF EXISTS {s}.pause(text, text, text);
DROP FUNCTION IF EXISTS {s}.resume(text, text);
""",
    # 4: register() puts a sent run the caller knows over the run a backfill replaced (one
    # that ended without running, with a lower token) that an older copy of the store
    # holds: no table changes, the functions are installed again.
    3: "SELECT 1;",
    # 5: register() also puts a later-token sent run over an earlier send no worker started
    # (two backfills of one instant, restored from an older copy): functions only.
    4: "SELECT 1;",
    # 6: the liveness of worker processes (the workers table, worker_heartbeat(): created
    # by the DDL installed after the migrations); the last heartbeat's instant (beat_at),
    # and heartbeat() looks for the caller's newest writes (another signature: dropped,
    # then installed); claim() hands out no token below the clock; the beats that
    # registered an entry (registrants: forget keeps an entry a live beat registered) and
    # its history horizon (trim raises it; backfill refuses instants at or before it):
    # NULL in every existing row (none recorded).
    5: """
ALTER TABLE {s}.epoch ADD COLUMN IF NOT EXISTS beat_at bigint;
DROP FUNCTION IF EXISTS {s}.heartbeat(text, jsonb, bigint, boolean, text, bigint, boolean,
                                      text);
ALTER TABLE {s}.entries ADD COLUMN IF NOT EXISTS registrants jsonb,
  ADD COLUMN IF NOT EXISTS horizon bigint;
""",
    # 7: an entry's definition (version 0 in every existing row: none), its version, origin,
    # last change, and its place in the change log (changed_seq); the change log's table,
    # indexes and trigger, and define() (created by the DDL installed after the
    # migrations); forget() keeps an entry with a live definition (functions only).
    6: """
ALTER TABLE {s}.entries ADD COLUMN IF NOT EXISTS definition text,
  ADD COLUMN IF NOT EXISTS version bigint NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS origin text, ADD COLUMN IF NOT EXISTS changed_by text,
  ADD COLUMN IF NOT EXISTS changed_at bigint, ADD COLUMN IF NOT EXISTS change_id text,
  ADD COLUMN IF NOT EXISTS changed_seq bigint;
""",
    # 8: heartbeat() looks for a check before publish among the caller's newest writes
    # (each one says what was written: 'k'), and answers whether the caller's record was
    # there before ('known') and when the epoch began ('since'): functions only.
    7: "SELECT 1;",
    # 9: the due index: an entry's next due instant (next_due: NULL in every existing row,
    # not indexed: a rebuild sweep pages through them, Store.unindexed, and indexes each),
    # its indexes (created by the DDL installed after the migrations), claim() and
    # define() writing it, index() (functions).
    8: """
ALTER TABLE {s}.entries ADD COLUMN IF NOT EXISTS next_due bigint;
""",
    # 10: heartbeat() checks the caller's continuity (p_continuity: the epoch it saw, when,
    # and whether its record was renewed within a TTL) and begins a new epoch in its own
    # step when the store does not show it (another signature: dropped, then installed).
    9: """
DROP FUNCTION IF EXISTS {s}.heartbeat(text, jsonb, bigint, boolean, text, bigint, boolean,
                                      text, jsonb);
""",
    # 11: heartbeat() takes a write the caller confirmed at an earlier heartbeat ('c') of an
    # entry the store no longer holds, or holds made anew (another anchor, 'a'), for
    # removed (a prune), not lost: functions only.
    10: "SELECT 1;",
}
#: The oldest server the layout is meant for (it uses nothing newer than 11: jsonb -> numeric
#: casts, EXECUTE FUNCTION triggers; tested on 15).
MIN_SERVER_VERSION = 120000
#: Items per statement: a bigger batch holds its entries' locks longer.
CHUNK = 1000
#: Number fields of a run's record: any other type makes it unreadable (as in the Lua
#: prelude's get_run).
NUMBER_FIELDS = ("due", "token", "claimed_at", "sending_at", "sent_at", "started_at",
                 "finished_at", "released_at", "revived_at", "worker_pid", "retries",
                 "attempts", "reclaims", "deliveries")
#: libpq keywords a Django database's OPTIONS may hold that are Django's, not libpq's.
_DJANGO_ONLY_OPTIONS = ("isolation_level", "server_side_binding", "assume_role", "pool",
                        "cursor_factory", "context")
#: Errors that mean the schema (or part of it) is not there: it is installed again.
_MISSING = (pg_errors.UndefinedTable, pg_errors.UndefinedFunction,
            pg_errors.InvalidSchemaName, pg_errors.UndefinedColumn)
#: Errors that mean the server cannot serve us now: an outage, not a bad record.
_OUTAGE = (psycopg.OperationalError, psycopg.InterfaceError,
           pg_errors.ReadOnlySqlTransaction, pg_errors.InsufficientPrivilege,
           pg_errors.CannotConnectNow)

# -- names -----------------------------------------------------------------------------
_IDENT = re.compile(r"[^a-z0-9_]+")


def schema_name(prefix: str) -> str:
    """The schema of a key prefix: lower case letters, digits and ``_`` (runs of anything
    else become one ``_``), at most 63 bytes, never a name PostgreSQL reserves. Prefixes
    that differ only in those characters share a schema."""
    name = _IDENT.sub("_", prefix.lower()).strip("_") or "beat_claims"
    if name[0].isdigit() or name.startswith("pg_") or name in ("public",
                                                                "information_schema"):
        name = f"bc_{name}"
    if len(name) > 63:
        digest = f"{zlib.crc32(prefix.encode()):08x}"
        name = f"{name[:54]}_{digest}"
    return name


def _quoted_list(values: Sequence[str]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in sorted(values)) + ")"


def _sql_names(schema: str) -> dict[str, str]:
    """What the SQL below is formatted with: the schema, and the names of states, reasons
    and replies generated from the enums (never written a second time in SQL)."""
    names = {"s": f'"{schema}"', "WEEK_MS": str(WEEK_MS),
             "ANCHOR_SHARED_MS": str(ANCHOR_SHARED_MS), "TOKENS_PER_MS": str(TOKENS_PER_MS)}
    names.update({state.name: f"'{state.value}'" for state in RunState})
    names.update({f"R_{reason.name}": f"'{reason.value}'" for reason in Reason})
    names.update({f"C_{status.name}": f"'{status.value}'" for status in ClaimStatus})
    names.update({f"V_{verdict.name}": f"'{verdict.value}'" for verdict in CheckVerdict})
    names.update({f"S_{verdict.name}": f"'{verdict.value}'" for verdict in StartVerdict})
    names.update({f"W_{status.name}": f"'{status.value}'" for status in WriteStatus})
    names.update({f"K_{kind.name}": f"'{kind.value}'" for kind in Wrote})
    names["CHANGES_PER_MS"] = str(CHANGES_PER_MS)
    names["DUE_AT_ONCE"], names["NOT_DUE"] = str(DUE_AT_ONCE), str(NOT_DUE)
    names["TOMBSTONES_DROPPED"] = str(TOMBSTONES_DROPPED)
    names["DEFINED"] = "(version <> 0 OR definition IS NOT NULL)"
    names["OVERLAP_SKIP"] = f"'{Overlap.SKIP.value}'"
    names["OVERLAP_BUFFER_ONE"] = f"'{Overlap.BUFFER_ONE.value}'"
    # A batch's items (entry, due) with their runs, in order, in one read: the items of one
    # call name distinct runs (the Python side cuts a call where one repeats).
    select_runs = (
        "SELECT x.value, r.entry_id, r.record, r.readable{} FROM jsonb_array_elements(p_items)"
        " WITH ORDINALITY x (value, n)"
        f" LEFT JOIN {names['s']}.entries e ON e.name = x.value ->> 'e'"
        f" LEFT JOIN {names['s']}.runs r"
        " ON r.entry_id = e.id AND r.due = (x.value ->> 'd')::bigint ORDER BY x.n")
    names["SELECT_RUNS"] = select_runs.format("")
    # The entries a batch of items names, locked in one order (name) so that two batches
    # never wait on each other in a circle.
    names["LOCK_ITEMS_ENTRIES"] = (
        f"PERFORM 1 FROM {names['s']}.entries e"
        " WHERE e.name IN (SELECT x ->> 'e' FROM jsonb_array_elements(p_items) x)"
        " ORDER BY e.name FOR NO KEY UPDATE;")
    names["SELECT_RUNS_SINCE"] = select_runs.format(", r.since")
    names["STATES"] = _quoted_list([s.value for s in RunState])
    names["FINAL"] = _quoted_list([s.value for s in FINAL_STATES])
    names["HELD"] = _quoted_list([s.value for s in RunState if s.held])
    names["OPEN"] = _quoted_list([s.value for s in RunState if s.open])
    names["REASONS"] = _quoted_list([r.value for r in Reason])
    # Each present number field a number small enough for a bigint (a CASE: never cast a
    # value before its type is known).
    names["NUMBERS_OK"] = "\n      AND ".join(
        f"CASE WHEN NOT r ? '{f}' THEN true WHEN jsonb_typeof(r -> '{f}') <> 'number'"
        f" THEN false ELSE abs((r -> '{f}')::numeric) < 9e18 END"
        for f in NUMBER_FIELDS) + "\n      AND r ? 'due'"
    return names


# -- the schema ------------------------------------------------------------------------
# Formatted with _sql_names(): {s} is the schema, {CLAIMED} a state's name, and so on.
# Tables first, then the trigger that indexes runs, then the transitions. Every statement
# is idempotent: installing again repairs what is missing.
_DDL = """
CREATE SCHEMA IF NOT EXISTS {s};

-- An integer field of a record, or NULL (absent, not a number, out of range). Never raises,
-- whatever a record holds.
CREATE OR REPLACE FUNCTION {s}.int_of(v jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN jsonb_typeof(v) IS DISTINCT FROM 'number' THEN NULL
              WHEN abs(v::numeric) >= 9e18 THEN NULL
              ELSE floor(v::numeric)::bigint END
$$;

CREATE OR REPLACE FUNCTION {s}.now_ms() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
$$;

CREATE TABLE IF NOT EXISTS {s}.version (version integer NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.epoch (
  one boolean PRIMARY KEY DEFAULT true CHECK (one),
  id text NOT NULL,
  settle_until bigint,
  since bigint NOT NULL,
  server text NOT NULL,
  beat_at bigint);
CREATE TABLE IF NOT EXISTS {s}.anchoring (
  one boolean PRIMARY KEY DEFAULT true CHECK (one),
  instant bigint NOT NULL,
  expires_at bigint NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.owners (
  id text PRIMARY KEY,
  info jsonb NOT NULL,
  expires_at bigint NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.entries (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  name text NOT NULL UNIQUE,
  description text NOT NULL DEFAULT '',
  anchor bigint NOT NULL,
  checkpoint bigint,
  token bigint NOT NULL DEFAULT 0,
  paused_at bigint,
  paused_by text,
  paused_note text,
  resumed_by text,
  resumed_at bigint,
  last_paused_at bigint,
  registrants jsonb,
  horizon bigint,
  definition text,
  version bigint NOT NULL DEFAULT 0,
  origin text,
  changed_by text,
  changed_at bigint,
  change_id text,
  changed_seq bigint,
  next_due bigint);
CREATE TABLE IF NOT EXISTS {s}.runs (
  entry_id bigint NOT NULL REFERENCES {s}.entries (id),
  due bigint NOT NULL,
  record jsonb NOT NULL,
  in_history boolean NOT NULL DEFAULT true,
  lost_at bigint,
  -- Computed from the record by index_run() at every write, whoever writes:
  readable boolean NOT NULL DEFAULT false,
  live_state text,
  owner text,
  token bigint,
  since bigint,
  PRIMARY KEY (entry_id, due));
CREATE INDEX IF NOT EXISTS runs_live ON {s}.runs (entry_id, due) WHERE live_state IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_due ON {s}.runs (since) WHERE live_state = {DUE};
CREATE INDEX IF NOT EXISTS runs_waiting ON {s}.runs (since) WHERE live_state = {WAITING};
CREATE INDEX IF NOT EXISTS runs_held ON {s}.runs (since) WHERE live_state IN {HELD};
CREATE INDEX IF NOT EXISTS runs_open ON {s}.runs (since) WHERE live_state IN {OPEN};
CREATE INDEX IF NOT EXISTS runs_lost ON {s}.runs (entry_id, lost_at)
  WHERE lost_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_unreadable ON {s}.runs (entry_id, due) WHERE NOT readable;

-- A run's index columns, from its record (the Lua prelude's get_run, index and since): a
-- record that cannot be read (not an object, an unknown state, another due instant, a
-- number field that is not a number, an owner that is not a string) is in no index.
-- A trigger rather than generated columns: those are planned again at every statement,
-- and these checks once per session.
CREATE OR REPLACE FUNCTION {s}.index_run() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  r jsonb := NEW.record;
  v_state text := NEW.record ->> 'state';
BEGIN
  NEW.readable := false;
  NEW.live_state := NULL;
  NEW.owner := NULL;
  NEW.token := NULL;
  NEW.since := NULL;
  IF jsonb_typeof(r) IS DISTINCT FROM 'object'
      OR jsonb_typeof(r -> 'state') IS DISTINCT FROM 'string'
      OR v_state NOT IN {STATES}
      OR (r ? 'owner' AND jsonb_typeof(r -> 'owner') <> 'string') THEN
    RETURN NEW;
  END IF;
  IF NOT ({NUMBERS_OK}) THEN
    RETURN NEW;
  END IF;
  IF (r -> 'due')::numeric <> NEW.due THEN
    RETURN NEW;
  END IF;
  NEW.readable := true;
  NEW.live_state := CASE WHEN v_state IN {FINAL} THEN NULL ELSE v_state END;
  NEW.owner := r ->> 'owner';
  NEW.token := coalesce(floor((r -> 'token')::numeric), 0);
  -- The instant the run last became what it is: what sweeps compare with their cutoffs.
  NEW.since := floor(CASE
    WHEN v_state = {DUE} THEN coalesce(r -> 'released_at', r -> 'claimed_at', r -> 'due')
    WHEN v_state = {WAITING} THEN to_jsonb(coalesce({s}.int_of(r -> 'waiting_at'), NEW.due))
    WHEN v_state IN {HELD} THEN coalesce(r -> 'sending_at', r -> 'claimed_at', '0')
    ELSE coalesce(r -> 'revived_at', r -> 'started_at', r -> 'sent_at', r -> 'sending_at',
                  '0') END::numeric);
  RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS index_run ON {s}.runs;
CREATE TRIGGER index_run BEFORE INSERT OR UPDATE ON {s}.runs
  FOR EACH ROW EXECUTE FUNCTION {s}.index_run();

-- The run a task id was started for: it goes with the run (trimmed, or forgotten).
CREATE TABLE IF NOT EXISTS {s}.tasks (
  task_id text PRIMARY KEY,
  entry_id bigint NOT NULL,
  due bigint NOT NULL,
  token bigint NOT NULL,
  FOREIGN KEY (entry_id, due) REFERENCES {s}.runs (entry_id, due) ON DELETE CASCADE);
CREATE INDEX IF NOT EXISTS tasks_run ON {s}.tasks (entry_id, due);
-- The store's id: kept as long as the store keeps its records (a wipe makes a new one).
CREATE TABLE IF NOT EXISTS {s}.ident (
  one boolean PRIMARY KEY DEFAULT true CHECK (one),
  id text NOT NULL);

-- Which server process holds the data: its system identifier, timeline and start time,
-- and the epoch table itself (a restore or a wipe recreates it: a new relation).
CREATE OR REPLACE FUNCTION {s}.server_identity() RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  v_system text := '';
  v_timeline text := '';
BEGIN
  IF has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE') THEN
    SELECT system_identifier::text INTO v_system FROM pg_catalog.pg_control_system();
  END IF;
  IF NOT pg_is_in_recovery()
      AND has_function_privilege('pg_catalog.pg_current_wal_lsn()', 'EXECUTE') THEN
    v_timeline := substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8);
  END IF;
  RETURN concat_ws(':', v_system, v_timeline,
                   extract(epoch FROM pg_postmaster_start_time())::text,
                   '{s}.epoch'::regclass::oid::text);
END $$;

-- The instant new entries are anchored at: entries first seen within ANCHOR_SHARED_MS of
-- each other share it (anchor_instant.lua).
CREATE OR REPLACE FUNCTION {s}.anchor_instant() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  v_now bigint;
  v_instant bigint;
BEGIN
  PERFORM 1 FROM {s}.anchoring FOR UPDATE;
  v_now := {s}.now_ms();
  INSERT INTO {s}.anchoring AS a (one, instant, expires_at)
    VALUES (true, v_now, v_now + {ANCHOR_SHARED_MS})
    ON CONFLICT (one) DO UPDATE SET instant = excluded.instant, expires_at = excluded.expires_at
      WHERE a.expires_at <= excluded.instant
    RETURNING a.instant INTO v_instant;
  IF v_instant IS NULL THEN
    SELECT a.instant INTO v_instant FROM {s}.anchoring a;
  END IF;
  RETURN v_instant;
END $$;

-- Whether a scheduled run due at p_due is skipped for a pause: the entry is paused
-- (p_paused_at), or p_due is in its last pause [p_last, p_resumed) (kept after the resume).
CREATE OR REPLACE FUNCTION {s}.paused_for(p_paused_at bigint, p_last bigint,
                                          p_resumed bigint, p_due bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT p_paused_at IS NOT NULL
    OR coalesce(p_due >= p_last AND p_due < p_resumed, false)
$$;

-- Whether a run of the entry other than p_besides is being sent, sent or started: what the
-- overlap policies wait for (the prelude's busy_besides). A run registered again after a
-- wipe as sent, that no worker has started since, may well be finished: it does not count.
CREATE OR REPLACE FUNCTION {s}.busy(p_entry bigint, p_besides bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM {s}.runs r WHERE r.entry_id = p_entry
    AND r.due IS DISTINCT FROM p_besides AND r.live_state IN ({SENDING}, {SENT}, {STARTED})
    AND NOT (r.live_state = {SENT} AND coalesce(r.record -> 'reseeded' <> 'false', false)))
$$;

-- A trim removed runs up to p_gone (NULL: none): the entry's history horizon moves up to
-- it, never back (the prelude's raise_horizon). Called with the entry's row locked.
CREATE OR REPLACE FUNCTION {s}.raise_horizon(p_entry bigint, p_gone bigint)
RETURNS void LANGUAGE sql AS $$
  UPDATE {s}.entries SET horizon = p_gone
    WHERE id = p_entry AND p_gone IS NOT NULL AND (horizon IS NULL OR horizon < p_gone)
$$;

-- Whether a beat whose heartbeat has not lapsed is among p_registrants (the prelude's
-- registered_alive); NULL (none recorded) is not; one that is not a JSON object of
-- numbers cannot be read, and counts as one (nothing is removed that cannot be seen).
CREATE OR REPLACE FUNCTION {s}.registered_alive(p_registrants jsonb) RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT CASE WHEN p_registrants IS NULL THEN false
    WHEN jsonb_typeof(p_registrants) <> 'object' THEN true
    WHEN EXISTS (SELECT 1 FROM jsonb_each(p_registrants) r
                 WHERE jsonb_typeof(r.value) <> 'number') THEN true
    ELSE EXISTS (SELECT 1 FROM jsonb_object_keys(p_registrants) k
                 JOIN {s}.owners o ON o.id = k WHERE o.expires_at > {s}.now_ms()) END
$$;

-- Keep the entry's history to p_limit runs (the prelude's trim): the oldest final or
-- unreadable runs go first, wherever they are; a lost run leaves the history for the lost
-- set (kept a week, at most p_limit); only when there are not enough of those is the
-- oldest run sent and never started pushed out, presumed lost (history_limit).
-- A caller that counted the history already passes the count (p_count), and whether the
-- entry keeps lost runs (p_lost).
CREATE OR REPLACE FUNCTION {s}.trim(p_entry bigint, p_limit integer, p_now bigint,
                                    p_count bigint DEFAULT NULL, p_lost boolean DEFAULT true)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  v_excess integer;
  v_row record;
  v_unstarted jsonb[] := ARRAY[]::jsonb[];
  v_rec jsonb;
  v_expired integer;
  v_lost integer;
  v_gone bigint;  -- the newest instant whose run leaves the store: the horizon
BEGIN
  IF p_count IS NULL THEN
    SELECT count(*) INTO p_count FROM {s}.runs WHERE entry_id = p_entry AND in_history;
  END IF;
  v_excess := p_count - p_limit;
  IF v_excess > 0 THEN
    FOR v_row IN SELECT r.due, r.record, r.readable AS ok FROM {s}.runs r
        WHERE r.entry_id = p_entry AND r.in_history ORDER BY r.due LIMIT v_excess + 64 LOOP
      EXIT WHEN v_excess <= 0;
      IF NOT v_row.ok THEN
        DELETE FROM {s}.runs WHERE entry_id = p_entry AND due = v_row.due;
        v_excess := v_excess - 1;
        v_gone := greatest(v_gone, v_row.due);
      ELSIF v_row.record ->> 'state' = {LOST} THEN
        UPDATE {s}.runs SET in_history = false,
            lost_at = coalesce({s}.int_of(v_row.record -> 'finished_at'), p_now)
          WHERE entry_id = p_entry AND due = v_row.due;
        v_excess := v_excess - 1;
        p_lost := true;
      ELSIF v_row.record ->> 'state' IN {FINAL} THEN
        DELETE FROM {s}.runs WHERE entry_id = p_entry AND due = v_row.due;
        v_excess := v_excess - 1;
        v_gone := greatest(v_gone, v_row.due);
      ELSIF v_row.record ->> 'state' = {SENT} AND NOT v_row.record ? 'started_at' THEN
        v_unstarted := array_append(v_unstarted, v_row.record);
      END IF;
    END LOOP;
    FOR i IN 1 .. least(v_excess, coalesce(array_length(v_unstarted, 1), 0)) LOOP
      v_rec := v_unstarted[i] || jsonb_build_object(
        'state', {LOST}, 'reason', {R_HISTORY_LIMIT}, 'finished_at', p_now);
      UPDATE {s}.runs SET record = v_rec, in_history = false, lost_at = p_now
        WHERE entry_id = p_entry AND due = {s}.int_of(v_rec -> 'due');
      p_lost := true;
    END LOOP;
  END IF;
  IF NOT p_lost THEN
    PERFORM {s}.raise_horizon(p_entry, v_gone);
    RETURN;
  END IF;
  SELECT count(*) FILTER (WHERE lost_at < p_now - {WEEK_MS}), count(*)
    INTO v_expired, v_lost FROM {s}.runs WHERE entry_id = p_entry AND lost_at IS NOT NULL;
  IF v_expired > 0 OR v_lost - v_expired > p_limit THEN
    FOR v_row IN SELECT r.due, r.record, r.readable AS ok FROM {s}.runs r
        WHERE r.entry_id = p_entry AND r.lost_at IS NOT NULL ORDER BY r.lost_at, r.due
        LIMIT v_expired + greatest(v_lost - v_expired - p_limit, 0) LOOP
      IF NOT v_row.ok OR v_row.record ->> 'state' = {LOST} THEN
        DELETE FROM {s}.runs WHERE entry_id = p_entry AND due = v_row.due;
        v_gone := greatest(v_gone, v_row.due);
      ELSE
        UPDATE {s}.runs SET lost_at = NULL WHERE entry_id = p_entry AND due = v_row.due;
      END IF;
    END LOOP;
  END IF;
  PERFORM {s}.raise_horizon(p_entry, v_gone);
END $$;

-- register.lua, for a batch of seeds [{{e, desc, a, c, t, runs}}]: new entries anchored at
-- the shared instant (the first beat wins), floors merged without going back, known runs
-- restored where the store has no record at their instant, the token counter raised to
-- every token of theirs. (An entry's fields are typed
-- columns: there is no unreadable field to repair.)
CREATE OR REPLACE FUNCTION {s}.register(p_seeds jsonb, p_limit integer)
RETURNS TABLE (o_name text, o_anchor bigint, o_checkpoint bigint, o_token bigint)
LANGUAGE plpgsql AS $$
DECLARE
  v_seed jsonb;
  v_entry record;
  v_anchor bigint;
  v_run jsonb;
BEGIN
  IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_seeds) x
             WHERE NOT EXISTS (SELECT 1 FROM {s}.entries e WHERE e.name = x ->> 'e')) THEN
    v_anchor := {s}.anchor_instant();
    -- (a new entry is indexed due at once: its reader computes when it is due)
    INSERT INTO {s}.entries (name, description, anchor, checkpoint, token, next_due)
      SELECT x ->> 'e', coalesce(x ->> 'desc', ''), coalesce((x ->> 'a')::bigint, v_anchor),
             (x ->> 'c')::bigint, coalesce((x ->> 't')::bigint, 0), {DUE_AT_ONCE}
        FROM jsonb_array_elements(p_seeds) x ORDER BY x ->> 'e'
      ON CONFLICT (name) DO NOTHING;
  END IF;
  PERFORM 1 FROM {s}.entries e
    WHERE e.name IN (SELECT x ->> 'e' FROM jsonb_array_elements(p_seeds) x)
    ORDER BY e.name FOR NO KEY UPDATE;
  FOR v_seed IN SELECT x FROM jsonb_array_elements(p_seeds) x LOOP
    UPDATE {s}.entries e SET description = coalesce(v_seed ->> 'desc', ''),
        checkpoint = CASE WHEN e.checkpoint IS NULL OR e.checkpoint < (v_seed ->> 'c')::bigint
                          THEN coalesce((v_seed ->> 'c')::bigint, e.checkpoint)
                          ELSE e.checkpoint END,
        -- every token of the runs the caller knows was handed out (restored or not)
        token = greatest(e.token, coalesce((v_seed ->> 't')::bigint, 0),
          (SELECT max({s}.int_of(x -> 'token'))
             FROM jsonb_array_elements(coalesce(v_seed -> 'runs', '[]')) x))
      WHERE e.name = v_seed ->> 'e'
      RETURNING e.id, e.anchor, e.checkpoint, e.token INTO v_entry;
    CONTINUE WHEN NOT FOUND;
    IF jsonb_array_length(coalesce(v_seed -> 'runs', '[]')) > 0 THEN
      FOR v_run IN SELECT x FROM jsonb_array_elements(v_seed -> 'runs') x LOOP
        -- An older copy of the store holds the run a backfill replaced (it ended without
        -- running, or an earlier send no worker started), and the caller sent a later run
        -- since, with a later token (the record of an instant carries its latest token: the
        -- copy is behind): as a backfill does, the old row goes (with its task ids), and
        -- the caller's is put.
        DELETE FROM {s}.runs r
          WHERE r.entry_id = v_entry.id AND r.due = (v_run ->> 'due')::bigint
            AND v_run ->> 'state' = {SENT} AND r.readable
            AND (r.record ->> 'state' IN ({SKIPPED}, {CANCELLED})
                 OR (r.record ->> 'state' IN ({LOST}, {SENT})
                     AND r.record ->> 'started_at' IS NULL))
            AND coalesce({s}.int_of(r.record -> 'token'), 0)
                < coalesce({s}.int_of(v_run -> 'token'), 0);
        -- Where the store has a record, it is kept, unless an older copy of the store
        -- still holds it claimed (or due again) and the caller sent it since (not over a run
        -- never claimed that the caller did not send as an operator's: a backfill or a
        -- request made since).
        INSERT INTO {s}.runs AS r (entry_id, due, record)
          VALUES (v_entry.id, (v_run ->> 'due')::bigint, v_run)
          ON CONFLICT (entry_id, due) DO UPDATE SET record = excluded.record
            WHERE excluded.record ->> 'state' = {SENT} AND r.readable
              AND r.record ->> 'state' NOT IN {FINAL} AND r.record ->> 'state' NOT IN {OPEN}
              AND coalesce({s}.int_of(r.record -> 'token'), 0)
                  <= coalesce({s}.int_of(excluded.record -> 'token'), 0)
              AND (coalesce({s}.int_of(r.record -> 'token'), 0) > 0
                   OR coalesce(excluded.record -> 'manual' <> 'false'::jsonb, false));
      END LOOP;
      PERFORM {s}.trim(v_entry.id, p_limit, {s}.now_ms());
    END IF;
    o_name := v_seed ->> 'e';
    o_anchor := v_entry.anchor;
    o_checkpoint := v_entry.checkpoint;
    o_token := v_entry.token;
    RETURN NEXT;
  END LOOP;
END $$;

-- claim.lua, for a batch of plans [{{e, x (expected given), a, c, f (token floor),
-- t (take due), s: [[due, 'claim' or a skip reason], ...] sorted}}] naming distinct
-- entries: one compare-and-set on each entry's checkpoint, a fresh token per claim above
-- the floor, planned skips recorded, instants that have a run left alone; then the entry's
-- due runs are taken, and its waiting run (overlap="buffer_one") once no run of the entry
-- is busy. While the entry is paused, new occurrences and due runs that are not an
-- operator's request are recorded skipped (paused) instead; so are those due in its last
-- pause, after the resume. The common plan costs two
-- statements (the run, the entry): what only some entries need (due or waiting runs,
-- unreadable runs, trimming) is found for the batch at once.
CREATE OR REPLACE FUNCTION {s}.claim(p_owner text, p_plans jsonb, p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  v_plan jsonb;
  v_step jsonb;
  v_id bigint;
  v_anchor bigint;
  v_checkpoint bigint;
  v_token0 bigint;
  v_paused_at bigint;
  v_last_paused bigint;
  v_resumed bigint;
  v_version bigint;
  v_next_due bigint;
  v_busy boolean;
  v_action text;
  v_row record;
  v_ids bigint[];
  v_with_due bigint[];
  v_with_bad bigint[];
  v_now bigint;
  v_floor bigint;
  v_token bigint;
  v_next bigint;
  v_cp bigint;
  v_due bigint;
  v_rec jsonb;
  v_claimed jsonb;
  v_skipped jsonb;
  v_existing jsonb;
  v_taken jsonb;
  v_unreadable jsonb;
  v_out jsonb[] := ARRAY[]::jsonb[];
  v_claimed_ids bigint[] := ARRAY[]::bigint[];
BEGIN
  v_ids := ARRAY(SELECT e.id FROM {s}.entries e
    WHERE e.name IN (SELECT x ->> 'e' FROM jsonb_array_elements(p_plans) x)
    ORDER BY e.name FOR NO KEY UPDATE);
  v_with_due := ARRAY(SELECT DISTINCT r.entry_id FROM {s}.runs r
    WHERE r.entry_id = ANY(v_ids) AND r.live_state IN ({DUE}, {WAITING}));
  v_with_bad := ARRAY(SELECT DISTINCT r.entry_id FROM {s}.runs r
    WHERE r.entry_id = ANY(v_ids) AND NOT r.readable);
  FOR v_plan, v_id, v_anchor, v_checkpoint, v_token0, v_paused_at, v_last_paused, v_resumed,
      v_version, v_next_due IN
      SELECT x.value, e.id, e.anchor, e.checkpoint, e.token, e.paused_at, e.last_paused_at,
             e.resumed_at, e.version, e.next_due
      FROM jsonb_array_elements(p_plans)
      WITH ORDINALITY x (value, n) LEFT JOIN {s}.entries e ON e.name = x.value ->> 'e'
      ORDER BY x.n LOOP
    IF v_id IS NULL THEN
      v_out := array_append(v_out, jsonb_build_object('s', {C_MISSING}));
      CONTINUE;
    END IF;
    IF (v_plan ->> 'x')::boolean AND (
        v_anchor IS DISTINCT FROM (v_plan ->> 'a')::bigint
        OR v_checkpoint IS DISTINCT FROM (v_plan ->> 'c')::bigint) THEN
      v_out := array_append(v_out, jsonb_build_object(
        's', {C_CONFLICT}, 'a', v_anchor, 'c', v_checkpoint, 'k', v_token0));
      CONTINUE;
    END IF;
    v_now := {s}.now_ms();
    -- (a token is never below the clock: a store put back from an older copy hands none
    -- out twice)
    v_floor := greatest(coalesce((v_plan ->> 'f')::bigint, 0), v_now * {TOKENS_PER_MS} - 1);
    v_token := v_token0;
    v_cp := v_checkpoint;
    v_claimed := '[]';
    v_skipped := '[]';
    v_existing := '[]';
    v_taken := '[]';
    v_unreadable := '[]';
    IF (v_plan ->> 'x')::boolean THEN
      FOR v_step IN SELECT x FROM jsonb_array_elements(v_plan -> 's') x LOOP
        v_due := (v_step ->> 0)::bigint;
        CONTINUE WHEN v_cp IS NOT NULL AND v_due <= v_cp;
        v_cp := v_due;
        v_action := CASE WHEN v_step ->> 1 = 'claim'
                              AND {s}.paused_for(v_paused_at, v_last_paused, v_resumed, v_due)
                         THEN {R_PAUSED} ELSE v_step ->> 1 END;
        IF v_action = 'claim' THEN
          v_next := v_token + 1;
          IF v_next <= v_floor THEN v_next := v_floor + 1; END IF;
          INSERT INTO {s}.runs (entry_id, due, record) VALUES (v_id, v_due,
              jsonb_build_object('due', v_due, 'state', {CLAIMED}, 'token', v_next,
                                 'owner', p_owner, 'claimed_at', v_now))
            ON CONFLICT DO NOTHING;
          IF FOUND THEN
            v_token := v_next;
            v_floor := v_next;
            v_claimed := v_claimed || jsonb_build_array(jsonb_build_array(v_due, v_next));
          ELSE
            v_existing := v_existing || to_jsonb(v_due);
          END IF;
        ELSE
          INSERT INTO {s}.runs (entry_id, due, record) VALUES (v_id, v_due,
              jsonb_build_object('due', v_due, 'state', {SKIPPED}, 'reason', v_action,
                                 'finished_at', v_now))
            ON CONFLICT DO NOTHING;
          IF FOUND THEN
            v_skipped := v_skipped || jsonb_build_array(jsonb_build_array(v_due, v_action));
          ELSE
            v_existing := v_existing || to_jsonb(v_due);
          END IF;
        END IF;
      END LOOP;
    END IF;
    IF (v_plan ->> 't')::boolean AND v_id = ANY(v_with_due) THEN
      v_busy := NULL;
      FOR v_row IN SELECT r.due, r.record, r.live_state FROM {s}.runs r
          WHERE r.entry_id = v_id AND r.live_state IN ({DUE}, {WAITING}) ORDER BY r.due LOOP
        IF {s}.paused_for(v_paused_at, v_last_paused, v_resumed, v_row.due)
            AND NOT coalesce(v_row.record -> 'manual' <> 'false'::jsonb, false) THEN
          UPDATE {s}.runs SET record = v_row.record || jsonb_build_object(
              'state', {SKIPPED}, 'reason', {R_PAUSED}, 'finished_at', v_now)
            WHERE entry_id = v_id AND due = v_row.due;
          v_skipped := v_skipped || jsonb_build_array(jsonb_build_array(v_row.due,
                                                                        {R_PAUSED}));
          CONTINUE;
        END IF;
        IF v_row.live_state = {WAITING} THEN
          -- It waits on while a run of the entry is busy (taking due runs makes none busy).
          v_busy := coalesce(v_busy, {s}.busy(v_id, v_row.due));
          CONTINUE WHEN v_busy;
        END IF;
        v_next := v_token + 1;
        IF v_next <= v_floor THEN v_next := v_floor + 1; END IF;
        v_token := v_next;
        v_floor := v_next;
        -- The previous holder's check is not this claim's: it is held since now.
        v_rec := (v_row.record - ARRAY['sending_at', 'waiting_at', 'waited_by'])
          || jsonb_build_object(
          'token', v_next, 'state', {CLAIMED}, 'owner', p_owner, 'claimed_at', v_now);
        UPDATE {s}.runs SET record = v_rec WHERE entry_id = v_id AND due = v_row.due;
        v_taken := v_taken || jsonb_build_array(jsonb_build_array(
          v_row.due, v_next, coalesce(v_rec -> 'manual' <> 'false'::jsonb, false),
          coalesce(v_rec -> 'maybe_sent' <> 'false'::jsonb, false),
          coalesce({s}.int_of(v_rec -> 'attempts'), 0)));
      END LOOP;
    END IF;
    IF (v_plan ->> 't')::boolean AND v_id = ANY(v_with_bad) THEN
      -- Runs whose record cannot be read are in no index: the caller is told which, so
      -- that someone hears of them.
      SELECT coalesce(jsonb_agg(r.due ORDER BY r.due), '[]') INTO v_unreadable
        FROM {s}.runs r WHERE r.entry_id = v_id AND NOT r.readable;
    END IF;
    -- The next due instant the plan computed ('n'), with the checkpoint it moved: only
    -- after its compare-and-set passed, and while the definition is at its version ('v').
    IF (v_plan ->> 'x')::boolean AND v_plan ->> 'n' IS NOT NULL
        AND (v_plan ->> 'v' IS NULL OR (v_plan ->> 'v')::bigint = v_version) THEN
      v_next_due := (v_plan ->> 'n')::bigint;
      UPDATE {s}.entries SET token = v_token, checkpoint = v_cp, next_due = v_next_due
        WHERE id = v_id;
    ELSIF v_token <> v_token0 OR v_cp IS DISTINCT FROM v_checkpoint THEN
      UPDATE {s}.entries SET token = v_token, checkpoint = v_cp WHERE id = v_id;
    END IF;
    v_claimed_ids := array_append(v_claimed_ids, v_id);
    v_out := array_append(v_out, jsonb_build_object(
      's', {C_OK}, 'a', v_anchor, 'c', v_cp, 'k', v_token, 'claimed', v_claimed,
      'skipped', v_skipped, 'existing', v_existing, 'taken', v_taken,
      'unreadable', v_unreadable));
  END LOOP;
  -- The entries claimed are trimmed: only those whose history is over the limit, or
  -- that keep lost runs, have anything to trim.
  FOR v_row IN SELECT r.entry_id, count(*) FILTER (WHERE r.in_history) AS kept,
        bool_or(r.lost_at IS NOT NULL) AS lost
      FROM {s}.runs r WHERE r.entry_id = ANY(v_claimed_ids) GROUP BY r.entry_id
      HAVING count(*) FILTER (WHERE r.in_history) > p_limit OR bool_or(r.lost_at IS NOT NULL)
      LOOP
    PERFORM {s}.trim(v_row.entry_id, p_limit, {s}.now_ms(), v_row.kept, v_row.lost);
  END LOOP;
  RETURN to_jsonb(v_out);
END $$;

-- check.lua, for a batch [{{e, d, t, id (task id), skip (reason or null), ov}}]: only the
-- holder of the current token may send; the run becomes sending, or is recorded skipped
-- (the caller's reason; paused for a run of a paused entry; overlap with ov "skip" while
-- another run of the entry is busy), or, with ov "buffer_one" while one is busy, waiting
-- (no owner: nobody holds it) and any older waiting run of the entry skipped (overlap), or
-- skipped itself when a newer one waits or a newer scheduled one is busy already. An
-- operator's request is sent whatever the pause and the overlap policy.
CREATE OR REPLACE FUNCTION {s}.check(p_owner text, p_items jsonb)
RETURNS TABLE (o_verdict text, o_detail text) LANGUAGE plpgsql AS $$
DECLARE
  v_item jsonb;
  v_entry bigint;
  v_due bigint;
  v_token bigint;
  v_rec jsonb;
  v_ok boolean;
  v_reason text;
  v_now bigint;
  v_paused bigint[];
  v_pauses jsonb;
  v_touched bigint[] := ARRAY[]::bigint[];
  v_newest bigint;
BEGIN
  -- Locked, and the paused ones among them read once locked.
  v_paused := array_remove(ARRAY(SELECT CASE WHEN e.paused_at IS NOT NULL THEN e.id END
    FROM {s}.entries e
    WHERE e.name IN (SELECT x ->> 'e' FROM jsonb_array_elements(p_items) x)
    ORDER BY e.name FOR NO KEY UPDATE), NULL);
  -- The last pause of those resumed after one (id -> [last_paused_at, resumed_at]).
  SELECT jsonb_object_agg(e.id::text, jsonb_build_array(e.last_paused_at, e.resumed_at))
    INTO v_pauses FROM {s}.entries e
    WHERE e.name IN (SELECT x ->> 'e' FROM jsonb_array_elements(p_items) x)
      AND e.last_paused_at IS NOT NULL AND e.resumed_at IS NOT NULL;
  FOR v_item, v_entry, v_rec, v_ok IN {SELECT_RUNS} LOOP
    v_due := (v_item ->> 'd')::bigint;
    v_token := (v_item ->> 't')::bigint;
    IF v_entry = ANY(v_touched) THEN
      -- An earlier item of the batch recorded waiting runs of this entry skipped: this
      -- run's record as it is now.
      SELECT r.record, r.readable INTO v_rec, v_ok FROM {s}.runs r
        WHERE r.entry_id = v_entry AND r.due = v_due;
    END IF;
    o_verdict := {V_REFUSED};
    o_detail := NULL;
    IF v_entry IS NULL THEN
      o_verdict := {V_MISSING};  -- the store lost it (or never had it)
      o_detail := 'no such run';
    ELSIF NOT v_ok THEN
      o_detail := 'unreadable record';
    ELSIF v_rec ->> 'state' = {WAITING} AND v_rec ->> 'waited_by' IS NOT DISTINCT FROM p_owner
        AND coalesce({s}.int_of(v_rec -> 'token'), 0) = v_token THEN
      -- made waiting by this holder's check: asked again (whatever overlap policy it asks
      -- with now) it answers the same, what the run is; not this holder's to send any more
      o_verdict := {V_WAITING};
      o_detail := '';
    ELSIF v_rec ->> 'owner' IS DISTINCT FROM p_owner
        OR coalesce({s}.int_of(v_rec -> 'token'), 0) <> v_token THEN
      o_detail := 'superseded';
    ELSIF v_rec ->> 'state' = {SKIPPED} AND v_rec ->> 'reason' IN {REASONS} THEN
      -- skipped by this holder's check: asked again
      o_verdict := {V_SKIPPED};
      o_detail := v_rec ->> 'reason';
    ELSIF v_rec ->> 'state' NOT IN {HELD} THEN
      o_detail := v_rec ->> 'state';
    ELSE
      v_now := {s}.now_ms();
      v_reason := nullif(v_item ->> 'skip', '');
      IF v_reason IS NULL AND NOT coalesce(v_rec -> 'manual' <> 'false'::jsonb, false) THEN
        IF v_entry = ANY(v_paused) OR {s}.paused_for(NULL,
            (v_pauses -> v_entry::text ->> 0)::bigint, (v_pauses -> v_entry::text ->> 1)::bigint,
            v_due) THEN
          v_reason := {R_PAUSED};  -- paused, or due in its last pause
        ELSIF v_item ->> 'ov' IN ({OVERLAP_SKIP}, {OVERLAP_BUFFER_ONE})
            AND v_rec ->> 'state' = {CLAIMED} AND {s}.busy(v_entry, v_due) THEN
          IF v_item ->> 'ov' = {OVERLAP_SKIP} OR EXISTS (
              -- buffer_one: a newer scheduled run is busy already, this one comes too late
              SELECT 1 FROM {s}.runs r WHERE r.entry_id = v_entry AND r.due > v_due
                AND r.live_state IN ({SENDING}, {SENT}, {STARTED})
                AND NOT coalesce(r.record -> 'manual' <> 'false'::jsonb, false)
                AND NOT (r.live_state = {SENT}
                         AND coalesce(r.record -> 'reseeded' <> 'false', false))) THEN
            v_reason := {R_OVERLAP};
          ELSE
            -- Only the newest waits: the other waiting runs older than it are skipped.
            SELECT max(r.due) INTO v_newest FROM {s}.runs r
              WHERE r.entry_id = v_entry AND r.live_state = {WAITING} AND r.due <> v_due;
            UPDATE {s}.runs SET record = record || jsonb_build_object(
                'state', {SKIPPED}, 'reason', {R_OVERLAP}, 'finished_at', v_now)
              WHERE entry_id = v_entry AND live_state = {WAITING} AND due <> v_due
                AND due < greatest(v_due, v_newest);
            IF FOUND THEN
              v_touched := array_append(v_touched, v_entry);
            END IF;
            IF v_newest > v_due THEN
              v_reason := {R_OVERLAP};
            ELSE
              o_verdict := {V_WAITING};
            END IF;
          END IF;
        END IF;
      END IF;
      IF o_verdict = {V_WAITING} THEN
        v_rec := (v_rec - 'owner') || jsonb_build_object(
          'state', {WAITING}, 'waited_by', p_owner, 'waiting_at', v_now);
        o_detail := '';
      ELSIF v_reason IS NOT NULL THEN
        v_rec := v_rec || jsonb_build_object(
          'state', {SKIPPED}, 'reason', v_reason, 'finished_at', v_now);
        o_verdict := {V_SKIPPED};
        o_detail := v_reason;
      ELSE
        v_rec := v_rec || jsonb_build_object(
          'state', {SENDING}, 'task_id', v_item ->> 'id', 'sending_at', v_now);
        o_verdict := {V_SEND};
        o_detail := '';
      END IF;
      UPDATE {s}.runs SET record = v_rec WHERE entry_id = v_entry AND due = v_due;
    END IF;
    RETURN NEXT;
  END LOOP;
END $$;

-- sent.lua, for a batch [{{e, d, t}}]: sending becomes sent (a worker may already have
-- started or finished the run). Returns how many were recorded.
CREATE OR REPLACE FUNCTION {s}.sent(p_items jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  v_item jsonb;
  v_entry bigint;
  v_due bigint;
  v_rec jsonb;
  v_ok boolean;
  v_count integer := 0;
BEGIN
  {LOCK_ITEMS_ENTRIES}
  FOR v_item, v_entry, v_rec, v_ok IN {SELECT_RUNS} LOOP
    v_due := (v_item ->> 'd')::bigint;
    CONTINUE WHEN v_entry IS NULL OR NOT v_ok;
    CONTINUE WHEN coalesce({s}.int_of(v_rec -> 'token'), 0) <> (v_item ->> 't')::bigint;
    CONTINUE WHEN v_rec ->> 'state' IN ({CLAIMED}, {DUE}, {WAITING});
    IF v_rec ->> 'state' = {SENDING} THEN
      UPDATE {s}.runs SET record = v_rec || jsonb_build_object(
          'state', {SENT}, 'sent_at', {s}.now_ms())
        WHERE entry_id = v_entry AND due = v_due;
    ELSIF NOT v_rec ? 'sent_at' THEN
      UPDATE {s}.runs SET record = v_rec || jsonb_build_object('sent_at', {s}.now_ms())
        WHERE entry_id = v_entry AND due = v_due;
    END IF;
    v_count := v_count + 1;
  END LOOP;
  RETURN v_count;
END $$;

-- release.lua, for a batch [{{e, d, t, et, em}}]: the holder gives claims back (due again),
-- or, at the p_max-th failed publish, records the run failed (publish_error).
CREATE OR REPLACE FUNCTION {s}.release(p_owner text, p_items jsonb, p_max integer)
RETURNS TABLE (o_state text) LANGUAGE plpgsql AS $$
DECLARE
  v_item jsonb;
  v_entry bigint;
  v_due bigint;
  v_rec jsonb;
  v_ok boolean;
  v_now bigint;
  v_attempts bigint;
BEGIN
  {LOCK_ITEMS_ENTRIES}
  FOR v_item, v_entry, v_rec, v_ok IN {SELECT_RUNS} LOOP
    v_due := (v_item ->> 'd')::bigint;
    o_state := NULL;
    IF v_entry IS NOT NULL AND v_ok AND v_rec ->> 'state' IN {HELD}
        AND v_rec ->> 'owner' = p_owner
        AND coalesce({s}.int_of(v_rec -> 'token'), 0) = (v_item ->> 't')::bigint THEN
      v_now := {s}.now_ms();
      IF coalesce(v_item ->> 'em', '') <> '' THEN
        v_attempts := coalesce({s}.int_of(v_rec -> 'attempts'), 0) + 1;
        v_rec := v_rec || jsonb_build_object('attempts', v_attempts,
          'exc_type', coalesce(v_item ->> 'et', ''), 'exc_message', v_item ->> 'em');
        IF v_attempts >= p_max THEN
          v_rec := v_rec || jsonb_build_object('state', {FAILED},
            'reason', {R_PUBLISH_ERROR}, 'finished_at', v_now);
        END IF;
      END IF;
      IF v_rec ->> 'state' <> {FAILED} THEN
        v_rec := (v_rec - 'owner') || jsonb_build_object(
          'released_by', v_rec -> 'owner', 'state', {DUE}, 'released_at', v_now);
      END IF;
      UPDATE {s}.runs SET record = v_rec WHERE entry_id = v_entry AND due = v_due;
      o_state := v_rec ->> 'state';
    END IF;
    RETURN NEXT;
  END LOOP;
END $$;

-- reclaim.lua, for a batch [{{e, d, t (null: any)}}]: take held claims back (due again; a
-- run being sent is remembered as maybe sent). Per item 1 if taken back, -1 for a record
-- that cannot be read (reported: it is in no index), else 0.
CREATE OR REPLACE FUNCTION {s}.reclaim(p_items jsonb, p_by text)
RETURNS TABLE (o_result integer) LANGUAGE plpgsql AS $$
DECLARE
  v_item jsonb;
  v_entry bigint;
  v_due bigint;
  v_rec jsonb;
  v_ok boolean;
BEGIN
  {LOCK_ITEMS_ENTRIES}
  FOR v_item, v_entry, v_rec, v_ok IN {SELECT_RUNS} LOOP
    v_due := (v_item ->> 'd')::bigint;
    o_result := CASE WHEN v_entry IS NULL THEN 0 WHEN NOT v_ok THEN -1
      WHEN v_rec ->> 'state' IN {HELD} AND (v_item ->> 't' IS NULL
           OR coalesce({s}.int_of(v_rec -> 'token'), 0) = (v_item ->> 't')::bigint) THEN 1
      ELSE 0 END;
    IF o_result = 1 THEN
      IF v_rec ->> 'state' = {SENDING} THEN
        v_rec := v_rec || jsonb_build_object('maybe_sent', true);
      END IF;
      v_rec := (v_rec - 'owner') || jsonb_build_object(
        'reclaimed_from', v_rec -> 'owner',
        'reclaims', coalesce({s}.int_of(v_rec -> 'reclaims'), 0) + 1,
        'released_by', p_by, 'state', {DUE}, 'released_at', {s}.now_ms());
      UPDATE {s}.runs SET record = jsonb_strip_nulls(v_rec)
        WHERE entry_id = v_entry AND due = v_due;
    END IF;
    RETURN NEXT;
  END LOOP;
END $$;

-- start.lua: the worker's fencing for one delivery. With p_task_id, a delivery that runs
-- records what the task id was started for (in the same transaction). The store's id is
-- answered too.
CREATE OR REPLACE FUNCTION {s}.start(
  p_entry text, p_due bigint, p_token bigint, p_worker text, p_pid bigint,
  p_retries bigint, p_takeover_worker text, p_takeover_pid bigint, p_process text,
  p_task_id text)
RETURNS TABLE (o_verdict text, o_detail text, o_worker text, o_pid bigint, o_process text,
               o_store text)
LANGUAGE plpgsql AS $$
DECLARE
  v_entry record;
  v_rec jsonb;
  v_ok boolean;
  v_found boolean;
  v_now bigint;
  v_state text;
  v_same boolean;
  v_retry boolean;
  v_takeover boolean;
BEGIN
  SELECT i.id INTO o_store FROM {s}.ident i;
  SELECT e.id, e.checkpoint INTO v_entry FROM {s}.entries e WHERE e.name = p_entry
    FOR NO KEY UPDATE;
  IF FOUND THEN
    SELECT r.record, r.readable INTO v_rec, v_ok FROM {s}.runs r
      WHERE r.entry_id = v_entry.id AND r.due = p_due;
  END IF;
  v_found := FOUND;
  IF NOT v_found THEN
    IF v_entry.checkpoint IS NOT NULL AND p_due <= v_entry.checkpoint THEN
      o_verdict := {S_REFUSED};
      o_detail := 'no record of this run (trimmed from history, or the store was wiped)';
    ELSE
      o_verdict := {S_UNTRACKED};
      o_detail := 'no record of this run yet';
    END IF;
    RETURN NEXT;
    RETURN;
  END IF;
  IF NOT v_ok THEN
    o_verdict := {S_UNTRACKED};
    o_detail := 'corrupt record';
    RETURN NEXT;
    RETURN;
  END IF;
  IF coalesce({s}.int_of(v_rec -> 'token'), 0) <> p_token THEN
    o_verdict := {S_REFUSED};
    o_detail := format('token %s superseded by %s', p_token,
                       coalesce({s}.int_of(v_rec -> 'token'), 0));
    RETURN NEXT;
    RETURN;
  END IF;
  v_state := v_rec ->> 'state';
  IF v_state IN {FINAL} AND v_state <> {LOST} THEN
    o_verdict := {S_REFUSED};
    o_detail := 'already ' || v_state;
    RETURN NEXT;
    RETURN;
  END IF;
  v_now := {s}.now_ms();
  IF v_state = {STARTED} OR (v_state = {LOST} AND v_rec ? 'started_at') THEN
    -- The same process only if its identity matches too: a restarted worker may get
    -- the same node name and pid.
    v_same := v_rec ->> 'worker' IS NOT DISTINCT FROM p_worker
      AND coalesce({s}.int_of(v_rec -> 'worker_pid'), -1) = p_pid
      AND coalesce(v_rec ->> 'worker_process', '') = p_process;
    v_retry := p_retries > coalesce({s}.int_of(v_rec -> 'retries'), 0);
    v_takeover := p_takeover_worker IS NOT NULL
      AND p_takeover_worker = coalesce(v_rec ->> 'worker', '')
      AND p_takeover_pid = coalesce({s}.int_of(v_rec -> 'worker_pid'), -1);
    IF NOT (v_retry OR v_takeover) THEN
      IF v_same THEN
        o_verdict := {S_REFUSED};
        o_detail := 'already started by this process';
      ELSE
        o_verdict := {S_BUSY};
        o_detail := 'busy';
        o_worker := coalesce(v_rec ->> 'worker', '');
        o_pid := coalesce({s}.int_of(v_rec -> 'worker_pid'), 0);
        o_process := coalesce(v_rec ->> 'worker_process', '');
      END IF;
      RETURN NEXT;
      RETURN;
    END IF;
    IF v_takeover THEN
      v_rec := v_rec || jsonb_build_object(
        'deliveries', coalesce({s}.int_of(v_rec -> 'deliveries'), 1) + 1);
    END IF;
  ELSIF v_state IN ({SENDING}, {SENT}, {LOST}) THEN
    v_rec := v_rec || jsonb_build_object('deliveries', 1);
  ELSE
    o_verdict := {S_REFUSED};
    o_detail := 'not sent (' || v_state || ')';
    RETURN NEXT;
    RETURN;
  END IF;
  IF v_state = {LOST} THEN
    -- Presumed lost, and it was not: its run_timeout counts again from now.
    v_rec := (v_rec - ARRAY['finished_at', 'reason'])
      || jsonb_build_object('revived', true, 'revived_at', v_now);
    UPDATE {s}.runs SET in_history = true, lost_at = NULL
      WHERE entry_id = v_entry.id AND due = p_due;
  END IF;
  v_rec := (v_rec - 'reseeded') || jsonb_build_object('state', {STARTED}, 'worker', p_worker,
    'worker_pid', p_pid, 'worker_process', p_process, 'retries', p_retries,
    'started_at', coalesce(v_rec -> 'started_at', to_jsonb(v_now)));
  IF coalesce(p_task_id, '') <> '' THEN
    v_rec := v_rec || jsonb_build_object('task_id', p_task_id);  -- the one indexed
  END IF;
  UPDATE {s}.runs SET record = v_rec WHERE entry_id = v_entry.id AND due = p_due;
  IF coalesce(p_task_id, '') <> '' THEN
    INSERT INTO {s}.tasks AS t (task_id, entry_id, due, token)
      VALUES (p_task_id, v_entry.id, p_due, p_token)
      ON CONFLICT (task_id) DO UPDATE SET entry_id = excluded.entry_id, due = excluded.due,
        token = excluded.token;
  END IF;
  o_verdict := {S_RUN};
  o_detail := '';
  RETURN NEXT;
END $$;

-- finish.lua, for a batch [{{e, d, t (null: current), st, r, et, em, w, since, u}}]: a
-- final state is never overwritten (but for a run presumed lost that a worker started:
-- its late outcome is recorded, back in the history), a superseded token's outcome is
-- ignored; a presumption
-- of loss applies only to an open run not active since the caller's cutoff; with u
-- (unstarted only), not to a run a delivery started.
CREATE OR REPLACE FUNCTION {s}.finish(p_items jsonb)
RETURNS TABLE (o_ok boolean) LANGUAGE plpgsql AS $$
DECLARE
  v_item jsonb;
  v_entry bigint;
  v_due bigint;
  v_rec jsonb;
  v_ok boolean;
  v_state text;
  v_since bigint;
  v_late boolean;
BEGIN
  {LOCK_ITEMS_ENTRIES}
  FOR v_item, v_entry, v_rec, v_ok, v_since IN {SELECT_RUNS_SINCE} LOOP
    v_due := (v_item ->> 'd')::bigint;
    v_state := v_rec ->> 'state';
    v_late := coalesce(v_state = {LOST} AND v_rec ? 'started_at', false);
    o_ok := v_entry IS NOT NULL AND v_ok
      AND (v_item ->> 't' IS NULL
           OR coalesce({s}.int_of(v_rec -> 'token'), 0) = (v_item ->> 't')::bigint)
      AND (v_state NOT IN {FINAL} OR v_late) AND v_state NOT IN ({CLAIMED}, {DUE}, {WAITING});
    IF o_ok AND (v_item ->> 'u')::boolean AND (v_state = {STARTED} OR v_late) THEN
      o_ok := false;  -- a delivery revoked before it ran: another one is running it
    END IF;
    IF o_ok AND v_item ->> 'st' = {LOST} THEN
      o_ok := v_state IN {OPEN} AND (v_item ->> 'since' IS NULL
                                     OR v_since < (v_item ->> 'since')::bigint);
    END IF;
    IF o_ok THEN
      IF v_late THEN
        -- presumed lost, and a worker ran it: run_timeout no longer holds
        v_rec := (v_rec - 'reason') || jsonb_build_object('revived', true);
      END IF;
      v_rec := v_rec || jsonb_build_object('state', v_item ->> 'st',
                                           'finished_at', {s}.now_ms());
      IF coalesce(v_item ->> 'r', '') <> '' THEN
        v_rec := v_rec || jsonb_build_object('reason', v_item ->> 'r');
      END IF;
      IF coalesce(v_item ->> 'et', '') <> '' THEN
        v_rec := v_rec || jsonb_build_object('exc_type', v_item ->> 'et');
      END IF;
      IF coalesce(v_item ->> 'em', '') <> '' THEN
        v_rec := v_rec || jsonb_build_object('exc_message', v_item ->> 'em');
      END IF;
      IF coalesce(v_item ->> 'w', '') <> '' AND NOT v_rec ? 'worker' THEN
        v_rec := v_rec || jsonb_build_object('worker', v_item ->> 'w');
      END IF;
      UPDATE {s}.runs SET record = v_rec,
          in_history = in_history OR v_late, lost_at = CASE WHEN v_late THEN NULL ELSE lost_at END
        WHERE entry_id = v_entry AND due = v_due;
    END IF;
    RETURN NEXT;
  END LOOP;
END $$;

-- request.lua: an operator's run now, at the first free millisecond, recorded due. A
-- request id seen before (asked again after a lost reply) records nothing more.
CREATE OR REPLACE FUNCTION {s}.request(p_entry text, p_by text, p_limit integer,
                                       p_request text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_entry bigint;
  v_due bigint;
BEGIN
  SELECT e.id INTO v_entry FROM {s}.entries e WHERE e.name = p_entry FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF p_request IS NOT NULL THEN
    SELECT r.due INTO v_due FROM {s}.runs r
      WHERE r.entry_id = v_entry AND r.in_history AND r.record ->> 'request_id' = p_request
        AND r.readable
      ORDER BY r.due LIMIT 1;
    IF FOUND THEN
      RETURN v_due;
    END IF;
  END IF;
  v_due := {s}.now_ms();
  WHILE EXISTS (SELECT 1 FROM {s}.runs r WHERE r.entry_id = v_entry AND r.due = v_due) LOOP
    v_due := v_due + 1;
  END LOOP;
  INSERT INTO {s}.runs (entry_id, due, record) VALUES (v_entry, v_due, jsonb_strip_nulls(
    jsonb_build_object(
    'due', v_due, 'state', {DUE}, 'manual', true, 'requested_by', p_by,
    'released_at', v_due, 'request_id', p_request)));
  PERFORM {s}.trim(v_entry, p_limit, v_due);
  RETURN v_due;
END $$;

-- backfill.lua: an operator asks for past occurrences to run. Each instant with no run, or
-- whose run ended without running (skipped, lost, cancelled), gets a manual run due (as a
-- requested run; the old record and its task id go): a beat claims it with a fresh token
-- and sends it. Instants whose run ran, runs or is on its way are kept (reported with their
-- state), a run presumed lost that a worker started among them; a record that cannot be
-- read is left for an operator. The checkpoint is not touched. NULL for an unknown entry;
-- {{refused: runs it would create, live: unfinished runs}} when the history cannot hold them;
-- {{forgotten: instants without a record at or before the history's horizon, horizon}} when
-- it has any.
CREATE OR REPLACE FUNCTION {s}.backfill(p_entry text, p_dues bigint[], p_by text,
                                        p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  v_entry bigint;
  v_due bigint;
  v_rec jsonb;
  v_ok boolean;
  v_found boolean;
  v_now bigint;
  v_created jsonb := '[]';
  v_kept jsonb := '[]';
  v_new bigint;
  v_live bigint;
  v_horizon bigint;
BEGIN
  SELECT e.id, e.horizon INTO v_entry, v_horizon FROM {s}.entries e WHERE e.name = p_entry
    FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  -- Refused when an instant without a run recorded is at or before the history's horizon:
  -- whether it ran there is not known (a record is its latest run).
  SELECT count(DISTINCT d) INTO v_new FROM unnest(p_dues) d WHERE d <= v_horizon
    AND NOT EXISTS (SELECT 1 FROM {s}.runs r WHERE r.entry_id = v_entry AND r.due = d);
  IF v_new > 0 THEN
    RETURN jsonb_build_object('forgotten', v_new, 'horizon', v_horizon);
  END IF;
  -- Refused, before anything is written, when the history cannot hold the runs it would
  -- create beside the entry's unfinished ones (they could push runs sent out of it).
  SELECT count(*) INTO v_new FROM (SELECT DISTINCT d FROM unnest(p_dues) d
                                   WHERE d IS NOT NULL) x
    LEFT JOIN {s}.runs r ON r.entry_id = v_entry AND r.due = x.d
    WHERE r.due IS NULL OR (r.readable AND r.record ->> 'state' IN ({SKIPPED}, {LOST}, {CANCELLED})
                            AND NOT (r.record ->> 'state' = {LOST} AND r.record ? 'started_at'));
  IF v_new > 0 THEN
    SELECT count(*) INTO v_live FROM {s}.runs r
      WHERE r.entry_id = v_entry AND r.in_history AND r.live_state IS NOT NULL;
    IF v_live + v_new > p_limit THEN
      RETURN jsonb_build_object('refused', v_new, 'live', v_live);
    END IF;
  END IF;
  v_now := {s}.now_ms();
  FOR v_due IN SELECT DISTINCT d FROM unnest(p_dues) d WHERE d IS NOT NULL ORDER BY d LOOP
    SELECT r.record, r.readable INTO v_rec, v_ok FROM {s}.runs r
      WHERE r.entry_id = v_entry AND r.due = v_due;
    v_found := FOUND;
    CONTINUE WHEN v_found AND NOT v_ok;
    IF v_found AND (v_rec ->> 'state' NOT IN ({SKIPPED}, {LOST}, {CANCELLED})
                    OR (v_rec ->> 'state' = {LOST} AND v_rec ? 'started_at')) THEN
      v_kept := v_kept || jsonb_build_array(jsonb_build_array(v_due, v_rec ->> 'state'));
      CONTINUE;
    END IF;
    IF v_found THEN
      DELETE FROM {s}.runs WHERE entry_id = v_entry AND due = v_due;
    END IF;
    INSERT INTO {s}.runs (entry_id, due, record) VALUES (v_entry, v_due, jsonb_build_object(
      'due', v_due, 'state', {DUE}, 'manual', true, 'requested_by', p_by,
      'released_at', v_now));
    v_created := v_created || to_jsonb(v_due);
  END LOOP;
  IF jsonb_array_length(v_created) > 0 THEN
    PERFORM {s}.trim(v_entry, p_limit, v_now);
  END IF;
  RETURN jsonb_build_object('created', v_created, 'kept', v_kept);
END $$;

-- pause.lua: from now on the entry's runs that are not an operator's request are recorded
-- skipped (paused) by the claim and the check before publish. Pausing a paused entry keeps
-- its instant and takes the new note and who. The entry as entries() reads it; no row for
-- an unknown entry.
CREATE OR REPLACE FUNCTION {s}.pause(p_entry text, p_by text, p_note text)
RETURNS TABLE (o_name text, o_description text, o_anchor bigint, o_checkpoint bigint,
               o_token bigint, o_paused_at bigint, o_paused_by text, o_paused_note text,
               o_resumed_by text, o_resumed_at bigint, o_last_paused_at bigint)
LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY UPDATE {s}.entries e
    SET paused_at = coalesce(e.paused_at, {s}.now_ms()), paused_by = p_by,
        paused_note = coalesce(p_note, '')
    WHERE e.name = p_entry
    RETURNING e.name, e.description, e.anchor, e.checkpoint, e.token, e.paused_at,
              e.paused_by, e.paused_note, e.resumed_by, e.resumed_at, e.last_paused_at;
END $$;

-- resume.lua: the entry's pause ends, recording who and when, and when it began
-- (last_paused_at: occurrences due in [last_paused_at, resumed_at) stay skipped when
-- claimed or checked after the resume); an entry that is not paused is left as it is.
-- The entry as entries() reads it; no row for an unknown entry.
CREATE OR REPLACE FUNCTION {s}.resume(p_entry text, p_by text)
RETURNS TABLE (o_name text, o_description text, o_anchor bigint, o_checkpoint bigint,
               o_token bigint, o_paused_at bigint, o_paused_by text, o_paused_note text,
               o_resumed_by text, o_resumed_at bigint, o_last_paused_at bigint)
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM 1 FROM {s}.entries e WHERE e.name = p_entry FOR NO KEY UPDATE;
  UPDATE {s}.entries e SET paused_at = NULL, paused_by = NULL, paused_note = NULL,
      last_paused_at = e.paused_at, resumed_by = p_by, resumed_at = {s}.now_ms()
    WHERE e.name = p_entry AND e.paused_at IS NOT NULL;
  RETURN QUERY SELECT e.name, e.description, e.anchor, e.checkpoint, e.token, e.paused_at,
      e.paused_by, e.paused_note, e.resumed_by, e.resumed_at, e.last_paused_at
    FROM {s}.entries e WHERE e.name = p_entry;
END $$;

-- requeue.lua: the delivery that started a run gives it back without an outcome (only that
-- delivery's process, with the current token): the run is sent again, and the next
-- delivery of its token starts it. Returns whether it was given back.
CREATE OR REPLACE FUNCTION {s}.requeue(p_entry text, p_due bigint, p_token bigint,
                                       p_worker text, p_pid bigint, p_process text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  v_entry bigint;
  v_rec jsonb;
  v_ok boolean;
BEGIN
  SELECT e.id INTO v_entry FROM {s}.entries e WHERE e.name = p_entry FOR NO KEY UPDATE;
  SELECT r.record, r.readable INTO v_rec, v_ok FROM {s}.runs r
    WHERE r.entry_id = v_entry AND r.due = p_due;
  IF NOT FOUND OR NOT v_ok OR v_rec ->> 'state' <> {STARTED}
      OR coalesce({s}.int_of(v_rec -> 'token'), 0) <> p_token
      OR v_rec ->> 'worker' IS DISTINCT FROM p_worker
      OR coalesce({s}.int_of(v_rec -> 'worker_pid'), -1) <> p_pid
      OR coalesce(v_rec ->> 'worker_process', '') <> p_process THEN
    RETURN false;
  END IF;
  UPDATE {s}.runs SET record = (v_rec - ARRAY['worker', 'worker_pid', 'worker_process'])
      || jsonb_build_object('state', {SENT},
                            'requeues', coalesce({s}.int_of(v_rec -> 'requeues'), 0) + 1,
                            -- its run_timeout counts again from now (since reads it)
                            'revived_at', {s}.now_ms())
    WHERE entry_id = v_entry AND due = p_due;
  RETURN true;
END $$;

-- forget.lua, for a batch of names: entries no schedule has any more go, with every record
-- of their runs, unless a run of theirs is claimed, being sent, sent or started, or a live
-- beat registered them, or they have a live definition (a tombstone goes with its entry,
-- and leaves the change log: the trigger entries_unlog). Returns the names removed.
CREATE OR REPLACE FUNCTION {s}.forget(p_names text[])
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
  v_entry record;
BEGIN
  FOR v_entry IN SELECT e.id, e.name, e.registrants, e.definition FROM {s}.entries e
      WHERE e.name = ANY(p_names) ORDER BY e.name FOR UPDATE LOOP
    CONTINUE WHEN v_entry.definition IS NOT NULL;  -- a live definition: never pruned
    CONTINUE WHEN EXISTS (SELECT 1 FROM {s}.runs r WHERE r.entry_id = v_entry.id
                          AND r.live_state IN ({CLAIMED}, {SENDING}, {SENT}, {STARTED}));
    CONTINUE WHEN {s}.registered_alive(v_entry.registrants);
    DELETE FROM {s}.runs WHERE entry_id = v_entry.id;
    DELETE FROM {s}.entries WHERE id = v_entry.id;
    RETURN NEXT v_entry.name;
  END LOOP;
END $$;

-- heartbeat.lua: the owner is alive for p_ttl more; the epoch changes when there is none,
-- when the server holding the data is another one, on a resync, or when the store does not
-- show the caller's continuity (p_continuity: 'epoch' it saw, 'seen' the clock then,
-- 'renewed' its record renewed within a TTL; 'went_back' answers it), and then no beat
-- claims until settle_until; a caller still registering what it knows (p_settling) keeps a
-- settling store so for p_ttl more. Owners lapsed long ago are forgotten. The store's id is
-- made by the first heartbeat. The last heartbeat's instant is kept (beat_at, answered as
-- it was before this one), and the caller's newest writes (p_written: e, d, t, k, what
-- was written: Wrote; c, confirmed, and a, its entry's anchor: Written) are looked for as
-- kept.lua does: 'lost' lists those the store no longer holds, by position, 'removed' the
-- confirmed ones of an entry removed or made anew since, 'unjudged' those whose run's
-- record cannot be read; 'known': whether the owner's record was there before.
CREATE OR REPLACE FUNCTION {s}.heartbeat(p_owner text, p_info jsonb, p_ttl bigint,
                                         p_resync boolean, p_new text, p_forget bigint,
                                         p_settling boolean, p_store text, p_written jsonb,
                                         p_continuity jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  v_now bigint;
  v_server text := {s}.server_identity();
  v_epoch record;
  v_new boolean;
  v_until bigint;
  v_store text;
  v_last bigint;
  v_lost jsonb := '[]';
  v_removed jsonb := '[]';
  v_unjudged jsonb := '[]';
  v_known boolean;
  v_item jsonb;
  v_n bigint;
  v_entry record;
  v_run record;
  v_token bigint;
  v_went_back boolean := false;
BEGIN
  -- Its commit need not wait for the WAL flush: a heartbeat a crash loses makes its owner
  -- look dead sooner (its claims are taken back; fencing stops it), and a restart or a
  -- failover is a new epoch anyway.
  PERFORM set_config('synchronous_commit', 'off', true);
  -- The epoch row is locked first by every heartbeat: the caller's continuity checked and
  -- the new epoch it may begin are one step, which no other heartbeat reads half way (one
  -- that read the epoch unlocked, then the owners after that step, answered a beat's
  -- renewal with the epoch before it, and its clock later than the new epoch's start).
  PERFORM 1 FROM {s}.epoch FOR UPDATE;
  SELECT ep.id, ep.settle_until, ep.server, ep.since, ep.beat_at INTO v_epoch
    FROM {s}.epoch ep;
  v_new := NOT FOUND OR v_epoch.server <> v_server OR p_resync;
  IF v_new THEN
    PERFORM 1 FROM {s}.epoch FOR UPDATE;
  END IF;
  -- Owners lapsed long ago are forgotten, a few at a time, never waiting for another
  -- heartbeat doing the same.
  DELETE FROM {s}.owners WHERE id IN (
    SELECT o.id FROM {s}.owners o WHERE o.expires_at < {s}.now_ms() - p_forget
      AND o.id <> p_owner ORDER BY o.expires_at LIMIT 100 FOR UPDATE SKIP LOCKED);
  PERFORM 1 FROM {s}.owners o WHERE o.id = p_owner FOR UPDATE;
  v_known := FOUND;
  FOR v_item, v_n IN SELECT x.value, x.n - 1 FROM jsonb_array_elements(p_written)
      WITH ORDINALITY x (value, n) LOOP
    SELECT e.id, e.token, e.anchor INTO v_entry FROM {s}.entries e
      WHERE e.name = v_item ->> 'e';
    IF coalesce((v_item ->> 'c')::boolean, false) AND (NOT FOUND
        OR v_entry.anchor <> coalesce((v_item ->> 'a')::bigint, v_entry.anchor)) THEN
      -- (confirmed: removed since, or made anew; see Written)
      v_removed := v_removed || to_jsonb(v_n);
      CONTINUE;
    END IF;
    IF NOT FOUND OR v_entry.token < (v_item ->> 't')::bigint THEN
      v_lost := v_lost || to_jsonb(v_n);
      CONTINUE;
    END IF;
    SELECT r.record, r.readable INTO v_run FROM {s}.runs r
      WHERE r.entry_id = v_entry.id AND r.due = (v_item ->> 'd')::bigint;
    CONTINUE WHEN NOT FOUND;  -- (trimmed from the history: the counter judged it)
    IF NOT v_run.readable THEN
      v_unjudged := v_unjudged || to_jsonb(v_n);  -- (not judged)
      CONTINUE;
    END IF;
    v_token := coalesce({s}.int_of(v_run.record -> 'token'), 0);
    CONTINUE WHEN v_token = 0;  -- (never claimed: a backfill's or a request's run)
    IF v_token < (v_item ->> 't')::bigint OR (v_token = (v_item ->> 't')::bigint
        AND ((v_item ->> 'k' = {K_CHECK} AND v_run.record ->> 'state' = {CLAIMED})
             OR (v_item ->> 'k' = {K_SENT}
                 AND v_run.record ->> 'state' IN ({CLAIMED}, {SENDING}, {DUE}, {WAITING}))))
    THEN
      v_lost := v_lost || to_jsonb(v_n);
    END IF;
  END LOOP;
  -- The caller's continuity, judged while the epoch row is locked: a store that went back
  -- begins a new epoch with this very renewal.
  v_went_back := coalesce(p_continuity IS NOT NULL AND NOT (p_resync OR p_settling) AND (
    jsonb_array_length(v_lost) > 0
    OR ((p_continuity ->> 'renewed')::boolean AND NOT v_known)
    OR (v_epoch.id <> p_continuity ->> 'epoch'
        AND v_epoch.since < (p_continuity ->> 'seen')::bigint)
    -- (the last heartbeat of any beat, which only moves forward, before the caller's: a
    -- copy taken before it)
    OR v_epoch.beat_at < (p_continuity ->> 'seen')::bigint), false);
  v_now := {s}.now_ms();  -- once the rows it writes are locked
  INSERT INTO {s}.owners AS o (id, info, expires_at) VALUES (p_owner, p_info, v_now + p_ttl)
    ON CONFLICT (id) DO UPDATE SET info = excluded.info, expires_at = excluded.expires_at;
  IF v_went_back THEN
    v_new := true;
    PERFORM 1 FROM {s}.epoch FOR UPDATE;
  END IF;
  IF v_new THEN
    -- Long enough for every beat the store knows alive to notice: until the latest of
    -- their heartbeats lapses (beats with a longer interval than the caller's), within
    -- reason.
    SELECT greatest(v_now + p_ttl, least(max(o.expires_at), v_now + 10 * p_ttl))
      INTO v_until FROM {s}.owners o;
    INSERT INTO {s}.epoch (one, id, settle_until, since, server)
      VALUES (true, p_new, v_until, v_now, v_server) ON CONFLICT (one) DO NOTHING;
    SELECT ep.id, ep.settle_until, ep.server, ep.since INTO v_epoch FROM {s}.epoch ep FOR UPDATE;
    -- Another heartbeat may have started the new epoch while this one waited.
    IF v_epoch.id <> p_new AND (v_epoch.server <> v_server OR p_resync OR v_went_back) THEN
      UPDATE {s}.epoch SET id = p_new,
          settle_until = greatest(coalesce(settle_until, 0), v_until),
          since = v_now, server = v_server
        RETURNING id, settle_until, server, since INTO v_epoch;
    END IF;
  ELSIF p_settling AND v_epoch.settle_until > v_now
      AND v_epoch.settle_until < v_now + p_ttl THEN
    UPDATE {s}.epoch SET settle_until = v_now + p_ttl
      WHERE settle_until > v_now AND settle_until < v_now + p_ttl;
    SELECT ep.id, ep.settle_until, ep.server, ep.since INTO v_epoch FROM {s}.epoch ep;
  END IF;
  SELECT i.id INTO v_store FROM {s}.ident i;
  IF NOT FOUND THEN
    INSERT INTO {s}.ident (one, id) VALUES (true, p_store) ON CONFLICT (one) DO NOTHING;
    SELECT i.id INTO v_store FROM {s}.ident i;
  END IF;
  -- (read locked: forward only, a later instant another heartbeat wrote meanwhile stays)
  SELECT ep.beat_at INTO v_last FROM {s}.epoch ep FOR UPDATE;
  UPDATE {s}.epoch SET beat_at = greatest(coalesce(v_last, v_now), v_now);
  RETURN jsonb_build_object('now', v_now, 'epoch', v_epoch.id, 'since', v_epoch.since,
    'settle', v_epoch.settle_until, 'server', v_server, 'store', v_store,
    'last_beat', v_last, 'lost', v_lost, 'removed', v_removed, 'unjudged', v_unjudged,
    'known', v_known, 'went_back', v_went_back,
    'owners', (SELECT coalesce(jsonb_agg(jsonb_build_array(o.id, o.info, o.expires_at)),
                               '[]') FROM {s}.owners o));
END $$;
-- register() by a beat that schedules the entries (registrant.lua): p_owner becomes one of
-- each entry's registrants, at the database's clock; those whose heartbeat has lapsed are
-- dropped (the list stays bounded by the live beats); a value that cannot be read is
-- replaced. Answers what register() answers.
CREATE OR REPLACE FUNCTION {s}.register_as(p_owner text, p_seeds jsonb, p_limit integer)
RETURNS TABLE (o_name text, o_anchor bigint, o_checkpoint bigint, o_token bigint)
LANGUAGE plpgsql AS $$
BEGIN
  FOR o_name, o_anchor, o_checkpoint, o_token IN
      SELECT * FROM {s}.register(p_seeds, p_limit) LOOP
    UPDATE {s}.entries e SET registrants = jsonb_build_object(p_owner, {s}.now_ms())
        || coalesce((SELECT jsonb_object_agg(r.key, r.value)
                     FROM jsonb_each(CASE WHEN jsonb_typeof(e.registrants) = 'object'
                                          THEN e.registrants END) r
                     JOIN {s}.owners o ON o.id = r.key
                     WHERE o.expires_at > {s}.now_ms() AND r.key <> p_owner
                       AND jsonb_typeof(r.value) = 'number'), '{{}}')
      WHERE e.name = o_name;
    RETURN NEXT;
  END LOOP;
END $$;

-- unregister.lua, for a batch of names: p_owner no longer schedules these entries.
CREATE OR REPLACE FUNCTION {s}.unregister(p_owner text, p_names text[])
RETURNS void LANGUAGE sql AS $$
  UPDATE {s}.entries e SET registrants = e.registrants - p_owner
    WHERE e.name = ANY(p_names) AND jsonb_typeof(e.registrants) = 'object'
      AND e.registrants ? p_owner
$$;
"""


# The liveness of the worker processes that execute deliveries (a table and a function of
# their own, installed with the rest).
_WORKERS_DDL = """
CREATE TABLE IF NOT EXISTS {s}.workers (
  id text PRIMARY KEY,
  record jsonb NOT NULL,
  expires_at bigint NOT NULL);
CREATE INDEX IF NOT EXISTS workers_expiry ON {s}.workers (expires_at);

-- worker_heartbeat.lua: the worker process p_id is alive for p_ttl more; its record says
-- who it is, when it was renewed and when it lapses (the database's clock). Records lapsed
-- more than p_keep ago are removed, a hundred at most a call, never waiting for another
-- heartbeat doing the same. Its commit need not wait for the WAL flush: a crash loses at
-- most the last renewals (a record a little older), which the next renews.
CREATE OR REPLACE FUNCTION {s}.worker_heartbeat(p_id text, p_worker text, p_pid bigint,
                                                p_process text, p_ttl bigint, p_keep bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  v_now bigint;
  v_record jsonb;
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  DELETE FROM {s}.workers WHERE id IN (
    SELECT w.id FROM {s}.workers w WHERE w.expires_at < {s}.now_ms() - p_keep
      AND w.id <> p_id ORDER BY w.expires_at LIMIT 100 FOR UPDATE SKIP LOCKED);
  PERFORM 1 FROM {s}.workers w WHERE w.id = p_id FOR UPDATE;
  v_now := {s}.now_ms();  -- once the row it writes is locked
  v_record := jsonb_build_object('worker', p_worker, 'pid', p_pid, 'process', p_process,
                                 'renewed_at', v_now, 'expires_at', v_now + p_ttl);
  INSERT INTO {s}.workers AS w (id, record, expires_at) VALUES (p_id, v_record, v_now + p_ttl)
    ON CONFLICT (id) DO UPDATE SET record = excluded.record, expires_at = excluded.expires_at;
  RETURN v_record;
END $$;
"""


# Definitions and the change feed (layout 7): the change log is the entries' changed_seq
# (an index where set), numbered under the lock of the one row of ``changes`` (seq: the last
# number handed out; dropped: the newest number of an entry that left the log), held until
# the transaction commits, so numbers are committed in their order: a reader that saw a
# number has seen every lower one. (A sequence hands numbers out outside transactions: a
# later commit may carry a lower number than one a reader already passed.) Locks are taken
# entries first (in name order), then that row, as a prune's trigger takes them.
_DEFINITIONS_DDL = """
CREATE TABLE IF NOT EXISTS {s}.changes (
  one boolean PRIMARY KEY DEFAULT true CHECK (one),
  seq bigint NOT NULL DEFAULT 0,
  dropped bigint NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS entries_changes ON {s}.entries (changed_seq)
  WHERE changed_seq IS NOT NULL;
CREATE INDEX IF NOT EXISTS entries_defined ON {s}.entries ((name COLLATE "C"))
  WHERE {DEFINED};
CREATE INDEX IF NOT EXISTS entries_gone ON {s}.entries (changed_at)
  WHERE definition IS NULL AND changed_seq IS NOT NULL AND version <> 0;

-- An entry that leaves the store (a prune) leaves the change log: its number is a dropped
-- one (a reader behind it reloads).
CREATE OR REPLACE FUNCTION {s}.unlog() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {s}.changes AS c (one, dropped) VALUES (true, OLD.changed_seq)
    ON CONFLICT (one) DO UPDATE SET dropped = greatest(c.dropped, excluded.dropped);
  RETURN OLD;
END $$;
DROP TRIGGER IF EXISTS entries_unlog ON {s}.entries;
CREATE TRIGGER entries_unlog AFTER DELETE ON {s}.entries
  FOR EACH ROW WHEN (OLD.changed_seq IS NOT NULL) EXECUTE FUNCTION {s}.unlog();

-- define.lua, for a batch [{{e, d (definition; null: delete), v (expected version), o, b,
-- id (change id), s: [[due, reason], ...], cp, xc}}]: each a compare-and-set on the
-- version (and on the checkpoint, with xc); new entries anchored as register anchors
-- them; the skips recorded by claim() itself (a plan of skips alone); the checkpoint moved
-- forward only; the definition (or its tombstone), version, origin, who and when written,
-- and the change numbered in the log; then the tombstones older than p_keep leave the log
-- (TOMBSTONES_DROPPED at most, skipping rows another transaction holds). The last
-- change's id answers as that change did. Returns a list of {{s, dt, a, c, k, d, v, o, b,
-- t}}: status, detail, the entry's anchor, checkpoint, token, and its stored definition
-- (d: null once written: the caller has it), version, origin, changed_by, changed_at.
CREATE OR REPLACE FUNCTION {s}.define(p_items jsonb, p_limit integer, p_keep bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  v_item jsonb;
  v_e record;
  v_seq bigint;
  v_dropped bigint;
  v_gone bigint;
  v_now bigint;
  v_status text;
  v_detail text;
  v_out jsonb[] := ARRAY[]::jsonb[];
  v_anchor bigint;
BEGIN
  IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_items) x
             WHERE (x ->> 'v')::bigint = 0 AND x ->> 'xc' IS NULL
               AND NOT EXISTS (SELECT 1 FROM {s}.entries e WHERE e.name = x ->> 'e')) THEN
    v_anchor := {s}.anchor_instant();
    INSERT INTO {s}.entries (name, anchor, next_due)
      SELECT x ->> 'e', v_anchor, {DUE_AT_ONCE} FROM jsonb_array_elements(p_items) x
        WHERE (x ->> 'v')::bigint = 0 AND x ->> 'xc' IS NULL ORDER BY x ->> 'e'
      ON CONFLICT (name) DO NOTHING;
  END IF;
  {LOCK_ITEMS_ENTRIES}
  INSERT INTO {s}.changes AS c (one) VALUES (true)
    ON CONFLICT (one) DO UPDATE SET seq = c.seq RETURNING c.seq, c.dropped
    INTO v_seq, v_dropped;
  FOR v_item IN SELECT x FROM jsonb_array_elements(p_items) x LOOP
    SELECT e.id, e.anchor, e.checkpoint, e.token, e.definition, e.version, e.change_id
      INTO v_e FROM {s}.entries e WHERE e.name = v_item ->> 'e';
    v_status := NULL;
    v_detail := '';
    IF v_e.id IS NOT NULL AND (v_e.version < 0 OR (v_e.version = 0
                                                   AND v_e.definition IS NOT NULL)) THEN
      v_status := {W_CORRUPT};
      v_detail := 'version';
    ELSIF v_item ->> 'id' <> '' AND v_e.change_id IS NOT DISTINCT FROM v_item ->> 'id' THEN
      v_status := {W_OK};
    ELSIF (v_item ->> 'v')::bigint = 0 THEN
      IF v_e.definition IS NOT NULL THEN v_status := {W_EXISTS}; END IF;
    ELSIF v_e.definition IS NULL THEN
      v_status := {W_MISSING};
    ELSIF v_e.version <> (v_item ->> 'v')::bigint THEN
      v_status := {W_CONFLICT};
      v_detail := 'version';
    END IF;
    IF v_status IS NULL AND v_item ->> 'xc' IS NOT NULL
        AND v_e.checkpoint IS DISTINCT FROM (v_item ->> 'xc')::bigint THEN
      v_status := {W_CONFLICT};
      v_detail := 'checkpoint';
    END IF;
    IF v_status IS NULL THEN
      IF jsonb_array_length(v_item -> 's') > 0 THEN
        PERFORM {s}.claim('', jsonb_build_array(jsonb_build_object(
          'e', v_item ->> 'e', 'x', true, 'a', v_e.anchor, 'c', v_e.checkpoint, 'f', 0,
          't', false, 's', v_item -> 's')), p_limit);
      END IF;
      v_now := {s}.now_ms();
      v_seq := greatest(v_seq + 1, v_now * {CHANGES_PER_MS});
      UPDATE {s}.entries e SET
          checkpoint = CASE WHEN e.checkpoint IS NULL OR e.checkpoint < (v_item ->> 'cp')::bigint
                            THEN coalesce((v_item ->> 'cp')::bigint, e.checkpoint)
                            ELSE e.checkpoint END,
          definition = v_item ->> 'd', version = e.version + 1, origin = v_item ->> 'o',
          changed_by = v_item ->> 'b', changed_at = v_now,
          change_id = nullif(v_item ->> 'id', ''), changed_seq = v_seq,
          -- (a writer that names no next due instant, one of layout 8 included: due at
          -- once; a delete: not due)
          next_due = CASE WHEN v_item ->> 'd' IS NULL THEN {NOT_DUE}
                          ELSE coalesce((v_item ->> 'nd')::bigint, {DUE_AT_ONCE}) END
        WHERE e.id = v_e.id;
      v_status := {W_OK};
    END IF;
    SELECT e.anchor, e.checkpoint, e.token, e.definition, e.version, e.origin, e.changed_by,
           e.changed_at INTO v_e FROM {s}.entries e WHERE e.name = v_item ->> 'e';
    v_out := array_append(v_out, jsonb_build_object(
      's', v_status, 'dt', v_detail, 'a', v_e.anchor, 'c', v_e.checkpoint, 'k', v_e.token,
      'd', CASE WHEN v_status = {W_OK} THEN NULL ELSE v_e.definition END,
      'v', nullif(v_e.version, 0), 'o', v_e.origin, 'b', v_e.changed_by,
      't', v_e.changed_at));
  END LOOP;
  WITH old AS (
    SELECT e.id, e.changed_seq FROM {s}.entries e
      WHERE e.definition IS NULL AND e.changed_seq IS NOT NULL AND e.version <> 0
        AND e.changed_at < {s}.now_ms() - p_keep
      ORDER BY e.changed_at LIMIT {TOMBSTONES_DROPPED} FOR UPDATE SKIP LOCKED),
  gone AS (
    UPDATE {s}.entries e SET changed_seq = NULL FROM old WHERE e.id = old.id
      RETURNING old.changed_seq AS seq)
  SELECT max(seq) INTO v_gone FROM gone;
  UPDATE {s}.changes SET seq = v_seq, dropped = greatest(v_dropped, v_gone);
  RETURN to_jsonb(v_out);
END $$;
"""


# The due index (layout 9): each entry's next due instant (next_due: ms; NOT_DUE when not
# due; NULL when never indexed), in (next_due, name) order where indexed, and in name order
# where never indexed (a rebuild sweep's pages). Names by code point (COLLATE "C"), as the
# Redis and SQLite stores order them.
_INDEX_DDL = """
CREATE INDEX IF NOT EXISTS entries_next ON {s}.entries (next_due, (name COLLATE "C"))
  WHERE next_due >= 0;
CREATE INDEX IF NOT EXISTS entries_unindexed ON {s}.entries ((name COLLATE "C"))
  WHERE next_due IS NULL;

-- index.lua, for a batch [{{e, a, c, v, n}}] naming distinct entries: each entry's next
-- due instant n, written only if it still has the anchor a, checkpoint c (null: none) and
-- definition version v it was computed from. Returns a list of booleans: written or not.
CREATE OR REPLACE FUNCTION {s}.index(p_items jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  v_done text[];
BEGIN
  {LOCK_ITEMS_ENTRIES}
  WITH done AS (
    UPDATE {s}.entries e SET next_due = (x ->> 'n')::bigint
      FROM jsonb_array_elements(p_items) x
      WHERE e.name = x ->> 'e' AND e.anchor = (x ->> 'a')::bigint
        AND e.checkpoint IS NOT DISTINCT FROM (x ->> 'c')::bigint
        AND e.version = (x ->> 'v')::bigint
      RETURNING e.name)
  SELECT coalesce(array_agg(name), ARRAY[]::text[]) INTO v_done FROM done;
  RETURN (SELECT coalesce(jsonb_agg(x.value ->> 'e' = ANY(v_done) ORDER BY x.n), '[]')
          FROM jsonb_array_elements(p_items) WITH ORDINALITY x (value, n));
END $$;
"""


def _ddl(schema: str) -> str:
    return (_DDL + _WORKERS_DDL + _DEFINITIONS_DDL + _INDEX_DDL).format_map(
        _sql_names(schema))


# -- connections -----------------------------------------------------------------------
#: Whether this psycopg bounds a wait (3.3: ``Connection.wait(gen, interval, timeout)``).
_WAIT_TAKES_TIMEOUT = {"interval", "timeout"} <= set(
    inspect.signature(psycopg.Connection.wait).parameters)


class _Connection(psycopg.Connection[Any]):
    """A connection whose every wait for the server is bounded by ``deadline`` seconds
    (when psycopg supports it): a server or a proxy that accepts a query and never answers
    fails the call, as a socket timeout does for the Redis store."""

    deadline: float | None = None

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        if _WAIT_TAKES_TIMEOUT and self.deadline is not None and len(args) < 2:
            kwargs.setdefault("timeout", self.deadline)
        return super().wait(gen, *args, **kwargs)


#: Connections a forked child inherited: kept referenced, their socket pointed at
#: /dev/null, so that the child never talks on (or closes) its parent's session.
_INHERITED: list[psycopg.Connection[Any]] = []


def _disown(conn: psycopg.Connection[Any]) -> None:
    try:
        fd = conn.pgconn.socket
        null = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
    except (psycopg.Error, OSError):
        pass
    _INHERITED.append(conn)


def _conninfo(params: dict[str, Any]) -> str:
    """The ``key=value`` string of a connection's parameters ("" when libpq would refuse
    them: the connection says why)."""
    try:
        return make_conninfo(**params)
    except psycopg.Error:
        return ""


def _django_params(alias: str) -> dict[str, Any]:
    """libpq parameters from a Django database's settings (imported only for such URLs)."""
    url = redact_url("django" if alias == "default" else f"django:{alias}")
    try:
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured
    except ImportError:
        raise StoreConfigurationError(
            f"beat_claims_url={url!r}: Django is not installed") from None
    try:
        databases = settings.DATABASES
    except ImproperlyConfigured as exc:
        raise StoreConfigurationError(
            f"beat_claims_url={url!r}: Django settings are not configured ({exc})") from None
    if alias not in databases:
        raise StoreConfigurationError(
            f"beat_claims_url={url!r}: settings.DATABASES has no {redact_url(alias)!r}"
            f" (it has {', '.join(sorted(databases)) or 'none'})")
    db = databases[alias]
    engine = str(db.get("ENGINE", ""))
    if "postgresql" not in engine and "postgis" not in engine:
        raise StoreConfigurationError(
            f"beat_claims_url={url!r}: DATABASES[{alias!r}] is {engine!r}, not PostgreSQL")
    params: dict[str, Any] = {
        key: db[name] for name, key in (("NAME", "dbname"), ("USER", "user"),
                                        ("PASSWORD", "password"), ("HOST", "host"),
                                        ("PORT", "port"))
        if db.get(name) not in (None, "")}
    options = dict(db.get("OPTIONS") or {})
    for name in _DJANGO_ONLY_OPTIONS:
        options.pop(name, None)
    params.update({k: v for k, v in options.items() if isinstance(v, (str, int, float))})
    if "dbname" not in params and "service" not in params:
        raise StoreConfigurationError(
            f"beat_claims_url={url!r}: DATABASES[{alias!r}] has no NAME")
    return params


#: What libpq says when the server refuses who we are (no SQLSTATE comes with a failed
#: connection), and when a host name does not exist (not a resolver that is down).
_REFUSED = ("password authentication failed", "no pg_hba.conf entry", "does not exist",
            "authentication failed", "Name or service not known",
            "nodename nor servname provided", "No address associated with hostname")


def _connect_error(exc: psycopg.Error, where: str) -> Exception:
    """What a failed connection means, as for the Redis store: credentials (or a role, a
    database) refused and a host that does not exist are the configuration's fault (the
    beat says so and stops, at start); anything else is an outage (connection refused, a
    timeout, a server starting or shutting down)."""
    message = str(exc)
    if any(marker in message for marker in _REFUSED):
        return StoreConfigurationError(f"beat_claims_url: {where} refused the connection:"
                                       f" {message}")
    return StoreError(f"cannot connect to {where}: {message}")


# -- the store -------------------------------------------------------------------------
class PostgresStore(Store):
    """The store in a PostgreSQL database (a schema of its own)."""

    def __init__(self, params: dict[str, Any], prefix: str = "beat-claims",
                 history_limit: int = 100, timeout: float = 5.0, url: str = "") -> None:
        """``url`` as written in the settings (``postgresql://...``, ``django:ALIAS``), or
        "" (``params`` alone): shown masked (:func:`~beat_claims.urls.redact_url`)."""
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise StoreConfigurationError(f"beat_claims_url: timeout must be a number of"
                                          f" seconds > 0, not {timeout!r}")
        self.prefix = prefix
        self.schema = schema_name(prefix)
        self.history_limit = history_limit
        self.timeout = float(timeout)
        self._params = self._with_bounds(params)
        #: The URL (or parameters) the client's errors may quote pieces of: masked in them.
        self._secret_url = url if "://" in url else _conninfo(params)
        self._url = redact_url(url)  # postgresql://..., as written
        if "://" not in url:  # django:ALIAS, or parameters alone: the parameters too
            shown = redact_url(self._secret_url)
            self._url = f"{self._url} ({shown})" if self._url and shown else self._url or shown
        s = f'"{self.schema}"'
        self._s = s
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._conn: _Connection | None = None
        self._ready = False  # the layout was checked (or installed) by this store
        #: The server identity the last heartbeat read. A new connection may reach another
        #: server (a failover, a restart, a restore): until a heartbeat has read its epoch,
        #: every other call is refused (``_suspect``), as the Redis store does.
        self._server: str | None = None
        self._suspect = False
        self._noted: set[tuple[str, int]] = set()  # unreadable runs logged once
        self._refused: set[str] = set()  # items the database refused, logged once
        # Runs due again, and waiting runs (overlap="buffer_one") once a claim would take
        # them (their entry has no busy run, or is paused: they are recorded skipped).
        self._sql_live = (
            f"(SELECT 'd', e.name, r.due, 0, NULL, r.since FROM {s}.runs r"
            f" JOIN {s}.entries e ON e.id = r.entry_id WHERE r.live_state = '{RunState.DUE.value}'"
            f" ORDER BY r.since, r.entry_id, r.due LIMIT %(n)s)"
            f" UNION ALL"
            f" (SELECT 'd', e.name, r.due, 0, NULL, r.since FROM {s}.runs r"
            f" JOIN {s}.entries e ON e.id = r.entry_id"
            f" WHERE r.live_state = '{RunState.WAITING.value}'"
            f" AND (e.paused_at IS NOT NULL OR NOT {s}.busy(r.entry_id, r.due))"
            f" ORDER BY r.since, r.entry_id, r.due LIMIT %(n)s)"
            f" UNION ALL"
            f" (SELECT 'h', e.name, r.due, r.token, r.owner, r.since FROM {s}.runs r"
            f" JOIN {s}.entries e ON e.id = r.entry_id"
            f" WHERE r.live_state IN ('{RunState.CLAIMED.value}', '{RunState.SENDING.value}')"
            f" AND r.since < %(top)s AND (r.since < %(held)s"
            f" OR (coalesce(r.owner, '') = %(me)s AND r.since < %(mine)s)"
            f" OR (coalesce(r.owner, '') <> %(me)s"
            f" AND NOT coalesce(r.owner, '') = ANY(%(live)s::text[]) AND r.since < %(dead)s))"
            f" ORDER BY r.since, r.entry_id, r.due LIMIT %(n)s)")
        self._sql_open = (
            f"SELECT e.name, r.due, r.token, r.live_state, r.since, r.record ->> 'task_id'"
            f" FROM {s}.runs r JOIN {s}.entries e ON e.id = r.entry_id"
            f" WHERE r.live_state IN ('{RunState.SENT.value}', '{RunState.STARTED.value}')"
            f" AND r.since < %(before)s {{after}}"
            f" ORDER BY r.since, r.due, e.name COLLATE \"C\" LIMIT %(limit)s")

        self._sql_due = (
            f"SELECT name, next_due, anchor, checkpoint, token, version FROM {s}.entries"
            f" WHERE next_due >= 0 AND next_due <= %(before)s"
            f" AND (next_due, name COLLATE \"C\") > (%(low)s, %(name)s COLLATE \"C\")"
            f" ORDER BY next_due, name COLLATE \"C\" LIMIT %(limit)s")
        self._sql_unindexed = (
            f"SELECT name FROM {s}.entries WHERE next_due IS NULL"
            f" AND name COLLATE \"C\" > %s COLLATE \"C\" ORDER BY name COLLATE \"C\""
            f" LIMIT %s")

    @classmethod
    def from_url(cls, url: str, prefix: str = "beat-claims", history_limit: int = 100,
                 timeout: float = 5.0) -> PostgresStore:
        """A store for ``postgresql://`` / ``postgres://`` URLs, and ``django`` or
        ``django:ALIAS`` (the connection settings of that Django database). Nothing is
        connected yet: a database that is down at start is an outage, not an error."""
        if url == "django" or url.startswith("django:"):
            alias = url.partition(":")[2] or "default"
            if alias.startswith("//"):
                raise StoreConfigurationError(
                    f"beat_claims_url={redact_url(url)!r}: write 'django' or 'django:ALIAS'")
            params = _django_params(alias)
        else:
            try:
                params = conninfo_to_dict(url)
            except psycopg.ProgrammingError as exc:
                raise StoreConfigurationError(  # (libpq quotes what it cannot read)
                    f"beat_claims_url: not a PostgreSQL URL: {redact_text(str(exc), url)}"
                ) from None
        return cls(params, prefix, history_limit, timeout, url)

    @property
    def description(self) -> str:
        return f"{self._url} (schema {self.schema!r})"

    # -- connections ------------------------------------------------------------------
    def _with_bounds(self, params: dict[str, Any]) -> dict[str, Any]:
        """Connection parameters with every wait bounded: the connect (2 s, as the Redis
        store's, and libpq's minimum, unless the URL names another), dead peers (TCP
        keepalives, unacknowledged data), and statements (set on each new connection)."""
        out = dict(params)
        given = str(out.get("connect_timeout", "")).strip()
        if not given.isdigit() or int(given) <= 0:
            out["connect_timeout"] = 2
        out.setdefault("application_name", f"beat-claims ({self.schema})"[:63])
        host = str(out.get("host", ""))
        if not host.startswith("/"):
            idle = max(1, math.ceil(self.timeout))
            out.update(keepalives=1, keepalives_idle=idle, keepalives_interval=1,
                       keepalives_count=3, tcp_user_timeout=math.ceil(self.timeout * 1000))
        return out

    def _after_fork(self) -> None:
        """In a forked child: a lock and a session of its own (the parent's are never
        used, nor closed). Called before the lock is taken: a thread of the parent may
        have held it when the process forked."""
        if os.getpid() != self._pid:
            if self._conn is not None:
                _disown(self._conn)
            self._conn, self._pid, self._lock = None, os.getpid(), threading.RLock()

    def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        try:
            conn = _Connection.connect(make_conninfo(**self._params), autocommit=True)
        except psycopg.Error as exc:
            raise_redacted(_connect_error(exc, self.description), self._secret_url, exc)
        try:
            conn.execute(
                f"SET statement_timeout = {max(1, round(self.timeout * 1000))};"
                " SET lock_timeout = 0; SET default_transaction_isolation = 'read committed'")
            conn.deadline = self.timeout + 1.0
            if not self._ready:
                self._check_layout(conn)
            if self._server is not None:
                self._suspect = self._server_of(conn) != self._server
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _server_of(self, conn: _Connection) -> str | None:
        try:
            row = conn.execute(f"SELECT {self._s}.server_identity()").fetchone()
        except _MISSING:
            return None  # the schema is gone: the store lost everything
        except _OUTAGE as exc:
            raise StoreError(f"{type(exc).__name__}: {exc}") from exc
        return str(row[0]) if row else None

    def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _check_layout(self, conn: _Connection) -> None:
        """The schema's version: installed (or migrated) when missing or older, refused
        when newer than this code knows."""
        try:
            row = conn.execute(f"SELECT max(version) FROM {self._s}.version").fetchone()
            version = row[0] if row else None
        except _MISSING:
            version = None
        except _OUTAGE as exc:
            raise StoreError(f"{type(exc).__name__}: {exc}") from exc
        if version is not None and version > LAYOUT:
            raise self._newer(version)
        if version != LAYOUT:
            self._install(conn, again=False)
        self._ready = True

    def _newer(self, version: int) -> StoreConfigurationError:
        return StoreConfigurationError(
            f"beat_claims_url: the store's schema {self.schema!r} in {self._url} was"
            f" written by a newer beat-claims (layout {version}; this one knows up to"
            f" {LAYOUT}): upgrade beat-claims, or give this fleet another"
            f" beat_claims_key_prefix")

    def _install(self, conn: _Connection, again: bool = True) -> None:
        """Create or migrate the schema in one transaction, one installer at a time.
        Without ``again`` (the version read before the lock was older or missing), a schema
        another installer made current meanwhile is left as it is: its DDL run again takes
        its tables' strongest locks while beats that found it current use them (a
        deadlock with a beat's first registration). ``again``: objects are missing from a
        schema of this layout (a partial restore): the DDL is run whatever the version."""
        try:
            if conn.info.server_version < MIN_SERVER_VERSION:
                raise StoreConfigurationError(
                    f"beat_claims_url: {self._url} runs PostgreSQL"
                    f" {conn.info.server_version // 10000}; the store needs 12 or later")
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)",
                             [zlib.crc32(f"beat-claims:{self.schema}".encode())])
                row = conn.execute(
                    "SELECT to_regclass(%s) IS NOT NULL", [f"{self._s}.version"]).fetchone()
                version = None
                if row and row[0]:
                    found = conn.execute(f"SELECT max(version) FROM {self._s}.version"
                                         ).fetchone()
                    version = found[0] if found else None
                if version is not None and version > LAYOUT:
                    raise self._newer(version)
                if version == LAYOUT and not again:
                    return  # (installed by another beat while this one waited its turn)
                for step in range(version or LAYOUT, LAYOUT):
                    conn.execute(MIGRATIONS[step].format_map(_sql_names(self.schema)))
                conn.execute(_ddl(self.schema))
                conn.execute(f"DELETE FROM {self._s}.version")
                conn.execute(f"INSERT INTO {self._s}.version (version) VALUES (%s)",
                             [LAYOUT])
        except StoreConfigurationError:
            raise
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise StoreError(f"{type(exc).__name__}: {exc}") from exc
        except psycopg.Error as exc:
            user = self._params.get("user") or "(default user)"
            raise StoreConfigurationError(
                f"beat_claims_url: cannot create the store's schema {self.schema!r} in"
                f" {self._url} as {user}: {type(exc).__name__}: {exc}".rstrip()) from None

    def _execute(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None,
                 heartbeat: bool = False) -> list[tuple[Any, ...]]:
        """One statement (one transaction, one round trip): its rows. An outage raises
        StoreError; a schema found missing is installed again and the statement, which
        did nothing, sent again; other errors (a bad item) are the caller's."""
        self._after_fork()
        with self._lock:
            for attempt in (1, 2):
                conn = self._connection()
                if self._suspect and not heartbeat:
                    raise StoreError(
                        "the store's server is another one than at the last heartbeat (a"
                        " restart, a failover or a restore): its epoch must be read first")
                try:
                    cur = conn.execute(query, params)
                    return cur.fetchall() if cur.description is not None else []
                except _MISSING as exc:
                    if attempt == 2:
                        raise StoreError(f"the store's schema is incomplete: {exc}") from exc
                    logger.warning("beat-claims: the store's schema %r is missing in %s"
                                   " (%s); installing it again", self.schema, self._url,
                                   exc)
                    self._install(conn)
                    self._discard()  # a fresh session: no cached plan of the old objects
                except _OUTAGE as exc:
                    if (conn.closed or conn.broken
                            or conn.info.transaction_status != pq.TransactionStatus.IDLE):
                        self._discard()
                    raise StoreError(f"{type(exc).__name__}: {exc}".strip()) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _batch(self, items: Sequence[T], call: Callable[[list[T]], list[Any]],
               on_error: Callable[[T, Exception], Any],
               key: Callable[[T], Any] | None = None) -> list[Any]:
        """``call`` on CHUNK items at a time (one statement each), cut where ``key``
        repeats. A chunk that fails for another reason than an outage is sent again one
        item at a time, so that a bad item (a record or a name the database refuses) gets
        its own answer and the others theirs."""
        if key is not None:
            return [r for part in _distinct(items, key) for r in self._batch(part, call,
                                                                             on_error)]
        out: list[Any] = []
        for start in range(0, len(items), CHUNK):
            chunk = list(items[start:start + CHUNK])
            try:
                out += call(chunk)
            except psycopg.Error as exc:
                if len(chunk) > 1:
                    for item in chunk:
                        out += self._batch([item], call, on_error)
                    continue
                if repr(chunk[0]) not in self._refused:  # once, not at every try
                    if len(self._refused) > 10_000:
                        self._refused.clear()
                    self._refused.add(repr(chunk[0]))
                    logger.error("beat-claims: the store refused %r (%s: %s); it is left"
                                 " out until it can be taken", chunk[0], type(exc).__name__,
                                 exc)
                out.append(on_error(chunk[0], exc))
        return out

    def close(self) -> None:
        self._after_fork()
        with self._lock:
            self._discard()

    # -- beats: liveness and entries ---------------------------------------------------
    def heartbeat(self, owner: Owner, ttl: float, resync: bool = False,
                  settling: bool = False, sweep: LiveQuery | None = None,
                  written: Sequence[Written] = (), changes: ChangeCursor | None = None,
                  continuity: Continuity | None = None) -> Heartbeat:
        # (``sweep``, ``changes``: a second call here, so the caller asks apart: ``live``
        # and ``changes`` stay None)
        try:
            [(reply,)] = self._execute(
                f"SELECT {self._s}.heartbeat(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [owner.id, Jsonb(owner.as_dict()), max(1, round(ttl * 1000)), resync,
                 uuid.uuid4().hex, FORGET_OWNERS_MS, settling, uuid.uuid4().hex,
                 Jsonb([{"e": w.entry, "d": w.due, "t": w.token, "k": w.kind.value,
                         "c": w.confirmed, "a": w.anchor} for w in written]),
                 None if continuity is None else Jsonb({
                     "epoch": continuity.epoch, "seen": continuity.seen_at,
                     "renewed": continuity.owner_renewed})],
                heartbeat=True)
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        with self._lock:
            self._server, self._suspect = str(reply["server"]), False
        now = int(reply["now"])
        return Heartbeat(now=now, epoch=str(reply["epoch"]), store_id=str(reply["store"]),
                         settle_until=_maybe_int(reply.get("settle")),
                         owners=tuple(_owner_statuses(reply["owners"], now)),
                         lost=tuple(written[int(i)] for i in reply.get("lost") or ()),
                         removed=tuple(written[int(i)] for i in reply.get("removed") or ()),
                         unjudged=tuple(written[int(i)]
                                        for i in reply.get("unjudged") or ()),
                         last_beat=_maybe_int(reply.get("last_beat")),
                         owner_known=bool(reply.get("known")),
                         epoch_since=_maybe_int(reply.get("since")),
                         went_back=bool(reply.get("went_back")))

    def leave(self, owner: Owner) -> None:
        try:
            self._execute(f"UPDATE {self._s}.owners SET expires_at = {self._s}.now_ms() - 1"
                          f" WHERE id = %s", [owner.id])
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc

    def register(self, seeds: Sequence[EntrySeed], owner: Owner | None = None
                 ) -> dict[str, EntryState]:
        def call(chunk: list[EntrySeed]) -> list[Any]:
            args = [Jsonb([_seed(seed) for seed in chunk]), self.history_limit]
            if owner is not None:
                return list(self._execute(f"SELECT * FROM {self._s}.register_as(%s, %s, %s)",
                                          [owner.id, *args]))
            rows = self._execute(
                f"SELECT * FROM {self._s}.register(%s, %s)", args)
            return list(rows)

        out: dict[str, EntryState] = {}
        for row in self._batch(list(seeds), call, lambda seed, exc: None):
            if row is not None:
                name, anchor, checkpoint, token = row
                out[name] = EntryState(int(anchor), _maybe_int(checkpoint), int(token))
        return out

    def unregister(self, owner: Owner, entries: Sequence[str]) -> None:
        names = sorted(set(entries))
        for start in range(0, len(names), CHUNK):
            try:
                self._execute(f"SELECT {self._s}.unregister(%s, %s::text[])",
                              [owner.id, names[start:start + CHUNK]])
            except psycopg.Error as exc:
                raise StoreError(f"the server answered with an error: {exc}") from exc

    # -- beats: the life of a claim ----------------------------------------------------
    def claim(self, owner: Owner, plans: Sequence[ClaimPlan]) -> list[ClaimResult]:
        def call(chunk: list[ClaimPlan]) -> list[Any]:
            [(replies,)] = self._execute(f"SELECT {self._s}.claim(%s, %s, %s)",
                                         [owner.id, Jsonb([_plan(p) for p in chunk]),
                                          self.history_limit])
            return [_claim_result(plan.entry, reply) for plan, reply in zip(chunk, replies)]

        return self._batch(checked_plans(plans), call, lambda plan, exc: ClaimResult(
            plan.entry, ClaimStatus.CORRUPT, detail=f"{type(exc).__name__}: {exc}"),
            key=lambda plan: plan.entry)

    def check(self, owner: Owner, checks: Sequence[Check]) -> list[CheckResult]:
        def call(chunk: list[Check]) -> list[Any]:
            rows = self._execute(f"SELECT * FROM {self._s}.check(%s, %s)", [
                owner.id, Jsonb([{"e": c.claim.entry, "d": c.claim.due, "t": c.claim.token,
                                  "id": c.task_id, "skip": c.skip.value if c.skip else None,
                                  "ov": c.overlap.value} for c in chunk])])
            return [_check_result(item.claim, verdict, detail)
                    for item, (verdict, detail) in zip(chunk, rows)]

        return self._batch(list(checks), call, lambda item, exc: CheckResult(
            item.claim, CheckVerdict.REFUSED, why=f"unreadable record: {exc}"),
            key=lambda item: item.claim.ref)

    def record_sent(self, owner: Owner, claims: Sequence[Claim]) -> int:
        def call(chunk: list[Claim]) -> list[Any]:
            [(count,)] = self._execute(f"SELECT {self._s}.sent(%s)", [
                Jsonb([{"e": c.entry, "d": c.due, "t": c.token} for c in chunk])])
            return [int(count)]

        return sum(self._batch(list(claims), call, lambda claim, exc: 0,
                               key=lambda claim: claim.ref))

    def release(self, owner: Owner, releases: Sequence[Release], max_attempts: int = 0
                ) -> list[RunState | None]:
        def call(chunk: list[Release]) -> list[Any]:
            rows = self._execute(f"SELECT * FROM {self._s}.release(%s, %s, %s)", [
                owner.id, Jsonb([{"e": r.claim.entry, "d": r.claim.due, "t": r.claim.token,
                                  "et": r.error_type, "em": r.error or ""} for r in chunk]),
                max(1, max_attempts)])
            return [RunState(state) if state else None for (state,) in rows]

        return self._batch(list(releases), call, lambda item, exc: None,
                           key=lambda item: item.claim.ref)

    # -- sweeps -----------------------------------------------------------------------
    def live_runs(self, query: LiveQuery) -> LiveRuns:
        try:
            rows = self._execute(self._sql_live, {
                "n": query.limit + 1, "me": query.owner, "live": sorted(query.live_owners),
                "held": query.held_before, "mine": query.mine_before,
                "dead": query.dead_before,
                "top": max(query.held_before, query.mine_before, query.dead_before)})
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        due = [RunRef(name, int(d)) for kind, name, d, _, _, _ in sorted(
            (row for row in rows if row[0] == "d"), key=lambda row: row[5])]
        held = [HeldRun(name, int(d), int(token), owner or "", int(since))
                for kind, name, d, token, owner, since in rows if kind == "h"]
        complete = len(due) <= query.limit and len(held) <= query.limit
        return LiveRuns(tuple(due[:query.limit]), tuple(held[:query.limit]), complete)

    def open_runs(self, before: int, after: int | None = None, limit: int = 1000
                  ) -> list[OpenRun]:
        if limit <= 0:
            return []
        sql = self._sql_open.format(after="" if after is None else "AND r.since > %(after)s")
        try:
            rows = self._execute(sql, {"before": before, "after": after, "limit": limit})
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        return [OpenRun(name, int(due), int(token), RunState(state), int(since), task_id)
                for name, due, token, state, since, task_id in rows]

    def reclaim(self, reclaims: Sequence[Reclaim], by: str) -> list[bool]:
        def call(chunk: list[Reclaim]) -> list[Any]:
            rows = self._execute(f"SELECT * FROM {self._s}.reclaim(%s, %s)", [
                Jsonb([{"e": r.entry, "d": r.due, "t": r.token} for r in chunk]), by])
            return [int(result) for (result,) in rows]

        reclaims = list(reclaims)
        results = self._batch(reclaims, call, lambda item, exc: -1,
                              key=lambda item: (item.entry, item.due))
        for item, result in zip(reclaims, results):
            if result == -1 and (item.entry, item.due) not in self._noted:
                self._noted.add((item.entry, item.due))
                logger.error("beat-claims: %s due %s: its record in the store cannot be"
                             " read; it is left out of the store's indexes (nothing will"
                             " send it)", item.entry, iso(item.due))
        return [result == 1 for result in results]

    # -- workers ----------------------------------------------------------------------
    def start(self, delivery: Delivery) -> StartDecision:
        d, proc, takeover = delivery, delivery.process, delivery.takeover
        try:
            [(verdict, why, worker, pid, process, store_id)] = self._execute(
                f"SELECT * FROM {self._s}.start(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [d.entry, d.due, d.token, proc.worker, proc.pid, d.retries,
                 takeover.worker if takeover else None, takeover.pid if takeover else None,
                 proc.process, d.task_id or None])
        except psycopg.Error as exc:
            logger.error("beat-claims: the store could not fence %r: %s", d, exc)
            return StartDecision(StartVerdict.UNTRACKED, f"unreadable record: {exc}")
        decision, store_id = StartVerdict(verdict), str(store_id or "")
        if decision is StartVerdict.BUSY:
            return StartDecision(decision, str(why), WorkerProcess(
                str(worker), int(pid), str(process)), store_id=store_id)
        return StartDecision(decision, str(why or ""), store_id=store_id)

    def requeue(self, delivery: Delivery) -> bool:
        d, proc = delivery, delivery.process
        try:
            [(given_back,)] = self._execute(
                f"SELECT {self._s}.requeue(%s, %s, %s, %s, %s, %s)",
                [d.entry, d.due, d.token, proc.worker, proc.pid, proc.process])
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        return bool(given_back)

    def finish(self, outcomes: Sequence[Outcome]) -> list[bool]:
        def call(chunk: list[Outcome]) -> list[Any]:
            rows = self._execute(f"SELECT * FROM {self._s}.finish(%s)", [Jsonb([
                {"e": o.entry, "d": o.due, "t": o.token, "st": o.state.value,
                 "r": o.reason.value if o.reason else "", "et": o.exc_type,
                 "em": o.exc_message, "w": o.worker, "since": o.inactive_since,
                 "u": o.unstarted_only}
                for o in chunk])])
            return [bool(ok) for (ok,) in rows]

        return self._batch(list(outcomes), call, lambda item, exc: False,
                           key=lambda item: (item.entry, item.due))

    def lookup_task(self, task_id: str) -> Claim | None:
        try:
            rows = self._execute(
                f"SELECT e.name, t.due, t.token FROM {self._s}.tasks t"
                f" JOIN {self._s}.entries e ON e.id = t.entry_id WHERE t.task_id = %s",
                [task_id])
        except psycopg.Error:
            return None
        return Claim(str(rows[0][0]), int(rows[0][1]), int(rows[0][2])) if rows else None

    # -- operators --------------------------------------------------------------------
    def request_run(self, entry: str, by: str, request_id: str = "") -> int | None:
        try:
            [(due,)] = self._execute(f"SELECT {self._s}.request(%s, %s, %s, %s)",
                                     [entry, by, self.history_limit, request_id or None])
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        return _maybe_int(due)

    def backfill(self, entry: str, dues: Sequence[int], by: str) -> BackfillResult | None:
        try:
            [(reply,)] = self._execute(f"SELECT {self._s}.backfill(%s, %s::bigint[], %s, %s)",
                                       [entry, sorted({int(d) for d in dues}), by,
                                        self.history_limit])
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        if reply is None:
            return None
        if "refused" in reply:
            raise BackfillRefused(entry, int(reply["refused"]), int(reply["live"]),
                                  self.history_limit)
        if "forgotten" in reply:
            raise BackfillForgotten(entry, _maybe_int(reply["horizon"]),
                                    int(reply["forgotten"]), self.history_limit)
        return BackfillResult(entry, tuple(int(d) for d in reply["created"]),
                              tuple((int(d), RunState(state)) for d, state in reply["kept"]))

    def pause(self, entry: str, by: str, note: str = "") -> EntryRecord | None:
        return self._entry_call("pause", [entry, by, note])

    def resume(self, entry: str, by: str) -> EntryRecord | None:
        return self._entry_call("resume", [entry, by])

    def _entry_call(self, function: str, args: list[Any]) -> EntryRecord | None:
        """An operator's transition of one entry that answers the entry (none: unknown)."""
        marks = ", ".join(["%s"] * len(args))
        try:
            rows = self._execute(f"SELECT * FROM {self._s}.{function}({marks})", args)
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        return _entry_record(rows[0]) if rows else None

    def forget(self, entries: Sequence[str]) -> list[str]:
        names = list(dict.fromkeys(entries))
        if not names:
            return []
        try:
            rows = self._execute(f"SELECT * FROM {self._s}.forget(%s::text[])", [names])
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        removed = {name for (name,) in rows}
        return [name for name in names if name in removed]

    # -- definitions ------------------------------------------------------------------
    def write_definitions(self, writes: Sequence[DefinitionWrite]
                          ) -> list[DefinitionResult]:
        writes = checked_writes(writes, self.history_limit)

        def call(chunk: list[DefinitionWrite]) -> list[Any]:
            [(replies,)] = self._execute(f"SELECT {self._s}.define(%s, %s, %s)", [
                Jsonb([_definition_item(w) for w in chunk]), self.history_limit,
                self.tombstones_kept_ms])
            return [_write_result(w, reply) for w, reply in zip(chunk, replies)]

        return self._batch(writes, call, lambda w, exc: DefinitionResult(
            w.name, WriteStatus.CORRUPT, 0, detail=f"{type(exc).__name__}: {exc}"))

    def definitions(self, names: Sequence[str] | None = None, after: str = "",
                    limit: int = 1000) -> list[StoredDefinition]:
        fields = "name, definition, version, origin, changed_by, changed_at"
        defined = "(version <> 0 OR definition IS NOT NULL)"
        try:
            if names is None:
                rows = self._execute(
                    f"SELECT {fields} FROM {self._s}.entries WHERE {defined}"
                    f' AND (name COLLATE "C") > %s ORDER BY (name COLLATE "C") LIMIT %s',
                    [after, page_limit(limit, 0)])
            else:
                rows = self._execute(f"SELECT {fields} FROM {self._s}.entries"
                                     f" WHERE name = ANY(%s::text[]) AND {defined}",
                                     [list(names)])
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        found = {row[0]: stored_definition(*row) for row in rows}
        order = [row[0] for row in rows] if names is None else list(dict.fromkeys(names))
        return [found[name] for name in order if name in found]

    def changes(self, cursor: ChangeCursor | None, limit: int = 1000) -> Changes:
        limit = page_limit(limit, 1)
        position, name, _ = (cursor.positions[0] if cursor is not None
                             and len(cursor.positions) == 1 else (0, "", 0))
        s = self._s
        try:  # (one statement: one snapshot of the log)
            [(head, dropped, top, seen, members)] = self._execute(
                f"SELECT c.seq, c.dropped,"
                f" (SELECT jsonb_build_array(e.name, e.changed_seq) FROM {s}.entries e"
                f"  WHERE e.changed_seq IS NOT NULL ORDER BY e.changed_seq DESC LIMIT 1),"
                f" (SELECT e.changed_seq FROM {s}.entries e WHERE e.name = %(name)s),"
                f" (SELECT coalesce(jsonb_agg(jsonb_build_array(m.name, m.changed_seq,"
                f"  m.definition, m.version, m.origin, m.changed_by, m.changed_at)"
                f"  ORDER BY m.changed_seq), '[]') FROM (SELECT * FROM {s}.entries e"
                f"  WHERE e.changed_seq > %(pos)s ORDER BY e.changed_seq LIMIT %(n)s) m)"
                f" FROM (SELECT 1) one LEFT JOIN {s}.changes c ON true",
                {"name": name, "pos": position, "n": limit + 1})
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        newest = (str(top[0]), int(top[1])) if top else ("", 0)
        head = max(int(head), newest[1]) if head is not None else newest[1]
        read = LogRead(head, head if dropped is None else int(dropped), newest,
                       _maybe_int(seen) if name else None,
                       tuple((str(m[0]), int(m[1])) for m in members))
        next_cursor, taken, reload, complete = follow(cursor, [read], limit)
        by_name = {str(m[0]): m for m in members}
        return Changes(next_cursor, tuple(stored_definition(n, *by_name[n][2:7])
                                          for n, _ in taken), reload, complete)

    # -- reads ------------------------------------------------------------------------
    # -- the due index ----------------------------------------------------------------
    def due(self, before: int, limit: int, after: tuple[int, str] | None = None
            ) -> list[DueEntry]:
        before, limit, after = due_cursor(before, limit, after)
        low, name = after if after is not None else (-1, "")
        rows = self._execute(self._sql_due, {"before": before, "low": low, "name": name,
                                             "limit": limit})
        return [DueEntry(str(n), int(d), EntryState(int(a), c, int(k)), int(v))
                for n, d, a, c, k, v in rows]

    def index(self, writes: Sequence[IndexWrite]) -> list[bool]:
        def call(chunk: list[IndexWrite]) -> list[Any]:
            [(replies,)] = self._execute(f"SELECT {self._s}.index(%s)", [Jsonb([
                {"e": w.name, "a": w.expected.anchor, "c": w.expected.checkpoint,
                 "v": w.version, "n": w.next_due} for w in chunk])])
            return [bool(r) for r in replies]

        return self._batch(checked_index_writes(writes), call, lambda w, exc: False,
                           key=lambda w: w.name)

    def unindexed(self, limit: int, cursor: str = "") -> Unindexed:
        limit = page_limit(limit, 1)
        names = [str(n) for (n,) in self._execute(self._sql_unindexed, [cursor, limit])]
        return Unindexed(tuple(names), names[-1] if names else cursor, len(names) < limit)

    def entries(self, names: Sequence[str] | None = None) -> list[EntryRecord]:
        sql = (f"SELECT name, description, anchor, checkpoint, token, paused_at, paused_by,"
               f" paused_note, resumed_by, resumed_at, last_paused_at, registrants, horizon"
               f" FROM {self._s}.entries")
        try:
            if names is None:
                rows = self._execute(sql)
            else:
                rows = self._execute(sql + " WHERE name = ANY(%s::text[])", [list(names)])
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        found = {row[0]: _entry_record(row) for row in rows}
        order = sorted(found) if names is None else [n for n in names if n in found]
        return [found[name] for name in dict.fromkeys(order)]

    def history(self, entry: str, limit: int | None = None) -> list[Run]:
        if limit is not None and limit <= 0:
            return []
        try:
            rows = self._execute(
                f"SELECT r.record FROM {self._s}.runs r JOIN {self._s}.entries e"
                f" ON e.id = r.entry_id WHERE e.name = %s AND r.in_history"
                f" ORDER BY r.due DESC LIMIT %s", [entry, limit])
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        return [run for (record,) in rows if (run := _parse_run(entry, record)) is not None]

    def now(self) -> int:
        # The clock is the server's whatever it holds: readable before a heartbeat has read
        # the epoch of a server found new.
        try:
            [(now,)] = self._execute(f"SELECT {self._s}.now_ms()", heartbeat=True)
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        return int(now)

    def owners(self) -> list[OwnerStatus]:
        try:
            rows = self._execute(
                f"SELECT n.now, o.id, o.info, o.expires_at FROM (SELECT {self._s}.now_ms()"
                f" AS now) n LEFT JOIN {self._s}.owners o ON true")
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        now = int(rows[0][0])
        return _owner_statuses([[i, info, exp] for _, i, info, exp in rows if i], now)

    # -- workers: liveness ------------------------------------------------------------
    def worker_heartbeat(self, process: WorkerProcess, ttl: float) -> WorkerLiveness:
        ttl_ms = worker_ttl_ms(ttl)
        try:
            # (a liveness write is harmless whatever the epoch: allowed before a beat's
            # heartbeat has read it, as that heartbeat is)
            [(reply,)] = self._execute(
                f"SELECT {self._s}.worker_heartbeat(%s, %s, %s, %s, %s, %s)",
                [worker_id(process), process.worker, process.pid, process.process, ttl_ms,
                 self.worker_records_kept_ms], heartbeat=True)
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        return written_worker_record(process, reply)

    def worker_liveness(self, processes: Sequence[WorkerProcess]) -> WorkerLivenessRead:
        processes = list(processes)
        ids = [worker_id(p) for p in processes]
        try:
            rows = self._execute(
                f"SELECT n.now, w.id, w.record FROM (SELECT {self._s}.now_ms() AS now) n"
                f" LEFT JOIN {self._s}.workers w ON w.id = ANY(%s::text[])", [ids])
        except psycopg.Error as exc:
            raise StoreError(f"the server answered with an error: {exc}") from exc
        found = {i: record for _, i, record in rows if i}
        return WorkerLivenessRead(int(rows[0][0]), tuple(
            read_worker_record(p, found.get(i)) for p, i in zip(processes, ids)))


# -- items and replies ----------------------------------------------------------------
def _distinct(items: Sequence[T], key: Callable[[T], Any]) -> list[list[T]]:
    """``items`` cut, in order, into parts in which no key repeats: the functions read what
    their whole batch needs at once, which must not change within it (an entry for a claim,
    a run for the others)."""
    parts: list[list[T]] = [[]]
    seen: set[Any] = set()
    for item in items:
        if key(item) in seen:
            parts.append([])
            seen.clear()
        seen.add(key(item))
        parts[-1].append(item)
    return [part for part in parts if part]


def _seed(seed: EntrySeed) -> dict[str, Any]:
    return {"e": seed.name, "desc": seed.description, "a": seed.anchor, "c": seed.checkpoint,
            "t": seed.token, "runs": [run.to_record() for run in seed.runs]}


def _plan(plan: ClaimPlan) -> dict[str, Any]:
    steps = sorted([(due, "claim") for due in plan.claim]
                   + [(due, reason.value) for due, reason in plan.skip])
    expected = plan.expected
    return {"e": plan.entry, "x": expected is not None,
            "a": expected.anchor if expected else None,
            "c": expected.checkpoint if expected else None,
            "f": plan.token_floor, "t": plan.take_due, "s": steps,
            "n": plan.next_due, "v": plan.version}


def _definition_item(w: DefinitionWrite) -> dict[str, Any]:
    return {"e": w.name, "d": w.definition, "v": w.expected_version, "o": w.origin.value,
            "b": w.by, "id": w.change_id, "s": [[due, reason.value] for due, reason
                                                in sorted(w.skip)],
            "cp": w.checkpoint, "xc": w.expected_checkpoint, "nd": written_next_due(w)}


def _write_result(w: DefinitionWrite, reply: dict[str, Any]) -> DefinitionResult:
    status = WriteStatus(reply["s"])
    if status is WriteStatus.CORRUPT:
        return DefinitionResult(w.name, status, 0,
                                detail=f"unreadable field {reply['dt']!r}")
    state = (EntryState(int(reply["a"]), _maybe_int(reply.get("c")), int(reply["k"]))
             if reply.get("a") is not None else None)
    return definition_result(w, status, state, [reply.get(k) for k in "dvobt"],
                             str(reply.get("dt") or ""))


def _claim_result(entry: str, reply: dict[str, Any]) -> ClaimResult:
    status = ClaimStatus(reply["s"])
    if status is ClaimStatus.MISSING:
        return ClaimResult(entry, status)
    state = EntryState(int(reply["a"]), _maybe_int(reply.get("c")), int(reply["k"]))
    if status is not ClaimStatus.OK:
        return ClaimResult(entry, status, state)
    return ClaimResult(
        entry, status, state,
        claims=tuple(Claim(entry, int(due), int(token)) for due, token in reply["claimed"]),
        taken=tuple(Claim(entry, int(due), int(token), manual=bool(manual),
                          maybe_sent=bool(maybe_sent), attempts=int(attempts))
                    for due, token, manual, maybe_sent, attempts in reply["taken"]),
        skipped=tuple((int(due), Reason(reason)) for due, reason in reply["skipped"]),
        existing=tuple(int(due) for due in reply["existing"]),
        unreadable=tuple(int(due) for due in reply.get("unreadable", ())))


def _check_result(claim: Claim, verdict: str, detail: str | None) -> CheckResult:
    if verdict == CheckVerdict.SEND.value:
        return CheckResult(claim, CheckVerdict.SEND)
    if verdict == CheckVerdict.SKIPPED.value:
        return CheckResult(claim, CheckVerdict.SKIPPED, Reason(detail))
    if verdict == CheckVerdict.WAITING.value:
        return CheckResult(claim, CheckVerdict.WAITING)
    if verdict == CheckVerdict.MISSING.value:
        return CheckResult(claim, CheckVerdict.MISSING, why=str(detail or "no such run"))
    return CheckResult(claim, CheckVerdict.REFUSED, why=str(detail or "refused"))


def _maybe_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _entry_record(row: Sequence[Any]) -> EntryRecord:
    """An entry from its row: name, description, anchor, checkpoint, token, paused_at,
    paused_by, paused_note, resumed_by, resumed_at, last_paused_at, and (from entries(),
    not from pause() and resume()) registrants and horizon."""
    (name, description, anchor, checkpoint, token, paused_at, by, note, resumed_by,
     resumed_at, last_paused_at, *more) = row
    registrants, horizon = more if more else (None, None)
    paused = None if paused_at is None else Pause(str(by or ""), str(note or ""),
                                                   int(paused_at))
    return EntryRecord(name, description, _maybe_int(anchor), _maybe_int(checkpoint),
                       int(token), paused, resumed_by, _maybe_int(resumed_at),
                       _maybe_int(last_paused_at),
                       None if registrants is None else registrants_from_json(registrants),
                       _maybe_int(horizon))


def _parse_run(entry: str, record: Any) -> Run | None:
    try:
        return Run.from_record(entry, record)
    except (ValueError, TypeError):
        return None  # an unreadable record is shown as missing rather than failing a read


def _owner_statuses(rows: list[Any], now: int) -> list[OwnerStatus]:
    out = []
    for _owner_id, info, expires in rows:
        try:
            owner = Owner.from_dict(info if isinstance(info, dict) else json.loads(info))
        except (ValueError, KeyError, TypeError):
            continue
        out.append(OwnerStatus(owner, int(expires) > now, int(expires)))
    return out


__all__ = ["LAYOUT", "PostgresStore", "schema_name"]
