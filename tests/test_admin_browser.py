"""The admin in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by Selenium through the system chromedriver), a live Django
server of the test site, a real store, a real ``celery beat`` and a real worker.

An operator logs in, opens the entries, opens an entry and presses Run now; the manual run
is shown ``done`` once the worker ran it. Then they pause the entry with a note, see it
paused (who, note, since when) in the entries list, and resume it there. They pause
another entry from the list, resume it once the beat has skipped some of its occurrences,
and backfill those from its page (a mistyped instant refused first, said beside the
form): each runs once, shown ``done``. Every page is kept as a screenshot under
``test-artifacts/admin/``. On the way the pages are checked as a person reads them: every
state label (``paused`` too) has a text contrast of at least 4.5:1 (WCAG 2.x AA) in the
admin's light, dark and auto themes, times are in the project's timezone, on one line,
with the UTC instant in their ``title``, and no action button lies outside the table's
visible box (with the widest claims the list can have).

Each page action is one method of :class:`Admin`.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import urllib3

pytest.importorskip("django_celery_beat")
pytest.importorskip("selenium")

from django.utils.formats import date_format
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.command import Command
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.expected_conditions import staleness_of
from selenium.webdriver.support.wait import WebDriverWait

from beat_claims.enums import Reason, RunState
from beat_claims.operations import parse_instant
from beat_claims.runs import iso
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer, seed_settled_epoch
from .djangosite.testing import site_app
from .processes import ROOT, Fleet, wait_for
from .test_django_beat import site

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = ROOT / "test-artifacts" / "admin"
#: What the celery processes of the test site use (its settings name no other).
PREFIX = "beat-claims"
DATABASE_SCHEDULER = "beat_claims.contrib.django.database_scheduler:DatabaseScheduler"
#: Half an hour off UTC: a time shown in UTC, or with the offset applied twice, shows.
ZONE = "Asia/Kolkata"
#: Every state a label can show: the runs' and the entries' (``paused``).
STATES = (*(s.value for s in RunState), "paused")
AA = 4.5
#: The admin's theme toggle, and the colour scheme the system prefers: the page left last
#: in the light theme.
THEMES = (("dark", "light"), ("auto", "dark"), ("light", "dark"), ("light", "light"))
ISO_UTC = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
USER, PASSWORD = "operator", "a-browser-test-password"
TASK = "djangosite.record"


# -- colours as WCAG 2.x reads them ----------------------------------------------------

def rgba(css: str) -> tuple[float, float, float, float]:
    """``rgb(r, g, b)`` or ``rgba(r, g, b, a)``, as getComputedStyle writes colours."""
    found = re.fullmatch(r"rgba?\(([\d.]+), ([\d.]+), ([\d.]+)(?:, ([\d.]+))?\)", css)
    assert found, f"a colour that is not rgb(): {css!r}"
    r, g, b, a = found.groups()
    return float(r), float(g), float(b), 1.0 if a is None else float(a)


def over(top: tuple[float, float, float, float],
         below: tuple[float, float, float]) -> tuple[float, float, float]:
    """``top`` composited over an opaque colour."""
    a = top[3]
    return (top[0] * a + below[0] * (1 - a), top[1] * a + below[1] * (1 - a),
            top[2] * a + below[2] * (1 - a))


def luminance(rgb: tuple[float, float, float]) -> float:
    """Relative luminance (WCAG 2.x)."""
    def linear(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (linear(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg: tuple[float, float, float], bg: tuple[float, float, float]) -> float:
    light, dark = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


#: For each element: its text colour and the background colours from it up to the root
#: (transparent ones included): the effective background is their composite.
COLOURS_JS = """
return Array.from(document.querySelectorAll(arguments[0])).map(el => {
  const layers = [];
  for (let node = el; node; node = node.parentElement) {
    layers.push(getComputedStyle(node).backgroundColor);
  }
  return {text: el.textContent.trim(), color: getComputedStyle(el).color, layers: layers};
});
"""


#: The runs table, one object a row, read in one call (a WebDriver call an element and
#: attribute took seconds for a table of fifty runs on a loaded host): the text as a person
#: reads it (rendered, its whitespace collapsed as WebDriver's ``.text`` gives it).
RUNS_JS = r"""
const text = el => el.innerText.replace(/\u00a0/g, ' ').split('\n')
  .map(line => line.replace(/[ \t]+/g, ' ').trim()).join('\n').trim();
return Array.from(document.querySelectorAll('#runs tr.run')).map(row => {
  const cells = row.querySelectorAll('td');
  const due = cells[0].querySelector('time');
  return {due: due.getAttribute('title'), due_text: text(due),
          state: text(cells[1].querySelector('.bc-state')),
          manual: text(cells[0]).includes('(manual,'), detail: text(cells[cells.length - 1])};
});
"""


def ratios(found: list[dict[str, Any]]) -> dict[str, tuple[float, bool]]:
    """Label text -> its lowest contrast ratio on the page, and whether its text is
    lighter than its background (as a dark theme has it)."""
    out: dict[str, tuple[float, bool]] = {}
    for label in found:
        bg: tuple[float, float, float] = (255.0, 255.0, 255.0)  # the canvas
        for layer in reversed(label["layers"]):
            bg = over(rgba(layer), bg)
        fg = over(rgba(label["color"]), bg)
        ratio = (contrast(fg, bg), luminance(fg) > luminance(bg))
        out[label["text"]] = min(ratio, out.get(label["text"], ratio))
    return out


# -- the operator's browser ------------------------------------------------------------

class Admin:
    """The admin as an operator uses it: one method a page action."""

    def __init__(self, driver: webdriver.Chrome, base_url: str, shots: Path) -> None:
        self.driver = driver
        self.base_url = base_url
        self.shots = shots
        self.taken: list[Path] = []

    # pages
    def open(self, path: str) -> None:
        self.driver.get(self.base_url + path)

    def login(self, username: str, password: str) -> None:
        self.open("/admin/login/?next=/admin/beat_claims/entry/")
        self.shot("login")
        self.driver.find_element(By.ID, "id_username").send_keys(username)
        self.driver.find_element(By.ID, "id_password").send_keys(password)
        self.follow(self.driver.find_element(By.CSS_SELECTOR, "input[type=submit]"))
        assert "/admin/login/" not in self.driver.current_url, self.messages()

    def reload_until(self, check: Any, timeout: float, what: str) -> Any:
        """The page, reloaded until ``check()`` finds what it looks for on it."""
        return wait_for(check, timeout, what, interval=0.3, between=self.driver.refresh)

    def open_entries(self, until: str, timeout: float = 30) -> None:
        """The entries list, reloaded until a beat has seen the entry ``until``: it has a
        next due time (a row of the schedule that no beat has seen has none)."""
        self.open("/admin/beat_claims/entry/")
        self.reload_until(lambda: self.next_due(until), timeout,
                          f"{until} in the entries list with a next due time")

    def open_entry(self, name: str) -> None:
        row = self.entry_row(name)
        assert row is not None, f"no row for {name}"
        self.follow(row.find_element(By.LINK_TEXT, name))
        assert self.heading() == name

    # actions
    def follow(self, element: WebElement) -> None:
        """Click a link or a button and wait for the page it loads."""
        element.click()
        # Asked about the old page while the new one loads, chromedriver may answer with
        # an error of its own ("unhandled inspector error") rather than "stale": ask again.
        WebDriverWait(self.driver, 10, ignored_exceptions=(WebDriverException,)).until(
            staleness_of(element))

    def press_run_now(self) -> None:
        self.follow(self.driver.find_element(By.CSS_SELECTOR, "input[value='Run now']"))

    def press_pause(self, note: str, entry: str | None = None) -> None:
        """Pause, with a note: on the entry's page, or in ``entry``'s row of the list."""
        form = self.action_form("Pause", entry)
        form.find_element(By.NAME, "note").send_keys(note)
        self.follow(form.find_element(By.CSS_SELECTOR, "input[value='Pause']"))

    def press_resume(self, entry: str | None = None) -> None:
        form = self.action_form("Resume", entry)
        self.follow(form.find_element(By.CSS_SELECTOR, "input[value='Resume']"))

    def press_backfill(self, start: str, end: str) -> None:
        """The entry's Backfill form: From and To typed as given."""
        form = self.driver.find_element(By.CSS_SELECTOR, "#backfill form")
        for name, value in (("start", start), ("end", end)):
            field = form.find_element(By.NAME, name)
            field.clear()
            field.send_keys(value)
        self.follow(form.find_element(By.CSS_SELECTOR, "input[value='Backfill']"))

    def action_form(self, action: str, entry: str | None) -> WebElement:
        """The form of an action button: the page's, or that of ``entry``'s row (its
        actions menu opened first)."""
        within: Any = self.driver if entry is None else self.entry_row(entry)
        assert within is not None, f"no row for {entry}"
        for menu in within.find_elements(By.CSS_SELECTOR, "details.bc-menu:not([open])"):
            menu.find_element(By.TAG_NAME, "summary").click()
        button = within.find_element(By.CSS_SELECTOR, f"input[value='{action}']")
        form: WebElement = button.find_element(By.XPATH, "./ancestor::form")
        return form

    # what the page shows
    def heading(self) -> str:
        found = self.driver.find_elements(By.CSS_SELECTOR, "#content h1, #content h2")
        return str(found[0].text) if found else ""

    def messages(self) -> list[str]:
        return [m.text for m in self.driver.find_elements(By.CSS_SELECTOR, ".messagelist li")]

    def entry_row(self, name: str) -> WebElement | None:
        for row in self.driver.find_elements(By.CSS_SELECTOR, "#result_list tr.entry"):
            if row.find_element(By.CSS_SELECTOR, "th a").text == name:
                return row
        return None

    def paused(self, name: str) -> dict[str, str] | None:
        """An entry's pause as the entries list shows it: its text and label, and the
        UTC instant it has been paused since; None when it is not paused."""
        row = self.entry_row(name)
        assert row is not None, f"no row for {name}"
        found = row.find_elements(By.CSS_SELECTOR, "th .bc-pause")
        if not found:
            return None
        since = found[0].find_element(By.TAG_NAME, "time")
        # (its whole text: a long note is cut with an ellipsis in the row, whole in its title)
        text = " ".join(str(found[0].get_attribute("textContent")).split())
        return {"text": text, "since": str(since.get_attribute("title")),
                "label": found[0].find_element(By.CSS_SELECTOR, ".bc-state").text}

    def resumed_at(self) -> str:
        """The UTC instant an entry's page says it was last resumed at (a time's title)."""
        row = self.driver.find_element(By.XPATH, "//tr[th='Paused']/td")
        assert row.text.startswith("no (resumed by "), row.text
        return str(row.find_element(By.TAG_NAME, "time").get_attribute("title"))

    def errors(self) -> list[str]:
        """What a refused form says: its note, and each error."""
        return [e.text for e in self.driver.find_elements(
            By.CSS_SELECTOR, ".errornote, ul.errorlist li")]

    def runs(self) -> list[dict[str, Any]]:
        """The runs table: one dict a row, with its cells and its due instant (UTC)."""
        found: list[dict[str, Any]] = self.driver.execute_script(RUNS_JS)
        return found

    def wait_for_run(self, state: str, timeout: float, **match: Any) -> dict[str, Any]:
        """The entry's page, reloaded until a run matching ``match`` is in ``state``."""
        def found() -> dict[str, Any] | None:
            return next((r for r in self.runs() if r["state"] == state and all(
                r[k] == v for k, v in match.items())), None)
        run: dict[str, Any] = self.reload_until(found, timeout,
                                                f"a run {match} shown {state}")
        return run

    def hidden_buttons(self) -> list[str]:
        """The action buttons and fields a person cannot see without scrolling sideways:
        outside the box of the module that holds them (its overflow is scrolled), each
        row's actions menu open (and closed again)."""
        found: list[str] = self.driver.execute_script("""
            const closed = document.querySelectorAll('details.bc-menu:not([open])');
            closed.forEach(d => { d.open = true; });
            const hidden = Array.from(document.querySelectorAll('.beat-claims .bc-actions input'))
              .filter(el => el.type !== 'hidden').filter(el => {
                const box = el.closest('.module').getBoundingClientRect();
                const r = el.getBoundingClientRect();
                return r.left < box.left || r.right > box.right;
              }).map(el => el.value || el.placeholder);
            closed.forEach(d => { d.open = false; });
            return hidden;""")
        return found

    def times(self) -> list[dict[str, Any]]:
        """Every time on the page: its text, its title and how many lines it takes
        (those folded away, as dead beats are, left out: they take none)."""
        found: list[dict[str, Any]] = self.driver.execute_script("""
            return Array.from(document.querySelectorAll('.beat-claims time'))
              .filter(t => !t.closest('details:not([open])')).map(t => ({
              text: t.textContent, title: t.title, lines: t.getClientRects().length}));""")
        return found

    def label_ratios(self) -> dict[str, tuple[float, bool]]:
        return ratios(self.driver.execute_script(COLOURS_JS, ".beat-claims .bc-state"))

    def readable_labels(self, shot: str) -> dict[str, dict[str, float]]:
        """Theme -> label -> its contrast ratio, each at least AA, in each of the admin's
        themes (a screenshot of each); the page is left in the light theme."""
        measured = {}
        for theme, system in THEMES:
            self.theme(theme, system)
            found = self.label_ratios()
            self.shot(f"{shot}-{theme}-{system}")
            dark = theme == "dark" or (theme, system) == ("auto", "dark")
            assert all(lighter is dark for _, lighter in found.values()), (theme, found)
            measured[f"{theme}/{system}"] = {s: r for s, (r, _) in found.items()}
            low = {s: round(r, 2) for s, (r, _) in found.items() if r < AA}
            assert low == {}, f"state labels under {AA}:1, theme {theme}/{system}: {low}"
        return measured

    def next_due(self, name: str) -> str | None:
        """The UTC instant of an entry's next due time in the entries list."""
        row = self.entry_row(name)
        if row is None:
            return None
        found = row.find_elements(By.CSS_SELECTOR, "td:nth-of-type(2) time")
        return found[0].get_attribute("title") if found else None

    def last_run(self, name: str) -> str:
        """The state of an entry's last run in the entries list."""
        row = self.entry_row(name)
        assert row is not None, f"no row for {name}"
        return str(row.find_elements(By.TAG_NAME, "td")[3].find_element(
            By.CSS_SELECTOR, ".bc-state").text)

    def with_a_claim(self) -> None:
        """A current claim in each row of the entries list, as wide as one gets (held by a
        beat, with its Release button): the list then has its widest content, which a
        test cannot time (claims are held for a moment)."""
        self.driver.execute_script("""
            for (const row of document.querySelectorAll('#result_list tr.entry')) {
              const time = row.querySelector('td time').cloneNode(true);
              const claim = document.createElement('div');
              claim.className = 'bc-claim';
              claim.innerHTML = '<span class="bc-state bc-sending">sending</span> due ';
              claim.appendChild(time);
              claim.insertAdjacentHTML('beforeend', ' by runner-host-01:123456 (alive)'
                + ' <form class="bc-inline"><input type="submit" value="Release"></form>');
              row.querySelectorAll('td')[2].replaceChildren(claim);
            }""")

    def with_every_state(self) -> None:
        """A copy of the first run's row for each state a label can show, in the table
        where runs are shown: the page then has every state's label in place."""
        self.driver.execute_script("""
            const row = document.querySelector('#runs tr.run');
            for (const state of arguments[0]) {
              const copy = row.cloneNode(true);
              const label = copy.querySelector('.bc-state');
              label.className = 'bc-state bc-' + state;
              label.textContent = state;
              row.parentElement.appendChild(copy);
            }""", list(STATES))

    def theme(self, name: str, system: str = "light") -> None:
        """Django's theme toggle (light, dark or auto), as the admin's theme.js sets it,
        with the colour scheme the system prefers (what ``auto`` follows)."""
        self.driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [
            {"name": "prefers-color-scheme", "value": system}]})
        self.driver.execute_script("document.documentElement.dataset.theme = arguments[0];"
                                   "localStorage.setItem('theme', arguments[0]);", name)

    def shot(self, name: str) -> Path:
        """The whole page, not only the viewport, as a PNG test artefact."""
        data = self.driver.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True})["data"]
        path = self.shots / f"{len(self.taken) + 1:02d}-{name}.png"
        path.write_bytes(base64.b64decode(data))
        self.taken.append(path)
        return path


def chromium() -> webdriver.Chrome:
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not os.access(binary, os.X_OK):
            pytest.fail(f"{binary} not found: scripts/test installs it"
                        " (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900", "--lang=en-US", "--no-first-run",
                "--disable-extensions", "--disable-background-networking"):
        options.add_argument(arg)
    options.enable_bidi = True  # WebDriver BiDi: a user context of its own for each test
    # The system chromedriver, named: Selenium Manager never looks for (or downloads) one.
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    # A chromedriver that hangs fails the command (urllib3's error) rather than every later
    # test of this process (no timeout by default): the browser is then replaced.
    driver.command_executor.client_config.timeout = COMMAND_TIMEOUT
    return driver


#: How long a WebDriver command's request may take (seconds): page loads time out first
#: (20 s). To a chromedriver that hangs, a POST fails after it, a GET after four times it
#: (urllib3 tries a GET three times more): within the test's timeout either way.
COMMAND_TIMEOUT = 30
#: What a browser that no longer answers raises: a WebDriver error, or a command's HTTP
#: request that failed or timed out (urllib3's, retries spent).
DEAD_BROWSER = (WebDriverException, urllib3.exceptions.HTTPError)


#: The worker's one Chromium (see :func:`shared_chromium`), once started.
_CHROMIUM: list[webdriver.Chrome] = []


@pytest.fixture(scope="session")
def shared_chromium() -> Iterator[webdriver.Chrome]:
    """One headless Chromium for the browser tests of this process (started and stopped
    for each test it took seconds of a loaded host each time); a test uses it only inside
    :func:`own_context`. Kept in ``_CHROMIUM``: a module that imports this fixture gets a
    fixture of its own, and the one browser."""
    if not _CHROMIUM:
        _CHROMIUM.append(chromium())
    yield _CHROMIUM[0]
    if _CHROMIUM:
        driver = _CHROMIUM.pop()
        # Chromium closed, then chromedriver stopped, which closes the BiDi socket from its
        # side: closed from this side first, the socket's reader went on waiting on it, and
        # quit() with it (10 s each time).
        # Each step whatever came of the one before (chromedriver stopped in any case).
        with contextlib.suppress(*DEAD_BROWSER):
            driver.execute(Command.QUIT)
        with contextlib.suppress(Exception):
            driver.service.stop()
        with contextlib.suppress(Exception):
            driver.quit()


@contextlib.contextmanager
def own_context(driver: webdriver.Chrome) -> Iterator[webdriver.Chrome]:
    """A tab in a user context of its own (as a fresh browser profile: no cookie, storage,
    theme or emulated media or viewport of an earlier test), the driver switched to it;
    the context removed afterwards, with its tabs. A browser that no longer answers
    (crashed or hung in an earlier test: a command failed or timed out) is replaced first,
    for the tests after it too."""
    driver = _CHROMIUM[0] if _CHROMIUM else driver  # the replacement, if any
    try:
        home = driver.current_window_handle
    except DEAD_BROWSER:
        with contextlib.suppress(Exception):
            driver.quit()  # (chromedriver stopped, even if the browser does not answer)
        driver = chromium()
        _CHROMIUM[:] = [driver]
        home = driver.current_window_handle
    context = driver.browser.create_user_context()
    try:
        driver.switch_to.window(driver.browsing_context.create(type="tab",
                                                               user_context=context))
        driver.set_page_load_timeout(20)
        yield driver
    finally:
        with contextlib.suppress(*DEAD_BROWSER):
            driver.browser.remove_user_context(context)
        with contextlib.suppress(*DEAD_BROWSER):
            driver.switch_to.window(home)


@pytest.fixture
def browser(live_server: Any, shared_chromium: webdriver.Chrome,
            request: pytest.FixtureRequest) -> Iterator[Admin]:
    """The operator's browser on the live server; screenshots of the test's pages in
    ARTIFACTS (emptied first), and of the page it failed on."""
    if ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    ARTIFACTS.mkdir(parents=True)
    with own_context(shared_chromium) as driver:
        admin = Admin(driver, live_server.url, ARTIFACTS)
        failed = request.session.testsfailed
        try:
            yield admin
            if request.session.testsfailed > failed:  # the test's report is in by now
                with contextlib.suppress(WebDriverException):
                    admin.shot("failed-here")
        finally:
            sys.stdout.write(f"screenshots: {ARTIFACTS}\n")


@pytest.fixture
def site_settings(settings: Any) -> Any:
    """The project's timezone off UTC, and the admin's own CSS served by the live server
    (the test site has no staticfiles app: the server serves STATIC_ROOT). Passwords
    hashed with a fast hasher (Django's default, made slow on purpose, took a second of a
    loaded host for each user made and each login)."""
    import django

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.TIME_ZONE = ZONE
    settings.STATIC_ROOT = str(Path(django.__file__).parent / "contrib/admin/static")
    return settings


def test_an_operator_runs_an_entry_now_and_sees_it_done(
        server: RedisServer, browser: Admin, site_settings: Any, tmp_path: Path) -> None:
    from django.conf import settings
    from django.contrib.auth.models import User

    started = time.monotonic()
    seed_settled_epoch(server, PREFIX)  # the beat claims at its first heartbeat
    User.objects.create_superuser(USER, "", PASSWORD)
    nightly = CrontabSchedule.objects.create(minute="0", hour="3", timezone=ZONE)
    PeriodicTask.objects.create(name="nightly-report", task=TASK, crontab=nightly)
    every = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(name="every-1s", task=TASK, interval=every)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.djangosite.settings",
        "BC_DJANGO_DB_NAME": settings.DATABASES["default"]["NAME"],
        "BC_REDIS_URL": server.url,
        "BC_BROKER_URL": server.broker_url(),
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    store = RedisStore.from_url(server.url, PREFIX)
    # The admin (this process) reads what the beat uses: the same store, prefix and rows.
    with site_app(server.url, server.broker_url(), beat_claims_key_prefix=PREFIX,
                  beat_claims_heartbeat_interval=1.0, beat_scheduler=DATABASE_SCHEDULER), \
            site(env, tmp_path) as fleet:
        fleet.beat()
        fleet.worker(concurrency=1)
        browser.login(USER, PASSWORD)

        browser.open_entries(until="nightly-report")
        browser.shot("entries")
        assert browser.hidden_buttons() == []
        browser.open_entry("nightly-report")
        browser.shot("entry")
        browser.press_run_now()
        assert any("Triggered a run of nightly-report" in m for m in browser.messages()), \
            browser.messages()
        browser.shot("run-now")
        [manual] = [r for r in store.history("nightly-report") if r.manual]
        run = browser.wait_for_run("done", 30, manual=True)
        browser.shot("run-done")

        # The time: the project's timezone, one line, the exact UTC instant in its title.
        assert run["due"] == iso(manual.due)
        local = datetime.fromtimestamp(manual.due / 1000, timezone.utc).astimezone(
            ZoneInfo(ZONE))
        assert run["due_text"] == f"{date_format(local, 'DATE_FORMAT')}, {local:%H:%M:%S}"
        shown = browser.times()
        assert shown and all(t["lines"] == 1 and re.fullmatch(ISO_UTC, t["title"])
                             for t in shown), shown

        # Every state's label, in the runs table, in each of the admin's themes.
        browser.with_every_state()
        measured = browser.readable_labels("every-state")
        sys.stdout.write("".join(f"contrast {theme}: " + ", ".join(
            f"{s}={found[s]:.2f}" for s in STATES) + "\n" for theme, found in measured.items()))
        assert all(set(STATES) <= set(found) for found in measured.values()), measured

        # Paused from its page, with a note: shown paused in the list (who, note, since
        # when), its label as readable as the others; resumed from the list.
        browser.theme("light", "light")
        browser.press_pause("deploy in progress")
        assert any("Paused nightly-report" in m for m in browser.messages()), \
            browser.messages()
        browser.shot("entry-paused")
        assert browser.hidden_buttons() == []
        [info] = store.entries(["nightly-report"])
        assert info.paused is not None and info.paused.by == f"admin:{USER}"
        browser.open_entries(until="nightly-report")
        assert browser.last_run("nightly-report") == "done"
        paused = browser.paused("nightly-report")
        assert paused is not None, "not shown paused"
        assert (paused["label"], paused["since"]) == ("paused", iso(info.paused.at))
        assert paused["text"].startswith(f"paused by admin:{USER} since ")
        assert paused["text"].endswith("deploy in progress”"), paused
        assert all(t["lines"] == 1 for t in browser.times()), [
            t for t in browser.times() if t["lines"] != 1]
        assert browser.hidden_buttons() == []
        browser.with_a_claim()
        assert browser.hidden_buttons() == []
        browser.shot("entries-paused-widest")
        browser.driver.refresh()
        measured = browser.readable_labels("entries-paused")
        assert all("paused" in found for found in measured.values()), measured
        browser.press_resume("nightly-report")
        assert any("Resumed nightly-report" in m for m in browser.messages()), \
            browser.messages()
        assert browser.paused("nightly-report") is None
        browser.shot("entries-resumed")
        assert store.entries(["nightly-report"])[0].paused is None

        # every-1s paused from the list for a while: its occurrences are skipped (paused).
        # Resumed, then what was skipped is backfilled from its page, the range copied
        # from the times' titles (since when it was paused, when it was resumed): each of
        # those occurrences runs once, a manual run shown done.
        browser.press_pause("maintenance window", "every-1s")
        since = browser.paused("every-1s")
        assert since is not None, "every-1s not shown paused"

        def skipped_while_paused() -> list[int]:
            paused_at = parse_instant(since["since"], "since")
            found = sorted(r.due for r in store.history("every-1s")
                           if r.reason is Reason.PAUSED and r.due >= paused_at)
            return found if len(found) >= 2 else []

        skipped = wait_for(skipped_while_paused, 20, "two occurrences of every-1s skipped"
                           " while paused", interval=0.2)
        browser.press_resume("every-1s")
        assert browser.paused("every-1s") is None
        browser.open_entry("every-1s")
        shown = browser.reload_until(lambda: [r for r in browser.runs() if r["state"] ==
                                              "skipped" and r["detail"] == "paused"],
                                     10, "the runs skipped while paused")
        assert {r["due"] for r in shown} >= {iso(due) for due in skipped}
        browser.shot("entry-skipped-while-paused")
        # A refusal first, as an operator may type: said beside the form, nothing done.
        browser.press_backfill("yesterday", browser.resumed_at())
        assert any("From='yesterday': not an instant" in e for e in browser.errors()), \
            browser.errors()
        browser.shot("backfill-refused")
        browser.press_backfill(since["since"], browser.resumed_at())
        said = next((m for m in browser.messages() if "Backfill of every-1s" in m), "")
        created = re.search(r"created (\d+) run\(s\)", said)
        assert created and int(created[1]) >= len(skipped), browser.messages()
        browser.shot("backfilled")
        for due in skipped:
            browser.wait_for_run("done", 30, manual=True, due=iso(due))
        browser.shot("backfill-done")
        runs = store.history("every-1s")
        assert all(r.manual and r.requested_by == f"admin:{USER}" and r.state is RunState.DONE
                   for r in runs if r.due in skipped), runs
        assert len({r.due for r in runs}) == len(runs)  # one run an occurrence
        stop(fleet)
    assert all(p.stat().st_size > 0 for p in browser.taken), browser.taken
    sys.stdout.write(f"took {time.monotonic() - started:.1f} s\n")


def stop(fleet: Fleet) -> None:
    """Every process asked to stop at once, then waited for (not one after another)."""
    for proc in fleet.procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in fleet.procs:
        proc.wait(20)
