"""PostgreSQL only: ``beat_claims_url = "django"`` (or ``"django:ALIAS"``) uses the connection
settings of that Django database (settings configured in this process, as by
tests/djangosite), with a connection of the store's own; a database that is not PostgreSQL
is refused naming the setting."""

from __future__ import annotations

import contextlib
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import override_settings
from psycopg import sql

from beat_claims.settings import Settings
from beat_claims.stores import open_store
from beat_claims.stores.base import ClaimStatus, StoreConfigurationError
from beat_claims.stores.postgres import PostgresStore

from .backend_postgres import HOST, PORT, USER, admin, database
from .helpers import A, claim, register

SECRET = "not-for-logs"


@contextlib.contextmanager
def databases(request: pytest.FixtureRequest) -> Iterator[str]:
    """Django's DATABASES pointing at the session's database (and a few others)."""
    name = database(request)
    postgres: dict[str, Any] = {
        "ENGINE": "django.db.backends.postgresql", "NAME": name, "USER": USER,
        "HOST": HOST, "PORT": PORT, "PASSWORD": SECRET,
        # Django's own options are not libpq's: they are left out.
        "OPTIONS": {"sslmode": "disable", "isolation_level": 1, "server_side_binding": True}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding setting DATABASES can lead to ..."
        with override_settings(DATABASES={
                "default": postgres,
                "gis": {**postgres, "ENGINE": "django.contrib.gis.db.backends.postgis"},
                "legacy": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
                "nameless": {**postgres, "NAME": ""}}):
            yield name


@contextlib.contextmanager
def dropped(store: PostgresStore) -> Iterator[PostgresStore]:
    try:
        yield store
    finally:
        store.close()
        admin().execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
            sql.Identifier(store.schema)))


def test_django_uses_the_default_database(request: pytest.FixtureRequest) -> None:
    with databases(request) as name:
        store = PostgresStore.from_url("django", f"bc-django-{uuid.uuid4().hex[:8]}")
        assert store.description.startswith(
            f"django (dbname={name} user={USER} password=*** host={HOST} port={PORT}")
        assert SECRET not in store.description
        with dropped(store):
            assert store.heartbeat(A, 10).epoch
            state = register(store, "e")["e"]
            assert claim(store, A, state, state.anchor + 1000).status is ClaimStatus.OK
            [(schemas,)] = admin().execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname = %s", [store.schema]
            ).fetchall()
            assert schemas == 1  # in the database Django names


def test_open_store_builds_it_from_django_alias(request: pytest.FixtureRequest) -> None:
    with databases(request):
        store = open_store(Settings(url="django:gis", key_prefix="bc-django-alias"),
                           timeout=2.0)
        assert isinstance(store, PostgresStore)
        assert store.description.startswith("django:gis (dbname=")
        assert store.schema == "bc_django_alias" and store.timeout == 2.0
        with dropped(store):
            assert store.entries() == []


@pytest.mark.parametrize(("url", "why"), [
    ("django:legacy", "not PostgreSQL"),
    ("django:missing", "has no 'missing'"),
    ("django:nameless", "has no NAME"),
    ("django://default", "'django:ALIAS'"),
])
def test_a_django_database_that_cannot_be_the_store_is_refused_naming_the_setting(
        request: pytest.FixtureRequest, url: str, why: str) -> None:
    with databases(request), pytest.raises(StoreConfigurationError) as refused:
        PostgresStore.from_url(url)
    assert "beat_claims_url" in str(refused.value) and why in str(refused.value)


def test_the_test_sites_own_settings_resolve_without_connecting() -> None:
    """tests/djangosite as configured (the local PostgreSQL, or SQLite with
    BC_DJANGO_DB=sqlite): resolved, not connected (nothing is written to that database)."""
    default = django_settings.DATABASES["default"]
    if "postgresql" not in default["ENGINE"]:
        with pytest.raises(StoreConfigurationError, match="not PostgreSQL"):
            PostgresStore.from_url("django")
        return
    store = PostgresStore.from_url("django")
    assert f"(dbname={default['NAME']} " in store.description
    assert store.schema == "beat_claims"
