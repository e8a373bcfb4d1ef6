"""Prometheus metrics of a beat, served on beat_claims_metrics_port."""

from __future__ import annotations

import urllib.request

import pytest

from beat_claims.settings import ConfigurationError, Settings

from .conftest import RedisServer, free_port
from .inprocess import make, make_app, run_for


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("beat_claims_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_a_beat_serves_its_counts(server: RedisServer) -> None:
    port = free_port()
    s = make(make_app(server, beat_claims_metrics_port=port))
    run_for(2.3, s)
    m = scrape(port)
    assert m['beat_claims_runs_total{event="sent"}'] >= 2
    assert m['beat_claims_runs_total{event="claimed"}'] >= m['beat_claims_runs_total{event="sent"}']
    assert m["beat_claims_store_up"] == 1
    assert m["beat_claims_last_heartbeat_seconds"] > 0
    s.sender.send = lambda claims, schedule: None  # type: ignore[method-assign]
    run_for(1.2, s)
    s.close()
    assert scrape(port)['beat_claims_runs_total{event="released"}'] >= 1


def test_bad_metrics_port_is_named(server: RedisServer) -> None:
    with pytest.raises(ConfigurationError, match="beat_claims_metrics_port"):
        Settings.from_app(make_app(server, beat_claims_metrics_port="9100x"))
