"""A small run of the MySQL store's burst benchmark (bench/mysql_store.py) with each client
library installed, on the machine's MariaDB (a database of its own, dropped after)."""

from __future__ import annotations

import json

import pytest

from bench.mysql_store import main

from .contract.backend_mysql import INSTALLED_DRIVERS


@pytest.mark.parametrize("driver", INSTALLED_DRIVERS)
def test_a_small_run_claims_and_marks_every_entry_in_four_round_trips_a_chunk(
        driver: str, capsys: pytest.CaptureFixture[str]) -> None:
    """150 entries: two calls of each kind (100 and 50), two round trips each."""
    assert main(["--entries", "150", "--rounds", "2", "--drivers", driver]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    [(name, figures)] = result["drivers"].items()
    assert name == driver and [r["round_trips"] for r in figures["rounds"]] == [8, 8]
    assert figures["cpu_seconds"] > 0 and figures["seconds"] > 0
