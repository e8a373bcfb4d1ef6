"""Redis only: the key layout's promises (redis.py's module docstring).

* Every key a script touches is one of the keys it declares, and they all share one hash
  slot (so each script runs on Redis Cluster): checked on the keys the server reports the
  scripts touched while every store method runs, and on the key names themselves.
* No named value is written both in Lua and in Python: the scripts get the names of
  states, reasons, policies and replies from a table generated from the enums.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import re
import threading
from collections.abc import Iterator
from enum import Enum
from importlib import resources
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from beat_claims.enums import (
    FINAL_STATES,
    CatchUp,
    Origin,
    Overlap,
    Reason,
    RunState,
    StartVerdict,
)
from beat_claims.runs import Run
from beat_claims.stores.base import (
    BackfillRefused,
    Check,
    CheckVerdict,
    ClaimPlan,
    ClaimStatus,
    DefinitionWrite,
    EntrySeed,
    IndexWrite,
    LiveQuery,
    Outcome,
    Reclaim,
    Release,
    WriteStatus,
    Written,
    Wrote,
)
from beat_claims.stores.redis import (
    BUCKETS,
    SCRIPTS,
    RedisStore,
    _lua_names,
    _sha,
    function_name,
)

from ..conftest import RedisServer
from .helpers import (
    A,
    B,
    C,
    after,
    claim,
    claims,
    delivery,
    now,
    process,
    query,
    register,
    run,
    send,
    sending,
    started,
    take,
)

#: Entry names that could fool a hash tag: braces, empty tags, unicode, separators.
ODD_NAMES = ["e", "weird{name}", "{}", "}{", "{a}{b}", "a:b|c", "ünïcødé", "x" * 300]


@pytest.fixture
def redis_store(server: RedisServer) -> Iterator[RedisStore]:
    store = RedisStore.from_url(server.url, "bc-layout", history_limit=2)
    yield store
    store.close()


def test_the_keys_of_an_entry_share_one_hash_slot() -> None:
    for prefix in ("beat-claims", "app{1}", "p"):
        store = RedisStore(redis.Redis(), prefix)
        buckets = set()
        for name in [*ODD_NAMES, *(f"entry-{i}" for i in range(200))]:
            keys = store.entry_keys(name)
            assert len(keys) == 11 and len(set(keys)) == 11
            assert len({key_slot(k.encode()) for k in keys}) == 1, (prefix, name, keys)
            buckets.add(keys[-1])
        assert len(buckets) == BUCKETS  # the entries are spread over every bucket


# -- what the scripts touch ---------------------------------------------------------------
_LINE = re.compile(rb"^[\d.]+ \[\d+ ([^\]]+)\] (.*)$")
_ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"')


def _args(rest: bytes) -> list[bytes]:
    return [codecs.escape_decode(a)[0] for a in _ARG.findall(rest)]  # type: ignore[misc]


class Monitor:
    """The commands the server runs, as MONITOR reports them, until ``stop``."""

    MARK = b"contract-monitor-stop"

    def __init__(self, server: RedisServer) -> None:
        self.client = redis.Redis(port=server.port)
        self.lines: list[bytes] = []
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        with self.client.monitor() as m:
            self.ready.set()
            while True:
                line = m.connection.read_response()
                assert isinstance(line, bytes)
                if self.MARK in line:
                    return
                self.lines.append(line)

    def __enter__(self) -> Monitor:
        self.thread.start()
        assert self.ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.echo(self.MARK)
        self.thread.join(10)
        assert not self.thread.is_alive()

    def scripts(self) -> list[tuple[str, list[str], list[list[bytes]]]]:
        """Each script run: its sha or function name, its declared keys, and the commands it
        ran."""
        runs: list[tuple[str, list[str], list[list[bytes]]]] = []
        current: list[list[bytes]] | None = None
        for line in self.lines:
            match = _LINE.match(line)
            assert match, line
            who, args = match.group(1), _args(match.group(2))
            if who == b"lua":
                assert current is not None, f"a script command outside a script: {line!r}"
                current.append(args)
            elif args and args[0].upper() in (b"EVALSHA", b"EVAL", b"FCALL"):
                n = int(args[2])
                current = []
                runs.append((args[1].decode(), [k.decode() for k in args[3:3 + n]], current))
            else:
                current = None
        return runs


def script_names() -> dict[str, str]:
    """Each script's name, by what a call of it names (its function, or its sha)."""
    return {**{_sha(name): name for name in SCRIPTS},
            **{function_name(name): name for name in SCRIPTS}}


def exercise(store: RedisStore) -> None:
    """Every store method, through the paths that touch the most keys."""
    store.heartbeat(A, 10)
    store.heartbeat(B, 10, resync=True)
    known = (Run("known", 5, RunState.SENT, token=1, sent_at=5),)
    register(store, *ODD_NAMES)
    store.register([EntrySeed("known", checkpoint=10, token=1, runs=known)])
    for name in ODD_NAMES:
        c1, c2, c3, c4 = claims(store, A, 1000, 2000, 3000, 4000, entry=name)
        send(store, A, c1)
        started(store, c1, process(1), task_id=f"task-{name}")
        store.start(delivery(c1, process(2)))
        store.start(delivery(c1, process(2), takeover=process(1)))
        store.finish([Outcome(name, c1.due, c1.token, RunState.DONE)])
        sending(store, A, c2)
        store.check(A, [Check(c3, "t", overlap=Overlap.SKIP)])
        store.reclaim([Reclaim(name, c2.due, c2.token)], B.id)
        store.release(A, [Release(c4, "boom", "OSError")], max_attempts=1)
        [again] = take(store, B, entry=name)
        send(store, B, again)
        lost_at = after(store, run(store, again).sent_at or 0)
        store.finish([Outcome(name, again.due, again.token, RunState.LOST, Reason.RUN_TIMEOUT,
                              inactive_since=lost_at)])
        store.start(delivery(again, process(3)))  # revived
        store.requeue(delivery(again, process(3)))  # handed back (a Reject, a replace)
        # One created (after the runs trimmed so far), one kept.
        store.backfill(name, [c4.due + 500, again.due], "operator:alice")
        store.request_run(name, "operator:alice", f"request-{name}")
        store.pause(name, "operator:alice", "a note")
        with pytest.raises(BackfillRefused):  # more than the history can hold
            store.backfill(name, [c3.due - 500 - k for k in range(store.history_limit + 1)],
                           "operator:alice")
        store.check(B, [Check(again, "t", overlap=Overlap.BUFFER_ONE)])
        store.resume(name, "operator:alice")
        state = register(store, name)[name]
        claim(store, C, state, state.anchor + 9000,
              skip=((state.anchor + 8000, Reason.CATCH_UP),))  # trims the history
        store.claim(A, [ClaimPlan(name, state, (state.anchor + 10_000,))])  # a conflict
        store.record_sent(B, [again])
        # The heartbeat asks whether the store still holds a beat's newest writes (kept).
        store.heartbeat(A, 10, written=[Written(name, c3.due, c3.token),
                                        Written(name, again.due, again.token, Wrote.CHECK),
                                        Written(name, again.due, again.token, Wrote.SENT)])
        store.history(name)
        store.lookup_task(f"task-{name}")
    store.claim(A, [ClaimPlan("never-registered", None)])
    # The due index: claimed with the next instant, read, indexed again, swept.
    indexed = store.due(now(store) + 1, 100)
    store.index([IndexWrite(d.name, d.state, d.version, 1) for d in indexed[:3] if d.state])
    store.unindexed(10)
    store.live_runs(query(C, live=(A,), held_before=now(store) + 1, dead_before=now(store)))
    store.open_runs(before=now(store) + 1)
    store.entries()
    store.owners()
    register(store, "removed")
    store.register([EntrySeed(name) for name in ODD_NAMES], A)  # A is their registrant
    store.unregister(A, ODD_NAMES[1:])
    # Definitions: created, changed with skips, deleted, read, followed, pruned.
    cursor = store.changes(None).cursor
    store.write_definitions([DefinitionWrite(name, '{"task": "t"}', 0, Origin.API, "ops",
                                             f"create-{i}") for i, name in enumerate(ODD_NAMES)])
    for i, name in enumerate(ODD_NAMES):
        [entry_state] = store.entries([name])
        cp = entry_state.checkpoint or 0
        store.write_definitions([
            DefinitionWrite(name, '{"task": "u"}', 1, Origin.CONFIG, "beat", f"change-{i}",
                            ((cp + 100, Reason.CHANGED), (cp + 200, Reason.DISABLED)),
                            cp + 300, cp)])
        store.write_definitions([DefinitionWrite(name, None, 2, Origin.API, "ops")])
    store.tombstones_kept_ms = 0  # the next writes drop the tombstones from the feed
    store.write_definitions([DefinitionWrite(name, '{"task": "v"}', 3, Origin.API, "ops")
                             for name in ODD_NAMES])  # (MISSING: tombstones)
    store.definitions(ODD_NAMES)
    store.definitions(after="a", limit=3)
    store.changes(cursor, limit=2)
    store.forget(["removed", ODD_NAMES[0]])
    store.leave(A)
    store.worker_heartbeat(process(1), 10)
    store.worker_liveness([process(1), process(2)])


def test_every_key_a_script_touches_is_declared_and_in_one_hash_slot(
        redis_store: RedisStore, server: RedisServer) -> None:
    """As on a cluster: there the sweeps read one bucket per call (on one server, one call
    reads every bucket: see the next test)."""
    redis_store.single_node = False
    with Monitor(server) as monitor:
        exercise(redis_store)
    runs = monitor.scripts()
    names = script_names()
    assert {names.get(sha, sha) for sha, _, _ in runs} == set(SCRIPTS)  # every script ran
    client = server.client()
    checked = 0
    for sha, declared, commands in runs:
        assert len({key_slot(k.encode()) for k in declared}) <= 1, (names[sha], declared)
        for command in commands:
            try:
                touched = client.command_getkeys(*command)
            except redis.ResponseError:
                continue  # a command without keys (TIME, INFO)
            undeclared = set(touched) - set(declared)
            assert not undeclared, (names[sha], command, declared)
            checked += 1
    assert checked > 100


def test_on_one_server_a_sweep_reads_every_bucket_in_one_call(
        redis_store: RedisStore, server: RedisServer) -> None:
    """What keeps an idle beat cheap, whatever the number of entries: one script call for
    the runs that need a beat, one for the open runs."""
    assert redis_store.single_node
    with Monitor(server) as monitor:
        redis_store.live_runs(LiveQuery("o", frozenset(), 0, 0, 0))
        redis_store.open_runs(before=1)
    names = script_names()
    assert sorted(names[sha] for sha, _, _ in monitor.scripts()) == ["live", "open"]


# -- names --------------------------------------------------------------------------------
#: Every named value the scripts compare with or answer with.
NAMED: list[type[Enum]] = [RunState, Reason, Overlap, CatchUp, StartVerdict, ClaimStatus,
                           CheckVerdict, WriteStatus, Origin]
_TOKEN = re.compile(r"""--[^\n]*|'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*\"""")


def _lua_strings() -> dict[str, set[str]]:
    """The string literals of each Lua file, comments left out."""
    out = {}
    for path in resources.files("beat_claims.stores").joinpath("lua").iterdir():
        if path.name.endswith(".lua"):
            text = path.read_text()
            out[path.name] = {t[1:-1] for t in _TOKEN.findall(text) if not t.startswith("--")}
    return out


def test_no_named_value_is_written_in_the_lua_scripts() -> None:
    values = {str(m.value) for enum in NAMED for m in enum}
    # A record's field names are not named values, even where they read the same ("due").
    fields = {f.name for f in dataclasses.fields(Run)}
    for name, strings in _lua_strings().items():
        written = (strings & values) - fields
        assert not written, f"{name} spells {sorted(written)}: use the generated tables"


def test_the_lua_names_are_generated_from_the_enums(server: RedisServer) -> None:
    script = _lua_names() + """
return cjson.encode({STATE = STATE, FINAL = FINAL, HELD = HELD, OPEN = OPEN, REASON = REASON,
  OVERLAP = OVERLAP, CLAIM = CLAIM, CHECK = CHECK, START = START, WRITE = WRITE})"""
    tables: dict[str, Any] = json.loads(server.client().eval(script, 0))

    def named(enum: type[Enum]) -> dict[str, str]:
        return {str(m.value): str(m.value) for m in enum}

    assert tables["STATE"] == named(RunState)
    assert tables["REASON"] == named(Reason)
    assert tables["OVERLAP"] == named(Overlap)
    assert tables["CLAIM"] == named(ClaimStatus)
    assert tables["CHECK"] == named(CheckVerdict)
    assert tables["START"] == named(StartVerdict)
    assert tables["WRITE"] == named(WriteStatus)
    assert set(tables["FINAL"]) == {s.value for s in FINAL_STATES}
    assert set(tables["HELD"]) == {s.value for s in RunState if s.held}
    assert set(tables["OPEN"]) == {s.value for s in RunState if s.open}
