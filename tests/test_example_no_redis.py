"""The README's first command without Redis: ``example_project/run.sh`` in its SQLite mode
(the beat-claims store a SQLite file, the broker kombu's filesystem transport), end to end
with real processes (one worker, two beats, runserver) and no Redis to talk to: REDIS_URL
points at a closed port."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from beat_claims.enums import RunState
from beat_claims.runs import Run
from beat_claims.stores.sqlite import SQLiteStore

from .conftest import free_port
from .processes import ROOT, wait_for

pytest.importorskip("django")
pytestmark = pytest.mark.integration

PROJECT = ROOT / "example_project"
RUN_SH = PROJECT / "run.sh"
PREFIX = "example-claims"  # CELERY_BEAT_CLAIMS_KEY_PREFIX of the example
#: How long the example may take to start and record its first runs (a loaded machine).
DEADLINE = 90.0


class Example:
    """``run.sh`` running in the background, its output in a file."""

    def __init__(self, tmp: Path) -> None:
        self.data = tmp / "data"
        self.logs = tmp / "logs"
        self.out = tmp / "run.out"
        self.admin = f"127.0.0.1:{free_port()}"
        python_dir = os.path.dirname(sys.executable)
        self.env = {
            **os.environ,
            "PATH": f"{python_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "BC_STORE": "sqlite",
            "BC_NO_VENV": "1",
            "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
            # A backstop only: the test interrupts the run once it has seen what it needs.
            "RUN_SECONDS": str(int(DEADLINE) + 30),
            "EXAMPLE_HEARTBEAT": "1",  # the new store's epoch settles in 3 s, not 6
            "EXAMPLE_DATA": str(self.data),
            "EXAMPLE_DB": str(tmp / "db.sqlite3"),
            "LOG_DIR": str(self.logs),
            "ADMIN_ADDR": self.admin,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.store: SQLiteStore | None = None

    def start(self) -> None:
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(["bash", str(RUN_SH)], env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def open_store(self) -> SQLiteStore | None:
        if self.store is None and (self.data / "claims.db").exists():
            self.store = SQLiteStore.from_url(f"sqlite:///{self.data / 'claims.db'}", PREFIX)
        return self.store

    def runs(self, entry: str) -> list[Run]:
        store = self.open_store()
        return store.history(entry) if store is not None else []

    def done(self, entry: str) -> list[Run]:
        return [r for r in self.runs(entry) if r.state is RunState.DONE]

    def alive_beats(self) -> int:
        store = self.open_store()
        return sum(1 for o in store.owners() if o.alive) if store is not None else 0

    def admin_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.admin}/admin/login/", timeout=2) as r:
                return r.status == 200 and b"Django" in r.read()
        except OSError:
            return False

    def interrupt(self) -> int:
        """Ctrl-C: run.sh prints the status, stops everything and exits."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        # The worker's warm shutdown waits for slow_report (12 s).
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if self.store is not None:
            self.store.close()


@pytest.fixture
def example(tmp_path: Path) -> Iterator[Example]:
    ex = Example(tmp_path)
    ex.start()
    try:
        yield ex
    finally:
        ex.kill()


def until(example: Example, predicate: Callable[[], object], what: str) -> None:
    """Wait for ``predicate`` while run.sh runs; say what it printed when it did not."""

    def check() -> bool:
        if not example.running():
            raise AssertionError(f"run.sh exited early while waiting for {what}:\n"
                                 f"{example.output()}")
        return bool(predicate())

    wait_for(check, DEADLINE, what, interval=0.5)


def test_the_example_runs_with_sqlite_and_no_redis(example: Example) -> None:
    until(example, lambda: len(example.done("heartbeat")) >= 2,
          "two heartbeat runs recorded done in the SQLite store")
    until(example, lambda: example.alive_beats() == 2, "both beats alive in the store")
    until(example, example.admin_answers, "the Django admin's login page")
    assert example.interrupt() == 0, example.output()

    out = example.output()
    assert "SQLite: store sqlite:///" in out and "Redis:" not in out
    # The status it printed: the heartbeat entry's last run done, with its counts.
    row = next(line for line in out.splitlines() if line.startswith("heartbeat "))
    assert " done " in row and re.search(r"done=\d+", row), out
    sent = {beat: int(n) for beat, n in re.findall(r"^\s+(beat[12])\s+(\d+) sent$", out,
                                                  re.MULTILINE)}
    assert set(sent) == {"beat1", "beat2"} and sum(sent.values()) >= 2, out
    refused = re.search(r"^\s+refused\s+(\d+)$", out, re.MULTILINE)
    assert refused is not None and refused.group(1) == "0", out

    # The store, read again once every process has stopped: each occurrence ran once, by
    # the worker, with its own task id; the beats left.
    runs = example.done("heartbeat")
    assert len(runs) >= 2
    assert len({r.due for r in runs}) == len(runs)
    assert len({r.task_id for r in runs}) == len(runs) and all(r.task_id for r in runs)
    assert all(r.worker and r.worker.startswith("example-worker@") for r in runs)
    assert example.alive_beats() == 0

    # Nothing talked to Redis: the broker is the filesystem, and no process stopped on an
    # error of its own.
    worker_log = (example.logs / "worker.log").read_text(errors="replace")
    assert "exampleproj.broker:Transport" in worker_log
    for log in example.logs.glob("*.log"):
        text = log.read_text(errors="replace")
        assert "redis://" not in text and "Unrecoverable error" not in text, (log, text)
    assert not list((example.data / "broker" / "queue").glob(".*.part"))


def test_a_message_file_appears_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's fix of kombu's filesystem transport: when the message gets its name (the
    one a consumer takes), its file is already written; a consumer then takes it whole."""
    from kombu import Connection, Exchange, Queue

    # The module alone: importing the package would make the example's Celery app current.
    spec = importlib.util.spec_from_file_location("example_broker",
                                                  PROJECT / "exampleproj" / "broker.py")
    assert spec is not None and spec.loader is not None
    broker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(broker)
    transport = broker.Transport

    folder = tmp_path / "queue"
    folder.mkdir()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder),
               "control_folder": str(tmp_path / "control")}
    named: list[tuple[list[str], bytes]] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        named.append((sorted(p.name for p in folder.glob("*.msg")), Path(src).read_bytes()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    queue = Queue("celery", Exchange("celery", "direct"), routing_key="celery")
    with Connection("filesystem://", transport=transport, transport_options=options) as conn:
        channel = conn.default_channel
        queue(channel).declare()
        conn.Producer(channel).publish({"n": 1}, exchange=queue.exchange,
                                       routing_key="celery")
        [(visible, written)] = named
        assert visible == [] and "body" in json.loads(written)  # whole, before it is seen
        [name] = [p.name for p in folder.iterdir()]
        assert name.endswith(".celery.msg") and not name.startswith(".")
        message = channel.basic_get("celery")
        assert message is not None and message.payload == {"n": 1}
        message.ack()
    assert list(folder.iterdir()) == []
