"""Helpers for tests of the Django integration: the site's Celery app pointed at the test's
private redis-server (never the machine's shared one), and staff users."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from celery import Celery

from ..processes import wait_for

T = TypeVar("T")
PREFIX = "site-claims"


@contextmanager
def configured(app: Celery, **conf: Any) -> Iterator[Celery]:
    """``app.conf`` updated for the duration, then exactly as it was."""
    app.conf.get("broker_url")  # read the Django settings first: ``changes`` is then ours
    before = dict(app.conf.changes)
    app.conf.update(conf)
    # The app caches the zone it reads from its conf (Django's TIME_ZONE, which a test may
    # change): read again, here and after, or a later test's crontab on the current app
    # would be in an earlier test's zone.
    del app.timezone
    try:
        yield app
    finally:
        app.conf.changes.clear()
        app.conf.changes.update(before)
        del app.timezone


@contextmanager
def site_app(store_url: str, broker_url: str, **conf: Any) -> Iterator[Celery]:
    """The test site's Celery app (``BEAT_CLAIMS_CELERY_APP``) on a private server."""
    from .celery import app

    settings: dict[str, Any] = {
        "beat_claims_url": store_url, "broker_url": broker_url,
        "beat_claims_key_prefix": PREFIX, "beat_claims_heartbeat_interval": 0.2,
        "beat_claims_catch_up_grace": 2, "beat_max_loop_interval": 0.2,
        "broker_connection_retry_on_startup": True, "beat_schedule": {}, **conf,
    }
    with configured(app, **settings):
        from beat_claims.settings import Settings

        # Never the machine's shared Redis: make sure the override took.
        assert (Settings.from_app(app).url, app.conf.broker_url) == (store_url, broker_url)
        yield app


def staff(username: str, *perms: str) -> Any:
    """A staff user with these ``beat_claims`` permissions (codenames)."""
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user(username, is_staff=True)  # no password: fast
    user.user_permissions.set(Permission.objects.filter(
        content_type__app_label="beat_claims", codename__in=perms))
    return user


def poll(check: Callable[[], T], timeout: float, what: str,
         between: Callable[[], Any] | None = None) -> T:
    """``check()`` until it is truthy; ``between()`` (a scheduler tick) runs between tries."""
    result: T = wait_for(check, timeout, what, interval=0.02, between=between)
    return result
