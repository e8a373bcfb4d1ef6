"""Stores: the contract (``base``) and its backends, built in one place from the settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..urls import redact_text, redact_url
from .base import Store, StoreConfigurationError, StoreError

if TYPE_CHECKING:
    from ..settings import Settings

#: URL schemes of each backend.
REDIS_SCHEMES = ("redis", "rediss", "unix", "sentinel", "redis+cluster", "rediss+cluster")
SQLITE_SCHEMES = ("sqlite",)
POSTGRES_SCHEMES = ("postgresql", "postgres")
MYSQL_SCHEMES = ("mysql", "mariadb")
#: ``django`` or ``django:ALIAS``: the PostgreSQL, MySQL or MariaDB database of a Django
#: connection.
DJANGO_SCHEME = "django"


def _django_engine(url: str) -> str:
    """The store a ``django`` / ``django:ALIAS`` URL names: ``mysql`` when that Django
    database is MySQL or MariaDB, else ``postgres`` (which says what it cannot open)."""
    alias = url.partition(":")[2] or "default"
    try:
        from django.conf import settings as django_settings

        config = (getattr(django_settings, "DATABASES", {}) or {}).get(alias) or {}
    except Exception:  # Django missing or not configured: the PostgreSQL store says so
        return "postgres"
    return "mysql" if "mysql" in str(config.get("ENGINE", "")) else "postgres"


def open_store(settings: Settings, timeout: float | None = None) -> Store:
    """The store ``settings`` name, for a beat, a worker, the CLI or the Django app.

    ``timeout`` bounds each command (default: the heartbeat interval, at least 1 s): a
    caller that must answer quickly (a web page, a check) passes less.
    """
    url = settings.url
    scheme = url.split("://", 1)[0].lower() if "://" in url else url.split(":", 1)[0]
    seconds = timeout if timeout is not None else max(1.0, settings.heartbeat_interval)
    if scheme in SQLITE_SCHEMES:
        from .sqlite import SQLiteStore

        return SQLiteStore.from_url(url, settings.key_prefix, settings.history_limit, seconds)
    if scheme == DJANGO_SCHEME:
        scheme = "mysql" if _django_engine(url) == "mysql" else "postgresql"
    if scheme in MYSQL_SCHEMES:
        from .mysql import MySQLStore

        return MySQLStore.from_url(url, settings.key_prefix, settings.history_limit, seconds)
    if scheme in POSTGRES_SCHEMES:
        from .postgres import PostgresStore

        return PostgresStore.from_url(url, settings.key_prefix, settings.history_limit,
                                      seconds)
    if scheme in REDIS_SCHEMES:
        from .redis import RedisStore
        from .redis_client import RedisOptions

        options = RedisOptions(timeout=seconds, connect_timeout=min(seconds, 2.0),
                               sentinel_master=settings.sentinel_master)
        try:
            return RedisStore.from_url(url, settings.key_prefix,
                                       settings.history_limit, options)
        except ValueError as exc:
            # (a client's message may quote pieces of a URL it misread)
            raise StoreConfigurationError(f"beat_claims_url: {redact_text(str(exc), url)}"
                                          ) from None
    schemes = REDIS_SCHEMES + SQLITE_SCHEMES + POSTGRES_SCHEMES + MYSQL_SCHEMES
    raise StoreConfigurationError(
        f"beat_claims_url={redact_url(url)!r}: unknown store (the URL must start with"
        f" {', '.join(s + '://' for s in schemes)},"
        f" or be {DJANGO_SCHEME!r} or '{DJANGO_SCHEME}:ALIAS')")


__all__ = ["Store", "StoreConfigurationError", "StoreError", "open_store"]
