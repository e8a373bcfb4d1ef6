"""MySQL only: ``beat_claims_url = "django"`` (or ``"django:ALIAS"``) uses the connection
settings of that Django database when its ENGINE is MySQL or MariaDB, with a connection of
the store's own and its own tables; the password never shows."""

from __future__ import annotations

import contextlib
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from beat_claims.settings import Settings
from beat_claims.stores import open_store
from beat_claims.stores.base import ClaimStatus, StoreConfigurationError
from beat_claims.stores.mysql import MySQLStore
from beat_claims.stores.postgres import PostgresStore

from .backend_mysql import HOST, PORT, database, sql
from .backend_postgres import HOST as PG_HOST
from .backend_postgres import PORT as PG_PORT
from .backend_postgres import USER as PG_USER
from .backend_postgres import admin as pg_admin
from .backend_postgres import database as pg_database
from .helpers import A, claim, register

SECRET = "not-for-logs"


@contextlib.contextmanager
def databases(request: pytest.FixtureRequest) -> Iterator[str]:
    """Django's DATABASES: ``shop`` the session's MySQL database (as a user of its own, with
    a password), ``default`` PostgreSQL, ``nameless`` MySQL without a NAME."""
    name = database(request)
    user = f"bc_django_{uuid.uuid4().hex[:8]}"
    sql(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{SECRET}'")
    sql(f"GRANT ALL ON `{name}`.* TO '{user}'@'%'")
    mysql: dict[str, Any] = {
        "ENGINE": "django.db.backends.mysql", "NAME": name, "USER": user,
        "PASSWORD": SECRET, "HOST": HOST, "PORT": str(PORT),
        "OPTIONS": {"charset": "utf8mb4", "init_command": "SET sql_mode='STRICT_ALL_TABLES'"}}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding setting DATABASES can lead to ..."
            with override_settings(DATABASES={
                    "default": {"ENGINE": "django.db.backends.postgresql", "NAME": "x"},
                    "shop": mysql, "nameless": {**mysql, "NAME": ""}}):
                yield name
    finally:
        sql(f"DROP USER IF EXISTS '{user}'@'%'")


def assert_tables_in(name: str, prefix: str) -> None:
    """The store's tables of ``prefix`` are in the database ``name``."""
    with contextlib.closing(__import__("pymysql").connect(
            host=HOST, port=PORT, user="root", database=name)) as conn, conn.cursor() as cur:
        cur.execute("SHOW TABLES LIKE %s", (f"{prefix}\\_runs",))
        assert cur.fetchall(), f"the store's tables are not in the database {name}"


def drop_tables(prefix: str) -> None:
    for table in ("meta", "entries", "runs", "owners", "tasks", "workers"):
        sql(f"DROP TABLE IF EXISTS `{prefix}_{table}`")


def test_open_store_builds_the_mysql_store_from_a_django_alias(
        request: pytest.FixtureRequest) -> None:
    prefix = f"bc_django_{uuid.uuid4().hex[:8]}"
    with databases(request) as name:
        store = open_store(Settings(url="django:shop", key_prefix=prefix), timeout=2.0)
        try:
            assert isinstance(store, MySQLStore)
            assert store.description.startswith(f"django:shop (mysql://{HOST}:{PORT}/{name}")
            assert SECRET not in store.description and store.timeout == 2.0
            assert store.heartbeat(A, 10).epoch
            state = register(store, "e")["e"]
            assert claim(store, A, state, state.anchor + 1000).status is ClaimStatus.OK
            assert_tables_in(name, prefix)
        finally:
            store.close()
            drop_tables(prefix)


def test_a_django_alias_of_postgresql_still_opens_the_postgresql_store(
        request: pytest.FixtureRequest) -> None:
    with databases(request), override_settings(DATABASES={"default": {
            "ENGINE": "django.db.backends.postgresql", "NAME": pg_database(request),
            "USER": PG_USER, "HOST": PG_HOST, "PORT": PG_PORT}}):
        store = open_store(Settings(url="django", key_prefix="bc-django-pg"), timeout=2.0)
        try:
            assert isinstance(store, PostgresStore), type(store)
        finally:
            store.close()
            pg_admin().execute(f'DROP SCHEMA IF EXISTS "{store.schema}" CASCADE')


def test_a_mysql_django_database_without_a_name_is_refused_naming_the_setting(
        request: pytest.FixtureRequest) -> None:
    with databases(request), pytest.raises(StoreConfigurationError) as refused:
        MySQLStore.from_url("django:nameless")
    assert "beat_claims_url" in str(refused.value) and "has no NAME" in str(refused.value)


def test_a_django_database_set_in_an_option_file_opens_the_store_from_that_file(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Django's documented way to keep MySQL credentials out of settings: NAME, USER and
    PASSWORD in a ``my.cnf`` that ``OPTIONS["read_default_file"]`` names. The store reads
    the same file (no NAME in the settings is then no error), the password never shows."""
    prefix = f"bc_django_{uuid.uuid4().hex[:8]}"
    with databases(request) as name:
        user = settings.DATABASES["shop"]["USER"]
        cnf = tmp_path / "my.cnf"
        cnf.write_text(f"[client]\ndatabase = {name}\nuser = {user}\npassword = {SECRET}\n"
                       f"host = {HOST}\nport = {PORT}\n")
        with override_settings(DATABASES={**settings.DATABASES, "from_file": {
                "ENGINE": "django.db.backends.mysql",
                "OPTIONS": {"read_default_file": str(cnf)}}}):
            store = open_store(Settings(url="django:from_file", key_prefix=prefix),
                               timeout=2.0)
        try:
            assert isinstance(store, MySQLStore)
            assert SECRET not in store.description, store.description
            state = register(store, "e")["e"]
            assert claim(store, A, state, state.anchor + 1000).status is ClaimStatus.OK
            assert store.database == name, store.database
            assert f"`{prefix}_runs`" in store.tables.runs
            assert_tables_in(name, prefix)
        finally:
            store.close()
            drop_tables(prefix)
