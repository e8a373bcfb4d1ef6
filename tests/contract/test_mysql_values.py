"""MySQL only: every value the store binds reaches the tables as it was given, whichever
client library binds it, whatever the session's SQL mode (NO_BACKSLASH_ESCAPES: a quote
doubled, a backslash a backslash): names, descriptions, definitions, owners and task ids
with quotes, backslashes, NUL, 4-byte UTF-8 and long text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import cast

import pytest

from beat_claims.enums import Origin
from beat_claims.runs import Owner
from beat_claims.stores.base import (
    CheckVerdict,
    ClaimPlan,
    DefinitionWrite,
    EntrySeed,
    SendAtOnce,
)
from beat_claims.stores.mysql import MySQLStore

from .backend_mysql import BACKEND as backend_mysql
from .backend_mysql import INSTALLED_DRIVERS, with_driver

#: Values an escaping must carry whole (each ends a string literal the naive way).
NASTY = ["it's", "back\\slash", "back\\", "\\'; DROP TABLE x; -- ", "nul\x00byte",
         "\"dq\"", "\N{PILE OF POO} four bytes", "\x1a ctrl-z \r\n", "%s %% %d", "?",
         "\\\\'\\'", "x" * 900]


@pytest.fixture(params=[(d, mode) for d in INSTALLED_DRIVERS
                        for mode in ("", "NO_BACKSLASH_ESCAPES")],
                ids=lambda p: f"{p[0]}-{p[1] or 'default'}")
def store(request: pytest.FixtureRequest) -> Iterator[MySQLStore]:
    driver, mode = request.param
    with backend_mysql.open(request, 100) as opened, with_driver(
            cast(MySQLStore, opened), driver) as chosen:
        chosen.now()
        if mode:  # (as a server's or an operator's setting would leave the session)
            chosen._statement(chosen._db, f"SET SESSION sql_mode = '{mode}'")
        yield chosen


def test_values_with_quotes_backslashes_and_nul_are_stored_as_given(
        store: MySQLStore) -> None:
    names = [f"entry {v}" for v in NASTY]
    owner = Owner(id="own'er\\\x00", host="h'\\ost", pid=1, started_at=1.0)
    states = store.register([EntrySeed(name, f"every 1s ({v})")
                             for name, v in zip(names, NASTY)])
    assert sorted(states) == sorted(names)
    results = store.claim(owner, [ClaimPlan(name, state, (state.anchor + 1000,),
                                            send=SendAtOnce((f"t-{name}",)))
                                  for name, state in states.items()])
    assert [c.verdict for r in results for c in r.checked] == [CheckVerdict.SEND] * len(names)
    writes = [DefinitionWrite(name, json.dumps({"task": "t", "args": [v], "kwargs": {v: v}}),
                              0, Origin.API, f"by {v}"[:200])
              for name, v in zip(names, NASTY)]
    written = store.write_definitions(writes)
    assert all(r.status.value == "ok" for r in written), written
    for driver in INSTALLED_DRIVERS:
        with with_driver(store, driver) as reader:
            assert [e.name for e in reader.entries(names)] == names
            assert [h[0].task_id for h in (reader.history(n) for n in names)] == [
                f"t-{n}" for n in names]
            assert [h[0].owner for h in (reader.history(n) for n in names)] == [
                owner.id] * len(names)
            defs = {d.name: d for d in reader.definitions(names)}
            assert [defs[n].changed_by for n in names] == [f"by {v}"[:200] for v in NASTY]
            assert [defs[n].definition for n in names] == [w.definition for w in writes]
