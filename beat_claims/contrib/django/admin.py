"""The admin: every entry, its next occurrence, current claims, last outcome and runs.

Read from the store, not from the database: the registered model is unmanaged and only
carries the permissions. Operator actions, each a POST (with Django's CSRF token) that
needs its own permission, is logged (admin log and the ``celery.beat.claims`` logger) and
records who asked as ``admin:<username>``; what they do is :mod:`beat_claims.operations`,
as ``celery claims`` does it:

- release a stuck claim (``beat_claims.release_claim``): the run is due again and a beat
  sends it with a fresh token; the old holder's check before publish refuses it;
- run an entry now (``beat_claims.trigger_run``): a run due now is recorded, and a beat
  claims and sends it like any other occurrence at its next heartbeat;
- pause an entry, with a note (``beat_claims.pause_entry``): every beat records its
  occurrences skipped (``paused``) instead of sending them, until
- resume (``beat_claims.resume_entry``): occurrences due from then on are sent again;
- backfill (``beat_claims.backfill_entry``): a manual run at each occurrence in [from, to)
  (instants in the project's timezone, as the pages show them) that has not run; at most
  ``beat_claims_backfill_limit`` occurrences, ``to`` not after the store's clock.

Entries defined at run time are edited through :class:`beat_claims.entries.Entries`, with
Django's model permissions: add (``beat_claims.add_entry``), edit, enable and disable
(``beat_claims.change_entry``), delete, after a confirmation page
(``beat_claims.delete_entry``). An edit names the version it read (a hidden field): a
stale one is refused, the edit kept beside the store's current definition. An entry of a
``beat_schedule`` is read-only here, a django-celery-beat row is edited in its own admin.
Arguments are shown on the edit form only, never in a log line or a message.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime
from enum import Enum
from typing import Any, TypeVar

from celery.utils.log import get_logger
from django import forms
from django.apps import apps as django_apps
from django.contrib import admin, messages
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.admin.utils import quote, unquote
from django.contrib.contenttypes.models import ContentType
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
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.http import url_has_allowed_host_and_scheme, urlencode

from beat_claims import inspect, operations, schedule_words
from beat_claims.definitions import Definition, DefinitionError
from beat_claims.entries import (
    DefinedInBeatSchedule,
    Entries,
    EntryError,
    EntryExists,
    NoSuchEntry,
    StaleVersion,
    StoredEntry,
)
from beat_claims.enums import Origin
from beat_claims.runs import Run, from_ms, iso
from beat_claims.settings import ConfigurationError, Settings
from beat_claims.stores import StoreConfigurationError, StoreError
from beat_claims.stores.base import Store
from beat_claims.urls import redact_url

from . import status as source
from . import timeline
from .apps import project_app
from .entry_form import FIELDS, EntryForm
from .models import Entry

logger = get_logger("celery.beat.claims")
T = TypeVar("T")

#: Runs shown on an entry's page unless ``?limit=`` asks for another number.
HISTORY_LIMIT = 50
#: What a failed store read looks like to the page, instead of a server error.
STORE_ERRORS = (StoreError, StoreConfigurationError, OSError, ConfigurationError)
RELEASABLE = tuple(state.value for state in operations.RELEASABLE)
#: The instants of each document that the pages show as times (time.html).
RUN_TIMES = ("due", "claimed_at", "sent_at", "started_at", "finished_at")
ENTRY_TIMES = ("next_due", "checkpoint", "anchor", "paused_at", "resumed_at")
OWNER_TIMES = ("started_at", "expires_at")
#: The longest pause note the admin records.
NOTE_LIMIT = 500
#: What the backfill form reads (Django's own parsing of an instant: the formats of the
#: locale, ISO 8601; naive ones in the current timezone).
INSTANT_HELP = ("in {tz}, as the times on these pages (e.g. 2026-01-31 02:00:00), or an ISO"
                " 8601 instant with its offset (a time's title, e.g. 2026-01-30T20:30:00Z)")


class InstantField(forms.DateTimeField):
    """An instant as an operator types it: with an offset (``Z``, ``+05:30``; a time's
    title on these pages) it is read by :func:`beat_claims.operations.parse_instant`, as
    ``celery claims`` reads it; without one, in the current timezone, as the pages show
    times (Django's own parsing: the locale's formats, ISO 8601). A refusal names the field
    and what it was given."""

    def __init__(self, label: str, **kwargs: Any) -> None:
        super().__init__(label=label, error_messages={
            "required": f"{label}: required, an instant"}, **kwargs)

    def to_python(self, value: Any) -> datetime | None:
        text = "" if value is None else str(value).strip()
        if text in self.empty_values:
            return None
        with contextlib.suppress(ValueError):
            aware = parse_datetime(text)
            if aware is not None and aware.tzinfo is not None:
                try:
                    return from_ms(operations.parse_instant(text, str(self.label)))
                except operations.OperationError as exc:
                    raise forms.ValidationError(str(exc)) from None
        try:
            when: datetime | None = super().to_python(text)
        except forms.ValidationError as exc:
            why = " ".join(exc.messages).rstrip(".")
            raise forms.ValidationError(
                f"{self.label}={text!r}: not an instant ({why}); give one"
                f" {INSTANT_HELP.format(tz=timezone.get_current_timezone_name())}.") from None
        return when


class BackfillForm(forms.Form):
    """[From, To): two instants (see :class:`InstantField`)."""

    start = InstantField(label="From", widget=forms.TextInput(attrs={
        "size": 26, "placeholder": "YYYY-MM-DD HH:MM:SS"}))
    end = InstantField(label="To", widget=forms.TextInput(attrs={
        "size": 26, "placeholder": "YYYY-MM-DD HH:MM:SS"}))

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        start, end = data.get("start"), data.get("end")
        if start is not None and end is not None and start >= end:
            raise forms.ValidationError(
                f"From ({_shown(_ms(start))}) is not before To ({_shown(_ms(end))}):"
                " nothing to backfill.")
        return data

    def range_ms(self) -> tuple[int, int]:
        return _ms(self.cleaned_data["start"]), _ms(self.cleaned_data["end"])


class Editing(Enum):
    """Whether the admin edits an entry's definition, and if not, why."""

    EDITABLE = "editable"  # defined at run time (the API, the CLI, this admin, an import)
    BEAT_SCHEDULE = "beat_schedule"  # changed in beat_schedule, where it is defined
    DJANGO_ROW = "django_row"  # a django-celery-beat row: edited in its own admin
    UNREADABLE = "unreadable"  # its stored definition cannot be read: only deleted
    UNDEFINED = "undefined"  # the store holds no definition of it


#: Why an entry is not edited here, as its page and a refusal say it.
READ_ONLY = {
    Editing.BEAT_SCHEDULE: "defined in beat_schedule: change it there",
    Editing.DJANGO_ROW: "a django-celery-beat periodic task: edit it in django-celery-beat's"
                        " admin",
    Editing.UNREADABLE: "its stored definition cannot be read: delete it and add it again",
    Editing.UNDEFINED: "the store holds no definition of it (a beat registered it, or it"
                       " was deleted)",
}


@admin.register(Entry)
class EntryAdmin(admin.ModelAdmin):
    """Custom views over the store; the model's queryset is never used. Django's add,
    change and delete permissions of the model are those of the entries defined at run
    time."""

    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view  # login, staff, CSRF
        actions = {"edit": self.edit_view, "enable": self.enable_view,
                   "disable": self.disable_view, "delete": self.delete_view,
                   "release": self.release_view, "trigger": self.trigger_view,
                   "pause": self.pause_view, "resume": self.resume_view,
                   "backfill": self.backfill_view}
        return [
            path("", wrap(self.changelist_view), name=f"{info}_changelist"),
            # "+" is quoted in an entry's name (quote): no entry's page is "+add/".
            path("+add/", wrap(self.add_view), name=f"{info}_add"),
            *(path(f"<str:object_id>/{action}/", wrap(view), name=f"{info}_{action}")
              for action, view in actions.items()),
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
        # The fleet's last hours, counted as each entry's runs are read (never kept).
        recent = timeline.FleetCounts(since=_ms(timezone.now()) - RECENT_MS)
        doc, error = self._status(recent.add_runs)
        owners = {o["id"]: o for o in doc["owners"]}
        stored: dict[str, StoredEntry] = {}
        if error is None:
            try:
                stored = self._stored(request)
            except STORE_ERRORS as exc:
                error = self._store_error(exc)
        rows = self._periodic_tasks([e["name"] for e in doc["entries"]])
        site = self._site_schedule()
        entries = [dict(self._entry_row(e, owners), stored=self._stored_doc(
            e["name"], stored.get(e["name"]),
            self._editing(e["name"], stored.get(e["name"]), rows, site),
            rows.get(e["name"], ""))) for e in doc["entries"]]
        context = {
            **self._context(request, "Entries"),
            "add_url": self._url("add"),
            "owners": [dict(o, at=_times(o, OWNER_TIMES)) for o in doc["owners"]
                       if o["alive"]],
            "dead_owners": [dict(o, at=_times(o, OWNER_TIMES)) for o in doc["owners"]
                            if not o["alive"]],
            "fleet": recent.svg(
                {i: _owner_label(i, owners) for i in owners},
                timeline.ms(doc.get("generated_at")) or _ms(timezone.now()), _label),
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
        can_backfill = self._may(request, "backfill_entry")
        kept: list[dict[str, Any]] = []  # every run the store keeps (history_limit)
        if error is None:
            try:
                kept = source.history(name)["runs"]
            except STORE_ERRORS as exc:
                error = self._store_error(exc)
        state, outcome = request.GET.get("state", ""), request.GET.get("outcome", "")
        runs = [r for r in kept if (not state or r["state"] == state)
                and (not outcome or outcome in (r.get("reason"), r.get("exc_type")))][:limit]
        results = self._task_results([r["task_id"] for r in runs if r["task_id"]])
        stored: dict[str, Any] | None = None
        if error is None:
            try:
                definition = self._stored(request, [name]).get(name)
            except STORE_ERRORS as exc:
                error = self._store_error(exc)
            else:
                rows = self._periodic_tasks([name])
                stored = self._stored_doc(name, definition,
                                          self._editing(name, definition, rows),
                                          rows.get(name, ""))
        context = {
            **self._context(request, name),
            "entry": self._entry_row(found, owners) if found else None,
            "stored": stored,
            "name": name,
            "runs": [self._run_row(r, owners, results) for r in runs],
            "timeline": timeline.entry_svg(runs, _label),
            "filters": _filters(kept, state, outcome, limit),
            "limit": limit,
            "error": error,
            "changelist_url": self._url("changelist"),
            "backfill_form": BackfillForm() if can_backfill else None,
            "backfill_help": INSTANT_HELP.format(tz=timezone.get_current_timezone_name()),
            "backfill_limit": self._backfill_limit(),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/beat_claims/entry/entry.html", context)

    def _context(self, request: HttpRequest, title: str) -> dict[str, Any]:
        request.current_app = self.admin_site.name
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "store_url": self._store_label(),
            "can_release": self._may(request, "release_claim"),
            "can_trigger": self._may(request, "trigger_run"),
            "can_pause": self._may(request, "pause_entry"),
            "can_resume": self._may(request, "resume_entry"),
            "can_backfill": self._may(request, "backfill_entry"),
            "can_add": self._may(request, "add_entry"),
            "can_change": self._may(request, "change_entry"),
            "can_delete": self._may(request, "delete_entry"),
            "note_limit": NOTE_LIMIT,
        }

    def _may(self, request: HttpRequest, codename: str) -> bool:
        return bool(request.user.has_perm(f"{self.opts.app_label}.{codename}"))

    # -- actions ------------------------------------------------------------------------
    def release_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST ``due`` (ms): release the claim on that run, whoever holds it."""
        refused = self._refused(request, "release_claim")
        if refused is not None:
            return refused
        name = unquote(object_id)
        try:
            due = int(request.POST["due"])
        except (KeyError, ValueError):
            return HttpResponseBadRequest("due: the run's due instant in UTC milliseconds")
        by = self._by(request)
        done = self._operate(request, name, "released",
                             lambda store: operations.release(store, name, due, by))
        if isinstance(done, HttpResponse):
            return done
        if not done.released:
            messages.warning(request, f"{done.why_not}.")
            return self._back(request, name)
        self.log_change(request, Entry(name=name),
                        f"Released the claim of the run due {iso(due)}.")
        logger.warning("beat-claims: %s released the claim of %s due %s: it is due again",
                       by, name, iso(due))
        messages.success(request, f"Released the claim of {name} due {iso(due)}: the run"
                                  " is due again and a beat will send it.")
        return self._back(request, name)

    def trigger_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: record a run of the entry due now, for a beat to claim and send."""
        refused = self._refused(request, "trigger_run")
        if refused is not None:
            return refused
        name = unquote(object_id)
        by = self._by(request)
        app = project_app()
        done = self._operate(request, name, "triggered",
                             lambda store: operations.trigger(store, name, by))
        if isinstance(done, HttpResponse):
            return done
        due = done.due
        self.log_change(request, Entry(name=name), f"Triggered a run now (due {iso(due)}).")
        logger.info("beat-claims: %s triggered a run of %s (due %s)", by, name, iso(due))
        heartbeat = Settings.from_app(app).heartbeat_interval
        messages.success(request, f"Triggered a run of {name} (due {iso(due)}): a beat claims"
                                  f" and sends it within about {heartbeat:g} s.")
        if done.beats is None:
            messages.warning(request, f"Which beats schedule {name} is not recorded (a beat"
                                      " of an older beat-claims registered it): only a beat"
                                      " that has it will send the run.")
        return self._back(request, name)

    def pause_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST ``note``: pause the entry on every beat, until resumed."""
        refused = self._refused(request, "pause_entry")
        if refused is not None:
            return refused
        name = unquote(object_id)
        note = " ".join(request.POST.get("note", "").split())
        if len(note) > NOTE_LIMIT:
            messages.error(request, f"The note has {len(note)} characters, more than"
                                    f" {NOTE_LIMIT}: {name} was not paused.")
            return self._back(request, name)
        by = self._by(request)
        done = self._operate(request, name, "paused",
                             lambda store: operations.pause(store, name, by, note))
        if isinstance(done, HttpResponse):
            return done
        since = iso(done.paused.at) if done.paused else None
        self.log_change(request, Entry(name=name), f"Paused (since {since})"
                        + (f": {note}" if note else "."))
        logger.warning("beat-claims: %s paused %s (since %s)%s: its occurrences are skipped"
                       " until resume", by, name, since, f": {note}" if note else "")
        messages.success(request, f"Paused {name}: every beat records its occurrences skipped"
                                  " (paused) instead of sending them, until it is resumed."
                                  " Runs already sent are not touched; Run now and Backfill"
                                  " still send.")
        return self._back(request, name)

    def resume_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: end the entry's pause."""
        refused = self._refused(request, "resume_entry")
        if refused is not None:
            return refused
        name = unquote(object_id)
        by = self._by(request)
        resumed = self._operate(request, name, "resumed",
                                lambda store: operations.resume(store, name, by))
        if isinstance(resumed, HttpResponse):
            return resumed
        _, ended = resumed
        if not ended:
            messages.warning(request, f"{name} was not paused: nothing was recorded.")
            return self._back(request, name)
        self.log_change(request, Entry(name=name), "Resumed.")
        logger.warning("beat-claims: %s resumed %s: its occurrences are sent again", by, name)
        messages.success(request, f"Resumed {name}: occurrences due from now on are sent"
                                  " again. Those skipped while it was paused stay skipped:"
                                  " Backfill runs them.")
        return self._back(request, name)

    def backfill_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST ``start`` and ``end`` (instants, naive ones in the current timezone): a
        manual run at each occurrence in [start, end) that has not run. A refusal shows
        the entry's page again with the form and why."""
        refused = self._refused(request, "backfill_entry")
        if refused is not None:
            return refused
        name = unquote(object_id)
        form = BackfillForm(request.POST)
        if not form.is_valid():
            return self._backfill_refused(request, object_id, form)
        start, end = form.range_ms()
        by = self._by(request)
        app = project_app()
        try:
            store = source.store_for(app)
            now = store.now()
            if end > now:
                form.add_error("end", f"To ({_shown(end)}) is after the store's clock"
                                      f" ({_shown(now)}): a backfill runs past occurrences"
                                      " (for a run now, use Run now).")
                return self._backfill_refused(request, object_id, form)
            done = operations.backfill(store, name, self._schedules(app).get(name), start,
                                       end, by, Settings.from_app(app).backfill_limit)
        except inspect.UnknownEntry as exc:  # its page has no form: said as a message
            messages.error(request, f"{exc}: nothing was backfilled.")
            return self._back(request, name)
        except operations.OperationError as exc:
            form.add_error(None, f"{exc}.")
            return self._backfill_refused(request, object_id, form)
        except STORE_ERRORS as exc:
            form.add_error(None, self._store_error(exc))
            return self._backfill_refused(request, object_id, form)
        created, kept = len(done.result.created), len(done.result.kept)
        span = f"from {_shown(start)} to {_shown(end)}"
        before = (f" (the store first saw {name} at {_shown(done.anchor)}: nothing was due"
                  " before)" if start <= done.anchor else "")
        if not created:
            what = (f"{len(done.dues)} occurrence(s), each already ran, runs or is on its way"
                    if done.dues else "its schedule has no occurrence there")
            messages.warning(request, f"Backfill of {name} {span}: {what}: nothing was"
                                      f" created{before}.")
            return self._back(request, name)
        self.log_change(request, Entry(name=name),
                        f"Backfilled {created} run(s) from {iso(start)} to {iso(end)}"
                        f" ({len(done.dues)} occurrence(s), {kept} kept as they were).")
        logger.warning("beat-claims: %s backfilled %s from %s to %s: %d run(s) created, %d"
                       " kept", by, name, iso(start), iso(end), created, kept)
        messages.success(request, f"Backfill of {name} {span}: {len(done.dues)}"
                                  f" occurrence(s); created {created} run(s), the beats send"
                                  f" them oldest first; kept {kept} that ran, run or are on"
                                  f" their way{before}.")
        return self._back(request, name)

    def _backfill_refused(self, request: HttpRequest, object_id: str,
                          form: BackfillForm) -> HttpResponse:
        """The entry's page again, the form showing what it was given and why not."""
        return self.detail_view(request, object_id, {"backfill_form": form})

    # -- entries defined at run time ----------------------------------------------------
    def add_view(self, request: HttpRequest, form_url: str = "",
                 extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """GET: the form; POST: create the entry (``beat_claims.add_entry``)."""
        if not self._may(request, "add_entry"):
            raise PermissionDenied
        if request.method != "POST":
            return self._form_page(request, EntryForm(adding=True), None)
        form = EntryForm(request.POST, adding=True)
        if not form.is_valid():
            return self._form_page(request, form, None)
        name = form.cleaned_data["name"]
        if name in self._site_schedule():
            form.add_error("name", f"{name!r} is {READ_ONLY[Editing.BEAT_SCHEDULE]}; nothing"
                                   " was written.")
            return self._form_page(request, form, None)
        fields = form.definition_fields()
        created = self._written(request, form, lambda entries: entries.create(name, **fields))
        if created is None:
            return self._form_page(request, form, None)
        assert created.definition is not None
        what = _summary(created.definition)
        self.log_addition(request, Entry(name=name), f"Added: {what} (version"
                                                     f" {created.version}).")
        logger.warning("beat-claims: %s added entry %s (version %d): %s", created.changed_by,
                       name, created.version, what)
        messages.success(request, f"Added {name} (version {created.version}): the beats"
                                  " follow it from its first occurrence.")
        return HttpResponseRedirect(self._url("change", name))

    def edit_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: the form filled from the stored definition, with its version; POST: write
        the edit at that version (``beat_claims.change_entry``)."""
        if not self._may(request, "change_entry"):
            raise PermissionDenied
        name = unquote(object_id)
        if request.method != "POST":
            current = self._editable(request, name, "edited")
            if isinstance(current, HttpResponse):
                return current
            return self._form_page(request, EntryForm.of(current), current)
        form = EntryForm(request.POST, adding=False)
        if not form.is_valid():
            return self._form_page(request, form, None, name)
        version = form.cleaned_data["version"]
        fields = form.definition_fields()
        try:
            entries = self._entries(request)
            current = entries.get(name)
            editing = self._editing(name, current)
            if editing is not Editing.EDITABLE:
                raise EntryError(name, f"{name} is {READ_ONLY[editing]}; nothing was written")
            assert current.definition is not None
            # Only what the operator changed is written: the rest stays as the store has it.
            stored = current.definition.as_dict()
            changes = {f: v for f, v in fields.items() if v != stored[f]}
            entries.definition(name, {**stored, **changes})  # refused on its field
        except (DefinitionError, EntryError) as exc:
            form.refuse(exc)
            return self._form_page(request, form, None, name)
        except STORE_ERRORS as exc:
            form.add_error(None, self._store_error(exc))
            return self._form_page(request, form, None, name)
        if current.version == version and not changes:
            messages.info(request, f"{name}: nothing changed (version {version} kept).")
            return HttpResponseRedirect(self._url("change", name))
        try:
            updated = self._written(request, form,
                                    lambda entries: entries.update(name, version, **changes))
        except StaleVersion as exc:
            return self._stale(request, name, exc)
        if updated is None:
            return self._form_page(request, form, None, name)
        changed = _changed(current.definition, updated.definition)
        what = f"{', '.join(changed) or 'nothing'} (version {version} → {updated.version})"
        self.log_change(request, Entry(name=name), f"Changed {what}.")
        logger.warning("beat-claims: %s changed entry %s: %s", updated.changed_by, name,
                       what.replace("→", "->"))
        messages.success(request, f"Changed {name}: {what}; the beats follow it from its"
                                  " first occurrence after now.")
        return HttpResponseRedirect(self._url("change", name))

    def _stale(self, request: HttpRequest, name: str, exc: StaleVersion) -> HttpResponse:
        """The edit kept as it was typed, at the version the store holds now, beside that
        version's definition: saved again, it replaces that version, knowingly."""
        data = request.POST.copy()
        data["version"] = str(exc.current)
        form = EntryForm(data, adding=False)
        try:
            current: StoredEntry | None = self._entries(request).get(name)
        except (EntryError, *STORE_ERRORS) as err:
            form.add_error(None, f"{exc}. {err}.")
            return self._form_page(request, form, None, name)
        form.add_error(None, f"Version {exc.expected} of {name} was edited, but the store"
                             f" holds version {exc.current} now: nothing was written. Your"
                             f" edit is kept below, beside version {exc.current} as the"
                             f" store holds it: save again to replace version"
                             f" {exc.current} with your edit.")
        return self._form_page(request, form, None, name, stale=current)

    def enable_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST ``version``: enable the entry (``beat_claims.change_entry``)."""
        return self._set_enabled(request, object_id, True)

    def disable_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST ``version``: disable the entry (``beat_claims.change_entry``)."""
        return self._set_enabled(request, object_id, False)

    def _set_enabled(self, request: HttpRequest, object_id: str, enabled: bool
                     ) -> HttpResponse:
        refused = self._refused(request, "change_entry")
        if refused is not None:
            return refused
        name = unquote(object_id)
        version = _version(request)
        if version is None:
            return HttpResponseBadRequest("version: the version read (a whole number from 1)")
        what = "enabled" if enabled else "disabled"
        done = self._edit(request, name, what, lambda entries: (
            entries.enable(name, version) if enabled else entries.disable(name, version)))
        if isinstance(done, HttpResponse):
            return done
        if done.version == version:
            messages.info(request, f"{name} is {what} already (version {version}): nothing"
                                   " was written.")
            return self._back(request, name)
        change = f"version {version} → {done.version}"
        self.log_change(request, Entry(name=name), f"{what.capitalize()} ({change}).")
        logger.warning("beat-claims: %s %s entry %s (%s)", done.changed_by, what, name,
                       change.replace("→", "->"))
        messages.success(request, f"{what.capitalize()} {name} ({change}): "
                         + ("its occurrences are sent from the first after now." if enabled
                            else "no beat sends it from now on; runs already claimed go on."))
        return self._back(request, name)

    def delete_view(self, request: HttpRequest, object_id: str,
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """GET: what will be deleted, to confirm; POST ``version``: delete the entry's
        definition (``beat_claims.delete_entry``). Its runs stay until pruned."""
        if not self._may(request, "delete_entry"):
            raise PermissionDenied
        name = unquote(object_id)
        if request.method != "POST":
            current = self._editable(request, name, "deleted", deleting=True)
            if isinstance(current, HttpResponse):
                return current
            context = {
                **self._context(request, f"Delete {name}?"),
                "name": name,
                "stored": self._stored_doc(name, current, self._editing(name, current)),
                "changelist_url": self._url("changelist"),
                "entry_url": self._url("change", name),
                **(extra_context or {}),
            }
            return TemplateResponse(request, "admin/beat_claims/entry/delete.html", context)
        version = _version(request)
        if version is None:
            return HttpResponseBadRequest("version: the version read (a whole number from 1)")
        deleted = self._edit(request, name, "deleted",
                             lambda entries: entries.delete(name, version))
        if isinstance(deleted, HttpResponse):
            return deleted
        change = f"version {version} deleted (its tombstone: version {deleted})"
        LogEntry.objects.create(
            user_id=request.user.pk, object_id=name, object_repr=name[:200],
            content_type_id=ContentType.objects.get_for_model(Entry,
                                                              for_concrete_model=False).pk,
            action_flag=DELETION, change_message=f"Deleted: {change}.")
        logger.warning("beat-claims: %s deleted entry %s (%s)", self._by(request), name,
                       change)
        messages.success(request, f"Deleted {name} ({change}): no beat sends it from now on;"
                                  " runs already claimed go on, and its runs stay until"
                                  " pruned (celery claims prune).")
        return HttpResponseRedirect(self._url("changelist"))

    def _editable(self, request: HttpRequest, name: str, what: str, deleting: bool = False
                  ) -> StoredEntry | HttpResponse:
        """The entry as the store holds it, when this admin may change it; else its page,
        saying why not."""
        current: StoredEntry | None = None
        try:
            current = self._entries(request).get(name)
        except NoSuchEntry as exc:
            missing = f"{exc}"
        except STORE_ERRORS as exc:
            messages.error(request, self._store_error(exc))
            return HttpResponseRedirect(self._url("change", name))
        editing = self._editing(name, current)
        if current is not None and (editing is Editing.EDITABLE or (
                deleting and editing is Editing.UNREADABLE)):
            return current
        if editing is Editing.UNDEFINED:
            messages.error(request, f"{missing}: nothing can be {what}.")
        else:
            messages.error(request, f"{name} is {READ_ONLY[editing]}; it cannot be {what}"
                                    " here.")
        return HttpResponseRedirect(self._url("change", name))

    def _written(self, request: HttpRequest, form: EntryForm,
                 act: Callable[[Entries], StoredEntry]) -> StoredEntry | None:
        """``act`` done, or None with why not on the form (the field it names); a stale
        version is the caller's to show (:class:`StaleVersion` is raised)."""
        try:
            return act(self._entries(request))
        except StaleVersion:
            raise
        except (EntryExists, DefinedInBeatSchedule) as exc:
            form.add_error("name" if form.adding else None, f"{exc}.")
        except (DefinitionError, EntryError) as exc:
            form.refuse(exc)
        except STORE_ERRORS as exc:
            form.add_error(None, self._store_error(exc))
        return None

    def _edit(self, request: HttpRequest, name: str, what: str,
              act: Callable[[Entries], T]) -> T | HttpResponse:
        """``act`` on the entries; for a refusal (a stale version, an entry deleted or
        defined in beat_schedule) or a store that does not answer, its page, saying why."""
        try:
            return act(self._entries(request))
        except NoSuchEntry as exc:
            messages.error(request, f"{exc}: nothing was {what}.")
        except (EntryError, DefinitionError) as exc:
            messages.error(request, f"{exc}.")
        except STORE_ERRORS as exc:
            messages.error(request, self._store_error(exc))
        return self._back(request, name)

    def _form_page(self, request: HttpRequest, form: EntryForm, current: StoredEntry | None,
                   name: str | None = None, stale: StoredEntry | None = None
                   ) -> HttpResponse:
        """The add or edit form; on an edit, the entry's origin, version and who changed it
        last (``current``), or after a stale edit the version the store holds (``stale``),
        its arguments too (this is the edit form)."""
        name = current.name if current is not None else name
        shown = current or stale
        context = {
            **self._context(request, "Add entry" if form.adding else f"Edit {name}"),
            "form": form,
            "name": name,
            "adding": form.adding,
            "stored": self._stored_doc(shown.name, shown, Editing.EDITABLE) if shown else None,
            "stale": _full(stale) if stale is not None and stale.definition else None,
            "changelist_url": self._url("changelist"),
            "entry_url": self._url("change", name) if name else None,
            "action_url": self._url("add") if form.adding else self._url("edit", name),
        }
        return TemplateResponse(request, "admin/beat_claims/entry/entry_form.html", context)

    def _entries(self, request: HttpRequest) -> Entries:
        """The entries of the project's store, changed by ``admin:<username>``."""
        app = project_app()
        return Entries(app, store=source.store_for(app), by=self._by(request))

    def _site_schedule(self) -> set[str]:
        """The names this site's ``beat_schedule`` defines."""
        try:
            return set(project_app().conf.beat_schedule or {})
        except ConfigurationError:
            return set()

    def _editing(self, name: str, stored: StoredEntry | None,
                 rows: dict[str, str] | None = None, site: set[str] | None = None
                 ) -> Editing:
        """Whether this admin edits the entry (``rows``: django-celery-beat's, ``site``:
        the names of this site's beat_schedule, when read already)."""
        rows = self._periodic_tasks([name]) if rows is None else rows
        if name in rows or (stored is not None and stored.origin is Origin.DJANGO):
            return Editing.DJANGO_ROW
        if stored is None:
            site = self._site_schedule() if site is None else site
            return Editing.BEAT_SCHEDULE if name in site else Editing.UNDEFINED
        if stored.origin is Origin.CONFIG:
            return Editing.BEAT_SCHEDULE
        return Editing.EDITABLE if stored.definition is not None else Editing.UNREADABLE

    def _stored_doc(self, name: str, stored: StoredEntry | None, editing: Editing,
                    row_url: str = "") -> dict[str, Any]:
        """An entry's definition as its page shows it: origin, version, who changed it
        and when, what it sends (never its arguments: only how many), and what may be
        done with it."""
        definition = stored.definition if stored is not None else None
        doc: dict[str, Any] = {
            "present": stored is not None,
            "editing": editing.value,
            "editable": editing is Editing.EDITABLE,
            "deletable": editing in (Editing.EDITABLE, Editing.UNREADABLE),
            "read_only": READ_ONLY.get(editing, ""),
            "row_url": row_url,
            "edit_url": self._url("edit", name),
            "enable_url": self._url("enable", name),
            "disable_url": self._url("disable", name),
            "delete_url": self._url("delete", name),
        }
        if stored is not None:
            doc.update(origin=stored.origin.value, version=stored.version,
                       changed_by=stored.changed_by, enabled=stored.enabled,
                       problem=stored.problem, at=_times(
                           {"changed_at": iso(stored.changed_at) if stored.changed_at
                            else None}, ("changed_at",)))
        if definition is not None:
            doc.update(
                task=definition.task, schedule=_json(definition.schedule.to_json()),
                schedule_text=_describe(definition),
                options=_options_shown(definition.options),
                claims=_json(definition.claims) if definition.claims else "",
                description=definition.description, args=len(definition.args),
                kwargs=len(definition.kwargs))
        return doc

    def _stored(self, request: HttpRequest, names: Iterable[str] | None = None
                ) -> dict[str, StoredEntry]:
        """The store's definitions: of ``names``, or every one."""
        entries = self._entries(request)
        if names is None:
            return {e.name: e for e in entries.iterate()}
        out = {}
        for name in names:
            with contextlib.suppress(NoSuchEntry):
                out[name] = entries.get(name)
        return out

    def _periodic_tasks(self, names: list[str]) -> dict[str, str]:
        """Name -> the django-celery-beat admin page of its row ('' when that admin is not
        on this site), for the names that are rows."""
        if not names or not django_apps.is_installed("django_celery_beat"):
            return {}
        from django_celery_beat.models import PeriodicTask

        meta = PeriodicTask._meta
        linked = self.admin_site.is_registered(PeriodicTask)
        rows = PeriodicTask.objects.filter(name__in=names).values_list("name", "pk")
        return {name: reverse(f"{self.admin_site.name}:{meta.app_label}_{meta.model_name}"
                              "_change", args=(quote(pk),)) if linked else ""
                for name, pk in rows}

    def _operate(self, request: HttpRequest, name: str, what: str,
                 act: Callable[[Store], T]) -> T | HttpResponse:
        """``act`` on the store; for an entry the store does not know, or a store that
        does not answer, the page to go back to, saying why nothing was done."""
        try:
            return act(source.store_for())
        except inspect.UnknownEntry as exc:
            messages.error(request, f"{exc}: nothing was {what}.")
        except operations.OperationError as exc:  # a request that cannot be done (says why)
            messages.error(request, f"{exc}.")
        except STORE_ERRORS as exc:
            messages.error(request, self._store_error(exc))
        return self._back(request, name)

    def _refused(self, request: HttpRequest, codename: str) -> HttpResponse | None:
        """Why an action is not done: not a POST (405), or no permission (403)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self._may(request, codename):
            raise PermissionDenied
        return None

    def _by(self, request: HttpRequest) -> str:
        """Who asks, as every action records it."""
        return operations.who(f"admin:{request.user.get_username()}")

    def _back(self, request: HttpRequest, name: str) -> HttpResponse:
        target = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(target, {request.get_host()},
                                               request.is_secure()):
            target = self._url("change", name)
        return HttpResponseRedirect(target)

    # -- data ---------------------------------------------------------------------------
    def _status(self, seen: Callable[[list[Run]], None] | None = None
                ) -> tuple[dict[str, Any], str | None]:
        """The status document, each entry with its pause (``operations.entry_doc``);
        ``seen`` is given each entry's runs as they are read."""
        try:
            doc = source.status(seen=seen)
            pauses = {r.name: operations.entry_doc(r) for r in source.store_for().entries()}
        except STORE_ERRORS as exc:
            return {"owners": [], "entries": []}, self._store_error(exc)
        for entry in doc["entries"]:
            pause = pauses.get(entry["name"], {})
            entry.update({k: pause.get(k) for k in PAUSE_FIELDS})
            entry["paused"] = bool(entry["paused"])
        return doc, None

    def _backfill_limit(self) -> int | None:
        try:
            return Settings.from_app(project_app()).backfill_limit
        except ConfigurationError:
            return None

    def _store_error(self, exc: Exception) -> str:
        return (f"Cannot read the beat-claims store at {self._store_label()}:"
                f" {type(exc).__name__}: {exc}")

    def _store_label(self) -> str:
        try:
            settings = Settings.from_app(project_app())
        except ConfigurationError as exc:
            return f"(misconfigured: {exc})"
        return f"{redact_url(settings.url)} (prefix {settings.key_prefix!r})"

    def _schedules(self, app: Any) -> dict[str, Any]:
        """Entry name -> Celery schedule, as the beats of this site compute them."""
        found = source.schedules(app)
        return found if found is not None else inspect.beat_schedules(app)

    def _entry_row(self, entry: dict[str, Any], owners: dict[str, Any]) -> dict[str, Any]:
        last = entry["last_run"]
        return {
            **entry,
            "at": _times(entry, ENTRY_TIMES),
            "last_run": dict(last, at=_times(last, RUN_TIMES)) if last else None,
            "url": self._url("change", entry["name"]),
            "release_url": self._url("release", entry["name"]),
            "trigger_url": self._url("trigger", entry["name"]),
            "pause_url": self._url("pause", entry["name"]),
            "resume_url": self._url("resume", entry["name"]),
            "backfill_url": self._url("backfill", entry["name"]),
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
            "after": {f: timeline.after(run["due_ms"], at) for f in RUN_TIMES[1:]
                      if (at := timeline.ms(run.get(f))) is not None},
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


#: An entry's pause, as ``operations.entry_doc`` (and ``celery claims pause -j``) names it.
PAUSE_FIELDS = ("paused", "paused_by", "paused_note", "paused_at", "resumed_by", "resumed_at")


def _ms(when: datetime) -> int:
    return round(when.timestamp() * 1000)


def _shown(ms: int) -> str:
    """An instant for a message: in the current timezone, as the pages show times, and
    the exact UTC instant."""
    local = timezone.localtime(from_ms(ms))
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()} = {iso(ms)}"


def _times(doc: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """``doc``'s instants (ISO 8601 UTC strings) for time.html: each as ``at``, an aware
    datetime the template shows in the current timezone, ``utc``, the exact instant, and
    ``short``, its time alone when it is today (in the current timezone), else its day and
    time to the minute (the entries list's narrow columns); None where there is none."""
    today = timezone.localdate()
    out: dict[str, Any] = {}
    for f in fields:
        if not doc.get(f):
            out[f] = None
            continue
        at = datetime.fromisoformat(doc[f].replace("Z", "+00:00"))
        local = timezone.localtime(at)
        short = f"{local:%H:%M:%S}" if local.date() == today else f"{local:%b %d, %H:%M}"
        out[f] = {"at": at, "utc": doc[f], "short": short}
    return out


def _label(ms: int) -> str:
    """An instant as the timelines say it: in the current timezone, to the second."""
    return f"{timezone.localtime(from_ms(ms)):%Y-%m-%d %H:%M:%S}"


#: How far back the entries list keeps runs for the fleet's timeline (its hour, and a
#: margin for a store clock ahead of this server's).
RECENT_MS = 2 * 3_600_000


def _filters(runs: list[dict[str, Any]], state: str, outcome: str, limit: int
             ) -> dict[str, Any]:
    """The runs filter: each state and each outcome (a reason, an exception's type) of
    the runs kept, with how many, its query string and whether it is the one chosen."""
    def link(key: str, value: str, count: int) -> dict[str, Any]:
        query = {key: value} if value else {}
        if limit != HISTORY_LIMIT:
            query["limit"] = str(limit)
        return {"value": value, "count": count, "query": urlencode(query),
                "chosen": (state if key == "state" else outcome) == value
                and (not value or not (outcome if key == "state" else state))}

    states = Counter(r["state"] for r in runs)
    outcomes = Counter(o for r in runs for o in {r.get("reason"), r.get("exc_type")} if o)
    return {"all": link("state", "", len(runs)) | {"chosen": not state and not outcome},
            "states": [link("state", s, n) for s, n in sorted(states.items())],
            "outcomes": [link("outcome", o, n) for o, n in outcomes.most_common()],
            "active": bool(state or outcome)}


def _owner_label(owner_id: str | None, owners: dict[str, Any]) -> str:
    """``host:pid`` of a beat, or its id when it is no longer registered."""
    if not owner_id:
        return ""
    owner = owners.get(owner_id)
    return f"{owner['host']}:{owner['pid']}" if owner else owner_id[:8]


def _version(request: HttpRequest) -> int | None:
    """The version an action names (read with the page), or None when it names none."""
    try:
        version = int(request.POST["version"])
    except (KeyError, ValueError):
        return None
    return version if version >= 1 else None


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _describe(definition: Definition) -> str:
    """A schedule in words, as the status shows schedules (``every 30 s``), or its JSON
    form when it cannot be computed here."""
    try:
        return schedule_words.describe(definition.schedule, project_app())
    except Exception:
        return _json(definition.schedule.to_json())


def _options_shown(options: dict[str, Any]) -> str:
    """An entry's options as its page shows them: the names of its headers, not their
    values (a header may hold a secret, as an argument may)."""
    shown = {k: sorted(v) if k == "headers" and isinstance(v, dict) else v
             for k, v in options.items()}
    return ", ".join(f"{k}={_json(v)}" if k != "headers" else f"headers ({', '.join(v)})"
                     for k, v in shown.items())


def _summary(definition: Definition) -> str:
    """What a log line says of a definition: its task and schedule, disabled or not;
    never its arguments nor its options."""
    return (f"task {definition.task}, schedule {_json(definition.schedule.to_json())}"
            + ("" if definition.enabled else ", disabled"))


def _changed(before: Definition | None, after: Definition | None) -> list[str]:
    """The names of the fields an edit changed (their values are not said)."""
    old = before.as_dict() if before is not None else {}
    new = after.as_dict() if after is not None else {}
    return [f for f in FIELDS if old.get(f) != new.get(f)]


def _full(stored: StoredEntry) -> dict[str, str]:
    """Every field of a stored definition as JSON text, as the edit form shows them."""
    assert stored.definition is not None
    return {f: v if f == "description" else _json(v)
            for f, v in stored.definition.as_dict().items()}
