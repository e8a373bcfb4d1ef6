#!/usr/bin/env python
"""How fast a change of one django-celery-beat row reaches the beats, with many rows.

A PostgreSQL database of the run's own (``bench/dispatch.py``'s ``PostgresDatabase``)
gets ``--rows`` (100,000) ``PeriodicTask`` rows due once a day (made with
``bulk_create``, their ``date_changed`` an hour old, as rows made long before), plus
``target`` (every 60 s), ``to-disable`` and ``to-delete`` (every second). Then:

1. In this process, what each read of beat-claims' ``DatabaseScheduler`` costs at that
   size: the queries of a move of the change marker (the enabled ids, the rows changed
   lately by id and date, the schedule tables) and the full comparison every
   ``FULL_READ_EVERY`` (every enabled row's columns).
2. Two ``celery beat -S beat_claims.contrib.django.DatabaseScheduler`` processes (the test
   site's app, ``tests/djangosite``, with the default heartbeat and loop interval of 5 s:
   ``bench/django_rows_settings.py``; store and broker on a private redis-server). Once
   both read the rows: ``target``'s interval is changed to 2 s with ``save()``,
   ``to-disable`` disabled with ``save()``, ``to-delete`` deleted (``target``'s arguments
   changed too: its messages by the new definition are told apart). Reported: the time
   from ``save()`` to the first message of ``target`` with the new definition's arguments
   (the broker's queue is polled every 20 ms: nobody consumes), the rows each beat says it read, and
   each beat's CPU from the save until the change was applied, less the same time idle.
3. ``--compare`` (default on): one ``celery beat -S
   django_celery_beat.schedulers:DatabaseScheduler`` on the same rows (one: it has no
   coordination), once its schedule is read (its CPU at rest): ``target``'s interval
   changed to 3 s (and its arguments) with ``save()``, and the same figures.

The last line is one JSON document with every figure.

Usage::

    python bench/django_rows.py                  # 100,000 rows; ~5 minutes on two cores
    python bench/django_rows.py --rows 20000 --no-compare
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: bench/ is not a package on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil

from bench.dispatch import PostgresDatabase, RedisServer

ROOT = Path(__file__).resolve().parents[1]
READ = re.compile(r"database rows \(the change marker moved\): read (\d+) changed rows of"
                  r" (\d+) enabled, (\d+) gone; (\d+) entries changed \(([\d.]+)s\)")


def _django(db_name: str, redis_url: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.django_rows_settings",
        "BC_DJANGO_DB_NAME": db_name,
        "BC_REDIS_URL": redis_url,
        "BC_BROKER_URL": redis_url.rsplit("/", 1)[0] + "/1",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    os.environ.update({k: env[k] for k in ("DJANGO_SETTINGS_MODULE", "BC_DJANGO_DB_NAME",
                                           "BC_REDIS_URL", "BC_BROKER_URL")})
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return env


def _make_rows(n: int) -> None:
    from django.utils import timezone
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    daily = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.DAYS)
    for start in range(0, n, 10_000):
        PeriodicTask.objects.bulk_create(
            [PeriodicTask(name=f"bulk-{i:06d}", task="djangosite.record", interval=daily,
                          args=f"[{i}]") for i in range(start, min(n, start + 10_000))])
    PeriodicTask.objects.update(date_changed=timezone.now() - timedelta(hours=1))
    for name, seconds in (("target", 60), ("to-disable", 1), ("to-delete", 1)):
        every = IntervalSchedule.objects.create(every=seconds, period=IntervalSchedule.SECONDS)
        PeriodicTask.objects.create(name=name, task="djangosite.record", interval=every)


def _timed(f: Any, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - started)
    return round(best, 4)


def _query_costs() -> dict[str, float]:
    """beat-claims' reads at this size, in this process (best of three, seconds)."""
    from django.utils import timezone
    from django_celery_beat.models import PeriodicTask

    from beat_claims.contrib.django import database_scheduler as ds

    enabled = PeriodicTask.objects.filter(enabled=True)
    since = timezone.now() - ds.CHANGE_MARGIN
    scheduler = ds.DatabaseScheduler.__new__(ds.DatabaseScheduler)
    return {
        "enabled_ids": _timed(lambda: set(enabled.values_list("id", flat=True))),
        "changed_lately_by_id_and_date": _timed(lambda: list(PeriodicTask.objects.filter(
            date_changed__gte=since).values_list("id", "date_changed"))),
        "schedule_tables": _timed(scheduler._schedule_rows),
        "full_comparison": _timed(lambda: {v[0]: ds._digest(v) for v in enabled.values_list(
            *ds._ROW_FIELDS)}, 2),
    }


class Broker:
    """The broker's queue, polled for the messages of one entry (nobody consumes)."""

    def __init__(self, redis_url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/1")
        self.seen = self.client.llen("celery")

    def first_after(self, name: str, args: list[Any], after: float, timeout: float
                    ) -> float | None:
        """When the first message of ``name`` with ``args`` (those of its new definition)
        published after ``after`` was seen."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            length = self.client.llen("celery")
            if length > self.seen:
                fresh = self.client.lrange("celery", 0, length - self.seen - 1)
                self.seen = length
                now = time.time()
                for raw in fresh:
                    message = json.loads(raw)
                    if message["headers"].get("periodic_task_name") != name:
                        continue
                    body = json.loads(base64.b64decode(message["body"]))
                    if body[0] == args and now >= after:
                        return now
            time.sleep(0.02)
        return None


def _beat(env: dict[str, str], scheduler: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.djangosite.celery", "beat",
             "--loglevel", "INFO", "-S", scheduler, "-s", str(log.with_suffix(".db"))],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _cpu(procs: list[subprocess.Popen[bytes]]) -> list[float]:
    out = []
    for proc in procs:
        times = psutil.Process(proc.pid).cpu_times()
        out.append(times.user + times.system)
    return out


def _wait(predicate: Any, timeout: float, what: str) -> float:
    started = time.time()
    while not predicate():
        if time.time() - started > timeout:
            raise SystemExit(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)
    return time.time() - started


def _at_rest(procs: list[subprocess.Popen[bytes]], timeout: float) -> float:
    """Until the beats use less than a tenth of a core over two seconds (read and
    registered); how long that took."""
    started = time.time()
    before = _cpu(procs)
    while True:
        time.sleep(2)
        after = _cpu(procs)
        if max(b - a for a, b in zip(before, after, strict=True)) < 0.2:
            return time.time() - started
        if time.time() - started > timeout:
            raise SystemExit("the beats did not come to rest")
        before = after


def _save(name: str, **fields: Any) -> float:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    row = PeriodicTask.objects.get(name=name)
    if "every" in fields:
        row.interval = IntervalSchedule.objects.create(every=fields.pop("every"),
                                                       period=IntervalSchedule.SECONDS)
    for key, value in fields.items():
        setattr(row, key, value)
    row.save()
    return time.time()


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def _beat_claims(env: dict[str, str], redis_url: str, rows: int, workdir: Path,
                 timeout: float) -> dict[str, Any]:
    from django_celery_beat.models import PeriodicTask

    logs = [workdir / f"beat-claims-{i}.log" for i in range(2)]
    started = time.time()
    beats = [_beat(env, "beat_claims.contrib.django.DatabaseScheduler", log) for log in logs]
    try:
        for log in logs:
            _wait(lambda log=log: f"read {rows + 3} enabled rows" in log.read_text(), timeout,
                  "the beats to read the rows")
        read_at_start = time.time() - started
        for log in logs:
            _wait(lambda log=log: "entries registered; claiming" in log.read_text(), timeout,
                  "the beats to register the entries")
        _at_rest(beats, timeout)
        registered = time.time() - started
        broker = Broker(redis_url)
        cpu_before = _cpu(beats)
        saved = _save("target", every=2, args="[2]")
        _save("to-disable", enabled=False)
        PeriodicTask.objects.get(name="to-delete").delete()
        sent = broker.first_after("target", [2], saved, timeout)
        _wait(lambda: all("entry to-delete: no longer scheduled" in log.read_text()
                          for log in logs), timeout, "both beats to apply the changes")
        window = time.time() - saved
        cpu_after = _cpu(beats)
        time.sleep(window)  # as long again, at rest
        cpu_idle = _cpu(beats)
        reads = [[dict(zip(("rows_read", "enabled", "gone", "entries_changed", "seconds"),
                           (float(v) if "." in v else int(v) for v in m), strict=True))
                  for m in READ.findall(log.read_text())] for log in logs]
    finally:
        _stop(beats)
    return {
        "beats": 2,
        "start_to_rows_read_s": round(read_at_start, 2),
        "start_to_registered_at_rest_s": round(registered, 2),
        "save_to_first_send_by_new_definition_s": None if sent is None else round(
            sent - saved, 3),
        "reads_per_beat": reads,
        "cpu_per_beat_for_the_change_s": [
            round((a - b) - (i - a), 3) for b, a, i in zip(cpu_before, cpu_after, cpu_idle,
                                                           strict=True)],
    }


def _django_celery_beat(env: dict[str, str], redis_url: str, rows: int, workdir: Path,
                        timeout: float) -> dict[str, Any]:
    log = workdir / "django-celery-beat.log"
    started = time.time()
    beats = [_beat(env, "django_celery_beat.schedulers:DatabaseScheduler", log)]
    try:
        _wait(lambda: "beat: Starting" in log.read_text(), timeout, "django-celery-beat")
        _at_rest(beats, timeout)
        at_rest = time.time() - started
        broker = Broker(redis_url)
        cpu_before = _cpu(beats)
        saved = _save("target", every=3, args="[3]")
        sent = broker.first_after("target", [3], saved, timeout)
        window = time.time() - saved
        cpu_after = _cpu(beats)
        time.sleep(window)
        cpu_idle = _cpu(beats)
    finally:
        _stop(beats)
    return {
        "beats": 1,
        "start_to_at_rest_s": round(at_rest, 2),
        "save_to_first_send_by_new_definition_s": None if sent is None else round(
            sent - saved, 3),
        "rows_read_per_change": rows + 2,  # every enabled row (to-disable, target, bulk)
        "cpu_for_the_change_s": round((cpu_after[0] - cpu_before[0])
                                      - (cpu_idle[0] - cpu_after[0]), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--compare", action=argparse.BooleanOptionalAction, default=True,
                        help="django-celery-beat's own DatabaseScheduler too")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    server = RedisServer("django-rows")
    pg = PostgresDatabase()
    result: dict[str, Any] = {"rows": args.rows + 3}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-django-rows-") as tmp:
            env = _django(pg.name, server.url)
            started = time.time()
            _make_rows(args.rows)
            result["bulk_create_s"] = round(time.time() - started, 2)
            result["beat_claims_reads_s"] = _query_costs()
            print(json.dumps(result["beat_claims_reads_s"]), file=sys.stderr)
            result["beat_claims"] = _beat_claims(env, server.url, args.rows, Path(tmp),
                                                 args.timeout)
            print(json.dumps(result["beat_claims"]), file=sys.stderr)
            if args.compare:
                result["django_celery_beat"] = _django_celery_beat(
                    env, server.url, args.rows, Path(tmp), args.timeout)
    finally:
        from django.db import connections

        with contextlib.suppress(Exception):
            connections.close_all()
        pg.stop()
        server.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
