"""``celery claims exporter``: Prometheus metrics of the whole fleet, read from the store.

A beat's own metrics (``beat_claims_metrics_port``) count what that process did; these say
what the store holds for every entry, whichever beat sent it, so one exporter serves the
fleet. Each scrape reads the store, except that scrapes within ``cache_seconds`` of a read
share it (so several Prometheus servers, or a scrape retried, cost one read).

The work of one read is bounded: at most ``max_entries`` entries (the first by name; the
rest are counted in ``beat_claims_fleet_entries_not_exported``), at most ``history`` runs
of each (the newest), one read of live claims (up to ``health.LIVE_LIMIT``), and the open
runs older than ``beat_claims_unstarted_after`` page by page (``unstarted.PAGE`` a round
trip). That is one round trip for the entries, one per entry for its runs, three or four
for the rest with up to a page of such open runs.

Per entry (label ``entry``):

* ``beat_claims_entry_runs{state}``: runs in each state among the newest ``history``;
* ``beat_claims_entry_last_outcome_timestamp_seconds{state}``: the newest finished run
  (by due instant): when it finished, labelled with its state;
* ``beat_claims_entry_last_finished_timestamp_seconds{state}``: for each final state, when
  the newest run that ended in it finished (``state="done"``: the last success);
* ``beat_claims_entry_send_lateness_seconds`` and ``..._start_lateness_seconds``: sent -
  due and started - due of the newest scheduled (not manual) run that was sent, started;
* ``beat_claims_entry_paused``: 1 while an operator has paused it;
* ``beat_claims_entry_unstarted_runs``: its runs sent and not started by any worker for
  longer than ``beat_claims_unstarted_after`` (:mod:`beat_claims.unstarted`).

For the fleet: ``beat_claims_fleet_up`` (the last read succeeded), ``..._beats_alive``
(:func:`beat_claims.beat.liveness.owner_alive`), ``..._beats_registered``,
``..._stale_claims`` (held longer than their ``reclaim_after``), ``..._unstarted_runs``,
``..._entries``, ``..._entries_not_exported``, ``..._read_seconds``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import health, unstarted
from .beat.liveness import owner_alive
from .enums import FINAL_STATES, RunState
from .runs import Run
from .settings import DEFAULT_UNSTARTED_AFTER, ConfigurationError, Policy
from .stores.base import Store, StoreError

#: Scrapes within this many seconds of a read share it.
CACHE_SECONDS = 5.0
#: Entries exported, unless told otherwise.
MAX_ENTRIES = 1000
#: Runs read per entry: the default ``beat_claims_history_limit``.
HISTORY = 100

#: The README's example alert: nightly-billing has not succeeded for 26 hours (or not once
#: in its kept history while the exporter can read it and it is not paused).
ALERT_EXAMPLE = (
    'time() - beat_claims_entry_last_finished_timestamp_seconds'
    '{entry="nightly-billing", state="done"} > 26 * 3600\n'
    'or (beat_claims_entry_paused{entry="nightly-billing"} == 0\n'
    '    unless on(entry) beat_claims_entry_last_finished_timestamp_seconds{state="done"})'
)


@dataclass
class EntryStats:
    name: str
    paused: bool
    runs: dict[RunState, int] = field(default_factory=dict)
    last_outcome: tuple[RunState, float] | None = None
    last_finished: dict[RunState, float] = field(default_factory=dict)
    send_lateness: float | None = None
    start_lateness: float | None = None
    unstarted: int = 0  # runs sent and not started for longer than unstarted_after


@dataclass
class Snapshot:
    """One read of the store: what a scrape exports."""

    up: bool
    read_seconds: float
    error: str = ""
    entries: list[EntryStats] = field(default_factory=list)
    not_exported: int = 0
    beats_alive: int = 0
    beats_registered: int = 0
    stale_claims: int = 0
    unstarted: int | None = None  # None: not looked for (unstarted_after is None)


def entry_stats(name: str, paused: bool, runs: Iterable[Run]) -> EntryStats:
    """What is exported of one entry, from its runs newest first."""
    stats = EntryStats(name, paused, {state: 0 for state in RunState})
    for run in runs:
        stats.runs[run.state] += 1
        if run.state in FINAL_STATES:
            at = (run.finished_at or run.due) / 1000
            if stats.last_outcome is None:
                stats.last_outcome = (run.state, at)
            stats.last_finished[run.state] = max(at, stats.last_finished.get(run.state, at))
        if run.manual:
            continue  # an operator's instant: its lateness is not the schedule's
        if stats.send_lateness is None and run.sent_at is not None:
            stats.send_lateness = (run.sent_at - run.due) / 1000
        if stats.start_lateness is None and run.started_at is not None:
            stats.start_lateness = (run.started_at - run.due) / 1000
    return stats


def read(store: Store, policies: Callable[[list[str]], dict[str, Policy]], default: Policy,
         max_entries: int = MAX_ENTRIES, history: int = HISTORY,
         unstarted_after: float | None = DEFAULT_UNSTARTED_AFTER) -> Snapshot:
    """One bounded read of the store (see the module docstring)."""
    started = time.monotonic()
    try:
        records = sorted(store.entries(), key=lambda r: r.name)
        shown = [r for r in records if r.anchor is not None][:max_entries]
        entries = [entry_stats(r.name, r.paused is not None, store.history(r.name, history))
                   for r in shown]
        owners = store.owners()
        now = store.now()
        held = health.live(store, now, policies([r.name for r in shown]), default)
        waiting = (unstarted.read(store, now, unstarted_after).entries
                   if unstarted_after is not None else None)
    except StoreError as exc:
        return Snapshot(False, time.monotonic() - started, str(exc))
    if waiting is not None:
        counts = {u.entry: u.runs for u in waiting}
        for e in entries:
            e.unstarted = counts.get(e.name, 0)
    return Snapshot(True, time.monotonic() - started, "", entries,
                    max(0, len(records) - len(shown)), sum(1 for o in owners if owner_alive(o)),
                    len(owners), len(held.stale),
                    None if waiting is None else sum(u.runs for u in waiting))


class FleetCollector:
    """A prometheus_client collector over :func:`read`, with its cache."""

    def __init__(self, read: Callable[[], Snapshot], cache_seconds: float = CACHE_SECONDS
                 ) -> None:
        self._read = read
        self.cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._snapshot: Snapshot | None = None
        self.reads = 0

    def snapshot(self) -> Snapshot:
        with self._lock:  # concurrent scrapes wait for one read and share it
            if self._snapshot is None or time.monotonic() - self._at >= self.cache_seconds:
                self._snapshot = self._read()
                self._at = time.monotonic()
                self.reads += 1
            return self._snapshot

    def describe(self) -> list[Any]:
        return []  # no read at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        snap = self.snapshot()

        def gauge(name: str, doc: str, labels: Iterable[str] = ()) -> Any:
            return GaugeMetricFamily(f"beat_claims_{name}", doc, labels=list(labels))

        up = gauge("fleet_up", "1 when the last read of the store succeeded")
        up.add_metric([], 1 if snap.up else 0)
        took = gauge("fleet_read_seconds", "How long the last read of the store took")
        took.add_metric([], snap.read_seconds)
        yield from (up, took)
        if not snap.up:
            return
        fleet = [("fleet_beats_alive", "Beats whose heartbeat is alive", snap.beats_alive),
                 ("fleet_beats_registered", "Beats registered in the store",
                  snap.beats_registered),
                 ("fleet_stale_claims", "Claims held longer than their entry's reclaim_after",
                  snap.stale_claims),
                 ("fleet_entries", "Entries exported", len(snap.entries)),
                 ("fleet_entries_not_exported", "Entries left out (--max-entries)",
                  snap.not_exported)]
        if snap.unstarted is not None:
            fleet.append(("fleet_unstarted_runs", "Runs sent and not started by any worker"
                          " for longer than beat_claims_unstarted_after", snap.unstarted))
        for name, doc, value in fleet:
            g = gauge(name, doc)
            g.add_metric([], value)
            yield g
        paused = gauge("entry_paused", "1 while the entry is paused", ["entry"])
        runs = gauge("entry_runs", "Runs in each state among the newest read",
                     ["entry", "state"])
        outcome = gauge("entry_last_outcome_timestamp_seconds", "When the newest finished"
                        " run finished, labelled with its state", ["entry", "state"])
        finished = gauge("entry_last_finished_timestamp_seconds", "When the newest run that"
                         " ended in each final state finished", ["entry", "state"])
        send = gauge("entry_send_lateness_seconds", "Sent - due of the newest scheduled run"
                     " that was sent", ["entry"])
        start = gauge("entry_start_lateness_seconds", "Started - due of the newest"
                      " scheduled run that started", ["entry"])
        waiting = gauge("entry_unstarted_runs", "Runs sent and not started by any worker for"
                        " longer than beat_claims_unstarted_after", ["entry"])
        for e in snap.entries:
            paused.add_metric([e.name], 1 if e.paused else 0)
            for state, n in e.runs.items():
                runs.add_metric([e.name, state.value], n)
            if e.last_outcome is not None:
                outcome.add_metric([e.name, e.last_outcome[0].value], e.last_outcome[1])
            for state, at in sorted(e.last_finished.items()):
                finished.add_metric([e.name, state.value], at)
            if e.send_lateness is not None:
                send.add_metric([e.name], e.send_lateness)
            if e.start_lateness is not None:
                start.add_metric([e.name], e.start_lateness)
            if snap.unstarted is not None:
                waiting.add_metric([e.name], e.unstarted)
        yield from (paused, runs, outcome, finished, send, start)
        if snap.unstarted is not None:
            yield waiting


def serve(collector: FleetCollector, port: int, addr: str = "0.0.0.0",
          ready: Callable[[Any], None] | None = None) -> None:
    """Serve ``/metrics`` (any path) until interrupted. ``OSError`` when the port cannot
    be bound."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import CollectorRegistry, make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    httpd = make_server(addr, port, make_wsgi_app(registry), Server, handler_class=Quiet)
    try:
        if ready is not None:
            ready(httpd)
        httpd.serve_forever()
    finally:
        httpd.server_close()


def require_client() -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise ConfigurationError("the exporter needs prometheus-client:"
                                 " pip install 'beat-claims[metrics]'") from None


__all__ = ["ALERT_EXAMPLE", "CACHE_SECONDS", "HISTORY", "MAX_ENTRIES", "EntryStats",
           "FleetCollector", "Snapshot", "entry_stats", "read", "require_client", "serve"]
