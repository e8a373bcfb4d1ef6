"""The due-index benchmark's own rules that its figures rest on (bench/due_index.py), and
a small run of it on each store (real servers, as the benchmark starts them)."""

from __future__ import annotations

import json

import pytest

from bench.due_index import main, next_due_of

NOW = 1_800_000_000_000


def test_exactly_the_asked_number_of_entries_are_due_at_ten_instants() -> None:
    for entries, due in ((1_000_000, 1000), (2000, 100), (1000, 1000)):
        instants = [next_due_of(i, entries, due, NOW) for i in range(entries)]
        due_ones = [t for t in instants if t <= NOW]
        assert len(due_ones) == due and len(set(due_ones)) == min(10, due)
        assert all(t >= NOW + 3_600_000 for t in instants if t > NOW)


@pytest.mark.parametrize("store", ["redis", "postgres", "sqlite"])
def test_a_small_run_answers_every_due_entry_and_its_figures(
        store: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--stores", store, "--entries", "2000", "--due", "100", "--repeat", "2",
                 "--json"]) == 0
    [result] = json.loads(capsys.readouterr().out.splitlines()[-1])["due_index"]
    assert (result["store"], result["entries"], result["due"]) == (store, 2000, 100)
    assert result["due_ms_median"] > 0 and result["bytes_per_entry"] > 0
