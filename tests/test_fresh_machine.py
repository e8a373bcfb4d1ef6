"""The README's test command, ``scripts/test``, on a machine that lacks what the tests need:
it names what it cannot install and stops before the tests; with no PostgreSQL where the
tests look, it runs them against a private cluster of its own, gone when it exits.

Each runs the real script with the checkout's ``.venv`` (as ``scripts/test`` made it: the
install is not repeated) and a one-test pytest, so that nothing is installed here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from .conftest import free_port
from .processes import ROOT

SCRIPT = ROOT / "scripts" / "test"
#: One quick test that needs PostgreSQL (the contract suite's backend).
PG_TEST = ("tests/contract/test_backfill.py::"
           "test_an_unknown_entry_cannot_be_backfilled[postgres]")


def installed_venv() -> None:
    """Skip unless .venv has the test extras installed by scripts/test (its stamp)."""
    stamp = ROOT / ".venv" / ".beat-claims-installed"
    if not stamp.exists() or "test" not in stamp.read_text().split():
        pytest.skip("run ./scripts/test once first: this test reuses the .venv it makes")


def script_env(**extra: str) -> dict[str, str]:
    """This environment without the outer pytest's (xdist's, this test's) variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "COV_CORE_"))}
    return {**env, **extra}


def run_script(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180, stdin=subprocess.DEVNULL)


def shown(out: subprocess.CompletedProcess[str]) -> str:
    return f"exit {out.returncode}\n---- stdout ----\n{out.stdout}\n---- stderr ----\n{out.stderr}"


def path_without(tmp: Path, *names: str) -> str:
    """A PATH with every command of this one but ``names``, as links in ``tmp``."""
    farm = tmp / "bin"
    farm.mkdir()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not folder or not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            if entry.name in names or (farm / entry.name).exists():
                continue
            if os.access(entry.path, os.X_OK) and not entry.is_dir():
                (farm / entry.name).symlink_to(entry.path)
    return str(farm)


def test_a_missing_server_it_cannot_install_is_named_and_no_test_runs(tmp_path: Path) -> None:
    installed_venv()
    out = run_script(PG_TEST, env=script_env(
        PATH=path_without(tmp_path, "redis-server", "apt-get")))
    assert out.returncode == 1, shown(out)
    [line] = [ln for ln in out.stderr.splitlines() if "missing:" in ln]
    assert line.startswith("scripts/test: missing: redis-server"), shown(out)
    assert "to install: Debian's packages redis-server" in line, shown(out)
    assert "pytest" not in out.stderr and "passed" not in out.stdout, shown(out)


def test_with_no_postgresql_a_private_cluster_serves_the_run_and_goes(tmp_path: Path) -> None:
    installed_venv()
    if shutil.which("initdb") is None and not any(
            Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        pytest.skip("no initdb here (apt-get install postgresql) to start a cluster with")
    closed = free_port()  # nothing listens there
    out = run_script(PG_TEST, "-n", "0", "-p", "no:cacheprovider",
                     env=script_env(BC_PGHOST="127.0.0.1", BC_PGPORT=str(closed),
                                    BC_PGUSER="postgres"))
    assert out.returncode == 0, shown(out)
    assert "1 passed" in out.stdout, shown(out)
    found = re.search(r"none answered at 127\.0\.0\.1:(\d+) as postgres; a private cluster"
                      r" \(.*\) on 127\.0\.0\.1:(\d+) for this run, in (\S+)", out.stderr)
    assert found is not None, shown(out)
    assert int(found.group(1)) == closed and int(found.group(2)) != closed
    # Stopped and deleted at exit: the port refuses, the directory is gone.
    assert not Path(found.group(3)).exists(), shown(out)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(host="127.0.0.1", port=found.group(2), user="postgres",
                        dbname="postgres", connect_timeout=3).close()
