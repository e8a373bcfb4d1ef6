"""Each test session's Django test database is its own, named after the session's process
and xdist worker (``test_beat_claims_<pid>_gw0``), so suites that run at once on one machine
(two worktrees, CI beside a developer) never use, clobber or drop each other's; a session
drops the databases it made when it ends. ``BC_DJANGO_TEST_DB`` names it instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from .contract.backend_postgres import url
from .processes import ROOT

pytest.importorskip("django")

#: Where the naming test writes the name it saw, when a test runs it in a session of its own.
REPORT = "BC_TEST_DB_REPORT"


def _on_postgres() -> bool:
    from django.conf import settings

    return bool(settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql")


@pytest.mark.django_db
def test_the_sessions_database_is_named_after_its_process_and_worker(
        request: pytest.FixtureRequest) -> None:
    from django.db import connection

    if not _on_postgres():
        pytest.skip("SQLite's test database is in memory, the session's own")
    worker = getattr(request.config, "workerinput", {}).get("workerid")
    base = os.environ.get("BC_DJANGO_TEST_DB") or f"test_beat_claims_{os.getpid()}"
    name = connection.settings_dict["NAME"]
    assert name == (f"{base}_{worker}" if worker else base)
    if os.environ.get(REPORT):
        Path(os.environ[REPORT]).write_text(json.dumps({"name": name, "pid": os.getpid()}))


def _databases() -> set[str]:
    import psycopg

    with psycopg.connect(url("postgres"), connect_timeout=5) as conn:
        return {row[0] for row in conn.execute("SELECT datname FROM pg_database")}


def test_sessions_at_once_have_their_own_databases_and_drop_them(tmp_path: Path) -> None:
    """Two test sessions at the same time, one named by ``BC_DJANGO_TEST_DB``: each creates
    its own database and drops it when it ends. (With xdist, the worker's id is added to
    the name: the naming test checks it in a suite run with ``-n``.)"""
    if not _on_postgres():
        pytest.skip("SQLite's test database is in memory, the session's own")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "BC_DJANGO_TEST_DB", "DJANGO_SETTINGS"))}
    test = f"{Path(__file__).relative_to(ROOT)}::" \
           f"{test_the_sessions_database_is_named_after_its_process_and_worker.__name__}"
    override = f"bc_test_named_{uuid.uuid4().hex[:8]}"
    sessions: dict[str, dict[str, str]] = {"own": {}, "named": {"BC_DJANGO_TEST_DB": override}}
    procs: dict[str, subprocess.Popen[str]] = {}
    for label, extra in sessions.items():
        procs[label] = subprocess.Popen(  # (the tables from the models: a quicker start)
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nomigrations",
             test],
            cwd=ROOT, env={**env, **extra, REPORT: str(tmp_path / label)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outputs = {label: proc.communicate(timeout=180)[0] for label, proc in procs.items()}
    for label, proc in procs.items():
        assert proc.returncode == 0, f"the {label} session failed:\n{outputs[label]}"
    seen: dict[str, Any] = {label: json.loads((tmp_path / label).read_text())
                            for label in sessions}
    assert seen["own"]["name"] == f"test_beat_claims_{seen['own']['pid']}", seen
    assert seen["named"]["name"] == override, seen
    left = {s["name"] for s in seen.values()} & _databases()
    assert not left, f"databases the sessions made and did not drop: {sorted(left)}"
