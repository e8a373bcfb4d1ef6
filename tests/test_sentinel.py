"""The store behind Redis Sentinel: ``sentinel://`` URLs, as Celery's broker takes them.

Discovery against real sentinels (``redis-server --sentinel``) started here, with dead ones
in the list: every sentinel is asked once, each within ``connect_timeout + timeout``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from redis.sentinel import MasterNotFoundError

from beat_claims.stores.redis_client import RedisOptions, connect

from .conftest import RedisServer, free_port
from .processes import wait_for
from .test_redis_client import BlackholedAddress, SilentServer, timed

#: Small timeouts keep the tests fast; the bounds asserted leave room for a loaded machine.
FAST = RedisOptions(timeout=0.5, connect_timeout=0.5, sentinel_master="bcmaster")
#: What one unresponsive sentinel may cost, as the module docstring documents it.
PER_SENTINEL = FAST.connect_timeout + FAST.timeout


@contextmanager
def running_sentinel(binary: str, master_port: int, where: Path, extra: str = "",
                     down_after_ms: int = 5000) -> Iterator[int]:
    """A sentinel of our own watching ``bcmaster`` at ``master_port``; yields its port."""
    port = free_port()
    conf = where / f"sentinel-{port}.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\nsentinel monitor bcmaster 127.0.0.1"
                    f" {master_port} 1\nsentinel down-after-milliseconds bcmaster"
                    f" {down_after_ms}\n{extra}")
    proc = subprocess.Popen([binary, str(conf), "--sentinel"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port, decode_responses=True, socket_timeout=2)

        def master_known() -> bool:
            try:
                return bool(client.sentinel_get_master_addr_by_name("bcmaster"))
            except redis.RedisError:
                return False

        wait_for(master_known, 10, "the sentinel to know its master")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def sentinel(server: RedisServer, tmp_path: Path) -> Iterator[int]:
    with running_sentinel(server.binary, server.port, tmp_path) as port:
        yield port


def test_scheduler_claims_through_sentinel(server: RedisServer, sentinel: int) -> None:
    # Imported here: the client tests below need none of the scheduler (or Celery app).
    from .inprocess import make, make_app, occurrences_sent

    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1)}},
                   beat_claims_url=f"sentinel://127.0.0.1:{sentinel}/0",
                   beat_claims_sentinel_master="bcmaster")
    s = make(app)
    wait_for(lambda: len(occurrences_sent(server)) >= 2, 15, "two runs sent", interval=0.05,
             between=s.tick)
    from beat_claims.stores.redis import RedisStore

    # Written through the master: read there directly.
    assert len(RedisStore(server.client(), "beat-claims").owners()) == 1
    s.close()


def test_sentinel_url_needs_a_master_name(server: RedisServer) -> None:
    from beat_claims.settings import ConfigurationError, Settings

    from .inprocess import make_app

    app = make_app(server, beat_claims_url="sentinel://127.0.0.1:26379")
    with pytest.raises(ConfigurationError, match="beat_claims_sentinel_master"):
        Settings.from_app(app)
    app.conf.broker_transport_options = {"master_name": "fromthebroker"}
    assert Settings.from_app(app).sentinel_master == "fromthebroker"


# -- discovery through the client (beat_claims.stores.redis_client) ----------------------


@pytest.fixture
def silent_peers() -> Iterator[list[SilentServer]]:
    """Sentinels that accept connections and never answer (two of them)."""
    peers = [SilentServer(), SilentServer()]
    yield peers
    for peer in peers:
        peer.close()


@pytest.fixture
def blackholed_peer() -> Iterator[BlackholedAddress]:
    """A sentinel address whose TCP connect never completes."""
    peer = BlackholedAddress()
    yield peer
    peer.close()


def node(port: int, userinfo: str = "") -> str:
    return f"sentinel://{userinfo}127.0.0.1:{port}"


def test_sentinel_url_resolves_the_master(server: RedisServer, sentinel: int) -> None:
    client = connect(f"{node(sentinel)}/2", FAST)
    client.set("through-sentinel", "v")
    assert client.get("through-sentinel") == "v"
    assert server.client(2).get("through-sentinel") == "v"
    client.close()


def test_an_unresponsive_first_sentinel_costs_one_timeout_and_is_asked_once(
        server: RedisServer, sentinel: int, silent_peers: list[SilentServer]) -> None:
    dead = silent_peers[0]
    client = connect(f"{node(dead.port)};{node(sentinel)}/0", FAST)
    elapsed, error = timed(client.ping)
    assert error is None
    assert elapsed < 2 * PER_SENTINEL
    # The sentinel that answered is asked first from now on: a new connection is quick.
    client.connection_pool.disconnect()
    elapsed, error = timed(client.ping)
    assert error is None and elapsed < FAST.timeout
    assert dead.connections() == 1
    client.close()


def test_a_blackholed_first_sentinel_costs_the_connect_timeout(
        server: RedisServer, sentinel: int, blackholed_peer: BlackholedAddress) -> None:
    options = RedisOptions(timeout=5, connect_timeout=0.3, sentinel_master="bcmaster")
    client = connect(f"{node(blackholed_peer.port)};{node(sentinel)}/0", options)
    elapsed, error = timed(client.ping)
    assert error is None
    assert elapsed < options.connect_timeout + 0.5  # bounded by connect_timeout, not 5 s
    client.close()


def test_three_unresponsive_sentinels_fail_within_the_documented_bound(
        silent_peers: list[SilentServer], blackholed_peer: BlackholedAddress) -> None:
    ports = [silent_peers[0].port, blackholed_peer.port, silent_peers[1].port]
    client = connect(";".join(node(port) for port in ports) + "/0", FAST)
    elapsed, error = timed(client.ping)
    assert isinstance(error, MasterNotFoundError)
    assert isinstance(error, redis.ConnectionError)
    message = str(error)
    assert "bcmaster" in message
    assert all(f"port={port}" in message for port in ports)  # each sentinel and its error
    assert elapsed <= len(ports) * PER_SENTINEL
    assert [peer.connections() for peer in silent_peers] == [1, 1]  # each asked once
    client.close()


@pytest.fixture
def acl_master() -> Iterator[RedisServer]:
    """A master of its own that requires the ACL user ``bc``."""
    own = RedisServer()
    own.start()
    admin = redis.Redis(port=own.port)
    admin.acl_setuser("bc", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all"])
    admin.acl_setuser("default", enabled=False)
    yield own
    own.stop()
    shutil.rmtree(own.dir, ignore_errors=True)


def test_credentials_in_a_sentinel_url_apply_to_the_master(
        acl_master: RedisServer, tmp_path: Path) -> None:
    auth = "sentinel auth-user bcmaster bc\nsentinel auth-pass bcmaster pw\n"
    with running_sentinel(acl_master.binary, acl_master.port, tmp_path, auth) as port:
        client = connect(f"{node(port)};{node(port, 'bc:pw@')}/1", FAST)
        assert client.acl_whoami() == "bc"
        client.close()
        with pytest.raises(redis.AuthenticationError):
            connect(f"{node(port, 'bc:wrong@')}/1", FAST).ping()


def test_a_silent_master_behind_a_sentinel_fails_a_command_within_the_timeout(
        silent_peers: list[SilentServer], tmp_path: Path) -> None:
    master = silent_peers[0]
    binary = shutil.which("redis-server")
    assert binary is not None
    with running_sentinel(binary, master.port, tmp_path, down_after_ms=60000) as port:
        client = connect(f"{node(port)}/0", FAST)
        elapsed, error = timed(client.ping)
        assert isinstance(error, redis.TimeoutError)
        assert 0.8 * FAST.timeout <= elapsed < FAST.timeout + 0.5
        client.close()
