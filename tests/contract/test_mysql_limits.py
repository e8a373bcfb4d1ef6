"""MySQL only: what the tables cannot hold is one item's failure, not the whole call's.

Names and ids are ``VARBINARY(1024)`` (InnoDB's index key limit): a longer name, which the
other stores keep, is refused by the server (STRICT_TRANS_TABLES). That entry alone fails
(logged); the other items of the call are written, as a record that cannot be read is
answered alone. (A definition write refuses such a name before it reaches the store.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from beat_claims.stores.base import EntrySeed, Store

from .backend_mysql import BACKEND as backend_mysql

#: One byte more than a name column holds (4-byte UTF-8 characters).
TOO_LONG = "\N{GRINNING FACE}" * 256 + "x"


@pytest.fixture
def mysql_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with backend_mysql.open(request, 100) as store:
        yield store


def test_a_name_longer_than_the_column_fails_alone_in_a_register(mysql_store: Store) -> None:
    at_limit = "\N{GRINNING FACE}" * 256
    states = mysql_store.register([EntrySeed("a", "every 1s"), EntrySeed(TOO_LONG, "long"),
                                   EntrySeed(at_limit, "at the limit")])
    assert sorted(states) == sorted(["a", at_limit]), sorted(map(len, states))
    assert [e.name for e in mysql_store.entries(["a", TOO_LONG, at_limit])] == ["a", at_limit]

