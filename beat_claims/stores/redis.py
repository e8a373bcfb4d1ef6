"""The Redis store: each transition is one Lua script, atomic on the server.

All keys of one entry share a hash tag (``{prefix}:{<digest>}:...``), so every script touches
a single slot and runs on Redis Cluster too. Records are JSON, never pickle. Owner
liveness and the task-id index live outside the entries' slots; they are only ever read as
hints, and every decision taken from them is re-checked by a token compare-and-set.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.client import Pipeline
from redis.exceptions import NoScriptError
from redis.retry import Retry
from redis.sentinel import Sentinel

from ..runs import Owner, Run
from .base import (
    Claim,
    ClaimRequest,
    ClaimResult,
    EntryState,
    StartDecision,
    Store,
)

#: Beats that anchor new entries within this many ms of each other share the instant.
ANCHOR_SHARED_MS = 2000
#: How long the task-id index keeps a started run (a week, like runs presumed lost).
TASK_INDEX_TTL_MS = 7 * 24 * 3600 * 1000

SCRIPTS = ("anchor", "claim", "send", "sent", "release", "reclaim", "start", "finish", "lost",
           "skip", "request", "free", "drop_seen", "anchor_instant")


@cache
def _source(name: str) -> str:
    lua = resources.files(__package__).joinpath("lua")
    return lua.joinpath("_prelude.lua").read_text() + "\n" + lua.joinpath(f"{name}.lua").read_text()


def connect(url: str, socket_timeout: float = 5.0,
            sentinel_master: str | None = None) -> redis.Redis:
    """A client for ``url``: ``redis://``, ``rediss://``, ``unix://`` (ACL user and password
    in the URL), or ``sentinel://host:port;sentinel://host2:port/db`` (as Celery's broker
    URLs), which follows the master named ``sentinel_master`` across failovers.

    Retries are left to beat-claims' own loop: a script that timed out may have run, and
    the caller reconciles instead of blindly running it twice.
    """
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_timeout,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 30,
    }
    if not url.startswith("sentinel://"):
        return redis.Redis.from_url(url, **options)
    nodes, db, username, password = _parse_sentinel(url)
    sentinel = Sentinel(nodes, sentinel_kwargs={"socket_timeout": socket_timeout},
                        socket_timeout=socket_timeout)
    return sentinel.master_for(sentinel_master or "", db=db, username=username,
                               password=password, **options)


def _parse_sentinel(url: str) -> tuple[list[tuple[str, int]], int, str | None, str | None]:
    """``sentinel://[user:password@]host:port[;sentinel://host:port...][/db]``."""
    nodes: list[tuple[str, int]] = []
    db, username, password = 0, None, None
    for part in url.split(";"):
        parsed = urlsplit(part.strip())
        if parsed.hostname:
            nodes.append((parsed.hostname, parsed.port or 26379))
        username = username or parsed.username or None
        password = password or parsed.password or None
        if parsed.path.strip("/"):
            db = int(parsed.path.strip("/"))
    return nodes, db, username, password


class RedisStore(Store):
    def __init__(self, client: redis.Redis, prefix: str = "beat-claims") -> None:
        self.client = client
        self.prefix = prefix
        self._scripts = {name: client.register_script(_source(name)) for name in SCRIPTS}
        self._shas = {name: hashlib.sha1(_source(name).encode()).hexdigest() for name in SCRIPTS}
        self._local = threading.local()

    @classmethod
    def from_url(cls, url: str, prefix: str = "beat-claims", socket_timeout: float = 5.0,
                 sentinel_master: str | None = None) -> RedisStore:
        return cls(connect(url, socket_timeout, sentinel_master), prefix)

    # -- keys -------------------------------------------------------------------------
    def _tag(self, entry: str) -> str:
        digest = hashlib.blake2b(entry.encode(), digest_size=10).hexdigest()
        return f"{self.prefix}:{{{digest}}}"

    def _keys(self, entry: str, *names: str) -> list[str]:
        tag = self._tag(entry)
        return [f"{tag}:{name}" for name in names]

    def _global(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def _run(self, name: str, keys: list[str], args: list[Any], client: Any = None) -> Any:
        if isinstance(client, Pipeline):
            # EVALSHA directly: redis-py would otherwise ask SCRIPT EXISTS on every execute.
            return client.evalsha(self._shas[name], len(keys), *keys, *args)
        return self._scripts[name](keys=keys, args=args, client=client or self.client)

    def _batch(self, build: Callable[[Pipeline], None]) -> list[Any]:
        """One round trip. If the server lost our scripts (restart, SCRIPT FLUSH), none of
        them ran: load them and send the batch again."""
        for attempt in (1, 2):
            pipe = self._pipeline()
            try:
                build(pipe)
                return list(pipe.execute())
            except NoScriptError:
                if attempt == 2:
                    raise
                for name in SCRIPTS:
                    self.client.script_load(_source(name))
            finally:
                pipe.reset()  # an error while building must not leave commands queued
        raise AssertionError("unreachable")

    def _pipeline(self) -> Pipeline:
        """This thread's pipeline, reused: building one costs more than the round trip it
        saves (redis-py copies its response callbacks into every new client object)."""
        pipe: Pipeline | None = getattr(self._local, "pipe", None)
        if pipe is None:
            pipe = self._local.pipe = self.client.pipeline(transaction=False)
        elif len(pipe):
            # Left from a call that failed before sending (redis-py does not reset a
            # pipeline whose connection could not be made): never send those.
            pipe.reset()
        return pipe

    def _notice(self, pipe: Pipeline, entries: Iterable[str]) -> None:
        """Tell other beats, in the same round trip as the release, where to look."""
        names = list(entries)
        for name in names:
            pipe.hincrby(self._global("released-in"), name, 1)
        if names:
            pipe.incr(self._global("released"))

    # -- clock ------------------------------------------------------------------------
    def now_ms(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    # -- beat side --------------------------------------------------------------------
    def ensure_entries(self, entries: Sequence[tuple[str, str]]) -> dict[str, EntryState]:
        now = str(self._run("anchor_instant", [self._global("anchoring")], [ANCHOR_SHARED_MS]))

        def build(pipe: Pipeline) -> None:
            for name, description in entries:
                self._run("anchor", self._keys(name, "entry"), [name, description, now], pipe)
                pipe.hset(self._global("entries"), self._tag(name), name)

        replies = self._batch(build)[::2]
        return {
            name: EntryState(int(anchor), int(checkpoint) if checkpoint else None)
            for (name, _), (anchor, checkpoint) in zip(entries, replies)
        }

    def claim(self, owner: Owner, requests: Sequence[ClaimRequest],
              history_limit: int, now_ms: int) -> list[ClaimResult]:
        calls = []
        for req in requests:
            args: list[Any] = [owner.id]
            if req.expected is None:
                args += ["", "*"]
            else:
                cp = req.expected.checkpoint
                args += [str(req.expected.anchor), "" if cp is None else str(cp)]
            plan = [(due, "claim") for due in req.claim] + list(req.skip)
            plan.sort()
            args += [history_limit, req.overlap, len(plan)]
            for due, action in plan:
                args += [str(due), action]
            calls.append((self._keys(req.entry, "entry", "runs", "history", "live", "open"),
                          args))

        def build(pipe: Pipeline) -> None:
            # The owner's note of where it may hold claims is written before the claims, in
            # the same round trip, so a reclaimer always finds the claims of a dead owner.
            pipe.zadd(self._global("owner", owner.id, "entries"),
                      {req.entry: now_ms for req in requests}, nx=True)
            for keys, args in calls:
                self._run("claim", keys, args, pipe)

        results = []
        for req, reply in zip(requests, self._batch(build)[1:]):
            result = ClaimResult(req.entry)
            if reply[0] == "conflict":
                anchor, checkpoint = reply[1], reply[2]
                if not anchor:
                    result.missing = True
                else:
                    cp = int(checkpoint) if checkpoint else None
                    result.conflict = EntryState(int(anchor), cp)
            else:
                claimed, skipped, taken = reply[1], reply[2], reply[3]
                result.claims = [Claim(req.entry, int(claimed[i]), int(claimed[i + 1]))
                                 for i in range(0, len(claimed), 2)]
                result.claims += [Claim(req.entry, int(taken[i]), int(taken[i + 1]))
                                  for i in range(0, len(taken), 2)]
                result.skipped = [(int(skipped[i]), skipped[i + 1])
                                  for i in range(0, len(skipped), 2)]
            results.append(result)
        return results

    def check_many(self, owner: Owner, items: Sequence[tuple[Claim, str]],
                   sent: Sequence[Claim] = ()) -> list[tuple[bool, str]]:
        def build(pipe: Pipeline) -> None:
            for done in sent:
                self._mark_sent(done, pipe)
            for claim, task_id in items:
                self._run("send", self._keys(claim.entry, "runs"),
                          [str(claim.due), str(claim.token), owner.id, task_id], pipe)
            if items:  # where runs may be open from now on: the sweeps look only there
                pipe.hset(self._global("open-in"), mapping={
                    claim.entry: f"{owner.id}:{claim.token}" for claim, _ in items})

        replies = self._batch(build)[len(sent):len(sent) + len(items)]
        return [(bool(int(r[0])), (r[1] if len(r) > 1 else "")) for r in replies]

    def _mark_sent(self, claim: Claim, client: Any = None) -> Any:
        return self._run("sent", self._keys(claim.entry, "runs", "live", "open"),
                         [str(claim.due), str(claim.token)], client)

    def skip(self, owner: Owner, claim: Claim, reason: str) -> bool:
        return bool(self._run("skip", self._keys(claim.entry, "runs", "live"),
                              [str(claim.due), str(claim.token), owner.id, reason]))

    def mark_sent(self, claim: Claim) -> bool:
        return bool(self._mark_sent(claim))

    def mark_all_sent(self, claims: Sequence[Claim], owner: Owner | None = None,
                      done_in: Iterable[str] = ()) -> int:
        names = list(done_in)

        def build(pipe: Pipeline) -> None:
            for claim in claims:
                self._mark_sent(claim, pipe)
            if owner is not None and names:
                pipe.zrem(self._global("owner", owner.id, "entries"), *names)

        if not claims and not names:
            return 0
        return sum(int(r) for r in self._batch(build)[:len(claims)])

    def release(self, owner: Owner, entries: Iterable[str], unsent: Iterable[tuple[str, int]] = ()
                ) -> int:
        entries, unsent = list(entries), list(unsent)
        if not entries and not unsent:
            return 0

        def build(pipe: Pipeline) -> None:
            for entry in entries:
                self._run("release", self._keys(entry, "runs", "live"), [owner.id, ""], pipe)
            for entry, due in unsent:
                self._run("release", self._keys(entry, "runs", "live"), [owner.id, str(due)],
                          pipe)
            self._notice(pipe, dict.fromkeys(entries + [entry for entry, _ in unsent]))

        return sum(int(r) for r in self._batch(build)[:len(entries) + len(unsent)])

    def released_in(self) -> dict[str, int]:
        return {name: int(count)
                for name, count in self.client.hgetall(self._global("released-in")).items()}

    def picked_up(self, seen: dict[str, int]) -> None:
        self._drop_seen("released-in", seen)

    def open_in(self) -> dict[str, str]:
        return dict(self.client.hgetall(self._global("open-in")))

    def note_open(self, entries: Sequence[str]) -> None:
        if entries:
            stamp = f"found:{time.time_ns()}"
            self.client.hset(self._global("open-in"), mapping=dict.fromkeys(entries, stamp))

    def settled(self, seen: dict[str, str]) -> None:
        self._drop_seen("open-in", seen)

    def _drop_seen(self, notices: str, seen: dict[str, int] | dict[str, str]) -> None:
        if seen:
            args = [part for name, count in seen.items() for part in (name, str(count))]
            self._run("drop_seen", [self._global(notices)], args)

    def heartbeat(self, owner: Owner, ttl: float) -> tuple[int, int]:
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self._global("owner", owner.id), "1", px=int(ttl * 1000))
        pipe.hset(self._global("owners"), owner.id, json.dumps(owner.as_dict()))
        pipe.get(self._global("released"))
        pipe.time()
        _, _, generation, (seconds, micros) = pipe.execute()
        return int(generation or 0), int(seconds) * 1000 + int(micros) // 1000

    def forget_owner(self, owner: Owner) -> None:
        self.client.delete(self._global("owner", owner.id))
        if not self.client.zcard(self._global("owner", owner.id, "entries")):
            self.client.hdel(self._global("owners"), owner.id)

    def done_claiming(self, owner: Owner, entries: Iterable[str]) -> None:
        names = list(entries)
        if names:
            self.client.zrem(self._global("owner", owner.id, "entries"), *names)

    def owners(self) -> list[tuple[Owner, bool, dict[str, int]]]:
        return self.sweep_view(())[0]

    def sweep_view(self, known: Sequence[str]
                   ) -> tuple[list[tuple[Owner, bool, dict[str, int]]], dict[str, str]]:
        """Owners and open-runs index in one round trip when the owners are the ones seen
        last time (``known``); a second one only to read the liveness and notes of owners
        registered since."""
        def read(pipe: Pipeline) -> None:
            pipe.hgetall(self._global("owners"))
            pipe.hgetall(self._global("open-in"))
            for owner_id in known:
                pipe.exists(self._global("owner", owner_id))
                pipe.zrange(self._global("owner", owner_id, "entries"), 0, -1, withscores=True)

        replies = self._batch(read)
        registered, open_in = replies[0], dict(replies[1])
        state = {owner_id: (replies[2 + 2 * i], replies[3 + 2 * i])
                 for i, owner_id in enumerate(known)}
        parsed: list[Owner] = []
        for raw in registered.values():
            try:
                parsed.append(Owner.from_dict(json.loads(raw)))
            except (ValueError, KeyError, TypeError):
                continue
        new = [owner for owner in parsed if owner.id not in state]
        if new:
            def read_new(pipe: Pipeline) -> None:
                for owner in new:
                    pipe.exists(self._global("owner", owner.id))
                    pipe.zrange(self._global("owner", owner.id, "entries"), 0, -1,
                                withscores=True)

            more = self._batch(read_new)
            state.update({owner.id: (more[2 * i], more[2 * i + 1])
                          for i, owner in enumerate(new)})
        out = []
        for owner in parsed:
            alive, entries = state[owner.id]
            out.append((owner, bool(alive), {name: int(score) for name, score in entries}))
        return out, open_in

    def reclaim(self, entries: Sequence[str], old_owner: str, new_owner: Owner,
                cutoff_ms: int | None) -> list[Claim]:
        names = list(entries)
        if not names:
            return []
        cutoff = "" if cutoff_ms is None else str(cutoff_ms)

        def build(pipe: Pipeline) -> None:
            pipe.zadd(self._global("owner", new_owner.id, "entries"),
                      dict.fromkeys(names, self.now_ms()), nx=True)
            for name in names:
                self._run("reclaim", self._keys(name, "entry", "runs", "live"),
                          [old_owner, new_owner.id, cutoff], pipe)
            if cutoff_ms is None and old_owner != new_owner.id:
                # Only the entries processed here leave the dead owner's note (and never the
                # note of this owner, which now holds them).
                pipe.zrem(self._global("owner", old_owner, "entries"), *names)

        replies = self._batch(build)[1:len(names) + 1]
        return [Claim(name, int(reply[i]), int(reply[i + 1]), reclaimed=True,
                      maybe_sent=bool(int(reply[i + 2])))
                for name, reply in zip(names, replies) for i in range(0, len(reply), 3)]

    def drop_owner(self, owner_id: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self._global("owner", owner_id, "entries"))
        pipe.exists(self._global("owner", owner_id))
        noted, alive = pipe.execute()
        if not noted and not alive:
            self.client.hdel(self._global("owners"), owner_id)

    def mark_lost(self, cutoffs: dict[str, int]) -> dict[str, list[int]]:
        if not cutoffs:
            return {}
        def build(pipe: Pipeline) -> None:
            for entry, cutoff in cutoffs.items():
                self._run("lost", self._keys(entry, "runs", "open"), [str(cutoff)], pipe)

        return {entry: [int(d) for d in reply]
                for entry, reply in zip(cutoffs, self._batch(build)) if reply}

    # -- worker side ------------------------------------------------------------------
    def start(self, entry: str, due: int, token: int, worker: str, pid: int, retries: int,
              takeover: tuple[str, int] | None = None, created: float = 0.0,
              task_id: str = "") -> StartDecision:
        def build(pipe: Pipeline) -> None:
            self._run("start", self._keys(entry, "runs", "live", "open", "entry"), [
                str(due), str(token), worker, str(pid), str(retries),
                f"{takeover[0]}|{takeover[1]}" if takeover else "", repr(created),
            ], pipe)
            if task_id:  # for signals that carry only the task id (main-process failures)
                pipe.set(self._global("task", task_id),
                         json.dumps({"entry": entry, "due": due, "token": token}),
                         px=TASK_INDEX_TTL_MS)

        reply = self._batch(build)[0]
        if reply[0] == "ok":
            return StartDecision(True, reply[1] if len(reply) > 1 else "")
        if reply[0] == "busy":
            return StartDecision(False, "busy", (reply[1], int(reply[2]), float(reply[3])))
        return StartDecision(False, reply[1])

    def finish(self, entry: str, due: int, token: int | None, state: str,
               exc_type: str = "", exc_message: str = "", worker: str = "") -> bool:
        return bool(self._run("finish", self._keys(entry, "runs", "live", "open"), [
            str(due), "" if token is None else str(token), state, exc_type, exc_message, worker,
        ]))

    def lookup_task(self, task_id: str) -> tuple[str, int, int] | None:
        raw = self.client.get(self._global("task", task_id))
        if not raw:
            return None
        try:
            data = json.loads(raw)
            return str(data["entry"]), int(data["due"]), int(data["token"])
        except (ValueError, KeyError, TypeError):
            return None

    # -- operators --------------------------------------------------------------------
    def request_run(self, entry: str, requested_by: str) -> int | None:
        def build(pipe: Pipeline) -> None:
            self._run("request", self._keys(entry, "entry", "runs", "history", "live"),
                      [requested_by], pipe)
            self._notice(pipe, [entry])

        due = self._batch(build)[0]
        return int(due) if due else None

    def free_claim(self, entry: str, due: int, released_by: str) -> bool:
        def build(pipe: Pipeline) -> None:
            self._run("free", self._keys(entry, "runs"), [str(due), released_by], pipe)
            self._notice(pipe, [entry])

        return bool(self._batch(build)[0])

    # -- inspection -------------------------------------------------------------------
    def entry_names(self) -> list[str]:
        return sorted(self.client.hvals(self._global("entries")))

    def entry_info(self, entry: str) -> dict[str, Any]:
        data = self.client.hgetall(self._keys(entry, "entry")[0])
        return {
            "anchor": int(data["anchor"]) if data.get("anchor") else None,
            "checkpoint": int(data["checkpoint"]) if data.get("checkpoint") else None,
            "token": int(data.get("token") or 0),
            "schedule": data.get("schedule"),
        }

    def _runs(self, entry: str, dues: Sequence[str]) -> list[Run]:
        if not dues:
            return []
        return _parse(entry, self.client.hmget(self._keys(entry, "runs")[0], list(dues)))

    def history(self, entry: str, limit: int | None = None) -> list[Run]:
        end = -1 if limit is None else limit - 1
        dues = self.client.zrevrange(self._keys(entry, "history")[0], 0, end)
        return self._runs(entry, dues)

    def open_runs(self, entries: Sequence[str]) -> dict[str, list[Run]]:
        pipe = self.client.pipeline(transaction=False)
        for entry in entries:
            live, open_ = self._keys(entry, "live", "open")
            pipe.zrange(live, 0, -1)
            pipe.zrange(open_, 0, -1)
        replies = pipe.execute()
        wanted = {entry: sorted(set(replies[2 * i]) | set(replies[2 * i + 1]), key=int)
                  for i, entry in enumerate(entries)}
        wanted = {entry: dues for entry, dues in wanted.items() if dues}
        for entry, dues in wanted.items():
            pipe.hmget(self._keys(entry, "runs")[0], dues)
        return {entry: _parse(entry, raws) for entry, raws in zip(wanted, pipe.execute())}

    def close(self) -> None:
        self.client.close()


def _parse(entry: str, raws: Iterable[str | None]) -> list[Run]:
    out = []
    for raw in raws:
        if not raw:
            continue
        try:
            out.append(Run.from_record(entry, json.loads(raw)))
        except (ValueError, KeyError, TypeError):
            continue  # a corrupt record is shown as missing rather than crashing
    return out


__all__ = ["RedisStore", "connect"]
