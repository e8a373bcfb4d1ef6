"""The Django integration, through the example project (real ``manage.py`` processes):
settings through the CELERY namespace, the worker side installed by the app config, the
system checks and the ``beat_claims`` command. The admin, the checks' failure modes and
outcomes from django-celery-results are tested in process: tests/test_django_*.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from beat_claims.stores.base import EntrySeed
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


def test_the_example_store_has_a_database_of_its_own(server: RedisServer,
                                                    tmp_path: Any) -> None:
    """The broker's queue is in REDIS_URL's database, the store in database 1 of the same
    server (the README's Quick start): neither shares a database with the other."""
    assert shell(server, (
        "from exampleproj.celery import app; from beat_claims.settings import Settings;"
        "print(app.conf.broker_url, Settings.from_app(app).url)"), tmp_path) == [
        server.url, f"redis://127.0.0.1:{server.port}/1"]
    assert server.url.endswith("/0")


def test_status_and_history_commands_match_the_store(server: RedisServer,
                                                    tmp_path: Any) -> None:
    store = RedisStore.from_url(f"redis://127.0.0.1:{server.port}/1", "example-claims")
    store.register([EntrySeed("heartbeat", "every 5s")])
    doc = json.loads(manage(server, "beat_claims", "status", "--json", tmp=tmp_path))
    names = {e["name"] for e in doc["entries"]}
    assert "heartbeat" in names
    entry = next(e for e in doc["entries"] if e["name"] == "heartbeat")
    assert entry["in_schedule"] and entry["next_due"] is not None
    table = manage(server, "beat_claims", "status", tmp=tmp_path)
    assert "heartbeat" in table and "ENTRY" in table
    due = store.request_run("heartbeat", "test")
    history = json.loads(manage(server, "beat_claims", "history", "heartbeat", "--json",
                                tmp=tmp_path))
    assert [(r["due_ms"], r["state"], r.get("manual")) for r in history["runs"]] == [
        (due, "due", True)]


def test_the_example_project_passes_its_checks(server: RedisServer, tmp_path: Any) -> None:
    """Its settings are valid and its store answers: no beat_claims message at all."""
    out = manage(server, "check", "--fail-level", "WARNING", tmp=tmp_path)
    assert "no issues" in out
