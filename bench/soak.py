#!/usr/bin/env python
"""Soak: does a beat's memory stay flat while it sends ~150 runs a second for minutes?

One beat of each scheduler (``--schedulers``: Celery's ``PersistentScheduler``, RedBeat,
beat-claims on Redis) runs at once for ``--minutes`` (12) on ``--entries`` (300) interval
entries of 1 to 5 s (entry i every ``1 + i % 5`` seconds: about 137 runs a second). Each
beat is built and driven as ``celery beat -S <class>`` does (the helpers of
``bench/dispatch.py``: ``celery.beat.Service``, ``beat_init``, ``tick()``, sleep,
``_do_sync()``) and records nothing per run itself, so that what grows is the scheduler's.

Two private redis-servers (``bench/dispatch.py``'s ``RedisServer``): the *store*
(beat-claims' store on db 0, RedBeat's keys on db 1, the app's ``result_backend`` on db 2:
``--result-backend none`` runs without one) and the *broker*, one database per scheduler.
Nobody consumes: a drain thread empties each scheduler's queue every second
(``LLEN`` and ``DEL`` in one transaction) and counts what it removed, so the runs sent are
counted at the broker and the broker's memory stays small.

Every ``--sample`` seconds (10) the parent reads ``VmRSS`` and ``VmHWM`` of each beat from
``/proc/<pid>/status``. Per scheduler it reports the runs sent, the RSS at the mark (10
minutes, or 80 % of a shorter run), the peak RSS (``VmHWM`` at the end), the peak minus
the RSS at the mark, and the growth per sent run over the last three quarters of the run:
the least-squares slope of RSS against runs sent over the samples from minute 3 of 12 on
(bytes per run; ``--growth-from MINUTES`` moves its start). The last line (``--json``: the
only output on stdout) is one JSON document with every figure and sample.

``--containers``: each beat lists its largest dicts, sets, lists and deques at the end,
and where they are held (``module.Class.attribute``).

``--tracemalloc N``: each beat traces allocations with N frames, takes a snapshot at
``--snapshot-at`` minutes (3, or a quarter of a shorter run) and another at the end, and
the parent prints (stderr) the ``--top`` allocation sites that grew most, grouped by
traceback, with the growth of the counts of live objects by type (``gc.get_objects()``).
Tracing slows the beats: the figures of such a run are for finding the cause only.

Usage::

    python bench/soak.py                                   # 12 minutes, three schedulers
    python bench/soak.py --minutes 4 --schedulers beat_claims --tracemalloc 6
    python bench/soak.py --json > soak.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from typing import Any

if __package__ in (None, ""):  # run as a script: bench/ is not a package on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.dispatch import (
    LABELS,
    QUEUE,
    TASK,
    RedisServer,
    _build,
    _make_app,
    _setup,
    _vm_kib,
    machine,
)

SCHEDULERS = ("persistent", "redbeat", "beat_claims")
#: The broker database of each scheduler (its queue is drained and counted apart).
BROKER_DB = {"persistent": 1, "redbeat": 2, "beat_claims": 3}
#: The store database: beat-claims on db 0 (dispatch's setup counts its keys there).
STORE_DB = {"persistent": 0, "redbeat": 1, "beat_claims": 0}
#: The store database of the result backend (``--result-backend redis``), for them all.
RESULT_DB = 2
MARK_MINUTES = 10.0  # RSS "after the first ten minutes"
MARK_FRACTION = 0.8  # of a run shorter than that
#: Growth per run is measured from a quarter of the run on (minute 3 of 12): the start
#: (imports, caches, the first sync, bounded piles filling) is left out.
GROWTH_FROM_FRACTION = 0.25
SETUP_TIMEOUT = 120.0


def interval_of(index: int) -> float:
    """Entry ``index`` runs every 1 to 5 seconds (60 entries of each in 300)."""
    return float(1 + index % 5)


# -- the beat process ------------------------------------------------------------------------
def _owner_of(obj: Any, ignore: set[int]) -> str:
    """Where ``obj`` is held: ``<module>.<class>.<attribute>`` of the instance whose
    attribute it is, else the type of what refers to it (``ignore``: ids of the finder's
    own lists and dicts)."""
    import gc
    import types

    found = "?"
    for holder in gc.get_referrers(obj):
        if id(holder) in ignore or isinstance(holder, (types.FrameType, types.CellType)):
            continue
        if isinstance(holder, dict):
            name = next((k for k, v in holder.items() if v is obj), "?")
            for owner in gc.get_referrers(holder):
                if getattr(owner, "__dict__", None) is holder:
                    cls = type(owner)
                    return f"{cls.__module__}.{cls.__qualname__}.{name}"
            found = f"dict[{str(name)[:40]!r}]"
        elif not isinstance(holder, (list, tuple)):
            for name, value in getattr(holder, "__dict__", {}).items():
                if value is obj:
                    cls = type(holder)
                    return f"{cls.__module__}.{cls.__qualname__}.{name}"
            found = type(holder).__qualname__
        elif found == "?":
            found = type(holder).__qualname__
    return found


def _largest_containers(top: int, least: int = 1000) -> list[tuple[int, str, str]]:
    """The ``top`` largest dicts, sets, lists and deques of the process (at least
    ``least`` items), with their type and where they are held."""
    import gc

    gc.unfreeze()  # beat-claims freezes what it built at start (beat/long_lived.py)
    gc.collect()
    found: dict[int, Any] = {}
    kinds = (dict, set, list, collections.deque)
    everything = gc.get_objects()
    for obj in everything:
        for ref in (obj, *gc.get_referents(obj)):
            if isinstance(ref, kinds) and len(ref) >= least and ref is not everything:
                found[id(ref)] = ref
    largest = sorted(found.values(), key=len, reverse=True)[:top]
    del everything
    ignore = {id(found), id(largest)}
    return [(len(c), type(c).__name__, _owner_of(c, ignore)) for c in largest]


def _type_counts() -> collections.Counter[str]:
    import gc

    gc.unfreeze()  # beat-claims freezes what it built at start (beat/long_lived.py)
    gc.collect()
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


def _growth_report(first: Any, last: Any, types0: collections.Counter[str],
                   types1: collections.Counter[str], top: int) -> dict[str, Any]:
    """The allocation sites (grouped by traceback) and object types that grew most."""
    import tracemalloc

    ignore = [tracemalloc.Filter(False, tracemalloc.__file__),
              tracemalloc.Filter(False, "<frozen importlib._bootstrap>")]
    stats = last.filter_traces(ignore).compare_to(first.filter_traces(ignore), "traceback")
    sites = [{"size_diff_kib": round(s.size_diff / 1024, 1), "count_diff": s.count_diff,
              "traceback": s.traceback.format()} for s in stats[:top]]
    grown = collections.Counter(types1)
    grown.subtract(types0)
    return {"sites": sites, "types": grown.most_common(top),
            "traced_kib": round(sum(s.size_diff for s in stats) / 1024, 1)}


def _beat(kind: str, cfg: dict[str, Any], out_q: Any, go: Any, stop: Any) -> None:
    """One beat: configure, set up, then tick as ``Service.start`` does until stopped."""
    import logging

    logging.basicConfig(level=logging.WARNING,
                        format=f"%(asctime)s {kind} %(levelname)s %(name)s: %(message)s")
    try:
        import celery.beat  # noqa: F401

        if kind == "redbeat":
            import redbeat  # noqa: F401
        app = _make_app(cfg)
        service, sched = _build(kind, app, cfg["workdir"], 0)
        _setup(kind, sched, cfg)
    except Exception:
        out_q.put(("error", kind, traceback.format_exc()))
        return
    out_q.put(("ready", kind, os.getpid()))
    go.wait()
    frames, report = cfg["tracemalloc"], None
    first: Any = None
    types0: collections.Counter[str] = collections.Counter()
    if frames:
        import tracemalloc

        tracemalloc.start(frames)
    snapshot_at = time.monotonic() + cfg["snapshot_at"]
    error = None
    try:
        while not stop.is_set():
            interval = sched.tick()
            if frames and first is None and time.monotonic() >= snapshot_at:
                first, types0 = tracemalloc.take_snapshot(), _type_counts()
            if interval and interval > 0:
                stop.wait(interval)
                if sched.should_sync():
                    sched._do_sync()
        if first is not None:
            report = _growth_report(first, tracemalloc.take_snapshot(), types0,
                                    _type_counts(), cfg["top"])
        if cfg["containers"]:
            report = {**(report or {}), "containers": _largest_containers(cfg["top"])}
    except Exception:
        error = traceback.format_exc()
    out_q.put(("result", kind, {"error": error, "tracemalloc": report}))
    with contextlib.suppress(Exception):
        service.sync()  # what celery beat does on its way out: the scheduler's close()


# -- the parent ------------------------------------------------------------------------------
class Drain(threading.Thread):
    """Empties each scheduler's queue every second and counts the messages it removed."""

    def __init__(self, broker: RedisServer, kinds: list[str]) -> None:
        super().__init__(daemon=True, name="soak-drain")
        import redis

        self.clients = {k: redis.Redis(port=broker.port, db=BROKER_DB[k]) for k in kinds}
        self.sent = dict.fromkeys(kinds, 0)
        self.halt = threading.Event()

    def drain(self) -> None:
        for kind, client in self.clients.items():
            pipe = client.pipeline(transaction=True)
            pipe.llen(QUEUE)
            pipe.delete(QUEUE)
            self.sent[kind] += int(pipe.execute()[0])

    def run(self) -> None:
        while not self.halt.wait(1.0):
            self.drain()


def _config(kind: str, args: argparse.Namespace, store: RedisServer, broker: RedisServer,
            workdir: str) -> dict[str, Any]:
    names = [f"entry-{i:03d}" for i in range(args.entries)]
    backend = (f"redis://127.0.0.1:{store.port}/{RESULT_DB}"
               if args.result_backend == "redis" else None)
    store_url = f"redis://127.0.0.1:{store.port}/{STORE_DB[kind]}"
    schedule = {name: {"task": TASK, "schedule": timedelta(seconds=interval_of(i)),
                       "args": (name,)} for i, name in enumerate(names)}
    return {"scheduler": kind, "names": names, "store_url": store_url, "store_kind": "redis",
            "store_port": store.port, "broker_url": f"redis://127.0.0.1:{broker.port}/"
                                                   f"{BROKER_DB[kind]}",
            "interval": 1.0, "idle": True, "last_run_at": time.time(),
            "workdir": tempfile.mkdtemp(dir=workdir), "setup_timeout": SETUP_TIMEOUT,
            "extra_conf": {"beat_schedule": schedule, "result_backend": backend},
            "tracemalloc": args.tracemalloc,
            "snapshot_at": args.snapshot_at * 60, "top": args.top,
            "containers": args.containers}


def _slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y on x."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    if var == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / var


def figures(samples: list[dict[str, Any]], mark: float, growth_from: float,
            peak_kib: int | None) -> dict[str, Any]:
    """A scheduler's figures from its samples (``t`` seconds, ``sent``, ``rss_kib``)."""
    if not samples:
        return {}
    at_mark = min(samples, key=lambda s: abs(s["t"] - mark))
    after = [s for s in samples if s["t"] >= growth_from]
    slope = _slope([(s["sent"], s["rss_kib"] * 1024.0) for s in after])
    last = samples[-1]
    peak = peak_kib if peak_kib is not None else max(s["hwm_kib"] for s in samples)
    return {
        "runs_sent": last["sent"],
        "runs_per_second": round(last["sent"] / last["t"], 1) if last["t"] else None,
        "mark_seconds": at_mark["t"],
        "rss_at_mark_mib": round(at_mark["rss_kib"] / 1024, 1),
        "rss_end_mib": round(last["rss_kib"] / 1024, 1),
        "peak_rss_mib": round(peak / 1024, 1),
        "peak_minus_mark_mib": round((peak - at_mark["rss_kib"]) / 1024, 1),
        "growth_from_seconds": round(growth_from, 1),
        "runs_in_growth_window": last["sent"] - after[0]["sent"] if after else 0,
        "growth_window_mib": round((last["rss_kib"] - after[0]["rss_kib"]) / 1024, 1)
        if after else None,
        "growth_bytes_per_run": round(slope, 1) if slope is not None else None,
    }


def _print_tracemalloc(kind: str, report: dict[str, Any]) -> None:
    err = sys.stderr
    if report.get("containers") is not None:
        print(f"\n== {LABELS[kind]}: the largest containers at the end ==", file=err)
        for size, type_name, owner in report["containers"]:
            print(f"  {size:9d} {type_name:6} {owner}", file=err)
    if "sites" not in report:
        return
    print(f"\n== {LABELS[kind]}: growth between the snapshots (traced {report['traced_kib']}"
          " KiB) ==", file=err)
    for site in report["sites"]:
        print(f"{site['size_diff_kib']:+10.1f} KiB {site['count_diff']:+8d} blocks", file=err)
        for line in site["traceback"]:
            print(f"      {line}", file=err)
    print("  live objects by type:", file=err)
    for name, diff in report["types"]:
        print(f"    {diff:+9d} {name}", file=err)


def _print_table(results: dict[str, dict[str, Any]]) -> None:
    cols = ("runs_sent", "runs_per_second", "rss_at_mark_mib", "peak_rss_mib",
            "peak_minus_mark_mib", "growth_bytes_per_run")
    print(f"{'scheduler':34}" + "".join(f"{c:>22}" for c in cols))
    for kind, res in results.items():
        print(f"{LABELS[kind]:34}" + "".join(f"{res.get(c)!s:>22}" for c in cols))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=12.0, help="length of the run (12)")
    ap.add_argument("--schedulers", default=",".join(SCHEDULERS),
                    help=f"comma-separated subset of {','.join(SCHEDULERS)}")
    ap.add_argument("--entries", type=int, default=300,
                    help="interval entries, entry i every 1 + i %% 5 seconds (300)")
    ap.add_argument("--result-backend", choices=("redis", "none"), default="redis",
                    help="the app's result_backend: a Redis database of the store"
                         " redis-server (redis, as most apps have), or none (redis)")
    ap.add_argument("--sample", type=float, default=10.0,
                    help="seconds between RSS samples (10)")
    ap.add_argument("--growth-from", type=float, default=None, metavar="MINUTES",
                    help="growth per run is measured from this minute on (default: a"
                         " quarter of the run, minute 3 of 12)")
    ap.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES",
                    help="trace allocations with this many frames and print the sites"
                         " that grew most between --snapshot-at and the end (0: off)")
    ap.add_argument("--snapshot-at", type=float, default=None, metavar="MINUTES",
                    help="when the first snapshot is taken (3, or a quarter of the run)")
    ap.add_argument("--containers", action="store_true",
                    help="at the end, print the largest dicts, sets, lists and deques of"
                         " each beat (1,000 items or more) and where they are held")
    ap.add_argument("--top", type=int, default=15, help="sites and types printed (15)")
    ap.add_argument("--json", action="store_true",
                    help="print only the JSON document on stdout")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.schedulers.split(",") if k.strip()]
    for k in kinds:
        if k not in SCHEDULERS:
            ap.error(f"--schedulers: unknown scheduler {k!r}")
    if args.minutes <= 0 or args.entries < 1 or args.sample <= 0:
        ap.error("--minutes, --entries and --sample must be positive")
    duration = args.minutes * 60
    mark = MARK_MINUTES * 60 if duration > MARK_MINUTES * 60 else duration * MARK_FRACTION
    if args.snapshot_at is None:
        args.snapshot_at = min(3.0, args.minutes / 4)
    growth_from = (duration * GROWTH_FROM_FRACTION if args.growth_from is None
                   else args.growth_from * 60)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers and beats
    store, broker = RedisServer("store"), RedisServer("broker")
    workdir = tempfile.mkdtemp(prefix="bench-soak-")
    ctx = mp.get_context("spawn")
    out_q, go, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    procs = {k: ctx.Process(target=_beat, daemon=True,
                            args=(k, _config(k, args, store, broker, workdir), out_q, go,
                                  stop))
             for k in kinds}
    drain = Drain(broker, kinds)
    samples: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    pids: dict[str, int] = {}
    reports: dict[str, Any] = {}
    problem = None
    try:
        for p in procs.values():
            p.start()
        deadline = time.time() + SETUP_TIMEOUT + 60
        while len(pids) < len(kinds) and problem is None:
            kind, what, payload = out_q.get(timeout=max(0.1, deadline - time.time()))
            if kind == "error":
                problem = f"{LABELS[what]} failed:\n{payload}"
            else:
                pids[what] = payload
        if problem is None:
            drain.drain()  # nothing is due before the start; an empty queue to count from
            drain.sent = dict.fromkeys(kinds, 0)
            drain.start()
            go.set()
            t0 = time.monotonic()
            print(f"soak: {', '.join(kinds)} for {args.minutes:g} min", file=sys.stderr)
            while True:
                elapsed = time.monotonic() - t0
                if elapsed >= duration or not all(p.is_alive() for p in procs.values()):
                    break
                time.sleep(min(args.sample - elapsed % args.sample, duration - elapsed))
                t = round(time.monotonic() - t0, 1)
                for k in kinds:
                    samples[k].append({"t": t, "sent": drain.sent[k],
                                       "rss_kib": _vm_kib("VmRSS", pids[k]) or 0,
                                       "hwm_kib": _vm_kib("VmHWM", pids[k]) or 0})
                if not args.json:
                    print(f"  {t:7.0f}s " + "  ".join(
                        f"{k}={samples[k][-1]['sent']} runs"
                        f" {samples[k][-1]['rss_kib'] / 1024:.1f} MiB" for k in kinds),
                        file=sys.stderr)
            peaks = {k: _vm_kib("VmHWM", pids[k]) for k in kinds}
            stop.set()
            while len(reports) < len(kinds):
                kind, what, payload = out_q.get(timeout=120)
                if kind == "result":
                    reports[what] = payload
    finally:
        stop.set()
        go.set()
        drain.halt.set()
        for p in procs.values():
            p.join(15)
            if p.is_alive():
                p.kill()
                p.join()
        store.stop()
        broker.stop()
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    results = {k: figures(samples[k], mark, growth_from, peaks[k]) for k in kinds}
    errors = {k: r["error"] for k, r in reports.items() if r.get("error")}
    ratios = {}
    for other in ("persistent", "redbeat"):
        if "beat_claims" in results and other in results:
            a = results["beat_claims"].get("growth_bytes_per_run")
            b = results[other].get("growth_bytes_per_run")
            ratios[f"growth_beat_claims/{other}"] = round(a / b, 2) if a and b else None
            ratios[f"peak_beat_claims/{other}"] = round(
                results["beat_claims"]["peak_rss_mib"] / results[other]["peak_rss_mib"], 2)
    summary: dict[str, Any] = {"benchmark": "soak", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "machine": machine(),
               "options": {"minutes": args.minutes, "entries": args.entries,
                           "schedulers": kinds, "sample": args.sample,
                           "result_backend": args.result_backend,
                           "mark_seconds": mark, "growth_from_seconds": growth_from,
                           "tracemalloc": args.tracemalloc,
                           "command": " ".join([os.path.basename(sys.argv[0]),
                                                *(sys.argv[1:] if argv is None else argv)])},
               "results": results, "ratios": ratios, "errors": errors,
               "tracemalloc": {k: r["tracemalloc"] for k, r in reports.items()
                               if r.get("tracemalloc")},
               "samples": samples}
    for kind, report in summary["tracemalloc"].items():
        _print_tracemalloc(kind, report)
    for kind, text in errors.items():
        print(f"{LABELS[kind]} failed:\n{text}", file=sys.stderr)
    if not args.json:
        _print_table(results)
        for name, value in ratios.items():
            print(f"{name}: {value}")
    print(json.dumps(summary))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
