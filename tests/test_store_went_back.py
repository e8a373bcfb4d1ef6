"""A store that comes back empty (a restart without persistence) or older (an older RDB
snapshot): real beats, a real worker, a real redis-server restarted under them. The broker
and the ledger the tasks write live on another server, which keeps its data.

No occurrence a live beat knew was handed out runs again, no token is used twice, interval
entries keep their grid, and only what fell due while the store was away is left to the
catch-up policy."""

from __future__ import annotations

import contextlib
import itertools
import shutil
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import RedisServer
from .processes import duplicates, executions, fleet, wait_for

pytestmark = pytest.mark.integration


class SnapshotServer(RedisServer):
    """A redis-server whose data can be saved, and brought back older or not at all."""

    def snapshot(self, to: Path) -> None:
        self.client().save()
        shutil.copy(Path(self.dir) / "dump.rdb", to)

    def come_back(self, snapshot: Path | None) -> None:
        """Stop without saving, and start again from ``snapshot`` (None: empty)."""
        assert self.proc is not None
        with contextlib.suppress(Exception):  # it answers by closing the connection
            self.client().shutdown(nosave=True)
        self.proc.wait(10)
        self.proc = None
        dump = Path(self.dir) / "dump.rdb"
        dump.unlink(missing_ok=True)
        if snapshot is not None:
            shutil.copy(snapshot, dump)
        self.start()


@pytest.fixture
def store_server() -> Iterator[SnapshotServer]:
    server = SnapshotServer()
    server.start()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


def tokens_are_never_reused(rows: list[dict[str, object]]) -> None:
    dues_of: dict[tuple[object, object], set[object]] = defaultdict(set)
    for row in rows:
        dues_of[(row["entry"], row["token"])].add(row["due"])
    reused = {key: dues for key, dues in dues_of.items() if len(dues) > 1}
    assert reused == {}, reused


def _ms(due: object) -> int:
    from datetime import datetime

    return round(datetime.fromisoformat(str(due).replace("Z", "+00:00")).timestamp() * 1000)


def test_an_older_snapshot_restored_mid_run_runs_nothing_twice_and_reuses_no_token(
        store_server: SnapshotServer, broker: RedisServer, tmp_path: Path) -> None:
    ledger = broker.client(db=2)
    schedule = {f"e{i}": {"every": 1} for i in range(3)}
    with fleet(store_server.url, broker.broker_url(), tmp_path, schedule,
               BC_EXEC_URL=f"redis://127.0.0.1:{broker.port}/2") as f:
        f.worker(concurrency=2)
        beats = [f.beat(), f.beat()]
        wait_for(lambda: len(executions(ledger)) >= 6, 30, "runs before the snapshot")
        store_server.snapshot(tmp_path / "old.rdb")
        before = len(executions(ledger))
        wait_for(lambda: len(executions(ledger)) >= before + 9, 30,
                 "runs the snapshot does not know of")
        store_server.come_back(tmp_path / "old.rdb")
        restored_at = len(executions(ledger))
        wait_for(lambda: len(executions(ledger)) >= restored_at + 9, 40,
                 "runs after the restore")
        for beat in beats:
            f.wait_log(beat, "the store may have lost writes", 5)
        rows = executions(ledger)
    assert duplicates(rows) == {}
    tokens_are_never_reused(rows)


def test_a_wiped_store_keeps_interval_grids_and_catch_up_all_misses_nothing(
        store_server: SnapshotServer, broker: RedisServer, tmp_path: Path) -> None:
    ledger = broker.client(db=2)
    schedule = {"grid": {"every": 1, "claims": {"catch_up": "all"}},
                "other": {"every": 2, "claims": {"catch_up": "all"}}}
    with fleet(store_server.url, broker.broker_url(), tmp_path, schedule,
               BC_EXEC_URL=f"redis://127.0.0.1:{broker.port}/2") as f:
        f.worker(concurrency=2)
        beats = [f.beat(), f.beat()]
        wait_for(lambda: len(executions(ledger)) >= 5, 30, "runs before the wipe")
        store_server.come_back(None)  # a restart without persistence: empty
        wiped = time.time()
        wait_for(lambda: [r for r in executions(ledger)
                          if r["entry"] == "grid" and _ms(r["due"]) > (wiped + 6) * 1000],
                 40, "runs well after the wipe")
        for beat in beats:
            f.wait_log(beat, "the store may have lost writes", 5)
        rows = executions(ledger)
    assert duplicates(rows) == {}
    tokens_are_never_reused(rows)
    for name, period in (("grid", 1000), ("other", 2000)):
        dues = sorted(_ms(r["due"]) for r in rows if r["entry"] == name)
        gaps = [b - a for a, b in itertools.pairwise(dues)]
        # The same grid before and after the wipe, and every occurrence ran (caught up).
        assert gaps and set(gaps) == {period}, (name, gaps)
