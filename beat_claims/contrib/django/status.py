"""What the admin and ``manage.py beat_claims`` read: the store, and the schedules that
give each entry its next occurrence.

Everything comes from the store through :mod:`beat_claims.inspect`, the same
documents ``celery claims`` prints; nothing is read from database tables, except the
schedules themselves when the django-celery-beat database scheduler is in use.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

from django.apps import apps as django_apps

from beat_claims import inspect
from beat_claims.runs import Run
from beat_claims.settings import Settings
from beat_claims.stores import open_store
from beat_claims.stores.base import Store

from .apps import project_app

#: How long a page waits for the store: it must not hang on it.
STORE_TIMEOUT = 2.0
DATABASE_SCHEDULER = "beat_claims.contrib.django.database_scheduler"

_stores: dict[tuple[str, str, str | None], Store] = {}
_lock = threading.Lock()


def store_for(app: Any = None) -> Store:
    """The store of ``app`` (default: the project's Celery app), one client per process."""
    settings = Settings.from_app(app or project_app())
    key = (settings.url, settings.key_prefix, settings.sentinel_master)
    with _lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = open_store(settings, timeout=STORE_TIMEOUT)
    return store


def uses_database_scheduler(app: Any) -> bool:
    """Whether ``beat_scheduler`` names beat-claims' django-celery-beat scheduler (by path
    or by its ``celery.beat_schedulers`` alias)."""
    from celery.utils.imports import load_extension_class_names

    scheduler = app.conf.get("beat_scheduler") or ""
    if not isinstance(scheduler, str):
        scheduler = f"{scheduler.__module__}:{scheduler.__qualname__}"
    aliases = dict(load_extension_class_names("celery.beat_schedulers") or ())
    path = str(aliases.get(scheduler, scheduler)).replace(":", ".")
    return path.startswith(DATABASE_SCHEDULER) or path == "beat_claims.contrib.django." \
        "DatabaseScheduler"


def schedules(app: Any) -> dict[str, Any] | None:
    """Entry name -> Celery schedule when the database scheduler is in use: its rows, and
    ``beat_schedule`` over them (as that scheduler merges them). None (read
    ``beat_schedule`` only) otherwise, or when its helper is not available."""
    if not django_apps.ready or not django_apps.is_installed("django_celery_beat") \
            or not uses_database_scheduler(app):
        return None  # (not ready: Django is not set up, this is no Django project)
    try:
        module = importlib.import_module(DATABASE_SCHEDULER)
    except ImportError:
        return None
    helper = getattr(module, "schedules_from_db", None)
    if helper is None:
        return None
    return {**dict(helper()), **inspect.beat_schedules(app)}


def enabled_rows() -> set[str]:
    """The names of django-celery-beat's enabled rows, whichever scheduler the app names (a
    beat may be given ``-S`` on its command line): a prune keeps their entries. Empty when
    Django is not set up or django-celery-beat is not installed."""
    if not django_apps.ready or not django_apps.is_installed("django_celery_beat"):
        return set()
    from django_celery_beat.models import PeriodicTask

    return set(PeriodicTask.objects.filter(enabled=True).values_list("name", flat=True))


def status(app: Any = None, seen: Callable[[list[Run]], None] | None = None
           ) -> dict[str, Any]:
    """The ``celery claims status`` document of the project's app (``seen``: see
    :func:`beat_claims.inspect.status`)."""
    app = app or project_app()
    return inspect.status(app, store_for(app), schedules=schedules(app), seen=seen)


def history(entry: str, limit: int | None = None, app: Any = None) -> dict[str, Any]:
    """The ``celery claims history ENTRY`` document of the project's app."""
    app = app or project_app()
    try:
        return inspect.history(app, entry, limit, store=store_for(app))
    except inspect.UnknownEntry:  # a page for it all the same (no beat has seen it yet)
        return {"entry": entry, "runs": []}
