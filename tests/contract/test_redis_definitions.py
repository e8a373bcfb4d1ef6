"""Redis only: a definition write whose reply is lost (a real TCP proxy in front of a real
redis-server throws the reply away after the server ran the script) is written once: the
same write again, with its change id, answers what the first did and changes nothing."""

from __future__ import annotations

from beat_claims.stores.redis import RedisStore, function_name

from ..conftest import RedisServer
from ..faults import proxy
from .helpers import a_definition_write_whose_reply_is_lost_is_written_once


def test_a_definition_write_whose_reply_was_lost_is_written_once(server: RedisServer) -> None:
    store = RedisStore.from_url(server.url, "bc-lost-definitions")
    with proxy(server.port) as p:
        lossy = RedisStore.from_url(p.url(), store.prefix)
        try:
            a_definition_write_whose_reply_is_lost_is_written_once(
                store, lossy, p, function_name("define"))
        finally:
            lossy.close()
            store.close()
