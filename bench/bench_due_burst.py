#!/usr/bin/env python
"""Due burst: how long each scheduler takes to send N entries that all fall due at once.

Schedulers compared in one run, on the same workload and the same (private) Redis:

* ``celery``      -- ``celery.beat.PersistentScheduler`` (shelve file in a temp dir)
* ``redbeat``     -- ``redbeat.RedBeatScheduler`` (Redis db 2)
* ``beat_claims`` -- ``beat_claims.Scheduler`` (store: Redis db 0)

The broker is the same server, db 1; every task lands in the list ``celery``.

Workload: N interval entries (``--interval`` seconds, one ``bench.noop`` task each, whose only
argument is the entry name). Each scheduler is created in a child process and ticked once
while nothing is due (setup, anchoring, heap building: not measured); the child then waits
until every entry is due (its creation + interval) and ticks the way ``celery beat``'s
``Service.start`` does (``tick()``; sleep what it returns) until the parent tells it to stop.
The time of each ``kombu.Producer.publish`` is recorded in the child (the same wrapper for
all three); the burst time is the N-th publish minus the moment all entries were due. The
queue length (``LLEN celery``) is used by the parent to decide when the burst is over and to
verify the count; the queued messages are then decoded to check each entry was sent exactly
once. Client round trips (``send_packed_command`` calls of redis-py, broker included) and
server-side commands (``INFO commandstats``) during the burst are reported per sent task.

Each run is bounded by ``--timeout``: a scheduler that has not sent N tasks by then is
stopped (killed if its tick does not return) and reported as timed out.

``--beats K`` (K > 1) runs K ``beat_claims`` schedulers in K processes on the same store and
checks that exactly N messages are published (no duplicate). RedBeat is run with K
processes too, but only the one that holds RedBeat's lock sends; the others stand by.
``PersistentScheduler`` has no coordination (K beats would send K x N), so it is run once.

Usage: python bench/bench_due_burst.py [--entries 2000] [--beats 1] [--json]
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import json
import multiprocessing as mp
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

QUEUE = "celery"
TASK = "bench.noop"
KINDS = ("celery", "redbeat", "beat_claims")
LABELS = {
    "celery": "celery.beat.PersistentScheduler",
    "redbeat": "redbeat.RedBeatScheduler",
    "beat_claims": "beat_claims.Scheduler",
}
STORE_DB, BROKER_DB, REDBEAT_DB = 0, 1, 2


# -- private redis-server ---------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="bench-redis-")
        self.port = _free_port()
        exe = shutil.which("redis-server")
        if not exe:
            sys.exit("redis-server not found on PATH")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--databases", "4"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis
        self.client = redis.Redis(port=self.port, db=BROKER_DB)
        deadline = time.time() + 10
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.time() > deadline or self.proc.poll() is not None:
                    self.stop()
                    sys.exit("redis-server did not start")
                time.sleep(0.05)

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# -- child side -------------------------------------------------------------------------
def _make_app(cfg: dict[str, Any]) -> Any:
    from celery import Celery

    app = Celery("bench_due_burst", set_as_current=True)
    app.conf.update(
        broker_url=cfg["broker_url"],
        beat_claims_url=cfg["store_url"],
        beat_claims_heartbeat_interval=1,
        redbeat_redis_url=cfg["redbeat_url"],
        beat_schedule={
            name: {"task": TASK, "schedule": cfg["interval"], "args": (name,)}
            for name in cfg["names"]
        },
        timezone="UTC",
    )

    @app.task(name=TASK)
    def noop(name: str) -> None:  # never run: there is no worker
        return None

    return app


class _Counters:
    """Publishes (with their times) and redis-py round trips, identical for all schedulers."""

    def __init__(self) -> None:
        import kombu.messaging
        import redis.connection

        self.publishes: list[float] = []
        self.round_trips = 0
        publish = kombu.messaging.Producer.publish
        send = redis.connection.AbstractConnection.send_packed_command
        counters = self

        def counted_publish(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = publish(self, *args, **kwargs)
            counters.publishes.append(time.time())
            return result

        def counted_send(self: Any, *args: Any, **kwargs: Any) -> Any:
            counters.round_trips += 1
            return send(self, *args, **kwargs)

        kombu.messaging.Producer.publish = counted_publish  # type: ignore[method-assign]
        redis.connection.AbstractConnection.send_packed_command = counted_send  # type: ignore

    def reset(self) -> None:
        self.publishes = []
        self.round_trips = 0


def _build(kind: str, app: Any, workdir: str, index: int) -> tuple[Any, bool]:
    """The scheduler, and whether it stands by (RedBeat without its lock)."""
    if kind == "celery":
        from celery.beat import PersistentScheduler

        path = os.path.join(workdir, f"celerybeat-schedule-{index}")
        return PersistentScheduler(app, schedule_filename=path), False
    if kind == "redbeat":
        from redbeat import RedBeatScheduler
        from redbeat.schedulers import LUA_EXTEND_TO_SCRIPT, get_redis

        sched = RedBeatScheduler(app)
        # What redbeat's beat_init handler does, but without blocking: a beat that does not
        # get the lock waits for it (here: stands by until the end of the run).
        client = get_redis(app)
        lock = client.lock(sched.lock_key, timeout=sched.lock_timeout, sleep=sched.max_interval)
        lock.lua_extend = client.register_script(LUA_EXTEND_TO_SCRIPT)
        if lock.acquire(blocking=False):
            sched.lock = lock
            return sched, False
        return sched, True
    if kind == "beat_claims":
        from beat_claims import Scheduler

        return Scheduler(app), False
    raise ValueError(kind)


def _child(kind: str, index: int, cfg: dict[str, Any], ready_q: Any, start_at: Any, go: Any,
           stop: Any, result_q: Any) -> None:
    import logging

    logging.basicConfig(level=logging.WARNING,
                        format=f"%(asctime)s {kind}[{index}] pid %(process)d %(levelname)s"
                               " %(name)s: %(message)s")
    warnings: collections.Counter[str] = collections.Counter()

    class _CountWarnings(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                warnings[" ".join(str(record.msg).split()[:4])] += 1

    logging.getLogger().addHandler(_CountWarnings())
    counters = _Counters()
    app = _make_app(cfg)
    t0 = time.time()
    sched, standby = _build(kind, app, cfg["workdir"], index)
    if not standby:
        sched.tick()  # warm-up: nothing is due yet
    ready_q.put({"index": index, "setup_started": t0, "ready": time.time(),
                 "sent_during_setup": len(counters.publishes), "standby": standby})
    go.wait()
    begin = start_at.value
    time.sleep(max(0.0, begin - time.time()))
    counters.reset()
    profiler = None
    if cfg["profile_dir"] and not standby and kind in cfg["profile_kinds"]:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    self_stop = cfg["self_stop_at"]
    ticks = 0
    error = None
    try:
        while not stop.is_set():
            if standby:
                stop.wait(0.05)
                continue
            interval = sched.tick()
            ticks += 1
            if self_stop and len(counters.publishes) >= self_stop:
                break
            if interval and interval > 0:
                stop.wait(interval)
    except Exception as exc:  # reported, not hidden
        error = repr(exc)
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(os.path.join(cfg["profile_dir"], f"{kind}-{index}.prof"))
    result = {"index": index, "publishes": counters.publishes, "ticks": ticks,
              "round_trips": counters.round_trips, "standby": standby, "error": error,
              "warnings": dict(warnings)}
    result_q.put(result)
    with contextlib.suppress(Exception):
        sched.close()


# -- parent side ------------------------------------------------------------------------
def _commandstats(client: Any) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"])
            for k, v in client.info("commandstats").items()}


def _decode_queue(client: Any) -> dict[str, Any]:
    """Count the queued messages per entry and per task id (deterministic for beat_claims)."""
    per_entry: collections.Counter[str] = collections.Counter()
    per_id: collections.Counter[str] = collections.Counter()
    for raw in client.lrange(QUEUE, 0, -1):
        msg = json.loads(raw)
        body = msg["body"]
        if msg.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        per_entry[args[0]] += 1
        per_id[msg["headers"]["id"]] += 1
    return {
        "total": sum(per_entry.values()),
        "entries_sent": len(per_entry),
        "entries_sent_more_than_once": sum(1 for c in per_entry.values() if c > 1),
        "duplicate_task_ids": sum(c - 1 for c in per_id.values() if c > 1),
    }


def run_one(kind: str, beats: int, args: argparse.Namespace, server: RedisServer,
            workdir: str) -> dict[str, Any]:
    client = server.client
    client.flushall()
    names = [f"entry-{i:05d}" for i in range(args.entries)]
    n = args.entries
    cfg = {
        "broker_url": server.url(BROKER_DB), "store_url": server.url(STORE_DB),
        "redbeat_url": server.url(REDBEAT_DB), "interval": args.interval, "names": names,
        "workdir": tempfile.mkdtemp(dir=workdir), "profile_dir": args.profile,
        "profile_kinds": args.profile_kinds, "self_stop_at": n if beats == 1 else None,
    }
    ctx = mp.get_context("spawn")
    ready_q, result_q = ctx.Queue(), ctx.Queue()
    start_at, go, stop = ctx.Value("d", 0.0), ctx.Event(), ctx.Event()
    procs = [ctx.Process(target=_child, args=(kind, i, cfg, ready_q, start_at, go, stop,
                                              result_q), daemon=True)
             for i in range(beats)]
    for p in procs:
        p.start()
    out: dict[str, Any] = {"scheduler": kind, "label": LABELS[kind], "beats": beats,
                           "entries": n, "interval": args.interval}
    readies: list[dict[str, Any]] = []
    deadline = time.time() + args.timeout
    try:
        while len(readies) < beats:
            readies.append(ready_q.get(timeout=max(0.1, deadline - time.time())))
    except Exception:
        stop.set()
        go.set()
        _reap(procs)
        out.update(status="setup-timeout", seconds=None, sends_per_second=None)
        return out
    setup = max(r["ready"] for r in readies) - min(r["setup_started"] for r in readies)
    # Every entry was created (anchored, last_run_at set) before its beat was ready.
    begin = max(r["ready"] for r in readies) + args.interval + 0.05
    out["setup_seconds"] = round(setup, 3)
    out["standby_beats"] = sum(1 for r in readies if r["standby"])
    early = client.llen(QUEUE)
    stats_before = _commandstats(client)
    start_at.value = begin
    go.set()
    reached = None
    status = "ok"
    polls = 0
    while True:
        time.sleep(0.01)
        now = time.time()
        if now < begin:
            continue
        length = client.llen(QUEUE)
        polls += 1
        if reached is None and length >= n + early:
            reached = now
        if reached is not None and now >= reached + (args.grace if beats > 1 else 0.0):
            break
        if now > begin + args.timeout:
            status = "timeout"
            break
        if not any(p.is_alive() for p in procs):
            if reached is None:
                status = "died"
            break
    stop.set()
    results = []
    for _ in procs:
        try:
            results.append(result_q.get(timeout=10 if status == "ok" else 3))
        except Exception:
            break
    _reap(procs)
    stats_after = _commandstats(client)
    # The parent's own LLEN polls are not the scheduler's.
    commands = {k: v - stats_before.get(k, 0) for k, v in stats_after.items()
                if v - stats_before.get(k, 0) > 0}
    commands["llen"] = commands.get("llen", 0) - polls
    commands = {k: v for k, v in commands.items() if v > 0 and k not in ("info",)}
    stamps = sorted(t for r in results for t in r["publishes"])
    queue = _decode_queue(client)
    sent = len(stamps)
    if status == "ok" and len(stamps) >= n:
        seconds = stamps[n - 1] - begin
    elif status == "ok":  # a child could not report (killed): fall back to the poll time
        seconds = reached - begin if reached else None
    else:
        seconds = None
    out.update(
        status=status,
        seconds=None if seconds is None else round(seconds, 4),
        sends_per_second=None if not seconds else round(n / seconds, 1),
        sent_before_start=early,
        published=sent,
        published_per_beat=[len(r["publishes"]) for r in sorted(results, key=lambda r: r["index"])],
        queued=queue["total"],
        queue=queue,
        exactly_n=(queue["total"] == n and queue["entries_sent"] == n),
        ticks=sum(r["ticks"] for r in results),
        round_trips_per_task=round(sum(r["round_trips"] for r in results) / max(1, sent), 2),
        commands_per_task={k: round(v / max(1, sent), 2) for k, v in sorted(commands.items())},
        errors=[r["error"] for r in results if r["error"]],
        warnings=dict(sum((collections.Counter(r["warnings"]) for r in results),
                          collections.Counter())),
    )
    if status == "timeout":
        out["sent_by_timeout"] = queue["total"]
    return out


def _reap(procs: list[Any]) -> None:
    for p in procs:
        p.join(5)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(5)
        if p.is_alive():
            p.kill()
            p.join()


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median time (a failed run counts as slowest); all times attached."""
    ordered = sorted(runs, key=lambda r: (r["seconds"] is None, r["seconds"] or 0.0))
    chosen = dict(ordered[(len(ordered) - 1) // 2] if len(ordered) % 2 else
                  ordered[len(ordered) // 2 - 1])
    chosen["runs_seconds"] = [r["seconds"] for r in runs]
    chosen["runs_status"] = [r["status"] for r in runs]
    chosen["all_runs_exactly_n"] = all(r.get("exactly_n") for r in runs)
    if any(r["status"] != "ok" for r in runs):
        chosen["status"] = next(r["status"] for r in runs if r["status"] != "ok")
    return chosen


def _ratio(a: Any, b: Any) -> float | None:
    return round(a / b, 3) if a and b else None


def _print_profiles(directory: str, kinds: list[str], top: int) -> None:
    import pstats

    for name in sorted(os.listdir(directory)):
        if not name.endswith(".prof") or not any(name.startswith(k) for k in kinds):
            continue
        print(f"\n--- cProfile {name} (top {top} by own time) ---")
        pstats.Stats(os.path.join(directory, name)).sort_stats("tottime").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=2000, help="entries due at once (2000)")
    ap.add_argument("--beats", type=int, default=1,
                    help="beat processes for beat_claims and redbeat (1)")
    ap.add_argument("--interval", type=float, default=None,
                    help="interval of every entry, seconds (default: 2 + 1 ms per entry,"
                         " + 10 s with --beats > 1 so that no second occurrence falls in"
                         " the window)")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="abort a scheduler that has not sent the burst after this (300 s)")
    ap.add_argument("--grace", type=float, default=2.0,
                    help="with --beats > 1, keep watching this long for duplicates (2 s)")
    ap.add_argument("--schedulers", default=",".join(KINDS),
                    help=f"comma-separated subset of {','.join(KINDS)}")
    ap.add_argument("--profile", metavar="DIR", default=None,
                    help="cProfile the burst of each child, write DIR/<scheduler>-<i>.prof")
    ap.add_argument("--profile-kinds", default="beat_claims",
                    help="schedulers to profile with --profile (beat_claims)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per scheduler; the median run is reported (1)")
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    args = ap.parse_args(argv)
    if args.interval is None:
        args.interval = 2.0 + args.entries / 1000 + (10.0 if args.beats > 1 else 0.0)
    args.profile_kinds = [k for k in args.profile_kinds.split(",") if k]
    kinds = [k.strip() for k in args.schedulers.split(",") if k.strip()]
    for k in kinds:
        if k not in KINDS:
            ap.error(f"unknown scheduler {k!r}")
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)

    server = RedisServer()
    workdir = tempfile.mkdtemp(prefix="bench-due-burst-")
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    try:
        for rep in range(args.repeat):  # round-robin, so that noise spreads over all three
            for kind in kinds:
                beats = 1 if kind == "celery" else args.beats
                if not args.json:
                    print(f"[{rep + 1}/{args.repeat}] running {LABELS[kind]} x{beats}"
                          f" ({args.entries} entries) ...", file=sys.stderr, flush=True)
                runs[kind].append(run_one(kind, beats, args, server, workdir))
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    results = [_median_run(runs[kind]) for kind in kinds]

    by = {r["scheduler"]: r for r in results}
    bc = by.get("beat_claims", {}).get("seconds")
    summary = {
        "benchmark": "due_burst",
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "entries": args.entries, "beats": args.beats, "interval": args.interval,
        "repeat": args.repeat,
        "results": results,
        "ratios": {
            # time ratios: < 1 means beat_claims sends the burst faster
            "beat_claims/celery": _ratio(bc, by.get("celery", {}).get("seconds")),
            "beat_claims/redbeat": _ratio(bc, by.get("redbeat", {}).get("seconds")),
        },
    }
    if not args.json:
        print()
        hdr = (f"{'scheduler':34} {'beats':>5} {'status':>8} {'seconds':>9} {'sends/s':>9}"
               f" {'min..max s':>15} {'queued':>7} {'exact':>6} {'RT/task':>8} {'ticks':>6}")
        print(hdr)
        print("-" * len(hdr))
        for r in results:
            secs = "-" if r.get("seconds") is None else f"{r['seconds']:.3f}"
            rate = "-" if not r.get("sends_per_second") else f"{r['sends_per_second']:.0f}"
            beats = f"{r['beats']}" + (f"({r['beats'] - r['standby_beats']})"
                                        if r.get("standby_beats") else "")
            times = [t for t in r["runs_seconds"] if t is not None]
            spread = f"{min(times):.3f}..{max(times):.3f}" if times else "-"
            print(f"{r['label']:34} {beats:>5} {r['status']:>8} {secs:>9} {rate:>9}"
                  f" {spread:>15} {r.get('queued', '-'):>7}"
                  f" {r.get('all_runs_exactly_n', '-')!s:>6}"
                  f" {r.get('round_trips_per_task', '-'):>8} {r.get('ticks', '-'):>6}")
        for key, value in summary["ratios"].items():
            print(f"time ratio {key}: {value if value is not None else '-'}")
        if any(r.get("standby_beats") for r in results):
            print("redbeat: beats(active) -- only the beat holding RedBeat's lock sends.")
        for r in results:
            if r.get("errors"):
                print(f"{r['scheduler']} errors: {r['errors']}")
            if r.get("warnings"):
                print(f"{r['scheduler']} warnings logged by the beat(s): {r['warnings']}")
        if args.profile:
            _print_profiles(args.profile, args.profile_kinds, 25)
        print()
    print(json.dumps(summary, sort_keys=True))
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
