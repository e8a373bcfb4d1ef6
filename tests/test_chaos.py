"""The chaos run (``bench/chaos.py``) for one minute: beats killed and replaced, the store
crashed and restarted, a beat paused in the middle of a publish for longer than
``reclaim_after``; every occurrence due must have executed once, and none twice (a run
the store restart delayed, through its outage and the new epoch's settle period, is late,
not missed).

Why in the suite: each of these failures is pinned alone elsewhere; this checks that they
also hold together, judged by a ledger the task writes itself rather than by the store.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bench.chaos import Config, Result, run, summary

pytestmark = pytest.mark.integration


def _explain(result: Result) -> str:
    """The summary and the tail of every process log, for a failure message."""
    out = [summary(result)]
    for log in sorted(Path(result.workdir, "logs").glob("*.log")):
        out.append(f"---- {log.name} ----\n{log.read_text(errors='replace')[-3000:]}")
    return "\n".join(out)


def test_one_minute_of_chaos_runs_every_occurrence_once(tmp_path: Path) -> None:
    seed = int(os.environ.get("BEAT_CLAIMS_CHAOS_SEED", "20261130"))  # to try other seeds
    result = run(Config(duration=60, seed=seed, workdir=tmp_path))
    sys.stderr.write(summary(result) + "\n")
    figures = result.figures()
    # The chaos happened: kills (with replacements), one store restart, one pause.
    assert figures["sigkill"] + figures["sigterm"] >= 3, _explain(result)
    assert figures["store_restarts"] == 1, _explain(result)
    assert figures["pauses"] == 1, _explain(result)
    assert figures["due"] >= 250, _explain(result)
    # The restarted store was a new epoch: the beats noticed, and claiming settled.
    assert figures["beat_store_lost_writes"] >= 1, _explain(result)
    assert figures["store_settle_s"] is not None, _explain(result)
    # ... and beat-claims held.
    assert result.duplicates == {}, _explain(result)
    assert figures["missed_unexplained"] == 0, _explain(result)
    assert figures["executed"] == figures["due"] - figures["missed"], _explain(result)
    assert result.off_schedule == [] and result.reanchored == [], _explain(result)
    # No beat or worker crashed or logged an unexpected error on the way.
    assert figures["traceback_lines"] == 0, _explain(result)
    assert result.ok
