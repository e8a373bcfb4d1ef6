"""Redis Cluster only: what the store must get right on three masters (the session's cluster
of ``backend_redis_cluster.py``) beyond the contract suite, which runs there too.

* Entries spread over every master; a batch spanning them is one call that answers each
  item, and every store method works with each bucket on its own slot.
* A master that lost the scripts (restarted, SCRIPT FLUSH) gets them back, and only the
  commands it refused are sent again; nothing is ever sent twice: a reply lost after a
  master ran the command (the connection cut, or a timeout) is an outage for the call.
* The epoch covers every master: restarting one that holds only entry buckets, or a
  failover to its replica, starts a new epoch, and until a heartbeat has read it a
  connection to that master is refused.
* A slot resharded (MOVED), or open while its keys move (ASK, TRYAGAIN), is followed
  within a bounded number of passes; clients of one seed read the command table once.
* Two schedulers ticked in this process across a master's restart send nothing twice.
* ``redis+cluster://`` and ``rediss+cluster://`` URLs, through ``open_store``.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from redis.crc import key_slot

from beat_claims.beat.clock import StoreClock
from beat_claims.beat.liveness import Liveness, StoreWentBack
from beat_claims.enums import Origin, RunState
from beat_claims.settings import Settings
from beat_claims.stores import open_store
from beat_claims.stores.base import (
    Check,
    Claim,
    ClaimPlan,
    ClaimStatus,
    DefinitionWrite,
    EntryState,
    IndexWrite,
    Outcome,
    Reclaim,
    Release,
    StoreConfigurationError,
    StoreError,
    Written,
    Wrote,
)
from beat_claims.stores.redis import BUCKETS, SCRIPTS, RedisStore, _sha, function_name, library_name
from beat_claims.stores.redis_client import (
    ClusterClient,
    RedisOptions,
    connect,
    parse_cluster_url,
)

from ..conftest import RedisServer, free_port
from ..faults import Proxy, proxy
from ..inprocess import make, make_app, occurrences_sent, run_for
from ..processes import wait_for
from .backend import counting
from .backend_redis_cluster import BACKEND as CLUSTER
from .backend_redis_cluster import ClusterServers, NodeServer, bucket_masters, cluster, other_master
from .helpers import (
    A,
    B,
    a_claim_whose_reply_is_lost_wrote_its_next_due_once,
    above_clock,
    claim,
    delivery,
    now,
    one_claim,
    plan,
    process,
    query,
    register,
    run,
    send,
)
from .test_redis_layout import exercise


@pytest.fixture(scope="session")
def redis_cluster(request: pytest.FixtureRequest) -> ClusterServers:
    return cluster(request)


@pytest.fixture
def cluster_servers(redis_cluster: ClusterServers) -> Iterator[ClusterServers]:
    """The session's cluster, every master up and empty at the start of the test."""
    redis_cluster.ensure_running()
    redis_cluster.flushall()
    yield redis_cluster
    redis_cluster.ensure_running()
    redis_cluster.repair()  # (a slot a failed test left open or moved)


def new_store(c: ClusterServers, options: RedisOptions | None = None,
              prefix: str | None = None) -> RedisStore:
    return RedisStore.from_url(c.url, prefix or f"bc-cluster-{uuid.uuid4().hex[:8]}",
                               options=options)


@pytest.fixture
def store(cluster_servers: ClusterServers) -> Iterator[RedisStore]:
    s = new_store(cluster_servers)
    yield s
    s.close()


def master_of(store: RedisStore, c: ClusterServers) -> dict[str, int]:
    """A map: entry name -> the port of the master of its bucket (as the cluster says now)."""
    masters = bucket_masters(store, c)

    class Where(dict[str, int]):
        def __missing__(self, name: str) -> int:
            return masters[int(store._tag(name)[0][-3:-1])].port

    return Where()


def names_on(store: RedisStore, c: ClusterServers, node: NodeServer, count: int = 1,
             prefix: str = "e") -> list[str]:
    """Entry names whose bucket is on ``node``."""
    where = master_of(store, c)
    out = [name for name in (f"{prefix}{i}" for i in range(1000))
           if where[name] == node.port][:count]
    assert len(out) == count, f"not {count} entry names with their bucket on {node.name}"
    return out


def names_off(store: RedisStore, c: ClusterServers, node: NodeServer, count: int = 1,
              prefix: str = "x") -> list[str]:
    """Entry names whose bucket is on another master than ``node``."""
    where = master_of(store, c)
    return [name for name in (f"{prefix}{i}" for i in range(1000))
            if where[name] != node.port][:count]


def bucket_calls(store: RedisStore, names: list[str], where: dict[str, int],
                 node: NodeServer) -> int:
    """The script calls that claim ``names`` (fewer than a batch a bucket) make on
    ``node``: one for each of its buckets they are in (its keys share one slot)."""
    return len({store.index_key(n) for n in names if where[n] == node.port})


def script_calls(node: NodeServer) -> tuple[int, int]:
    """Script calls (FCALL or EVALSHA) that ran, and those that failed (the library or the
    scripts missing), on ``node`` so far."""
    info = node.client().info("commandstats")
    calls = failed = 0
    for command in ("cmdstat_fcall", "cmdstat_evalsha"):
        stats = info.get(command, {})
        calls += int(stats.get("calls", 0))
        failed += int(stats.get("failed_calls", 0))
    return calls - failed, failed


def loads(node: NodeServer, command: str) -> int:
    """How many times ``node`` was sent ``command`` (``script|load``, ``function|load``)."""
    return int(node.client().info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def has_library(node: NodeServer) -> bool:
    return bool(node.client().function_list(library=library_name()))


def answers(store: RedisStore) -> bool:
    try:
        store.heartbeat(B, 10)
    except StoreError:
        return False
    return True


# -- spread, and every method on the cluster ----------------------------------------------
def test_entries_spread_over_every_master_and_one_call_answers_every_item(
        store: RedisStore, cluster_servers: ClusterServers) -> None:
    names = [f"entry-{i}" for i in range(200)]
    states = register(store, *names)
    where = master_of(store, cluster_servers)
    spread = Counter(where[n] for n in names)
    assert set(spread) == {n.port for n in cluster_servers.nodes}, spread
    assert len({p for p in (bucket_masters(store, cluster_servers)[b].port
                            for b in range(16))}) == 3
    results = store.claim(A, [plan(s, s.anchor + 1000, entry=n) for n, s in states.items()])
    assert [r.status for r in results] == [ClaimStatus.OK] * len(names)
    # The sweep reads every bucket, on every master.
    found = store.live_runs(query(A, live=(A,), mine_before=now(store) + 1))
    assert {(h.entry, h.due) for h in found.held} == {
        (n, states[n].anchor + 1000) for n in names}
    assert found.complete
    assert {r.name for r in store.entries()} == set(names)
    for node in cluster_servers.nodes:
        assert node.client().dbsize() > 0


def test_every_store_method_works_on_the_cluster(store: RedisStore) -> None:
    exercise(store)  # (the layout test's tour of every method, here on three masters)
    assert {r.name for r in store.entries()} >= {"e", "known", "weird{name}"}


# -- the library (or the scripts) a master lost ---------------------------------------------
@pytest.mark.parametrize("calls_by", ["functions", "scripts"])
def test_a_master_that_lost_the_scripts_gets_them_and_only_its_commands_go_again(
        store: RedisStore, cluster_servers: ClusterServers, calls_by: str) -> None:
    """With functions (Redis 7), the library; by EVALSHA (a server that takes no functions:
    see test_redis_specific.py for how the store finds out), the scripts."""
    if calls_by == "scripts":
        store._functions = False
    names = [f"e{i}" for i in range(60)]
    states = register(store, *names)
    flushed = other_master(store, cluster_servers)
    load = "function|load" if calls_by == "functions" else "script|load"
    if calls_by == "functions":
        flushed.client().function_flush()
    else:
        flushed.client().script_flush()
    calls = {n.port: script_calls(n) for n in cluster_servers.nodes}
    before = {n.port: loads(n, load) for n in cluster_servers.nodes}
    results = store.claim(A, [plan(s, s.anchor + 1000, entry=n) for n, s in states.items()])
    assert [r.status for r in results] == [ClaimStatus.OK] * len(names)
    where = master_of(store, cluster_servers)
    assert any(where[n] == flushed.port for n in names)
    for node in cluster_servers.nodes:
        ran, failed = (now_ - then for now_, then in zip(script_calls(node),
                                                          calls[node.port]))
        mine = bucket_calls(store, names, where, node)
        assert ran == mine, (node.name, ran, mine)  # each bucket's claims ran once
        if node.port == flushed.port:
            assert failed == mine  # refused (not found) once each, then sent again
            assert loads(node, load) - before[node.port] == (
                1 if calls_by == "functions" else len(SCRIPTS))
        else:
            assert failed == 0
            assert loads(node, load) == before[node.port]
    if calls_by == "functions":
        assert has_library(flushed)
    else:
        assert flushed.client().script_exists(*(_sha(n) for n in SCRIPTS)) == [True] * len(
            SCRIPTS)


# -- nothing sent twice -------------------------------------------------------------------
@pytest.fixture
def lossy(cluster_servers: ClusterServers) -> Iterator[tuple[Proxy, NodeServer]]:
    """A TCP proxy in front of one master (one holding buckets, not the global keys)."""
    probe = new_store(cluster_servers, prefix="bc-cluster-probe")
    node = other_master(probe, cluster_servers)
    probe.close()
    with proxy(node.port) as p:
        yield p, node


def through(store: RedisStore, p: Proxy, node: NodeServer) -> RedisStore:
    """``store``'s client reaches ``node`` through the proxy (redis-py's address_remap)."""
    client = store.client
    assert isinstance(client, ClusterClient)
    client.kwargs["address_remap"] = (
        lambda addr: ("127.0.0.1", p.port) if int(addr[1]) == node.port else addr)
    return store


@pytest.mark.parametrize("fault", ["connection cut", "timeout"])
def test_a_reply_lost_after_a_master_ran_the_batch_is_an_outage_and_nothing_runs_twice(
        cluster_servers: ClusterServers, lossy: tuple[Proxy, NodeServer], fault: str) -> None:
    """redis-py's cluster pipeline sends again, one by one, the commands whose connection
    failed or timed out: a claim would run twice. The store's call must fail instead (the
    caller reconciles: the claims are found again), each command having run once."""
    p, node = lossy
    store = through(new_store(cluster_servers, RedisOptions(timeout=0.5, connect_timeout=0.5),
                              prefix="bc-cluster-probe"), p, node)
    try:
        store.heartbeat(A, 10)
        names = [f"e{i}" for i in range(40)]
        states = register(store, *names)
        where = master_of(store, cluster_servers)
        assert 0 < sum(1 for n in names if where[n] == node.port) < len(names)
        floor = above_clock(store)  # (a claim made twice would show as floor + 2)
        calls = {n.port: script_calls(n) for n in cluster_servers.nodes}
        if fault == "connection cut":
            p.drop_reply_to(function_name("claim"))
        else:
            p.delay = 1.5
        with pytest.raises(StoreError):
            store.claim(A, [plan(s, s.anchor + 1000, entry=n, token_floor=floor)
                            for n, s in states.items()])
        p.delay = 0
        for n in cluster_servers.nodes:
            mine = bucket_calls(store, names, where, n)
            assert script_calls(n)[0] - calls[n.port][0] == mine, n.name
        # Every claim was made once, and is found from the records.
        cutoff = now(store) + 1
        held = store.live_runs(query(A, live=(A,), mine_before=cutoff)).held
        assert sorted((h.entry, h.token) for h in held) == sorted((n, floor + 1)
                                                                  for n in names)
    finally:
        store.close()


# -- the due index -----------------------------------------------------------------------
def test_what_falls_due_is_merged_from_every_bucket_on_every_master(
        store: RedisStore, cluster_servers: ClusterServers) -> None:
    """One due index per bucket (its slot: spread over the masters); a page of what falls
    due is every bucket's first, merged in (instant, name) order, one pass over them."""
    names = [f"due-{i:03d}" for i in range(96)]
    states = register(store, *names)
    where = master_of(store, cluster_servers)
    assert {where[n] for n in names} == {n.port for n in cluster_servers.nodes}
    assert len({store._tag(n)[0] for n in names}) == BUCKETS
    instants = {n: 1000 + 1000 * (i % 5) for i, n in enumerate(names)}  # ties: 5 instants
    assert store.index([IndexWrite(n, states[n], 0, t) for n, t in instants.items()]) == [
        True] * len(names)
    expected = sorted((t, n) for n, t in instants.items() if t <= 4000)
    trips = counting(store, "_round_trip")
    page, after, got = 10, None, []
    while True:
        found = store.due(4000, page, after)
        got += [(d.next_due, d.name) for d in found]
        if len(found) < page:
            break
        after = (found[-1].next_due, found[-1].name)
    assert got == expected
    # Each page: the buckets' due indexes in one pass, the entries' states in another.
    assert trips() == 2 * (len(expected) // page + 1)


def test_a_claim_whose_reply_was_lost_wrote_its_next_due_once(
        cluster_servers: ClusterServers, lossy: tuple[Proxy, NodeServer]) -> None:
    """The claim ran on the master and its reply was lost: its next_due was written with its
    checkpoint; the claim asked again conflicts and writes nothing."""
    p, node = lossy
    store = new_store(cluster_servers, prefix="bc-cluster-probe")
    lossy_store = through(new_store(cluster_servers, RedisOptions(timeout=0.5,
                                                                  connect_timeout=0.5),
                                    prefix="bc-cluster-probe"), p, node)
    try:
        [name] = names_on(store, cluster_servers, node, prefix="lost")
        a_claim_whose_reply_is_lost_wrote_its_next_due_once(
            store, lossy_store, p, function_name("claim"), name)
    finally:
        lossy_store.close()
        store.close()


# -- resharding ---------------------------------------------------------------------------
def test_a_bucket_resharded_to_another_master_is_followed_and_nothing_runs_twice(
        store: RedisStore, cluster_servers: ClusterServers) -> None:
    """Its client's slot table is stale: MOVED, the table read again, the commands sent to
    the new master. While the slot is open (its keys moving), a script of that bucket gets
    TRYAGAIN from Redis: the call is an outage, nothing ran; a one-key read follows ASK."""
    store.heartbeat(A, 10)
    source = other_master(store, cluster_servers)
    target = next(n for n in cluster_servers.nodes if n.port != source.port)
    [name] = names_on(store, cluster_servers, source)
    slot = key_slot(store._tag(name)[0].encode())
    state = register(store, name)[name]
    # (the counter above the clock's tokens: the second claim counts on from it, there)
    first = claim(store, A, state, state.anchor + 1000, entry=name,
                  token_floor=above_clock(store))
    send(store, A, first.claims[0])
    try:
        cluster_servers.move_slot(slot, target, finish=False)  # open, its keys on target
        assert [r.due for r in store.history(name)] == [first.claims[0].due]  # ASK
        calls = script_calls(target)[0] + script_calls(source)[0]
        with pytest.raises(StoreError, match=r"TRYAGAIN|redirect"):
            claim(store, A, first.state, state.anchor + 2000, entry=name)
        assert script_calls(target)[0] + script_calls(source)[0] == calls  # none ran
        cluster_servers.finish_move(slot, target, source)
        second = claim(store, A, first.state, state.anchor + 2000, entry=name)  # MOVED
        assert second.status is ClaimStatus.OK
        assert [c.token for c in second.claims] == [first.claims[0].token + 1]
        assert cluster_servers.node_of(store.entry_keys(name)[0]).port == target.port
        assert sorted(store.history(name), key=lambda r: r.due)[0].state is RunState.SENT
        assert store.heartbeat(A, 10).epoch  # the heartbeat reads the new layout
    finally:
        cluster_servers.move_slot(slot, source)


def test_execute_follows_ask_to_the_node_it_knows_and_gives_up_on_tryagain(
        cluster_servers: ClusterServers) -> None:
    """A slot open (its keys on the importing master): the old owner answers ASK, and the
    command is sent again after ASKING to that master, as the client already knows it (no
    other connection pool). A command that gets TRYAGAIN there (keys split across the move)
    is tried again a bounded number of times, then the call fails."""
    client = connect(cluster_servers.url, RedisOptions(timeout=1, connect_timeout=1))
    assert isinstance(client, ClusterClient)
    try:
        client.set("{ask}a", "1")
        client.set("{ask}b", "2")
        slot = key_slot(b"{ask}a")
        source = cluster_servers.node_of_slot(slot)
        target = next(n for n in cluster_servers.nodes if n.port != source.port)
        known = client.cluster().get_node(host="127.0.0.1", port=target.port)
        nodes = {n.name for n in client.cluster().get_nodes()}
        cluster_servers.move_slot(slot, target, finish=False)
        replies = client.execute([(("GET", "{ask}a"), {}), (("GET", "{ask}b"), {}),
                                  (("GET", "{ask}none"), {})])
        assert [reply for reply, _ in replies] == ["1", "2", None]
        assert all(node is known for _, node in replies)
        assert {n.name for n in client.cluster().get_nodes()} == nodes
        started = time.monotonic()
        with pytest.raises(redis.exceptions.TryAgainError, match="redirecting 1 command"):
            client.execute([(("MGET", "{ask}a", "{ask}none"), {})])
        assert time.monotonic() - started < 2  # 0.05 + 0.1 + ... s between the passes
        cluster_servers.finish_move(slot, target, source)
        [(reply, node)] = client.execute([(("GET", "{ask}a"), {})])  # MOVED: table read again
        assert reply == "1" and node is not None and node.port == target.port
    finally:
        client.close()


def test_clients_of_one_seed_share_the_command_table(cluster_servers: ClusterServers) -> None:
    """redis-py reads COMMAND with every cluster client: once per process and seed here."""

    def reads() -> int:
        return sum(int(n.client().info("commandstats").get("cmdstat_command", {}).get(
            "calls", 0)) for n in cluster_servers.nodes)

    before = reads()
    clients = [connect(cluster_servers.url) for _ in range(3)]
    try:
        for i, client in enumerate(clients):
            client.set(f"{{t}}{i}", str(i))  # routed by key, through the shared table
        assert [c.get(f"{{t}}{i}") for i, c in enumerate(clients)] == ["0", "1", "2"]
        assert reads() - before <= 1
    finally:
        for client in clients:
            client.close()


# -- the epoch covers every master --------------------------------------------------------
@pytest.mark.parametrize("which", ["a master of entry buckets only", "the global keys' master"])
def test_a_restart_of_any_master_starts_a_new_epoch_and_keeps_the_records(
        store: RedisStore, cluster_servers: ClusterServers, which: str) -> None:
    first = store.heartbeat(A, 10)
    node = (other_master(store, cluster_servers) if which.startswith("a master")
            else cluster_servers.node_of(store._epoch))
    [name] = names_on(store, cluster_servers, node)
    state = register(store, name)[name]
    c = claim(store, A, state, state.anchor + 1000, entry=name).claims[0]
    old_run_id = node.run_id()
    cluster_servers.restart(node)
    assert node.run_id() != old_run_id
    wait_for(lambda: answers(store), 10, "the store to answer after the restart",
             interval=0.05)
    hb = store.heartbeat(A, 10)
    assert hb.epoch != first.epoch
    assert hb.settle_until is not None and hb.settle_until > hb.now + 5_000  # settling
    assert node.run_id() in (store._server or "").split(",")
    assert run(store, c).owner == A.id  # the records came back
    assert has_library(node)  # the scripts too


def test_a_write_the_heartbeat_could_not_look_for_is_not_confirmed_by_it(
        request: pytest.FixtureRequest) -> None:
    """On a cluster a beat's newest writes are looked for a round trip before the heartbeat
    (their entries' masters); when that round trip fails, the heartbeat stands and judges
    none of them. Not found held, they are not confirmed (a confirmed write of an entry
    the store no longer holds is taken for removed by a prune): a copy taken after the
    beat's last heartbeat and before the write, put back, is found at the next one."""
    with CLUSTER.open(request, 100) as store:
        assert isinstance(store, RedisStore) and not store.single_node
        written: list[Written] = []
        liveness = Liveness(store, A, 0.5, StoreClock(), written=lambda: written)
        liveness.beat()
        restore = CLUSTER.copy(store)  # (taken after that heartbeat)
        c = send(store, A, one_claim(store, A))
        written.append(Written(c.entry, c.due, c.token, Wrote.SENT, anchor=c.due - 1000))
        restore()  # the store put back: it never held the entry, nor the write
        real = store._kept_build

        def unanswered(pipe: Any, items: Any) -> None:
            raise StoreError("the master of the entry's slot did not answer (test)")

        store._kept_build = unanswered  # type: ignore[method-assign]
        try:
            liveness.beat()  # (nothing of the write judged: the heartbeat stands)
        finally:
            store._kept_build = real  # type: ignore[method-assign]
        with pytest.raises(StoreWentBack, match="no longer holds what this beat wrote"):
            liveness.beat()


def test_a_failover_to_a_replica_starts_a_new_epoch_and_keeps_what_was_replicated() -> None:
    """A cluster of its own (three masters, then a replica of one holding entry buckets):
    after ``CLUSTER FAILOVER`` the bucket's master is another process, the next heartbeat
    starts a new epoch (the beats register again what they know) and the records that
    reached the replica are there."""
    c = ClusterServers()
    try:
        c.start()
        store = new_store(c)
        first = store.heartbeat(A, 10)
        node = other_master(store, c)
        [name] = names_on(store, c, node)
        state = register(store, name)[name]
        held = claim(store, A, state, state.anchor + 1000, entry=name).claims[0]
        replica = c.add_replica(node)
        assert node.client().execute_command("WAIT", 1, 5000) == 1  # (the claim is there)
        c.failover(replica)
        wait_for(lambda: answers(store), 10, "the store to answer after the failover",
                 interval=0.05)
        hb = store.heartbeat(A, 10)
        assert hb.epoch != first.epoch
        assert hb.settle_until is not None and hb.settle_until > hb.now
        masters = (store._server or "").split(",")
        assert replica.run_id() in masters and node.run_id() not in masters
        assert run(store, held).owner == A.id and run(store, held).token == held.token
        assert c.node_of(store.entry_keys(name)[0]).port == replica.port
        store.close()
    finally:
        c.stop()


def test_a_restarted_master_is_refused_until_a_heartbeat_has_read_the_epoch(
        store: RedisStore, cluster_servers: ClusterServers) -> None:
    """A beat's first call after another master restarted is not a heartbeat: redis-py
    reconnects to the new process without a word. That master is refused (its data may be
    older) while the others answer; the next heartbeat starts a new epoch."""
    first = store.heartbeat(A, 10)
    node = other_master(store, cluster_servers)
    [there] = names_on(store, cluster_servers, node)
    [elsewhere] = names_off(store, cluster_servers, node)
    states = register(store, there, elsewhere)
    cluster_servers.restart(node)
    for _ in range(3):  # the old connection fails, then every new one is refused
        with pytest.raises(StoreError):
            store.claim(A, [plan(states[there], states[there].anchor + 1000, entry=there)])
    assert claim(store, A, states[elsewhere], states[elsewhere].anchor + 1000,
                 entry=elsewhere).status is ClaimStatus.OK
    hb = store.heartbeat(A, 10)
    assert hb.epoch != first.epoch
    # Nothing reached the restarted master: the claim made from the state read before is
    # the first one there (a claim that had run would leave a conflict).
    assert claim(store, A, states[there], states[there].anchor + 1000,
                 entry=there).status is ClaimStatus.OK


def test_workers_and_readers_are_not_held_back_by_the_epoch(
        store: RedisStore, cluster_servers: ClusterServers) -> None:
    """A client that never heartbeats (a worker, an operator) reads a restarted master at
    once: only beats wait for the epoch."""
    store.heartbeat(A, 10)
    node = other_master(store, cluster_servers)
    [name] = names_on(store, cluster_servers, node)
    state = register(store, name)[name]
    [c] = claim(store, A, state, state.anchor + 1000, entry=name).claims
    send(store, A, c)
    worker = new_store(cluster_servers, prefix=store.prefix)
    try:
        cluster_servers.restart(node)
        assert wait_for(lambda: _try(lambda: worker.start(delivery(c, process(1))).ok), 10,
                        "the worker's start after the restart", interval=0.05)
        assert worker.finish([Outcome(name, c.due, c.token, RunState.DONE)]) == [True]
    finally:
        worker.close()


def _try(call: Any) -> Any:
    try:
        return call()
    except StoreError:
        return None


# -- schedulers across a master's restart --------------------------------------------------
def test_two_schedulers_across_a_master_restart_send_nothing_twice(
        cluster_servers: ClusterServers, server: RedisServer) -> None:
    prefix = f"bc-cluster-{uuid.uuid4().hex[:8]}"
    probe = new_store(cluster_servers, prefix=prefix)
    node = other_master(probe, cluster_servers)
    on_node = names_on(probe, cluster_servers, node, count=3)
    elsewhere = names_off(probe, cluster_servers, node, count=3)
    probe.close()
    schedule = {name: {"task": "t.noop", "schedule": timedelta(seconds=1),
                       "claims": {"catch_up": "all"}} for name in on_node + elsewhere}
    app = make_app(server, schedule, beat_claims_url=cluster_servers.url,
                   beat_claims_key_prefix=prefix)
    a, b = make(app), make(app)
    try:
        # Running: every entry sent (those of the master about to restart included).
        wait_for(lambda: set(schedule) <= {e for e, _ in occurrences_sent(server)}, 10,
                 "every entry to be sent once", interval=0.05,
                 between=lambda: run_for(0.1, a, b))
        before = len(occurrences_sent(server))
        epoch = a.liveness.epoch
        restart = threading.Thread(target=cluster_servers.restart, args=(node,))
        restart.start()
        while restart.is_alive():  # the beats keep ticking while the master restarts
            run_for(0.2, a, b)
        restart.join()
        wait_for(lambda: a.liveness.epoch != epoch and b.liveness.epoch != epoch, 15,
                 "both beats to see the new epoch", interval=0.05,
                 between=lambda: run_for(0.1, a, b))
        restarted_at = time.time()
        # Both keep sending afterwards, entries of the restarted master included.

        def sent_since() -> set[str]:
            return {e for e, due in occurrences_sent(server)
                    if _ms(due) > restarted_at * 1000}

        wait_for(lambda: set(on_node) <= sent_since(), 15,
                 "entries of the restarted master to be sent again", interval=0.05,
                 between=lambda: run_for(0.1, a, b))
        sent = occurrences_sent(server)
        assert len(sent) > before
        duplicated = {k: n for k, n in Counter(sent).items() if n > 1}
        assert duplicated == {}, duplicated
        assert has_library(node)
    finally:
        for s in (a, b):
            s.close()


def _ms(due: str) -> int:
    from datetime import datetime

    return round(datetime.fromisoformat(due.replace("Z", "+00:00")).timestamp() * 1000)


# -- URLs ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("url", "expected"), [
    ("redis+cluster://h:7000", {"host": "h", "port": 7000}),
    ("redis+cluster://h", {"host": "h", "port": 6379}),
    ("redis+cluster://u:p%40ss@h:7000/0", {"host": "h", "port": 7000, "username": "u",
                                          "password": "p@ss"}),
    ("rediss+cluster://:pw@h:7000?ssl_cert_reqs=none",
     {"host": "h", "port": 7000, "password": "pw", "ssl": True, "ssl_cert_reqs": "none"}),
    ("REDISS+CLUSTER://h:1", {"host": "h", "port": 1, "ssl": True}),
    # Options beat-claims owns are not the URL's to loosen.
    ("redis+cluster://h:1?socket_timeout=60&retry_on_timeout=true", {"host": "h", "port": 1}),
])
def test_parse_cluster_url(url: str, expected: dict[str, Any]) -> None:
    assert parse_cluster_url(url) == expected


@pytest.mark.parametrize(("url", "message"), [
    ("redis+cluster://h:1/2", "only database 0"),
    ("redis+cluster://h1:1,h2:2", "one seed node"),
    ("redis+cluster://h1:1;redis+cluster://h2:2", "one seed node"),
    ("redis+cluster://h:1?db=3", "only database 0"),
    ("redis+cluster://h:1?health_check_interval=3", "not supported"),
    ("redis+cluster://:1", "no host"),
    ("redis+cluster://h:port", "Port could not be cast"),  # (the "port" masked: a password?)
    ("redis://h:1", "starts with redis\\+cluster://"),
])
def test_parse_cluster_url_refuses(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_cluster_url(url)


def test_parse_cluster_url_errors_do_not_show_passwords() -> None:
    with pytest.raises(ValueError) as info:
        parse_cluster_url("redis+cluster://u:hunter2@h:1/5")
    assert "hunter2" not in str(info.value) and "***" in str(info.value)


def _settings(url: str, **conf: Any) -> Settings:
    from celery import Celery

    app = Celery("t", set_as_current=False)
    app.conf.update(beat_claims_url=url, beat_claims_heartbeat_interval=0.5, **conf)
    return Settings.from_app(app)


@pytest.mark.parametrize("scheme", ["redis+cluster", "rediss+cluster"])
def test_open_store_builds_a_cluster_store_without_connecting(scheme: str) -> None:
    port = free_port()  # nothing listens there
    store = open_store(_settings(f"{scheme}://u:secret@127.0.0.1:{port}"))
    try:
        assert isinstance(store, RedisStore) and not store.single_node
        assert isinstance(store.client, ClusterClient)
        assert "secret" not in store.description
        assert store.client.kwargs.get("ssl", False) is (scheme == "rediss+cluster")
        started = time.monotonic()
        with pytest.raises(StoreError) as info:  # an outage, not a configuration error
            store.heartbeat(A, 10)
        assert not isinstance(info.value, StoreConfigurationError)
        assert time.monotonic() - started < 2 + 1  # connect + read, at most 1 s each here
    finally:
        store.close()


def test_open_store_refuses_a_bad_cluster_url_naming_the_setting() -> None:
    with pytest.raises(StoreConfigurationError, match=r"beat_claims_url.*database 0"):
        open_store(_settings("redis+cluster://127.0.0.1:1/3"))


def test_a_server_not_in_cluster_mode_is_a_configuration_error(server: RedisServer) -> None:
    store = RedisStore.from_url(f"redis+cluster://127.0.0.1:{server.port}")
    try:
        with pytest.raises(StoreConfigurationError, match="not in cluster mode"):
            store.heartbeat(A, 10)
    finally:
        store.close()


def _every_method(store: RedisStore) -> dict[str, Callable[[], object]]:
    """A call of each of the store's methods that reaches the store (an item or more)."""
    c = Claim("e", 1000, 1)
    d = delivery(c, process(1))
    return {
        "heartbeat": lambda: store.heartbeat(A, 10),
        "heartbeat, written": lambda: store.heartbeat(A, 10, written=[Written("e", 1000, 1)]),
        "leave": lambda: store.leave(A),
        "register": lambda: register(store, "e"),
        "unregister": lambda: store.unregister(A, ["e"]),
        "claim": lambda: store.claim(A, [ClaimPlan("e", None)]),
        "check": lambda: store.check(A, [Check(c, "t")]),
        "record_sent": lambda: store.record_sent(A, [c]),
        "release": lambda: store.release(A, [Release(c)]),
        "live_runs": lambda: store.live_runs(query(A, live=(A,))),
        "open_runs": lambda: store.open_runs(before=1000),
        "reclaim": lambda: store.reclaim([Reclaim("e", 1000, 1)], B.id),
        "start": lambda: store.start(d),
        "requeue": lambda: store.requeue(d),
        "finish": lambda: store.finish([Outcome("e", 1000, 1, RunState.DONE)]),
        "lookup_task": lambda: store.lookup_task("t"),
        "request_run": lambda: store.request_run("e", "operator:alice"),
        "pause": lambda: store.pause("e", "operator:alice"),
        "resume": lambda: store.resume("e", "operator:alice"),
        "backfill": lambda: store.backfill("e", [1000], "operator:alice"),
        "forget": lambda: store.forget(["e"]),
        "write_definitions": lambda: store.write_definitions([DefinitionWrite(
            "e", '{"task": "t"}', 0, Origin.API, "ops")]),
        "definitions": lambda: store.definitions(["e"]),
        "changes": lambda: store.changes(None),
        "due": lambda: store.due(1000, 10),
        "due_ahead": lambda: store.due_ahead(1000, 10),
        "index": lambda: store.index([IndexWrite("e", EntryState(1, None), 0, 5)]),
        "unindexed": lambda: store.unindexed(10),
        "entries": lambda: store.entries(),
        "history": lambda: store.history("e"),
        "owners": lambda: store.owners(),
        "now": lambda: store.now(),
        "worker_heartbeat": lambda: store.worker_heartbeat(process(1), 10),
        "worker_liveness": lambda: store.worker_liveness([process(1)]),
    }


@pytest.mark.parametrize("cluster_is", ["down", "a server not in cluster mode"])
def test_every_method_of_a_new_store_raises_only_the_contracts_errors_when_the_cluster_fails(
        server: RedisServer, cluster_is: str) -> None:
    """A new store (a new process) reads the cluster's topology at its first call, whichever
    method that is (one that starts with an entry's keys too): a cluster that cannot be
    reached is an outage (StoreError), a server not in cluster mode the configuration's
    fault, never redis-py's own exceptions."""
    port = free_port() if cluster_is == "down" else server.port  # (down: nothing listens)
    url = f"redis+cluster://127.0.0.1:{port}"
    expected = StoreError if cluster_is == "down" else StoreConfigurationError
    wrong: dict[str, str] = {}
    methods = list(_every_method(RedisStore.from_url(url)))  # (their names: nothing sent)
    for method in methods:  # each called first on a store of its own, as in a new process
        store = RedisStore.from_url(url, options=RedisOptions(timeout=1, connect_timeout=1))
        try:
            _every_method(store)[method]()
        except expected:
            continue
        except Exception as exc:  # (what the test looks for)
            wrong[method] = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
        else:
            wrong[method] = "no error"
        finally:
            store.close()
    assert not wrong, "\n".join(f"{method}: {what:.150}" for method, what in wrong.items())


class TLSNode:
    """A one-master cluster (every slot) on TLS only, whose one user is ``bc`` (the default
    user is off): ``rediss+cluster://bc:...@`` must carry TLS and the credentials to every
    connection the cluster client makes."""

    PASSWORD = "s3cr@t/x"

    def __init__(self, where: Path) -> None:
        key, cert = where / "key.pem", where / "cert.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                        "1", "-subj", "/CN=beat-claims-test", "-keyout", str(key), "-out",
                        str(cert)], check=True, capture_output=True)
        binary = shutil.which("redis-server")
        assert binary is not None
        self.port, bus = free_port(), free_port()
        self.proc = subprocess.Popen(
            [binary, "--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert),
             "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
             "--tls-auth-clients", "no", "--tls-cluster", "yes", "--cluster-enabled", "yes",
             "--cluster-config-file", "nodes.conf", "--cluster-port", str(bus),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(where),
             "--user", "default", "off", "--user", "bc", "on", f">{self.PASSWORD}", "~*", "&*",
             "+@all", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: self._try(lambda: self.client().ping()), 10,
                     "the TLS node to start", interval=0.02)
            self.client().execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            wait_for(lambda: self._try(lambda: "cluster_state:ok" in str(
                self.client().execute_command("CLUSTER", "INFO"))), 15,
                     "the TLS cluster to be ok", interval=0.05)
        except BaseException:
            self.stop()
            raise

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, ssl=True, ssl_cert_reqs="none", username="bc",
                           password=self.PASSWORD, socket_timeout=5)

    @staticmethod
    def _try(call: Any) -> Any:
        try:
            return call()
        except redis.RedisError:
            return None

    def url(self, password: str = PASSWORD, query: str = "?ssl_cert_reqs=none") -> str:
        return f"rediss+cluster://bc:{quote(password, safe='')}@127.0.0.1:{self.port}{query}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSNode]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed: cannot make a certificate for the TLS node")
    node = TLSNode(tmp_path_factory.mktemp("tls-cluster"))
    try:
        yield node
    finally:
        node.stop()


def test_rediss_cluster_with_a_user_and_password_works_end_to_end(tls_node: TLSNode) -> None:
    store = RedisStore.from_url(tls_node.url(), f"bc-tls-{uuid.uuid4().hex[:6]}")
    try:
        store.heartbeat(A, 10)
        state = register(store, "e")["e"]
        assert claim(store, A, state, state.anchor + 1000).status is ClaimStatus.OK
        assert store.owners()[0].owner == A
    finally:
        store.close()


@pytest.mark.parametrize(("url", "refused"), [
    ("wrong password", StoreConfigurationError),  # the beat says so and stops
    ("certificate not trusted", StoreError),  # as for rediss://: an outage
    ("plain TCP to the TLS port", StoreError),
])
def test_rediss_cluster_refusals(tls_node: TLSNode, url: str,
                                 refused: type[Exception]) -> None:
    given = {"wrong password": tls_node.url(password="nope"),
             "certificate not trusted": tls_node.url(query=""),
             "plain TCP to the TLS port": tls_node.url().replace("rediss+", "redis+")}[url]
    store = RedisStore.from_url(given, options=RedisOptions(timeout=1, connect_timeout=1))
    try:
        with pytest.raises(StoreError if refused is StoreError else StoreConfigurationError
                           ) as info:
            store.heartbeat(A, 10)
        assert isinstance(info.value, refused)
        assert "nope" not in str(info.value) and TLSNode.PASSWORD not in str(info.value)
    finally:
        store.close()


def test_connect_returns_a_cluster_client_that_connects_at_first_use(
        cluster_servers: ClusterServers) -> None:
    client = connect(cluster_servers.url, RedisOptions(timeout=1, connect_timeout=1))
    try:
        assert isinstance(client, ClusterClient)
        assert client._client is None  # nothing connected yet
        client.set("{k}", "v")
        assert client.get("{k}") == "v"
        # The cluster client's own retries are off (each node's connections have none).
        built = client.cluster()
        retries = getattr(getattr(built, "retry", None), "get_retries", None)  # (redis-py >= 6)
        assert (retries() if retries else built.cluster_error_retry_attempts) == 0
    finally:
        client.close()


def test_the_heartbeat_reads_the_run_id_of_every_master_holding_the_store(
        store: RedisStore, cluster_servers: ClusterServers) -> None:
    store.heartbeat(A, 10)
    holders = {m.port: m for m in bucket_masters(store, cluster_servers).values()}
    holders[cluster_servers.node_of(store._epoch).port] = cluster_servers.node_of(store._epoch)
    assert store._server == ",".join(sorted(n.run_id() for n in holders.values()))
