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
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.connection import ConnectionPool, parse_url
from redis.retry import Retry
from redis.sentinel import Sentinel

DEFAULT_SENTINEL_PORT = 26379

#: Client options beat-claims owns: a URL's query cannot loosen them (the store's URL is
#: often the broker's, whose query may carry settings meant for the broker).
_OWNED = ("socket_timeout", "socket_connect_timeout", "decode_responses", "retry",
          "retry_on_timeout", "retry_on_error")


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


def connect(url: str, options: RedisOptions = RedisOptions()) -> redis.Redis:
    """A client for ``url`` with bounded waits and no automatic retries (module docstring).

    ``redis://``, ``rediss://`` and ``unix://`` URLs are read as redis-py reads them (ACL
    user and password, db in the path, query options such as ``ssl_cert_reqs``), except
    that the timeouts and retries are always those of ``options``. ``sentinel://`` URLs
    are read as Celery's broker reads them (``sentinel://[user:password@]h1:26379;
    sentinel://h2:26379/0``); the client follows ``options.sentinel_master`` across
    failovers. Nothing is connected until the first command.
    """
    common: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": options.timeout,
        "socket_connect_timeout": options.connect_timeout,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 30,
    }
    if not url.startswith("sentinel://"):
        # Not Redis.from_url: there the URL's query wins over the arguments given.
        kwargs = {key: value for key, value in parse_url(url).items() if key not in _OWNED}
        pool = ConnectionPool(**{**kwargs, **common})
        return redis.Redis.from_pool(pool)  # type: ignore[attr-defined]  # not in types-redis
    if not options.sentinel_master:
        raise ValueError(f"{redact(url)}: a sentinel:// URL needs the master's name"
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
                               username=parsed.username, password=parsed.password, **common)


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
        where = redact(part)
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
                raise ValueError(f"{redact(url)}: the nodes give different {key}s")
    if not nodes:
        raise ValueError(f"{redact(url)}: no sentinel in the URL")
    return SentinelURL(tuple(nodes), found.get("db", 0), found.get("username"),
                       found.get("password"))


_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#;]*", re.IGNORECASE)


def redact(url: str) -> str:
    """``url`` with every password replaced by ``***``, for logs and error messages.

    Never raises, and masks too much rather than too little on a malformed URL.
    """
    out = []
    for part in url.split(";"):
        scheme, sep, rest = part.partition("://")
        if sep:
            authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
            end = authority.rfind("@")
            if end < 0 and ":" in rest and "@" in rest:
                end = rest.rfind("@")  # an unquoted / ? or # in the password
            userinfo = rest[:end] if end >= 0 else ""
            if ":" in userinfo:
                rest = userinfo.split(":", 1)[0] + ":***" + rest[end:]
            part = scheme + sep + rest
        out.append(_QUERY_PASSWORD.sub(r"\1***", part))
    return ";".join(out)


__all__ = ["RedisOptions", "SentinelURL", "connect", "parse_sentinel_url", "redact"]
