"""The steady workload of the dispatch benchmark (bench/steady.py): what it counts and
measures, and a real run at a small N."""

from __future__ import annotations

import pytest

from bench.dispatch import Case
from bench.steady import figures, first_minute
from tests.test_bench_dispatch import HEARTBEAT_EVERY_SECOND, run_bench


def test_an_occurrence_missing_or_sent_twice_is_counted_in_its_minute() -> None:
    from beat_claims.occurrences import jitter_offset
    from beat_claims.runs import iso

    start, jitter = 1_800_000_000.0, 60.0  # a minute boundary

    def sent(entry: int, minute: int, late: float) -> tuple[dict[str, str], tuple]:
        due_ms = int((start + 60 * minute) * 1000)
        name = f"entry-{entry:07d}"
        at = (due_ms + jitter_offset(name, due_ms, jitter)) / 1000 + late
        return {"entry": name, "due": iso(due_ms)}, (at, entry, due_ms / 1000)

    sends = [sent(0, 0, 0.010), sent(1, 0, 0.020), sent(0, 1, 0.030), sent(0, 1, 0.5),
             sent(2, 5, 0.0)]  # entry 1 missing in minute 1, entry 0 twice; minute 5 not
    messages, records = [m for m, _ in sends], [r for _, r in sends]
    out = figures(Case("beat_claims", 2), 2, records, messages, start, 60.0, 2, jitter)
    assert [(r["sent"], r["missing"], r["duplicates"]) for r in out["minutes"]] == [
        (2, 0, 0), (2, 1, 1)], out
    assert (out["sent"], out["missing"], out["duplicates"], out["exactly_once"]) == (
        4, 1, 1, False)
    assert out["lateness_p50_ms"] == 20.0 and out["lateness_max_ms"] == 500.0, out
    assert out["minutes"][1]["lateness_min_ms"] == 30.0


def test_redbeat_lateness_is_from_the_due_instant_its_beat_was_sending() -> None:
    start = 1_800_000_000.0
    records = [(start + 42.0, 0, start), (start + 43.0, 1, start)]  # a minute-start burst
    out = figures(Case("redbeat", 1), 2, records, [], start, 60.0, 1, 0.0)
    assert (out["sent"], out["missing"], out["exactly_once"]) == (2, 0, True)
    assert (out["lateness_p50_ms"], out["lateness_max_ms"]) == (42000.0, 43000.0)


def test_the_first_measured_minute_follows_a_warm_up_and_no_catch_up() -> None:
    b = 1_800_000_000.0  # a minute boundary
    # Entries made before b - 60, beats ready at b - 30: the occurrences due at b - 60 to
    # be sent before b - 30 are caught up at once; the minute after b is steady.
    assert first_minute(b - 30, b - 100, 60.0, True) == b + 60
    # Made after b - 60: nothing due before b; b is the first minute.
    assert first_minute(b - 30, b - 50, 60.0, True) == b
    assert first_minute(b - 30, b - 50, 60.0, True, warmup=60.0) == b + 60
    assert first_minute(b - 0.5, b - 50, 60.0, True) == b + 60  # less than a second
    assert first_minute(b + 0.25, b - 50, 5.0, False) == b + 1.25  # an interval's period


#: The steady run's interval (and jitter), and its grace once its beats are ready (s).
STEADY_PERIOD, STEADY_GRACE = 3, 2


def test_a_steady_run_sends_every_occurrence_once_and_reports_its_figures(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Real redis-servers, a real creator, two beat-claims beats and a RedBeat beat, on 200
    entries of a 3 s interval with a 3 s jitter (the crontab's minute is too long for the
    suite: each case runs for three periods and a 2 s grace once its beats are ready), two
    periods measured. The beat-claims beats heartbeat every second: the store settles for
    3 s before its entries are made, not for the default's TTL of 15 s."""
    summary = run_bench(capsys, [
        "--steady-entries", "200", "--steady-period", str(STEADY_PERIOD),
        "--steady-minutes", "2", "--steady-warmup", "0", "--steady-grace", str(STEADY_GRACE),
        "--schedulers", "redbeat,beat_claims",
        "--beats", "2", *HEARTBEAT_EVERY_SECOND])
    results = summary["results"]
    for key, beats in (("beat_claims_2", 2), ("redbeat", 1)):
        got = results[key]["steady_200"]
        assert len(got["runs"][0]["minutes"]) == 2, got
        # every publish recorded, and found at the broker
        assert got["runs"][0]["recorded"] == got["runs"][0]["queued"], got
        for figure in ("lateness_p50_ms", "lateness_p99_ms", "lateness_max_ms",
                       "cpu_seconds_per_minute", "peak_rss_mib"):
            assert got[figure] is not None, (figure, got)
        assert len(got["runs"][0]["cpu_per_minute_by_beat"]) == beats, got
        assert len(got["runs"][0]["peak_rss_mib_by_beat"]) == beats, got
    bc = results["beat_claims_2"]["steady_200"]
    counts = [{k: row[k] for k in ("minute", "sent", "missing", "duplicates",
                                   "other_instants", "lateness_max_ms")}
              for row in bc["runs"][0]["minutes"]]  # (the evidence, whole: pytest cuts a dict)
    assert bc["exactly_once"] and bc["sent"] == 400, counts
    assert all(row["sent"] == 200 and row["missing"] == row["duplicates"] == 0
               for row in bc["runs"][0]["minutes"]), counts
    # Sent at due + its offset: the median late by less than a period and the grace.
    assert 0 <= bc["lateness_p50_ms"] < (STEADY_PERIOD + STEADY_GRACE) * 1000, bc["runs"][0]
    assert "beat_claims_2/redbeat_p99" in summary["ratios"]["steady_200"]
    assert "steady_every_occurrence_once_p99_at_most_1s_beat_claims_2_steady_200" in \
        summary["goals"]
