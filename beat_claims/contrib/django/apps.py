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
    ``proj/__init__.py`` does with ``from .celery import app as celery_app``; when none
    was (Celery's default app is current), the project's ``celery`` module next to its
    settings is looked for. None when there is no telling.
    """
    path = getattr(settings, "BEAT_CLAIMS_CELERY_APP", None)
    if path:
        from celery.utils.imports import symbol_by_name

        try:
            return symbol_by_name(path)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ImproperlyConfigured(
                f"BEAT_CLAIMS_CELERY_APP={path!r} cannot be imported: {exc}") from exc
    from celery import _state, current_app

    app = current_app._get_current_object()
    if app is not _state.default_app:
        return app
    return _project_app()


def _project_app() -> Any:
    """``<package>.celery:app`` (or ``celery_app``) where ``<package>`` holds the settings
    module, as Celery's Django guide lays a project out."""
    import importlib

    package = str(getattr(settings, "SETTINGS_MODULE", "") or "").rpartition(".")[0]
    for module_name in (f"{package}.celery", package) if package else ():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for attr in ("app", "celery_app", "celery"):
            candidate = getattr(module, attr, None)
            if candidate is not None and hasattr(candidate, "conf") and \
                    hasattr(candidate, "tasks"):
                return candidate
    return None


def project_app() -> Any:
    """The project's Celery app, or one configured from Django's settings when it cannot
    be found: what the admin and the commands read the settings from."""
    app = celery_app()
    return app if app is not None else settings_app()


def settings_app() -> Any:
    """A Celery app configured from Django's settings (the ``CELERY_`` namespace), for the
    checks to read what beats would, when the project's own app cannot be found."""
    from celery import Celery

    app = Celery("beat_claims_checks", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    return app


class BeatClaimsConfig(AppConfig):
    name = "beat_claims.contrib.django"
    label = "beat_claims"
    verbose_name = "beat-claims"

    def ready(self) -> None:
        import beat_claims

        from . import checks

        checks.register()
        app = celery_app()
        if app is not None:
            beat_claims.install(app)
        else:  # found when a worker starts: its app
            from celery import signals

            signals.worker_init.connect(_install_on_worker, weak=False)


def _install_on_worker(sender: Any = None, **kwargs: Any) -> None:
    import beat_claims

    app = getattr(sender, "app", None)
    if app is not None:
        beat_claims.install(app)
