"""The store behind Redis Sentinel: ``sentinel://`` URLs, as Celery's broker takes them."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from beat_claims.settings import ConfigurationError, Settings

from .conftest import RedisServer, free_port
from .inprocess import make, make_app, occurrences_sent, run_for
from .processes import wait_for


@pytest.fixture
def sentinel(server: RedisServer, tmp_path: Path) -> Iterator[int]:
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\nsentinel monitor bcmaster 127.0.0.1"
                    f" {server.port} 1\nsentinel down-after-milliseconds bcmaster 5000\n")
    proc = subprocess.Popen([server.binary, str(conf), "--sentinel"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port, decode_responses=True)

        def master_known() -> bool:
            try:
                return bool(client.sentinel_get_master_addr_by_name("bcmaster"))
            except redis.RedisError:
                return False

        wait_for(master_known, 10, "the sentinel to know its master")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def test_scheduler_claims_through_sentinel(server: RedisServer, sentinel: int) -> None:
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1)}},
                   beat_claims_url=f"sentinel://127.0.0.1:{sentinel}/0",
                   beat_claims_sentinel_master="bcmaster")
    s = make(app)
    run_for(2.3, s)
    assert len(occurrences_sent(server)) >= 2
    assert server.client().hlen("beat-claims:owners") == 1  # written through the master
    s.close()


def test_sentinel_url_needs_a_master_name(server: RedisServer) -> None:
    app = make_app(server, beat_claims_url="sentinel://127.0.0.1:26379")
    with pytest.raises(ConfigurationError, match="beat_claims_sentinel_master"):
        Settings.from_app(app)
    app.conf.broker_transport_options = {"master_name": "fromthebroker"}
    assert Settings.from_app(app).sentinel_master == "fromthebroker"
