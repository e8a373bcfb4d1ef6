"""The ``dynamic_<N>`` workload of bench/dispatch.py: N entries created at run time through
each scheduler's own API before one beat starts (``--dynamic-entries``).

One run, for beat-claims (on each ``--store``) and for RedBeat (on the store
redis-server):

1. The store is emptied (as for the other workloads). For beat-claims a *primer* beat with
   no entries is started in the creator process and ticked until it claims, then stopped:
   the store's epoch has settled before the entries are written, so the startup measured
   is that of a beat joining a store in service, not a new store's settle period (one
   heartbeat TTL, 15 s, measured by the other workloads).
2. The store's size is read (Redis ``INFO memory`` ``used_memory``; PostgreSQL the
   ``pg_total_relation_size`` of every table of the store's schemas, indexes and TOAST
   included; SQLite the database file and its WAL).
3. A *creator* process (spawned, like the beats; nothing of it is measured but its own
   time) writes N interval entries of one hour (``entry-0000000`` ...), each with its name
   as its only argument: beat-claims' ``Entries(app).bulk_create(items)``, one call for
   all N (it validates every item, then writes 500 a chunk); RedBeat's
   ``RedBeatSchedulerEntry(name, task, schedule(3600 s), args=[name], app=app).save()``,
   one by one as its API does (each ``save()`` one MULTI/EXEC pipeline of HSET, HSETNX,
   ZADD). ``--redbeat-create both`` also times the same commands pipelined 500 entries a
   round trip (not RedBeat's API: what a bulk writer could do), written under another key
   prefix and deleted before the beat starts. Neither is due for an hour (beat-claims
   anchors an interval at its creation; RedBeat's entry has ``last_run_at`` = now, Celery's
   default; the steady workload, ``bench/steady.py``, gives them a one-minute crontab
   and a claims policy instead). Then ``--dynamic-soon`` entries due once, ``soon_lead``
   seconds after the bulk ended, are created the same way (beat-claims: a ``clocked``
   schedule, one ``bulk_create``; RedBeat: an interval of an hour whose ``last_run_at``
   is one hour before that instant): the beat must send each exactly once.
   ``create_seconds`` is the time of the N entries' calls only (the items are built
   before the clock starts);
   ``create_cpu_seconds`` the creator's own CPU time in them (the store server's is not
   counted).
   With ``--dynamic-start restarted`` (the default) the creator then heartbeats once in
   beat-claims' store as a beat of its own and exits: the beat started next finds the
   store as a restarted beat does (its last heartbeat recent, no beat alive) and joins at
   its first heartbeat. With ``cold`` it does not: when the creation took longer than a
   heartbeat TTL (15 s), the store shows no heartbeat for longer than that (it may be an
   older copy put back), and the beat waits a heartbeat TTL and a confirming
   heartbeat before it claims (``beat_claims.beat.liveness.Joining``); its
   ``startup_marks`` show that wait (``joining``).
4. The store's size is read again: ``store_bytes_per_entry`` = the growth / N.
5. One beat process is spawned (``startup_seconds`` counts from just before the spawn:
   interpreter, imports, the scheduler built as ``celery beat -S`` builds it,
   ``beat_init``, ticks) and ticked as ``Service.start`` does (sleeping what ``tick()``
   returns) until it is ready: beat-claims when it logs ``entries registered; claiming``
   (the time of that log record), RedBeat at the end of its first tick after taking its
   lock. ``startup_cpu_seconds`` is the CPU time the beat process used until then (its
   ``time.process_time()``: what the machine's other load changes least).
   ``startup_after_import_seconds`` counts from the moment the beat had imported
   everything and read its configuration; ``startup_marks`` gives, in seconds after the
   spawn, the end of each beat-claims tick until ready and when it logged its definitions
   read and composed (``loaded``), ``joining``, ``settling`` and ``ready``.
6. The parent waits until the soon entries are in the broker's queue, ``--settle``
   seconds more, then measures the beat's CPU over ``--idle-seconds`` (no entry is due in
   that window) as the idle workload does, and the store's size once more
   (``store_bytes_per_entry_running``: what the beat added, e.g. beat-claims' registrations,
   counted in). The beat's peak RSS is its ``VmHWM`` (its whole life: the startup
   included); ``rss_ready_mib`` is its ``VmRSS`` when it became ready.

Above ``--dynamic-beat-max`` entries no beat is started: only the create time and the
store's bytes per entry are measured (for 1,000,000).
"""

from __future__ import annotations

import argparse
import collections
import logging
import multiprocessing as mp
import os
import sys
import time
import traceback
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

# (the parent imports this module from bench/dispatch.py; so do the spawned children)
from bench.dispatch import (
    _PG_SYSTEM,
    IDLE_INTERVAL,
    QUEUE,
    TASK,
    Beats,
    Case,
    RedisServer,
    _base_cfg,
    _build,
    _busy_cpu,
    _command_delta,
    _decode_queue,
    _fmt,
    _make_app,
    _median,
    _other_cpu,
    _peak_rss_kib,
    _ratio,
    _tree_conf,
    _variant,
    _vm_kib,
    _window,
    check_import,
    runs_status,
)

#: The log line of a beat-claims beat that is ready to claim (scheduler.py).
READY_LINE = "entries registered; claiming"
CLAIMS_LOGGER = "celery.beat.claims"
#: RedBeat entries a pipeline writes at once with ``--redbeat-create both``.
PIPELINE_CHUNK = 500
#: beat-claims' goal for a beat's startup and peak RSS whatever N (the due index).
GOAL_STARTUP_SECONDS = 2.0
GOAL_RSS_MB = 100.0  # megabytes (10^6 bytes)
FIGURES = ("create_seconds", "create_us_per_entry", "create_cpu_seconds",
           "create_seconds_pipeline", "startup_cpu_seconds",
           "creator_peak_rss_mib", "store_bytes_per_entry", "store_bytes_per_entry_running",
           "startup_seconds", "startup_after_import_seconds", "ready_ticks",
           "rss_ready_mib", "peak_rss_mib", "rss_end_mib", "cpu_seconds_per_minute",
           "ticks_per_minute", "store_round_trips_per_minute", "store_commands_per_minute",
           "soon_lag_ms_max", "other_cpu_seconds")
RUN_FIELDS = ("status", *FIGURES, "prime_seconds", "soon_lead", "soon_sent",
              "soon_due_before_ready", "unexpected_sends", "duplicates", "beat_started",
              "startup_marks", "store_commands_by_name",
              "store_bytes", "loadavg_before", "loadavg_after", "error", "errors",
              "warnings")


def dynamic_names(n: int, prefix: str = "entry") -> list[str]:
    return [f"{prefix}-{i:07d}" for i in range(n)]


#: beat-claims' INFO lines whose first time is noted (``startup_marks``): its definitions
#: read and composed, joining (a store with no recent heartbeat), settling (a new epoch).
MARKS = {"loaded": "now scheduled)", "joining": "beat-claims: joining:",
         "settling": "the store has a new epoch", "ready": READY_LINE}


class _ReadyLine(logging.Handler):
    """Notes the time of beat-claims' "entries registered; claiming" record (``at``), and
    of the first of each of the :data:`MARKS` lines."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.at: float | None = None
        self.marks: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        for mark, words in MARKS.items():
            if mark not in self.marks and words in text:
                self.marks[mark] = record.created
        if self.at is None and READY_LINE in text:
            self.at = record.created


def _watch_ready_line() -> _ReadyLine:
    """A handler that sees beat-claims' INFO records (only WARNING and up are printed)."""
    for handler in logging.getLogger().handlers:
        if handler.level < logging.WARNING:
            handler.setLevel(logging.WARNING)
    watch = _ReadyLine()
    claims = logging.getLogger(CLAIMS_LOGGER)
    claims.setLevel(logging.INFO)
    claims.addHandler(watch)
    return watch


def _tick_until_ready(kind: str, sched: Any, deadline: float
                      ) -> tuple[float, int, dict[str, float]]:
    """Tick as ``Service.start`` does (sleeping what ``tick()`` returns) until the beat is
    ready: (when, ticks, marks). RedBeat: the end of its first tick; beat-claims: its log
    line (``marks``: when its :data:`MARKS` lines were logged, and each tick's end)."""
    if kind != "beat_claims":
        sched.tick()
        return time.time(), 1, {}
    watch = _watch_ready_line()
    ticks = 0
    try:
        while True:
            wait = sched.tick()
            ticks += 1
            watch.marks.setdefault(f"tick{ticks}_end", time.time())
            if watch.at is not None:
                return watch.at, ticks, watch.marks
            if time.time() > deadline:
                raise RuntimeError(f"no {READY_LINE!r} within the setup timeout")
            if wait and wait > 0:
                time.sleep(wait)
    finally:
        logging.getLogger(CLAIMS_LOGGER).removeHandler(watch)


def setup(kind: str, sched: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """The beat's setup in a dynamic run (called by bench/dispatch.py's ``_child``)."""
    t0 = time.time()
    ready, ticks, marks = _tick_until_ready(kind, sched, t0 + cfg["setup_timeout"])
    out = {"first_tick": (t0, t0), "registered_tick": (t0, t0), "setup_ticks": ticks,
           "ready_at": ready, "rss_ready_kib": _vm_kib("VmRSS") or 0, "marks": marks,
           "cpu_ready": time.process_time()}
    if sched.should_sync():
        sched._do_sync()
    return out


# -- the creator process ---------------------------------------------------------------------
def _prime(app: Any, cfg: dict[str, Any]) -> float:
    """A beat-claims beat with no entries, ticked until it claims and stopped: the store's
    new epoch has settled (seconds it took)."""
    t0 = time.time()
    service, sched = _build("beat_claims", app, cfg["workdir"], 99)
    try:
        _tick_until_ready("beat_claims", sched, t0 + cfg["setup_timeout"])
    finally:
        service.sync()  # the scheduler's close(), as celery beat does on its way out
    return round(time.time() - t0, 3)


def entry_schedule(cfg: dict[str, Any]) -> dict[str, Any]:
    """The N entries' schedule in a definition's JSON form: ``cfg["schedule"]`` (the steady
    workload's one-minute crontab, bench/steady.py), else an interval of an hour."""
    return dict(cfg.get("schedule") or {"every": IDLE_INTERVAL})


def celery_schedule(spec: dict[str, Any]) -> Any:
    """Celery's schedule of :func:`entry_schedule`'s JSON form (for RedBeat's entries):
    ``{"every": seconds}`` or ``{"crontab": {field: value}}``."""
    from celery.schedules import crontab, schedule

    if "crontab" in spec:
        return crontab(**spec["crontab"])
    return schedule(timedelta(seconds=spec["every"]))


def _create_beat_claims(app: Any, names: list[str], cfg: dict[str, Any]
                        ) -> tuple[float, float]:
    """beat-claims' API: one ``bulk_create`` of every entry (seconds of that call, and the
    CPU seconds of this process in it); the ``claims`` policy of ``cfg``, if any."""
    from beat_claims.entries import Entries

    claims = {"claims": cfg["claims"]} if cfg.get("claims") else {}
    items = [{"name": name, "task": TASK, "schedule": entry_schedule(cfg), "args": [name],
              **claims} for name in names]
    with Entries(app, by="bench") as entries:
        t0, c0 = time.perf_counter(), time.process_time()
        results = entries.bulk_create(items)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    failed = [r for r in results if r.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} entries not created: {failed[0].error}")
    return seconds, cpu


def _soon_beat_claims(app: Any, names: list[str], at: float) -> None:
    """Entries due once, at ``at`` (a clocked schedule): one ``bulk_create``, as a writer
    of many entries would (one ``create`` each took 80 s for 10,000 on MySQL, past their
    instant: those created after it are missed occurrences, sent late)."""
    from beat_claims.entries import Entries

    when = datetime.fromtimestamp(at, timezone.utc)
    with Entries(app, by="bench") as entries:
        results = entries.bulk_create({"name": name, "task": TASK, "schedule": when,
                                       "args": [name]} for name in names)
    failed = [r for r in results if r.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} soon entries not created: {failed[0].error}")


def _redbeat_entries(app: Any, names: list[str], last_run_at: datetime | None,
                     spec: dict[str, Any] | None = None) -> Any:
    from redbeat import RedBeatSchedulerEntry

    every = celery_schedule(spec or {"every": IDLE_INTERVAL})
    extra = {"last_run_at": last_run_at} if last_run_at is not None else {}
    for name in names:
        yield RedBeatSchedulerEntry(name, TASK, every, args=[name], app=app, **extra)


def _create_redbeat(app: Any, names: list[str], cfg: dict[str, Any]) -> tuple[float, float]:
    """RedBeat's API: each entry built and saved (``save()``: one pipeline each)."""
    t0, c0 = time.perf_counter(), time.process_time()
    for entry in _redbeat_entries(app, names, None, entry_schedule(cfg)):
        entry.save()
    return time.perf_counter() - t0, time.process_time() - c0


def _soon_redbeat(app: Any, names: list[str], at: float) -> None:
    """Entries of an hour's interval last run an hour before ``at``: due at ``at``."""
    due = datetime.fromtimestamp(at - IDLE_INTERVAL, timezone.utc)
    for entry in _redbeat_entries(app, names, due):
        entry.save()


def _redbeat_pipelined(cfg: dict[str, Any], names: list[str]) -> float:
    """The commands of RedBeat's ``save()`` for the N entries, 500 entries a pipeline, under
    another key prefix: timed, then deleted."""
    import json

    from redbeat.decoder import RedBeatJSONEncoder
    from redbeat.schedulers import get_redis

    app = _make_app({**cfg, "names": [],
                     "extra_conf": {"redbeat_key_prefix": "bench-pipelined:"}})
    client = get_redis(app)
    zkey = app.redbeat_conf.schedule_key
    t0 = time.perf_counter()
    batch: list[Any] = []

    def write(entries: list[Any]) -> None:
        with client.pipeline() as pipe:
            for e in entries:
                definition = {"name": e.name, "task": e.task, "args": e.args,
                              "kwargs": e.kwargs, "options": e.options,
                              "schedule": e.schedule, "enabled": e.enabled}
                pipe.hset(e.key, "definition", json.dumps(definition, cls=RedBeatJSONEncoder))
                pipe.hsetnx(e.key, "meta", json.dumps({"last_run_at": e.last_run_at},
                                                      cls=RedBeatJSONEncoder))
                pipe.zadd(zkey, {e.key: e.score})
            pipe.execute()

    for entry in _redbeat_entries(app, names, None, entry_schedule(cfg)):
        batch.append(entry)
        if len(batch) == PIPELINE_CHUNK:
            write(batch)
            batch = []
    if batch:
        write(batch)
    seconds = time.perf_counter() - t0
    keys = client.zrange(zkey, 0, -1)
    for start in range(0, len(keys), 10000):
        client.unlink(*keys[start:start + 10000])
    client.unlink(zkey)
    return seconds


def _heartbeat_as_a_stopped_beat(app: Any) -> None:
    """One heartbeat in the store from this process, which then exits: the beat started
    next finds the store as a restarted beat does (its last heartbeat recent, no beat
    alive) and joins at its first heartbeat (beat_claims.beat.liveness.Joining)."""
    from beat_claims.runs import Owner
    from beat_claims.settings import Settings
    from beat_claims.stores import open_store

    settings = Settings.from_app(app)
    store = open_store(settings)
    try:
        store.heartbeat(Owner.current(), settings.heartbeat_ttl)
    finally:
        store.close()


def _creator(kind: str, src: str | None, cfg: dict[str, Any], out_q: Any, go: Any) -> None:
    """Prime the store (beat-claims), wait for the parent's go, create the entries."""
    if src:
        sys.path.insert(0, src)
    logging.basicConfig(level=logging.WARNING,
                        format=f"%(asctime)s creator-{kind} %(levelname)s %(name)s:"
                               " %(message)s")
    try:
        app = _make_app({**cfg, "names": []})
        primed = _prime(app, cfg) if kind == "beat_claims" else 0.0
        out_q.put(("primed", primed))
        go.wait()
        n = cfg["n"]
        names = dynamic_names(n)
        soon = dynamic_names(cfg["soon"], "soon")
        out: dict[str, Any] = {}
        if kind == "redbeat" and cfg["redbeat_create"] == "both":
            out["create_seconds_pipeline"] = round(_redbeat_pipelined(cfg, names), 3)
        create, make_soon = ((_create_beat_claims, _soon_beat_claims) if kind == "beat_claims"
                             else (_create_redbeat, _soon_redbeat))
        seconds, cpu = create(app, names, cfg)
        soon_at = time.time() + cfg["soon_lead"]
        make_soon(app, soon, soon_at)
        if kind == "beat_claims" and cfg.get("dynamic_start") == "restarted":
            _heartbeat_as_a_stopped_beat(app)
        out.update({"create_seconds": round(seconds, 3), "create_cpu_seconds": round(cpu, 3),
                    "soon_at": soon_at,
                    "creator_peak_rss_kib": _peak_rss_kib()})
        out_q.put(("created", out))
    except Exception:
        out_q.put(("error", traceback.format_exc()))


# -- the parent: one run ----------------------------------------------------------------------
def store_bytes(case: Case, store: RedisServer, cfg: dict[str, Any]) -> int:
    """The store's size now: Redis ``used_memory``; PostgreSQL the tables of the store's
    schemas (``pg_total_relation_size``: indexes and TOAST included); SQLite the database
    file and its WAL; MySQL the data and indexes of the run's database's tables."""
    if case.store == "redis":
        return int(store.client.info("memory")["used_memory"])
    if case.store == "sqlite":
        path = cfg["store_url"].partition(":///")[2]
        return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
    if case.store == "mysql":
        return _mysql_bytes(cfg["store_url"])
    import psycopg

    with psycopg.connect(cfg["store_url"], autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            f" WHERE c.relkind IN ('r', 'p', 'm') AND {_PG_SYSTEM}").fetchone()
    return int(row[0]) if row else 0


def _mysql_bytes(url: str) -> int:
    """The data and indexes of every table of the run's MySQL database (InnoDB's figures,
    refreshed by ``ANALYZE TABLE`` first: they are estimates kept by the engine)."""
    from urllib.parse import unquote, urlsplit

    import pymysql

    parts = urlsplit(url)
    conn = pymysql.connect(host=parts.hostname, port=parts.port or 3306,
                           user=unquote(parts.username or "root"),
                           password=unquote(parts.password or ""),
                           database=parts.path.lstrip("/"), autocommit=True,
                           connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW TABLES")
            for (table,) in list(cur.fetchall()):
                cur.execute(f"ANALYZE TABLE `{table}`")
                cur.fetchall()
            cur.execute("SELECT COALESCE(SUM(data_length + index_length), 0)"
                        " FROM information_schema.TABLES WHERE table_schema = DATABASE()")
            row = cur.fetchone()
    finally:
        conn.close()
    return int(row[0]) if row else 0


def _create(case: Case, cfg: dict[str, Any], args: argparse.Namespace, store: RedisServer,
            out: dict[str, Any]) -> dict[str, Any] | str:
    """The creator's run (priming the store first for beat-claims): its figures, or why it
    failed. Fills ``out`` with the store's size before and after."""
    ctx = mp.get_context("spawn")
    q, go = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_creator, args=(case.scheduler, case.source.path, cfg, q, go),
                       daemon=True)
    proc.start()
    try:
        kind, payload = q.get(timeout=args.setup_timeout + 60)
        if kind == "error":
            return str(payload)
        out["prime_seconds"] = payload
        out["store_bytes"] = [store_bytes(case, store, cfg)]
        go.set()
        kind, payload = q.get(timeout=args.dynamic_create_timeout)
        if kind == "error":
            return str(payload)
        out["store_bytes"].append(store_bytes(case, store, cfg))
        return dict(payload)
    except Exception as exc:  # queue.Empty: the creator took too long
        return f"creator: no answer ({exc!r})"
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()


def _soon_figures(messages: list[dict[str, Any]], results: dict[int, Any], soon: int,
                  soon_at: float, ready_at: float) -> dict[str, Any]:
    """Whether the soon entries were each sent once, and nothing else was."""
    sent = collections.Counter(m["entry"] for m in messages)
    soon_sent = {name: c for name, c in sent.items() if str(name).startswith("soon-")}
    lags = [t - soon_at for r in results.values() for t, _ in r.get("publishes", [])]
    return {"soon_sent": len(soon_sent),
            "duplicates": sum(c - 1 for c in sent.values() if c > 1),
            "unexpected_sends": sum(c for name, c in sent.items()
                                    if not str(name).startswith("soon-")),
            "soon_due_before_ready": ready_at > soon_at,
            "soon_lag_ms_max": round(1000 * max(lags), 1) if len(lags) >= soon and lags
            else None}


def created_run_cfg(case: Case, args: argparse.Namespace, store: RedisServer,
                    broker: RedisServer, workdir: str, run_id: str, **fields: Any
                    ) -> dict[str, Any]:
    """The servers emptied, and the configuration of a run whose entries the creator makes
    (:func:`_create`) before its beats start (``fields``: the workload's own: ``n``,
    ``soon``, ``soon_lead``, ``redbeat_create``, ``dynamic_start``, ...)."""
    for server in (store, broker):
        server.client.flushall()
    profile = args.profile if case.scheduler in args.profile_schedulers else None
    return {**_base_cfg(case, [], store, broker, workdir, profile, run_id,
                        args.setup_timeout, args.databases),  # (new SQLite file; databases emptied)
            "interval": IDLE_INTERVAL, "last_run_at": time.time(), "idle": True,
            "dynamic": True, "extra_conf": _tree_conf(case, args), **fields}


def start_beats(case: Case, cfg: dict[str, Any], args: argparse.Namespace
                ) -> tuple[Beats, dict[int, Any], float] | str:
    """Spawn and configure the run's beats and wait until each is ready (:func:`setup`):
    the beats, their "ready" messages and when they were spawned; or why they are not."""
    spawned = time.time()
    beats = Beats(case)
    beats.configure(cfg)
    ready, problem = beats.collect("ready", spawned + args.setup_timeout + 60)
    if problem:
        beats.finish(3)
        return problem
    check_import(case, args, beats)  # (its "imported" message came before "ready")
    return beats, ready, spawned


def run_dynamic(case: Case, n: int, soon_lead: float, args: argparse.Namespace,
                store: RedisServer, broker: RedisServer, workdir: str,
                run_id: str) -> dict[str, Any]:
    """N entries created through the scheduler's API, then one beat started (module doc)."""
    out: dict[str, Any] = {"entries": n, "beats": 1, "soon_lead": round(soon_lead, 2),
                           "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    cfg = created_run_cfg(case, args, store, broker, workdir, run_id, n=n,
                          soon=args.dynamic_soon, soon_lead=soon_lead,
                          redbeat_create=args.redbeat_create,
                          dynamic_start=args.dynamic_start)
    created = _create(case, cfg, args, store, out)
    if isinstance(created, str):
        return {**out, "status": "error", "error": created}
    out["create_seconds"] = created["create_seconds"]
    out["create_us_per_entry"] = round(1e6 * created["create_seconds"] / n, 1)
    out["create_cpu_seconds"] = created.get("create_cpu_seconds")
    if "create_seconds_pipeline" in created:
        out["create_seconds_pipeline"] = created["create_seconds_pipeline"]
    out["creator_peak_rss_mib"] = round(created["creator_peak_rss_kib"] / 1024, 1)
    base = out["store_bytes"][0]
    out["store_bytes_per_entry"] = round((out["store_bytes"][1] - base) / n, 1)
    out["beat_started"] = n <= args.dynamic_beat_max
    if not out["beat_started"]:
        out["status"] = "ok"
        return out
    started = start_beats(case, cfg, args)
    if isinstance(started, str):
        return {**out, "status": "error", "error": started}
    beats, ready, spawned = started
    r = ready[0]
    beats.go.set()
    out.update({"startup_seconds": round(r["ready_at"] - spawned, 3),
                "startup_after_import_seconds": round(r["ready_at"] - r["setup_started"], 3),
                "startup_cpu_seconds": round(r["cpu_ready"], 3),
                "ready_ticks": r["setup_ticks"],
                "startup_marks": {k: round(t - spawned, 3) for k, t in r["marks"].items()},
                "rss_ready_mib": round(r["rss_ready_kib"] / 1024, 1)})
    soon_at = created["soon_at"]
    deadline = max(soon_at, time.time()) + args.dynamic_soon_timeout
    while broker.client.llen(QUEUE) < args.dynamic_soon and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(args.settle)
    try:
        w0, c0 = time.time(), beats.cpu_seconds()
        stats_before = store.commandstats()
        busy_before = _busy_cpu((store, broker))
        time.sleep(args.idle_seconds)
        w1, c1 = time.time(), beats.cpu_seconds()
        busy_after = _busy_cpu((store, broker))
        stats_after = store.commandstats()
    except RuntimeError as exc:  # the beat died or stopped answering
        beats.finish(3)
        return {**out, "status": "error", "error": str(exc)}
    out["store_bytes"].append(store_bytes(case, store, cfg))
    out["store_bytes_per_entry_running"] = round((out["store_bytes"][2] - base) / n, 1)
    results = beats.finish(10)
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    per_minute = 60.0 / (w1 - w0)
    windows = [_window([t for t in res["ticks"] if t[0] >= w0 and t[1] <= w1], w0, w1)
               for res in results.values()]
    out.update(_soon_figures(_decode_queue(broker.client), results, args.dynamic_soon,
                             soon_at, r["ready_at"]))
    out.update({
        "cpu_seconds_per_minute": round((c1 - c0) * per_minute, 4),
        "other_cpu_seconds": _other_cpu(busy_before, busy_after, c1 - c0),
        "ticks_per_minute": round(sum(w["ticks"] for w in windows) * per_minute, 1),
        "store_round_trips_per_minute": None if case.store == "sqlite" else round(
            sum(w["store_rt"] for w in windows) * per_minute, 1),
        "peak_rss_mib": round(max((res["maxrss_kib"] for res in results.values()),
                                  default=0) / 1024, 1),
        "rss_end_mib": round(max((res.get("rss_kib", 0) for res in results.values()),
                                 default=0) / 1024, 1),
        "errors": [res["error"] for res in results.values() if res.get("error")],
        "warnings": dict(sum((collections.Counter(res["warnings"])
                              for res in results.values()), collections.Counter())),
    })
    if case.store == "redis":
        delta = _command_delta(stats_before, stats_after, {})
        out["store_commands_per_minute"] = round(sum(delta.values()) * per_minute, 1)
        # (commands run inside Lua scripts count: INFO commandstats)
        out["store_commands_by_name"] = dict(sorted(delta.items()))
    good = (len(results) == 1 and not out["errors"] and out["soon_sent"] == args.dynamic_soon
            and not out["duplicates"] and not out["unexpected_sends"])
    out["status"] = "ok" if good else "error"
    if not good and not out.get("error"):
        out["error"] = (f"soon entries sent {out['soon_sent']}/{args.dynamic_soon},"
                        f" duplicates {out['duplicates']}, other sends"
                        f" {out['unexpected_sends']}, beat errors {len(out['errors'])}")
    return out


def next_soon_lead(run: dict[str, Any]) -> float | None:
    """The soon entries' lead for the next run of a case: past its startup, with room."""
    startup = run.get("startup_seconds")
    return None if startup is None else round(max(5.0, 1.5 * startup + 5.0), 1)


def first_soon_lead(case: Case, n: int) -> float:
    """A first guess: RedBeat is ready in about a second; beat-claims today holds every
    entry (about 0.5 ms an entry here)."""
    return 5.0 + (5e-4 * n if case.scheduler == "beat_claims" else 0.0)


# -- medians, ratios, goals, table -------------------------------------------------------------
def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok, out = runs_status(runs)
    for name in FIGURES:
        values = [r[name] for r in ok if r.get(name) is not None]
        out[name] = _median(values)
        if values and name in ("startup_seconds", "peak_rss_mib", "create_seconds",
                               "cpu_seconds_per_minute"):
            out[f"{name}_range"] = [min(values), max(values)]
    out["runs"] = [{k: r[k] for k in RUN_FIELDS if k in r} for r in runs]
    return out


#: (figure, ratio suffix) compared between beat-claims and RedBeat.
COMPARED = (("startup_seconds", "startup"), ("peak_rss_mib", "rss"),
            ("cpu_seconds_per_minute", "idle_cpu"),
            ("store_bytes_per_entry", "store_bytes"),
            ("store_bytes_per_entry_running", "store_bytes_running"),
            ("startup_cpu_seconds", "startup_cpu"), ("create_seconds", "create"),
            ("create_cpu_seconds", "create_cpu"))


def redbeat_ratios(results: dict[str, dict[str, Any]], kind: str, sizes: list[int],
                   compared: tuple[tuple[str, str], ...], one_beat: bool
                   ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``{"<kind>_<N>": {"<case>/redbeat_<suffix>": ratio}}``: each beat-claims case's
    figure over RedBeat's, for each (figure, suffix) of ``compared`` (``one_beat``: its
    one-beat cases only); and the (workload, case) pairs compared."""
    ratios: dict[str, Any] = {}
    pairs: list[tuple[str, str]] = []
    bc_cases = sorted(k for k in results if k.startswith("beat_claims_")
                      and (not one_beat or _variant(k)[0] == 1))
    for n in sizes:
        w = f"{kind}_{n}"
        r: dict[str, Any] = {}
        for bc in bc_cases:
            if w not in results[bc]:
                continue
            pairs.append((w, bc))
            for name, suffix in compared:
                r[f"{bc}/redbeat_{suffix}"] = _ratio(results[bc][w].get(name),
                                                     results.get("redbeat", {}).get(w, {})
                                                     .get(name))
        ratios[w] = r
    return ratios, pairs


def ratios_and_goals(results: dict[str, dict[str, Any]], sizes: list[int]
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """beat-claims / RedBeat for every compared figure, and the goals of the due index
    (startup ≤ 2 s, peak RSS ≤ 100 MB, whatever N)."""
    def fig(case: str, workload: str, name: str) -> float | None:
        return results.get(case, {}).get(workload, {}).get(name)

    goals: dict[str, Any] = {}
    ratios, pairs = redbeat_ratios(results, "dynamic", sizes, COMPARED, one_beat=True)
    for w, bc in pairs:
        ratios[w][f"{bc}/redbeat_create_pipelined"] = _ratio(
            fig(bc, w, "create_seconds"), fig("redbeat", w, "create_seconds_pipeline"))
        startup, rss = fig(bc, w, "startup_seconds"), fig(bc, w, "peak_rss_mib")
        if startup is not None:
            goals[f"dynamic_startup_at_most_2s_{bc}_{w}"] = {
                "seconds": startup, "met": startup <= GOAL_STARTUP_SECONDS}
        if rss is not None:
            mb = rss * 2**20 / 1e6
            goals[f"dynamic_peak_rss_at_most_100MB_{bc}_{w}"] = {
                "mb": round(mb, 2), "met": mb <= GOAL_RSS_MB}
    return ratios, goals


def table(summary: dict[str, Any], cases: list[Case], kind: str, hdr: str
          ) -> Iterator[tuple[str, Case, dict[str, Any]]]:
    """Print a table's header (``hdr``), then yield each ``<kind>_<N>`` workload of the
    run (its sizes are the option ``<kind>_entries``), case and summary, in order."""
    sizes = summary["options"].get(f"{kind}_entries") or []
    if not sizes:
        return
    print()
    print(hdr)
    print("-" * len(hdr))
    for n in sizes:
        w = f"{kind}_{n}"
        for case in cases:
            r = summary["results"].get(case.key, {}).get(w)
            if r is not None:
                yield w, case, r


def print_table(summary: dict[str, Any], cases: list[Case]) -> None:
    hdr = (f"{'workload':15} {'scheduler':38} {'status':>9} {'create s':>9} {'pipe s':>7}"
           f" {'B/entry':>8} {'B/e run':>8} {'startup s':>9} {'CPU s':>6} {'RSS MiB':>8}"
           f" {'ready MiB':>9} {'CPU s/min':>9} {'soon':>5}")
    for w, case, r in table(summary, cases, "dynamic", hdr):
        soon = ",".join(str(run.get("soon_sent", "-")) for run in r["runs"])
        print(f"{w:15} {case.label:38} {r['status'][:9]:>9}"
              f" {_fmt(r['create_seconds'], '.2f'):>9}"
              f" {_fmt(r['create_seconds_pipeline'], '.2f'):>7}"
              f" {_fmt(r['store_bytes_per_entry'], '.0f'):>8}"
              f" {_fmt(r['store_bytes_per_entry_running'], '.0f'):>8}"
              f" {_fmt(r['startup_seconds'], '.2f'):>9}"
              f" {_fmt(r['startup_cpu_seconds'], '.2f'):>6}"
              f" {_fmt(r['peak_rss_mib'], '.0f'):>8} {_fmt(r['rss_ready_mib'], '.0f'):>9}"
              f" {_fmt(r['cpu_seconds_per_minute'], '.3f'):>9} {soon:>5}")


def runs_case(case: Case) -> bool:
    """The dynamic workload runs one beat: RedBeat, and beat-claims' one-beat cases (the
    PersistentScheduler has no run-time API)."""
    return case.scheduler == "redbeat" or (case.scheduler == "beat_claims" and case.beats == 1)
