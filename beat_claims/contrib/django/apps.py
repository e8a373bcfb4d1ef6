"""The Django app config: installs the beat-claims worker side on the project's Celery app
and registers the system checks."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


def celery_app() -> Any:
    """The project's Celery app: ``BEAT_CLAIMS_CELERY_APP`` if set, else the current app.

    The setting is a dotted path such as ``"proj.celery:app"`` (or ``"proj.celery.app"``).
    Without it, the app is the one the project made current by creating it, as the usual
    ``proj/__init__.py`` does with ``from .celery import app as celery_app``.
    """
    path = getattr(settings, "BEAT_CLAIMS_CELERY_APP", None)
    if path:
        from celery.utils.imports import symbol_by_name

        try:
            return symbol_by_name(path)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ImproperlyConfigured(
                f"BEAT_CLAIMS_CELERY_APP={path!r} cannot be imported: {exc}") from exc
    from celery import current_app

    return current_app._get_current_object()


class BeatClaimsConfig(AppConfig):
    name = "beat_claims.contrib.django"
    label = "beat_claims"
    verbose_name = "beat-claims"

    def ready(self) -> None:
        import beat_claims

        from . import checks

        checks.register()
        beat_claims.install(celery_app())
