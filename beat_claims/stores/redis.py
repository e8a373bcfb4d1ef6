"""The Redis store: each transition is one Lua script, atomic on the server.

Key layout (``P`` is ``beat_claims_key_prefix``; ``NN`` an entry's bucket, ``D`` a digest
of its name). Every key of an entry shares its bucket's hash tag, so each script touches
one slot (Redis Cluster); the bucket's indexes are written by the same script as the run,
so they are records, not hints: a sweep finds every run that needs a beat from them.

======================  ======  ===========================================================
``{P:NN}:e:D``          hash    the entry: name, schedule, anchor, checkpoint, token; a
                                pause (paused_at, paused_by, paused_note) and the last
                                resume (resumed_by, resumed_at, last_paused_at); the beats
                                that registered it (registrants: JSON, owner id -> when);
                                its history horizon (horizon: the newest instant trimmed);
                                its definition (definition: JSON text, absent in a
                                tombstone; version, origin, changed_by, changed_at; the
                                last change's id: change_id); its next due instant
                                (next_due: ms, or -1 when not due; absent: never indexed)
``{P:NN}:r:D``          hash    its runs: due (ms) -> JSON record
``{P:NN}:h:D``          zset    its history: due -> due (``history_limit`` kept)
``{P:NN}:d:D``          zset    its runs due again: due -> due (what a claim takes)
``{P:NN}:b:D``          zset    its runs being sent, sent or started: due -> due
``{P:NN}:x:D``          zset    runs presumed lost, kept a week for late deliveries
``{P:NN}:due``          zset    the bucket's runs due again, and its waiting runs while a
                                claim would take them: "due|name" -> since
``{P:NN}:held``         zset    its claims: "owner|token|due|name" -> claimed or checked at
``{P:NN}:open``         zset    its runs sent or started: "due|name" -> last active at
``{P:NN}:t``            hash    task ids of its runs that started: id -> entry, due, token
``{P:NN}:next``         zset    its due index: name -> next due instant (ms), entries not
                                due (-1) and never indexed left out; written with the
                                entry's next_due field by the same script
``{P:NN}:changes``      zset    its change log: name -> sequence number of the entry's last
                                definition change (one member per entry; a tombstone leaves
                                it ``TOMBSTONE_KEPT_MS`` after its delete, a pruned entry
                                at once)
``{P:NN}:named``        zset    its entries that have or had a definition: name (scores 0:
                                in name order, for paging)
``{P:NN}:gone``         zset    its tombstones still in the change log: name -> deleted at
``{P:NN}:seq``          hash    its change log's sequence: seq (the last number handed
                                out), dropped (the newest number of a member that left it)
``{P}:owners``          hash    beats: owner id -> JSON (host, pid, start time)
``{P}:alive``           zset    beats: owner id -> heartbeat expiry (store ms)
``{P}:epoch``           hash    the store's epoch: id, settle_until, since, server (its
                                run id; on a cluster, those of the masters of every bucket
                                and of ``{P}``, sorted, comma-separated)
``{P}:entries``         hash    every entry seen: D -> name
``{P}:anchoring``       string  the shared anchoring instant (2 s)
``{P}:layout``          string  this layout's version
``{P}:id``              string  the store's id (made once; a wipe makes a new one)
``{P}:w:ID``            string  a worker process's liveness (JSON: node name, pid, process
                                identity, renewed_at, expires_at), removed by its expiry
                                ``worker_records_kept`` after it lapses; ID: ``worker_id``
======================  ======  ===========================================================

The definition fields and keys came with beat-claims 0.2's definitions: a reader of the
layout before them reads the same keys and fields the same way (and never the new ones),
so ``{P}:layout`` stays "2" (a prune of that version does not know definitions, and would
remove an entry that has one: prune with this one).

The due index (``next_due`` and ``{P:NN}:next``) came after them, and is additive in the
same way, so ``{P}:layout`` stays "2": a version before it reads nothing of it, and moving
the number would not stop it (its register sets "2" again). What such a version writes
leaves the index as it was: its claims move a checkpoint past the indexed instant (an
index earlier than truth: a read), its definition writes leave the instant of the old
definition (repaired by the beats that follow the change feed), its new entries have no
next_due (found by :meth:`RedisStore.unindexed`). Entries written before the index are
not in it either: a rebuild sweep pages through them (:meth:`RedisStore.unindexed`: one
``HSCAN`` step of ``{P}:entries``, 10,000 entries, a page, their keys made and their
records read by two scripts on the server) and indexes each.

On a cluster the due index spreads over as many masters as the buckets do (``BUCKETS``
hash tags, one slot each: up to 16 masters). :meth:`RedisStore.due` is two round trips:
every bucket's first ``limit`` due (``due.lua``: the start found by rank, O(log N)
whatever the ties before it; one script for every bucket on one server, one per bucket on
a cluster, in one pass over the masters), merged by the client; then the chosen entries'
states (``states.lua``, one call per bucket group). The first read that meets a name that
is not UTF-8 (written by something else) is made once more, leaving such names out, as
the store's later reads do.

Records are JSON, never pickle. Names of states, reasons and policies reach the scripts
as a table generated from :mod:`beat_claims.enums`.

On Redis Cluster (a :class:`~.redis_client.ClusterClient`) a round trip is one pipelined
pass over the masters concerned (:meth:`ClusterClient.execute`: redirections followed,
nothing sent twice), the sweeps read one bucket per script call, and the epoch covers
every master that holds one of the store's slots: the heartbeat first reads each one's
run id (``server.lua``, routed by a key of each bucket and of ``{P}``), and a new
connection to a node whose run id is not among them is refused until a heartbeat reads
them again (a master restarted or failed over may hold older data).
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import heapq
import itertools
import json
import math
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources
from typing import Any

import redis
from celery.utils.log import get_logger
from redis.client import NEVER_DECODE, Pipeline
from redis.exceptions import NoScriptError, RedisClusterException, ResponseError

from ..enums import FINAL_STATES, Origin, Overlap, Reason, RunState, StartVerdict
from ..runs import Owner, Run, iso
from ..urls import raise_redacted, redact_url
from .base import (
    CHANGES_PER_MS,
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
    DueAhead,
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
from .redis_client import ClusterClient, RedisOptions, connect
from .redis_packer import Packed, takes_packed

logger = get_logger("celery.beat.claims")

#: An entry's eleven keys as a command's arguments (one Packed, or eleven bytes), and its
#: name, encoded (see RedisStore._entry_head).
_Head = tuple[tuple[Any, ...], bytes]

#: Buckets the entries are spread over: each has its own slot on Redis Cluster, and a
#: sweep reads each bucket's indexes once. Part of the layout: never change it in place.
BUCKETS = 16
LAYOUT = "2"
#: Beats that register new entries within this many ms of each other share the instant.
ANCHOR_SHARED_MS = 2000
#: How long the task-id index keeps a started run, and a presumed-lost run is kept.
WEEK_MS = 7 * 24 * 3600 * 1000
#: Owners whose heartbeat lapsed this long ago are forgotten (an hour).
FORGET_OWNERS_MS = 3600 * 1000
#: Commands per round trip when one call has many items.
CHUNK = 1000
#: Times the script calls a server refused are sent again in one round trip (the library
#: lost, then no functions at all, then the scripts lost meanwhile).
MEND_PASSES = 3
#: Entries a call of a script made for many (claim, sent) takes at most: one command to
#: pack and one reply to read for all of them, rather than one of each per entry.
ENTRY_BATCH = 100
#: Entries of the registry one page of a rebuild pass looks at (one HSCAN step's COUNT):
#: the server makes their keys and reads their records, the beat handles a string a bucket.
REGISTRY_SCAN = 10_000
#: Changes of the feed a read answers at most by default (Store.changes'), and with a
#: heartbeat.
FEED_PAGE = 1000
#: Hexadecimal digits of an entry name's digest (the registry's fields, the keys' ends).
DIGEST_CHARS = 20
#: A digest of an entry's name, as the registry's fields hold it (see digest()).
_DIGEST = re.compile(f"[0-9a-f]{{{DIGEST_CHARS}}}")
#: Entries whose script arguments (keys and name, encoded) are kept; then they start again.
ENTRY_HEADS = 2048
#: What separates an entry's own arguments packed in one (see each_entry in the Lua
#: prelude) ...
_SEP = "\x1f"
#: ... and, when one of them holds it, a byte that UTF-8 text never holds.
_SEP_ANY = b"\xff"
#: An entry's keys (see entry_keys): its own, named by kind, then its bucket's.
_ENTRY_KINDS = ("e", "r", "h", "d", "b", "x")
_BUCKET_KEYS = ("due", "held", "open", "t", "next")
#: redis-py's option to read a command's reply as bytes.
_UNDECODED = {NEVER_DECODE: True}
#: Errors that say the server cannot serve us now: an outage, not a bad record. redis-py
#: turns the known codes into these classes (also when a script's call fails with one)...
_OUTAGE_CLASSES = (redis.exceptions.ReadOnlyError, redis.exceptions.BusyLoadingError,
                   redis.exceptions.MasterDownError, redis.exceptions.ClusterDownError,
                   redis.exceptions.TryAgainError,
                   redis.exceptions.OutOfMemoryError,  # type: ignore[attr-defined]  # stale stubs
                   redis.exceptions.AuthenticationError, redis.exceptions.NoPermissionError)
#: ... and leaves these codes in the message.
_OUTAGE_CODES = ("NOREPLICAS", "BUSY", "MISCONF", "READONLY", "LOADING", "MASTERDOWN",
                 "CLUSTERDOWN", "TRYAGAIN", "OOM", "NOAUTH", "WRONGPASS", "NOPERM")

SCRIPTS = ("register", "claim", "check", "sent", "release", "reclaim", "live", "open",
           "start", "finish", "requeue", "request", "forget", "heartbeat", "leave",
           "anchor_instant", "server", "pause", "resume", "backfill", "worker_heartbeat",
           "kept", "beats_alive", "registrant", "unregister", "define", "changes", "index",
           "due", "states", "unindexed", "registry_scan")


def _lua_names() -> str:
    """The names the scripts share with Python, generated from the enums."""
    def table(name: str, values: Iterable[str]) -> str:
        return f"local {name} = {{" + ", ".join(f"{v} = '{v}'" for v in values) + "}"

    def flags(name: str, values: Iterable[str]) -> str:
        return f"local {name} = {{" + ", ".join(f"{v} = true" for v in values) + "}"

    return "\n".join([
        table("STATE", (s.value for s in RunState)),
        flags("FINAL", sorted(s.value for s in FINAL_STATES)),
        flags("HELD", (s.value for s in RunState if s.held)),
        flags("OPEN", (s.value for s in RunState if s.open)),
        table("REASON", (r.value for r in Reason)),
        table("OVERLAP", (o.value for o in Overlap)),
        table("CLAIM", (c.value for c in ClaimStatus)),
        table("CHECK", (v.value for v in CheckVerdict)),
        table("START", (v.value for v in StartVerdict)),
        table("WRITE", (v.value for v in WriteStatus)),
        table("WROTE", (v.value for v in Wrote)),
        f"local LOST_KEEP_MS = {WEEK_MS}",
        f"local TOKENS_PER_MS = {TOKENS_PER_MS}",
        f"local CHANGES_PER_MS = {CHANGES_PER_MS}",
        f"local TOMBSTONES_DROPPED = {TOMBSTONES_DROPPED}",
    ])


#: A top-level definition of the prelude or of the generated names: ``local NAME`` or
#: ``local function NAME`` at the start of a line.
_LUA_DEFINITION = re.compile(r"^local (?:function )?([A-Za-z_]\w*)\b", re.M)
_LUA_WORD = re.compile(r"[A-Za-z_]\w*")
#: A line that is only a comment (a comment after code is read as code: it may name more,
#: never less).
_LUA_COMMENT_LINE = re.compile(r"^[ \t]*--(?!\[).*$", re.M)


def _lua_words(text: str) -> set[str]:
    return set(_LUA_WORD.findall(_LUA_COMMENT_LINE.sub("", text)))


def _lua_definitions(text: str) -> tuple[str, list[tuple[str, str]]]:
    """``text`` cut at its top-level definitions: what comes before the first (kept as it
    is), and (name, source) of each, in order (a definition's source runs to the next)."""
    starts = list(_LUA_DEFINITION.finditer(text))
    if not starts:
        return text, []
    ends = [m.start() for m in starts[1:]] + [len(text)]
    definitions = [(m.group(1), text[m.start():end]) for m, end in zip(starts, ends)]
    for defined, source in definitions:
        # Only a definition's own lines: the rest indented, its closing "end" or "}" not.
        for line in source.splitlines()[1:]:
            if line[:1] not in ("", " ", "\t", "-") and line.rstrip() not in ("end", "}"):
                raise ValueError(f"the Lua prelude's {defined!r} is followed by a top-level"
                                 f" line that is no definition: {line!r}")
    return text[:starts[0].start()], definitions


@cache
def _source(name: str) -> str:
    """The script ``name`` with the names and prelude definitions it uses, in their order.

    Redis runs the whole chunk on every call, so a definition the script never reaches
    still costs its table or closure each time. Lua resolves a local by its name in the
    text, and only to one defined before it: a definition no kept text names (the script,
    or a later kept definition) cannot be reached, and leaving it out changes nothing.
    """
    lua = resources.files(__package__).joinpath("lua")
    body = lua.joinpath(f"{name}.lua").read_text()
    head, definitions = _lua_definitions(_lua_names() + "\n"
                                          + lua.joinpath("_prelude.lua").read_text())
    used = _lua_words(body)
    kept: list[str] = []
    for defined, text in reversed(definitions):
        if defined in used:
            kept.append(text)
            used |= _lua_words(text)
    return "\n".join([head, *reversed(kept), body])


@cache
def _sha(name: str) -> str:
    return hashlib.sha1(_source(name).encode()).hexdigest()


#: Scripts that only read: flagged so in the library (a server out of memory runs them).
READ_ONLY_SCRIPTS = frozenset({"live", "open", "server", "beats_alive", "changes", "due",
                               "states", "unindexed", "registry_scan"})


@cache
def _library_parts() -> tuple[str, tuple[tuple[str, str], ...]]:
    """The library's shared head (the names and the whole prelude) and each script's body."""
    lua = resources.files(__package__).joinpath("lua")
    head = _lua_names() + "\n" + lua.joinpath("_prelude.lua").read_text()
    return head, tuple((name, lua.joinpath(f"{name}.lua").read_text()) for name in SCRIPTS)


def _library_text(name: str) -> str:
    """Every script as a function of one library named ``name`` (Redis 7 and later)."""
    head, bodies = _library_parts()
    functions = []
    for script, body in bodies:
        flags = "'no-writes'" if script in READ_ONLY_SCRIPTS else ""
        functions.append(f"redis.register_function{{function_name = '{_in(name, script)}',"
                         f" flags = {{{flags}}},\ncallback = function(KEYS, ARGV)\n{body}\n"
                         f"end}}")
    return "\n".join([f"#!lua name={name}", head, *functions])


@cache
def library_name() -> str:
    """The function library of this version's scripts, named by a digest of its whole text
    (its flags and wrappers too): versions side by side (a rolling upgrade) each load their
    own, and never run or replace another's (function names are global on a server, so
    they carry it too)."""
    text = _library_text("beat_claims")
    return "beat_claims_" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _in(library: str, script: str) -> str:
    return f"{library}_{script}"


@cache
def function_name(name: str) -> str:
    """The name script ``name`` is called by (FCALL) in this version's library."""
    return _in(library_name(), name)


@cache
def _script_of(function: str) -> str:
    return {function_name(name): name for name in SCRIPTS}[function]


@cache
def _library() -> str:
    """The library as loaded. Its names and prelude run once, when the server loads it,
    rather than at every call as with EVALSHA: over a burst, the server's time per call is
    about a fifth less (``store_script_usec_per_call``, docs/benchmarks.md)."""
    return _library_text(library_name())


class _NotRun(enum.Enum):
    """Why the server did not run a script call (a reply that says so: sent again once
    the cause is mended; any other error may follow a call that ran)."""

    NO_SCRIPT = "the server lost the scripts (a restart, SCRIPT FLUSH)"
    NO_FUNCTION = "the server lost the library (a restart, FUNCTION FLUSH, a new node)"
    NO_FUNCTIONS = "the server does not take functions (Redis before 7, or an ACL)"
    #: Out of memory, too few replicas, a failing save: a function may write, so it is
    #: refused before it starts. The same script by EVALSHA runs, and fails only at its
    #: first write: a call that only reads (the worker's fence turning a duplicate away;
    #: out of memory, a prune that only deletes) still answers, as it did before
    #: functions. Nothing remembers the refusal: while it lasts, such a call costs two
    #: round trips.
    WRITES_REFUSED = "the server refuses writes"


#: Replies that refuse a write command before it runs (a function's own failure names the
#: function: "... script: NAME, on @user_function:N.").
_WRITES_REFUSED_CODES = ("OOM", "NOREPLICAS", "MISCONF")


def _refuses_writes(reply: Any) -> bool:
    """A reply refusing a write command before it ran (out of memory, too few replicas, a
    failing save); a function's own failure names the function ("script: NAME, ...")."""
    return isinstance(reply, ResponseError) and "script:" not in str(reply) and (
        isinstance(reply, redis.exceptions.OutOfMemoryError)  # type: ignore[attr-defined]
        or str(reply).split(" ", 1)[0] in _WRITES_REFUSED_CODES)


@dataclass(frozen=True)
class _FeedRead:
    """One read of the change feed: ``limit`` changes after ``cursor``, one script call a
    group of buckets (``groups``), each bucket from its ``positions`` in its log."""

    cursor: ChangeCursor | None
    limit: int
    groups: list[list[int]]
    positions: tuple[tuple[int, str, int], ...]


@dataclass
class _Mended:
    """What mending a server could not do."""

    #: The server refused to load the library because it refuses writes (its reply).
    library_refusal: Any = None
    #: False: loading the scripts was not permitted (only the calls refused for writes
    #: needed them; with functions they are the only ones by EVALSHA).
    scripts: bool = True

    def and_(self, other: _Mended) -> _Mended:
        return _Mended(self.library_refusal or other.library_refusal,
                       self.scripts and other.scripts)


def _answer(i: int, reply: Any, refused: dict[int, Any]) -> Any:
    """A call's reply once sent again: a call refused for writes that EVALSHA may not
    serve (no permission) keeps its refusal."""
    if i in refused and isinstance(reply, redis.exceptions.NoPermissionError):
        return refused[i]
    return reply


def _not_run(reply: Any, command: Sequence[Any]) -> _NotRun | None:
    if isinstance(reply, NoScriptError):
        return _NotRun.NO_SCRIPT
    if not isinstance(reply, ResponseError) or str(command[0]).upper() != "FCALL":
        return None
    text = str(reply)
    if text.startswith("Function not found"):
        return _NotRun.NO_FUNCTION
    if text.lower().startswith("unknown command") or (
            isinstance(reply, redis.exceptions.NoPermissionError) and "'fcall'" in text):
        return _NotRun.NO_FUNCTIONS
    if _refuses_writes(reply):
        return _NotRun.WRITES_REFUSED
    return None


def digest(name: str) -> str:
    return hashlib.blake2b(name.encode(), digest_size=DIGEST_CHARS // 2).hexdigest()


class RedisStore(Store):
    """The store on one Redis server (or a Sentinel-managed primary)."""

    def __init__(self, client: redis.Redis | ClusterClient, prefix: str = "beat-claims",
                 history_limit: int = 100, url: str = "") -> None:
        self.client = client
        self._cluster = client if isinstance(client, ClusterClient) else None
        #: One server (standalone or a Sentinel's primary): a script may read every bucket.
        #: False on a cluster: there each bucket has its own slot.
        self.single_node = self._cluster is None
        self.prefix = prefix
        self.history_limit = history_limit
        self._url = redact_url(url) if url else "redis"
        self._secret_url = url  # (its secrets are masked in the client's errors)
        self._local = threading.local()
        g = f"{{{prefix}}}"
        self._owners, self._alive, self._epoch = f"{g}:owners", f"{g}:alive", f"{g}:epoch"
        self._store_id = f"{g}:id"
        self._registry, self._anchoring = f"{g}:entries", f"{g}:anchoring"
        self._layout = f"{g}:layout"
        # A reconnection may reach another server (a restart from an older snapshot, a
        # failover) that redis-py would use without a word: every new connection first
        # checks that its server is the one the last heartbeat read.
        self._server: str | None = None
        self._servers: frozenset[str] = frozenset()  # its run ids (a cluster's masters)
        self._bad_keys: set[str] = set()
        self._bad_text_logged = False  # see _json_reply
        #: The due index held a name that is not UTF-8: its reads leave such names out.
        self._due_careful = False
        self._entry_heads: dict[str, _Head] = {}  # see _entry_head
        self._owner_record: tuple[Owner, str] | None = None  # see _owner_json
        self._heartbeating = threading.local()
        #: Scripts are called as functions of one library (FCALL) until the server shows it
        #: takes none (see _mend): then by EVALSHA.
        self._functions = True
        self._mode_lock = threading.Lock()
        if isinstance(client, ClusterClient):
            client.keyless_key = self._epoch  # TIME: the clock the heartbeat reads
            client.on_connect = self._check_server
        else:
            client.connection_pool.connection_kwargs["redis_connect_func"] = self._on_connect

    @classmethod
    def from_url(cls, url: str, prefix: str = "beat-claims", history_limit: int = 100,
                 options: RedisOptions | None = None) -> RedisStore:
        return cls(connect(url, options or RedisOptions()), prefix, history_limit, url)

    @property
    def description(self) -> str:
        return f"{self._url} (prefix {self.prefix!r})"

    # -- keys -------------------------------------------------------------------------
    def _tag(self, entry: str) -> tuple[str, str]:
        d = digest(entry)
        return self._bucket_tag(d), d

    @cached_property
    def _takes_packed(self) -> bool:
        """Whether this client's connections take :class:`Packed` arguments: never on a
        cluster (its calls are recorded, then sent by each node's client), and answered
        without asking it (reading the cluster client's attributes would build it: a round
        trip to the seed, outside any call's handling of the store's errors)."""
        return self._cluster is None and takes_packed(self.client)

    def _bucket_tag(self, d: str) -> str:
        """The hash tag of the bucket of the entry whose name's digest is ``d`` (as
        registry_scan.lua makes it too)."""
        return self._bucket_tags[_bucket(d)]

    @cached_property
    def _bucket_tags(self) -> list[str]:
        return [f"{{{self.prefix}:{bucket:02d}}}" for bucket in range(BUCKETS)]

    def entry_keys(self, entry: str) -> list[str]:
        """The keys of one entry, in the order every entry script expects them."""
        tag, d = self._tag(entry)
        return [*(f"{tag}:{kind}:{d}" for kind in _ENTRY_KINDS),
                *(f"{tag}:{name}" for name in _BUCKET_KEYS)]

    def _entry_key(self, entry: str) -> str:
        """The entry's hash (the first of :meth:`entry_keys`)."""
        tag, d = self._tag(entry)
        return f"{tag}:e:{d}"

    @cached_property
    def _framed_keys(self) -> list[bytes]:
        """For each bucket, an entry's keys (:meth:`entry_keys`) in the protocol, as the
        command packer frames them, with ``%s`` for the digest (six times): the keys of
        an entry are made in one step."""
        out = []
        for tag in self._bucket_tags:
            parts = []
            for kind in _ENTRY_KINDS:
                head = f"{tag}:{kind}:".encode()
                parts.append(b"$%d\r\n" % (len(head) + DIGEST_CHARS)
                             + head.replace(b"%", b"%%") + b"%s\r\n")
            for name in _BUCKET_KEYS:
                key = f"{tag}:{name}".encode()
                parts.append(b"$%d\r\n" % len(key) + key.replace(b"%", b"%%") + b"\r\n")
            out.append(b"".join(parts))
        return out

    def index_key(self, entry: str) -> str:
        """The due index of the entry's bucket (zset: name -> next due instant)."""
        return f"{self._tag(entry)[0]}:next"

    def definition_keys(self, entry: str) -> list[str]:
        """The keys of a definition script: the entry's, then its bucket's change log,
        names, tombstones and sequence (the module docstring's table)."""
        tag, _ = self._tag(entry)
        return [*self.entry_keys(entry), f"{tag}:changes", f"{tag}:named", f"{tag}:gone",
                f"{tag}:seq"]

    def _bucket_keys(self, bucket: int, *names: str) -> list[str]:
        return [f"{{{self.prefix}:{bucket:02d}}}:{name}" for name in names]


    def _old_entry_key(self, entry: str) -> str:
        """Where beat-claims 0.1 kept the entry (read once, to keep its anchor)."""
        return f"{self.prefix}:{{{digest(entry)}}}:entry"

    def _on_connect(self, conn: Any) -> None:
        conn.on_connect()
        self._check_server(conn)

    def _check_server(self, conn: Any) -> None:
        """A new connection (set up): its server must be one the last heartbeat read."""
        if self._server is None or getattr(self._heartbeating, "on", False):
            return
        conn.send_command("INFO", "server")
        match = _RUN_ID.search(str(conn.read_response()))
        if match and match.group(1) not in self._servers:
            raise redis.ConnectionError(
                "the store's server is another process than at the last heartbeat (a restart"
                " or a failover): its epoch must be read again before anything else")

    # -- round trips ------------------------------------------------------------------
    def _pipeline(self) -> Pipeline:
        """This thread's pipeline, reused: building one costs more than the round trip it
        saves (redis-py copies its response callbacks into every new client object)."""
        pipe: Pipeline | None = getattr(self._local, "pipe", None)
        if pipe is None:
            pipe = self._local.pipe = self.client.pipeline(transaction=False)
        pipe.reset()  # never send commands left by a call that failed before sending
        return pipe

    def _round_trip(self, build: Callable[[Pipeline], Any], vital: int | None = None
                    ) -> list[Any]:
        """One round trip; each command's reply or its error (a bad record affects only its
        own item). Script calls the server says it did not run (it lost the library or the
        scripts: a restart, a flush; it takes no functions; it refuses writes: see
        _NotRun) are sent again, those alone, once the cause is mended, at most
        MEND_PASSES times. An outage error in any reply raises, or with
        ``vital`` only in the first ``vital`` replies (the others are the caller's to
        judge)."""
        if self._cluster is not None:
            return self._cluster_round_trip(self._cluster, build)
        pipe = self._pipeline()
        try:
            build(pipe)
            commands = [args for args, _ in pipe.command_stack]
            # (each command's options: a reply read as bytes is read so when sent again)
            options = [dict(opts) for _, opts in pipe.command_stack]
            replies = list(pipe.execute(raise_on_error=False))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise_redacted(_store_error(exc), self._secret_url, exc)
        finally:
            pipe.reset()
        refused: dict[int, Any] = {}  # see _resend
        for passes in range(MEND_PASSES + 1):
            lost = {i: why for i, reply in enumerate(replies)
                    if (why := _not_run(reply, commands[i])) is not None}
            _raise_outage([reply for i, reply in enumerate(replies[:vital])
                           if i not in lost])
            if not lost:
                break
            if passes == MEND_PASSES:
                if vital is None or min(lost) < vital:
                    raise StoreError(f"the server keeps refusing the scripts:"
                                     f" {replies[min(lost)]}")
                break  # (the caller's to judge, as any error reply past ``vital``)
            try:
                mended = self._mend(set(lost.values()), self._pipeline())
                resend = self._resend(lost, mended, commands, replies, refused)
                again = self._pipeline()
                for i in resend:
                    again.execute_command(*commands[i], **options[i])
                for i, reply in zip(resend, again.execute(raise_on_error=False)):
                    replies[i] = _answer(i, reply, refused)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise_redacted(_store_error(exc), self._secret_url, exc)
            finally:
                self._pipeline()
        return replies

    def _resend(self, lost: dict[int, _NotRun], mended: _Mended,
                commands: list[Sequence[Any]], replies: list[Any],
                refused: dict[int, Any]) -> list[int]:
        """The lost calls to send again, their commands as they go now (``commands``
        rewritten). A call refused for writes goes by EVALSHA, and its refusal is kept in
        ``refused``: if EVALSHA cannot serve it either (no permission for it, or for
        loading the scripts), the refusal is its reply, an outage as before."""
        resend = []
        for i, why in lost.items():
            if i in refused and not mended.scripts:
                replies[i] = refused[i]
                continue
            if why is _NotRun.NO_FUNCTION and mended.library_refusal is not None:
                why = _NotRun.WRITES_REFUSED  # (the library cannot be loaded now)
                refused.setdefault(i, mended.library_refusal)
            elif why is _NotRun.WRITES_REFUSED:
                refused.setdefault(i, replies[i])
            commands[i] = self._as_called(commands[i], why)
            resend.append(i)
        return resend

    def _mend(self, causes: set[_NotRun], pipe: Pipeline) -> _Mended:
        """Make the server able to run the script calls it refused (``pipe``: one to it):
        the library loaded again, or the scripts if it takes no functions."""
        mended = _Mended()
        if _NotRun.NO_FUNCTIONS in causes:
            self._no_functions("the server does not run functions (Redis before 7.0, or an"
                               " ACL without FCALL)")
        if self._functions and _NotRun.NO_FUNCTION in causes:
            pipe.execute_command("FUNCTION", "LOAD", _library())
            (reply,) = pipe.execute(raise_on_error=False)
            if isinstance(reply, Exception) and "already exists" not in str(reply):
                if _refuses_writes(reply):  # (FUNCTION LOAD is a write: by EVALSHA now)
                    mended.library_refusal = reply
                else:
                    if not isinstance(reply, redis.exceptions.NoPermissionError):
                        _raise_outage([reply])  # (loading, busy, a replica: try later)
                    if "compil" in str(reply).lower():  # (a bug of ours, not the server's)
                        logger.error("beat-claims: the server does not compile the script"
                                     " library (%s): please report it", reply)
                    self._no_functions(f"the server refused the library ({reply})")
        if not self._functions or _NotRun.NO_SCRIPT in causes:
            for name in SCRIPTS:
                pipe.script_load(_source(name))
            replies = pipe.execute(raise_on_error=False)
            if self._functions and any(isinstance(r, redis.exceptions.NoPermissionError)
                                       for r in replies):
                mended.scripts = False  # (only calls refused for writes needed them)
                return mended
            _raise_outage(replies)
            for reply in replies:
                _raise_if_error(reply)
        return mended

    def _no_functions(self, why: str) -> None:
        with self._mode_lock:  # (said once, whichever thread finds it out)
            if not self._functions:
                return
            self._functions = False
            logger.info("beat-claims: %s: each script is sent by EVALSHA instead, and runs"
                        " the shared prelude at every call (a claim costs the server more)",
                        why)

    def _as_called(self, command: Sequence[Any], why: _NotRun) -> Sequence[Any]:
        """A script call refused for ``why``, as it is sent again: by EVALSHA once the
        server takes no functions, or while it refuses writes (see _NotRun)."""
        if str(command[0]).upper() == "FCALL" and (
                not self._functions or why is _NotRun.WRITES_REFUSED):
            return ("EVALSHA", _sha(_script_of(str(command[1]))), *command[2:])
        return command

    def _cluster_round_trip(self, cluster: ClusterClient, build: Callable[[Pipeline], Any]
                            ) -> list[Any]:
        """:meth:`_round_trip` on a cluster: one pass over the masters concerned. A master
        that lost the library or the scripts (restarted, failed over, flushed, new) gets
        them, and only the commands it refused are sent again; a reply lost on the way (a
        timeout, a connection error) is an outage for the whole call, never a second
        try."""
        recorder: Pipeline | None = getattr(self._local, "recorder", None)
        if recorder is None:
            # Only records the commands (their replies are parsed by each node's client).
            recorder = self._local.recorder = redis.Redis().pipeline(transaction=False)
        recorder.reset()
        try:
            build(recorder)
            commands = [(args, dict(options)) for args, options in recorder.command_stack]
        finally:
            recorder.reset()
        refused: dict[int, Any] = {}  # see _resend
        try:
            answered = cluster.execute(commands)
            replies = [reply for reply, _ in answered]
            for passes in range(MEND_PASSES + 1):
                lost = {i: why for i, reply in enumerate(replies)
                        if (why := _not_run(reply, commands[i][0])) is not None}
                _raise_outage([reply for i, reply in enumerate(replies) if i not in lost])
                if not lost or passes == MEND_PASSES:
                    break  # (what is left is refused below)
                nodes = {}
                for i in lost:
                    node = answered[i][1]
                    if node is not None:
                        nodes[node.name] = node
                mended = _Mended()
                for node in nodes.values():
                    mended = mended.and_(self._mend(
                        set(lost.values()),
                        cluster.get_redis_connection(node).pipeline(transaction=False)))
                calls = [args for args, _ in commands]
                resend = self._resend(lost, mended, calls, replies, refused)
                commands = [(calls[i], options) for i, (_, options) in enumerate(commands)]
                for i, (reply, node) in zip(resend, cluster.execute([commands[i]
                                                                      for i in resend])):
                    replies[i], answered[i] = _answer(i, reply, refused), (reply, node)
        except (redis.ConnectionError, redis.TimeoutError, RedisClusterException,
                redis.exceptions.ClusterError, redis.exceptions.TryAgainError) as exc:
            # (TRYAGAIN: ClusterClient.execute gave up)
            raise_redacted(_store_error(exc), self._secret_url, exc)
        for i, reply in enumerate(replies):
            if _not_run(reply, commands[i][0]) is not None:
                raise StoreError(f"a cluster node keeps refusing the scripts: {reply}")
        return replies

    def _chunked(self, items: Sequence[Any], build: Callable[[Pipeline, Any], Any]
                 ) -> list[Any]:
        """One command per item, CHUNK commands per round trip."""
        replies: list[Any] = []
        for start in range(0, len(items), CHUNK):
            chunk = items[start:start + CHUNK]

            def each(pipe: Pipeline, c: Sequence[Any] = chunk) -> None:
                for item in c:
                    build(pipe, item)

            replies += self._round_trip(each)
        return replies

    def _call(self, name: str) -> tuple[str, str]:
        """How script ``name`` is called now: FCALL of its function, or EVALSHA (redis-py's
        Script would ask SCRIPT EXISTS at every execute)."""
        return ("FCALL", function_name(name)) if self._functions else ("EVALSHA", _sha(name))

    def _script(self, pipe: Pipeline, name: str, keys: Sequence[str | bytes], *args: Any,
                raw: bool = False) -> None:
        """Call script ``name``; with ``raw``, its reply is read as bytes (a JSON reply,
        decoded by _json_reply: a record of bytes that are not UTF-8 cannot fail it)."""
        pipe.execute_command(*self._call(name), len(keys), *keys, *args,
                             **(_UNDECODED if raw else {}))

    def _entry_head(self, entry: str) -> _Head:
        """The entry's keys and name as a command's arguments: a claim, its check and its
        sent mark each pass the same eleven keys. The keys are one argument already in the
        protocol (:class:`Packed`) when the client takes it, else the bytes redis-py would
        send (it sends bytes as they are)."""
        heads = self._entry_heads
        head = heads.get(entry)
        if head is None:
            if len(heads) >= ENTRY_HEADS:
                heads = self._entry_heads = {}  # (a new dict: other threads may read the old)
            if self._takes_packed:
                d = digest(entry)
                keys: tuple[Any, ...] = (Packed(11, self._framed_keys[_bucket(d)]
                                                % ((d.encode(),) * 6)),)
            else:
                keys = tuple(k.encode() for k in self.entry_keys(entry))
            head = heads[entry] = (keys, entry.encode())
        return head

    def _entry_script(self, pipe: Pipeline, name: str, entry: str, *args: Any) -> None:
        keys, name_bytes = self._entry_head(entry)
        pipe.execute_command(*self._call(name), 11, *keys, name_bytes, *args)

    def _entry_batches(self, entries: Sequence[str]) -> list[list[int]]:
        """The positions of ``entries`` grouped by the call of a script made for many that
        takes them: :data:`ENTRY_BATCH` at most, and on a cluster all of one bucket (its
        keys in one slot)."""
        if self.single_node:
            return [list(range(start, min(start + ENTRY_BATCH, len(entries))))
                    for start in range(0, len(entries), ENTRY_BATCH)]
        buckets: dict[str, list[int]] = {}
        for i, entry in enumerate(entries):
            buckets.setdefault(self._tag(entry)[0], []).append(i)
        return [positions[start:start + ENTRY_BATCH] for positions in buckets.values()
                for start in range(0, len(positions), ENTRY_BATCH)]

    def _batched(self, name: str, entries: Sequence[str], args: Sequence[str | bytes],
                 shared: Sequence[Any] = ()) -> list[Any]:
        """Script ``name`` (one made for many entries: see each_entry in the Lua prelude)
        for each of ``entries`` with its own ``args`` (packed: :func:`_packed`) and the
        ``shared`` ones, :data:`CHUNK` entries a round trip: each entry's reply (or error),
        in order. An entry's error that says the server cannot serve us now (out of memory
        at a write, by EVALSHA) is an outage for the whole call, as it would be for a call
        of its own (its caller reconciles, as after a reply lost)."""
        if not entries:
            return []
        out: list[Any] = [None] * len(entries)
        trips: list[list[list[int]]] = [[]]
        size = 0
        for batch in self._entry_batches(entries):
            if size + len(batch) > CHUNK:
                trips.append([])
                size = 0
            trips[-1].append(batch)
            size += len(batch)
        for trip in trips:

            def build(pipe: Pipeline, trip: list[list[int]] = trip) -> None:
                for batch in trip:
                    keys: list[Any] = []
                    argv: list[Any] = [*shared]
                    for i in batch:
                        head_keys, entry = self._entry_head(entries[i])
                        keys += head_keys
                        argv.append(entry)
                        argv.append(args[i])
                    pipe.execute_command(*self._call(name), 11 * len(batch), *keys, *argv)

            for batch, reply in zip(trip, self._round_trip(build)):
                answers = _each_reply(reply, len(batch))
                _raise_outage([a for a in answers if isinstance(a, Exception)])
                for i, answer in zip(batch, answers):
                    out[i] = answer
        return out

    # -- beats: liveness and entries ---------------------------------------------------
    def heartbeat(self, owner: Owner, ttl: float, resync: bool = False,
                  settling: bool = False, sweep: LiveQuery | None = None,
                  written: Sequence[Written] = (), changes: ChangeCursor | None = None,
                  continuity: Continuity | None = None) -> Heartbeat:
        # On one server the newest writes are looked for by the heartbeat's own script (in
        # the step that may begin a new epoch for them); on a cluster, whose runs live on
        # other masters, a round trip before it, and what was lost passed to it.
        found_lost = False
        cluster_kept: list[Any] = []
        if written and not self.single_node:
            try:
                cluster_kept = self._round_trip(lambda pipe: self._kept_build(pipe, written))
            except StoreError:  # judged at the next heartbeat; the heartbeat stands
                cluster_kept = []
            found_lost = bool(self._lost(written, cluster_kept))
        items = written if self.single_node else ()
        keys = list(self._heartbeat_keys)
        item_args: list[Any] = []
        for item in items:
            keys.extend(k.encode() for k in self.entry_keys(item.entry))
            item_args += [item.entry, item.due, item.token, item.kind.value,
                          *_confirmed_args(item)]
        on_going = continuity is not None and not (resync or settling)
        cont_args = ([continuity.epoch, continuity.seen_at,
                      "1" if continuity.owner_renewed else "0"]
                     if continuity is not None and on_going else ["", "0", "0"])

        def build(pipe: Pipeline) -> None:
            self._script(pipe, "heartbeat", keys, owner.id,
                         self._owner_json(owner), max(1, round(ttl * 1000)),
                         "1" if resync else "0", uuid.uuid4().hex, FORGET_OWNERS_MS,
                         "1" if settling else "0", uuid.uuid4().hex, servers, *cont_args,
                         "1" if found_lost else "0", *item_args, raw=True)
            if combined is not None:  # run after the heartbeat's script, in the same trip
                self._live_build(pipe, combined)
            if feed is not None:
                self._changes_build(pipe, feed)

        # On one server the sweep's scripts and the change feed's follow the heartbeat's
        # in its round trip, and whatever fails them leaves the heartbeat standing (the
        # caller asks again, and meets it there). A cluster would fail the whole batch for
        # one bucket's slot being moved (TRYAGAIN): there they are asked apart.
        combined = sweep if self.single_node else None
        feed = self._feed_read(changes, FEED_PAGE) if self.single_node and (
            changes is not None) else None

        self._heartbeating.on = True
        try:
            # On a cluster the script cannot read the other masters' run ids: they are read
            # just before (a master that restarts in between is caught by _check_server).
            servers = "" if self.single_node else self._masters()
            replies = self._round_trip(build, vital=1)
        finally:
            self._heartbeating.on = False
        reply = replies[0]
        _raise_if_error(reply)
        (now, epoch_id, settle, owners, alive, server, store_id, last_beat, known, since,
         script_kept, went_back) = self._json_reply(reply, 12)
        self._server = str(server) or None
        self._servers = frozenset(self._server.split(",")) if self._server else frozenset()
        kept = script_kept if self.single_node else cluster_kept
        # (no reply: the cluster's round trip failed; '' or an error: not judged)
        judged = list(kept)[:len(written)] + [""] * (len(written) - len(kept))
        replies = replies[1:]
        fed: Changes | None = None
        if feed is not None:
            replies, feed_replies = replies[:-len(feed.groups)], replies[-len(feed.groups):]
            try:
                fed = self._changes_parse(feed, feed_replies)
            except StoreError:  # (the caller reads the feed apart, and meets it there)
                fed = None
        return Heartbeat(now=int(now), epoch=str(epoch_id), store_id=str(store_id),
                         settle_until=int(settle) if settle else None,
                         owners=tuple(_owner_statuses(owners, alive, int(now))),
                         live=self._sweep_reply(replies, combined),
                         lost=self._lost(written, judged),
                         removed=tuple(item for item, reply in zip(written, judged)
                                       if reply == "r"),
                         unjudged=tuple(item for item, reply in zip(written, judged)
                                        if reply not in ("1", "0", "r")),
                         last_beat=int(last_beat) if last_beat else None,
                         owner_known=known == "1", epoch_since=int(since) if since else None,
                         changes=fed, went_back=went_back == "1")

    def _kept_build(self, pipe: Pipeline, written: Sequence[Written]) -> None:
        for item in written:
            self._entry_script(pipe, "kept", item.entry, item.due, item.token,
                               item.kind.value, *_confirmed_args(item))

    @staticmethod
    def _lost(written: Sequence[Written], replies: Sequence[Any]) -> tuple[Written, ...]:
        """The writes the store no longer holds (kept.lua answered '0'); an error or a
        record that cannot be read judges nothing."""
        return tuple(item for item, reply in zip(written, replies) if reply == "0")

    def _sweep_reply(self, replies: list[Any], sweep: LiveQuery | None) -> LiveRuns | None:
        """The sweep's answer that came with a heartbeat; None if the sweep's part failed
        (the heartbeat did not: the sweep asks again, and meets the error there)."""
        if sweep is None or len(replies) != len(self._live_keys) or any(
                isinstance(reply, Exception) for reply in replies):
            return None
        try:
            return self._live_parse(replies, sweep)
        except StoreError:
            return None

    def _owner_json(self, owner: Owner) -> str:
        """The owner's record, written at every heartbeat: encoded once per owner."""
        cached = self._owner_record
        if cached is None or cached[0] != owner:
            cached = self._owner_record = (owner, json.dumps(owner.as_dict()))
        return cached[1]

    def _masters(self) -> str:
        """The run ids of the masters holding the store's slots (each bucket's, and the one
        of the global keys), sorted and comma-separated: the epoch changes when any of them
        is another process. Routed by key, so the answer is the cluster's, not the slot
        table this client last read."""
        keys = [self._epoch, *(self._bucket_keys(b, "due")[0] for b in range(BUCKETS))]
        def build(pipe: Pipeline) -> None:
            for key in keys:
                self._script(pipe, "server", [key])

        replies = self._round_trip(build)
        for reply in replies:
            _raise_if_error(reply)
        return ",".join(sorted({str(reply) for reply in replies if reply}))

    def leave(self, owner: Owner) -> None:
        reply = self._round_trip(
            lambda pipe: self._script(pipe, "leave", [self._alive], owner.id))[0]
        _raise_if_error(reply)

    def register(self, seeds: Sequence[EntrySeed], owner: Owner | None = None
                 ) -> dict[str, EntryState]:
        if not seeds:
            return {}
        def first_build(pipe: Pipeline) -> None:
            self._script(pipe, "anchor_instant", [self._anchoring], ANCHOR_SHARED_MS)
            pipe.get(self._layout)
            if owner is not None:
                self._script(pipe, "beats_alive", [self._alive])

        first = self._round_trip(first_build)
        _raise_if_error(first[0])
        anchor_now, layout = str(first[0]), first[1]
        noting = (self._registrant_args(owner, first[2], int(anchor_now))
                  if owner is not None else None)
        seeds = list(seeds)
        if layout != LAYOUT:
            seeds = self._migrated(seeds)

        def build(pipe: Pipeline, seed: EntrySeed) -> None:
            runs = json.dumps([run.to_record() for run in seed.runs]) if seed.runs else ""
            self._entry_script(
                pipe, "register", seed.name, seed.description, anchor_now,
                "" if seed.anchor is None else seed.anchor,
                "" if seed.checkpoint is None else seed.checkpoint, seed.token,
                self.history_limit, runs)
            pipe.hset(self._registry, digest(seed.name), seed.name)
            if noting is not None:  # after the entry's script: it exists by then
                self._entry_script(pipe, "registrant", seed.name, *noting)

        replies = self._chunked(seeds, build)[::2 if noting is None else 3]
        out: dict[str, EntryState] = {}
        for seed, reply in zip(seeds, replies):
            if isinstance(reply, Exception):
                if seed.name not in self._bad_keys:  # once, not at every try
                    self._bad_keys.add(seed.name)
                    logger.error("beat-claims: entry %r cannot be registered in the store"
                                 " (%s); it is not scheduled until it can be", seed.name,
                                 reply)
                continue
            self._bad_keys.discard(seed.name)
            anchor, checkpoint, token, repaired = reply
            if repaired:
                logger.warning("beat-claims: entry %r had unreadable field(s) %s in the"
                               " store; repaired from what this beat knows", seed.name,
                               repaired)
            out[seed.name] = EntryState(int(anchor), int(checkpoint) if checkpoint else None,
                                        int(token))
        if layout != LAYOUT:
            self._round_trip(lambda pipe: pipe.set(self._layout, LAYOUT))
        return out

    def _registrant_args(self, owner: Owner, alive: Any, fallback: int
                         ) -> tuple[str, int, str]:
        """The registrant script's arguments for ``owner``, from beats_alive's reply (one
        that cannot be read: the live beats are not known, and nobody is dropped)."""
        now, live, known = self._beats_alive_reply(alive)
        return owner.id, now or fallback, json.dumps(sorted(live)) if known else "*"

    def _beats_alive_reply(self, reply: Any) -> tuple[int, list[str], bool]:
        """beats_alive's reply: the instant, the live owner ids, whether they are known."""
        try:
            now, ids, known = reply
            return int(now), [str(i) for i in ids], known == 1
        except (TypeError, ValueError):
            return 0, [], False

    def unregister(self, owner: Owner, entries: Sequence[str]) -> None:
        # (an entry whose record cannot be read answers an error: it stays as it is)
        self._chunked(list(entries), lambda pipe, name: self._entry_script(
            pipe, "unregister", name, owner.id))

    def _migrated(self, seeds: list[EntrySeed]) -> list[EntrySeed]:
        """Seeds for entries beat-claims 0.1 kept under its own keys: their anchor,
        checkpoint and token are kept, so interval entries keep their grid."""
        replies = self._chunked(seeds, lambda pipe, seed: pipe.hmget(
            self._old_entry_key(seed.name), ["anchor", "checkpoint", "token"]))
        out = []
        for seed, reply in zip(seeds, replies):
            try:
                anchor, checkpoint, token = (int(v) if v else None for v in reply)
            except (TypeError, ValueError):
                anchor = None
            if anchor is None or seed.anchor is not None:
                out.append(seed)
                continue
            out.append(EntrySeed(seed.name, seed.description, anchor,
                                 max(checkpoint or 0, seed.checkpoint or 0) or None,
                                 max(token or 0, seed.token), seed.runs))
        return out

    # -- beats: the life of a claim ----------------------------------------------------
    def claim(self, owner: Owner, plans: Sequence[ClaimPlan]) -> list[ClaimResult]:
        plans = checked_plans(plans)

        limit = self.history_limit

        def arguments(plan: ClaimPlan) -> str | bytes:
            # (claim.lua's claim_one's ARGV from its third: the owner is shared)
            expected, send = plan.expected, plan.send
            if expected is None:
                args: list[Any] = ["", ""]
            else:
                cp = expected.checkpoint
                args = [expected.anchor, "" if cp is None else cp]
            task_ids = dict(zip(plan.claim, send.task_ids)) if send else {}
            steps = sorted([(due, "claim", task_ids.get(due, "")) for due in plan.claim]
                           + [(due, reason.value, "") for due, reason in plan.skip])
            args += [plan.token_floor, "1" if plan.take_due else "0", limit,
                     send.overlap.value if send else "", len(steps)]
            for step in steps:
                args += step
            args += ["" if plan.next_due is None else plan.next_due,
                     "" if plan.version is None else plan.version]
            return _packed(args)

        return [_claim_result(plan.entry, reply) for plan, reply in zip(
            plans, self._batched("claim", [p.entry for p in plans],
                                 [arguments(p) for p in plans], (owner.id,)))]

    def check(self, owner: Owner, checks: Sequence[Check]) -> list[CheckResult]:
        def build(pipe: Pipeline, item: Check) -> None:
            c = item.claim
            self._entry_script(pipe, "check", c.entry, owner.id, c.token, c.due, item.task_id,
                               item.skip.value if item.skip else "", item.overlap.value)

        checks = list(checks)
        out = []
        for item, reply in zip(checks, self._chunked(checks, build)):
            if isinstance(reply, Exception):
                out.append(CheckResult(item.claim, CheckVerdict.REFUSED,
                                       why=f"unreadable record: {reply}"))
                continue
            verdict, _, detail = reply.partition(";")  # one string (see check.lua)
            if verdict == CheckVerdict.SEND.value:
                out.append(CheckResult(item.claim, CheckVerdict.SEND))
            elif verdict == CheckVerdict.MISSING.value:
                out.append(CheckResult(item.claim, CheckVerdict.MISSING, why=detail))
            elif verdict == CheckVerdict.SKIPPED.value:
                out.append(CheckResult(item.claim, CheckVerdict.SKIPPED, Reason(detail)))
            elif verdict == CheckVerdict.WAITING.value:
                out.append(CheckResult(item.claim, CheckVerdict.WAITING))
            else:
                out.append(CheckResult(item.claim, CheckVerdict.REFUSED, why=detail))
        return out

    def record_sent(self, owner: Owner, claims: Sequence[Claim]) -> int:
        claims = list(claims)
        replies = self._batched("sent", [c.entry for c in claims],
                                [f"{_SEP}{c.token}{_SEP}{c.due}" for c in claims])
        return sum(1 for r in replies if r == "1")

    def release(self, owner: Owner, releases: Sequence[Release], max_attempts: int = 0
                ) -> list[RunState | None]:
        def build(pipe: Pipeline, item: Release) -> None:
            c = item.claim
            self._entry_script(pipe, "release", c.entry, owner.id, c.token, c.due,
                               item.error_type, item.error or "", max(1, max_attempts))

        releases = list(releases)
        return [RunState(r) if isinstance(r, str) and r else None
                for r in self._chunked(releases, build)]

    # -- sweeps -----------------------------------------------------------------------
    def _json_reply(self, reply: Any, length: int) -> list[Any]:
        """A script's reply sent as one JSON array of ``length`` values (redis-py reads one
        string far faster than nested arrays), read as bytes: UTF-8 whatever the client's
        encoding, and bytes that are not UTF-8 (a record written by something else) read as
        replacement characters, logged once (such a name matches no entry). Lua's cjson
        writes an empty list as ``{}``: read back as ``[]``."""
        if isinstance(reply, bytes):
            try:
                reply = reply.decode()
            except UnicodeDecodeError:
                reply = reply.decode(errors="replace")
                self._note_bad_text()
        try:
            values = json.loads(reply)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"the server's reply is not the script's: {reply!r:.200}"
                             ) from exc
        if not isinstance(values, list) or len(values) != length:
            raise StoreError(f"the server's reply is not the script's: {reply!r:.200}")
        return [[] if value == {} else value for value in values]

    def _note_bad_text(self) -> None:
        if not self._bad_text_logged:
            self._bad_text_logged = True
            logger.error("beat-claims: the store holds a record whose bytes are not UTF-8"
                         " (written by something else than beat-claims): read with"
                         " replacement characters, or left out where it would be an entry's"
                         " name; such a name matches no entry")

    def _note_bad_key(self, key: str) -> None:
        if key not in self._bad_keys:
            self._bad_keys.add(key)
            logger.error("beat-claims: the store's key %r is not a sorted set: the runs it"
                         " indexes are not looked at until it is repaired (delete it and"
                         " restart a beat: every beat registers its entries again)", key)

    def _bucket_groups(self) -> list[list[int]]:
        """Buckets read by one script call: all of them on one server; one at a time on a
        cluster, where each has its own slot."""
        if self.single_node:
            return [list(range(BUCKETS))]
        return [[bucket] for bucket in range(BUCKETS)]

    @cached_property
    def _live_keys(self) -> list[list[bytes]]:
        """The keys of each live script call: a sweep at every heartbeat names them all
        (as bytes, which redis-py sends as they are)."""
        return [[k.encode() for b in group for k in self._bucket_keys(b, "due", "held")]
                for group in self._bucket_groups()]

    @cached_property
    def _heartbeat_keys(self) -> list[bytes]:
        return [k.encode() for k in (self._owners, self._alive, self._epoch, self._store_id)]

    def live_runs(self, query: LiveQuery) -> LiveRuns:
        return self._live_parse(self._round_trip(lambda pipe: self._live_build(pipe, query)),
                                query)

    def _live_build(self, pipe: Pipeline, query: LiveQuery) -> None:
        for keys in self._live_keys:
            self._script(pipe, "live", keys, query.owner, query.held_before,
                         query.mine_before, query.dead_before, query.limit,
                         *sorted(query.live_owners), raw=True)

    def _live_parse(self, replies: list[Any], query: LiveQuery) -> LiveRuns:
        due: list[RunRef] = []
        held: list[HeldRun] = []
        complete = True
        for reply in replies:
            _raise_if_error(reply)
            due_members, held_rows, more, bad_keys = self._json_reply(reply, 4)
            for bad_key in bad_keys:
                self._note_bad_key(bad_key)
                complete = False
            complete = complete and not int(more)
            for member in due_members:
                ref = _plain_member(member)
                if ref is not None:
                    due.append(ref)
            for member, score in zip(held_rows[::2], held_rows[1::2]):
                since = _finite_ms(score)
                run = _held_member(member, since) if since is not None else None
                if run is not None:
                    held.append(run)
        # The limit is per bucket in the script: the answer holds at most ``limit`` of each.
        if len(due) > query.limit or len(held) > query.limit:
            complete = False
            held.sort(key=lambda h: h.since)
            due, held = due[:query.limit], held[:query.limit]
        return LiveRuns(tuple(due), tuple(held), complete)

    def open_runs(self, before: int, after: int | None = None, limit: int = 1000
                  ) -> list[OpenRun]:
        low = "-inf" if after is None else f"({after}"

        def read(pipe: Pipeline) -> None:
            for group in self._bucket_groups():
                keys = [self._bucket_keys(b, "open")[0] for b in group]
                self._script(pipe, "open", keys, low, f"({before}", limit)

        found: list[tuple[float, RunRef]] = []
        for reply in self._round_trip(read):
            _raise_if_error(reply)
            for rows in reply:
                for member, score in zip(rows[::2], rows[1::2]):
                    ref = _plain_member(member)
                    if ref is not None:
                        found.append((float(score), ref))
        found.sort(key=lambda item: (item[0], item[1].due, item[1].entry))
        chosen = [ref for _, ref in found[:limit]]
        records = self._chunked(chosen, lambda pipe, ref: pipe.hget(
            self.entry_keys(ref.entry)[1], str(ref.due)))
        out = []
        for (score, ref), raw in zip(found[:limit], records):
            run = _parse_run(ref.entry, raw)
            if run is not None and run.state.open:
                out.append(OpenRun(ref.entry, ref.due, run.token, run.state, int(score),
                                   run.task_id))
        return out

    def reclaim(self, reclaims: Sequence[Reclaim], by: str) -> list[bool]:
        reclaims = list(reclaims)
        replies = self._chunked(reclaims, lambda pipe, r: self._entry_script(
            pipe, "reclaim", r.entry, r.due, "" if r.token is None else r.token, by))
        for item, reply in zip(reclaims, replies):
            if reply == -1 or isinstance(reply, Exception):
                key = f"{item.entry}\0{item.due}"
                if key not in self._bad_keys:
                    self._bad_keys.add(key)
                    logger.error("beat-claims: %s due %s: its record in the store cannot be"
                                 " read; it is left out of the store's indexes (nothing will"
                                 " send it)", item.entry, iso(item.due))
        return [r == 1 for r in replies]

    # -- workers ----------------------------------------------------------------------
    def start(self, delivery: Delivery) -> StartDecision:
        d, proc = delivery, delivery.process
        takeover = (f"{d.takeover.worker}|{d.takeover.pid}" if d.takeover else "")

        def build(pipe: Pipeline) -> None:
            self._entry_script(pipe, "start", d.entry, d.due, d.token, proc.worker, proc.pid,
                               d.retries, takeover, proc.process, d.task_id)
            pipe.get(self._store_id)

        reply, store_id = self._round_trip(build)
        store_id = store_id if isinstance(store_id, str) else ""
        if isinstance(reply, Exception):
            return StartDecision(StartVerdict.UNTRACKED, f"unreadable record: {reply}",
                                 store_id=store_id)
        verdict = StartVerdict(reply[0])
        if verdict is StartVerdict.BUSY:
            return StartDecision(verdict, "busy", WorkerProcess(
                str(reply[1]), int(reply[2]), str(reply[3])), store_id=store_id)
        return StartDecision(verdict, str(reply[1]) if len(reply) > 1 else "",
                             store_id=store_id)

    def requeue(self, delivery: Delivery) -> bool:
        d, proc = delivery, delivery.process
        reply = self._round_trip(lambda pipe: self._entry_script(
            pipe, "requeue", d.entry, d.due, d.token, proc.worker, proc.pid,
            proc.process))[0]
        _raise_if_error(reply)
        return bool(reply == 1)

    def finish(self, outcomes: Sequence[Outcome]) -> list[bool]:
        def build(pipe: Pipeline, o: Outcome) -> None:
            self._entry_script(
                pipe, "finish", o.entry, o.due, "" if o.token is None else o.token,
                o.state.value, o.reason.value if o.reason else "", o.exc_type, o.exc_message,
                o.worker, "" if o.inactive_since is None else o.inactive_since,
                "1" if o.unstarted_only else "0")

        outcomes = list(outcomes)
        return [r == 1 for r in self._chunked(outcomes, build)]

    def lookup_task(self, task_id: str) -> Claim | None:
        # The id is all the caller has: it is looked for in every bucket, in one round trip.
        replies = self._round_trip(lambda pipe: [
            pipe.hget(self._bucket_keys(b, "t")[0], task_id) for b in range(BUCKETS)])
        for raw in replies:
            if not raw or isinstance(raw, Exception):
                continue
            try:
                data = json.loads(raw)
                return Claim(str(data["entry"]), int(data["due"]), int(data["token"]))
            except (ValueError, KeyError, TypeError):
                continue
        return None

    # -- operators --------------------------------------------------------------------
    def request_run(self, entry: str, by: str, request_id: str = "") -> int | None:
        reply = self._round_trip(lambda pipe: self._entry_script(
            pipe, "request", entry, by, self.history_limit, request_id))[0]
        _raise_if_error(reply)
        return int(reply) if reply else None

    def pause(self, entry: str, by: str, note: str = "") -> EntryRecord | None:
        reply = self._round_trip(lambda pipe: self._entry_script(
            pipe, "pause", entry, by, note))[0]
        _raise_if_error(reply)
        if not reply:
            return None
        return self._entry_record(entry)

    def resume(self, entry: str, by: str) -> EntryRecord | None:
        reply = self._round_trip(lambda pipe: self._entry_script(
            pipe, "resume", entry, by))[0]
        _raise_if_error(reply)
        return None if reply == -1 else self._entry_record(entry)

    def backfill(self, entry: str, dues: Sequence[int], by: str) -> BackfillResult | None:
        instants = sorted({int(d) for d in dues})
        reply = self._round_trip(lambda pipe: self._entry_script(
            pipe, "backfill", entry, by, self.history_limit, *instants))[0]
        _raise_if_error(reply)
        if not reply:
            return None
        if reply[0] == -1:  # refused: the history cannot hold its runs
            raise BackfillRefused(entry, int(reply[1]), int(reply[2]), self.history_limit)
        if reply[0] == -2:  # refused: instants at or before the history's horizon
            raise BackfillForgotten(entry, _maybe_int(reply[2]), int(reply[1]),
                                    self.history_limit)
        created, kept = reply
        pairs = [(int(kept[i]), RunState(kept[i + 1])) for i in range(0, len(kept), 2)
                 if kept[i + 1]]
        return BackfillResult(entry, tuple(int(d) for d in created), tuple(pairs))

    def _entry_record(self, entry: str) -> EntryRecord | None:
        found = self.entries([entry])
        return found[0] if found else None

    def forget(self, entries: Sequence[str]) -> list[str]:
        names = list(entries)
        if not names:
            return []
        alive = self._round_trip(lambda pipe: self._script(pipe, "beats_alive",
                                                           [self._alive]))[0]
        _raise_if_error(alive)
        since, live, known = self._beats_alive_reply(alive)
        if not known:
            raise StoreError(f"{self._alive} cannot be read: which beats are alive is not"
                             " known, so nothing was removed")
        live_ids = json.dumps(sorted(live))
        replies = self._chunked(names, lambda pipe, name: self._script(
            pipe, "forget", self.definition_keys(name), name, live_ids, since))
        removed = [name for name, reply in zip(names, replies) if reply == 1]
        if removed:
            self._round_trip(lambda pipe: pipe.hdel(self._registry,
                                                    *[digest(n) for n in removed]))
        return removed

    # -- definitions ------------------------------------------------------------------
    #: A definition's stored fields, in the order every read asks for them.
    _DEFINITION_FIELDS = ("definition", "version", "origin", "changed_by", "changed_at")

    def write_definitions(self, writes: Sequence[DefinitionWrite]
                          ) -> list[DefinitionResult]:
        writes = checked_writes(writes, self.history_limit)
        if not writes:
            return []
        # New entries are anchored as register anchors them (anchor_instant.lua).
        anchor = self._round_trip(lambda pipe: self._script(
            pipe, "anchor_instant", [self._anchoring], ANCHOR_SHARED_MS))[0]
        _raise_if_error(anchor)
        out: list[DefinitionResult] = []
        for start in range(0, len(writes), CHUNK):
            chunk = writes[start:start + CHUNK]

            def build(pipe: Pipeline, part: Sequence[DefinitionWrite] = chunk) -> None:
                for w in part:
                    self._define(pipe, w, str(anchor))
                    if _creates(w):  # (listed with every entry, as register lists them)
                        pipe.hset(self._registry, digest(w.name), w.name)

            replies = iter(self._round_trip(build))
            for w in chunk:
                out.append(self._write_result(w, next(replies)))
                if _creates(w):
                    next(replies)
        return out

    def _define(self, pipe: Pipeline, w: DefinitionWrite, anchor: str) -> None:
        steps = [x for due, reason in sorted(w.skip) for x in (due, reason.value)]
        self._script(pipe, "define", self.definition_keys(w.name), w.name, anchor,
                     w.expected_version, w.definition or "",
                     "1" if w.definition is None else "0", w.origin.value, w.by, w.change_id,
                     "" if w.checkpoint is None else w.checkpoint,
                     "" if w.expected_checkpoint is None else w.expected_checkpoint,
                     self.history_limit, self.tombstones_kept_ms, len(w.skip), *steps,
                     written_next_due(w), raw=True)

    def _write_result(self, w: DefinitionWrite, reply: Any) -> DefinitionResult:
        """define.lua's reply; one that cannot be read (an error: a key of the wrong kind)
        makes its own entry corrupt, never the call."""
        try:
            _raise_if_error(reply)
            status_text, detail, anchor, checkpoint, token, *stored = self._json_reply(
                reply, 10)
            status = WriteStatus(status_text)
            if status is WriteStatus.CORRUPT:
                return DefinitionResult(w.name, status, 0,
                                        detail=f"unreadable field {detail!r}")
            state = (EntryState(_whole(anchor), _maybe_int(checkpoint), _whole(token))
                     if anchor else None)
        except (StoreError, ValueError, OverflowError) as exc:
            return DefinitionResult(w.name, WriteStatus.CORRUPT, 0, detail=str(exc))
        return definition_result(w, status, state,
                                 [None if v is False else v for v in stored], str(detail))

    def definitions(self, names: Sequence[str] | None = None, after: str = "",
                    limit: int = 1000) -> list[StoredDefinition]:
        if names is None:
            names = self._named(after, page_limit(limit, 0))
        found = self._definitions_of(list(dict.fromkeys(names)))
        return [d for d in found.values() if d is not None]

    def _definitions_of(self, names: list[str]) -> dict[str, StoredDefinition | None]:
        """Each entry's stored definition (None: it never had one), read as bytes."""
        replies = self._chunked(names, lambda pipe, name: pipe.execute_command(
            "HMGET", self.entry_keys(name)[0], *self._DEFINITION_FIELDS, **_UNDECODED))
        out: dict[str, StoredDefinition | None] = {}
        for name, reply in zip(names, replies):
            if isinstance(reply, Exception):
                out[name] = StoredDefinition(name, None, 0, Origin.API, "", 0, False,
                                             f"unreadable record: {reply}")
            elif reply[0] is None and reply[1] is None:
                out[name] = None
            else:
                out[name] = stored_definition(name, *reply)
        return out

    def _named(self, after: str, limit: int) -> list[str]:
        """The first ``limit`` names after ``after`` of the entries that have or had a
        definition: each bucket's first ``limit``, merged."""
        if limit <= 0:
            return []
        low = b"(" + after.encode() if after else b"-"

        def build(pipe: Pipeline) -> None:
            for bucket in range(BUCKETS):
                pipe.execute_command("ZRANGEBYLEX", self._bucket_keys(bucket, "named")[0],
                                     low, b"+", "LIMIT", 0, limit, **_UNDECODED)

        found: list[bytes] = []
        for bucket, reply in enumerate(self._round_trip(build)):
            if isinstance(reply, Exception):  # a key of the wrong kind: named, left out
                self._note_bad_key(self._bucket_keys(bucket, "named")[0])
                continue
            found += reply
        return [name.decode(errors="replace") for name in sorted(found)[:limit]]

    def changes(self, cursor: ChangeCursor | None, limit: int = FEED_PAGE) -> Changes:
        feed = self._feed_read(cursor, page_limit(limit, 1))
        return self._changes_parse(feed, self._round_trip(
            lambda pipe: self._changes_build(pipe, feed)))

    def _feed_read(self, cursor: ChangeCursor | None, limit: int) -> _FeedRead:
        positions = (cursor.positions if cursor is not None and len(cursor.positions) ==
                     BUCKETS else ((0, "", 0),) * BUCKETS)
        return _FeedRead(cursor, limit, self._bucket_groups(), positions)

    def _changes_build(self, pipe: Pipeline, feed: _FeedRead) -> None:
        """The change log's scripts of one read of the feed (one a group of buckets)."""
        for group in feed.groups:
            keys = [k for b in group for k in self._bucket_keys(b, "changes", "seq")]
            args = [x for b in group for x in (feed.positions[b][0], feed.positions[b][1])]
            self._script(pipe, "changes", keys, feed.limit, *args, raw=True)

    def _changes_parse(self, feed: _FeedRead, replies: Sequence[Any]) -> Changes:
        """The feed's page from its scripts' replies (and the definitions of what changed:
        one more round trip when anything did)."""
        cursor, limit, groups, positions = feed.cursor, feed.limit, feed.groups, feed.positions
        reads: list[LogRead] = []
        complete = True
        for group, reply in zip(groups, replies):
            _raise_if_error(reply)
            for bucket, row in zip(group, self._json_reply(reply, len(group))):
                read = _log_read(row, positions[bucket])
                if isinstance(read, str):  # a key of the wrong kind: the bucket stays put
                    self._note_bad_key(read)
                    complete = False
                    position, name, name_seq = positions[bucket]
                    read = LogRead(position, 0, (name, name_seq), name_seq or None, ())
                reads.append(read)
        next_cursor, taken, reload, whole = follow(cursor, reads, limit)
        stored = self._definitions_of([name for name, _ in taken])
        # (a member whose record is gone has no definition: deleted)
        changed = tuple(stored.get(name) or StoredDefinition(name, None, 0, Origin.API, "",
                                                              0, True)
                        for name, _ in taken)
        return Changes(next_cursor, changed, reload, complete and whole)

    # -- the due index ----------------------------------------------------------------
    def due(self, before: int, limit: int, after: tuple[int, str] | None = None
            ) -> list[DueEntry]:
        return self._due(before, limit, after, False).entries

    def due_ahead(self, before: int, limit: int, after: tuple[int, str] | None = None
                  ) -> DueAhead:
        """The first instant after ``before`` read by the same scripts as the page: the
        same round trips as :meth:`due` (none more)."""
        return self._due(before, limit, after, True)

    def _due(self, before: int, limit: int, after: tuple[int, str] | None, ahead: bool
             ) -> DueAhead:
        """The first ``limit`` entries of the due index at or before ``before`` after
        ``after``, every bucket's merged (one round trip), with their states (one more,
        when there are any); with ``ahead``, each bucket's first instant after ``before``
        too (the least of them: ``beyond``, once the page is short)."""
        before, limit, after = due_cursor(before, limit, after)
        groups = self._bucket_groups()
        low, name, low_next = ("", "", "") if after is None else (
            str(after[0]), after[1], str(after[0] + 1))

        def build(pipe: Pipeline) -> None:
            for group in groups:
                keys = [self._bucket_keys(b, "next")[0] for b in group]
                self._script(pipe, "due", keys, before + 1, limit, low, name,
                             "1" if ahead else "", low_next,
                             "1" if self._due_careful else "", raw=True)

        replies = self._round_trip(build)
        texts = _utf8_texts(replies)
        if texts is None and not self._due_careful:
            # A name that is not UTF-8 (by something else): read as text it would sort
            # elsewhere than its bytes, and a page ending on it would go on from the wrong
            # place. The index is read again leaving such names out, as it is from now on
            # (each name's bytes checked: the first read costs no check).
            self._due_careful = True
            self._note_bad_text()
            replies = self._round_trip(build)
            texts = _utf8_texts(replies)
        found: list[Iterator[tuple[int, bytes, str]]] = []
        beyond: list[int] = []
        for reply in replies if texts is None else texts:
            _raise_if_error(reply)
            names, instants, bad, later = self._json_reply(reply, 4)
            for key in bad:
                self._note_bad_key(key)
            found += [((int(due), n.encode(), n) for n, due in zip(mine, dues))
                      for mine, dues in zip(names, instants) if mine and dues]
            beyond += [at for at in map(_finite_ms, later or ()) if at is not None]
        # Each bucket's answer is in (instant, name's bytes) order, the order the next
        # page starts from (due.lua: a score that is no whole ms is read as its instant,
        # a name that is not UTF-8 left out), merged, and read only as far as the page goes
        # (on one server every bucket answers up to ``limit``: most of what a bucket
        # answers is not on the page).
        chosen = [(due, n) for due, _, n in itertools.islice(heapq.merge(*found), limit)]
        states = self._states([n for _, n in chosen])
        return DueAhead([DueEntry(n, due, *states[n]) for due, n in chosen],
                        min(beyond) if ahead and beyond and len(chosen) < limit else None)

    def _states(self, names: list[str]) -> dict[str, tuple[EntryState | None, int]]:
        """Each entry's state and definition version (None: it cannot be read), read by
        one script call per group of buckets (each bucket's keys in its own slot)."""
        if not names:
            return {}
        calls = [names]
        if not self.single_node:
            by_bucket: dict[str, list[str]] = {}
            for name in names:
                by_bucket.setdefault(self._tag(name)[0], []).append(name)
            calls = list(by_bucket.values())

        def build(pipe: Pipeline) -> None:
            for group in calls:
                self._script(pipe, "states", [self._entry_key(n) for n in group], raw=True)

        out: dict[str, tuple[EntryState | None, int]] = {}
        for group, reply in zip(calls, self._round_trip(build)):
            rows = (self._json_reply(reply, len(group)) if not isinstance(reply, Exception)
                    else [reply] * len(group))
            for name, row in zip(group, rows):
                version = None if isinstance(row, Exception) else _maybe_int(
                    row[3] or None)
                out[name] = (_due_state(row), version or 0)
        return out

    def index(self, writes: Sequence[IndexWrite]) -> list[bool]:
        writes = checked_index_writes(writes)
        replies = self._chunked(writes, lambda pipe, w: self._entry_script(
            pipe, "index", w.name, w.expected.anchor,
            "" if w.expected.checkpoint is None else w.expected.checkpoint, w.version,
            w.next_due))
        return [reply == 1 for reply in replies]

    def unindexed(self, limit: int, cursor: str = "") -> Unindexed:
        """One HSCAN step of the registry of every entry (``{P}:entries``, about
        :data:`REGISTRY_SCAN` entries) a call, from ``cursor`` ("SCAN:DIGESTS:END": the
        scan's cursor, and when a page ended inside its step, the entry each bucket read
        last, ','-separated, and where the step ends); each entry it names whose record has
        no next_due is answered. The pass is HSCAN's: an entry that stays unindexed through
        it is answered at least once (maybe more than once).

        A page that ends inside a step is followed by one that reads the step again, from
        the same cursor: the registry may have been resized meanwhile (beats registering or
        pruning entries), and the step then holds its entries in another order, and maybe
        others. So each bucket's entries of a step are read in digest order, a page going
        on after the digest its bucket read last whatever the order HSCAN answers, and the
        step ends where the earliest of its readings ended (in HSCAN's order of cursors):
        an entry that the step held when it was read again, but not when it was first read,
        comes again in the next step, rather than being passed over for the pass.

        Each record is read once a pass (``looked_at``: those this page read; a step read
        again after the registry's table resized, or while it rehashes, may read again those
        a reading read past the step's earliest end): the reads stop at the ``limit``-th
        entry found (on a cluster, each bucket's call at its share of ``limit``), and the
        next page reads the step from there. Two round trips whatever the step's size, a
        third only when some are answered (their names): the server makes the entries'
        keys (``registry_scan.lua``) and reads their records (``unindexed.lua``), so the
        beat handles one string a bucket, not a reply an entry. An idle beat's pass over
        100,000 entries is ten pages."""
        limit = page_limit(limit, 1)
        scan_text, _, rest = cursor.partition(":")
        read_text, _, end_text = rest.partition(":")
        scan = _scan_cursor(scan_text) or 0
        reply = self._round_trip(lambda pipe: self._script(
            pipe, "registry_scan", [self._registry], scan, REGISTRY_SCAN, self.prefix,
            BUCKETS, DIGEST_CHARS, raw=True))[0]
        _raise_if_error(reply)
        # (where the step ends: the earliest of its readings' ends)
        following = int(reply[0])
        end = _scan_cursor(end_text)
        if end is not None:
            following = _scan_earliest(following, end)
        read_last = {_bucket(d): d for d in read_text.split(",") if _DIGEST.fullmatch(d)}
        groups: list[tuple[int, list[bytes]]] = []  # (bucket, its keys still to read)
        for bucket, blob in enumerate(reply[1:]):
            # (one bucket's keys differ only by their digests: in digest order)
            keys = sorted(blob.split(b"\n")) if blob else []
            if bucket in read_last:
                last = read_last[bucket]
                keys = keys[bisect.bisect_right(
                    keys, f"{self._bucket_tag(last)}:e:{last}".encode()):]
            if keys:
                groups.append((bucket, keys))
        batches = [[group] for group in groups] if not self.single_node else (
            [groups] if groups else [])
        called = [(list(itertools.chain.from_iterable(keys for _, keys in batch)), batch,
                   share) for batch, share in zip(batches, _shares(limit, len(batches)))
                  if share]

        def check(pipe: Pipeline) -> None:
            for keys, _, share in called:
                if packed:  # (keys of one length: the server's own, sent back as they came)
                    pipe.execute_command(*self._call("unindexed"), len(keys),
                                         Packed.of_one_length(b"\n".join(keys), len(keys),
                                                              len(keys[0])), share)
                else:
                    self._script(pipe, "unindexed", keys, share)

        packed = self._takes_packed
        found: list[str] = []  # the digests of those without next_due, in the step's order
        looked_at, whole = 0, len(called) == len(batches)
        for (keys, batch, _), answer in zip(called, self._round_trip(check) if called else []):
            _raise_if_error(answer)
            read, positions = int(answer[0]), str(answer[1])
            looked_at += read
            found += [_digest_of(keys[int(i) - 1]) for i in positions.split(",") if i]
            for bucket, group in batch:  # (what each bucket of the call read)
                took = min(read, len(group))
                read -= took
                if took:
                    read_last[bucket] = _digest_of(group[took - 1])
                whole = whole and took == len(group)
        names = self._round_trip(lambda pipe: pipe.hmget(self._registry, found))[0] if (
            found) else []
        _raise_if_error(names)
        answered = tuple(str(name) for name in names if name is not None)
        if not whole:
            return Unindexed(answered, f"{scan}:{','.join(read_last.values())}:{following}",
                             False, looked_at)
        return Unindexed(answered, "" if following == 0 else f"{following}:",
                         following == 0, looked_at)

    # -- reads ------------------------------------------------------------------------
    def entries(self, names: Sequence[str] | None = None) -> list[EntryRecord]:
        if names is None:
            names = sorted(self._round_trip(lambda pipe: pipe.hvals(self._registry))[0])
        names = list(names)
        replies = self._chunked(names, lambda pipe, name: pipe.hmget(
            self.entry_keys(name)[0], ["anchor", "checkpoint", "token", "schedule",
                                       "paused_at", "paused_by", "paused_note",
                                       "resumed_by", "resumed_at", "last_paused_at",
                                       "registrants", "horizon"]))
        out = []
        for name, reply in zip(names, replies):
            if isinstance(reply, Exception):
                continue
            anchor, checkpoint, token, schedule, *pause, registrants, horizon = reply
            paused_at, paused_by, note, resumed_by, resumed_at, last_paused_at = pause
            # Paused is the field being there, as claims and checks read it; an instant
            # that cannot be read is reported as 0 rather than hiding the pause.
            paused = (None if paused_at is None else
                      Pause(paused_by or "", note or "", _maybe_int(paused_at) or 0))
            out.append(EntryRecord(name, schedule or "", _maybe_int(anchor),
                                   _maybe_int(checkpoint), _maybe_int(token) or 0, paused,
                                   resumed_by, _maybe_int(resumed_at),
                                   _maybe_int(last_paused_at),
                                   registrants_from_json(registrants),
                                   _maybe_int(horizon)))
        return out

    def history(self, entry: str, limit: int | None = None) -> list[Run]:
        if limit is not None and limit <= 0:
            return []  # (ZREVRANGE 0 0 would answer one run)
        keys = self.entry_keys(entry)
        dues = self._round_trip(lambda pipe: pipe.zrevrange(
            keys[2], 0, -1 if limit is None else max(0, limit - 1)))[0]
        if not dues or isinstance(dues, Exception):
            return []
        raws = self._round_trip(lambda pipe: pipe.hmget(keys[1], list(dues)))[0]
        return [run for raw in raws if (run := _parse_run(entry, raw)) is not None]

    def now(self) -> int:
        seconds, micros = self._round_trip(lambda pipe: pipe.time())[0]
        return int(seconds) * 1000 + int(micros) // 1000

    def owners(self) -> list[OwnerStatus]:
        owners, alive, (seconds, micros) = self._round_trip(lambda pipe: (
            pipe.hgetall(self._owners), pipe.zrange(self._alive, 0, -1, withscores=True),
            pipe.time()))
        flat_owners = [x for pair in owners.items() for x in pair]
        flat_alive = [x for pair in alive for x in pair]
        return _owner_statuses(flat_owners, flat_alive, int(seconds) * 1000 + micros // 1000)

    def close(self) -> None:
        self.client.close()

    # -- workers: liveness ------------------------------------------------------------
    def worker_key(self, process: WorkerProcess) -> str:
        """In the slot of the store's global keys, as the beats' liveness: one key a call."""
        return f"{{{self.prefix}}}:w:{worker_id(process)}"

    def worker_heartbeat(self, process: WorkerProcess, ttl: float) -> WorkerLiveness:
        ttl_ms = worker_ttl_ms(ttl)
        reply = self._round_trip(lambda pipe: self._script(
            pipe, "worker_heartbeat", [self.worker_key(process)], process.worker,
            process.pid, process.process, ttl_ms, self.worker_records_kept_ms))[0]
        _raise_if_error(reply)
        return written_worker_record(process, reply)

    def worker_liveness(self, processes: Sequence[WorkerProcess]) -> WorkerLivenessRead:
        processes = list(processes)

        def build(pipe: Pipeline) -> None:
            pipe.time()
            for process in processes:
                pipe.get(self.worker_key(process))

        (seconds, micros), *raws = self._round_trip(build)
        return WorkerLivenessRead(int(seconds) * 1000 + int(micros) // 1000,
                                  tuple(read_worker_record(p, raw)
                                        for p, raw in zip(processes, raws)))


# -- replies ------------------------------------------------------------------------------
_RUN_ID = re.compile(r"run_id:(\w+)")


def _store_error(exc: Exception) -> Exception:
    """What a failed round trip means: credentials refused or a host that does not exist
    are the configuration's fault (the beat says so and stops, at start); anything else
    is an outage (connection refused, timeouts, a server that is loading)."""
    if isinstance(exc, (redis.exceptions.AuthenticationError,
                        redis.exceptions.NoPermissionError)):
        return StoreConfigurationError(f"beat_claims_url: the store refused the"
                                       f" credentials ({type(exc).__name__}: {exc})")
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, socket.gaierror) and cause.errno in (socket.EAI_NONAME,
                                                              getattr(socket, "EAI_NODATA", -5)):
        return StoreConfigurationError(f"beat_claims_url: the store's host cannot be"
                                       f" resolved ({exc})")
    if isinstance(exc, RedisClusterException):
        # redis-py wraps what the seed answered: the first cause says what went wrong.
        inner = exc.__cause__
        if isinstance(inner, RedisClusterException) and "not enabled" in str(inner):
            return StoreConfigurationError(f"beat_claims_url: the store's node is not in"
                                           f" cluster mode ({inner}): use redis:// for a"
                                           f" single server")
        if isinstance(inner, (redis.ConnectionError, redis.TimeoutError)):
            wrapped = _store_error(inner)
            if isinstance(wrapped, StoreConfigurationError):
                return wrapped
    return StoreError(f"{type(exc).__name__}: {exc}")


def _raise_outage(replies: list[Any]) -> None:
    for reply in replies:
        if isinstance(reply, (redis.exceptions.AuthenticationError,
                              redis.exceptions.NoPermissionError)):
            raise _store_error(reply) from reply
        if isinstance(reply, _OUTAGE_CLASSES) or (
                isinstance(reply, ResponseError)
                and str(reply).split(" ", 1)[0] in _OUTAGE_CODES):
            raise StoreError(f"the server refused: {type(reply).__name__}: {reply}"
                             ) from reply


def _utf8_texts(replies: list[Any]) -> list[Any] | None:
    """Replies read as bytes, decoded; None when one is not UTF-8."""
    try:
        return [reply.decode() if isinstance(reply, bytes) else reply for reply in replies]
    except UnicodeDecodeError:
        return None


def _raise_if_error(reply: Any) -> None:
    if isinstance(reply, Exception):
        raise StoreError(f"the server answered with an error: {reply}") from reply


def _finite_ms(score: Any) -> int | None:
    """A sorted set's score as whole ms; None for one that is not finite (a record written
    by something else: ``-inf`` must not stop every heartbeat)."""
    try:
        value = float(score)
    except (TypeError, ValueError):
        return None
    return int(value) if math.isfinite(value) else None


def _maybe_int(value: Any) -> int | None:
    try:
        return _whole(value) if value not in (None, "") else None
    except (TypeError, ValueError, OverflowError):
        return None


def _whole(text: str) -> int:
    """A whole number as the store holds it: the scripts accept what Lua reads as one
    ('5.0', '5e3': a counter written by a tool or a restore)."""
    try:
        return int(text)
    except ValueError:
        number = float(text)
        if not number.is_integer():
            raise
        return int(number)


def _due_state(row: Any) -> EntryState | None:
    """An indexed entry's state from its fields (anchor, checkpoint, token, ...; False or
    None: absent); None when they cannot be read."""
    if isinstance(row, Exception):
        return None
    anchor, checkpoint, token = row[0], row[1], row[2]
    if anchor is not False and anchor is not None:
        try:  # (as a rule, three whole numbers, the checkpoint maybe absent)
            return EntryState(int(anchor), None if checkpoint is False else int(checkpoint),
                              0 if token is False else int(token))
        except (TypeError, ValueError, OverflowError):
            pass  # (read field by field below)
    anchor, checkpoint, token = (None if v is False else v for v in row[:3])
    if _maybe_int(anchor) is None or (checkpoint is not None
                                      and _maybe_int(checkpoint) is None):
        return None
    return EntryState(_maybe_int(anchor) or 0, _maybe_int(checkpoint), _maybe_int(token) or 0)


def _scan_reply(reply: Any) -> tuple[int, dict[str, str]]:
    """HSCAN's reply (as redis-py parses it, or raw): the next cursor, and field -> value."""
    following, found = reply
    if not isinstance(found, dict):
        found = dict(zip(found[::2], found[1::2]))
    return int(following), {str(k): str(v) for k, v in found.items()}


def _scan_cursor(text: str) -> int | None:
    """A SCAN cursor as a rebuild's cursor holds it (None: none, or none Redis takes)."""
    if not (text.isascii() and text.isdigit() and len(text) <= 20):
        return None
    return int(text) if int(text) < 2 ** 64 else None


def _scan_earliest(a: int, b: int) -> int:
    """The earlier of two SCAN cursors in the order a scan reaches them (it counts with
    the cursor's bits reversed; 0: the scan's end)."""
    if a == 0 or b == 0:
        return a or b
    return min(a, b, key=_reversed_bits)


def _reversed_bits(cursor: int) -> int:
    return int(f"{cursor:064b}"[::-1], 2)


def _digest_of(key: bytes) -> str:
    """The digest an entry's hash key ends with (``{P:NN}:e:DIGEST``)."""
    return key.rsplit(b":", 1)[1].decode()


def _packed(args: Sequence[Any]) -> str | bytes:
    """An entry's own arguments of a script made for many entries, in one (see each_entry
    in the Lua prelude): each as redis-py would send it (``str``), after a separator none of
    them holds."""
    text = _SEP + _SEP.join(map(str, args))
    if text.count(_SEP) == len(args):
        return text
    return _SEP_ANY + _SEP_ANY.join(a if isinstance(a, bytes) else str(a).encode()
                                    for a in args)


def _bucket(d: str) -> int:
    """The bucket of the entry whose name's digest is ``d`` (as registry_scan.lua counts)."""
    return int(d[:4], 16) % BUCKETS


def _shares(limit: int, calls: int) -> list[int]:
    """``limit`` cut into ``calls`` shares as even as can be, the first ones larger (some
    are 0 when ``limit`` is less than ``calls``)."""
    each, more = divmod(limit, calls) if calls else (0, 0)
    return [each + (i < more) for i in range(calls)]


def _each_reply(reply: Any, n: int) -> list[Any]:
    """The replies of the ``n`` entries of one call of a script made for many (see
    each_entry in the Lua prelude): an entry whose script raised has that error, and an
    error of the whole call is each entry's."""
    if isinstance(reply, Exception):
        return [reply] * n
    answers: list[Any] = str(reply).split("\n")
    if len(answers) != n:
        return [StoreError(f"the server's reply is not the script's: {reply!r:.200}")] * n
    return [redis.ResponseError(answer[1:]) if answer.startswith("!") else answer
            for answer in answers]


def _claim_result(entry: str, reply: Any) -> ClaimResult:
    """The claim script's reply: one string of ';'-separated fields (see claim.lua). A
    reply that cannot be read (a field the script passed on as stored: a counter of
    'inf') makes its own entry corrupt, never the call."""
    if isinstance(reply, Exception):
        return ClaimResult(entry, ClaimStatus.CORRUPT, detail=str(reply))
    try:
        return _parse_claim(entry, reply)
    except (ValueError, IndexError, KeyError, OverflowError) as exc:
        return ClaimResult(entry, ClaimStatus.CORRUPT,
                           detail=f"unreadable answer {str(reply)[:200]!r}: {exc}")


def _parse_claim(entry: str, reply: str) -> ClaimResult:
    fields = reply.split(";")
    status = _CLAIM_STATUS.get(fields[0]) or ClaimStatus(fields[0])
    if status is ClaimStatus.MISSING:
        return ClaimResult(entry, status)
    if status is ClaimStatus.CORRUPT:
        return ClaimResult(entry, status, detail=f"unreadable field {fields[1]!r}")
    state = EntryState(_whole(fields[1]), _maybe_int(fields[2]), _whole(fields[3]))
    if status is ClaimStatus.CONFLICT:
        return ClaimResult(entry, status, state)
    claimed, skipped, existing, taken, unreadable, checked = fields[4:10]
    # (most fields of most answers are empty: each is read only when it holds something)
    claims: tuple[Claim, ...] = ()
    if claimed:
        c = claimed.split(",")
        claims = tuple([Claim(entry, int(c[i]), int(c[i + 1])) for i in range(0, len(c), 2)])
    took: tuple[Claim, ...] = ()
    if taken:
        t = taken.split(",")
        took = tuple([Claim(entry, int(t[i]), int(t[i + 1]), manual=t[i + 2] == "1",
                            maybe_sent=t[i + 3] == "1", attempts=int(t[i + 4]))
                      for i in range(0, len(t), 5)])
    skips: tuple[tuple[int, Reason], ...] = ()
    if skipped:
        s = skipped.split(",")
        skips = tuple([(int(s[i]), _reason(s[i + 1])) for i in range(0, len(s), 2)])
    answers: tuple[CheckResult, ...] = ()
    if checked:
        by_due = {claim.due: claim for claim in claims}
        k = checked.split(",")
        answers = tuple([_checked(by_due[int(k[i])], k[i + 1], k[i + 2])
                         for i in range(0, len(k), 3)])
    return ClaimResult(entry, status, state, claims, took, skips,
                       _dues(existing.split(",")) if existing else (),
                       _dues(unreadable.split(",")) if unreadable else (), "", answers)


#: The answers' words, as their enums (a word none of them has raises, as the enum does).
_CLAIM_STATUS = {s.value: s for s in ClaimStatus}
_VERDICTS = {v.value: v for v in CheckVerdict}
_REASONS = {r.value: r for r in Reason}


def _reason(word: str) -> Reason:
    return _REASONS.get(word) or Reason(word)


def _checked(claim: Claim, verdict: str, reason: str) -> CheckResult:
    """A new claim's check made with it (see claim.lua): send, skipped or waiting."""
    return CheckResult(claim, _VERDICTS.get(verdict) or CheckVerdict(verdict),
                       _reason(reason) if reason else None)


def _dues(texts: list[str]) -> tuple[int, ...]:
    """Instants the script reports as stored (a run's key): one a tool wrote otherwise
    ('5.0x') is left out rather than hiding the claims of the same answer."""
    out = []
    for text in texts:
        try:
            out.append(_whole(text))
        except (ValueError, OverflowError):
            logger.warning("beat-claims: a run key that is no instant: %r", text[:100])
    return tuple(out)


def _creates(w: DefinitionWrite) -> bool:
    """Whether a write makes the entry exist (or finds it): a create that names no
    checkpoint (one that does answers CONFLICT for an entry that does not exist)."""
    return w.expected_version == 0 and w.expected_checkpoint is None


def _log_read(row: list[Any], position: tuple[int, str, int]) -> LogRead | str:
    """changes.lua's answer for one bucket, or the key of the wrong kind it named. A
    counter that cannot be read is taken as the newest number the log holds, a dropped
    mark that cannot be read as the head (a reader reloads rather than misses a drop)."""
    head, dropped, top_name, top_seq, seen, members, bad = row
    if bad:
        return str(bad)
    flat = [] if members == {} else list(members)
    pairs = tuple((str(flat[i]), n) for i in range(0, len(flat), 2)
                  if (n := _maybe_int(flat[i + 1])) is not None)
    newest = _maybe_int(top_seq) or 0
    head_n = _maybe_int(head)
    if head_n is None:
        head_n = max([newest, position[0], *(n for _, n in pairs)])
    dropped_n = _maybe_int(dropped)
    return LogRead(head_n, head_n if dropped_n is None else dropped_n,
                   (str(top_name), newest), _maybe_int(seen), pairs)


def _plain_member(member: str) -> RunRef | None:
    due, sep, name = member.partition("|")
    if not sep or not due.lstrip("-").isdigit():
        return None
    return RunRef(name, int(due))


def _held_member(member: str, since: int) -> HeldRun | None:
    parts = member.split("|", 3)
    if len(parts) != 4 or not parts[1].isdigit() or not parts[2].lstrip("-").isdigit():
        return None
    owner, token, due, name = parts
    return HeldRun(name, int(due), int(token), owner, since)


def _parse_run(entry: str, raw: Any) -> Run | None:
    if not raw or isinstance(raw, Exception):
        return None
    try:
        return Run.from_record(entry, json.loads(raw))
    except (ValueError, TypeError):
        return None  # an unreadable record is shown as missing rather than failing a read


def _confirmed_args(item: Written) -> tuple[str, str]:
    """What kept.lua (heartbeat.lua on one server) takes after a write's kind: '1' when it
    is confirmed, and its entry's anchor ('' not known)."""
    return ("1" if item.confirmed else "0", "" if item.anchor is None else str(item.anchor))


def _owner_statuses(owners: list[Any], alive: list[Any], now: int) -> list[OwnerStatus]:
    # (an expiry that is not a finite number, written by something else: taken as lapsed)
    expiry = {alive[i]: _finite_ms(alive[i + 1]) or 0 for i in range(0, len(alive), 2)}
    out = []
    for owner_id, raw in zip(owners[::2], owners[1::2]):
        try:
            owner = Owner.from_dict(json.loads(raw))
        except (ValueError, KeyError, TypeError):
            continue
        expires = expiry.get(owner_id, 0)
        out.append(OwnerStatus(owner, expires > now, expires))
    return out


__all__ = ["BUCKETS", "RedisStore", "digest"]
