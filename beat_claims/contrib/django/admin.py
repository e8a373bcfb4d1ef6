"""The admin: every entry, its next occurrence, current claims, last outcome and runs.

Read-only, and read from the store (Redis), not from the database: the registered model is
unmanaged and only carries the permissions. Two operator actions, each a POST that needs
its own permission and is logged (admin log and the ``celery.beat.claims`` logger):

- release a stuck claim (``beat_claims.release_claim``): the run is due again and a beat
  sends it with a fresh token; the old holder's check before publish refuses it;
- run an entry now (``beat_claims.trigger_run``): a run due now is recorded, and a beat
  claims and sends it like any other occurrence at its next heartbeat.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from celery.utils.log import get_logger
from django.apps import apps as django_apps
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.http import url_has_allowed_host_and_scheme

from beat_claims.runs import iso
from beat_claims.settings import ConfigurationError, Settings
from beat_claims.stores import StoreConfigurationError, StoreError
from beat_claims.stores.base import Reclaim

from . import status as source
from .apps import project_app
from .checks import mask
from .models import Entry

logger = get_logger("celery.beat.claims")

#: Runs shown on an entry's page unless ``?limit=`` asks for another number.
HISTORY_LIMIT = 50
#: What a failed store read looks like to the page, instead of a server error.
STORE_ERRORS = (StoreError, StoreConfigurationError, OSError, ConfigurationError)
RELEASABLE = ("claimed", "sending")
#: The instants of each document that the pages show as times (time.html).
RUN_TIMES = ("due", "claimed_at", "sent_at", "started_at", "finished_at")
ENTRY_TIMES = ("next_due", "checkpoint", "anchor")
OWNER_TIMES = ("started_at", "expires_at")


@admin.register(Entry)
class EntryAdmin(admin.ModelAdmin):
    """Custom views over the store; the model's queryset is never used."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view  # login, staff, CSRF
        return [
            path("", wrap(self.changelist_view), name=f"{info}_changelist"),
            path("<str:object_id>/release/", wrap(self.release_view), name=f"{info}_release"),
            path("<str:object_id>/trigger/", wrap(self.trigger_view), name=f"{info}_trigger"),
            # Named "_change" so that admin log entries link to it.
            path("<str:object_id>/", wrap(self.detail_view), name=f"{info}_change"),
        ]

    def _url(self, view: str, name: str | None = None) -> str:
        args = () if name is None else (quote(name),)
        return reverse(f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}"
                       f"_{view}", args=args)

    # -- pages --------------------------------------------------------------------------
    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        doc, error = self._status()
        owners = {o["id"]: o for o in doc["owners"]}
        entries = [self._entry_row(e, owners) for e in doc["entries"]]
        context = {
            **self._context(request, "Entries"),
            "owners": [dict(o, at=_times(o, OWNER_TIMES)) for o in doc["owners"]],
            "entries": entries,
            "error": error,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/beat_claims/entry/entries.html", context)

    def detail_view(self, request: HttpRequest, object_id: str,
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        name = unquote(object_id)
        try:
            limit = max(1, int(request.GET.get("limit", HISTORY_LIMIT)))
        except ValueError:
            limit = HISTORY_LIMIT
        doc, error = self._status()
        owners = {o["id"]: o for o in doc["owners"]}
        found = next((e for e in doc["entries"] if e["name"] == name), None)
        runs: list[dict[str, Any]] = []
        if error is None:
            try:
                runs = source.history(name, limit)["runs"]
            except STORE_ERRORS as exc:
                error = self._store_error(exc)
        results = self._task_results([r["task_id"] for r in runs if r["task_id"]])
        context = {
            **self._context(request, name),
            "entry": self._entry_row(found, owners) if found else None,
            "name": name,
            "runs": [self._run_row(r, owners, results) for r in runs],
            "limit": limit,
            "error": error,
            "changelist_url": self._url("changelist"),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/beat_claims/entry/entry.html", context)

    def _context(self, request: HttpRequest, title: str) -> dict[str, Any]:
        request.current_app = self.admin_site.name
        user = request.user
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "store_url": self._store_label(),
            "can_release": user.has_perm(f"{self.opts.app_label}.release_claim"),
            "can_trigger": user.has_perm(f"{self.opts.app_label}.trigger_run"),
        }

    # -- actions ------------------------------------------------------------------------
    def release_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST ``due`` (ms): release the claim on that run, whoever holds it."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not request.user.has_perm(f"{self.opts.app_label}.release_claim"):
            raise PermissionDenied
        name = unquote(object_id)
        try:
            due = int(request.POST["due"])
        except (KeyError, ValueError):
            return HttpResponseBadRequest("due: the run's due instant in UTC milliseconds")
        by = f"admin:{request.user.get_username()}"
        try:
            [freed] = source.store_for().reclaim([Reclaim(name, due, None)], by)
        except STORE_ERRORS as exc:
            messages.error(request, self._store_error(exc))
            return self._back(request, name)
        if freed:
            self.log_change(request, Entry(name=name),
                            f"Released the claim of the run due {iso(due)}.")
            logger.warning("beat-claims: %s released the claim of %s due %s: it is due again",
                           by, name, iso(due))
            messages.success(request, f"Released the claim of {name} due {iso(due)}: the run"
                                      " is due again and a beat will send it.")
        else:
            messages.warning(request, f"The run of {name} due {iso(due)} was not released:"
                                      " it is no longer claimed.")
        return self._back(request, name)

    def trigger_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: record a run of the entry due now, for a beat to claim and send."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not request.user.has_perm(f"{self.opts.app_label}.trigger_run"):
            raise PermissionDenied
        name = unquote(object_id)
        by = f"admin:{request.user.get_username()}"
        app = project_app()
        try:
            due = source.store_for(app).request_run(name, by, uuid.uuid4().hex)
        except STORE_ERRORS as exc:
            messages.error(request, self._store_error(exc))
            return self._back(request, name)
        if due is None:
            messages.error(request, f"{name} is not known to the store (no beat has seen it):"
                                    " nothing was triggered.")
            return self._back(request, name)
        self.log_change(request, Entry(name=name), f"Triggered a run now (due {iso(due)}).")
        logger.info("beat-claims: %s triggered a run of %s (due %s)", by, name, iso(due))
        heartbeat = Settings.from_app(app).heartbeat_interval
        messages.success(request, f"Triggered a run of {name} (due {iso(due)}): a beat claims"
                                  f" and sends it within about {heartbeat:g} s.")
        if name not in self._schedule_names(app):
            messages.warning(request, f"{name} is not in this site's schedule: only a beat"
                                      " that has it will send the run.")
        return self._back(request, name)

    def _back(self, request: HttpRequest, name: str) -> HttpResponse:
        target = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(target, {request.get_host()},
                                               request.is_secure()):
            target = self._url("change", name)
        return HttpResponseRedirect(target)

    # -- data ---------------------------------------------------------------------------
    def _status(self) -> tuple[dict[str, Any], str | None]:
        try:
            return source.status(), None
        except STORE_ERRORS as exc:
            return {"owners": [], "entries": []}, self._store_error(exc)

    def _store_error(self, exc: Exception) -> str:
        return (f"Cannot read the beat-claims store at {self._store_label()}:"
                f" {type(exc).__name__}: {exc}")

    def _store_label(self) -> str:
        try:
            settings = Settings.from_app(project_app())
        except ConfigurationError as exc:
            return f"(misconfigured: {exc})"
        return f"{mask(settings.url)} (prefix {settings.key_prefix!r})"

    def _schedule_names(self, app: Any) -> set[str]:
        found = source.schedules(app)
        return set(found if found is not None else app.conf.beat_schedule or {})

    def _entry_row(self, entry: dict[str, Any], owners: dict[str, Any]) -> dict[str, Any]:
        last = entry["last_run"]
        return {
            **entry,
            "at": _times(entry, ENTRY_TIMES),
            "last_run": dict(last, at=_times(last, RUN_TIMES)) if last else None,
            "url": self._url("change", entry["name"]),
            "release_url": self._url("release", entry["name"]),
            "trigger_url": self._url("trigger", entry["name"]),
            "claims": [dict(c, owner_label=_owner_label(c.get("owner"), owners),
                            releasable=c["state"] in RELEASABLE, at=_times(c, RUN_TIMES))
                       for c in entry["claims"]],
            "counts": {k: v for k, v in entry["counts"].items() if v},
        }

    def _run_row(self, run: dict[str, Any], owners: dict[str, Any],
                 results: dict[str, tuple[str, str]]) -> dict[str, Any]:
        detail = run.get("reason") or run.get("exc_type") or ""
        if run.get("exc_message"):
            detail += f": {run['exc_message']}"
        result_url, result_status = results.get(run["task_id"] or "", ("", ""))
        return {
            **run,
            "owner_label": _owner_label(run.get("owner"), owners),
            "at": _times(run, RUN_TIMES),
            "detail": detail,
            "releasable": run["state"] in RELEASABLE,
            "result_url": result_url,
            "result_status": result_status,
        }

    def _task_results(self, task_ids: list[str]) -> dict[str, tuple[str, str]]:
        """task id -> (TaskResult admin URL, its status), for django-celery-results."""
        if not task_ids or not django_apps.is_installed("django_celery_results"):
            return {}
        from django_celery_results.models import TaskResult

        if not self.admin_site.is_registered(TaskResult):
            return {}
        meta = TaskResult._meta
        rows = TaskResult.objects.filter(task_id__in=task_ids).values_list(
            "task_id", "pk", "status")
        return {
            task_id: (reverse(f"{self.admin_site.name}:{meta.app_label}_{meta.model_name}"
                              "_change", args=(quote(pk),)), status)
            for task_id, pk, status in rows
        }


def _times(doc: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """``doc``'s instants (ISO 8601 UTC strings) for time.html: each as ``at``, an aware
    datetime the template shows in the current timezone, and ``utc``, the exact instant;
    None where there is none."""
    return {f: {"at": datetime.fromisoformat(doc[f].replace("Z", "+00:00")), "utc": doc[f]}
            if doc.get(f) else None for f in fields}


def _owner_label(owner_id: str | None, owners: dict[str, Any]) -> str:
    """``host:pid`` of a beat, or its id when it is no longer registered."""
    if not owner_id:
        return ""
    owner = owners.get(owner_id)
    return f"{owner['host']}:{owner['pid']}" if owner else owner_id[:8]
