"""Running beats follow the definitions in the store: a definition written there is sent
by the live beats within one heartbeat interval, without a restart (by the beat whose
share of the due index it is); a change is
followed from the change's instant; a claim a beat holds is sent with the definition it
was claimed with; a definition that is not valid is logged and the others go on; two beats
whose ``beat_schedule`` differ send one grid. Beats driven tick by tick in the test's
process, on each store (Redis, SQLite, PostgreSQL); the broker is the test's redis-server
(its db 1), whose messages are counted."""

from __future__ import annotations

import base64
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from beat_claims.cli_entries import export_doc
from beat_claims.definitions import validate
from beat_claims.entries import Entries, apply_import, plan_import
from beat_claims.entry_changes import EntryChange, apply_changes
from beat_claims.enums import Origin, Reason, RunState
from beat_claims.runs import iso
from beat_claims.scheduler import Scheduler
from beat_claims.settings import Settings
from beat_claims.stores import Store, open_store
from beat_claims.stores.base import DefinitionResult, DefinitionWrite, WriteStatus

from .conftest import RedisServer
from .inprocess import beats, joined, make, make_app, messages, run_for, settled_epoch
from .processes import wait_for
from .test_integration_fleet import claims_url

INTERVAL = 0.5  # make_app's heartbeat interval
#: A tick's time on a loaded machine, on top of the heartbeat interval.
SLACK = 0.5


@pytest.fixture(params=["redis", "sqlite", "postgres"])
def url(request: pytest.FixtureRequest, server: RedisServer, tmp_path: Path
        ) -> Iterator[str]:
    """A store of each kind that has run a while (a settled epoch): the tests here are
    about beats that run, not a new store's start, and their beats claim at once rather
    than after the new epoch's settle period (tests/inprocess.py settled_epoch)."""
    with claims_url(request.param, server, tmp_path) as found:
        settled_epoch(app(server, found))
        yield found


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    opened = open_store(Settings(url=url), timeout=5.0)
    yield opened
    opened.close()


def app(server: RedisServer, url: str, schedule: dict[str, Any] | None = None) -> Celery:
    return make_app(server, schedule or {}, beat_claims_url=url)


def configured(server: RedisServer, url: str, name: str, args: list[Any], seconds: float = 1
               ) -> Celery:
    """An app whose beat_schedule has one entry, ``name``: every ``seconds`` with ``args``."""
    return app(server, url, {name: {"task": "t.noop", "args": args,
                                    "schedule": timedelta(seconds=seconds)}})


def define(store: Store, celery_app: Celery, name: str, obj: Any,
           origin: Origin = Origin.API) -> DefinitionResult:
    """Make ``obj`` (None: delete) the entry's definition, as a writer does
    (:mod:`beat_claims.entry_changes`: the old definition's instants since the checkpoint
    recorded skipped, the checkpoint moved to the change's instant)."""
    found = store.definitions([name])
    version = found[0].version if found and not found[0].deleted else 0
    definition = validate(name, obj) if obj is not None else None
    [result] = apply_changes(store, [EntryChange(name, definition, version)], origin, "test",
                             celery_app)
    assert result.status is WriteStatus.OK, result
    return result


def sent(server: RedisServer, name: str) -> list[tuple[int, list[Any]]]:
    """(due instant in ms, args) of each message of ``name`` in the broker, oldest first."""
    out = []
    for message in messages(server):
        claims = message["claims"]
        if claims and claims["entry"] == name:
            out.append((_ms(claims["due"]), _args(server, message["id"])))
    return out


def _ms(text: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _args(server: RedisServer, task_id: str) -> list[Any]:
    for raw in server.client(db=1).lrange("celery", 0, -1):
        body = json.loads(raw)
        if body["headers"]["id"] == task_id:
            return list(json.loads(base64.b64decode(body["body"]))[0])
    raise AssertionError(task_id)


def once_each(server: RedisServer, name: str) -> list[tuple[int, list[Any]]]:
    got = sent(server, name)
    twice = {due: n for due, n in Counter(due for due, _ in got).items() if n > 1}
    assert not twice, f"sent more than once: {[(iso(d), n) for d, n in twice.items()]}"
    return got


def tick_until(schedulers: list[Scheduler], predicate: Any, timeout: float, what: str
               ) -> float:
    """Tick until ``predicate()``; the seconds it took."""
    began = time.monotonic()
    wait_for(predicate, timeout, what, interval=0.02,
             between=lambda: [s.tick() for s in schedulers])
    return time.monotonic() - began


def test_a_definition_written_in_the_store_is_taken_by_the_running_beats_within_a_heartbeat(
        server: RedisServer, url: str, store: Store) -> None:
    """The beat whose share of the due index it is takes it (the others only once it is
    late)."""
    fleet = beats(app(server, url), app(server, url))
    define(store, fleet[0].app, "dynamic", {"task": "t.noop", "schedule": {"every": 1},
                                            "args": [1]})
    took = tick_until(fleet, lambda: any("dynamic" in s.schedule for s in fleet),
                      INTERVAL + SLACK + 2, "a beat to schedule the new entry")
    assert took <= INTERVAL + SLACK, f"followed after {took:.2f}s"
    tick_until(fleet, lambda: len(sent(server, "dynamic")) >= 3, 10, "three sends")
    got = once_each(server, "dynamic")
    assert all(args == [1] for _, args in got)
    anchor = store.entries(["dynamic"])[0].anchor
    assert anchor is not None
    assert all((due - anchor) % 1000 == 0 for due, _ in got)


def test_a_change_of_interval_is_followed_from_the_change(
        server: RedisServer, url: str, store: Store) -> None:
    fleet = beats(app(server, url), app(server, url))
    define(store, fleet[0].app, "grid", {"task": "t.noop", "schedule": {"every": 1},
                                         "args": ["one"]})
    tick_until(fleet, lambda: len(sent(server, "grid")) >= 2, 10, "two sends")
    result = define(store, fleet[0].app, "grid", {"task": "t.noop", "schedule": {"every": 2},
                                                  "args": ["two"]})
    assert result.state is not None and result.state.checkpoint is not None
    changed_at = result.state.checkpoint
    took = tick_until(fleet, lambda: all(
        s.schedule["grid"].schedule.run_every.total_seconds() == 2 for s in fleet
        if "grid" in s.schedule), INTERVAL + SLACK + 2, "every beat to follow the change")
    assert took <= INTERVAL + SLACK, f"followed after {took:.2f}s"
    tick_until(fleet, lambda: sum(a == ["two"] for _, a in sent(server, "grid")) >= 2, 10,
               "two sends by the new definition")
    got = once_each(server, "grid")
    anchor = store.entries(["grid"])[0].anchor
    assert anchor is not None
    for due, args in got:
        if due <= changed_at:
            assert args == ["one"] and (due - anchor) % 1000 == 0, (iso(due), args)
        else:
            assert args == ["two"] and (due - anchor) % 2000 == 0, (iso(due), args)
    skipped = [r for r in store.history("grid") if r.state is RunState.SKIPPED]
    assert all(r.reason is Reason.CHANGED and r.due <= changed_at for r in skipped), skipped


@pytest.mark.parametrize("catch_up", ["latest", "none"])
def test_a_one_off_entry_created_after_its_instant_is_a_missed_occurrence(
        server: RedisServer, url: str, store: Store, catch_up: str) -> None:
    """A clocked instant that passed before the entry was created (its writer was slow, or
    no beat ran) is judged by the catch-up policy: ``latest`` sends it once, late, as
    django-celery-beat and RedBeat do; ``none`` records it skipped. Never silently
    nothing."""
    fleet = beats(app(server, url), app(server, url))
    at = fleet[0].clock.now() - 5_000
    define(store, fleet[0].app, "late", {"task": "t.noop", "schedule": {"clocked": iso(at)},
                                         "args": ["late"], "claims": {"catch_up": catch_up}})
    assert [d.name for d in store.due(fleet[0].clock.now(), 10)] == ["late"], \
        "a one-off entry created after its instant is indexed due"
    tick_until(fleet, lambda: any(r.due == at and r.state in (RunState.SENT, RunState.SKIPPED)
                                  for r in store.history("late")), 10,
               "the missed occurrence to be judged")
    run_for(1.5, *fleet)
    [run] = store.history("late")
    assert run.due == at
    if catch_up == "latest":
        assert run.state is RunState.SENT, run
        assert [due for due, _ in once_each(server, "late")] == [at]
    else:
        assert run.state is RunState.SKIPPED and run.reason is Reason.CATCH_UP, run
        assert sent(server, "late") == []
    assert not store.due(fleet[0].clock.now() + 60_000, 10), "nothing more is due"


def test_an_edit_to_a_one_off_instant_already_past_takes_effect_from_the_change(
        server: RedisServer, url: str, store: Store) -> None:
    """An edit counts from its own instant, whatever the schedule: an instant it sets that
    already passed is not sent (only an entry created after its instant has missed it)."""
    fleet = beats(app(server, url), app(server, url))
    now = fleet[0].clock.now()
    spec = {"task": "t.noop", "args": ["edited"]}
    define(store, fleet[0].app, "moved", {**spec, "schedule": {"clocked": iso(now + 60_000)}})
    define(store, fleet[0].app, "moved", {**spec, "schedule": {"clocked": iso(now - 5_000)}})
    run_for(1.5, *fleet)
    assert sent(server, "moved") == []
    assert not store.due(fleet[0].clock.now() + 120_000, 10), "nothing is due"


def test_a_one_off_entry_that_ran_is_not_sent_again_when_import_puts_it_back(
        server: RedisServer, url: str, store: Store) -> None:
    """``export`` then ``import`` into a store that came back empty (here: the same store
    under another prefix, empty) puts back the definitions, not what ran: the import
    counts from its own instant, as an edit does, so a one-off instant that passed (and
    ran in the store it was exported from) is not sent a second time."""
    fleet = beats(app(server, url), app(server, url))
    at = fleet[0].clock.now() + 1_000
    define(store, fleet[0].app, "once", {"task": "t.noop", "schedule": {"clocked": iso(at)},
                                         "args": ["once"]})
    tick_until(fleet, lambda: [due for due, _ in sent(server, "once")] == [at], 10,
               "the one-off entry to be sent")
    exported = [export_doc(e.name, e.definition) for e in Entries(fleet[0].app, store).iterate()
                if e.definition is not None]
    for s in fleet:
        s.close()

    empty = app(server, url)
    empty.conf.beat_claims_key_prefix = "came-back-empty"
    with Entries(empty) as entries:
        plan = plan_import(entries, exported)
        assert [name for name, _ in plan.create] == ["once"], plan
        assert [r.error for r in apply_import(entries, plan)] == [None]
        assert not entries.store.due(fleet[0].clock.now() + 60_000, 10), \
            "the one-off instant that passed is indexed as not due"
    again = beats(empty)
    run_for(1.5 + 2 * INTERVAL, *again)
    assert [due for due, _ in once_each(server, "once")] == [at]


@pytest.mark.parametrize("how", ["disabled", "deleted"])
def test_a_claim_held_when_its_entry_is_disabled_or_deleted_keeps_its_definition(
        server: RedisServer, url: str, store: Store, how: str) -> None:
    beat = make(app(server, url))
    spec = {"task": "t.noop", "schedule": {"every": 1}, "args": ["old"]}
    define(store, beat.app, "held", spec)
    tick_until([beat], lambda: len(sent(server, "held")) >= 1, 10, "a first send")
    # Claimed ahead and not yet sent: held by the beat when the change comes.
    wait_for(lambda: (beat.claimer.next_due() or 0) <= beat.clock.now(), 5,
             "the next occurrence to be due")
    now = beat.clock.now()
    due = beat.claimer.pop_due(now)
    fresh, _ = beat.claimer.claim(due, now)
    for name in due:
        beat.claimer.push(name)
    assert [c.entry for c in fresh] == ["held"], fresh
    [claim] = fresh
    define(store, beat.app, "held", None if how == "deleted"
           else {**spec, "enabled": False, "args": ["new"]})
    beat.liveness.last -= INTERVAL  # the next tick heartbeats: it reads the change first
    beat.tick()
    assert "held" not in beat.schedule
    tick_until([beat], lambda: claim.due in dict(sent(server, "held")), 5,
               "the held claim to be sent")
    assert dict(sent(server, "held"))[claim.due] == ["old"]
    run_for(2.5, beat)
    got = once_each(server, "held")
    assert max(due for due, _ in got) == claim.due, [iso(d) for d, _ in got]
    assert not beat.pinned


def test_a_definition_that_is_not_valid_is_logged_and_the_others_go_on(
        server: RedisServer, url: str, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    fleet = beats(app(server, url))
    bad = json.dumps({"task": "t.noop", "schedule": {"every": -1}, "args": ["s3cr3t-arg"]})
    store.write_definitions([DefinitionWrite("bad", bad, 0, Origin.API, "test")])
    define(store, fleet[0].app, "good", {"task": "t.noop", "schedule": {"every": 1}})
    tick_until(fleet, lambda: len(sent(server, "good")) >= 2, 10, "the valid entry's sends")
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    named = [e for e in errors if "'bad'" in e and "schedule.every" in e]
    assert len(named) == 1, errors
    assert "s3cr3t" not in caplog.text
    assert "bad" not in fleet[0].schedule and not sent(server, "bad")


def test_two_beats_with_different_beat_schedules_send_the_stored_grid_and_warn(
        server: RedisServer, url: str, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    first = make(configured(server, url, "rolling", ["old"]))
    tick_until([first], lambda: len(sent(server, "rolling")) >= 1, 10, "a first send")
    second = joined(configured(server, url, "rolling", ["new"], 2), first)
    changed = store.definitions(["rolling"])[0]
    assert changed.origin is Origin.CONFIG and changed.changed_by == second.owner.id
    changed_at = store.entries(["rolling"])[0].checkpoint
    assert changed_at is not None
    tick_until([first, second], lambda: sum(
        a == ["new"] for _, a in sent(server, "rolling")) >= 3, 15, "three sends by the"
               " stored definition")
    got = once_each(server, "rolling")
    anchor = store.entries(["rolling"])[0].anchor
    assert anchor is not None
    for due, args in got:
        if due > changed_at:
            assert args == ["new"] and (due - anchor) % 2000 == 0, (iso(due), args)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and "'rolling'" in r.getMessage() and "differs" in r.getMessage()]
    assert len(warnings) == 1 and second.owner.id in warnings[0], warnings


def test_a_beat_whose_beat_schedule_differs_is_shown_by_status_and_health(
        server: RedisServer, url: str, store: Store) -> None:
    from beat_claims import health, inspect

    first = make(configured(server, url, "rolling", ["old"]))
    second = joined(configured(server, url, "rolling", ["new"], 2), first)
    tick_until([first, second], lambda: first.liveness.owner.schedule_differs == (
        "rolling",), 5, "the first beat to report that its beat_schedule differs")
    first.liveness.last -= INTERVAL  # heartbeat now: the store holds what it reports
    first.tick()
    operator = app(server, url)  # an operator's app: beat_schedule without the entry
    doc = inspect.status(operator, store=store, schedules={})
    [entry] = [e for e in doc["entries"] if e["name"] == "rolling"]
    assert entry["in_schedule"] is True, entry  # live beats schedule it: not "(removed)"
    assert entry["definition"]["origin"] == "config"
    assert entry["definition"]["changed_by"] == second.owner.id
    here = f"{first.owner.host}:{first.owner.pid}"
    assert entry["beat_schedule_differs_in"] == [here], entry
    assert entry["next_due"] is not None
    from beat_claims.cli import status_table
    table = status_table(doc)
    assert "WARNING: 1 entry(ies) defined otherwise in the beat_schedule of live beats" \
        in table and f"rolling in {here}" in table, table
    [row] = [line for line in table.splitlines() if line.startswith("rolling ")]
    assert "DIFFERS in 1 beat(s)" in row, table
    settings = Settings.from_app(operator)
    report = health.fleet(store, {}, {}, settings.policy, 30.0)
    [check] = [c for c in report.checks if c.name == "schedules"]
    assert not check.ok and "rolling" in check.detail and [
        i["id"] for i in check.items] == [first.owner.id], check


def test_a_dynamic_definition_shadows_a_beat_schedule_entry_of_the_same_name(
        server: RedisServer, url: str, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    beat = make(configured(server, url, "both", ["config"]))
    assert store.definitions(["both"])[0].origin is Origin.CONFIG
    tick_until([beat], lambda: len(sent(server, "both")) >= 1, 10, "a first send")
    result = define(store, beat.app, "both", {"task": "t.noop", "schedule": {"every": 1},
                                              "args": ["dynamic"]})
    assert result.state is not None and result.state.checkpoint is not None
    tick_until([beat], lambda: any(a == ["dynamic"] for _, a in sent(server, "both")), 10,
               "a send by the dynamic definition")
    shadowed = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and "shadowed by a dynamic entry" in r.getMessage()]
    assert len(shadowed) == 1 and "'both'" in shadowed[0], shadowed
    for due, args in once_each(server, "both"):
        assert args == (["config"] if due <= result.state.checkpoint else ["dynamic"])
    # A beat started now does not overwrite it.
    again = joined(configured(server, url, "both", ["config"]), beat)
    assert store.definitions(["both"])[0].origin is Origin.API
    assert again.schedule["both"].args == ["dynamic"]


def test_an_entry_that_cannot_be_stored_stays_the_beats_own_with_one_warning(
        server: RedisServer, url: str, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    from celery.beat import BeatLazyFunc

    caplog.set_level(logging.INFO)
    beat = make(configured(server, url, "lazy", [BeatLazyFunc(str)]))
    tick_until([beat], lambda: len(sent(server, "lazy")) >= 2, 10, "two sends")
    assert store.definitions(["lazy"]) == []
    warned = [r.getMessage() for r in caplog.records if "cannot be shared" in r.getMessage()]
    assert len(warned) == 1 and "'lazy'" in warned[0], warned


def test_a_config_definition_is_sent_only_by_the_beats_whose_beat_schedule_has_it(
        server: RedisServer, url: str, store: Store) -> None:
    entry = {"task": "t.noop", "schedule": timedelta(seconds=1)}
    with_it = make(app(server, url, {"configured": entry}))
    without = joined(app(server, url, {"other": entry}), with_it)
    run_for(1.5, with_it, without)
    assert "configured" in with_it.schedule and "configured" not in without.schedule
    assert {d.name for d in store.definitions(["configured", "other"])} == {
        "configured", "other"}
    with_it.close()  # the last beat with the entry stops: nobody sends it
    time.sleep(0.3)
    stopped_at = store.now()
    run_for(2.5, without)
    assert not [iso(d) for d, _ in sent(server, "configured") if d > stopped_at]
    assert any(d > stopped_at for d, _ in sent(server, "other"))


def test_a_store_that_lost_the_beat_schedule_definitions_gets_them_again(
        server: RedisServer) -> None:
    beat = make(configured(server, server.url, "kept", ["a"]))
    store = open_store(Settings(url=server.url), timeout=5.0)
    assert [d.origin for d in store.definitions(["kept"])] == [Origin.CONFIG]
    server.client().flushdb()  # the store's database (the broker's is another)
    tick_until([beat], lambda: [d.origin for d in store.definitions(["kept"])] == [
        Origin.CONFIG], 15, "the definition written again")
    tick_until([beat], lambda: len(sent(server, "kept")) >= 2, 15, "sends after the wipe")
    once_each(server, "kept")


def test_a_stored_definition_that_cannot_be_read_is_logged_once_and_the_others_go_on(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    from beat_claims.stores.redis import RedisStore

    caplog.set_level(logging.INFO)
    store = open_store(Settings(url=server.url), timeout=5.0)
    assert isinstance(store, RedisStore)
    celery_app = app(server, server.url)
    define(store, celery_app, "broken", {"task": "t.noop", "schedule": {"every": 1},
                                         "args": ["s3cr3t-arg"]})
    define(store, celery_app, "fine", {"task": "t.noop", "schedule": {"every": 1}})
    # The record's definition is no longer JSON (a bad restore, a hand edit).
    server.client().hset(store.entry_keys("broken")[0], "definition", '["s3cr3t-arg"')
    assert store.definitions(["broken"])[0].corrupt
    beat = make(celery_app)
    tick_until([beat], lambda: len(sent(server, "fine")) >= 2, 10, "the other entry's sends")
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    named = [e for e in errors if "'broken'" in e and "definition" in e]
    assert len(named) == 1, errors
    assert "s3cr3t" not in caplog.text
    assert "broken" not in beat.schedule and not sent(server, "broken")


def test_a_definition_made_again_at_the_same_version_after_a_wipe_is_sent_as_it_is_now(
        server: RedisServer) -> None:
    """The store lost everything and the entry was created again (an import, an operator):
    its version is 1 again, with another definition. The beat sends the one the store holds,
    never the one it read before the wipe under the same version."""
    beat = make(app(server, server.url))
    store = open_store(Settings(url=server.url), timeout=5.0)
    define(store, beat.app, "again", {"task": "t.noop", "schedule": {"every": 1},
                                      "args": ["before"]})
    tick_until([beat], lambda: len(sent(server, "again")) >= 1, 10, "a send before the wipe")
    server.client().flushdb()  # the store's database (the broker's is another)
    assert define(store, beat.app, "again", {"task": "t.noop", "schedule": {"every": 1},
                                             "args": ["after"]}).version == 1
    wiped_at = store.now()
    tick_until([beat], lambda: len([d for d, _ in sent(server, "again") if d > wiped_at]) >= 2,
               15, "sends after the wipe")
    late = [(iso(d), args) for d, args in sent(server, "again") if d > wiped_at]
    assert all(args == ["after"] for _, args in late), late
    store.close()
