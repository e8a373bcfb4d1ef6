"""The dispatch benchmark's own rules that its figures rest on (bench/dispatch.py)."""

from __future__ import annotations

import gc
import json
import os
from typing import Any

import pytest

from bench.dispatch import _GcPauses, _stolen

#: The working tree's beat-claims beats heartbeat every second: a new store's epoch settles
#: for their TTL, 3 s, not the default's 15 s (a wait of the suite's, not the bench's).
HEARTBEAT_EVERY_SECOND = ("--tree-conf", "beat_claims_heartbeat_interval=1")


def test_a_burst_the_host_took_cpu_from_is_run_again() -> None:
    cpus = os.cpu_count() or 1
    capacity = 4.0 * cpus  # a 4 s burst, on every CPU
    ok = {"status": "ok", "seconds": 4.0}
    assert _stolen({**ok, "steal_seconds": 0.051 * capacity}, 0.05)
    assert not _stolen({**ok, "steal_seconds": 0.049 * capacity}, 0.05)
    assert not _stolen({**ok, "steal_seconds": capacity}, None)  # --max-steal -1
    # A burst that did not go through is judged by its status, never run again for steal.
    assert not _stolen({"status": "timeout", "seconds": None, "steal_seconds": 99.0}, 0.05)


def test_gc_pauses_are_counted_until_stopped() -> None:
    pauses = _GcPauses()
    gc.collect()
    pauses.stop()
    counted = pauses.seconds
    assert counted > 0.0  # a collection's start and stop, timed by perf_counter
    assert pauses.full_collections == 1  # gc.collect() walks the oldest generation
    gc.collect()
    assert pauses.seconds == counted
    assert pauses.full_collections == 1
    assert pauses._on_gc not in gc.callbacks


def test_the_dynamic_goals_are_the_due_index_targets_whatever_n() -> None:
    from bench.dynamic import ratios_and_goals

    def case(startup: float, rss_mib: float) -> dict[str, Any]:
        return {"dynamic_10": {"startup_seconds": startup, "peak_rss_mib": rss_mib,
                               "create_seconds": 3.0, "cpu_seconds_per_minute": 0.02,
                               "store_bytes_per_entry": 1000.0}}

    results = {"redbeat": case(0.5, 50.0),
               "beat_claims_1": case(2.0, 95.3),  # 99.93 MB
               "beat_claims_1+sqlite": case(2.01, 95.4),  # 100.03 MB
               "beat_claims_2": case(9.0, 900.0)}  # two beats: not this workload's
    ratios, goals = ratios_and_goals(results, [10])
    assert ratios["dynamic_10"]["beat_claims_1/redbeat_startup"] == 4.0
    assert ratios["dynamic_10"]["beat_claims_1/redbeat_create"] == 1.0
    assert goals["dynamic_startup_at_most_2s_beat_claims_1_dynamic_10"]["met"]
    assert goals["dynamic_peak_rss_at_most_100MB_beat_claims_1_dynamic_10"]["met"]
    assert not goals["dynamic_startup_at_most_2s_beat_claims_1+sqlite_dynamic_10"]["met"]
    assert not goals["dynamic_peak_rss_at_most_100MB_beat_claims_1+sqlite_dynamic_10"]["met"]
    assert not any("beat_claims_2" in name for name in [*goals, *ratios["dynamic_10"]])


def test_a_dynamic_run_wants_each_soon_entry_once_and_nothing_else() -> None:
    from bench.dynamic import _soon_figures

    beat = {0: {"publishes": [(101.0, None), (101.2, None)]}}
    sent = [{"entry": "soon-0000000"}, {"entry": "soon-0000001"}]
    good = _soon_figures(sent, beat, 2, soon_at=100.0, ready_at=90.0)
    assert good == {"soon_sent": 2, "duplicates": 0, "unexpected_sends": 0,
                    "soon_due_before_ready": False, "soon_lag_ms_max": 1200.0}
    bad = _soon_figures([*sent, sent[0], {"entry": "entry-0000007"}], beat, 2, 100.0, 120.0)
    assert (bad["duplicates"], bad["unexpected_sends"], bad["soon_due_before_ready"]) == (
        1, 1, True)


def test_a_dynamic_run_measures_each_beat_on_entries_made_through_its_api(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Real redis-servers, a real creator and beat per scheduler. The beat-claims beat
    heartbeats every second (``--tree-conf``): the store settles for 3 s before its
    entries are made, not for the default's TTL of 15 s."""
    summary = run_bench(capsys, [
        "--dynamic-entries", "200", "--schedulers", "redbeat,beat_claims", "--beats", "1",
        "--idle-seconds", "2", "--settle", "0.5", "--dynamic-soon", "2",
        "--redbeat-create", "both", *HEARTBEAT_EVERY_SECOND])
    results = summary["results"]
    for key in ("redbeat", "beat_claims_1"):
        r = results[key]["dynamic_200"]
        run = r["runs"][0]
        assert (run["soon_sent"], run["duplicates"], run["unexpected_sends"]) == (2, 0, 0), run
        assert 0 < r["startup_seconds"] < 60, run
        assert r["store_bytes_per_entry"] > 100, run  # each entry is in the store
        assert r["peak_rss_mib"] >= r["rss_ready_mib"] > 10, run
    assert results["redbeat"]["dynamic_200"]["create_seconds_pipeline"] > 0
    assert "beat_claims_1/redbeat_startup" in summary["ratios"]["dynamic_200"]


def run_bench(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    """bench/dispatch.py's run with ``argv`` (no burst, no idle workload, one repeat): its
    JSON summary, once it is known to have exited 0 (else its results are shown)."""
    from bench.dispatch import main

    code = main(["--entries", "0", "--idle-entries", "0", "--repeat", "1", "--quiet", *argv])
    summary: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0, json.dumps(summary["results"], indent=1)
    return summary


def test_the_publish_path_is_measured_against_a_bare_send_task_loop(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``send_task`` (bench/bare.py) publishes the burst with Celery alone, in the same run:
    its CPU per run is the floor beat-claims' is compared with (the 1.5x goal). The
    beat-claims beat heartbeats every second: its new store settles for 3 s, not 15 s."""
    from bench.dispatch import main

    code = main(["--entries", "100", "--idle-entries", "0", "--schedulers",
                 "send_task,beat_claims", "--beats", "1", "--repeat", "1", "--quiet",
                 *HEARTBEAT_EVERY_SECOND])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    results = summary["results"]
    assert code == 0, json.dumps(results, indent=1)
    bare = results["send_task"]["due_100"]
    assert bare["status"] == "ok" and bare["cpu_seconds"] > 0, bare
    goal = summary["goals"]["beat_claims_1_cpu_at_most_1.5x_send_task_due_100"]
    assert goal["send_task_ms_per_run"] > 0 and goal["ms_per_run"] > 0, goal
    assert "beat_claims_1/send_task" in summary["ratios"]["due_100"]
