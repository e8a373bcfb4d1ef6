"""The Redis Cluster backend of the contract suite: three masters (no replicas) started once
per session, ``redis+cluster://`` to one of them as the seed, a fresh key prefix per test.

The nodes are ``redis-server --cluster-enabled yes`` processes on free ports (the cluster
bus too: ``--cluster-port``); each master gets a third of the slots (``CLUSTER
ADDSLOTSRANGE``), they meet (``CLUSTER MEET``), and the cluster is used once every node says
``cluster_state:ok`` and they agree on who serves every slot. The fault hooks write with
plain clients of their own, as an operator would: a raw record, a raw entry field, a
``FLUSHALL`` on every master, and a master restarted with its data (``SAVE`` just before,
the snapshot loaded at start). The restarted master is one that holds entry buckets but
not the store's global keys: the epoch must change all the same (its data may be older).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.crc import key_slot

from beat_claims.stores.base import Store, WorkerProcess
from beat_claims.stores.redis import BUCKETS, RedisStore

from ..conftest import free_port
from .backend import Backend, counting
from .backend_redis import copy_keys, put_keys_back

#: Masters of the test cluster.
MASTERS = 3
SLOTS = 16384


class PortTaken(RuntimeError):
    """The server could not listen on its port (another process took it meanwhile)."""


class NodeServer:
    """One ``redis-server`` of the cluster, with its own directory (nodes.conf, dump.rdb)."""

    def __init__(self, binary: str, port: int, bus_port: int) -> None:
        self.binary, self.port, self.bus_port = binary, port, bus_port
        self.dir = tempfile.mkdtemp(prefix=f"bc-cluster-{port}-")
        self.proc: subprocess.Popen[bytes] | None = None
        self._client: redis.Redis | None = None

    @property
    def name(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server; returns once this process (not another one that took the port:
        xdist workers pick free ports at the same time) answers on the port."""
        self.proc = proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-port", str(self.bus_port), "--cluster-node-timeout", "5000",
             "--save", "", "--appendonly", "no", "--dir", self.dir,
             "--repl-diskless-sync-delay", "0",  # (a replica syncs at once, not after 5 s)
             "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                self.proc = None
                raise PortTaken(f"redis-server {self.name} exited at start ({proc.returncode}):"
                                " its port or bus port is taken?")
            try:
                if int(self.client().info("server")["process_id"]) == proc.pid:
                    return
                self.stop()
                raise PortTaken(f"another redis-server answers on {self.name}")
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server {self.name} did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        """Stop the server (killed if it does not stop within 10 s)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def client(self) -> redis.Redis:
        """A plain client of this node (one per node, kept until it stops)."""
        if self._client is None:
            self._client = redis.Redis(port=self.port, decode_responses=True,
                                       socket_timeout=5, socket_connect_timeout=2)
        return self._client

    def run_id(self) -> str:
        return str(self.client().info("server")["run_id"])


class ClusterServers:
    """Three masters on 127.0.0.1, each serving a third of the slots."""

    def __init__(self, masters: int = MASTERS) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server not found: .ci/run installs it"
                        " (apt-get install redis-server)")
        self.binary, self.masters = binary, masters
        self.nodes: list[NodeServer] = []
        #: Nodes added by add_replica() (after a failover, the old masters are here).
        self.replicas: list[NodeServer] = []
        self._raw: redis.cluster.RedisCluster | None = None
        #: Slots a test moved: put back by repair().
        self._moved: set[int] = set()
        #: Who serves each slot range as started (port).
        self._layout: dict[tuple[int, int], int] = {}

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self, attempts: int = 3) -> None:
        """Start the masters on free ports (others again if a port was taken meanwhile),
        give each a third of the slots and introduce them; returns once the cluster is ok."""
        for attempt in range(attempts):
            ports: set[int] = set()
            while len(ports) < 2 * self.masters:
                ports.add(free_port())
            chosen = sorted(ports)
            self.nodes = [NodeServer(self.binary, chosen[2 * i], chosen[2 * i + 1])
                          for i in range(self.masters)]
            try:
                for node in self.nodes:
                    node.start()
                break
            except PortTaken:
                self.stop()
                if attempt == attempts - 1:
                    raise
        share = SLOTS // len(self.nodes)
        for i, node in enumerate(self.nodes):
            last = SLOTS - 1 if i == len(self.nodes) - 1 else (i + 1) * share - 1
            node.client().execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
            node.client().execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            self._layout[(i * share, last)] = node.port
        for node in self.nodes[1:]:
            node.client().execute_command("CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port,
                                          self.nodes[0].bus_port)
        self.wait_ok()

    def wait_ok(self, timeout: float = 30) -> None:
        """Until every node says ``cluster_state:ok`` and all agree on every slot's master
        (a master that just started refuses writes for two seconds: Redis's own delay)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._ok():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the test cluster is not ok after {timeout}s")
            time.sleep(0.05)

    def _ok(self) -> bool:
        views = []
        for node in self.nodes + self.replicas:
            client = node.client()
            if "cluster_state:ok" not in str(client.execute_command("CLUSTER", "INFO")):
                return False
            views.append(self._slot_owners(client))
        covered = sum(end - start + 1 for start, end in views[0])
        return all(view == views[0] for view in views) and covered == SLOTS

    @staticmethod
    def _slot_owners(client: redis.Redis) -> dict[tuple[int, int], int]:
        return {(int(start), int(end)): int(master[1])
                for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS")}

    def node_of(self, key: str) -> NodeServer:
        """The master serving ``key``'s slot, as the cluster says now."""
        return self.node_of_slot(key_slot(key.encode()))

    def raw(self) -> redis.cluster.RedisCluster:
        """A cluster client of the tests' own (an operator's: it follows redirections)."""
        if self._raw is None:
            self._raw = redis.cluster.RedisCluster(host="127.0.0.1", port=self.nodes[0].port,
                                                   decode_responses=True)
        return self._raw

    def move_slot(self, slot: int, target: NodeServer, finish: bool = True) -> None:
        """Reshard ``slot`` to ``target`` as ``redis-cli --cluster reshard`` does: IMPORTING
        and MIGRATING, every key MIGRATEd, then (with ``finish``) the new owner told to every
        node. Without ``finish`` the slot is left open, its keys already on ``target``."""
        source = self.node_of_slot(slot)
        if source.port == target.port:
            return
        self._moved.add(slot)
        ids = {n.port: str(n.client().execute_command("CLUSTER", "MYID")) for n in self.nodes}
        target.client().execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING",
                                        ids[source.port])
        source.client().execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING",
                                        ids[target.port])
        while keys := source.client().execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            source.client().execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000,
                                            "KEYS", *keys)
        if finish:
            self.finish_move(slot, target, source)

    def finish_move(self, slot: int, target: NodeServer, source: NodeServer) -> None:
        target_id = str(target.client().execute_command("CLUSTER", "MYID"))
        for node in [target, source, *(n for n in self.nodes if n not in (target, source))]:
            node.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        self.wait_ok()

    def node_of_slot(self, slot: int) -> NodeServer:
        for (start, end), port in self._slot_owners(self.nodes[0].client()).items():
            if start <= slot <= end:
                return next(n for n in self.nodes + self.replicas if n.port == port)
        raise AssertionError(f"no master serves slot {slot}")

    def add_replica(self, master: NodeServer) -> NodeServer:
        """A new node, replica of ``master``; returns once it has synchronised."""
        ports: set[int] = set()
        while len(ports) < 2:
            ports.add(free_port())
        port, bus = sorted(ports)
        replica = NodeServer(self.binary, port, bus)
        self.replicas.append(replica)
        replica.start()
        replica.client().execute_command("CLUSTER", "MEET", "127.0.0.1", master.port,
                                         master.bus_port)
        master_id = str(master.client().execute_command("CLUSTER", "MYID"))

        def replicating() -> bool:
            try:
                replica.client().execute_command("CLUSTER", "REPLICATE", master_id)
            except redis.ResponseError:  # (it does not know the master yet)
                return False
            return True

        self._until(replicating, 10, f"{replica.name} to know {master.name}")
        self._until(lambda: replica.client().info("replication").get(
            "master_link_status") == "up", 20, f"{replica.name} to replicate {master.name}")

        def known_as_replica(node: NodeServer) -> bool:
            lines = node.client().execute_command("CLUSTER", "REPLICAS", master_id)
            return any(f":{replica.port}@" in str(line) for line in lines)

        # (A master votes for a failover only of a replica it knows.)
        self._until(lambda: all(known_as_replica(n) for n in self.nodes), 20,
                    f"every master to know {replica.name} as a replica")
        return replica

    def failover(self, replica: NodeServer) -> None:
        """``replica`` takes over its master's slots (``CLUSTER FAILOVER``: the master stops
        taking writes, the replica catches up, then is promoted); returns once every node
        agrees."""
        replica.client().execute_command("CLUSTER", "FAILOVER")
        self._until(lambda: replica.client().info("replication")["role"] == "master", 20,
                    f"{replica.name} to be promoted")
        promoted = {replica.port}
        self._until(lambda: all(
            promoted & set(self._slot_owners(n.client()).values())
            for n in self.nodes + self.replicas), 20, "every node to see the failover")
        self.wait_ok()

    @staticmethod
    def _until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.05)

    def original_master(self, slot: int) -> NodeServer:
        """The master that served ``slot`` when the cluster started."""
        port = next(p for (start, end), p in self._layout.items() if start <= slot <= end)
        return next(n for n in self.nodes if n.port == port)

    def repair(self) -> None:
        """Every slot a test moved is stable and back on its first master, whatever the test
        left (a slot still open, its keys half moved): the data is wiped first."""
        if not self._moved:
            return
        self.flushall()
        for slot in sorted(self._moved):
            for node in self.nodes:
                node.client().execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
            self.wait_ok()
            self.move_slot(slot, self.original_master(slot))
        self._moved.clear()

    def flushall(self) -> None:
        for node in self.nodes:
            node.client().flushall()

    def restart(self, node: NodeServer) -> None:
        """``node`` restarts with its data (a snapshot taken just before); returns once the
        whole cluster is ok again (a master that starts waits two seconds before it says
        so: Redis's own delay, the bulk of a restart's time)."""
        node.client().save()
        node.stop()
        try:
            node.start()
            self.wait_ok()
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(node.dir, "dump.rdb"))

    def ensure_running(self) -> None:
        """After a test that stopped a node and failed: every node up, the cluster ok."""
        stopped = [n for n in self.nodes if not n.running()]
        for node in stopped:
            node.start()
        if stopped:
            self.wait_ok()

    def stop(self) -> None:
        """Every node stopped (each killed if it does not stop), their directories removed."""
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        for node in self.nodes + self.replicas:
            try:
                node.stop()
            finally:
                shutil.rmtree(node.dir, ignore_errors=True)


_session: dict[str, ClusterServers] = {}
_failed: list[str] = []


def cluster(request: pytest.FixtureRequest) -> ClusterServers:
    """The session's cluster (one per xdist worker), started on first use and stopped when
    the session ends, whatever its outcome. A cluster that could not start fails every test
    that asks for it at once, with the first error."""
    if _failed:
        pytest.fail(f"the test cluster did not start: {_failed[0]}")
    if "cluster" not in _session:
        c = ClusterServers()
        try:
            c.start()
        except BaseException as exc:
            c.stop()
            _failed.append(f"{type(exc).__name__}: {exc}")
            raise
        _session["cluster"] = c
        request.config.add_cleanup(lambda: _session.pop("cluster").stop())
    c = _session["cluster"]
    c.ensure_running()
    return c


def bucket_masters(store: RedisStore, c: ClusterServers) -> dict[int, NodeServer]:
    """Each bucket's master."""
    return {b: c.node_of(store._bucket_keys(b, "due")[0]) for b in range(BUCKETS)}


def other_master(store: RedisStore, c: ClusterServers) -> NodeServer:
    """A master holding entry buckets, but not the store's global keys."""
    global_master = c.node_of(store._epoch)
    holders = {n.port: n for n in bucket_masters(store, c).values()}
    others = [n for port, n in sorted(holders.items()) if port != global_master.port]
    assert others, "every bucket is on the global keys' master: the layout changed?"
    return others[0]


# -- the backend --------------------------------------------------------------------------
_clusters: weakref.WeakKeyDictionary[RedisStore, ClusterServers] = weakref.WeakKeyDictionary()


def _store(store: Store) -> RedisStore:
    assert isinstance(store, RedisStore) and not store.single_node
    return store


@contextlib.contextmanager
def _cluster_open(request: pytest.FixtureRequest, history_limit: int) -> Iterator[Store]:
    c = cluster(request)
    c.flushall()
    store = RedisStore.from_url(c.url, f"bc-contract-{uuid.uuid4().hex[:8]}", history_limit)
    _clusters[store] = c
    try:
        yield store
    finally:
        store.close()


def _cluster_reopen(store: Store) -> Store:
    s = _store(store)
    c = _clusters[s]
    other = RedisStore.from_url(c.url, s.prefix, s.history_limit)
    _clusters[other] = c
    return other


def _cluster_corrupt_run(store: Store, entry: str, due: int, raw: str) -> None:
    s = _store(store)
    _clusters[s].raw().hset(s.entry_keys(entry)[1], str(due), raw)


def _cluster_corrupt_entry_field(store: Store, entry: str, field: str, raw: str) -> None:
    s = _store(store)
    _clusters[s].raw().hset(s.entry_keys(entry)[0], field, raw)


def _cluster_drop_next_due(store: Store, entry: str) -> None:
    s = _store(store)
    _clusters[s].raw().hdel(s.entry_keys(entry)[0], "next_due")
    _clusters[s].raw().zrem(s.index_key(entry), entry)


def _cluster_drop_entry_record(store: Store, entry: str) -> None:
    s = _store(store)
    _clusters[s].raw().delete(s.entry_keys(entry)[0])


def _cluster_corrupt_worker_record(store: Store, process: WorkerProcess, raw: str) -> None:
    s = _store(store)
    _clusters[s].raw().set(s.worker_key(process), raw, keepttl=True)


def _cluster_wipe(store: Store) -> None:
    _clusters[_store(store)].flushall()


def _cluster_restart(store: Store) -> None:
    s = _store(store)
    c = _clusters[s]
    c.restart(other_master(s, c))


def _cluster_copy(store: Store) -> Callable[[], None]:
    s = _store(store)
    c = _clusters[s]
    clients = [redis.Redis(port=node.port) for node in c.nodes]
    keys = copy_keys(clients, s.prefix)

    def client_of(key: bytes) -> redis.Redis:
        return redis.Redis(port=c.node_of(key.decode()).port)

    return lambda: put_keys_back(clients, s.prefix, keys, client_of)


BACKEND = Backend(open=_cluster_open, reopen=_cluster_reopen,
                  corrupt_run=_cluster_corrupt_run,
                  corrupt_entry_field=_cluster_corrupt_entry_field, wipe=_cluster_wipe,
                  restart=_cluster_restart,
                  corrupt_worker_record=_cluster_corrupt_worker_record, copy=_cluster_copy,
                  drop_next_due=_cluster_drop_next_due,
                  drop_entry_record=_cluster_drop_entry_record,
                  round_trips=lambda store: counting(store, "_round_trip"))
