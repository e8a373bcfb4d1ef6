"""System checks (``manage.py check``): the beat-claims configuration, as a beat reads it.

A beat refuses to start on a bad setting; these checks say so earlier, in the terms of
the Django settings (``CELERY_BEAT_CLAIMS_*``), with an id to silence or grep:

- ``beat_claims.E001``: no store URL (``CELERY_BEAT_CLAIMS_URL`` unset, broker not Redis);
- ``beat_claims.E002``: an invalid ``CELERY_BEAT_CLAIMS_*`` setting;
- ``beat_claims.E003``: an entry of ``CELERY_BEAT_SCHEDULE`` with invalid ``claims``
  options or a schedule beat-claims cannot compute;
- ``beat_claims.W001``: the store cannot be reached (within ``STORE_TIMEOUT`` seconds).

W001 is a warning, not an error: checks run before ``migrate`` and ``runserver`` too, and
those must work while Redis is down. ``BEAT_CLAIMS_CHECK_STORE = False`` skips the ping.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core import checks

from beat_claims.urls import redact_url

#: Seconds the reachability check waits for the store: ``check`` must not hang.
STORE_TIMEOUT = 1.0
TAG = "beat_claims"


def register() -> None:
    """Register the checks once (``AppConfig.ready`` may run more than once in tests)."""
    checks.register(check_configuration, TAG)


def check_configuration(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:

    from .apps import celery_app, settings_app

    notes: list[checks.CheckMessage] = []
    app = celery_app()
    if app is None:
        app = settings_app()
        notes.append(checks.Warning(
            "beat-claims cannot find the project's Celery app (none is current, and the"
            " settings' package has no celery module with an app): the checks read the"
            " CELERY_* settings instead.",
            hint="Set BEAT_CLAIMS_CELERY_APP = 'proj.celery:app' (the app beats and"
                 " workers run), or import it in proj/__init__.py as Celery's Django guide"
                 " shows.",
            id="beat_claims.W002"))
    return notes + _check_app(app)


def _check_app(app: Any) -> list[checks.CheckMessage]:
    from beat_claims.settings import ConfigurationError, Settings

    if _url_missing(app.conf):
        return [checks.Error(
            "beat-claims has no store: CELERY_BEAT_CLAIMS_URL is not set and the broker"
            f" ({redact_url(str(app.conf.get('broker_url') or '')) or 'none'}) is not Redis.",
            hint="Set CELERY_BEAT_CLAIMS_URL to the store's URL: redis://, rediss://,"
                 " sentinel://, postgresql://, mysql://, sqlite:///path, or 'django'.",
            id="beat_claims.E001")]
    try:
        settings = Settings.from_app(app)
        from .database_scheduler import entry_claims

        entry_claims(app, settings)  # CELERY_BEAT_CLAIMS_ENTRY_CLAIMS
    except ConfigurationError as exc:
        return [checks.Error(f"Invalid beat-claims setting: {exc}",
                             hint="Settings are read as CELERY_<NAME> (upper case), e.g."
                                  " CELERY_BEAT_CLAIMS_CATCH_UP = 'latest'.",
                             id="beat_claims.E002")]
    errors = _check_entries(app, settings)
    if errors or not getattr(django_settings, "BEAT_CLAIMS_CHECK_STORE", True):
        return errors
    return _check_store(settings)


def _url_missing(conf: Any) -> bool:
    from beat_claims.settings import ConfigurationError, _default_url

    if conf.get("beat_claims_url"):
        return False
    try:
        _default_url(str(conf.get("broker_url") or ""))
    except ConfigurationError:
        return True
    return False


def _check_entries(app: Any, settings: Any) -> list[checks.CheckMessage]:
    """Each ``beat_schedule`` entry as the beat will read it: ``claims`` and schedule."""
    from celery.beat import ScheduleEntry

    from beat_claims import occurrences
    from beat_claims.settings import ConfigurationError

    errors: list[checks.CheckMessage] = []
    for name, spec in (app.conf.beat_schedule or {}).items():
        try:
            spec = dict(spec)
            settings.policy_for(name, spec.pop("claims", None))
            schedule = ScheduleEntry(**dict(spec, name=name, app=app)).schedule
            occurrences.next_after(schedule, 0, 0)
        except ConfigurationError as exc:
            errors.append(checks.Error(f"Invalid beat-claims option: {exc}",
                                       obj=f"CELERY_BEAT_SCHEDULE[{name!r}]",
                                       id="beat_claims.E003"))
        except Exception as exc:
            errors.append(checks.Error(
                f"CELERY_BEAT_SCHEDULE[{name!r}]: beat-claims cannot read this entry:"
                f" {type(exc).__name__}: {exc}", obj=f"CELERY_BEAT_SCHEDULE[{name!r}]",
                id="beat_claims.E003"))
    return errors


def _check_store(settings: Any) -> list[checks.CheckMessage]:
    from beat_claims.stores import open_store

    store = None
    try:
        store = open_store(settings, timeout=STORE_TIMEOUT)
        store.owners()
    except Exception as exc:
        return [checks.Warning(
            f"beat-claims cannot reach its store at {redact_url(settings.url)}:"
            f" {type(exc).__name__}: {exc}",
            hint="Beats send nothing while the store is unreachable. Start the store or fix"
                 " CELERY_BEAT_CLAIMS_URL; BEAT_CLAIMS_CHECK_STORE = False skips this check.",
            id="beat_claims.W001")]
    finally:
        if store is not None:
            store.close()
    return []
