"""Entries at run time through the Python API (``Entries``), on every store: each change a
compare-and-set on the version its caller read (a stale one refused, nothing written);
a change takes effect at the store's clock and records the old definition's occurrences it
skips (changed, or disabled; at most the history limit of them), leaving what a beat
claimed as it is; a bulk goes in a bounded number of round trips; a write whose reply was
lost, sent again, answers what it did; bad input is refused naming the field; an entry
defined in beat_schedule is changed there."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab, solar

from beat_claims.definitions import Cron, DefinitionError, Every, validate
from beat_claims.entries import (
    DefinedInBeatSchedule,
    Entries,
    EntryExists,
    NoSuchEntry,
    StaleVersion,
    apply_import,
    plan_import,
)
from beat_claims.entry_changes import EntryChange, apply_changes
from beat_claims.enums import Origin, Reason, RunState
from beat_claims.runs import Run, to_ms
from beat_claims.stores.base import DefinitionWrite, EntrySeed, Store, WriteStatus
from beat_claims.stores.postgres import PostgresStore
from beat_claims.stores.redis import RedisStore, function_name

from .conftest import RedisServer
from .contract.backend import Backend
from .contract.backend_postgres import PORT, address, fresh_store
from .contract.conftest import BACKENDS
from .contract.helpers import A, after, claim
from .faults import proxy

#: The stores the API is proven on.
STORES = ("postgres", "redis", "sqlite")
#: An interval short enough that a test sees several of its occurrences go by (seconds).
FAST = 0.02
FAST_MS = 20


@pytest.fixture(params=STORES)
def backend(request: pytest.FixtureRequest) -> Backend:
    return BACKENDS[request.param]


@pytest.fixture
def limit() -> int:
    """The store's history limit (a test parametrizes it to change it)."""
    return 100


@pytest.fixture
def store(backend: Backend, request: pytest.FixtureRequest, limit: int) -> Iterator[Store]:
    with backend.open(request, limit) as s:
        yield s


@pytest.fixture
def app() -> Celery:
    made = Celery("entries-api", set_as_current=False)
    made.conf.timezone = "Europe/Paris"
    return made


@pytest.fixture
def entries(app: Celery, store: Store) -> Entries:
    return Entries(app, store, by="alice@ops")


def history(store: Store, name: str) -> dict[int, Run]:
    return {r.due: r for r in store.history(name, 1000)}


def skipped(store: Store, name: str) -> dict[int, Reason | None]:
    return {due: r.reason for due, r in history(store, name).items()
            if r.state is RunState.SKIPPED}


def grid(anchor: int, after_ms: int, until_ms: int, period: int = FAST_MS) -> list[int]:
    """An interval's instants in (after, until], counted from the anchor."""
    first = (max(after_ms, anchor) - anchor) // period + 1
    return [anchor + k * period for k in range(first, (until_ms - anchor) // period + 1)]


def checkpoint(store: Store, name: str) -> int | None:
    [found] = store.entries([name])
    return found.checkpoint


# -- create, update, delete ---------------------------------------------------------------
def test_an_entry_is_created_changed_deleted_and_created_again_each_with_a_version(
        entries: Entries, store: Store) -> None:
    made = entries.create("report", "proj.report", {"every": 60}, args=[1, "a"],
                          kwargs={"k": "v"}, options={"queue": "reports"},
                          claims={"catch_up": "none"}, description="the daily report")
    assert (made.name, made.version, made.origin, made.changed_by, made.enabled) == (
        "report", 1, Origin.API, "alice@ops", True)
    assert made.definition == validate("report", {
        "task": "proj.report", "schedule": {"every": 60}, "args": [1, "a"],
        "kwargs": {"k": "v"}, "options": {"queue": "reports"},
        "claims": {"catch_up": "none"}, "description": "the daily report"})
    assert entries.get("report") == made
    changed = entries.update("report", 1, schedule={"every": 30}, args=[2])
    assert changed.version == 2 and changed.definition is not None
    assert (changed.definition.schedule, changed.definition.args,
            changed.definition.kwargs) == (Every(30), (2,), {"k": "v"})
    with pytest.raises(EntryExists, match=re.escape("'report' exists (version 2)")):
        entries.create("report", "proj.other", 5)
    assert entries.delete("report") == 3
    with pytest.raises(NoSuchEntry, match=re.escape(
            "no entry 'report' in the store (deleted)")):
        entries.get("report")
    with pytest.raises(NoSuchEntry):
        entries.update("report", 3, task="proj.other")
    again = entries.create("report", "proj.report", 10)
    assert again.version == 4 and again.definition is not None
    [stored] = store.definitions(["report"])
    assert stored.definition == again.definition.to_json()


def test_a_stale_version_is_refused_naming_the_entry_and_both_versions_and_nothing_is_written(
        entries: Entries, app: Celery, store: Store) -> None:
    entries.create("report", "proj.report", 60)
    bob = Entries(app, store, by="bob@ops")
    read_by_bob = bob.get("report").version
    entries.update("report", 1, schedule=30)
    before = store.definitions(["report"])
    with pytest.raises(StaleVersion) as stale:
        bob.update("report", read_by_bob, schedule=45)
    assert str(stale.value) == (
        "entry 'report': version 1 is stale, the store holds version 2: nothing was"
        " written (read it again and edit that version)")
    assert (stale.value.expected, stale.value.current) == (1, 2)
    for refused in (lambda: bob.disable("report", read_by_bob),
                    lambda: bob.delete("report", read_by_bob)):
        with pytest.raises(StaleVersion):
            refused()
    assert store.definitions(["report"]) == before


# -- what a change skips ------------------------------------------------------------------
def test_a_change_records_the_old_definition_s_occurrences_it_skips_and_leaves_claims(
        entries: Entries, store: Store) -> None:
    """Due in (checkpoint, t] with no run: skipped, changed; the run a beat claimed keeps
    its definition; the checkpoint moves to t."""
    made = entries.create("e", "proj.t", FAST)
    [found] = store.entries(["e"])
    anchor = found.anchor
    assert anchor is not None
    held = claim(store, A, store.register([EntrySeed("e")])["e"], anchor + FAST_MS)
    assert held.status.value == "ok" and len(held.claims) == 1
    after(store, anchor + 10 * FAST_MS)
    changed = entries.update("e", made.version, schedule=FAST * 3)
    moved = checkpoint(store, "e")
    assert moved is not None and moved >= anchor + 10 * FAST_MS
    assert moved <= changed.changed_at
    expected = grid(anchor, anchor + FAST_MS, moved)
    assert skipped(store, "e") == {due: Reason.CHANGED for due in expected}, (
        f"anchor {anchor}, checkpoint {moved}")
    assert history(store, "e")[anchor + FAST_MS].state is RunState.CLAIMED


def test_a_disable_then_an_enable_record_what_came_due_as_disabled(
        entries: Entries, store: Store) -> None:
    made = entries.create("e", "proj.t", FAST)
    anchor = store.entries(["e"])[0].anchor
    assert anchor is not None
    after(store, anchor + 5 * FAST_MS)
    off = entries.disable("e")
    assert (off.version, off.enabled) == (made.version + 1, False)
    first = checkpoint(store, "e")
    assert first is not None and set(skipped(store, "e")) == set(grid(anchor, anchor, first))
    after(store, first + 5 * FAST_MS)
    on = entries.enable("e")
    assert (on.version, on.enabled) == (made.version + 2, True)
    second = checkpoint(store, "e")
    assert second is not None and second >= first + 5 * FAST_MS
    found = skipped(store, "e")
    assert found == {due: Reason.DISABLED for due in grid(anchor, anchor, second)}
    assert entries.enable("e") == on  # enabled already: nothing written


def test_a_change_of_the_description_alone_skips_nothing_and_keeps_the_checkpoint(
        entries: Entries, store: Store) -> None:
    made = entries.create("e", "proj.t", FAST)
    anchor = store.entries(["e"])[0].anchor
    assert anchor is not None
    after(store, anchor + 5 * FAST_MS)
    assert entries.update("e", made.version, description="now described").version == 2
    assert checkpoint(store, "e") is None and skipped(store, "e") == {}


def test_a_change_of_the_description_alone_keeps_a_stored_crontab_without_a_timezone(
        entries: Entries, store: Store) -> None:
    text = '{"task": "proj.t", "schedule": {"crontab": {"minute": "*"}}}'
    [made] = store.write_definitions([DefinitionWrite("c", text, 0, Origin.REDBEAT, "test")])
    anchor = store.entries(["c"])[0].anchor
    after(store, anchor + 1000)
    assert entries.update("c", made.version, description="now described").version == 2
    stored = json.loads(store.definitions(["c"])[0].definition or "{}")
    assert stored["schedule"] == {"crontab": {"minute": "*", "hour": "*", "day_of_week": "*",
                                              "day_of_month": "*", "month_of_year": "*"}}
    assert checkpoint(store, "c") is None and skipped(store, "c") == {}


@pytest.mark.parametrize("limit", [10])
def test_the_skips_of_one_change_are_at_most_the_history_limit_the_newest(
        entries: Entries, store: Store, limit: int) -> None:
    made = entries.create("e", "proj.t", FAST)
    anchor = store.entries(["e"])[0].anchor
    assert anchor is not None
    after(store, anchor + 3 * limit * FAST_MS)
    entries.update("e", made.version, task="proj.u")
    moved = checkpoint(store, "e")
    assert moved is not None
    due = grid(anchor, anchor, moved)
    assert len(due) >= 3 * limit
    assert skipped(store, "e") == {d: Reason.CHANGED for d in due[-limit:]}


def test_a_beat_that_claimed_ahead_of_the_change_keeps_its_claims_and_checkpoint(
        entries: Entries, store: Store) -> None:
    made = entries.create("e", "proj.t", FAST)
    state = store.register([EntrySeed("e")])["e"]
    ahead = [state.anchor + 1000 * k for k in (60, 120)]  # a minute and two ahead
    assert len(claim(store, A, state, *ahead).claims) == 2
    entries.update("e", made.version, task="proj.u")
    assert checkpoint(store, "e") == ahead[-1]
    assert {d: r.state for d, r in history(store, "e").items()} == {
        d: RunState.CLAIMED for d in ahead}


class ClaimsMeanwhile:
    """The store, and a beat that claims the entry's next occurrence while a change is
    being planned (between the change's reads and its write), ``times`` times."""

    def __init__(self, store: Store, times: int) -> None:
        self.store, self.times = store, times

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def now(self) -> int:
        t = self.store.now()
        if self.times > 0:
            self.times -= 1
            state = self.store.register([EntrySeed("e")])["e"]
            assert state.checkpoint is not None
            assert claim(self.store, A, state, state.checkpoint + FAST_MS).status.value == "ok"
        return t


def claimed_once(store: Store) -> int:
    """A beat claims the entry's first occurrence (it has a checkpoint): its anchor."""
    state = store.register([EntrySeed("e")])["e"]
    assert claim(store, A, state, state.anchor + FAST_MS).status.value == "ok"
    return state.anchor


def test_a_beat_that_claims_while_a_change_is_planned_makes_it_plan_again(
        app: Celery, store: Store) -> None:
    entries = Entries(app, store)
    made = entries.create("e", "proj.t", FAST)
    anchor = claimed_once(store)
    after(store, anchor + 10 * FAST_MS)
    meanwhile = ClaimsMeanwhile(store, times=2)
    [result] = apply_changes(meanwhile, [EntryChange(  # type: ignore[arg-type]
        "e", validate("e", {"task": "proj.u", "schedule": {"every": FAST}}), made.version)],
        Origin.API, "ops", app)
    assert (result.status, result.version, meanwhile.times) == (WriteStatus.OK, 2, 0)
    found = history(store, "e")
    claimed = [anchor + k * FAST_MS for k in (1, 2, 3)]
    assert [found[d].state for d in claimed] == [RunState.CLAIMED] * 3
    moved = checkpoint(store, "e")
    assert moved is not None
    assert skipped(store, "e") == {d: Reason.CHANGED for d in grid(anchor, claimed[-1], moved)}


def test_a_beat_that_keeps_claiming_leaves_the_change_refused_not_half_written(
        app: Celery, store: Store) -> None:
    entries = Entries(app, store)
    made = entries.create("e", "proj.t", FAST)
    claimed_once(store)
    meanwhile = ClaimsMeanwhile(store, times=100)
    [result] = apply_changes(meanwhile, [EntryChange(  # type: ignore[arg-type]
        "e", validate("e", {"task": "proj.u", "schedule": {"every": FAST}}), made.version)],
        Origin.API, "ops", app)
    assert (result.status, result.detail) == (WriteStatus.CONFLICT, "checkpoint")
    assert entries.get("e") == made


# -- a bulk -------------------------------------------------------------------------------
BULK = 5000


def test_a_bulk_of_5000_creates_and_updates_goes_in_a_bounded_number_of_round_trips(
        entries: Entries, store: Store, backend: Backend,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A few round trips per chunk of 500 (reads, the clock, the write): the count and the
    rate go to the report (pytest -s)."""
    trips = backend.round_trips(store)
    started_at = time.perf_counter()
    made = entries.bulk_create({"name": f"bulk-{i:04d}", "task": "proj.t",
                                "schedule": {"every": 60 + i}, "args": [i]}
                               for i in range(BULK))
    assert [r.error for r in made] == [None] * BULK
    assert {r.entry.version for r in made if r.entry} == {1}
    assert trips() <= 8 * (BULK // 500) + 4, trips()
    with capsys.disabled():
        print(f"\n{type(store).__name__}: {BULK} creates in"
              f" {time.perf_counter() - started_at:.2f}s, {trips()} round trips")
    trips = backend.round_trips(store)
    changed = entries.bulk_update({"name": f"bulk-{i:04d}", "version": 1, "args": [-i]}
                                  for i in range(BULK))
    assert [r.error for r in changed] == [None] * BULK
    assert trips() <= 8 * (BULK // 500) + 4, trips()
    page = entries.list(after="bulk-2499", limit=2)
    assert [(e.name, e.version) for e in page] == [("bulk-2500", 2), ("bulk-2501", 2)]
    assert page[0].definition is not None and page[0].definition.args == (-2500,)


def test_a_bulk_with_a_bad_item_writes_nothing_and_names_it(entries: Entries,
                                                           store: Store) -> None:
    items = [{"name": f"e{i}", "task": "proj.t", "schedule": {"every": 60}} for i in range(5)]
    items[3]["schedule"] = {"every": -1}
    with pytest.raises(DefinitionError, match=r"entry 'e3': schedule.every: -1"):
        entries.bulk_create(items)
    assert store.definitions() == []


# -- a lost reply -------------------------------------------------------------------------
def _lost_reply_answers_the_same(store: Store, lossy: Store, p: Any, pattern: str,
                                 app: Celery) -> None:
    Entries(app, store).create("e", "proj.t", 60)
    lossy.definitions(["e"])  # connected before the fault
    p.drop_reply_to(pattern)
    changed = Entries(app, lossy, by="bob@ops").update("e", 1, schedule=30)
    assert p.pending() == 0 and p.dropped, "the reply was not lost"
    assert (changed.version, changed.changed_by) == (2, "bob@ops")
    [stored] = store.definitions(["e"])
    assert stored.version == 2  # written once


def test_a_change_whose_reply_was_lost_is_sent_again_and_answers_the_same_redis(
        server: RedisServer, app: Celery) -> None:
    store = RedisStore.from_url(server.url, "bc-entries-lost")
    with proxy(server.port) as p:
        lossy = RedisStore.from_url(p.url(), store.prefix)
        try:
            _lost_reply_answers_the_same(store, lossy, p, function_name("define"), app)
        finally:
            lossy.close()
            store.close()


def test_a_change_whose_reply_was_lost_is_sent_again_and_answers_the_same_postgres(
        request: pytest.FixtureRequest, app: Celery) -> None:
    with fresh_store(request) as pg, proxy(int(PORT)) as p:
        assert isinstance(pg, PostgresStore)
        lossy = PostgresStore.from_url(address(pg).replace(f":{PORT}/", f":{p.port}/"),
                                       pg.prefix)
        try:
            _lost_reply_answers_the_same(pg, lossy, p, f'"{pg.schema}".define(', app)
        finally:
            lossy.close()


# -- bad input ----------------------------------------------------------------------------
@pytest.mark.parametrize(("fields", "says"), [
    ({"schedule": {"crontab": {"minute": "61"}}},
     "entry 'e': schedule.crontab.minute: '61' is not a valid minute"),
    ({"schedule": {"every": 0}}, "entry 'e': schedule.every: 0 is not a positive number"),
    ({"schedule": datetime(2030, 1, 1)}, "entry 'e': schedule: '2030-01-01T00:00:00' has no"
                                         " timezone"),
    ({"options": {"priority": 300}}, "entry 'e': options.priority: 300 is not a priority"),
    ({"options": {"countdown": 3}}, "entry 'e': options: unknown option 'countdown'"),
    ({"claims": {"catch_up": "sometimes"}}, "catch_up"),
    ({"task": "has spaces"}, "entry 'e': task: 'has spaces' is not a task name"),
], ids=["crontab-minute", "every-zero", "naive-datetime", "priority", "unknown-option",
        "policy", "task-name"])
def test_bad_input_is_refused_naming_the_field_and_the_value_and_nothing_is_written(
        entries: Entries, store: Store, fields: dict[str, Any], says: str) -> None:
    given = {"task": "proj.t", "schedule": {"every": 60}, **fields}
    with pytest.raises(DefinitionError) as refused:
        entries.create("e", **given)
    assert says in str(refused.value)
    assert store.definitions() == []
    made = entries.create("e", "proj.t", 60)
    with pytest.raises(DefinitionError) as refused:
        entries.update("e", made.version, **fields)
    assert says in str(refused.value)
    assert entries.get("e") == made
    with pytest.raises(DefinitionError, match="unknown field 'colour'"):
        entries.update("e", made.version, colour="blue")


def test_schedules_are_taken_as_celery_gives_them_and_a_crontab_takes_the_app_s_timezone(
        entries: Entries) -> None:
    given = {
        "cron-object": (crontab(minute="*/5", hour="3"),
                        Cron(minute="*/5", hour="3", timezone="Europe/Paris")),
        "cron-json": ({"crontab": {"minute": "0"}}, Cron(minute="0", timezone="Europe/Paris")),
        "cron-zoned": ({"crontab": {"minute": "0", "timezone": "Asia/Tokyo"}},
                       Cron(minute="0", timezone="Asia/Tokyo")),
        "timedelta": (timedelta(minutes=2), Every(120)),
        "number": (7.5, Every(7.5)),
    }
    for name, (schedule, spec) in given.items():
        made = entries.create(name, "proj.t", schedule)
        assert made.definition is not None and made.definition.schedule == spec, name
    at = datetime(2030, 1, 1, 12, tzinfo=timezone(timedelta(hours=1)))
    made = entries.create("clocked", "proj.t", at)
    assert made.definition is not None
    assert made.definition.schedule.to_json() == {"clocked": "2030-01-01T11:00:00.000Z"}
    assert to_ms(at) == made.definition.schedule.at_ms  # type: ignore[union-attr]
    sunset = entries.create("sunset", "proj.t", solar("sunset", 48.85, 2.35))
    assert sunset.definition is not None
    assert sunset.definition.schedule.to_json() == {
        "solar": {"event": "sunset", "latitude": 48.85, "longitude": 2.35}}


# -- beat_schedule's entries --------------------------------------------------------------
def test_an_entry_defined_in_beat_schedule_is_refused_and_changed_there(
        entries: Entries, store: Store) -> None:
    [config] = store.write_definitions([DefinitionWrite(
        "from-config", validate("from-config", {"task": "proj.t", "schedule": {"every": 60}})
        .to_json(), 0, Origin.CONFIG, "beat")])
    store.heartbeat(A, 60)
    store.register([EntrySeed("registered")], A)
    says = "is defined in beat_schedule"
    with pytest.raises(DefinedInBeatSchedule, match=re.escape(
            f"'from-config' {says} (its definition came from a beat's beat_schedule)")):
        entries.update("from-config", config.version, schedule=30)
    for refused in (lambda: entries.delete("from-config"),
                    lambda: entries.disable("from-config"),
                    lambda: entries.create("from-config", "proj.t", 5)):
        with pytest.raises(DefinedInBeatSchedule):
            refused()
    with pytest.raises(DefinedInBeatSchedule, match=re.escape(
            "entry 'registered' is defined in beat_schedule (registered by the live beat(s)"
            " contract-host:1001): change it there")):
        entries.create("registered", "proj.t", 5)
    assert [d.name for d in store.definitions()] == ["from-config"]
    assert store.definitions(["from-config"]) == [config.current]
    store.register([EntrySeed("from-config")], A)
    with pytest.raises(DefinedInBeatSchedule, match=re.escape(
            "(its definition came from the beat_schedule of the live beat(s)"
            " contract-host:1001)")):
        entries.delete("from-config")
    # Once no live beat registers it (it left every deploy), it is the operators' to remove.
    store.leave(A)
    entries.delete("from-config", config.version)
    assert store.definitions(["from-config"])[0].deleted
    store.heartbeat(A, 60)
    # An entry of the API that a beat registered (it schedules it) is the API's.
    made = entries.create("dynamic", "proj.t", 60)
    store.register([EntrySeed("dynamic")], A)
    assert entries.update("dynamic", made.version, schedule=30).version == 2


# -- reading, export and import -----------------------------------------------------------
def test_entries_are_listed_in_name_order_a_page_at_a_time_past_deleted_ones(
        entries: Entries) -> None:
    names = [f"e{i}" for i in range(8)]
    entries.bulk_create({"name": n, "task": "proj.t", "schedule": 60} for n in names)
    for n in names[1:6]:
        entries.delete(n)
    assert [e.name for e in entries.list(limit=2)] == ["e0", "e6"]
    assert [e.name for e in entries.list(after="e0", limit=5)] == ["e6", "e7"]
    assert [e.name for e in entries.iterate()] == ["e0", "e6", "e7"]


def test_an_import_creates_what_is_missing_changes_what_differs_and_leaves_the_rest(
        entries: Entries, store: Store) -> None:
    entries.create("same", "proj.t", 60)
    entries.create("differs", "proj.t", 60)
    entries.create("not-in-file", "proj.t", 60)
    gone = entries.create("deleted", "proj.t", 60)
    entries.delete("deleted", gone.version)
    items = [{"name": "same", **entries.get("same").as_dict()},  # as show -j writes it
             {"name": "differs", "task": "proj.t", "schedule": {"every": 30}},
             {"name": "deleted", "task": "proj.t", "schedule": {"every": 5}},
             {"name": "new", "task": "proj.t", "schedule": {"crontab": {"minute": "0"}}}]
    plan = plan_import(entries, items)
    assert [n for n, _ in plan.create] == ["deleted", "new"]
    assert [(n, v) for n, v, _ in plan.update] == [("differs", 1)]
    assert plan.unchanged == ("same",) and plan.refused == ()
    before = store.definitions()
    assert store.definitions() == before  # planning writes nothing
    results = apply_import(entries, plan)
    assert [(r.name, r.error) for r in results] == [("deleted", None), ("new", None),
                                                    ("differs", None)]
    assert plan_import(entries, items).unchanged == ("same", "differs", "deleted", "new")
    assert entries.get("not-in-file").version == 1
    with pytest.raises(DefinitionError, match="entry 'same': name: given twice"):
        plan_import(entries, [items[0], items[0]])
