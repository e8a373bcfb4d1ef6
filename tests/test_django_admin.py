"""The Django admin of beat-claims, through Django's test client, on a real store filled by a
real Scheduler (ticked in this process) against the test's private redis-server."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse

from beat_claims.contrib.django.models import Entry
from beat_claims.enums import Reason
from beat_claims.runs import Owner, RunState, iso
from beat_claims.scheduler import Scheduler
from beat_claims.stores.base import ClaimPlan, EntrySeed, EntryState
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer
from .djangosite.testing import PREFIX, configured, poll, site_app, staff
from .inprocess import messages, settled

pytestmark = pytest.mark.django_db

SCHEDULE = {
    "every-second": {"task": "site.tick", "schedule": timedelta(seconds=1)},
    "hourly-report": {"task": "site.report", "schedule": crontab(minute=0)},
}
GHOST = Owner(id="ghost0000beat", host="gone-host", pid=4242, started_at=1.0)
ACTIONS = ("release", "trigger", "pause", "resume", "backfill")
#: Every action's permission (codename), as the model declares them.
PERMISSIONS = ("release_claim", "trigger_run", "pause_entry", "resume_entry", "backfill_entry")
HOUR = 3600_000
#: The buttons of the actions, each shown only to a user with its permission.
BUTTONS = ("Release", "Run now", "Pause", "Resume", "Backfill")


@pytest.fixture
def app(server: RedisServer) -> Iterator[Celery]:
    # No lookups in the result backend (django-db): the beat's lookup thread would keep a
    # database connection of its own open, and the test database could not be dropped.
    with site_app(server.url, server.broker_url(), beat_schedule=SCHEDULE,
                  beat_claims_result_backend_recovery=False) as app:
        yield app


@pytest.fixture
def store(server: RedisServer) -> RedisStore:
    return RedisStore.from_url(server.url, PREFIX)


@pytest.fixture
def beat(app: Celery) -> Iterator[Scheduler]:
    scheduler = Scheduler(app=app)
    settled(scheduler)
    yield scheduler
    scheduler.close()


def url(view: str, name: str | None = None) -> str:
    return reverse(f"admin:beat_claims_entry_{view}", args=() if name is None else (quote(name),))


def login(client: Client, *perms: str, username: str = "op") -> Client:
    client.force_login(staff(username, "view_entry", *perms))
    return client


def sent_run(store: RedisStore, beat: Scheduler, name: str = "every-second") -> Any:
    return poll(lambda: next((r for r in store.history(name) if r.state is RunState.SENT), None),
                10, f"a sent run of {name}", between=beat.tick)


def stuck_claim(store: RedisStore, name: str = "hourly-report") -> int:
    """A claim held by a beat that is gone (its heartbeat expired): what an operator
    releases."""
    store.heartbeat(GHOST, 0.001)
    poll(lambda: not next(o.alive for o in store.owners() if o.owner.id == GHOST.id), 5,
         "the ghost's heartbeat to expire")
    info = store.entries([name])[0]
    assert info.anchor is not None
    due = (info.checkpoint or info.anchor) + 1
    state = EntryState(info.anchor, info.checkpoint, info.token)
    result = store.claim(GHOST, [ClaimPlan(name, state, (due,))])[0]
    assert [c.due for c in result.claims] == [due]
    return due


def test_changelist_and_detail_show_the_store(client: Client, store: RedisStore,
                                              beat: Scheduler) -> None:
    run = sent_run(store, beat)
    due = stuck_claim(store)
    login(client)
    page = client.get(url("changelist"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "every-second" in html and "hourly-report" in html
    assert "every second" in html  # the schedule, in words
    entries = {e["name"]: e for e in page.context["entries"]}
    assert entries["every-second"]["next_due"] is not None
    assert entries["every-second"]["counts"]["sent"] >= 1
    assert entries["every-second"]["last_run"] is None or (
        entries["every-second"]["last_run"]["state"] in ("sent", "done"))
    # The stuck claim: state, owner and whether it is alive.
    [claim] = entries["hourly-report"]["claims"]
    assert (claim["state"], claim["due"], claim["owner_label"], claim["owner_alive"]) == (
        "claimed", iso(due), "gone-host:4242", False)
    assert "gone-host:4242" in html and "not alive" in html
    assert f"{beat.owner.host}:{beat.owner.pid}" in html  # the live beat is listed
    for button in BUTTONS:  # no permission, no button
        assert f'value="{button}"' not in html, button
    assert url("change", "every-second") in html

    detail = client.get(url("change", "every-second"))
    assert detail.status_code == 200
    runs = detail.context["runs"]
    assert run.task_id in [r["task_id"] for r in runs]
    assert run.task_id in detail.content.decode()
    assert iso(run.due) in detail.content.decode()


def test_a_run_links_to_its_task_result(client: Client, store: RedisStore,
                                        beat: Scheduler) -> None:
    from django_celery_results.models import TaskResult

    run = sent_run(store, beat)
    result = TaskResult.objects.create(task_id=run.task_id, status="SUCCESS",
                                       periodic_task_name="every-second")
    login(client)
    html = client.get(url("change", "every-second")).content.decode()
    link = reverse("admin:django_celery_results_taskresult_change", args=(result.pk,))
    assert f'href="{link}"' in html


def test_pages_need_staff_and_the_view_permission(client: Client, beat: Scheduler) -> None:
    beat.tick()  # anchors the entries
    assert client.get(url("changelist")).status_code == 302  # to the login page
    client.force_login(staff("nobody"))
    assert client.get(url("changelist")).status_code == 403
    assert client.get(url("change", "every-second")).status_code == 403
    # The admin index lists the model only for users who may view it.
    assert url("changelist") not in client.get(reverse("admin:index")).content.decode()
    login(client, username="viewer")
    assert url("changelist") in client.get(reverse("admin:index")).content.decode()
    app_index = client.get(reverse("admin:app_list", kwargs={"app_label": "beat_claims"}))
    assert app_index.status_code == 200 and url("changelist") in app_index.content.decode()


def test_actions_need_post_their_permission_and_csrf(store: RedisStore,
                                                     beat: Scheduler) -> None:
    from django.contrib.auth.models import Permission

    beat.tick()  # anchors the entries
    due = stuck_claim(store)
    declared = set(Permission.objects.filter(content_type__app_label="beat_claims")
                   .values_list("codename", flat=True))
    assert declared == {"view_entry", "add_entry", "change_entry", "delete_entry",
                        *PERMISSIONS}  # the migrations made them
    anchor = store.entries(["hourly-report"])[0].anchor
    assert anchor is not None
    form = {"due": due, "note": "n", "start": iso(anchor - HOUR), "end": iso(anchor)}
    viewer = login(Client(), username="viewer")
    for view in ACTIONS:
        assert viewer.get(url(view, "hourly-report")).status_code == 405
        assert viewer.post(url(view, "hourly-report"), form).status_code == 403
    # Each action needs its own permission: every other one is not enough.
    for view, perm in zip(ACTIONS, PERMISSIONS):
        others = login(Client(), *(p for p in PERMISSIONS if p != perm), username=f"no-{view}")
        assert others.post(url(view, "hourly-report"), form).status_code == 403, view
    # With the permissions but without the CSRF token: refused.
    guarded = login(Client(enforce_csrf_checks=True), *PERMISSIONS)
    for view in ACTIONS:
        assert guarded.post(url(view, "hourly-report"), form).status_code == 403
    assert [r.state for r in store.history("hourly-report")] == [RunState.CLAIMED]
    assert not any(r.manual for r in store.history("every-second"))
    assert store.entries(["hourly-report"])[0].paused is None
    assert not LogEntry.objects.exists()


def test_release_frees_a_stuck_claim_and_a_beat_sends_it(
        client: Client, store: RedisStore, beat: Scheduler, server: RedisServer,
        caplog: pytest.LogCaptureFixture) -> None:
    beat.tick()  # anchors the entries
    due = stuck_claim(store)
    login(client, "release_claim")
    page = client.get(url("changelist"))
    assert 'value="Release"' in page.content.decode()
    with caplog.at_level(logging.INFO, logger="celery.beat.claims"):
        response = client.post(url("release", "hourly-report"), {"due": due}, follow=True)
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"]]
    assert any("Released the claim of hourly-report" in m for m in shown), shown
    [run] = store.history("hourly-report")
    assert (run.state, run.owner, run.released_by) == (RunState.DUE, None, "admin:op")
    log = LogEntry.objects.get()
    assert (log.object_id, log.user.username) == ("hourly-report", "op")
    assert iso(due) in log.get_change_message()
    assert "admin:op released the claim of hourly-report" in caplog.text
    # A live beat sends it as a normal occurrence, with a fresh token.
    sent = poll(lambda: next((r for r in store.history("hourly-report")
                              if r.state is RunState.SENT), None), 10,
                "the released run to be sent", between=beat.tick)
    assert (sent.due, sent.owner) == (due, beat.owner.id)
    assert ("hourly-report", iso(due)) in [(m["claims"]["entry"], m["claims"]["due"])
                                           for m in messages(server) if m["claims"]]
    # Releasing it again: nothing to release, and the user is told so.
    response = client.post(url("release", "hourly-report"), {"due": due}, follow=True)
    assert any("is sent, not claimed: nothing was released" in str(m)
               for m in response.context["messages"])
    assert LogEntry.objects.count() == 1


def test_run_now_is_claimed_and_sent_by_a_beat(client: Client, store: RedisStore,
                                               beat: Scheduler, server: RedisServer) -> None:
    sent_run(store, beat)  # the beat has anchored every entry
    login(client, "trigger_run")
    assert 'value="Run now"' in client.get(url("changelist")).content.decode()
    # The beat is alive through the request, as a running beat is (this one ticks only when
    # the test ticks it, and its TTL is 0.6 s: a page rendered on a loaded host outlives it).
    beat.store.heartbeat(beat.liveness.owner, 30.0)
    response = client.post(url("trigger", "hourly-report"), {"next": url("changelist")},
                           follow=True)
    assert response.redirect_chain[-1][0] == url("changelist")
    shown = [str(m) for m in response.context["messages"]]
    assert any("Triggered a run of hourly-report" in m for m in shown), shown
    [run] = store.history("hourly-report")
    assert run.state is RunState.DUE
    assert run.manual is True and run.requested_by == "admin:op"
    assert "hourly-report" in LogEntry.objects.get().object_id
    # The manual run is listed as a claim waiting for a beat.
    entry = next(e for e in client.get(url("changelist")).context["entries"]
                 if e["name"] == "hourly-report")
    assert [(c["state"], c["due"]) for c in entry["claims"]] == [("due", iso(run.due))]
    sent = poll(lambda: next((r for r in store.history("hourly-report")
                              if r.state is RunState.SENT), None), 10,
                "the manual run to be sent", between=beat.tick)
    assert sent.due == run.due and sent.manual is True
    [message] = [m for m in messages(server)
                 if m["claims"] and m["claims"]["entry"] == "hourly-report"]
    assert message["claims"]["due"] == iso(run.due)
    assert message["task"] == "site.report"


def test_run_now_of_an_unknown_entry_is_refused(client: Client, store: RedisStore,
                                                app: Celery) -> None:
    login(client, "trigger_run")
    response = client.post(url("trigger", "never-seen"), follow=True)
    assert any("no entry 'never-seen' in the store" in str(m)
               for m in response.context["messages"])
    assert store.history("never-seen") == []
    assert not LogEntry.objects.exists()


def test_run_now_of_an_entry_no_live_beat_schedules_is_refused(
        client: Client, store: RedisStore, app: Celery) -> None:
    """The only beat that registered it stopped: nobody would send the run."""
    store.heartbeat(GHOST, 60)
    store.register([EntrySeed("orphan", "every 1h")], GHOST)
    store.leave(GHOST)
    login(client, "trigger_run")
    response = client.post(url("trigger", "orphan"), follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert any("no live beat schedules orphan" in m and "gone-host:4242 (stopped)" in m
               and "nothing was recorded" in m for m in shown), shown
    assert store.history("orphan") == []
    assert not LogEntry.objects.exists()


def test_an_unreachable_store_is_shown_not_a_server_error(client: Client) -> None:
    from .conftest import free_port

    dead = f"redis://127.0.0.1:{free_port()}/0"
    with site_app(dead, dead):
        login(client)
        page = client.get(url("changelist"))
        assert page.status_code == 200
        assert "Cannot read the beat-claims store" in page.content.decode()
        assert client.get(url("change", "x")).status_code == 200



def test_next_occurrences_of_database_entries(client: Client, store: RedisStore,
                                              app: Celery) -> None:
    """With the database scheduler, the schedules come from django-celery-beat's rows."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every = IntervalSchedule.objects.create(every=10, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(name="db-entry", task="site.tick", interval=every)
    store.register([EntrySeed("db-entry", "every 10s"), EntrySeed("hourly-report", "hourly")])
    login(client)

    def shown() -> dict[str, Any]:
        return {e["name"]: e for e in client.get(url("changelist")).context["entries"]}

    entry = shown()["db-entry"]  # beat_schedule only: the row is not read
    assert (entry["in_schedule"], entry["next_due"]) == (False, None)
    database = "beat_claims.contrib.django.database_scheduler:DatabaseScheduler"
    with configured(app, beat_scheduler=database):
        entries = shown()
    assert entries["db-entry"]["in_schedule"] and entries["db-entry"]["next_due"]
    # beat_schedule's entries too, as that scheduler runs them along with the rows.
    assert entries["hourly-report"]["in_schedule"] and entries["hourly-report"]["next_due"]


def test_any_entry_name_has_a_page(client: Client, store: RedisStore, app: Celery) -> None:
    name = "reports/daily 1:_x?"
    store.register([EntrySeed(name, "every 1s")])
    login(client)
    changelist = client.get(url("changelist"))
    assert url("change", name) in changelist.content.decode().replace("&amp;", "&")
    detail = client.get(url("change", name))
    assert detail.status_code == 200 and detail.context["entry"]["name"] == name


def test_pause_and_resume_are_shown_and_every_beat_follows(
        client: Client, store: RedisStore, beat: Scheduler,
        caplog: pytest.LogCaptureFixture) -> None:
    sent_run(store, beat)  # the beat has anchored every entry and sends every-second
    login(client, "pause_entry", "resume_entry")
    html = client.get(url("changelist")).content.decode()
    assert 'value="Pause"' in html and 'name="note"' in html and 'value="Resume"' not in html
    with caplog.at_level(logging.INFO, logger="celery.beat.claims"):
        response = client.post(url("pause", "every-second"),
                               {"note": "  disk   full ", "next": url("changelist")},
                               follow=True)
    assert response.redirect_chain[-1][0] == url("changelist")
    assert any("Paused every-second" in str(m) for m in response.context["messages"])
    [info] = store.entries(["every-second"])
    assert info.paused is not None
    assert (info.paused.by, info.paused.note) == ("admin:op", "disk full")
    log = LogEntry.objects.get()
    assert (log.object_id, log.user.username, log.action_flag) == ("every-second", "op", CHANGE)
    assert log.content_type.model_class() is Entry and log.object_repr == "every-second"
    assert log.get_change_message() == f"Paused (since {iso(info.paused.at)}): disk full"
    assert "admin:op paused every-second" in caplog.text
    # Shown paused (who, note, since when) in the list and on its page, with Resume.
    for page in (response, client.get(url("change", "every-second"))):
        listed = page.context.get("entries")
        entry = page.context["entry"] if listed is None else next(
            e for e in listed if e["name"] == "every-second")
        assert (entry["paused"], entry["paused_by"], entry["paused_note"]) == (
            True, "admin:op", "disk full")
        assert entry["paused_at"] == iso(info.paused.at)
        html = page.content.decode()
        assert 'class="bc-state bc-paused">paused</span> by admin:op since' in html
        assert f'datetime="{iso(info.paused.at)}"' in html and "disk full" in html
        assert 'value="Resume"' in html
    hourly = next(e for e in response.context["entries"] if e["name"] == "hourly-report")
    assert hourly["paused"] is False
    # The beat records its next occurrences skipped (paused) instead of sending them.
    skipped = poll(lambda: next((r for r in store.history("every-second")
                                 if r.reason is Reason.PAUSED), None), 10,
                   "an occurrence skipped because paused", between=beat.tick)
    assert skipped.state is RunState.SKIPPED and skipped.due >= info.paused.at

    response = client.post(url("resume", "every-second"), follow=True)
    assert any("Resumed every-second" in str(m) for m in response.context["messages"])
    [info] = store.entries(["every-second"])
    assert info.paused is None and info.resumed_by == "admin:op"
    assert LogEntry.objects.count() == 2
    log = LogEntry.objects.latest("action_time")
    assert (log.object_id, log.user.username, log.action_flag) == ("every-second", "op", CHANGE)
    assert log.get_change_message() == "Resumed."
    html = response.content.decode()  # the entry's page
    assert "bc-state bc-paused" not in html and "resumed by admin:op" in html
    assert 'value="Pause"' in html
    resumed = info.resumed_at
    assert resumed is not None
    sent = poll(lambda: next((r for r in store.history("every-second")
                              if r.state is RunState.SENT and r.due > resumed), None), 10,
                "an occurrence sent after the resume", between=beat.tick)
    assert not sent.manual
    # Resuming again: nothing to do, the user is told so, nothing is logged.
    response = client.post(url("resume", "every-second"), follow=True)
    assert any("was not paused" in str(m) for m in response.context["messages"])
    assert LogEntry.objects.count() == 2


def test_pause_of_an_unknown_entry_is_refused(client: Client, store: RedisStore,
                                              app: Celery) -> None:
    login(client, "pause_entry", "resume_entry", "release_claim")
    for view in ("pause", "resume", "release"):
        response = client.post(url(view, "never-seen"), {"note": "x", "due": 1}, follow=True)
        assert any("no entry 'never-seen' in the store" in str(m)
                   for m in response.context["messages"]), view
    assert store.entries(["never-seen"]) == [] or store.entries(["never-seen"])[0].paused is None
    # A note longer than the admin records: refused, saying so; nothing paused.
    store.register([EntrySeed("every-second", "every 1s")])
    response = client.post(url("pause", "every-second"), {"note": "x" * 501}, follow=True)
    assert any("The note has 501 characters, more than 500" in str(m)
               for m in response.context["messages"])
    assert store.entries(["every-second"])[0].paused is None
    assert not LogEntry.objects.exists()


def kolkata(ms: int) -> str:
    """An instant as an operator in the project's timezone types it (as the pages show)."""
    from zoneinfo import ZoneInfo

    local = datetime.fromtimestamp(ms / 1000, timezone.utc).astimezone(ZoneInfo("Asia/Kolkata"))
    return f"{local:%Y-%m-%d %H:%M:%S}"


@pytest.fixture
def backfillable(store: RedisStore, app: Celery, settings: Any) -> Iterator[int]:
    """every-hour, first seen by the store three hours and a half ago (its anchor): it has
    three past occurrences, an hour apart from the anchor. The project's timezone is half
    an hour off UTC."""
    settings.TIME_ZONE = "Asia/Kolkata"
    anchor = store.now() // 1000 * 1000 - 7 * HOUR // 2  # whole seconds, as typed
    store.register([EntrySeed("every-hour", "every 1h", anchor=anchor)])
    assert store.entries(["every-hour"])[0].anchor == anchor
    hourly = {"task": "site.report", "schedule": timedelta(hours=1)}
    with configured(app, beat_schedule={**SCHEDULE, "every-hour": hourly}):
        yield anchor


def test_backfill_creates_the_missed_runs_a_beat_sends(
        client: Client, store: RedisStore, backfillable: int, app: Celery) -> None:
    anchor = backfillable
    hours = [anchor + k * HOUR for k in (1, 2, 3)]
    login(client, "backfill_entry")
    page = client.get(url("change", "every-hour"))
    html = page.content.decode()
    assert 'value="Backfill"' in html and 'name="start"' in html and "Asia/Kolkata" in html
    # From the anchor's instant to the last hour, in the project's timezone (naive).
    response = client.post(url("backfill", "every-hour"),
                           {"start": kolkata(anchor), "end": kolkata(hours[-1] + 1000)},
                           follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert any("Backfill of every-hour" in m and "created 3 run(s)" in m for m in shown), \
        shown
    runs = sorted(store.history("every-hour"), key=lambda r: r.due)
    assert [(r.due, r.state, r.manual, r.requested_by) for r in runs] == [
        (due, RunState.DUE, True, "admin:op") for due in hours]
    log = LogEntry.objects.get()
    assert (log.object_id, log.user.username, log.action_flag) == ("every-hour", "op", CHANGE)
    assert log.get_change_message() == (
        f"Backfilled 3 run(s) from {iso(anchor)} to {iso(hours[-1] + 1000)}"
        " (3 occurrence(s), 0 kept as they were).")
    # The same again (an instant with its offset, as a time's title has it): all kept.
    response = client.post(url("backfill", "every-hour"),
                           {"start": iso(anchor), "end": iso(hours[-1] + 1000)}, follow=True)
    assert any("nothing was created" in str(m) for m in response.context["messages"])
    assert len(store.history("every-hour")) == 3 and LogEntry.objects.count() == 1
    # A beat sends them.
    scheduler = Scheduler(app=app)
    try:
        settled(scheduler)
        poll(lambda: all(r.state is RunState.SENT for r in store.history("every-hour")),
             10, "the backfilled runs to be sent", between=scheduler.tick)
    finally:
        scheduler.close()
    assert sorted(r.due for r in store.history("every-hour")) == hours


@pytest.mark.parametrize(("start", "end", "limit", "said"), [
    (0, "future", None, "is after the store's clock"),
    (HOUR, 0, None, "is not before To"),
    (0, 0, None, "is not before To"),
    (0, 3 * HOUR + 1000, 2, "has 3 occurrences"),
    (0, 3 * HOUR + 1000, 2, "beat_claims_backfill_limit=2"),
    ("yesterday", 3 * HOUR + 1000, None, "From='yesterday': not an instant"),
    (0, "2026-02-30 25:00", None, "To='2026-02-30 25:00': not an instant"),
    ("2026-01-31T02:00:00+99:00", 0, None, "From='2026-01-31T02:00:00+99:00': not an"),
    ("", 0, None, "From: required, an instant"),
    (0, 3 * HOUR + 1000, 3, None),  # the control: within the limit, accepted
])
def test_backfill_refusals_are_shown_on_the_page(
        client: Client, store: RedisStore, backfillable: int, app: Celery,
        start: Any, end: Any, limit: int | None, said: str | None) -> None:
    anchor = backfillable

    def field(value: Any) -> str:
        if value == "future":
            return kolkata(store.now() + HOUR)
        return kolkata(anchor + value) if isinstance(value, int) else str(value)

    login(client, "backfill_entry")
    conf = {} if limit is None else {"beat_claims_backfill_limit": limit}
    with configured(app, **conf):
        response = client.post(url("backfill", "every-hour"),
                               {"start": field(start), "end": field(end)})
    if said is None:
        assert response.status_code == 302
        assert len(store.history("every-hour")) == 3
        return
    assert response.status_code == 200  # the entry's page again, with the form and why
    html = response.content.decode().replace("&#x27;", "'")
    assert said in html and "Nothing was backfilled." in html
    assert f'value="{field(start)}"' in html or not field(start)  # what was typed is kept
    assert store.history("every-hour") == []
    assert not LogEntry.objects.exists()


def test_backfill_of_an_entry_no_beat_has_seen(client: Client, store: RedisStore,
                                               app: Celery) -> None:
    login(client, "backfill_entry")
    now = store.now()
    response = client.post(url("backfill", "never-seen"),
                           {"start": iso(now - HOUR), "end": iso(now - 1000)}, follow=True)
    assert any("no entry 'never-seen' in the store" in str(m)
               for m in response.context["messages"])
    assert not LogEntry.objects.exists()


def test_each_button_is_shown_only_with_its_permission(
        store: RedisStore, backfillable: int) -> None:
    """A staff user sees the button of an action only with its permission: on the list
    and on the entry's page, for an entry paused and one not (Resume, Pause)."""
    store.register([EntrySeed(name, "") for name in SCHEDULE])  # as a beat registers them
    stuck_claim(store)  # a claim to release
    store.pause("every-second", "cli:someone", "why")

    def buttons(client: Client) -> dict[str, set[str]]:
        pages = {"list": client.get(url("changelist")),
                 "paused": client.get(url("change", "every-second")),
                 "entry": client.get(url("change", "hourly-report")),
                 "hourly": client.get(url("change", "every-hour"))}
        found = {}
        for page, response in pages.items():
            assert response.status_code == 200, page
            html = response.content.decode()
            found[page] = {b for b in BUTTONS if f'value="{b}"' in html}
        return found

    nothing = {"list": set(), "paused": set(), "entry": set(), "hourly": set()}
    assert buttons(login(Client(), username="viewer")) == nothing
    # The list has a row per entry: both Pause (every-hour) and Resume (every-second).
    assert buttons(login(Client(), *PERMISSIONS, username="all")) == {
        "list": {"Release", "Run now", "Pause", "Resume"},
        "paused": {"Run now", "Resume", "Backfill"},
        "entry": {"Release", "Run now", "Pause", "Backfill"},
        "hourly": {"Run now", "Pause", "Backfill"}}
    assert buttons(login(Client(), "pause_entry", username="pauser")) == {
        "list": {"Pause"}, "paused": set(), "entry": {"Pause"}, "hourly": {"Pause"}}
    assert buttons(login(Client(), "resume_entry", username="resumer")) == {
        "list": {"Resume"}, "paused": {"Resume"}, "entry": set(), "hourly": set()}
    assert buttons(login(Client(), "backfill_entry", username="backfiller")) == {
        "list": set(), "paused": {"Backfill"}, "entry": {"Backfill"}, "hourly": {"Backfill"}}
    assert buttons(login(Client(), "release_claim", username="releaser")) == {
        **nothing, "list": {"Release"}, "entry": {"Release"}}


def test_backfill_reads_an_instant_with_its_offset_as_the_cli_does(
        client: Client, store: RedisStore, backfillable: int) -> None:
    """``+05:30`` or ``Z``: read by operations.parse_instant (the project's timezone does
    not apply); without an offset, in the project's timezone."""
    from beat_claims.operations import parse_instant

    anchor = backfillable
    login(client, "backfill_entry")
    start = str(iso(anchor + HOUR - 1000))  # Z
    end = kolkata(anchor + HOUR + 1000).replace(" ", "T") + "+05:30"
    assert parse_instant(end, "To") == anchor + HOUR + 1000
    response = client.post(url("backfill", "every-hour"), {"start": start, "end": end},
                           follow=True)
    assert any("created 1 run(s)" in str(m) for m in response.context["messages"])
    assert [r.due for r in store.history("every-hour")] == [anchor + HOUR]
    # A range with no occurrence: said so, nothing recorded.
    response = client.post(url("backfill", "every-hour"),
                           {"start": kolkata(anchor + HOUR + 1000),
                            "end": kolkata(anchor + 2 * HOUR - 1000)}, follow=True)
    assert any("its schedule has no occurrence there" in str(m)
               for m in response.context["messages"])
    assert LogEntry.objects.count() == 1
