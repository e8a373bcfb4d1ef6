"""The dispatch benchmark's own rules that its figures rest on (bench/dispatch.py)."""

from __future__ import annotations

import gc
import os

from bench.dispatch import _GcPauses, _stolen


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
