"""Store clients: URLs as redis-py and Celery read them, every wait bounded, no retries.

Against real redis-server processes started here (never the machine's shared Redis), and
against two kinds of dead peers: a *silent* server (the kernel completes the TCP handshake,
nothing ever answers) and a *blackholed* address (the TCP connect itself never completes).
"""

from __future__ import annotations

import contextlib
import math
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.connection import SSLConnection, UnixDomainSocketConnection

from beat_claims.stores.redis_client import (
    RedisOptions,
    SentinelURL,
    connect,
    parse_sentinel_url,
)

from .conftest import RedisServer, free_port
from .processes import wait_for as poll

#: Small timeouts keep the tests fast; the bounds asserted leave room for a loaded machine.
FAST = RedisOptions(timeout=0.5, connect_timeout=0.5)


def timed(call: Callable[[], Any]) -> tuple[float, BaseException | None]:
    """How long ``call`` took, and what it raised."""
    start = time.monotonic()
    try:
        call()
    except Exception as exc:
        return time.monotonic() - start, exc
    return time.monotonic() - start, None


class SilentServer:
    """Accepts TCP connections (the kernel does, from the backlog) and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]

    def connections(self) -> int:
        """How many connections arrived since the last call (they are closed)."""
        self.sock.setblocking(False)
        count = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                conn, _ = self.sock.accept()
                conn.close()
                count += 1
        return count

    def close(self) -> None:
        self.connections()
        self.sock.close()


class BlackholedAddress:
    """A port whose TCP connects never complete: a listener with a full accept queue (Linux
    then drops the SYNs, as a firewall that drops packets would)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0)
        self.port: int = self.sock.getsockname()[1]
        self.fillers: list[socket.socket] = []
        for _ in range(8):
            probe = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            self.fillers.append(probe)
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            except TimeoutError:
                return  # the queue is full
        raise RuntimeError("could not fill the accept queue of a listener")

    def close(self) -> None:
        for filler in self.fillers:
            filler.close()
        self.sock.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    peer = SilentServer()
    yield peer
    peer.close()


@pytest.fixture
def blackholed() -> Iterator[BlackholedAddress]:
    peer = BlackholedAddress()
    yield peer
    peer.close()


@contextlib.contextmanager
def spawn_redis(args: list[str], client: Callable[[], redis.Redis]) -> Iterator[None]:
    """A redis-server of our own with ``args``, until the block ends."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server not found (apt-get install redis-server)")
    proc = subprocess.Popen([binary, "--save", "", "--appendonly", "no", "--bind", "127.0.0.1",
                             "--loglevel", "warning", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"redis-server {args} exited with {proc.returncode}")
        try:
            return bool(client().ping())
        except redis.RedisError:
            return False

    try:
        poll(answers, 10, f"redis-server {args} to answer")
        yield
    finally:
        proc.terminate()
        proc.wait(10)


# -- plain servers ------------------------------------------------------------------------


def test_redis_url_connects_pings_and_decodes(server: RedisServer) -> None:
    client = connect(server.url, FAST)
    assert client.ping() is True
    client.set("k", "v")
    assert client.get("k") == "v"  # str, not bytes: decode_responses
    client.close()


def test_db_in_the_url_path_selects_the_database(server: RedisServer) -> None:
    client = connect(f"redis://127.0.0.1:{server.port}/3", FAST)
    client.set("in-three", "1")
    assert server.client(3).get("in-three") == "1"
    assert server.client(0).get("in-three") is None
    client.close()


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    """A server of this module's own: a password on the default user, and an ACL user."""
    own = RedisServer()
    own.start()
    admin = redis.Redis(port=own.port)
    admin.acl_setuser("bc", enabled=True, passwords=["+s3cr@t/x"], keys=["*"],
                      commands=["+@all"])
    admin.config_set("requirepass", "defaultpw")
    yield own
    own.stop()
    shutil.rmtree(own.dir, ignore_errors=True)


def test_acl_user_and_password_in_the_url_authenticate(acl_server: RedisServer) -> None:
    client = connect(f"redis://bc:s3cr%40t%2Fx@127.0.0.1:{acl_server.port}/0", FAST)
    assert client.acl_whoami() == "bc"
    client.close()


def test_password_of_the_default_user_in_the_url(acl_server: RedisServer) -> None:
    client = connect(f"redis://:defaultpw@127.0.0.1:{acl_server.port}/0", FAST)
    assert client.acl_whoami() == "default"
    client.close()


def test_wrong_or_missing_password_is_refused(acl_server: RedisServer) -> None:
    with pytest.raises(redis.AuthenticationError):
        connect(f"redis://bc:wrong@127.0.0.1:{acl_server.port}/0", FAST).ping()
    with pytest.raises(redis.AuthenticationError):
        connect(f"redis://127.0.0.1:{acl_server.port}/0", FAST).ping()


def test_unix_socket_url_with_password_and_db(tmp_path: Path) -> None:
    path = tmp_path / "redis.sock"
    with spawn_redis(["--port", "0", "--unixsocket", str(path), "--requirepass", "pw"],
                     lambda: redis.Redis(unix_socket_path=str(path), password="pw")):
        client = connect(f"unix://:pw@{path}?db=2", FAST)
        client.set("k", "v")
        assert redis.Redis(unix_socket_path=str(path), password="pw", db=2).get("k") == b"v"
        pool = client.connection_pool
        assert pool.connection_class is UnixDomainSocketConnection
        assert pool.connection_kwargs["socket_connect_timeout"] == FAST.connect_timeout
        client.close()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed: cannot make a certificate for the TLS server")
    where = tmp_path_factory.mktemp("tls")
    key, cert = where / "key.pem", where / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=beat-claims-test", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return key, cert


def test_rediss_url_passes_ssl_query_options_through(tls_files: tuple[Path, Path]) -> None:
    key, cert = tls_files
    port = free_port()
    with spawn_redis(["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
                      "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
                      "--tls-auth-clients", "no"],
                     lambda: redis.Redis(port=port, ssl=True, ssl_cert_reqs="none")):
        trusting = connect(f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=none", FAST)
        assert trusting.ping() is True
        assert trusting.connection_pool.connection_class is SSLConnection
        trusting.close()
        # The default verifies the certificate, which is self-signed here.
        with pytest.raises(redis.ConnectionError, match=r"(?i)certificate"):
            connect(f"rediss://127.0.0.1:{port}/0", FAST).ping()


def test_url_query_cannot_loosen_timeouts_retries_or_decoding() -> None:
    client = connect("redis://127.0.0.1:1/0?socket_timeout=600&socket_connect_timeout=600"
                     "&decode_responses=False&retry_on_timeout=True",
                     FAST)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == FAST.timeout
    assert kwargs["socket_connect_timeout"] == FAST.connect_timeout
    assert kwargs["decode_responses"] is True
    assert "retry_on_timeout" not in kwargs
    assert kwargs["retry"].get_retries() == 0


# -- dead servers -------------------------------------------------------------------------


def test_a_silent_server_fails_a_command_within_the_timeout_and_once(
        silent: SilentServer) -> None:
    client = connect(f"redis://127.0.0.1:{silent.port}/0", FAST)
    elapsed, error = timed(client.ping)
    assert isinstance(error, redis.TimeoutError)
    assert FAST.timeout * 0.8 <= elapsed < FAST.timeout + 0.5
    assert silent.connections() == 1  # no automatic retry
    client.close()


def test_a_silent_tls_server_fails_within_the_timeout(silent: SilentServer) -> None:
    client = connect(f"rediss://127.0.0.1:{silent.port}/0?ssl_cert_reqs=none", FAST)
    elapsed, error = timed(client.ping)
    assert isinstance(error, (redis.TimeoutError, redis.ConnectionError))
    # Within the timeout, not the default 5 s: a loaded 2-core host adds up to a second to
    # a handshake (1.2 s seen at a load of 10).
    assert elapsed < FAST.timeout + 1.5, elapsed
    client.close()


def test_a_blackholed_address_fails_within_the_connect_timeout(
        blackholed: BlackholedAddress) -> None:
    options = RedisOptions(timeout=5, connect_timeout=0.3)
    client = connect(f"redis://127.0.0.1:{blackholed.port}/0", options)
    elapsed, error = timed(client.ping)
    assert isinstance(error, (redis.TimeoutError, redis.ConnectionError))
    assert elapsed < options.connect_timeout + 0.5  # not the 5 s read timeout, not retried
    client.close()


# -- options ------------------------------------------------------------------------------


def test_default_options() -> None:
    assert RedisOptions() == RedisOptions(timeout=5.0, connect_timeout=2.0,
                                          sentinel_master=None)


@pytest.mark.parametrize("field", ["timeout", "connect_timeout"])
@pytest.mark.parametrize("value", [0, -1, math.inf, math.nan, None, True, "1"])
def test_options_refuse_unbounded_or_invalid_timeouts(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        RedisOptions(**{field: value})


def test_sentinel_url_without_a_master_name_names_the_setting() -> None:
    with pytest.raises(ValueError, match="beat_claims_sentinel_master") as caught:
        connect("sentinel://:hunter2@127.0.0.1:26379/0", FAST)
    assert "hunter2" not in str(caught.value)
    with pytest.raises(ValueError, match="beat_claims_sentinel_master"):
        connect("sentinel://127.0.0.1:26379", RedisOptions(sentinel_master=""))


# -- parse_sentinel_url -------------------------------------------------------------------


@pytest.mark.parametrize(("url", "expected"), [
    ("sentinel://h1", SentinelURL((("h1", 26379),))),
    ("sentinel://h1:26380;sentinel://h2:26381/0",
     SentinelURL((("h1", 26380), ("h2", 26381)), 0)),
    ("sentinel://h1:26379;sentinel://h2:26379/3",
     SentinelURL((("h1", 26379), ("h2", 26379)), 3)),
    ("sentinel://:pw@h1/1;sentinel://h2", SentinelURL((("h1", 26379), ("h2", 26379)), 1,
                                                       None, "pw")),
    ("sentinel://h1;sentinel://user:p%40ss%3Bw@h2:1/2",
     SentinelURL((("h1", 26379), ("h2", 1)), 2, "user", "p@ss;w")),
    ("sentinel://u:pw@h1/2; sentinel://u:pw@h2/2;",
     SentinelURL((("h1", 26379), ("h2", 26379)), 2, "u", "pw")),
    ("sentinel://[::1]:26379", SentinelURL((("::1", 26379),))),
])
def test_parse_sentinel_url(url: str, expected: SentinelURL) -> None:
    assert parse_sentinel_url(url) == expected


@pytest.mark.parametrize(("url", "message"), [
    ("sentinel://", "no host"),
    ("sentinel://h1;redis://h2", "sentinel://"),
    ("sentinel://h1:notaport", "port"),
    ("sentinel://h1/zero", "database number"),
    ("sentinel://h1/0;sentinel://h2/1", "different dbs"),
    ("sentinel://:a@h1;sentinel://:b@h2", "different passwords"),
    ("sentinel://h1/0?ssl=true", "query"),
    (";", "no sentinel"),
])
def test_parse_sentinel_url_refuses(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_sentinel_url(url)


def test_parse_sentinel_url_errors_do_not_show_passwords() -> None:
    with pytest.raises(ValueError) as caught:
        parse_sentinel_url("sentinel://:first@h1;sentinel://:second@h2")
    assert "first" not in str(caught.value) and "second" not in str(caught.value)
