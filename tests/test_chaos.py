"""The chaos run (``bench/chaos.py``) on every store: beats killed and replaced, the store
failed once, a beat paused in the middle of a publish for longer than ``reclaim_after``;
every occurrence due must have executed once, and none twice.

Redis runs 40 s, with the store's redis-server crashed and restarted (a run the
restart delayed, through its outage and the new epoch's settle period, is late, not
missed). SQLite, PostgreSQL and MySQL (MariaDB) run 30 s each (the suite's time), with an
outage of their own: the file's writer lock held by another process; the database
refusing connections with every session cut (``pg_terminate_backend``), as in a failover;
the store's user locked (``ACCOUNT LOCK``) with every session of it killed. Runs of 120 s on
each store are in ``docs/benchmarks.md`` ("Stores").

The four runs go at once, each in a thread of the test (a fleet, a broker and a store of
its own each, as ``bench/chaos.py --store`` runs it alone), so that the suite waits for the
longest rather than for their sum; each store's run is checked alone, a failure naming it.
Their fleets start one after another (Redis's, the longest run, first): 36 processes
starting at once, each importing Celery, starve the suite's other tests of the CPU for
seconds (in one full run three tests whose beats must keep time failed beside them). A
fleet's turn lasts while its processes start up (its beats and workers together); the next
one starts while its beats wait to join their store and run their first occurrences.

Why in the suite: each of these failures is pinned alone elsewhere; this checks that they
also hold together, judged by a ledger the task writes itself rather than by the store.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.chaos import Config, Result, run, summary

pytestmark = pytest.mark.integration

#: Seconds of chaos per store.
DURATION = {"redis": 40, "sqlite": 30, "postgres": 30, "mysql": 30}


def _explain(result: Result) -> str:
    """The summary and the tail of every process log, for a failure message."""
    out = [summary(result)]
    for log in sorted(Path(result.workdir, "logs").glob("*.log")):
        out.append(f"---- {log.name} ----\n{log.read_text(errors='replace')[-3000:]}")
    return "\n".join(out)


def test_chaos_runs_every_occurrence_once_on_every_store(tmp_path: Path) -> None:
    """The chaos run on the four stores at once; each store's run is judged alone."""
    seed = int(os.environ.get("BEAT_CLAIMS_CHAOS_SEED", "20261130"))  # to try other seeds
    stores = sorted(DURATION, key=lambda store: (-DURATION[store], store))
    turns = [threading.Event() for _ in stores]
    turns[0].set()

    @contextlib.contextmanager
    def turn(k: int) -> Iterator[None]:
        """The k-th fleet starts once the one before it is up (or failed to start)."""
        turns[k].wait(120)  # (bounded: a run that failed before its start never sets it)
        try:
            yield
        finally:
            if k + 1 < len(turns):
                turns[k + 1].set()

    with ThreadPoolExecutor(len(stores), thread_name_prefix="chaos") as pool:
        runs = {store: pool.submit(run, Config(duration=DURATION[store], seed=seed,
                                               workdir=tmp_path / store, store=store,
                                               label=store), turn(k))
                for k, store in enumerate(stores)}
    failed = []
    for store, future in runs.items():
        try:
            result = future.result()
        except Exception:  # the run could not be made or judged: its store, and why
            failed.append(f"{store}: the run raised\n{traceback.format_exc()}")
            continue
        sys.stderr.write(summary(result) + "\n")
        try:
            _judge(store, result)
        except AssertionError as exc:
            failed.append(f"{store}: {exc}")
    assert not failed, "\n\n".join(failed)


def _judge(store: str, result: Result) -> None:
    """One store's run: the chaos happened, and beat-claims held."""
    duration = DURATION[store]
    figures = result.figures()
    # The chaos happened: kills (with replacements), one store failure, one pause.
    assert figures["sigkill"] + figures["sigterm"] >= duration // 20, _explain(result)
    assert figures["pauses"] == 1, _explain(result)
    assert figures["due"] >= 4 * duration, _explain(result)
    if store == "redis":
        # The restarted store was a new epoch: the beats noticed, and claiming settled.
        assert figures["store_restarts"] == 1, _explain(result)
        assert figures["beat_store_lost_writes"] >= 1, _explain(result)
        assert figures["store_settle_s"] is not None, _explain(result)
    else:
        # The store was unreachable (locked, or cutting and refusing sessions) for a
        # while, and the fleet noticed.
        assert figures["store_outages"] == 1, _explain(result)
        assert figures["beat_store_outages"] + figures["worker_store_outages"] >= 1, \
            _explain(result)
    # ... and beat-claims held.
    assert result.duplicates == {}, _explain(result)
    assert figures["missed_unexplained"] == 0, _explain(result)
    assert figures["executed"] == figures["due"] - figures["missed"], _explain(result)
    assert result.off_schedule == [] and result.reanchored == [], _explain(result)
    # No beat or worker crashed or logged an unexpected error on the way.
    assert figures["traceback_lines"] == 0, _explain(result)
    assert result.ok, _explain(result)
