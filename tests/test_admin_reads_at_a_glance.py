"""The admin read at a glance, in headless Chromium at 1280x800 and 1920x1080 (the
viewport emulated exactly), on a real store filled as beats and workers fill it: entries
of every kind of schedule, fifty runs of one entry (45 skipped, a failure with a long
message, a lost one, long task ids and worker names), two live beats and three dead ones.

An entry's page needs no sideways scroll; each row of the entries list is at most 60 px
tall, its actions one compact control; schedules read in words; task ids are shortened,
the full id in the title and in what is copied; dead beats are folded under their count;
runs are filtered by state and by outcome; an SVG timeline draws each run coloured by
state, and one draws the fleet's last hour, a lane a beat. Each page is kept as a
screenshot under ``test-artifacts/admin-glance/<width>x<height>/``.
"""

from __future__ import annotations

import base64
import os
import shutil
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django_celery_beat")
pytest.importorskip("selenium")

from celery.schedules import crontab, schedule, solar
from selenium.webdriver.common.by import By

from beat_claims.enums import Overlap, Reason, RunState
from beat_claims.runs import Owner, to_ms
from beat_claims.schedule_words import describe
from beat_claims.schedules import clocked, zoned_crontab
from beat_claims.stores.base import (
    Check,
    ClaimPlan,
    Delivery,
    EntrySeed,
    EntryState,
    Outcome,
    WorkerProcess,
)
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer, seed_settled_epoch
from .djangosite.testing import site_app
from .processes import ROOT, wait_for
from .test_admin_browser import (  # noqa: F401
    PASSWORD,
    USER,
    Admin,
    own_context,
    shared_chromium,
    site_settings,
)

pytestmark = pytest.mark.django_db
PREFIX = "glance-claims"
ARTIFACTS = ROOT / "test-artifacts" / "admin-glance"
SIZES = ((1280, 800), (1920, 1080))
BEAT_A = Owner(id="a1b2c3d4-live-beat-a", host="scheduler-host-a.internal", pid=4101,
               started_at=1.0)
BEAT_B = Owner(id="e5f6a7b8-live-beat-b", host="scheduler-host-b.internal", pid=4202,
               started_at=1.0)
DEAD = tuple(Owner(id=f"dead-beat-{n}", host=f"old-host-{n}", pid=3000 + n, started_at=1.0)
             for n in range(3))
WORKER = WorkerProcess("celery@worker-with-a-rather-long-hostname-07.eu-west-1.internal",
                       7777, "boot-1:7777")
LONG_MESSAGE = ("could not serialize access due to concurrent update of table"
                " reporting_nightly_aggregates_by_customer_and_region_v2; the transaction"
                " was rolled back and the lock wait timeout was reached after 50 s")
SCHEDULES = {
    "every-minute": crontab(),
    "nightly-paris": zoned_crontab(minute="0", hour="2", timezone="Europe/Paris"),
    "every-10s": schedule(timedelta(seconds=10)),
    "sunset-berlin": solar("sunset", 52.52, 13.405),
    "launch-once": clocked(to_ms(datetime(2030, 1, 31, 2, tzinfo=timezone.utc))),
}
WORDS = {
    "every-minute": "every minute",
    "nightly-paris": "at 02:00 Europe/Paris",
    "every-10s": "every 10 s",
    "sunset-berlin": "at sunset at 52.52°N 13.405°E",
    "launch-once": "once at 2030-01-31 02:00:00 UTC",
}


def task_id(n: int) -> str:
    return f"3f1c9a7e-5b2d-4e8f-9c6a-{n:012d}-retry-0-of-a-long-task-id"


def fill(store: RedisStore) -> dict[str, Any]:
    """The store as a fleet leaves it: entries registered by beat A (their descriptions as
    a beat registers them), 50 runs of every-10s (45 skipped: overlap; 2 done, 1 failed
    with a long message, 1 lost, 1 started), a few runs of every-minute sent by beat B and
    by a dead beat, nightly-paris paused with a note, three dead beats."""
    for beat in DEAD:
        store.heartbeat(beat, 0.001)
    now = store.heartbeat(BEAT_A, 600).now
    store.heartbeat(BEAT_B, 600)
    wait_for(lambda: not any(o.alive for o in store.owners() if o.owner in DEAD), 5,
             "the dead beats' heartbeats to lapse", interval=0.02)
    states = store.register([EntrySeed(name, describe(sched), anchor=now - 3_000_000)
                             for name, sched in SCHEDULES.items()], BEAT_A)
    dues = [now - 500_000 + k * 10_000 for k in range(50)]
    runs = _runs(store, BEAT_A, "every-10s", states["every-10s"], dues[45:], dues[:45])
    done, done2, failed, lost, _started = runs
    store.finish([Outcome(c.entry, c.due, c.token, RunState.DONE, worker=WORKER.worker)
                  for c in (done, done2)])
    store.finish([Outcome(failed.entry, failed.due, failed.token, RunState.FAILED,
                          exc_type="psycopg.errors.SerializationFailure",
                          exc_message=LONG_MESSAGE, worker=WORKER.worker)])
    store.finish([Outcome(lost.entry, lost.due, lost.token, RunState.LOST,
                          reason=Reason.RUN_TIMEOUT, inactive_since=now + 600_000)])
    minute = [now - 1_800_000 + k * 60_000 for k in range(3)]
    by_b = _runs(store, BEAT_B, "every-minute", states["every-minute"], minute[:2], ())
    store.finish([Outcome(c.entry, c.due, c.token, RunState.DONE, worker=WORKER.worker)
                  for c in by_b])
    [later] = store.entries(["every-minute"])
    _runs(store, DEAD[0], "every-minute", EntryState(later.anchor, later.checkpoint,
                                                      later.token), minute[2:], ())
    store.pause("nightly-paris", "alice@ops", "deploy of the reporting database in"
                " progress, back at 03:00 (ticket OPS-1234)")
    return {"runs": 50, "skipped": 45}


def _runs(store: RedisStore, beat: Owner, entry: str, state: Any, sent: list[int],
          skipped: list[int]) -> list[Any]:
    """Claim ``sent`` (checked, published, started) and record ``skipped`` (overlap)."""
    [result] = store.claim(beat, [ClaimPlan(entry, state, tuple(sent), tuple(
        (due, Reason.OVERLAP) for due in skipped))])
    claims = list(result.claims)
    assert len(claims) == len(sent), result
    store.check(beat, [Check(c, task_id(c.due % 100_000), None, Overlap.ALLOW)
                       for c in claims])
    assert store.record_sent(beat, claims) == len(claims)
    for c in claims:
        store.start(Delivery(c.entry, c.due, c.token, WORKER, 0, task_id(c.due % 100_000)))
    return claims


class Glance(Admin):
    """The operator's browser at one viewport size."""

    def open(self, path: str) -> None:
        super().open(path)
        assert "/admin/login/" not in self.driver.current_url, f"{path}: sent to log in"

    def logged_in(self, user: Any) -> None:
        """A session of ``user``, as Django's own login makes it, in the browser's cookie
        (the form's way in, two pages more a test, is the operator's test's)."""
        from django.conf import settings
        from django.test import Client

        client = Client()
        client.force_login(user)
        name = settings.SESSION_COOKIE_NAME
        self.driver.execute_cdp_cmd("Network.setCookie", {
            "name": name, "value": client.cookies[name].value, "url": self.base_url,
            "path": "/", "httpOnly": True})

    def size(self, width: int, height: int) -> None:
        self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def overflow(self) -> dict[str, Any]:
        """The page's width and its viewport's, and every box of the page's content that
        scrolls sideways inside itself (a module: what it hides is as far off screen)."""
        found: dict[str, Any] = self.driver.execute_script("""
            const e = document.scrollingElement;
            const inner = Array.from(document.querySelectorAll('.beat-claims *'))
              .filter(el => el.scrollWidth > el.clientWidth + 1
                      && ['auto', 'scroll'].includes(getComputedStyle(el).overflowX))
              .map(el => (el.id || el.className) + ': ' + el.scrollWidth + ' > '
                   + el.clientWidth);
            return {scroll: e.scrollWidth, client: e.clientWidth, inner: inner};""")
        return found

    def row_heights(self) -> dict[str, float]:
        found: dict[str, float] = self.driver.execute_script("""
            const out = {};
            for (const row of document.querySelectorAll('#result_list tr.entry')) {
              out[row.querySelector('th a').textContent] = row.getBoundingClientRect().height;
            }
            return out;""")
        return found

    def schedules(self) -> dict[str, str]:
        return {row.find_element(By.CSS_SELECTOR, "th a").text:
                row.find_element(By.CSS_SELECTOR, "td").text
                for row in self.driver.find_elements(By.CSS_SELECTOR, "#result_list tr.entry")}

    def viewport_shot(self, name: str) -> Path:
        data = self.driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})["data"]
        path = self.shots / f"{len(self.taken) + 1:02d}-{name}.png"
        path.write_bytes(base64.b64decode(data))
        self.taken.append(path)
        return path


@pytest.fixture(params=SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def glance(request: pytest.FixtureRequest, live_server: Any, server: RedisServer,
           site_settings: Any, shared_chromium: Any,  # noqa: F811
           ) -> Iterator[tuple[Glance, RedisStore, dict[str, Any]]]:
    """Logged in as a superuser, at the viewport size, the store filled (:func:`fill`)."""
    from django.contrib.auth.models import User

    width, height = request.param
    shots = ARTIFACTS / f"{width}x{height}" / request.node.originalname
    if shots.exists():
        shutil.rmtree(shots)
    shots.mkdir(parents=True)
    seed_settled_epoch(server, PREFIX)
    store = RedisStore.from_url(server.url, PREFIX)
    filled = fill(store)
    user = User.objects.create_superuser(USER, "", PASSWORD)
    with own_context(shared_chromium) as driver:
        admin = Glance(driver, live_server.url, shots)
        admin.size(width, height)
        try:
            with site_app(server.url, server.broker_url(), beat_claims_key_prefix=PREFIX,
                          beat_schedule={name: {"task": "djangosite.record", "schedule": s}
                                         for name, s in SCHEDULES.items()}):
                admin.logged_in(user)
                yield admin, store, filled
        finally:
            sys.stdout.write(f"screenshots: {shots}\n")


ENTRY = "/admin/beat_claims/entry/every-10s/"
ENTRIES = "/admin/beat_claims/entry/"


def test_an_entrys_page_needs_no_sideways_scroll(glance: Any) -> None:
    admin, _, filled = glance
    admin.open(ENTRY)
    admin.viewport_shot("entry-viewport")
    admin.shot("entry")
    assert len(admin.driver.find_elements(By.CSS_SELECTOR, "#runs tr.run")) == filled["runs"]
    seen = admin.overflow()
    assert seen["scroll"] <= seen["client"] and seen["inner"] == [], \
        f"the page scrolls sideways: {seen}"


def test_each_row_of_the_entries_list_is_at_most_60_px(glance: Any) -> None:
    admin, _, _ = glance
    admin.open(ENTRIES)
    admin.viewport_shot("entries-viewport")
    admin.shot("entries")
    heights = admin.row_heights()
    assert set(heights) == set(SCHEDULES), heights
    tall = {name: h for name, h in heights.items() if h > 60}
    assert tall == {}, f"rows taller than 60 px: {tall}"
    seen = admin.overflow()
    assert seen["scroll"] <= seen["client"] and seen["inner"] == [], \
        f"the list scrolls sideways: {seen}"
    # The row's actions: one compact control a row, its forms inside.
    for row in admin.driver.find_elements(By.CSS_SELECTOR, "#result_list tr.entry"):
        menus = row.find_elements(By.CSS_SELECTOR, "details.bc-menu")
        assert len(menus) == 1, row.text
        assert not menus[0].find_element(By.CSS_SELECTOR, "input[type=submit]").is_displayed()


def test_schedules_read_in_words(glance: Any) -> None:
    admin, _, _ = glance
    admin.open(ENTRIES)
    assert admin.schedules() == WORDS


def test_dead_beats_are_folded_under_their_count(glance: Any) -> None:
    admin, _, _ = glance
    admin.open(ENTRIES)
    live = admin.driver.find_elements(By.CSS_SELECTOR, "#beats > table tr.beat")
    assert sorted(r.find_elements(By.TAG_NAME, "td")[1].text for r in live) == [
        "scheduler-host-a.internal:4101", "scheduler-host-b.internal:4202"]
    folded = admin.driver.find_element(By.CSS_SELECTOR, "#beats details.bc-dead")
    summary = folded.find_element(By.TAG_NAME, "summary")
    assert summary.text.startswith("3 dead beats"), summary.text
    dead = folded.find_elements(By.CSS_SELECTOR, "tr.beat")
    assert len(dead) == 3 and not any(r.is_displayed() for r in dead)
    summary.click()
    assert all(r.is_displayed() for r in dead)
    admin.shot("dead-beats-unfolded")


def test_runs_filtered_by_state_and_by_outcome(glance: Any) -> None:
    admin, _, filled = glance
    admin.open(ENTRY)

    def states() -> list[str]:
        return [r["state"] for r in admin.runs()]

    admin.follow(admin.driver.find_element(By.CSS_SELECTOR,
                                           "#run-filter a[data-state='skipped']"))
    assert states() == ["skipped"] * filled["skipped"], states()
    admin.shot("filtered-skipped")
    admin.follow(admin.driver.find_element(By.CSS_SELECTOR,
                                           "#run-filter a[data-state='lost']"))
    assert states() == ["lost"], states()
    admin.follow(admin.driver.find_element(
        By.CSS_SELECTOR, "#run-filter a[data-outcome='psycopg.errors.SerializationFailure']"))
    assert states() == ["failed"], states()
    admin.shot("filtered-failure")
    admin.follow(admin.driver.find_element(By.CSS_SELECTOR, "#run-filter a[data-state='']"))
    assert len(states()) == filled["runs"]


def test_task_ids_are_shortened_with_the_full_id_kept(glance: Any) -> None:
    admin, _, _ = glance
    admin.open(ENTRY)
    ids: list[dict[str, Any]] = admin.driver.execute_script("""
        return Array.from(document.querySelectorAll('#runs .bc-id')).map(el => ({
          text: el.textContent, title: el.title, lines: el.getClientRects().length,
          width: el.getBoundingClientRect().width}));""")
    assert len(ids) == 5, ids
    for shown in ids:
        assert shown["text"] == shown["title"] and shown["text"].endswith("long-task-id")
        assert shown["lines"] == 1 and shown["width"] <= 120, shown


def test_timelines_draw_each_run_coloured_by_state(glance: Any) -> None:
    admin, _, filled = glance
    admin.open(ENTRY)
    marks: list[dict[str, str]] = admin.driver.execute_script("""
        return Array.from(document.querySelectorAll('svg#bc-timeline g.bc-tl-run')).map(g => ({
          state: g.dataset.state,
          fill: getComputedStyle(g.querySelector('.bc-tl-mark')).fill}));""")
    assert len(marks) == filled["runs"], marks
    fills: dict[str, set[str]] = {}
    for mark in marks:
        fills.setdefault(mark["state"], set()).add(mark["fill"])
    assert {s: len(f) for s, f in fills.items()} == {
        "skipped": 1, "done": 1, "failed": 1, "lost": 1, "started": 1}, fills
    colours = [next(iter(f)) for f in fills.values()]
    assert len(set(colours)) == len(colours), f"two states share a colour: {fills}"
    admin.shot("timeline")
    admin.open(ENTRIES)
    lanes: list[dict[str, Any]] = admin.driver.execute_script("""
        return Array.from(document.querySelectorAll('svg#bc-fleet g.bc-fleet-lane')).map(g => ({
          beat: g.dataset.beat, marks: g.querySelectorAll('.bc-tl-mark').length}));""")
    assert {lane["beat"] for lane in lanes} >= {
        "scheduler-host-a.internal:4101", "scheduler-host-b.internal:4202",
        "old-host-0:3000"}, lanes
    assert all(lane["marks"] > 0 for lane in lanes), lanes
    admin.shot("fleet")
    assert os.path.getsize(admin.taken[0]) > 0
