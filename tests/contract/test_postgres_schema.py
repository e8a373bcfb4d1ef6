"""PostgreSQL only: the store's schema. Created on first use and carrying a version; a
schema written by a newer version is refused; a user who may not create it gets an error
naming the setting, and one who may only read and write a schema an administrator created
uses it without any DDL; beats starting together install it once."""

from __future__ import annotations

import multiprocessing
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from beat_claims.stores.base import (
    ClaimStatus,
    EntrySeed,
    StoreConfigurationError,
    StoreError,
)
from beat_claims.stores.postgres import LAYOUT, PostgresStore, schema_name

from .backend_postgres import HOST, PORT, address, admin, database, fresh_store
from .helpers import (
    A,
    claim,
    migrated_entry_is_indexed_by_the_rebuild_sweep,
    migrated_entry_takes_a_definition,
    register,
)


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> Iterator[PostgresStore]:
    with fresh_store(request) as store:
        yield store


@pytest.fixture
def role(request: pytest.FixtureRequest) -> Iterator[str]:
    """A login role with no privilege of its own on the session's database."""
    database(request)
    name = f"bc_role_{uuid.uuid4().hex[:8]}"
    admin().execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    yield name
    admin().execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
    admin().execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _as(role: str, store: PostgresStore) -> PostgresStore:
    dbname = address(store).rsplit("/", 1)[1]
    return PostgresStore.from_url(f"postgresql://{role}@{HOST}:{PORT}/{dbname}", store.prefix)


def test_the_schema_is_created_on_first_use_with_its_version(pg: PostgresStore) -> None:
    assert admin().execute("SELECT to_regnamespace(%s)", [pg.schema]).fetchone() == (None,)
    register(pg, "e")
    [(version,)] = admin().execute(
        sql.SQL("SELECT version FROM {}.version").format(sql.Identifier(pg.schema))).fetchall()
    assert version == LAYOUT


def test_a_schema_written_by_a_newer_version_is_refused_naming_the_setting(
        pg: PostgresStore) -> None:
    register(pg, "e")
    admin().execute(sql.SQL("UPDATE {}.version SET version = %s").format(
        sql.Identifier(pg.schema)), [LAYOUT + 1])
    newer = PostgresStore.from_url(address(pg), pg.prefix)
    with pytest.raises(StoreConfigurationError) as refused:
        newer.heartbeat(A, 10)
    message = str(refused.value)
    assert "beat_claims_url" in message and "newer" in message and pg.schema in message
    # Nothing was changed by the refusal.
    [(version,)] = admin().execute(
        sql.SQL("SELECT version FROM {}.version").format(sql.Identifier(pg.schema))).fetchall()
    assert version == LAYOUT + 1


def test_a_user_who_cannot_create_the_schema_is_refused_at_its_first_call(
        pg: PostgresStore, role: str) -> None:
    store = _as(role, pg)
    with pytest.raises(StoreConfigurationError) as refused:
        store.heartbeat(A, 10)
    message = str(refused.value)
    assert "beat_claims_url" in message and role in message and pg.schema in message
    assert "InsufficientPrivilege" in message


def test_a_schema_an_administrator_created_is_used_without_ddl(pg: PostgresStore,
                                                               role: str) -> None:
    register(pg, "e")  # installed by the administrator
    ident, who = sql.Identifier(pg.schema), sql.Identifier(role)
    for grant in ("GRANT USAGE ON SCHEMA {} TO {}",
                  "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}",
                  "GRANT USAGE ON ALL SEQUENCES IN SCHEMA {} TO {}"):
        admin().execute(sql.SQL(grant).format(ident, who))
    store = _as(role, pg)
    assert store.heartbeat(A, 10).epoch
    state = register(store, "e", "f")
    assert claim(store, A, state["f"], state["f"].anchor + 1000, entry="f").status is (
        ClaimStatus.OK)
    store.close()


def test_a_schema_of_layout_2_is_migrated_and_keeps_the_last_pause_from_then_on(
        pg: PostgresStore) -> None:
    """Layout 3 keeps when the last pause began (last_paused_at) after its resume; pause()
    and resume() answer it (another return type: dropped and installed again)."""
    register(pg, "e")
    paused = pg.pause("e", "alice@ops", "billing is down")
    assert paused is not None and paused.paused is not None
    pg.close()
    s = sql.Identifier(pg.schema)
    # As layout 2 left it: no column, pause() and resume() without it, version 2.
    admin().execute(sql.SQL("ALTER TABLE {}.entries DROP COLUMN last_paused_at").format(s))
    for function in ("pause(text, text, text)", "resume(text, text)"):
        admin().execute(sql.SQL("DROP FUNCTION {}." + function).format(s))
    for function, args in (("pause", "p_entry text, p_by text, p_note text"),
                           ("resume", "p_entry text, p_by text")):
        admin().execute(sql.SQL(
            "CREATE FUNCTION {}." + function + "(" + args + ") RETURNS TABLE (o_name text,"
            " o_description text, o_anchor bigint, o_checkpoint bigint, o_token bigint,"
            " o_paused_at bigint, o_paused_by text, o_paused_note text, o_resumed_by text,"
            " o_resumed_at bigint) LANGUAGE sql AS $$ SELECT NULL::text, NULL::text,"
            " NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::text, NULL::text,"
            " NULL::text, NULL::bigint WHERE false $$").format(s))
    admin().execute(sql.SQL("UPDATE {}.version SET version = 2").format(s))
    store = PostgresStore.from_url(address(pg), pg.prefix)
    try:
        [record] = store.entries(["e"])  # its pause is kept; no last pause yet
        assert (record.paused, record.last_paused_at) == (paused.paused, None)
        [(version,)] = admin().execute(sql.SQL("SELECT version FROM {}.version").format(
            s)).fetchall()
        assert version == LAYOUT >= 3
        resumed = store.resume("e", "bob@ops")
        assert resumed is not None and resumed.resumed_at is not None
        assert (resumed.paused, resumed.last_paused_at) == (None, paused.paused.at)
        again = store.pause("e", "carol@ops")
        assert again is not None and again.last_paused_at == paused.paused.at
    finally:
        store.close()


def test_a_schema_of_layout_5_is_migrated_and_records_registrants_from_then_on(
        pg: PostgresStore) -> None:
    """Layout 6 keeps an entry's registrants and history horizon: NULL for the entries
    registered before (none recorded: judged as before), recorded from then on."""
    anchor = register(pg, "e")["e"].anchor
    pg.close()
    s = sql.Identifier(pg.schema)
    # As layout 5 left it: neither column, version 5.
    admin().execute(sql.SQL("ALTER TABLE {}.entries DROP COLUMN registrants,"
                            " DROP COLUMN horizon").format(s))
    admin().execute(sql.SQL("UPDATE {}.version SET version = 5").format(s))
    store = PostgresStore.from_url(address(pg), pg.prefix)
    try:
        [record] = store.entries(["e"])
        assert (record.anchor, record.registrants, record.history_horizon) == (
            anchor, None, None)
        [(version,)] = admin().execute(sql.SQL("SELECT version FROM {}.version").format(
            s)).fetchall()
        assert version == LAYOUT >= 6
        store.heartbeat(A, 60)
        store.register([EntrySeed("e")], A)
        [record] = store.entries(["e"])
        assert record.anchor == anchor and record.registrants is not None
        assert [r.owner for r in record.registrants] == [A.id]
        assert store.forget(["e"]) == []  # a live beat registered it
    finally:
        store.close()


def test_a_schema_of_layout_6_is_migrated_and_its_entries_get_definitions_from_then_on(
        pg: PostgresStore) -> None:
    """Layout 7 keeps an entry's definition, version and place in the change log: the
    entries registered before have none (version 0), and can be given one; forget() keeps
    an entry with a live definition."""
    state = register(pg, "e")["e"]
    claim(pg, A, state, state.anchor + 1000)
    pg.close()
    s = sql.Identifier(pg.schema)
    # As layout 6 left it: no definition columns (their indexes go with them), no change
    # log, no define(), version 6.
    admin().execute(sql.SQL("DROP TRIGGER entries_unlog ON {}.entries").format(s))
    admin().execute(sql.SQL(
        "ALTER TABLE {}.entries DROP COLUMN definition, DROP COLUMN version,"
        " DROP COLUMN origin, DROP COLUMN changed_by, DROP COLUMN changed_at,"
        " DROP COLUMN change_id, DROP COLUMN changed_seq").format(s))
    admin().execute(sql.SQL("DROP TABLE {}.changes").format(s))
    admin().execute(sql.SQL("DROP FUNCTION {}.define(jsonb, integer, bigint)").format(s))
    admin().execute(sql.SQL("DROP FUNCTION {}.unlog()").format(s))
    migrated_from(pg, 6, lambda store: migrated_entry_takes_a_definition(store, state))


def test_a_schema_of_layout_8_is_migrated_and_its_entries_wait_for_the_rebuild_sweep(
        pg: PostgresStore) -> None:
    """Layout 9 keeps the due index (next_due): the entries registered before have none
    (unindexed: the rebuild sweep's pass finds them), and are indexed from then on."""
    state = register(pg, "e")["e"]
    claim(pg, A, state, state.anchor + 1000)
    pg.close()
    s = sql.Identifier(pg.schema)
    # As layout 8 left it: no next_due column (its indexes go with it), no index().
    admin().execute(sql.SQL("ALTER TABLE {}.entries DROP COLUMN next_due").format(s))
    admin().execute(sql.SQL("DROP FUNCTION {}.index(jsonb)").format(s))
    migrated_from(pg, 8, lambda store: migrated_entry_is_indexed_by_the_rebuild_sweep(store, state))


def migrated_from(pg: PostgresStore, layout: int, holds: Callable[[PostgresStore], None]
                  ) -> None:
    """The schema (its tables and functions as of ``layout``) marked of that layout, opened
    by a store: ``holds`` of it, and the schema is of this layout."""
    s = sql.Identifier(pg.schema)
    admin().execute(sql.SQL("UPDATE {}.version SET version = %s").format(s), [layout])
    store = PostgresStore.from_url(address(pg), pg.prefix)
    try:
        holds(store)
        [(version,)] = admin().execute(sql.SQL("SELECT version FROM {}.version").format(
            s)).fetchall()
        assert version == LAYOUT > layout
    finally:
        store.close()


def _install(url: str, prefix: str, barrier: Any, out: Any) -> None:
    try:
        store = PostgresStore.from_url(url, prefix)
        barrier.wait(30)
        out.put(register(store, "e")["e"].anchor)
    except Exception as exc:
        out.put(repr(exc))


def test_beats_starting_together_install_the_schema_once(pg: PostgresStore) -> None:
    ctx = multiprocessing.get_context("fork")
    n = 6
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_install, args=(address(pg), pg.prefix, barrier, out))
             for _ in range(n)]
    for p in procs:
        p.start()
    try:
        answers = [out.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
    assert all(isinstance(anchor, int) for anchor in answers), answers
    assert set(answers) == {register(pg, "e")["e"].anchor}  # the first beat's anchor
    [(rows,)] = admin().execute(sql.SQL("SELECT count(*) FROM {}.version").format(
        sql.Identifier(pg.schema))).fetchall()
    assert rows == 1


def test_a_beat_that_waited_its_turn_to_install_leaves_a_schema_made_current_meanwhile(
        pg: PostgresStore) -> None:
    """Beats starting together read the schema's version before they take the install
    lock: one that read it missing (or older) and finds it current once it has the lock
    runs no DDL. Run again, the DDL takes the tables' strongest locks while beats that found
    the schema current use them: a beat's first registration deadlocked with it (seen under
    load). Here a beat is in the middle of a transaction on the entries table: the DDL run
    again waits for it (until its lock timeout); the install that found the schema current
    returns at once."""
    register(pg, "e")  # installed, and a beat uses it
    using = psycopg.connect(address(pg))  # (not autocommit: its transaction stays open)
    late = PostgresStore.from_url(address(pg), pg.prefix)
    try:
        using.execute(sql.SQL("SELECT count(*) FROM {}.entries").format(
            sql.Identifier(pg.schema)))
        conn = late._connection()  # (it read the version: current)
        conn.execute("SET lock_timeout = '2s'")
        with pytest.raises(StoreError, match="LockNotAvailable"):
            late._install(conn, again=True)  # the DDL again: it waits for the beat's locks
        late._install(conn, again=False)  # what a beat that read an older version runs
        using.rollback()
        assert register(late, "f")["f"].anchor > 0
    finally:
        using.close()
        late.close()


@pytest.mark.parametrize(("prefix", "schema"), [
    ("beat-claims", "beat_claims"),
    ("Beat.Claims:prod", "beat_claims_prod"),
    ("public", "bc_public"),
    ("pg_x", "bc_pg_x"),
    ("1st", "bc_1st"),
    ("---", "beat_claims"),
])
def test_schema_names(prefix: str, schema: str) -> None:
    assert schema_name(prefix) == schema


def test_a_long_prefix_gets_a_schema_name_of_at_most_63_bytes() -> None:
    long_a, long_b = "a" * 70 + "-one", "a" * 70 + "-two"
    assert len(schema_name(long_a)) == 63
    assert schema_name(long_a) != schema_name(long_b)


def test_the_description_names_the_schema_and_never_the_password() -> None:
    store = PostgresStore.from_url("postgresql://alice:s3cret@db.example:6543/app?sslmode=require",
                                   "beat-claims")
    assert store.description == ("postgresql://alice:***@db.example:6543/app?sslmode=require"
                                 " (schema 'beat_claims')")
    assert "s3cret" not in store.description


def test_a_url_that_is_not_one_is_refused_naming_the_setting() -> None:
    with pytest.raises(StoreConfigurationError, match="beat_claims_url"):
        PostgresStore.from_url("postgresql://host/db?nosuchoption=1")
