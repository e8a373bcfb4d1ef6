"""The Django integration, through the example project: settings through the CELERY
namespace, the worker side installed by the app config, the status command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer
from .processes import ROOT

pytest.importorskip("django")
PROJECT = ROOT / "example_project"


def manage(server: RedisServer, *args: str, tmp: Any) -> str:
    env = {**os.environ, "REDIS_URL": server.url, "PYTHONPATH": str(PROJECT),
           "DJANGO_SETTINGS_MODULE": "exampleproj.settings",
           "EXAMPLE_DB": str(tmp / "db.sqlite3")}
    out = subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def shell(server: RedisServer, code: str, tmp: Any) -> list[str]:
    """The last line ``manage.py shell -c`` printed (Django 5.2 prints a notice first)."""
    return manage(server, "shell", "-c", code, tmp=tmp).strip().splitlines()[-1].split()


def test_settings_reach_celery_and_the_worker_side_is_installed(server: RedisServer,
                                                                tmp_path: Any) -> None:
    assert shell(server, (
        "from exampleproj.celery import app; import beat_claims.worker as w;"
        "from beat_claims.settings import Settings; s = Settings.from_app(app);"
        "print(w._context.app is app, s.heartbeat_interval, s.key_prefix,"
        " app.conf.beat_scheduler)"), tmp_path) == [
        "True", "2.0", "example-claims", "beat_claims.Scheduler"]


def test_worker_start_adds_fencing_to_the_projects_tasks(server: RedisServer,
                                                         tmp_path: Any) -> None:
    assert shell(server, (
        "from exampleproj.celery import app; from celery import signals;"
        "app.loader.import_default_modules();"
        "signals.worker_init.send(sender=None);"
        "t = app.tasks['reports.tasks.heartbeat'];"
        "print(type(t).__dict__.get('_beat_claims_fenced'),"
        " type(t).before_start.__module__)"), tmp_path) == ["True", "beat_claims.worker"]


def test_status_command_matches_the_store(server: RedisServer, tmp_path: Any) -> None:
    store = RedisStore.from_url(server.url, "example-claims")
    store.ensure_entries([("heartbeat", "every 5s")])
    doc = json.loads(manage(server, "beat_claims_status", "--json", tmp=tmp_path))
    names = {e["name"] for e in doc["entries"]}
    assert "heartbeat" in names
    entry = next(e for e in doc["entries"] if e["name"] == "heartbeat")
    assert entry["in_schedule"] and entry["next_due"] is not None
    table = manage(server, "beat_claims_status", tmp=tmp_path)
    assert "heartbeat" in table and "ENTRY" in table


def test_outcomes_recovered_from_django_celery_results(server: RedisServer,
                                                       tmp_path: Any) -> None:
    """Workers without the hooks: the beat reads outcomes from the django-db backend."""
    from .processes import wait_for

    manage(server, "migrate", "-v", "0", tmp=tmp_path)
    env = {**os.environ, "REDIS_URL": server.url, "PYTHONPATH": str(PROJECT),
           "DJANGO_SETTINGS_MODULE": "exampleproj.settings",
           "EXAMPLE_DB": str(tmp_path / "db.sqlite3"), "EXAMPLE_NO_HOOKS": "1",
           "EXAMPLE_HEARTBEAT": "0.5"}
    store = RedisStore.from_url(server.url, "example-claims")
    procs = []
    try:
        for args in (["worker", "-c", "1", "--without-gossip", "--without-mingle"],
                     ["beat", "-s", str(tmp_path / "unused")]):
            log = (tmp_path / f"{args[0]}.log").open("wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "exampleproj", *args, "-l", "INFO"],
                cwd=PROJECT, env=env, stdout=log, stderr=subprocess.STDOUT))
        run = wait_for(lambda: next((r for r in store.history("heartbeat")
                                     if r.state.value == "done"), None), 60,
                       "an outcome recovered from django-celery-results")
        # The beat writes its log line just after the store: wait for it before stopping.
        wait_for(lambda: "from the result backend" in (tmp_path / "beat.log").read_text(), 10,
                 "the beat to log the recovery")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert run.started_at is None  # no worker hook recorded it: the backend did
    assert "from the result backend" in (tmp_path / "beat.log").read_text()
