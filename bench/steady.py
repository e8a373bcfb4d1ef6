"""The ``steady_<N>`` workload of bench/dispatch.py (``--steady-entries``): N entries with
one-minute crontabs, sent minute after minute by K beats of beat-claims (``--beats``, on
each ``--store``), and by one RedBeat beat with the same N entries, in the same run.

Why jitter
----------
Celery's crontab has a resolution of one minute: N entries of ``crontab()`` (minute
``*``) all fall due at hh:mm:00, a burst of N at the start of every minute, which is what
the ``due_<N>`` workload measures. The steady load of a large schedule ("100,000 entries
with one-minute crontabs, about 1,700 occurrences a second") is those occurrences spread
over the minute. So every beat-claims entry has the claims policy ``jitter`` of 60 s
(``--steady-jitter``): an occurrence due at D is sent at D + a fixed offset in
``[0, 60 s)`` computed from the entry's name and D alone
(``beat_claims.occurrences.jitter_offset``, the same on every beat), and the minute's N
occurrences are spread evenly over it (about 1,667 a second at 100,000). RedBeat has no
jitter, nor any other way to spread a crontab over its minute: its N occurrences are a
burst at the start of each minute, and its lateness is measured from that start.

One run (a case: ``beat_claims_K``, ``beat_claims_K+<store>``, ``redbeat``)
------------------------------------------------------------------------
1. The N entries (``entry-0000000`` ...) are created as the dynamic workload creates them
   (``bench/dynamic.py``, steps 1 to 4: a creator process; beat-claims' store primed by a
   beat with no entries, so that the beats join a store in service;
   ``Entries(app).bulk_create`` of ``{"crontab": {"minute": "*"}}`` with
   ``"claims": {"jitter": 60}``; RedBeat's ``RedBeatSchedulerEntry(name, task,
   crontab(), args=[name], app=app).save()`` one by one), with the store's bytes per
   entry and the create time.
2. K beat processes (RedBeat: one, the one holding its lock) are spawned and set up as
   the dynamic workload's beat is (ticked until ready: beat-claims' ``entries
   registered; claiming`` log line, RedBeat's first tick), and once every one is ready
   they are driven as ``celery beat`` drives them (bench/dispatch.py's ``_child``).
   RedBeat's lock lasts 5 x ``beat_max_loop_interval`` (25 s here) unless
   ``--steady-redbeat-lock-timeout`` says otherwise: at 100,000 entries its tick of a
   minute's burst lasts longer, and the next tick fails with ``LockNotOwnedError``
   (the beat stops, as ``celery beat`` would: the run reports it and what it sent).
3. The measured minutes: M (``--steady-minutes``, 3) whole minutes of the clock (UTC,
   the crontab's), the first of them the first minute that starts at least
   ``--steady-warmup`` seconds (one period: a minute) after the beats were ready, so that
   a beat's first scans of its due index are not measured (at 200 entries a beat just
   ready sent some of its first occurrences 3 s late), and is either the first minute
   any entry has an occurrence of, or one whose previous minute's occurrences were all to
   be sent after the beats were ready (else the occurrences of that minute to be sent
   before the beats were ready are caught up at once: a burst, not the steady load; a
   warm-up of a minute or more always meets this). Minute k holds the occurrences due at
   its start: one of each entry, N. With a jitter of a minute they are all to be sent
   within it; the run ends ``--steady-grace`` seconds (10) after the last measured minute
   (after the last planned send, with a longer jitter) and the beats are stopped.
4. Figures, for each measured minute and over all of them:

   - ``sent``: the messages whose (entry, due instant) falls in the measured minutes,
     counted at the broker (beat-claims: each message's ``beat_claims`` header; RedBeat's
     messages carry no due instant: the one its beat was sending, the crontab's next
     instant after the entry's ``last_run_at`` when Celery's ``Scheduler.apply_async``
     was called, recorded in the beat); ``missing``: occurrences never sent by the end
     of the run (a beat-claims beat behind sends an entry's latest occurrence and skips
     the older ones, as its catch-up policy ``latest`` says, or had not sent it yet: the
     store is not read to tell which; RedBeat's next instant is the first after its last
     send); ``duplicates``: messages beyond the first of an (entry, due) pair;
     ``exactly_once``: none missing and none duplicated in every measured minute;
   - ``lateness`` = publish time - (due + the occurrence's jitter offset), the offset
     computed again with ``beat_claims.occurrences.jitter_offset`` from the entry and the
     due instant (RedBeat: publish - due): p50, p99, max and min in milliseconds (below
     zero: sent before its instant);
   - each beat's CPU seconds in each minute (``time.process_time``, read at every minute
     boundary by a helper thread of the beat, as the idle workload reads it) and per
     minute over all of them; each beat's peak RSS (``VmHWM``, its whole life); the
     CPU seconds per minute of the store's and the broker's redis-servers and of the
     machine's other load;
   - the WARNING lines the beats logged (their first words, counted).

   The publish time of each message is recorded in the beat by bench/dispatch.py's
   wrapper of kombu's ``Producer.publish``, compactly (:class:`Recorder`: time, entry
   number and due instant in three arrays of numbers, a few MB for a run of 100,000
   entries) rather than in the list of tuples the other workloads keep.

Goals (issue 22): two beats send every occurrence once with a lateness p99 of at most
1 s (``steady_every_occurrence_once_p99_at_most_1s_beat_claims_K_steady_N``, K ≥ 2);
one beat alone keeps up (the same) or says in its log that it falls behind
(``steady_one_beat_keeps_up_or_warns_...``: met when it keeps up or logged any WARNING,
which the goal names for the reader to judge).

``--steady-period S`` (the test suite's) replaces the crontab with an interval of S
seconds and the jitter with S (unless ``--steady-jitter`` says otherwise): the measured
"minutes" are then periods of S seconds from the warm-up's end, each
holding every entry's occurrence due in it (beat-claims anchors an interval entry when it
is created: each entry has instants of its own; RedBeat's interval starts again from each
send, so its entries drift and its missing and duplicate counts mean little there).

Usage::

    python bench/dispatch.py --entries 0 --idle-entries 0 --steady-entries 100000 \\
        --steady-minutes 3 --schedulers redbeat,beat_claims --beats 1,2 --repeat 1
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import time
from array import array
from typing import Any

from bench.dispatch import (
    Beats,
    Case,
    RedisServer,
    _busy_cpu,
    _decode_queue,
    _fmt,
    _iso_to_epoch,
    _median,
    _other_cpu,
    _pct,
    _server_cpu,
    _variant,
    runs_status,
)
from bench.dynamic import (
    _create,
    created_run_cfg,
    dynamic_names,
    redbeat_ratios,
    start_beats,
    table,
)

MINUTE = 60.0
#: The first measured minute starts at least this long after the beats were ready.
READY_MARGIN = 1.0
FIGURES = ("lateness_p50_ms", "lateness_p99_ms", "lateness_max_ms", "lateness_min_ms",
           "sent", "missing", "duplicates", "cpu_seconds_per_minute",
           "cpu_seconds_per_minute_max_beat", "peak_rss_mib", "create_seconds",
           "startup_seconds", "store_bytes_per_entry", "store_server_cpu_per_minute",
           "broker_server_cpu_per_minute", "other_cpu_seconds_per_minute", "wait_seconds")
RUN_FIELDS = ("status", *FIGURES, "exactly_once", "minutes", "cpu_per_minute_by_beat",
              "peak_rss_mib_by_beat", "published_per_beat", "queued", "recorded",
              "first_minute", "period", "jitter", "loadavg_before", "loadavg_after",
              "error", "errors", "warnings")


# -- the beat process: what each publish was ---------------------------------------------------
def _epoch(when: Any) -> float:
    """A datetime as epoch seconds (a naive one is UTC, as Celery's are)."""
    from datetime import timezone

    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return float(when.timestamp())


def entry_number(name: str) -> int:
    """``entry-0000042`` -> 42 (bench/dynamic.py's names)."""
    return int(name.rpartition("-")[2])


class Recorder:
    """Every publish of a steady run in a beat: its time, its entry's number and its due
    instant (epoch seconds), in arrays. beat-claims' due instant is its message's
    ``beat_claims`` header; another scheduler's is the next instant of the entry's schedule
    after its ``last_run_at`` when Celery's ``Scheduler.apply_async`` was called
    (``period``: an interval's seconds; None: a one-minute crontab)."""

    def __init__(self, kind: str, period: float | None = None) -> None:
        self.period = period
        self.last_run = math.nan
        self.times, self.entries, self.dues = array("d"), array("q"), array("d")
        if kind != "beat_claims":
            self._watch_last_run()

    def _watch_last_run(self) -> None:
        import celery.beat

        apply_async = celery.beat.Scheduler.apply_async
        recorder = self

        def watched(sched: Any, entry: Any, *args: Any, **kwargs: Any) -> Any:
            last = entry.last_run_at  # (apply_async moves it on: read it first)
            recorder.last_run = math.nan if last is None else _epoch(last)
            return apply_async(sched, entry, *args, **kwargs)

        celery.beat.Scheduler.apply_async = watched

    def add(self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """One publish (kombu's ``Producer.publish(body, ...)``: Celery's body is
        ``(args, kwargs, embed)``, the entry's name its only argument)."""
        body: Any = args[0] if args else kwargs.get("body")
        header = (kwargs.get("headers") or {}).get("beat_claims")
        if isinstance(header, dict):
            due = _iso_to_epoch(header["due"])
        elif self.period is None:  # the crontab's next minute after the last run
            due = (math.floor(self.last_run / MINUTE) + 1) * MINUTE
        else:
            due = self.last_run + self.period
        self.times.append(now)
        self.entries.append(entry_number(body[0][0]))
        self.dues.append(due)

    def result(self) -> dict[str, Any]:
        return {"times": self.times, "entries": self.entries, "dues": self.dues}


# -- the parent: one run -------------------------------------------------------------------------
def first_minute(ready: float, created: float, period: float, cron: bool,
                 warmup: float = 0.0) -> float:
    """The start of the first measured minute (module doc, step 3). ``created``: a moment
    before the first entry was created; ``ready``: when the last beat was ready;
    ``warmup``: the least time from ``ready`` to the start."""
    after = ready + max(READY_MARGIN, warmup)
    if not cron:
        return after
    start = math.ceil(after / period) * period
    while not (start - period < created or start - period >= ready):
        start += period
    return start


def figures(case: Case, n: int, records: list[tuple[float, int, float]],
            messages: list[dict[str, Any]], start: float, period: float, minutes: int,
            jitter: float) -> dict[str, Any]:
    """Sent, missing and duplicate occurrences, and lateness, of each measured minute and
    of them all. ``records``: (publish time, entry number, due) of every beat's publishes;
    ``messages``: the broker's (bench/dispatch.py's ``_decode_queue``)."""
    from beat_claims.occurrences import jitter_offset

    names = dynamic_names(n)

    def minute_of(due: float) -> int | None:
        k = math.floor((due - start) / period + 1e-9)
        return k if 0 <= k < minutes else None

    if case.scheduler == "beat_claims":  # the pairs the broker holds
        pairs = [(entry_number(m["entry"]), _iso_to_epoch(m["due"])) for m in messages
                 if m["due"] and str(m["entry"]).startswith("entry-")]
    else:  # RedBeat's messages name no due instant: the one its beat recorded
        pairs = [(entry, due) for _, entry, due in records]
    by_minute: list[collections.Counter[tuple[int, int]]] = [
        collections.Counter() for _ in range(minutes)]
    for entry, due in pairs:
        k = minute_of(due)
        if k is not None:
            by_minute[k][(entry, round(due * 1000))] += 1
    late: list[list[float]] = [[] for _ in range(minutes)]
    for t, entry, due in records:
        k = minute_of(due)
        if k is None:
            continue
        due_ms = round(due * 1000)
        offset = jitter_offset(names[entry], due_ms, jitter) if jitter else 0
        late[k].append(t - (due_ms + offset) / 1000)
    rows = []
    for k in range(minutes):
        entries = {entry for entry, _ in by_minute[k]}
        rows.append({"minute": k, "sent": sum(by_minute[k].values()),
                     "missing": n - len(entries),
                     "duplicates": sum(c - 1 for c in by_minute[k].values()),
                     # an entry with two due instants in one period (an interval's drift)
                     "other_instants": len(by_minute[k]) - len(entries),
                     **_lateness(late[k])})
    every = [x for row in late for x in row]
    return {"minutes": rows, "sent": sum(r["sent"] for r in rows),
            "missing": sum(r["missing"] for r in rows),
            "duplicates": sum(r["duplicates"] for r in rows),
            "exactly_once": all(r["missing"] == r["duplicates"] == 0 for r in rows),
            **_lateness(every)}


def _lateness(values: list[float]) -> dict[str, float | None]:
    def ms(q: float) -> float | None:
        v = _pct(values, q)
        return None if v is None else round(1000 * v, 1)

    return {"lateness_p50_ms": ms(0.5), "lateness_p99_ms": ms(0.99),
            "lateness_max_ms": ms(1.0),
            "lateness_min_ms": round(1000 * min(values), 1) if values else None}


def _sleep_until(when: float, beats: Beats) -> None:
    while time.time() < when:
        if not all(p.is_alive() for p in beats.procs):
            raise RuntimeError("a beat stopped before the end of the run")
        time.sleep(min(1.0, max(0.0, when - time.time())))


def run_steady(case: Case, n: int, args: argparse.Namespace, store: RedisServer,
               broker: RedisServer, workdir: str, run_id: str) -> dict[str, Any]:
    """N entries of a one-minute crontab created through the scheduler's API, then K beats
    for M whole minutes (module doc)."""
    cron = args.steady_period is None
    period = MINUTE if cron else float(args.steady_period)
    jitter = (period if args.steady_jitter is None else float(args.steady_jitter)) \
        if case.scheduler == "beat_claims" else 0.0
    spec = {"crontab": {"minute": "*"}} if cron else {"every": period}
    out: dict[str, Any] = {"entries": n, "beats": case.beats, "period": period,
                           "jitter": jitter,
                           "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    cfg = created_run_cfg(case, args, store, broker, workdir, run_id, n=n, soon=0,
                          soon_lead=0.0, redbeat_create="save", dynamic_start="restarted",
                          steady=True, steady_period=None if cron else period,
                          schedule=spec, claims={"jitter": jitter} if jitter else None)
    if case.scheduler == "redbeat" and args.steady_redbeat_lock_timeout:
        cfg["extra_conf"] = {**cfg["extra_conf"],
                             "redbeat_lock_timeout": args.steady_redbeat_lock_timeout}
    created_at = time.time()
    created = _create(case, cfg, args, store, out)
    if isinstance(created, str):
        return {**out, "status": "error", "error": created}
    out["create_seconds"] = created["create_seconds"]
    before, after = out.pop("store_bytes")
    out["store_bytes_per_entry"] = round((after - before) / n, 1)
    started = start_beats(case, cfg, args)
    if isinstance(started, str):
        return {**out, "status": "error", "error": started}
    beats, ready, spawned = started
    ready_at = max(r["ready_at"] for r in ready.values())
    beats.go.set()
    warmup = period if args.steady_warmup is None else args.steady_warmup
    start = first_minute(ready_at, created_at, period, cron, warmup)
    span = args.steady_minutes * period
    # The last measured occurrences are due at the last minute's start (a crontab), or
    # until its end (an interval's own instants), and are to be sent within the jitter.
    last_due = start + span - period if cron else start + span
    end = max(start + span, last_due + jitter) + args.steady_grace
    out.update({"startup_seconds": round(ready_at - spawned, 3),
                "first_minute": start, "wait_seconds": round(start - ready_at, 1)})
    samples: list[tuple[float, dict[int, float]]] = []
    stopped = None  # why a beat stopped before the end: what it sent is still counted
    try:
        for k in range(args.steady_minutes + 1):
            _sleep_until(start + k * period, beats)
            if k == 0:
                busy0, servers0 = _busy_cpu((store, broker)), _server_cpu((store, broker))
            samples.append((time.time(), beats.cpu_by_beat()))
        busy1, servers1 = _busy_cpu((store, broker)), _server_cpu((store, broker))
        _sleep_until(end, beats)
    except RuntimeError as exc:  # a beat died or stopped answering
        stopped = str(exc)
        out["stopped_after_seconds"] = round(time.time() - start, 1)
    results = beats.finish(60)
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    messages = _decode_queue(broker.client)
    records = [rec for r in results.values() if r.get("recorded")
               for rec in zip(r["recorded"]["times"], r["recorded"]["entries"],
                              r["recorded"]["dues"])]
    out.update(figures(case, n, records, messages, start, period, args.steady_minutes,
                       jitter))
    measured = max(0, len(samples) - 1)  # minutes whose CPU was read at both ends
    cpu = {i: [round(samples[k + 1][1][i] - samples[k][1][i], 3) for k in range(measured)]
           for i in sorted(samples[0][1] if samples else {})}
    for k, row in enumerate(out["minutes"][:measured]):
        row["cpu_seconds_by_beat"] = [cpu[i][k] for i in sorted(cpu)]
    per_minute = MINUTE / (measured * period) if measured else 0.0
    by_beat = [round(sum(cpu[i]) * per_minute, 3) for i in sorted(cpu)] if measured else []
    if measured == args.steady_minutes:  # (a beat stopped: the machine's were not read)
        beats_cpu = sum(sum(c) for c in cpu.values())
        out.update({
            "store_server_cpu_per_minute": round((servers1[0] - servers0[0]) * per_minute, 3),
            "broker_server_cpu_per_minute": round((servers1[1] - servers0[1]) * per_minute,
                                                  3),
            "other_cpu_seconds_per_minute": round(
                _other_cpu(busy0, busy1, beats_cpu) * per_minute, 3)})
    out.update({
        "queued": len(messages), "recorded": len(records),
        "published_per_beat": [len(r["recorded"]["times"]) if r.get("recorded") else None
                               for _, r in sorted(results.items())],
        "cpu_per_minute_by_beat": by_beat,
        "cpu_seconds_per_minute": round(sum(by_beat), 3) if by_beat else None,
        "cpu_seconds_per_minute_max_beat": max(by_beat, default=None),
        "peak_rss_mib_by_beat": [round(r["maxrss_kib"] / 1024, 1)
                                 for _, r in sorted(results.items())],
        "errors": [r["error"] for r in results.values() if r.get("error")],
        "warnings": dict(sum((collections.Counter(r["warnings"]) for r in results.values()),
                             collections.Counter())),
    })
    out["peak_rss_mib"] = max(out["peak_rss_mib_by_beat"], default=None)
    problems = [stopped] if stopped else []
    problems += out["errors"]
    if len(results) < case.beats:
        problems.append(f"only {len(results)} of {case.beats} beats reported")
    if out["recorded"] != out["queued"]:  # every publish reached the broker, and only they
        problems.append(f"{out['recorded']} publishes recorded, {out['queued']} queued")
    out["status"] = "error" if problems else "ok"
    if problems:
        out["error"] = "; ".join(p.strip().splitlines()[-1] for p in problems)
    return out


def runs_case(case: Case) -> bool:
    """RedBeat (one beat) and beat-claims with every --beats count (the
    PersistentScheduler has no run-time API)."""
    return case.scheduler in ("redbeat", "beat_claims")


# -- medians, ratios, goals, table -------------------------------------------------------------
def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok, out = runs_status(runs)
    for name in FIGURES:
        out[name] = _median([r[name] for r in ok if r.get(name) is not None])
    # the worst run, for the goals: every run must meet them
    p99 = [r["lateness_p99_ms"] for r in ok if r.get("lateness_p99_ms") is not None]
    out["lateness_p99_ms_worst"] = max(p99) if p99 else None
    out["exactly_once"] = bool(ok) and len(ok) == len(runs) and all(
        r.get("exactly_once") for r in ok)
    out["runs"] = [{k: r[k] for k in RUN_FIELDS if k in r} for r in runs]
    return out


#: (figure, ratio suffix) compared between beat-claims and RedBeat.
COMPARED = (("lateness_p50_ms", "p50"), ("lateness_p99_ms", "p99"),
            ("lateness_max_ms", "max"), ("cpu_seconds_per_minute", "cpu"),
            ("peak_rss_mib", "rss"))
GOAL_P99_MS = 1000.0


def ratios_and_goals(results: dict[str, dict[str, Any]], sizes: list[int]
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """beat-claims / RedBeat for every compared figure, and issue 22's goals: with two
    beats and more every occurrence sent once with a lateness p99 of at most 1 s; one beat
    keeps up or logs that it does not."""
    goals: dict[str, Any] = {}
    ratios, pairs = redbeat_ratios(results, "steady", sizes, COMPARED, one_beat=False)
    for w, bc in pairs:
        r = results[bc][w]
        p99, once = r.get("lateness_p99_ms_worst"), r.get("exactly_once")
        keeps_up = bool(once) and p99 is not None and p99 <= GOAL_P99_MS
        if _variant(bc)[0] >= 2:
            goals[f"steady_every_occurrence_once_p99_at_most_1s_{bc}_{w}"] = {
                "p99_ms": p99, "exactly_once": once, "met": keeps_up}
        else:
            warned = sorted({k for run in r["runs"] for k in (run.get("warnings") or {})})
            goals[f"steady_one_beat_keeps_up_or_warns_{bc}_{w}"] = {
                "p99_ms": p99, "exactly_once": once, "warnings": warned,
                "met": keeps_up or bool(warned)}
    return ratios, goals


def print_table(summary: dict[str, Any], cases: list[Case]) -> None:
    hdr = (f"{'workload':14} {'scheduler':38} {'status':>7} {'min':>4} {'sent':>9}"
           f" {'miss':>6} {'dup':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
           f" {'CPU s/min per beat':>19} {'RSS MiB per beat':>17} {'start s':>7}")
    for w, case, r in table(summary, cases, "steady", hdr):
        for run in r["runs"]:
            rows = [{"minute": "all", **run}, *run.get("minutes", [])]
            for row in rows:
                whole = row["minute"] == "all"
                cpu = (run.get("cpu_per_minute_by_beat") if whole
                       else row.get("cpu_seconds_by_beat")) or []
                rss = (run.get("peak_rss_mib_by_beat") or []) if whole else []
                print(f"{w if whole else '':14} {case.label if whole else '':38}"
                      f" {run['status'] if whole else '':>7} {row['minute']!s:>4}"
                      f" {_fmt(row.get('sent')):>9} {_fmt(row.get('missing')):>6}"
                      f" {_fmt(row.get('duplicates')):>5}"
                      f" {_fmt(row.get('lateness_p50_ms'), '.0f'):>8}"
                      f" {_fmt(row.get('lateness_p99_ms'), '.0f'):>8}"
                      f" {_fmt(row.get('lateness_max_ms'), '.0f'):>8}"
                      f" {'/'.join(f'{c:.2f}' for c in cpu):>19}"
                      f" {'/'.join(f'{m:.0f}' for m in rss):>17}"
                      f" {_fmt(run.get('startup_seconds') if whole else None, '.1f'):>7}")
