"""The README's first command without Redis: ``example_project/run.sh`` in its SQLite mode
(the beat-claims store a SQLite file, the broker kombu's filesystem transport), end to end
with real processes (one worker, two beats, runserver) and no Redis to talk to: REDIS_URL
points at a closed port."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
#: How long the example may take, from run.sh's start, to record two heartbeats done with
#: both beats alive and the admin answering. Idle it takes about 15 s: a migrate, then five
#: Django and Celery processes starting at once (the worker with four children), the
#: store's epoch settling (3 s), two heartbeats (every 2 s here). Beside four test processes on
#: two cores each start is several times slower; polled, so a deadline met early costs
#: nothing.
START_DEADLINE = 150.0
#: How long run.sh may take to stop after Ctrl-C: ``claims status`` (one more Django and
#: Celery start), the worker's warm shutdown (slow_report, 1 s here, 12 s by default; run.sh
#: kills what has not stopped after 30 s), then its counts.
STOP_DEADLINE = 120.0


def default_sigint() -> None:
    """In run.sh's process, before bash starts: Ctrl-C (SIGINT) back to its default. A test
    run started in the background by a shell without job control (``nohup ... &``, some CI
    runners) ignores SIGINT, its children inherit that, and bash cannot trap a signal that
    was ignored when it started: run.sh would sleep through the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
            "RUN_SECONDS": str(int(START_DEADLINE) + 30),
            "EXAMPLE_HEARTBEAT": "1",  # the new store's epoch settles in 3 s, not 6
            # slow_report runs 1 s, not 12: the worker's warm shutdown at Ctrl-C waits for
            # it (up to 12 s), for nothing this test is about.
            "EXAMPLE_SLOW_REPORT_SECONDS": "1",
            # Two heartbeat runs 2 s apart, not 5: the test waits for two.
            "EXAMPLE_HEARTBEAT_EVERY": "2",
            "EXAMPLE_DATA": str(self.data),
            "EXAMPLE_DB": str(tmp / "db.sqlite3"),
            "LOG_DIR": str(self.logs),
            "ADMIN_ADDR": self.admin,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.store: SQLiteStore | None = None
        self.started = 0.0

    def start(self) -> None:
        self.started = time.monotonic()
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(["bash", str(RUN_SH)], env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=default_sigint)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def evidence(self) -> str:
        """What run.sh printed, and the end of each of its processes' logs."""
        parts = [f"---- run.sh's output ({self.out}) ----\n{self.output()}"]
        for log in sorted(self.logs.glob("*.log")):
            parts.append(f"---- {log.name} ({log}) ----\n"
                         f"{log.read_text(errors='replace')[-6000:]}")
        return "\n".join(parts)

    @contextmanager
    def shown_on_failure(self) -> Iterator[None]:
        """On a failure of the block, the evidence goes to stderr (shown with the failure)."""
        try:
            yield
        except BaseException:
            sys.stderr.write(self.evidence() + "\n")
            raise

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
        proc = self.proc
        assert proc is not None
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        wait_for(lambda: proc.poll() is not None, STOP_DEADLINE,
                 "run.sh to print the status and stop after Ctrl-C", interval=0.2)
        return proc.returncode

    def kill(self) -> None:
        """SIGTERM: run.sh stops what it started; SIGKILL to what is left after a while."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_DEADLINE)
            except subprocess.TimeoutExpired:
                # run.sh starts each process in a group of its own (set -m).
                pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", self.output())]
                for pgid in [self.proc.pid, *pids]:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pgid, signal.SIGKILL)
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


def until(example: Example, deadline: float, predicate: Callable[[], object],
          what: str) -> None:
    """Wait for ``predicate`` while run.sh runs, until ``deadline`` (monotonic)."""

    def check() -> bool:
        if not example.running():
            raise AssertionError(f"run.sh exited early while waiting for {what}")
        return bool(predicate())

    wait_for(check, max(0.0, deadline - time.monotonic()), what, interval=0.5)


# pytest-timeout's limit (setup, call and teardown) past every deadline above: the test's
# own deadlines fail first, with the evidence.
@pytest.mark.timeout(START_DEADLINE + 2 * STOP_DEADLINE + 30)
def test_the_example_runs_with_sqlite_and_no_redis(example: Example) -> None:
    with example.shown_on_failure():
        check_the_example(example)


def check_the_example(example: Example) -> None:
    started = example.started
    deadline = started + START_DEADLINE
    until(example, deadline, lambda: len(example.done("heartbeat")) >= 2,
          "two heartbeat runs recorded done in the SQLite store")
    until(example, deadline, lambda: example.alive_beats() == 2,
          "both beats alive in the store")
    until(example, deadline, example.admin_answers, "the Django admin's login page")
    up = time.monotonic()
    assert example.interrupt() == 0
    # On the terminal with -rP (and with the evidence on a failure): how long it took.
    print(f"run.sh: {up - started:.1f} s to two heartbeats done, both beats alive and the"
          f" admin up; {time.monotonic() - up:.1f} s to stop after Ctrl-C")

    out = example.output()
    assert "SQLite: store sqlite:///" in out and "Redis:" not in out
    # The status it printed while everything still ran: the heartbeat entry's last run
    # (sent, started or done: a run may be in flight when Ctrl-C comes) and its counts, at
    # least one done.
    row = next(line for line in out.splitlines() if line.startswith("heartbeat "))
    assert re.search(r" (sent|started|done) ", row) and re.search(r"done=[1-9]", row), row
    sent = {beat: int(n) for beat, n in re.findall(r"^\s+(beat[12])\s+(\d+) sent$", out,
                                                  re.MULTILINE)}
    assert set(sent) == {"beat1", "beat2"} and sum(sent.values()) >= 2
    refused = re.search(r"^\s+refused\s+(\d+)$", out, re.MULTILINE)
    assert refused is not None and refused.group(1) == "0"

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
        assert "redis://" not in text and "Unrecoverable error" not in text, log
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
