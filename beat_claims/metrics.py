"""Prometheus metrics of a beat (optional: ``pip install beat-claims[metrics]``).

Enabled by ``beat_claims_metrics_port``: the beat serves ``/metrics`` on that port. Counts
are per process; sum them over the fleet's beats. No per-entry labels: a schedule of
thousands of entries must not become thousands of series.
"""

from __future__ import annotations

from typing import Any

from celery.utils.log import get_logger

from .settings import ConfigurationError

logger = get_logger("celery.beat.claims")

#: What the ``beat_claims_runs_total`` counter counts, by its ``event`` label.
EVENTS = ("claimed", "sent", "skipped", "waiting", "released", "taken_over", "not_sent",
          "publish_failed", "sent_late")


class Metrics:
    """No-op unless started: the scheduler calls it either way."""

    def __init__(self) -> None:
        self._runs: Any = None
        self._held: Any = None
        self._store_up: Any = None
        self._heartbeat: Any = None

    def start(self, port: int, addr: str = "0.0.0.0") -> None:
        if port in _serving:
            self.__dict__.update(_serving[port].__dict__)
            return
        try:
            import prometheus_client as prom
        except ImportError:
            raise ConfigurationError(
                f"beat_claims_metrics_port={port!r} needs prometheus-client:"
                " pip install 'beat-claims[metrics]'") from None
        self._runs = _shared("runs", lambda: prom.Counter(
            "beat_claims_runs", "Runs handled by this beat, by event", ["event"]))
        self._held = _shared("held", lambda: prom.Gauge(
            "beat_claims_held_claims", "Claims this beat holds and has not sent yet"))
        self._store_up = _shared("store_up", lambda: prom.Gauge(
            "beat_claims_store_up", "1 while the store answers, 0 during an outage"))
        self._heartbeat = _shared("heartbeat", lambda: prom.Gauge(
            "beat_claims_last_heartbeat_seconds", "Unix time of this beat's last heartbeat"))
        for event in EVENTS:
            self._runs.labels(event=event)
        try:
            prom.start_http_server(port, addr=addr)
        except OSError as exc:
            # One port per host: a second beat on it must keep scheduling, without metrics.
            logger.error("beat-claims: beat_claims_metrics_port=%d cannot be served (%s):"
                         " this beat runs without its metrics endpoint. The port serves one"
                         " process per host: give each beat its own (e.g. from an"
                         " environment variable in its settings)", port, exc)
            return
        _serving[port] = self

    def count(self, event: str, n: int = 1) -> None:
        if self._runs is not None and n:
            self._runs.labels(event=event).inc(n)

    def held(self, n: int) -> None:
        if self._held is not None:
            self._held.set(n)

    def store_up(self, up: bool) -> None:
        if self._store_up is not None:
            self._store_up.set(1 if up else 0)

    def heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.set_to_current_time()


_collectors: dict[str, Any] = {}
_serving: dict[int, Metrics] = {}


def _shared(name: str, make: Any) -> Any:
    """One collector per process, however many schedulers it creates."""
    if name not in _collectors:
        _collectors[name] = make()
    return _collectors[name]
