"""Editing entries defined at run time in the Django admin (add, edit at the version read,
disable, enable, delete), through Django's test client, on the test's private
redis-server: what the admin writes is read back with the entries API."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from celery import Celery
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.test import Client
from django.urls import reverse

from beat_claims.definitions import validate
from beat_claims.entries import Entries, NoSuchEntry, StoredEntry
from beat_claims.entry_changes import EntryChange, apply_changes
from beat_claims.enums import Origin
from beat_claims.stores.redis import RedisStore

from . import test_django_admin as admin_tests
from .test_django_admin import login, url

pytestmark = pytest.mark.django_db

#: What an entry's arguments and headers hold: never in a log line, a message or a page
#: other than the edit form.
SECRETS = ("kw-secret-7f3a", "arg-secret-91c2", "hdr-secret-4d0e")
EDIT_PERMS = ("add_entry", "change_entry", "delete_entry")
#: A form as an operator fills it in.
FORM = {
    "name": "nightly-report",
    "task": "site.report",
    "schedule": '{"every": 30}',
    "args": '[1, "arg-secret-91c2"]',
    "kwargs": '{"token": "kw-secret-7f3a"}',
    "options": '{"queue": "reports", "headers": {"auth": "hdr-secret-4d0e"}}',
    "claims": '{"catch_up": "latest"}',
    "enabled": "on",
    "description": "the nightly report",
}


#: The admin tests' fixtures: the site's app on the test's redis-server (its beat_schedule
#: has every-second and hourly-report), and that server's store.
app = admin_tests.app
store = admin_tests.store


@pytest.fixture
def entries(app: Celery, store: RedisStore) -> Entries:
    """The entries API on the same store, as another operator (``cli:other``)."""
    return Entries(app, store=store, by="cli:other")


def created(entries: Entries, name: str = "nightly-report") -> StoredEntry:
    """An entry defined at run time, with secrets in its arguments and headers."""
    return entries.create(name, "site.report", {"every": 60}, args=[1, SECRETS[1]],
                          kwargs={"token": SECRETS[0]},
                          options={"queue": "reports", "headers": {"auth": SECRETS[2]}},
                          description="the nightly report")


def shown(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def html(response: Any) -> str:
    return str(response.content.decode()).replace("&quot;", '"').replace("&#x27;", "'")


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, (secret, text[:2000])


def logged() -> str:
    """Every admin log entry, as Recent actions and the history show them."""
    return "\n".join(f"{e.object_repr}: {e.get_change_message()}"
                     for e in LogEntry.objects.order_by("pk"))


def test_an_added_entry_is_listed_and_its_page_shows_where_it_came_from(
        client: Client, entries: Entries, caplog: pytest.LogCaptureFixture) -> None:
    login(client, "add_entry")
    index = client.get(reverse("admin:index")).content.decode()
    assert url("add") in index  # Django's "+ Add" for users with add_entry
    listed = client.get(url("changelist"))
    assert "Add entry" in listed.content.decode() and url("add") in listed.content.decode()
    form = client.get(url("add"))
    assert form.status_code == 200
    for field in ("name", "task", "schedule", "args", "kwargs", "options", "claims",
                  "enabled", "description"):
        assert f'name="{field}"' in form.content.decode(), field
    with caplog.at_level(logging.INFO, logger="celery.beat.claims"):
        response = client.post(url("add"), FORM)
    assert response.status_code == 302 and response["Location"] == url("change",
                                                                         "nightly-report")
    entry = entries.get("nightly-report")
    assert entry.definition is not None
    assert (entry.version, entry.origin, entry.changed_by) == (1, Origin.API, "admin:op")
    assert entry.definition.as_dict() == {
        "task": "site.report", "schedule": {"every": 30}, "args": [1, SECRETS[1]],
        "kwargs": {"token": SECRETS[0]},
        "options": {"queue": "reports", "headers": {"auth": SECRETS[2]}},
        "claims": {"catch_up": "latest"}, "enabled": True,
        "description": "the nightly report"}
    log = LogEntry.objects.get()
    assert (log.object_id, log.user.username, log.action_flag) == (
        "nightly-report", "op", ADDITION)
    assert log.get_change_message() == (
        'Added: task site.report, schedule {"every": 30} (version 1).')
    assert "admin:op added entry nightly-report (version 1)" in caplog.text
    # Listed, with its origin and version; its page shows who and when, never the
    # arguments' values (only how many) nor a header's.
    listed = client.get(url("changelist"))
    row = next(e for e in listed.context["entries"] if e["name"] == "nightly-report")
    assert (row["stored"]["origin"], row["stored"]["version"]) == ("api", 1)
    assert "api, version 1" in listed.content.decode()
    assert any("Added nightly-report (version 1)" in m for m in shown(listed))
    page = client.get(url("change", "nightly-report"))
    text = html(page)
    stored = page.context["stored"]
    assert (stored["origin"], stored["version"], stored["changed_by"]) == ("api", 1,
                                                                            "admin:op")
    assert stored["at"]["changed_at"]["utc"] == entry.as_dict()["changed_at"]
    assert "2 positional, 1 keyword" in text and "headers (auth)" in text
    assert "<code>site.report</code>" in text and "every 30 s" in text
    assert_no_secret(listed.content.decode(), text, logged(), caplog.text)
    # Adding it again: refused on its name, nothing written.
    again = client.post(url("add"), FORM)
    assert again.status_code == 200
    assert "exists (version 1)" in " ".join(again.context["form"].errors["name"])
    assert entries.get("nightly-report").version == 1 and LogEntry.objects.count() == 1


def test_an_edit_is_written_at_the_version_it_read(
        client: Client, entries: Entries, caplog: pytest.LogCaptureFixture) -> None:
    created(entries)
    login(client, "change_entry")
    page = client.get(url("change", "nightly-report"))
    assert f'href="{url("edit", "nightly-report")}"' in page.content.decode()
    form = client.get(url("edit", "nightly-report"))
    assert form.status_code == 200
    text = html(form)
    assert '<input type="hidden" name="version" value="1"' in text
    # The edit form is where the arguments are shown: they are the user's configuration.
    assert f'{{"token": "{SECRETS[0]}"}}' in text and SECRETS[1] in text
    filled = form.context["form"]
    data = {**{k: filled[k].value() or "" for k in filled.fields if k != "enabled"},
            "enabled": "on"}
    data.update(schedule='{"crontab": {"minute": "*/5"}}', description="every five")
    with caplog.at_level(logging.INFO, logger="celery.beat.claims"):
        response = client.post(url("edit", "nightly-report"), data)
    assert response.status_code == 302, response.context["form"].errors
    entry = entries.get("nightly-report")
    assert entry.definition is not None
    assert (entry.version, entry.changed_by) == (2, "admin:op")
    # A crontab without a timezone takes the app's (UTC here), written in.
    assert entry.definition.schedule.to_json() == {"crontab": {
        "minute": "*/5", "hour": "*", "day_of_week": "*", "day_of_month": "*",
        "month_of_year": "*", "timezone": "UTC"}}
    assert entry.definition.kwargs == {"token": SECRETS[0]}  # kept as it was shown
    assert entry.definition.description == "every five"
    log = LogEntry.objects.get()
    assert (log.action_flag, log.get_change_message()) == (
        CHANGE, "Changed schedule, description (version 1 → 2).")
    assert "admin:op changed entry nightly-report: schedule, description (version 1 -> 2)" \
        in caplog.text
    # The same form again: nothing changes, nothing is written.
    data["version"] = "2"
    data["schedule"] = json.dumps(entry.definition.schedule.to_json())
    response = client.post(url("edit", "nightly-report"), data, follow=True)
    assert any("nothing changed (version 2 kept)" in m for m in shown(response))
    assert entries.get("nightly-report").version == 2 and LogEntry.objects.count() == 1
    # Emptied arguments are no arguments.
    data.update(args="", kwargs="")
    assert client.post(url("edit", "nightly-report"), data).status_code == 302
    emptied = entries.get("nightly-report").definition
    assert emptied is not None and (emptied.args, emptied.kwargs) == ((), {})
    assert_no_secret(logged(), caplog.text)


def test_a_stale_edit_is_refused_naming_both_versions_and_nothing_is_lost(
        client: Client, entries: Entries) -> None:
    created(entries)
    login(client, "change_entry")
    form = client.get(url("edit", "nightly-report")).context["form"]
    assert form.initial["version"] == 1
    # Another operator changes it meanwhile.
    theirs = entries.update("nightly-report", 1, description="theirs", options={})
    assert theirs.version == 2
    mine = {**FORM, "version": "1", "schedule": '{"every": 45}', "description": "mine"}
    response = client.post(url("edit", "nightly-report"), mine)
    assert response.status_code == 200
    text = html(response)
    errors = " ".join(response.context["form"].non_field_errors())
    assert "Version 1 of nightly-report was edited, but the store holds version 2 now" \
        in errors and "nothing was written" in errors
    # Nothing written over theirs.
    entry = entries.get("nightly-report")
    assert entry.definition is not None
    assert (entry.version, entry.changed_by, entry.definition.description) == (
        2, "cli:other", "theirs")
    # Nothing lost: the edit as typed, beside version 2 as the store holds it.
    assert '{"every": 45}' in text and ">\nmine</textarea>" in text, text
    assert "Version 2 as the store holds it (changed by cli:other" in text
    assert response.context["stale"]["description"] == "theirs"
    assert '<input type="hidden" name="version" value="2"' in text
    assert not LogEntry.objects.exists()
    # Saved again, knowingly: it replaces version 2.
    assert client.post(url("edit", "nightly-report"),
                       {**mine, "version": "2"}).status_code == 302
    entry = entries.get("nightly-report")
    assert entry.definition is not None
    assert (entry.version, entry.definition.description, entry.definition.schedule
            .to_json()) == (3, "mine", {"every": 45})


@pytest.mark.parametrize(("field", "value", "said"), [
    ("schedule", '{"every": -1}', "schedule.every: -1 is not a positive number of seconds"),
    ("schedule", '{"crontab": {"minute": "61"}}', "schedule.crontab.minute: '61' is not a"
                                                  " valid minute"),
    ("schedule", '{"clocked": "2027-01-01 00:00"}', "schedule.clocked: '2027-01-01 00:00'"
                                                    " is not an instant"),
    ("schedule", '{"every": 30', "Schedule: not JSON (Expecting ',' delimiter"),
    ("schedule", "", "Schedule: required"),
    ("options", '{"priority": 300}', "options.priority: 300 is not a priority"),
    ("options", '{"queue": "q", "retry": true}', "unknown option 'retry'"),
    ("options", '{"queue": "a", "queue": "b"}', "the key 'queue' appears twice"),
    ("kwargs", '["kw-secret-7f3a"]', "kwargs: a list is not a JSON object"),
    ("args", '{"a": 1}', "args: a dict is not a JSON array"),
    ("claims", '{"catch_up": "sometimes"}', "catch_up"),
    ("task", "site report", "task: 'site report' is not a task name"),
    ("name", "", "This field is required"),
])
def test_bad_input_is_refused_on_the_field_it_names(
        client: Client, entries: Entries, field: str, value: str, said: str) -> None:
    login(client, "add_entry", "change_entry")
    response = client.post(url("add"), {**FORM, field: value})
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert set(errors) == {field} and said in " ".join(errors[field]), errors
    assert "Nothing was written" in response.content.decode()
    assert value in html(response) or not value  # what was typed is kept
    with pytest.raises(NoSuchEntry):
        entries.get("nightly-report")
    if field != "name":  # an edit: refused on the same field, its version kept
        created(entries)
        response = client.post(url("edit", "nightly-report"),
                               {**FORM, field: value, "version": "1"})
        assert response.status_code == 200
        assert set(response.context["form"].errors) == {field}
        assert entries.get("nightly-report").version == 1
    assert not LogEntry.objects.exists()
    assert_no_secret(" ".join(response.context["form"].errors.get(field, [])))


def test_disable_and_enable_at_the_version_read(
        client: Client, entries: Entries, caplog: pytest.LogCaptureFixture) -> None:
    created(entries)
    login(client, "change_entry")
    page = client.get(url("change", "nightly-report")).content.decode()
    assert 'value="Disable"' in page and 'value="Enable"' not in page
    assert f'action="{url("disable", "nightly-report")}"' in page
    assert '<input type="hidden" name="version" value="1">' in page
    with caplog.at_level(logging.INFO, logger="celery.beat.claims"):
        response = client.post(url("disable", "nightly-report"), {"version": 1}, follow=True)
    assert any("Disabled nightly-report (version 1 → 2)" in m for m in shown(response))
    entry = entries.get("nightly-report")
    assert (entry.enabled, entry.version, entry.changed_by) == (False, 2, "admin:op")
    text = html(response)  # the entry's page
    assert 'value="Enable"' in text and 'class="bc-state bc-disabled">disabled' in text
    listed = client.get(url("changelist")).content.decode()
    row = listed[listed.index(">nightly-report</a>"):]
    row = row[:row.index("</th>")]  # the entry's cell in the list: its label, its version
    assert '<span class="bc-state bc-disabled">disabled</span>' in row, row
    assert "api, version 2" in row, row
    # A stale one: refused, naming both versions; nothing written.
    response = client.post(url("enable", "nightly-report"), {"version": 1}, follow=True)
    assert any("version 1 is stale, the store holds version 2" in m
               and "nothing was written" in m for m in shown(response)), shown(response)
    assert entries.get("nightly-report").enabled is False
    response = client.post(url("enable", "nightly-report"), {"version": 2}, follow=True)
    assert any("Enabled nightly-report (version 2 → 3)" in m for m in shown(response))
    assert (entries.get("nightly-report").enabled, entries.get("nightly-report").version) \
        == (True, 3)
    # Enabled already: nothing written, said so.
    response = client.post(url("enable", "nightly-report"), {"version": 3}, follow=True)
    assert any("is enabled already (version 3)" in m for m in shown(response))
    assert entries.get("nightly-report").version == 3
    assert [e.get_change_message() for e in LogEntry.objects.order_by("pk")] == [
        "Disabled (version 1 → 2).", "Enabled (version 2 → 3)."]
    assert "admin:op disabled entry nightly-report (version 1 -> 2)" in caplog.text
    # Without a version: a bad request, nothing written.
    assert client.post(url("disable", "nightly-report")).status_code == 400
    assert entries.get("nightly-report").version == 3
    assert_no_secret(logged(), caplog.text)


def test_delete_shows_what_it_deletes_and_asks_first(
        client: Client, entries: Entries, store: RedisStore,
        caplog: pytest.LogCaptureFixture) -> None:
    created(entries)
    login(client, "delete_entry")
    page = client.get(url("change", "nightly-report")).content.decode()
    assert f'href="{url("delete", "nightly-report")}"' in page
    confirm = client.get(url("delete", "nightly-report"))
    assert confirm.status_code == 200
    text = html(confirm)
    assert 'value="Yes, delete"' in text and "version 1" in text
    assert "<code>site.report</code>" in text and "2 positional, 1 keyword" in text
    assert "until pruned" in text
    assert entries.get("nightly-report").version == 1  # asking deletes nothing
    with caplog.at_level(logging.INFO, logger="celery.beat.claims"):
        response = client.post(url("delete", "nightly-report"), {"version": 1}, follow=True)
    assert response.redirect_chain[-1][0] == url("changelist")
    assert any("Deleted nightly-report (version 1 deleted (its tombstone: version 2))" in m
               for m in shown(response)), shown(response)
    with pytest.raises(NoSuchEntry):
        entries.get("nightly-report")
    # Its record (and so its runs) stays until pruned; it is listed without a definition.
    assert [r.name for r in store.entries(["nightly-report"])] == ["nightly-report"]
    row = next(e for e in response.context["entries"] if e["name"] == "nightly-report")
    assert row["stored"]["present"] is False
    log = LogEntry.objects.get()
    assert (log.object_id, log.action_flag, log.change_message) == (
        "nightly-report", DELETION, "Deleted: version 1 deleted (its tombstone: version 2).")
    assert "admin:op deleted entry nightly-report" in caplog.text
    # Its page: no definition, nothing to delete again.
    again = client.post(url("delete", "nightly-report"), {"version": 2}, follow=True)
    assert any("no entry 'nightly-report' in the store (deleted): nothing was deleted" in m
               for m in shown(again)), shown(again)
    assert_no_secret(text, logged(), caplog.text)


def test_a_stale_delete_is_refused(client: Client, entries: Entries) -> None:
    created(entries)
    login(client, "delete_entry")
    entries.disable("nightly-report", 1)
    response = client.post(url("delete", "nightly-report"), {"version": 1}, follow=True)
    assert any("version 1 is stale, the store holds version 2" in m for m in shown(response))
    assert entries.get("nightly-report").version == 2 and not LogEntry.objects.exists()


def test_editing_needs_its_permission_and_csrf(entries: Entries) -> None:
    created(entries)
    viewer = login(Client(), username="viewer")
    for page in (url("changelist"), url("change", "nightly-report")):
        text = viewer.get(page).content.decode()
        assert "Add entry" not in text and url("edit", "nightly-report") not in text
        assert 'value="Disable"' not in text
        assert url("delete", "nightly-report") not in text
    assert url("add") not in viewer.get(reverse("admin:index")).content.decode()
    version = {"version": 1}
    for method, view, data in (("get", "add", None), ("post", "add", FORM),
                               ("get", "edit", None), ("post", "edit", {**FORM, **version}),
                               ("post", "disable", version), ("post", "enable", version),
                               ("get", "delete", None), ("post", "delete", version)):
        target = url(view) if view == "add" else url(view, "nightly-report")
        response = getattr(viewer, method)(target, data or {})
        assert response.status_code == 403, (method, view)
    # Each needs its own: add_entry does not change, change_entry does not delete.
    adder = login(Client(), "add_entry", "delete_entry", username="adder")
    assert adder.post(url("disable", "nightly-report"), version).status_code == 403
    assert adder.get(url("edit", "nightly-report")).status_code == 403
    changer = login(Client(), "add_entry", "change_entry", username="changer")
    assert changer.post(url("delete", "nightly-report"), version).status_code == 403
    assert changer.get(url("disable", "nightly-report")).status_code == 405
    # With every permission but without the CSRF token: refused.
    guarded = login(Client(enforce_csrf_checks=True), *EDIT_PERMS, username="guarded")
    for view, data in (("edit", {**FORM, **version}), ("disable", version),
                       ("delete", version)):
        assert guarded.post(url(view, "nightly-report"), data).status_code == 403, view
    assert guarded.post(url("add"), {**FORM, "name": "other"}).status_code == 403
    entry = entries.get("nightly-report")
    assert (entry.version, entry.enabled) == (1, True)
    with pytest.raises(NoSuchEntry):
        entries.get("other")
    assert not LogEntry.objects.exists()


def test_an_entry_of_beat_schedule_is_read_only(
        client: Client, app: Celery, store: RedisStore, entries: Entries) -> None:
    """Its definition came from a beat's beat_schedule (origin config), or this site's
    beat_schedule defines it: changed there, never here."""
    definition = validate("from-config", {"task": "site.tick", "schedule": {"every": 5}})
    [written] = apply_changes(store, [EntryChange("from-config", definition, 0)],
                              Origin.CONFIG, "beat:host:1", app)
    assert written.version == 1
    login(client, *EDIT_PERMS)
    for name in ("from-config", "every-second"):
        page = client.get(url("change", name))
        text = page.content.decode()
        assert "defined in beat_schedule: change it there" in text, name
        assert url("edit", name) not in text and url("delete", name) not in text
        assert 'value="Disable"' not in text and 'value="Enable"' not in text
        response = client.get(url("edit", name), follow=True)
        assert any("defined in beat_schedule" in m and "cannot be edited here" in m
                   for m in shown(response)), shown(response)
        response = client.get(url("delete", name), follow=True)
        assert any("cannot be deleted here" in m for m in shown(response))
    assert page.context["stored"]["present"] is False  # every-second: no definition
    response = client.post(url("edit", "from-config"), {**FORM, "version": "1"})
    assert response.status_code == 200
    assert "defined in beat_schedule" in " ".join(response.context["form"].non_field_errors())
    response = client.post(url("disable", "from-config"), {"version": 1}, follow=True)
    assert any("is defined in beat_schedule" in m for m in shown(response)), shown(response)
    response = client.post(url("delete", "from-config"), {"version": 1}, follow=True)
    assert any("is defined in beat_schedule" in m for m in shown(response)), shown(response)
    entry = entries.get("from-config")
    assert (entry.version, entry.origin, entry.enabled) == (1, Origin.CONFIG, True)
    # This site's beat_schedule has every-second: it is not added here either.
    response = client.post(url("add"), {**FORM, "name": "every-second"})
    assert "defined in beat_schedule" in " ".join(response.context["form"].errors["name"])
    with pytest.raises(NoSuchEntry):
        entries.get("every-second")
    assert not LogEntry.objects.exists()


def test_a_django_celery_beat_row_links_to_its_own_admin(
        client: Client, store: RedisStore, app: Celery) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from beat_claims.stores.base import EntrySeed

    every = IntervalSchedule.objects.create(every=10, period=IntervalSchedule.SECONDS)
    row = PeriodicTask.objects.create(name="db-entry", task="site.tick", interval=every)
    store.register([EntrySeed("db-entry", "every 10s")])
    login(client, *EDIT_PERMS)
    text = html(client.get(url("change", "db-entry")))
    link = reverse("admin:django_celery_beat_periodictask_change", args=(row.pk,))
    assert f'href="{link}"' in text and "edit it in django-celery-beat's admin" in text
    assert url("edit", "db-entry") not in text
    response = client.get(url("edit", "db-entry"), follow=True)
    assert any("a django-celery-beat periodic task" in m for m in shown(response))


def test_an_entry_named_like_a_page_keeps_its_own(client: Client, entries: Entries) -> None:
    """The form to add an entry is at a path no entry's name gives (``+`` is quoted)."""
    for name in ("add", "+add", "edit"):
        entries.create(name, "site.tick", {"every": 60})
    login(client, *EDIT_PERMS)
    assert client.get(url("add")).context["adding"] is True
    for name in ("add", "+add", "edit"):
        page = client.get(url("change", name))
        assert page.status_code == 200 and page.context["name"] == name, name
        assert page.context["stored"]["version"] == 1
        form = client.get(url("edit", name))
        assert form.context["name"] == name and form.context["form"].initial["version"] == 1
