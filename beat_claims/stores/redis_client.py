"""Redis clients for the store, with every wait bounded.

A beat must notice a store it cannot reach within seconds: its heartbeat lapses, other
beats take over, and ``manage.py check`` promises an answer within 1 s. redis-py's
defaults do not bound that: a ``Redis`` client retries three times with backoff, and
Sentinel connections have no connect timeout and keep those retries, so one sentinel
that accepts connections and never answers stalled discovery for about a minute.

Here every connection (to a server, to a Sentinel master, and to each sentinel) gets
``connect_timeout`` for the TCP connect and ``timeout`` for every blocking read or write
after it (TLS handshake, connection setup, each reply), and nothing is retried
automatically: a script that timed out may have run, and the caller reconciles.

Time bounds, for a server or sentinel that does not answer at all:

- a command on a ``redis://``, ``rediss://`` or ``unix://`` client fails (``TimeoutError``
  or ``ConnectionError``) within ``connect_timeout + timeout``;
- Sentinel discovery asks each sentinel of the URL once, in order, each within
  ``connect_timeout + timeout``, and raises ``MasterNotFoundError`` (a
  ``ConnectionError``) after at most ``N x (connect_timeout + timeout)`` for ``N``
  sentinels; a command that needs a new connection to the master adds at most one more
  ``connect_timeout + timeout``. With the defaults (2 s + 5 s) and three sentinels
  discovery gives up within 21 s. The sentinel that answered is asked first next time.

A server that answers, but slowly, may take up to ``timeout`` for each reply of the
connection setup (AUTH, CLIENT SETINFO, SELECT) as well.

Redis Cluster (``redis+cluster://`` and ``rediss+cluster://``, redis-py's ``RedisCluster``)
has more steps, each bounded the same way: every connection to every node gets the two
timeouts and no retry, the cluster client's own retries are off (redis-py retries a
command or a pipeline that timed out after reconnecting: a script would run twice), and
:meth:`ClusterClient.execute` follows redirections itself, only for replies that say the
command did not run. For ``N`` masters known to the client, with ``T = connect_timeout +
timeout``:

- discovering the topology (``CLUSTER SLOTS``, at the first command, after a connection
  error and after a ``MOVED`` reply) asks the known nodes one after the other, each within
  ``T``: at most ``N x T`` when none answers (the seed alone at the first command);
- one pass of a batch writes to every node concerned, then reads each reply: at most
  ``N x T`` for connections and reads, plus one discovery when a connection fails;
- a batch makes at most ``REDIRECT_PASSES`` (5) passes, the later ones only with the
  commands that were redirected (``MOVED``, ``ASK``, ``TRYAGAIN``: not run), then fails;
  ``TRYAGAIN`` (a slot whose keys are moving) waits 0.05 s, 0.1 s... between passes.

With the defaults (2 s + 5 s) and three masters a command fails within 42 s when a
master stops answering mid-batch; a dead seed at the first command, within 7 s.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import REDIS_ALLOWED_KEYS, ClusterNode, PipelineCommand, RedisCluster
from redis.connection import ConnectionPool, parse_url
from redis.exceptions import AskError, MovedError, TryAgainError
from redis.retry import Retry
from redis.sentinel import Sentinel

from ..urls import redact_text, redact_url
from .redis_packer import packer_options

DEFAULT_SENTINEL_PORT = 26379
#: ``redis+cluster://`` and ``rediss+cluster://`` (TLS): a Redis Cluster, any node as seed.
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
#: Passes a batch may make when the cluster redirects some of its commands.
REDIRECT_PASSES = 5

#: Client options beat-claims owns: a URL's query cannot loosen them (the store's URL is
#: often the broker's, whose query may carry settings meant for the broker). Text is UTF-8,
#: as the scripts and their JSON records are.
_OWNED = ("socket_timeout", "socket_connect_timeout", "decode_responses", "retry",
          "retry_on_timeout", "retry_on_error", "encoding", "encoding_errors")


@dataclass(frozen=True)
class RedisOptions:
    """How long a store client may wait, and which Sentinel master it follows."""

    timeout: float = 5.0
    """Read/write timeout of every command (and of each blocking step of a connect after
    the TCP connect), seconds."""
    connect_timeout: float = 2.0
    """TCP connect timeout of every connection, sentinels included, seconds."""
    sentinel_master: str | None = None
    """The master's name, required with ``sentinel://`` URLs."""

    def __post_init__(self) -> None:
        for name in ("timeout", "connect_timeout"):
            value = getattr(self, name)
            # None or inf would mean "wait forever": exactly what this module prevents.
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name} must be a finite number of seconds > 0,"
                                 f" not {value!r}")


@dataclass(frozen=True)
class SentinelURL:
    """A parsed ``sentinel://`` URL: the sentinels to ask, and how to talk to the master."""

    nodes: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None


def connect(url: str, options: RedisOptions = RedisOptions()) -> redis.Redis | ClusterClient:
    """A client for ``url`` with bounded waits and no automatic retries (module docstring).

    ``redis://``, ``rediss://`` and ``unix://`` URLs are read as redis-py reads them (ACL
    user and password, db in the path, query options such as ``ssl_cert_reqs``), except
    that the timeouts and retries are always those of ``options``. ``sentinel://`` URLs
    are read as Celery's broker reads them (``sentinel://[user:password@]h1:26379;
    sentinel://h2:26379/0``); the client follows ``options.sentinel_master`` across
    failovers. ``redis+cluster://[user:password@]host:port`` (``rediss+cluster://`` for
    TLS) is a Redis Cluster, any of its nodes as the seed: a :class:`ClusterClient`.
    Nothing is connected until the first command.
    """
    if url.split("://", 1)[0].lower() in CLUSTER_SCHEMES:
        return ClusterClient(url, options)
    common: dict[str, Any] = {
        "decode_responses": True,
        # Bytes that are not UTF-8 (written into the store's keys by something else) are
        # read as replacement characters: such a name matches nothing, and no read fails.
        "encoding_errors": "replace",
        "socket_timeout": options.timeout,
        "socket_connect_timeout": options.connect_timeout,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 30,
    }
    if not url.startswith("sentinel://"):
        # Not Redis.from_url: there the URL's query wins over the arguments given.
        try:
            given = parse_url(url)
        except ValueError as exc:  # (it may quote what it misread: a password's piece)
            raise ValueError(f"{redact_url(url)}: {redact_text(str(exc), url)}") from None
        kwargs = {key: value for key, value in given.items() if key not in _OWNED}
        pool = ConnectionPool(**{**kwargs, **common, **packer_options()})
        return redis.Redis.from_pool(pool)  # type: ignore[attr-defined]  # not in types-redis
    if not options.sentinel_master:
        raise ValueError(f"{redact_url(url)}: a sentinel:// URL needs the master's name"
                         " (beat_claims_sentinel_master, or the broker's"
                         " transport option master_name)")
    parsed = parse_sentinel_url(url)
    sentinel = Sentinel(
        list(parsed.nodes),
        sentinel_kwargs={
            "socket_timeout": options.timeout,
            "socket_connect_timeout": options.connect_timeout,
            "retry": Retry(NoBackoff(), 0),
        },
    )
    return sentinel.master_for(options.sentinel_master, db=parsed.db,
                               username=parsed.username, password=parsed.password, **common,
                               **packer_options())


class ClusterClient:
    """redis-py's ``RedisCluster`` for a ``redis+cluster://`` URL, built at its first use
    (``RedisCluster`` reads the topology from the seed as it is built: a cluster that is
    down when a beat starts is an outage, not a crash), and a batch executor that never
    runs a command twice (:meth:`execute`).

    Other attributes are the ``RedisCluster``'s (``client.hset(...)`` routes by key).
    ``on_connect`` is called with every new connection to any node, after its setup.
    """

    def __init__(self, url: str, options: RedisOptions = RedisOptions()) -> None:
        self.url = url
        self.kwargs = parse_cluster_url(url)
        self.options = options
        self.on_connect: Callable[[Any], None] | None = None
        #: Commands without a key (TIME) go to the node holding this key's slot.
        self.keyless_key = ""
        self._client: RedisCluster | None = None
        self._lock = threading.Lock()
        self._local = threading.local()

    def cluster(self) -> RedisCluster:
        """The ``RedisCluster``, built (and the topology read from the seed) on first use.
        Raises what redis-py raises when no node answers (``RedisClusterException``, its
        cause the node's error)."""
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self._client is None:
                client = _Cluster(
                    (str(self.kwargs.get("host")), int(self.kwargs["port"])),
                    **self.kwargs,
                    decode_responses=True,
                    encoding_errors="replace",  # (as connect(): no read fails on bad bytes)
                    socket_timeout=self.options.timeout,
                    socket_connect_timeout=self.options.connect_timeout,
                    # The cluster client's retries (each node's connections get none).
                    retry=Retry(NoBackoff(), 0),
                    redis_connect_func=self._connected,
                )
                client.cluster_error_retry_attempts = 0  # redis-py 5 reads this instead
                self._client = client
            return self._client

    def _connected(self, conn: Any) -> None:
        if self.on_connect is not None:
            self.on_connect(conn)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.cluster(), name)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    # -- one batch --------------------------------------------------------------------
    def node_of(self, args: Sequence[Any]) -> ClusterNode:
        """The master that serves the command, by its first key (a script's call: its
        first declared key), as the client's slot table has it."""
        name = str(args[0]).upper()
        if name in ("EVALSHA", "EVAL", "FCALL", "FCALL_RO"):
            key = args[3] if int(args[2]) > 0 else self.keyless_key
        else:
            key = args[1] if len(args) > 1 else self.keyless_key
        node = self.cluster().get_node_from_key(key)
        assert node is not None  # (None only when a replica is asked for)
        return node

    def execute(self, commands: Sequence[tuple[Sequence[Any], dict[str, Any]]]
                ) -> list[tuple[Any, ClusterNode | None]]:
        """Each command's reply (or its error) and the node that answered, in order.

        The commands go out in one pipelined pass (written to every node concerned, then
        read). A command redirected by a reply that says it did not run (``MOVED``: the
        slot table is read again; ``ASK``: sent again to that node after ``ASKING``;
        ``TRYAGAIN``) is sent again, in at most ``REDIRECT_PASSES`` passes. Nothing else
        is sent again: a connection error or a timeout raises at once (the commands may
        have run: the caller reconciles), and other error replies are returned.
        """
        cluster = self.cluster()
        replies: list[tuple[Any, ClusterNode | None]] = [(None, None)] * len(commands)
        pending = list(range(len(commands)))
        asking: dict[int, tuple[str, int]] = {}  # command -> the node an ASK named
        for attempt in range(REDIRECT_PASSES):
            again: list[int] = []
            moved = False
            if pending:
                stack, nodes = [], []
                for position, i in enumerate(pending):
                    args, options = commands[i]
                    node = self.node_of(args)
                    nodes.append(node)
                    stack.append(PipelineCommand(tuple(args),
                                                 {**options, "target_nodes": node}, position))
                results = self._pipeline().send_cluster_commands(
                    stack, raise_on_error=False, allow_redirections=False)
                for i, node, result in zip(pending, nodes, results):
                    moved = self._sort(i, node, result, replies, again, asking) or moved
            for address in sorted(set(asking.values())):
                batch = [i for i, named in asking.items() if named == address]
                for i in batch:
                    del asking[i]
                host, port = address
                target = cluster.get_node(host=host, port=port) or ClusterNode(host, port)
                pipe = cluster.get_redis_connection(target).pipeline(transaction=False)
                for i in batch:
                    args, options = commands[i]
                    pipe.execute_command("ASKING")
                    pipe.execute_command(*args, **options)
                results = pipe.execute(raise_on_error=False)[1::2]
                for i, result in zip(batch, results):
                    moved = self._sort(i, target, result, replies, again, asking) or moved
            if not again and not asking:
                return replies
            if moved:
                cluster.nodes_manager.initialize()
            else:
                time.sleep(0.05 * (attempt + 1))  # TRYAGAIN: a slot's keys are moving
            pending = again
        raise redis.exceptions.TryAgainError(
            f"the cluster kept redirecting {len(pending) + len(asking)} command(s) after"
            f" {REDIRECT_PASSES} passes (slots moving)")

    @staticmethod
    def _sort(i: int, node: ClusterNode, result: Any,
              replies: list[tuple[Any, ClusterNode | None]], again: list[int],
              asking: dict[int, tuple[str, int]]) -> bool:
        """File one reply; True when it was a MOVED (the slot table is stale)."""
        if isinstance(result, (redis.ConnectionError, redis.TimeoutError)):
            raise result  # the command may have run: never sent again
        if isinstance(result, MovedError):
            again.append(i)
            return True
        if isinstance(result, AskError):
            asking[i] = (str(result.host), int(result.port))
        elif isinstance(result, TryAgainError):
            again.append(i)
        else:
            replies[i] = (result, node)
        return False

    def _pipeline(self) -> Any:
        """This thread's ClusterPipeline (used for its pipelined send only)."""
        cluster = self.cluster()
        pipe = getattr(self._local, "pipe", None)
        if pipe is None or getattr(self._local, "of", None) is not cluster:
            pipe = self._local.pipe = cluster.pipeline()
            self._local.of = cluster
        return pipe


class _Cluster(RedisCluster):
    """``RedisCluster`` that reads the command table once per process and seed node.

    redis-py builds its ``CommandsParser`` (key positions, read from ``COMMAND``: some 240
    entries) with every client, a round trip and some 15 ms of parsing. A store is opened
    per ``celery claims`` call, per worker process, per test: they share the table of the
    first client of the same seed. It serves routing only, and the store's commands
    (EVALSHA, HGET, TIME...) have the same key positions on every Redis version.
    """

    _tables: dict[tuple[str, int], dict[str, Any]] = {}
    _tables_lock = threading.Lock()

    def __init__(self, seed: tuple[str, int], **kwargs: Any) -> None:
        self._seed = seed  # (read by command(), which super().__init__ calls)
        super().__init__(**kwargs)

    def command(self, **kwargs: Any) -> Any:
        if kwargs:
            return super().command(**kwargs)
        with self._tables_lock:
            table = self._tables.get(self._seed)
        if table is None:
            table = super().command()
            with self._tables_lock:
                self._tables[self._seed] = dict(table)
        return dict(table)  # (the parser renames keys of its copy)


def parse_cluster_url(url: str) -> dict[str, Any]:
    """``redis+cluster://[user:password@]host[:port][/0][?options]`` (``rediss+cluster``:
    TLS) as keyword arguments of ``RedisCluster``: the seed, the credentials, TLS and
    redis-py's query options (``ssl_cert_reqs``, ``ssl_ca_certs``...). A cluster has no
    database but 0; options redis-py would drop for a cluster are refused, and the ones
    beat-claims owns (timeouts, retries, decoding) are ignored as for other URLs."""
    where = redact_url(url)
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in CLUSTER_SCHEMES:
        raise ValueError(f"{where}: a cluster URL starts with redis+cluster:// or"
                         " rediss+cluster://")
    if ";" in rest or "," in urlsplit(url).netloc:
        raise ValueError(f"{where}: one seed node (any node of the cluster): the client"
                         " finds the others")
    try:
        parsed = parse_url(scheme.split("+", 1)[0] + "://" + rest)
    except ValueError as exc:
        raise ValueError(f"{where}: {redact_text(str(exc), url)}") from None
    if not parsed.get("host"):
        raise ValueError(f"{where}: no host")
    if parsed.pop("db", 0) != 0:
        raise ValueError(f"{where}: a Redis Cluster has only database 0")
    kwargs: dict[str, Any] = {"port": 6379}
    for key, value in parsed.items():
        if key in _OWNED or key == "connection_class":  # (rediss: SSLConnection; see ssl)
            continue
        if key not in REDIS_ALLOWED_KEYS:
            raise ValueError(f"{where}: the option {key!r} is not supported for a cluster")
        kwargs[key] = value
    if scheme == "rediss+cluster":
        kwargs["ssl"] = True
    return kwargs


def parse_sentinel_url(url: str) -> SentinelURL:
    """``sentinel://[user:password@]host[:port][/db]``, several joined by ``;``.

    As with Celery's broker: credentials and db may be on any node and apply to the
    master (sentinels are asked without them); the port defaults to 26379. Conflicting
    values, other schemes and query options raise ``ValueError`` rather than be guessed.
    """
    nodes: list[tuple[str, int]] = []
    found: dict[str, Any] = {}
    for part in url.split(";"):
        part = part.strip()
        if not part:
            continue
        where = redact_url(part)
        parsed = urlsplit(part)
        if parsed.scheme != "sentinel":
            raise ValueError(f"{where}: every node of a sentinel URL starts with sentinel://")
        if parsed.query or parsed.fragment:
            raise ValueError(f"{where}: sentinel URLs take no query options")
        try:
            port = parsed.port or DEFAULT_SENTINEL_PORT
        except ValueError:
            raise ValueError(f"{where}: invalid port") from None
        if not parsed.hostname:
            raise ValueError(f"{where}: no host")
        nodes.append((parsed.hostname, port))
        path = parsed.path.strip("/")
        if path and not path.isdigit():
            raise ValueError(f"{where}: the path must be a database number")
        for key, value in (("username", parsed.username), ("password", parsed.password),
                           ("db", int(path) if path else None)):
            if isinstance(value, str):
                value = unquote(value) or None
            if value is None:
                continue
            if found.setdefault(key, value) != value:
                raise ValueError(f"{redact_url(url)}: the nodes give different {key}s")
    if not nodes:
        raise ValueError(f"{redact_url(url)}: no sentinel in the URL")
    return SentinelURL(tuple(nodes), found.get("db", 0), found.get("username"),
                       found.get("password"))


__all__ = ["CLUSTER_SCHEMES", "ClusterClient", "RedisOptions", "SentinelURL", "connect",
           "parse_cluster_url", "parse_sentinel_url"]
