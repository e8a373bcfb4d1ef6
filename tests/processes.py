"""Real ``celery beat`` and ``celery worker`` processes for the integration tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

from beat_claims.settings import Settings
from beat_claims.stores import open_store
from beat_claims.stores.base import EntrySeed
from bench.chaos import stop_processes

ROOT = Path(__file__).resolve().parents[1]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.1, between: Callable[[], Any] | None = None) -> Any:
    """Poll until ``predicate()`` is truthy; fail with ``what`` after ``timeout`` seconds.
    ``between()`` (a scheduler tick, say) runs between tries."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        if between is not None:
            between()
        time.sleep(interval)


class Fleet:
    """Starts beats and workers against one Redis, and stops every one of them."""

    #: The Celery app (``-A``) of the processes.
    APP = "tests.proj.app"

    def __init__(self, redis_url: str, broker_url: str, log_dir: Path,
                 schedule: dict[str, Any], **env: str) -> None:
        self.env = {
            **os.environ,
            "BC_REDIS_URL": redis_url,
            "BC_BROKER_URL": broker_url,
            "BC_SCHEDULE": json.dumps(schedule),
            "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            **env,
        }
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}

    def _spawn(self, kind: str, args: list[str], wrap: Sequence[str] = (),
               **env: str) -> subprocess.Popen[bytes]:
        """``wrap``: a command that runs the process (``unshare ...``: another namespace)."""
        n = len(self.procs)
        log = self.log_dir / f"{kind}-{n}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*wrap, sys.executable, "-m", "celery", "-A", self.APP, *args],
                cwd=ROOT, env={**self.env, **env}, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def beat(self, *extra: str, loglevel: str = "INFO", **env: str) -> subprocess.Popen[bytes]:
        return self._spawn("beat", ["beat", "-S", "claims", "--loglevel", loglevel, *extra],
                           **env)

    def worker(self, *extra: str, concurrency: int = 2, pool: str = "prefork",
               wrap: Sequence[str] = (), **env: str) -> subprocess.Popen[bytes]:
        return self._spawn("worker", ["worker", "--loglevel", "INFO", "-P", pool,
                                      "-c", str(concurrency), "--without-gossip",
                                      "--without-mingle",
                                      "-n", f"w{len(self.procs)}@%h", *extra], wrap, **env)

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return self.logs[proc.pid].read_text(errors="replace")

    def wait_log(self, proc: subprocess.Popen[bytes], text: str, timeout: float = 30) -> None:
        wait_for(lambda: text in self.log(proc), timeout, f"{text!r} in the log of {proc.args}")

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM,
             timeout: float = 20) -> None:
        if proc.poll() is None:
            os.kill(proc.pid, sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                stacks = self.stacks(proc)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
                raise AssertionError(f"{proc.args} did not stop on signal {sig} within"
                                     f" {timeout}s; its log ends:\n{stacks}") from None

    def stacks(self, proc: subprocess.Popen[bytes]) -> str:
        """The end of a live process's log after it wrote every thread's stack to it (the
        test app registers faulthandler on SIGUSR2)."""
        before = len(self.log(proc))
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and "File " not in self.log(proc)[before:]:
            time.sleep(0.05)
        return self.log(proc)[-6000:]

    def close(self) -> None:
        close_all([self])


def close_all(fleets: Sequence[Fleet]) -> None:
    """Stop every process of ``fleets`` at once (bench.chaos.stop_processes: SIGTERM, one
    deadline 10 s on, then SIGKILL)."""
    stop_processes([proc for f in fleets for proc in f.procs], timeout=10)


F = TypeVar("F", bound=Fleet)


@contextmanager
def running(f: F) -> Iterator[F]:
    """``f`` for the test; on a failure the tail of every process's log goes to stderr, and
    every process is stopped in any case."""
    try:
        yield f
    except BaseException:
        for pid, path in f.logs.items():
            sys.stderr.write(f"---- log of pid {pid} ({path.name}) ----\n")
            sys.stderr.write(path.read_text(errors="replace")[-6000:])
        raise
    finally:
        f.close()


def fleet(redis_url: str, broker_url: str, log_dir: Path, schedule: dict[str, Any],
          **env: str) -> AbstractContextManager[Fleet]:
    return running(Fleet(redis_url, broker_url, log_dir, schedule, **env))


def executions(client: Any, what: str = "run") -> list[dict[str, Any]]:
    rows = [json.loads(raw) for raw in client.lrange("executions", 0, -1)]
    return [row for row in rows if row["what"] == what]


def duplicates(rows: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    counts = Counter((row["entry"], row["due"]) for row in rows)
    return {key: n for key, n in counts.items() if n > 1}


def next_due_in(url: str, schedule: dict[str, Any], seconds: float) -> None:
    """The interval entries of ``schedule`` (a fleet's, name -> {"every": s, ...}) in the
    store at ``url`` as beats that ran before left them: registered, each next due
    ``seconds`` from now, rather than a whole period after the fleet's beats register them
    (they keep an entry's anchor). An occurrence the beats come up too late for is caught
    up, or skipped as the entry's catch-up policy says."""
    store = open_store(Settings(url=url), timeout=5.0)
    try:
        now = store.now()
        store.register([EntrySeed(name, anchor=now - int(spec["every"] * 1000)
                                  + int(seconds * 1000))
                        for name, spec in schedule.items()])
    finally:
        store.close()
