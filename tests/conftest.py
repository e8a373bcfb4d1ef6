"""Fixtures: a private redis-server per test session (never the machine's shared one)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

if TYPE_CHECKING:
    from .any_store import StoreUnderTest


#: Where every process of a run caches the modules it compiled: outside the checkout, so that
#: no ``__pycache__`` appears in it, and yet each xdist worker need not rewrite the test
#: modules' asserts again nor each ``celery`` process compile beat-claims again (as they do
#: where the environment says PYTHONDONTWRITEBYTECODE). A given PYTHONPYCACHEPREFIX is kept.
PYCACHE = os.environ.get("PYTHONPYCACHEPREFIX") or os.path.join(
    tempfile.gettempdir(), f"beat-claims-pycache-{os.getuid()}")
sys.pycache_prefix = PYCACHE
sys.dont_write_bytecode = False
os.environ["PYTHONPYCACHEPREFIX"] = PYCACHE
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server the tests own: they may stop, restart, wipe or freeze it."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server not found: scripts/test installs it"
                        " (apt-get install redis-server)")
        self.binary = binary
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="bc-redis-")
        self.proc: subprocess.Popen[bytes] | None = None
        #: More of redis-server's options (``--name value ...``), for a test's own server.
        self.args: list[str] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def broker_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/1"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--loglevel", "warning", *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                redis.Redis(port=self.port, socket_timeout=0.5).ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def restart(self) -> None:
        """Restart without persistence: the store comes back empty."""
        self.stop()
        self.start()

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(port=self.port, db=db, decode_responses=True)


@contextlib.contextmanager
def own_redis(args: Sequence[str] = ()) -> Iterator[RedisServer]:
    """A redis-server of the test's own, with more options (``args``): its configuration
    never reaches the session's server."""
    server = RedisServer()
    server.args = list(args)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


def seed_settled_epoch(server: RedisServer, prefix: str = "beat-claims") -> None:
    """The store has run a while: its epoch exists, belongs to this server process and has
    settled, so a test with long heartbeat intervals need not wait one heartbeat TTL (three
    intervals) before its beats claim. The epoch's fields are the heartbeat script's."""
    client = server.client()
    run_id = client.info("server")["run_id"]
    client.hset(f"{{{prefix}}}:epoch", mapping={"id": "seeded", "settle_until": "0",
                                                "since": "0", "server": run_id})


def _own_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    yield from _own_server()


@pytest.fixture
def server(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The session's server, running and empty at the start of the test."""
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    redis_server.client().flushall()
    yield redis_server
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    else:
        try:
            redis_server.client().config_set("replica-read-only", "yes")
            redis_server.client().execute_command("REPLICAOF", "NO", "ONE")
        except redis.RedisError:
            pass


@pytest.fixture
def settled_store(request: pytest.FixtureRequest) -> None:
    """The store on the test's redis-server (``server``, the default key prefix) has run a
    while: its epoch has settled (:func:`seed_settled_epoch`). For the modules whose tests
    are about beats that run, not a new store's start (``pytestmark``'s
    ``pytest.mark.usefixtures("settled_store")``): their beats claim at once, rather than
    after the new epoch's settle period of a heartbeat TTL (3 s at the fleets' interval of
    1 s, 1.5 s at the in-process beats' 0.5 s)."""
    if "server" in request.fixturenames:
        seed_settled_epoch(request.getfixturevalue("server"))


@pytest.fixture(params=["redis", "sqlite", "postgres", "mysql"])
def any_store(request: pytest.FixtureRequest, server: RedisServer,
              tmp_path: Path) -> Iterator[StoreUnderTest]:
    """A fresh store of each kind, the broker on ``server`` (tests/any_store.py)."""
    from .any_store import store_of

    with store_of(request.param, server, tmp_path) as made:
        yield made


@pytest.fixture(scope="session")
def broker_server() -> Iterator[RedisServer]:
    """A second server, for tests that take the store down but need the broker up."""
    yield from _own_server()


@pytest.fixture
def broker(broker_server: RedisServer) -> RedisServer:
    broker_server.client().flushall()
    return broker_server


@pytest.fixture
def tmp_dir(tmp_path: Path) -> Path:
    return tmp_path


#: The contract suite's directory: its many short tests go last (see below).
CONTRACT = Path(__file__).parent / "contract"
#: A fixture made once for its module: ``@pytest.fixture(scope="module", ...)``.
MODULE_FIXTURE = re.compile(r"@pytest\.fixture\([^)]*scope=[\"']module[\"']")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order xdist hands the tests out in (``--dist loadgroup``, see below): the
    contract suite's thousands of short tests last, so that the long waits of the others
    (real beats and workers, schedules in real time) have all begun while the short ones
    fill the workers' ends (first, they left a few workers alone with the long ones at the
    end of a run). Within each part, the modules whose tests all go to one worker (see
    below: a fleet run once for the module) first: each is one unit of a minute or so, the
    longest the scheduler hands out, and one handed out late kept its worker busy alone
    at the end of the run (the contract suite's Redis Cluster module, 30 s).

    The other tests before the contract suite go mixed (:func:`mixed`): each module's
    spread evenly over that part, not one module after another. A module's tests are much
    alike, and handed out one after another the workers ran them side by side: seven
    browsers at once, then for minutes seven tests that mostly wait (the CPU busy 30-69% of
    the time), then seven that start celery processes. Mixed, the waits of some overlap
    the CPU of others.

    Runs after pytest-django's order (``trylast``), which it keeps among the tests that
    use Django's database: those in a transaction before the transactional ones, whose
    flush would empty what the others expect."""
    together = modules_with_module_fixtures(config.rootpath)

    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    contract = [item for item in items if CONTRACT in item.path.parents]
    others = [item for item in items if CONTRACT not in item.path.parents]
    items[:] = [*[item for item in others if module(item) in together],
                *mixed([item for item in others if module(item) not in together], module),
                *sorted(contract, key=lambda item: module(item) not in together)]


def mixed(items: list[pytest.Item], module: Callable[[pytest.Item], str]) -> list[pytest.Item]:
    """``items`` with each module's tests spread evenly over the whole list, in their order
    (the k-th of a module's n at (k + 1/2) / n of the way). The tests that use Django's
    database are one sequence, spread the same way, so that their order stays as found."""
    def django_db(item: pytest.Item) -> bool:
        return item.get_closest_marker("django_db") is not None or bool(
            {"db", "transactional_db", "live_server"} & set(getattr(item, "fixturenames", ())))

    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault("(django db)" if django_db(item) else module(item), []).append(item)
    placed = [((k + 0.5) / len(group), n, k) for n, group in enumerate(groups.values())
              for k in range(len(group))]
    group_list = list(groups.values())
    return [group_list[n][k] for _, n, k in sorted(placed)]


def modules_with_module_fixtures(root: Path) -> set[str]:
    """The test modules (as node ids name them, from ``root``) that define a fixture made
    once per module."""
    return {path.relative_to(root).as_posix()
            for path in Path(__file__).parent.rglob("test_*.py")
            if MODULE_FIXTURE.search(path.read_text(encoding="utf-8"))}


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` (pyproject's addopts): one test at a time to whichever worker
    is free, in the order above, except that the tests of a module that defines a
    module-scoped fixture (a fleet run once for the module, the docs site built once)
    all go to one worker, which makes that fixture once. xdist's own grouping, by
    ``xdist_group`` marks, is kept; it cannot group by module here: it renames the items,
    which pytest 9.2 ignores (pytest-xdist issue 1386)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    together = modules_with_module_fixtures(config.rootpath)

    class ModuleFixturesOnOneWorker(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in together else super()._split_scope(nodeid)

    return ModuleFixturesOnOneWorker(config, log)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """pytest-django has set Django up in this process by now. Child processes must not
    inherit its settings module: Celery turns on its Django fixup for any app when the
    variable is set. Tests that start Django processes name their settings explicitly."""
    os.environ.pop("DJANGO_SETTINGS_MODULE", None)


class SnapshotServer(RedisServer):
    """A redis-server whose data can be saved, and brought back older or not at all."""

    def snapshot(self, to: Path) -> None:
        self.client().save()
        shutil.copy(Path(self.dir) / "dump.rdb", to)

    def come_back(self, snapshot: Path | None) -> None:
        """Stop without saving, and start again from ``snapshot`` (None: empty)."""
        assert self.proc is not None
        # It answers by closing the connection; a client that retries on that (redis-py's
        # default) reconnects to a server going away, with backoff: 4 s for nothing.
        with contextlib.suppress(Exception):
            redis.Redis(port=self.port, retry=None).shutdown(nosave=True)
        self.proc.wait(10)
        self.proc = None
        dump = Path(self.dir) / "dump.rdb"
        dump.unlink(missing_ok=True)
        if snapshot is not None:
            shutil.copy(snapshot, dump)
        self.start()


@pytest.fixture
def store_server() -> Iterator[SnapshotServer]:
    server = SnapshotServer()
    server.start()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)
