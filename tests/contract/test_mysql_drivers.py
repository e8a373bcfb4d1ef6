"""MySQL only: the store's client library is mysqlclient when it is installed, else PyMySQL;
``?driver=`` in the URL chooses one, and a name it does not know is refused at start,
naming the setting. Whichever writes, either reads the same records."""

from __future__ import annotations

import decimal
import importlib.util
from collections.abc import Iterator
from typing import cast

import pytest

from beat_claims.stores.base import (
    CheckVerdict,
    ClaimPlan,
    EntrySeed,
    SendAtOnce,
    Store,
    StoreConfigurationError,
)
from beat_claims.stores.mysql import MySQLStore, parse_url
from beat_claims.stores.mysql_driver import _bound, choose

from .backend_mysql import BACKEND as backend_mysql
from .backend_mysql import INSTALLED_DRIVERS, with_driver
from .helpers import A


@pytest.fixture
def mysql_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with backend_mysql.open(request, 100) as store:
        yield store


def test_the_store_uses_mysqlclient_when_it_is_installed_else_pymysql() -> None:
    expected = "mysqlclient" if importlib.util.find_spec("MySQLdb") else "pymysql"
    assert choose().name == expected
    assert MySQLStore(parse_url("mysql://root@127.0.0.1:3306/db")).driver.name == expected


@pytest.mark.parametrize("driver", INSTALLED_DRIVERS)
def test_the_url_names_the_client_library(driver: str) -> None:
    params = parse_url(f"mysql://root@127.0.0.1:3306/db?driver={driver}")
    assert MySQLStore(params).driver.name == driver


def test_a_client_library_it_does_not_know_is_refused_at_start_naming_the_setting() -> None:
    with pytest.raises(StoreConfigurationError, match=r"beat_claims_url.*driver='oracle'"):
        MySQLStore.from_url("mysql://root@127.0.0.1:3306/db?driver=oracle")


def test_what_one_library_writes_the_other_reads_the_same(mysql_store: Store) -> None:
    """Names beyond ASCII, a claim checked at once and its sent mark written through the
    store's library: the entries, runs and history read through each library installed
    are the same."""
    names = ["caf\N{LATIN SMALL LETTER E WITH ACUTE}", "\N{HOT BEVERAGE} tea", "plain"]
    states = mysql_store.register([EntrySeed(name, f"every 1s ({name})") for name in names])
    results = mysql_store.claim(A, [ClaimPlan(name, state, (state.anchor + 1000,),
                                              send=SendAtOnce((f"t-{name}",)))
                                    for name, state in states.items()])
    assert [c.verdict for r in results for c in r.checked] == [CheckVerdict.SEND] * 3
    assert mysql_store.record_sent(A, [c for r in results for c in r.claims]) == 3
    seen = {}
    for driver in INSTALLED_DRIVERS:
        with with_driver(cast(MySQLStore, mysql_store), driver) as store:
            seen[driver] = (store.entries(names), [store.history(name) for name in names])
    assert all(found == seen[INSTALLED_DRIVERS[0]] for found in seen.values()), seen
    entries, histories = seen[INSTALLED_DRIVERS[0]]
    assert [e.name for e in entries] == names
    assert [[run.task_id for run in history] for history in histories] == [
        [f"t-{name}"] for name in names], histories


def test_mysqlclients_statements_are_bound_as_its_own_mogrify_binds_them(
        request: pytest.FixtureRequest) -> None:
    """The store binds mysqlclient's values itself (faster than its ``mogrify``): the same
    text, for every kind of value the store sends and a few it does not."""
    if "mysqlclient" not in INSTALLED_DRIVERS:
        pytest.skip("mysqlclient is not installed")
    with backend_mysql.open(request, 100) as opened, with_driver(
            cast(MySQLStore, opened), "mysqlclient") as store:
        store.now()
        conn = store._db
        values = (None, 0, -7, 2 ** 62, True, 1.5, decimal.Decimal("12.345"),
                  b"", b"plain", b"it's \\ \x00 \n \r \x1a \"",
                  "caf\N{LATIN SMALL LETTER E WITH ACUTE}".encode(),
                  "text 'quoted' \\ \N{HOT BEVERAGE}", "")
        statement = "SELECT " + ", ".join(["%s"] * len(values)) + " FROM DUAL WHERE 1 %% 2"
        assert _bound(conn, statement, values) == conn.cursor().mogrify(
            statement, values).encode(conn.encoding)
        assert _bound(conn, "SELECT 1 %% 2", ()) == b"SELECT 1 %% 2"
        # (bytes that are no UTF-8, which its mogrify cannot show: the server reads them
        # back as they were)
        raw = (b"\xff\xfe not UTF-8 ' \\", b"\x80", "\udcff".encode("utf-8", "surrogateescape"))
        cur = conn.cursor()
        cur.execute(_bound(conn, "SELECT %s, %s, %s", raw))
        assert cur.fetchall() == (raw,)
