"""Django integration: add ``"beat_claims.contrib.django"`` to ``INSTALLED_APPS``.

Settings are read through Celery's ``CELERY`` namespace (``CELERY_BEAT_CLAIMS_URL``, ...).
The app config installs the worker side (outcomes and fencing) on the project's Celery app
when Django starts and registers system checks (``beat_claims.E001``...); the admin shows
entries, claims and runs from the store, and ``manage.py beat_claims status|history``
prints what ``celery claims`` prints.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``beat_claims.contrib.django.DatabaseScheduler`` (the ``-S`` path), imported lazily:
    django-celery-beat is an optional dependency."""
    if name in ("DatabaseScheduler", "schedules_from_db"):
        from . import database_scheduler

        return getattr(database_scheduler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
