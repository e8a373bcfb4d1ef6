"""Settings through Django's ``CELERY`` namespace, and the system checks of each way the
configuration can be wrong (no database needed)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO

import pytest
from celery import Celery
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from beat_claims.settings import ConfigurationError, Settings

from .conftest import RedisServer, free_port
from .djangosite.testing import configured, site_app

EVERY = {"task": "site.tick", "schedule": timedelta(seconds=30)}


def django_app() -> Celery:
    """A Celery app configured from the Django settings, as a project's celery.py does."""
    app = Celery("proj", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    return app


@pytest.fixture
def app(server: RedisServer) -> Iterator[Celery]:
    with site_app(server.url, server.broker_url(), beat_schedule={"tick": EVERY}) as app:
        yield app


def ids(**conf: object) -> list[tuple[str, str]]:
    """(id, message) of the beat-claims checks, with ``conf`` on the site's app."""
    from .djangosite.celery import app

    with configured(app, **conf):
        return [(m.id or "", m.msg) for m in run_checks(tags=["beat_claims"])]


# -- settings -----------------------------------------------------------------------------
def test_celery_beat_claims_settings_reach_the_beat() -> None:
    with override_settings(CELERY_BEAT_CLAIMS_URL="rediss://u:p@store:6380/2",
                           CELERY_BEAT_CLAIMS_CATCH_UP="all", CELERY_BEAT_CLAIMS_MAX_CATCH_UP=7,
                           CELERY_BEAT_CLAIMS_OVERLAP="skip", CELERY_BEAT_CLAIMS_RUN_TIMEOUT=90,
                           CELERY_BEAT_CLAIMS_RECLAIM_AFTER=timedelta(minutes=2),
                           CELERY_BEAT_CLAIMS_KEY_PREFIX="proj-claims",
                           CELERY_BEAT_CLAIMS_HEARTBEAT_INTERVAL=3):
        settings = Settings.from_app(django_app())
    assert (settings.url, settings.key_prefix, settings.heartbeat_interval) == (
        "rediss://u:p@store:6380/2", "proj-claims", 3.0)
    policy = settings.policy
    assert (policy.catch_up, policy.max_catch_up, policy.overlap, policy.run_timeout,
            policy.reclaim_after) == ("all", 7, "skip", 90.0, 120.0)


def test_the_store_defaults_to_a_redis_broker() -> None:
    with override_settings(CELERY_BEAT_CLAIMS_URL=None, CELERY_BROKER_URL="redis://b:6379/3"):
        assert Settings.from_app(django_app()).url == "redis://b:6379/3"


@pytest.mark.parametrize(("setting", "value", "match"), [
    ("CELERY_BEAT_CLAIMS_CATCH_UP", "sometimes", "beat_claims_catch_up='sometimes'"),
    ("CELERY_BEAT_CLAIMS_RECLAIM_AFTER", 0, "beat_claims_reclaim_after=0"),
    ("CELERY_BEAT_CLAIMS_KEY_PREFIX", "a b", "beat_claims_key_prefix"),
])
def test_invalid_settings_raise_configuration_error(setting: str, value: object,
                                                    match: str) -> None:
    with override_settings(**{setting: value}), pytest.raises(ConfigurationError, match=match):
        Settings.from_app(django_app())


# -- checks -------------------------------------------------------------------------------
def test_a_valid_configuration_passes(app: Celery) -> None:
    assert ids() == []


def test_e001_no_store_url(app: Celery) -> None:
    [(check_id, msg)] = ids(beat_claims_url=None, broker_url="amqp://guest:secret@rabbit//")
    assert check_id == "beat_claims.E001"
    assert "CELERY_BEAT_CLAIMS_URL is not set" in msg and "amqp://guest:***@rabbit//" in msg
    assert "secret" not in msg


@pytest.mark.parametrize(("conf", "expected"), [
    ({"beat_claims_catch_up": "sometimes"}, "beat_claims_catch_up='sometimes'"),
    ({"beat_claims_overlap": "queue"}, "beat_claims_overlap='queue'"),
    ({"beat_claims_run_timeout": -5}, "beat_claims_run_timeout=-5"),
    ({"beat_claims_url": "sentinel://s1:26379"}, "beat_claims_sentinel_master"),
])
def test_e002_invalid_setting(app: Celery, conf: dict[str, object], expected: str) -> None:
    [(check_id, msg)] = ids(**conf)
    assert check_id == "beat_claims.E002" and expected in msg


def test_e003_invalid_entry_options(app: Celery) -> None:
    schedule = {
        "ok": EVERY,
        "bad-policy": {**EVERY, "claims": {"catch_up": "never"}},
        "bad-key": {**EVERY, "claims": {"catchup": "all"}},
    }
    found = ids(beat_schedule=schedule)
    assert [i for i, _ in found] == ["beat_claims.E003", "beat_claims.E003"]
    assert "entry 'bad-policy': claims['catch_up']='never'" in found[0][1]
    assert "entry 'bad-key': unknown key claims['catchup']" in found[1][1]


def test_w001_unreachable_store_masks_the_password(app: Celery) -> None:
    url = f"redis://user:hunter2@127.0.0.1:{free_port()}/0"
    [(check_id, msg)] = ids(beat_claims_url=url)
    assert check_id == "beat_claims.W001"
    assert f"redis://user:***@127.0.0.1:{url.rsplit(':', 1)[1]}" in msg
    assert "hunter2" not in msg and "ConnectionError" in msg


def test_w001_a_store_that_never_answers_does_not_hang_the_check(app: Celery) -> None:
    with socket.socket() as silent:  # accepts connections (backlog), never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        started = time.monotonic()
        [(check_id, msg)] = ids(beat_claims_url=f"redis://127.0.0.1:{silent.getsockname()[1]}")
        took = time.monotonic() - started
    assert check_id == "beat_claims.W001" and "Timeout" in msg
    assert took < 5


@pytest.mark.parametrize("silent_sentinels", [1, 3])
def test_w001_unresponsive_sentinels_cost_about_a_second_each(
        app: Celery, silent_sentinels: int) -> None:
    """Was 59 s for one sentinel that accepts connections and never answers, and more than
    100 s for three: every sentinel is asked once, within the check's 1 s timeouts."""
    from .test_redis_client import SilentServer

    peers = [SilentServer() for _ in range(silent_sentinels)]
    try:
        url = ";".join(f"sentinel://127.0.0.1:{p.port}" for p in peers) + "/0"
        started = time.monotonic()
        [(check_id, _msg)] = ids(beat_claims_url=url, beat_claims_sentinel_master="m")
        took = time.monotonic() - started
    finally:
        for peer in peers:
            peer.close()
    assert check_id == "beat_claims.W001"
    assert took < 2.5 * silent_sentinels, took


def test_the_store_ping_can_be_turned_off(app: Celery) -> None:
    with override_settings(BEAT_CLAIMS_CHECK_STORE=False):
        assert ids(beat_claims_url=f"redis://127.0.0.1:{free_port()}/0") == []


def test_manage_py_check_reports_them(app: Celery) -> None:
    with configured(app, beat_claims_catch_up="sometimes"), \
            pytest.raises(SystemCheckError, match=r"beat_claims\.E002"):
        call_command("check")
    err = StringIO()
    with configured(app, beat_claims_url=f"redis://127.0.0.1:{free_port()}/0"):
        call_command("check", stderr=err)
    assert "beat_claims.W001" in err.getvalue()


def test_without_the_apps_path_the_checks_find_the_project_app_or_say_so() -> None:
    """No BEAT_CLAIMS_CELERY_APP, and Celery's default app is current (the project's app
    was never made current): never a false E001 while CELERY_BEAT_CLAIMS_URL is set."""
    from celery import _state

    previous = _state.get_current_app()
    _state.default_app.set_current()
    try:
        with override_settings(BEAT_CLAIMS_CELERY_APP=None,
                               SETTINGS_MODULE="tests.djangosite.settings",
                               CELERY_BEAT_CLAIMS_URL="redis://127.0.0.1:1/0",
                               BEAT_CLAIMS_CHECK_STORE=False):
            found = [(m.id, m.msg) for m in run_checks(tags=["beat_claims"])]
        # The site's package has celery.py with an app: found, nothing to say.
        assert [i for i, _ in found] == [], found
        with override_settings(BEAT_CLAIMS_CELERY_APP=None, SETTINGS_MODULE="nowhere.settings",
                               CELERY_BEAT_CLAIMS_URL="redis://127.0.0.1:1/0",
                               BEAT_CLAIMS_CHECK_STORE=False):
            found = [(m.id, m.hint) for m in run_checks(tags=["beat_claims"])]
        assert [i for i, _ in found] == ["beat_claims.W002"], found
        assert "BEAT_CLAIMS_CELERY_APP = 'proj.celery:app'" in str(found[0][1])
    finally:
        previous.set_current()
