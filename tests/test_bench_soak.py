"""The soak benchmark's own rules that its figures rest on (bench/soak.py)."""

from __future__ import annotations

import collections

from bench.soak import _largest_containers, figures, interval_of


def test_growth_per_run_is_the_slope_of_rss_on_runs_sent_from_the_window_start() -> None:
    # 100 runs every 10 s; flat for a minute, then 1 KiB more every 100 runs (10 B a run).
    samples = [{"t": 10.0 * i, "sent": 100 * i, "hwm_kib": 0,
                "rss_kib": 1000 + max(0, i - 6)} for i in range(1, 13)]
    out = figures(samples, mark=100.0, growth_from=60.0, peak_kib=1006)
    assert out["growth_bytes_per_run"] == 10.2  # 1024 B / 100 runs
    assert out["runs_in_growth_window"] == 600
    assert (out["rss_at_mark_mib"], out["peak_minus_mark_mib"]) == (
        round(1004 / 1024, 1), round(2 / 1024, 1))
    flat = figures([{**s, "rss_kib": 1000} for s in samples], 100.0, 60.0, 1000)
    assert flat["growth_bytes_per_run"] == 0.0


def test_the_entries_run_every_one_to_five_seconds() -> None:
    assert collections.Counter(interval_of(i) for i in range(300)) == {
        float(s): 60 for s in range(1, 6)}


class _Holder:
    def __init__(self) -> None:
        self.pile = collections.deque(range(5000), maxlen=10_000)


def test_the_largest_containers_are_named_by_the_attribute_that_holds_them() -> None:
    holder = _Holder()
    found = _largest_containers(50, least=5000)
    assert (5000, "deque", f"{__name__}._Holder.pile") in found, found
    del holder
