"""Celery's own ``beat_*`` settings: each honoured, mapped onto a beat-claims policy, or
named at start in one line when set to a value beat-claims does not apply as Celery would.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from celery.schedules import crontab, schedule

from beat_claims import schedule_words
from beat_claims.catch_up import plan
from beat_claims.celery_settings import not_applied, start_line
from beat_claims.enums import Reason
from beat_claims.runs import RunState
from beat_claims.scheduler import Scheduler
from beat_claims.settings import ConfigurationError, Policy, Settings
from beat_claims.stores.base import EntrySeed
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer, free_port, seed_settled_epoch
from .processes import fleet, wait_for
from .test_settings_and_policies import make_app

START_LINE = "Celery settings not applied as Celery would"
NOW = 10_000_000_000
GRACE = 2_000


def cron_policy(deadline: float) -> Policy:
    """The policy of a crontab entry without claims, under Celery's deadline."""
    return Settings.from_app(make_app(beat_cron_starting_deadline=deadline)).policy_for(
        "c", None, crontab())


# -- the mapping, unit by unit -------------------------------------------------------------
def test_cron_starting_deadline_is_the_catch_up_window_of_crontab_entries_alone() -> None:
    s = Settings.from_app(make_app(beat_cron_starting_deadline=300))
    assert s.policy_for("nightly", None, crontab(minute="0", hour="3")).catch_up_window == 300
    # Celery applies it to crontab entries alone: an interval entry keeps the default.
    assert s.policy_for("often", None, schedule(timedelta(minutes=5))).catch_up_window is None
    assert s.policy_for("unknown", None).catch_up_window is None
    # An entry's own claims override it, key by key.
    assert s.policy_for("n", {"catch_up": "all"}, crontab()).catch_up_window == 300
    assert s.policy_for("n", {"catch_up_window": 60}, crontab()).catch_up_window == 60


def test_a_crontab_run_missed_longer_than_the_deadline_is_skipped_a_newer_one_runs() -> None:
    """Celery's deadline, as beat-claims plans it: the newest missed run within the deadline
    runs; older ones are recorded skipped (Celery would drop them without a word)."""
    policy = cron_policy(300)
    stale, within = NOW - 400_000, NOW - 100_000
    decided = plan(policy, [stale, within], 2, NOW, GRACE, 100)
    assert decided.run == [within]
    assert decided.skip == [(stale, Reason.CATCH_UP_WINDOW)]
    decided = plan(policy, [stale], 1, NOW, GRACE, 100)
    assert decided.run == [] and decided.skip == [(stale, Reason.CATCH_UP_WINDOW)]


def test_a_deadline_of_0_skips_every_missed_crontab_run_but_not_an_on_time_one() -> None:
    policy = cron_policy(0)
    late, on_time = NOW - 60_000, NOW - 500
    decided = plan(policy, [late, on_time], 2, NOW, GRACE, 100)
    assert decided.run == [on_time]
    assert decided.skip == [(late, Reason.CATCH_UP_WINDOW)]


@pytest.mark.parametrize("value", [-1, "soon", True, float("nan")])
def test_a_bad_deadline_fails_at_start_naming_the_setting(value: object) -> None:
    with pytest.raises(ConfigurationError) as err:
        Settings.from_app(make_app(beat_cron_starting_deadline=value))
    assert "beat_cron_starting_deadline" in str(err.value) and repr(value) in str(err.value)


@pytest.mark.parametrize("value", [-1, "soon", True, float("nan")])
def test_a_bad_max_loop_interval_fails_at_start_naming_the_setting(value: object) -> None:
    """Celery's loop sleeps only for a positive interval: a negative one would make the beat
    tick without sleeping, forever; a word would fail later, far from the setting."""
    with pytest.raises(ConfigurationError) as err:
        Scheduler(app=make_app(beat_max_loop_interval=value)).close()
    assert "beat_max_loop_interval" in str(err.value) and repr(value) in str(err.value)
    with pytest.raises(ConfigurationError) as err:  # celery beat --max-interval
        Scheduler(app=make_app(), max_interval=value).close()
    assert "max_interval" in str(err.value) and repr(value) in str(err.value)


def test_beat_claims_catch_up_window_wins_over_the_deadline_and_that_is_named() -> None:
    conf = {"beat_cron_starting_deadline": 300, "beat_claims_catch_up_window": 600}
    app = make_app(**conf)
    s = Settings.from_app(app)
    assert s.policy_for("c", None, crontab()).catch_up_window == 600
    [note] = not_applied(app.conf, s)
    assert "beat_cron_starting_deadline=300" in note and "beat_claims_catch_up_window" in note


def test_defaults_and_honoured_values_are_not_named() -> None:
    for conf in ({}, {"beat_max_loop_interval": 5}, {"beat_cron_starting_deadline": 60},
                 {"beat_schedule_filename": "celerybeat-schedule"}, {"beat_sync_every": 0}):
        app = make_app(**conf)
        assert not_applied(app.conf, Settings.from_app(app)) == [], conf
    assert start_line([]) is None


def test_each_setting_not_applied_is_named_with_its_value_in_one_line() -> None:
    app = make_app(beat_max_loop_interval=60, beat_sync_every=10,
                   beat_schedule_filename="/var/run/celerybeat-schedule")
    notes = not_applied(app.conf, Settings.from_app(app))
    line = start_line(notes)
    assert line is not None and "\n" not in line, line
    for said in ("beat_max_loop_interval=60", "beat_sync_every=10",
                 "beat_schedule_filename='/var/run/celerybeat-schedule'"):
        assert said in line, line
    # What ``celery beat`` passes the scheduler (its -s and --max-interval) is named too.
    app = make_app()
    notes = not_applied(app.conf, Settings.from_app(app), schedule_filename="elsewhere",
                        max_interval=30)
    assert [n.split(" ")[0] for n in notes] == ["beat_max_loop_interval=30",
                                                "beat_schedule_filename='elsewhere'"]


# -- real beats -----------------------------------------------------------------------------
@pytest.mark.integration
def test_a_beat_honours_beat_cron_starting_deadline_for_crontab_entries(
        server: RedisServer, tmp_path: Path) -> None:
    """Every beat was down for two hours. Of two hourly crontab entries, the one whose last
    occurrence is older than the deadline (five minutes) is skipped, the other runs; an
    interval entry whose last occurrence is older still runs, as with Celery (the deadline
    is for crontab entries). The deadline is honoured, so the beat names no setting."""
    seed_settled_epoch(server)
    store = RedisStore.from_url(server.url, "beat-claims")
    now = datetime.now(timezone.utc)
    if now.second > 50:  # (the minutes below are computed from this minute)
        time.sleep(61 - now.second)
        now = datetime.now(timezone.utc)
    schedule = {"stale": {"cron": str((now.minute - 10) % 60)},   # 10-11 min ago
                "recent": {"cron": str((now.minute - 2) % 60)},   # 2-3 min ago
                "hourly": {"every": 3600}}
    anchor = int(now.timestamp() * 1000) - 2 * 3_600_000
    store.register([
        EntrySeed("stale", schedule_words.describe(crontab(minute=schedule["stale"]["cron"])),
                  anchor),
        EntrySeed("recent", schedule_words.describe(crontab(minute=schedule["recent"]["cron"])),
                  anchor),
        EntrySeed("hourly", "every 3600s", anchor - 20 * 60_000),  # last due 20 min ago
    ])
    conf = json.dumps({"beat_cron_starting_deadline": 300})
    with fleet(server.url, server.broker_url(), tmp_path, schedule, BC_CONF=conf) as f:
        beat = f.beat()

        def settled() -> bool:  # two occurrences of each decided: skipped, or sent
            unsettled = (RunState.DUE, RunState.WAITING, RunState.CLAIMED, RunState.SENDING)
            return all(len(h) >= 2 and not any(r.state in unsettled for r in h)
                       for h in (store.history(name) for name in schedule))

        wait_for(settled, 30, "every entry's missed occurrences to be decided")
        log = f.log(beat)
    runs = {name: sorted(store.history(name), key=lambda r: r.due) for name in schedule}
    shown = {name: [(r.state.value, r.reason) for r in rs] for name, rs in runs.items()}
    # "stale": both missed occurrences older than the deadline: skipped, none sent.
    assert {(r.state, r.reason) for r in runs["stale"]} == {
        (RunState.SKIPPED, Reason.CATCH_UP_WINDOW)}, shown
    # "recent": the newest (2-3 min ago) sent; the one an hour before skipped.
    *older, newest = runs["recent"]
    assert newest.state in (RunState.SENT, RunState.STARTED, RunState.DONE), shown
    assert {(r.state, r.reason) for r in older} == {
        (RunState.SKIPPED, Reason.CATCH_UP_WINDOW)}, shown
    # "hourly": an interval entry; its newest missed occurrence (20 min ago) is sent.
    *older, newest = runs["hourly"]
    assert newest.state in (RunState.SENT, RunState.STARTED, RunState.DONE), shown
    assert {r.reason for r in older} == {Reason.CATCH_UP}, shown
    assert START_LINE not in log, log


@pytest.mark.integration
def test_a_beat_sleeps_at_most_beat_max_loop_interval_even_while_its_store_is_down(
        server: RedisServer, tmp_path: Path) -> None:
    """The store never answers: the beat retries it with a backoff that grows to the
    heartbeat interval (5 s), yet wakes every beat_max_loop_interval (1 s), as Celery's
    setting says (the tests' app sets it to 1)."""
    down = f"redis://127.0.0.1:{free_port()}/0"
    conf = json.dumps({"beat_claims_url": down})
    with fleet(server.url, server.broker_url(), tmp_path, {"e": {"every": 1}},
               BC_CONF=conf, BC_HEARTBEAT="5") as f:
        beat = f.beat(loglevel="DEBUG")
        f.wait_log(beat, "store unreachable")
        started = time.monotonic()
        wait_for(lambda: time.monotonic() - started > 9 and "Waking up" in f.log(beat), 20,
                 "nine seconds of the outage")
        log = f.log(beat)
    sleeps = [float(n) * (60 if unit.startswith("minute") else 1)
              for n, unit in re.findall(r"Waking up in ([\d.]+) (second|minute)", log)]
    assert sleeps, log[-3000:]
    assert max(sleeps) <= 1.0, f"sleeps longer than beat_max_loop_interval: {sleeps}"
    assert START_LINE not in log


@pytest.mark.integration
def test_a_beat_names_the_celery_settings_it_does_not_apply_in_one_start_line(
        server: RedisServer, tmp_path: Path) -> None:
    conf = json.dumps({"beat_sync_every": 10, "beat_max_loop_interval": 30})
    with fleet(server.url, server.broker_url(), tmp_path, {"e": {"every": 1}},
               BC_CONF=conf) as f:
        named = f.beat("--schedule", str(tmp_path / "celerybeat-schedule-here"))
        plain = f.beat()
        default = f.beat(BC_CONF="{}")  # Celery's defaults (the tests' app's own settings)
        for beat in (named, plain, default):
            f.wait_log(beat, "entries registered; claiming")
        named_log, plain_log, default_log = f.log(named), f.log(plain), f.log(default)
    lines = [line for line in named_log.splitlines() if START_LINE in line]
    assert len(lines) == 1, named_log
    [line] = lines
    assert "WARNING" in line
    for said in ("beat_sync_every=10", "beat_max_loop_interval=30",
                 f"beat_schedule_filename='{tmp_path / 'celerybeat-schedule-here'}'"):
        assert said in line, line
    # Without --schedule, the other beat names the two settings alone.
    [other] = [line for line in plain_log.splitlines() if START_LINE in line]
    assert "beat_schedule_filename" not in other and "beat_sync_every=10" in other
    assert not (tmp_path / "celerybeat-schedule-here").exists(), "no schedule file is made"
    assert START_LINE not in default_log, default_log
