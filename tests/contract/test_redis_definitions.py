"""Redis only: a definition write whose reply is lost (a real TCP proxy in front of a real
redis-server throws the reply away after the server ran the script) is written once: the
same write again, with its change id, answers what the first did and changes nothing; a
claim whose reply is lost wrote the entry's next due instant with its checkpoint, once."""

from __future__ import annotations

import pytest

from beat_claims.stores.redis import RedisStore, function_name

from ..conftest import RedisServer
from ..faults import proxy
from .helpers import (
    a_claim_whose_reply_is_lost_wrote_its_next_due_once,
    a_definition_write_whose_reply_is_lost_is_written_once,
)

#: Each write whose reply is lost: what must hold, and the script it calls.
LOST = {"definition write": (a_definition_write_whose_reply_is_lost_is_written_once, "define"),
        "claim's next due": (a_claim_whose_reply_is_lost_wrote_its_next_due_once, "claim")}


@pytest.mark.parametrize("write", sorted(LOST))
def test_a_write_whose_reply_was_lost_is_written_once(server: RedisServer, write: str) -> None:
    holds, script = LOST[write]
    store = RedisStore.from_url(server.url, "bc-lost-definitions")
    with proxy(server.port) as p:
        lossy = RedisStore.from_url(p.url(), store.prefix)
        try:
            holds(store, lossy, p, function_name(script))
        finally:
            lossy.close()
            store.close()
