"""The Django admin of beat-claims, through Django's test client, on a real store filled by a
real Scheduler (ticked in this process) against the test's private redis-server."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse

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


@pytest.fixture
def app(server: RedisServer) -> Iterator[Celery]:
    with site_app(server.url, server.broker_url(), beat_schedule=SCHEDULE) as app:
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
    assert "every 1s" in html  # the schedule
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
    assert 'value="Release"' not in html and 'value="Run now"' not in html  # no permission
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
    beat.tick()  # anchors the entries
    due = stuck_claim(store)
    viewer = login(Client(), username="viewer")
    for view in ("release", "trigger"):
        assert viewer.get(url(view, "hourly-report")).status_code == 405
        assert viewer.post(url(view, "hourly-report"), {"due": due}).status_code == 403
    # With the permissions but without the CSRF token: refused.
    guarded = login(Client(enforce_csrf_checks=True), "release_claim", "trigger_run")
    for view in ("release", "trigger"):
        assert guarded.post(url(view, "hourly-report"), {"due": due}).status_code == 403
    assert [r.state for r in store.history("hourly-report")] == [RunState.CLAIMED]
    assert not any(r.manual for r in store.history("every-second"))
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
    assert any("was not released" in str(m) for m in response.context["messages"])
    assert LogEntry.objects.count() == 1


def test_run_now_is_claimed_and_sent_by_a_beat(client: Client, store: RedisStore,
                                               beat: Scheduler, server: RedisServer) -> None:
    sent_run(store, beat)  # the beat has anchored every entry
    login(client, "trigger_run")
    assert 'value="Run now"' in client.get(url("changelist")).content.decode()
    response = client.post(url("trigger", "hourly-report"), {"next": url("changelist")},
                           follow=True)
    assert response.redirect_chain[-1][0] == url("changelist")
    assert any("Triggered a run of hourly-report" in str(m)
               for m in response.context["messages"])
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
    assert any("not known to the store" in str(m) for m in response.context["messages"])
    assert store.history("never-seen") == []
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
