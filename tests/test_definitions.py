"""An entry's definition: validated where it enters (naming the entry, the field and the
value, never an argument's value), one canonical JSON form and digest, its schedule's
exact instants (Celery's arithmetic through ``occurrences``, a crontab in its own
timezone across DST), and ``beat_schedule`` entries as definitions and back."""

from __future__ import annotations

import copy
import json
import pickle
import random
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery, signals
from celery.beat import BeatLazyFunc, _evaluate_entry_args, _evaluate_entry_kwargs
from celery.schedules import BaseSchedule, crontab, schedule, solar

from beat_claims import occurrences
from beat_claims.definitions import (
    MAX_DEFINITION_BYTES,
    Clocked,
    Cron,
    Definition,
    DefinitionError,
    Every,
    Solar,
    Unstorable,
    validate,
)
from beat_claims.occurrences import due_between, next_after
from beat_claims.runs import iso, to_ms
from beat_claims.schedule_words import describe
from beat_claims.scheduler import ClaimsEntry
from beat_claims.schedules import clocked, zoned_crontab
from beat_claims.settings import ConfigurationError, Settings


def make_app(tz: str = "Asia/Tokyo") -> Celery:
    app = Celery("defs", set_as_current=False)
    app.conf.timezone = tz
    app.conf.broker_url = "memory://"
    return app


@pytest.fixture
def app() -> Celery:
    return make_app()


def utc(*args: int) -> int:
    return to_ms(datetime(*args, tzinfo=timezone.utc))


def walk(sched: Any, start: int, n: int, anchor: int = 0) -> list[str]:
    """The next ``n`` instants after ``start`` (fewer when the schedule has no more)."""
    out: list[str] = []
    t = start
    for _ in range(n):
        nxt = next_after(sched, anchor, t)
        if nxt is None:
            break
        out.append(str(iso(nxt)).replace(".000Z", "Z"))
        t = nxt
    return out


def refused(name: str, obj: Any) -> str:
    with pytest.raises(DefinitionError) as err:
        validate(name, obj)
    assert isinstance(err.value, ValueError)
    return str(err.value)


def entry(app: Celery, name: str = "e", **spec: Any) -> ClaimsEntry:
    """A ``beat_schedule`` entry as the scheduler builds it."""
    return ClaimsEntry(**dict(spec, name=name, app=app))


# -- a crontab in its own timezone: the zone's wall times, DST included -----------------

def test_a_zoned_crontab_fires_at_paris_wall_times_across_both_dst_changes(
        app: Celery) -> None:
    nine = zoned_crontab(minute="0", hour="9", timezone="Europe/Paris", app=app)
    # The app's zone is Tokyo's: 09:00 Paris is 08:00Z in winter, 07:00Z in summer.
    assert walk(nine, utc(2026, 3, 27, 12), 4) == [  # Mar 29: 02:00 CET -> 03:00 CEST
        "2026-03-28T08:00:00Z", "2026-03-29T07:00:00Z", "2026-03-30T07:00:00Z",
        "2026-03-31T07:00:00Z"]
    assert walk(nine, utc(2026, 10, 23, 12), 4) == [  # Oct 25: 03:00 CEST -> 02:00 CET
        "2026-10-24T07:00:00Z", "2026-10-25T08:00:00Z", "2026-10-26T08:00:00Z",
        "2026-10-27T08:00:00Z"]
    half_past_two = zoned_crontab(minute="30", hour="2", timezone="Europe/Paris", app=app)
    # 02:30 does not exist on Mar 29 (Celery lands it at 03:30 CEST, 01:30Z), and comes
    # twice on Oct 25 (sent once, the first time).
    assert walk(half_past_two, utc(2026, 3, 27, 12), 4) == [
        "2026-03-28T01:30:00Z", "2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z",
        "2026-03-31T00:30:00Z"]
    assert walk(half_past_two, utc(2026, 10, 23, 12), 4) == [
        "2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z",
        "2026-10-27T01:30:00Z"]


def test_a_zoned_crontab_fires_at_new_york_wall_times_across_both_dst_changes(
        app: Celery) -> None:
    nine = zoned_crontab(minute="0", hour="9", timezone="America/New_York", app=app)
    assert walk(nine, utc(2026, 3, 6, 12), 4) == [  # Mar 8: 02:00 EST -> 03:00 EDT
        "2026-03-06T14:00:00Z", "2026-03-07T14:00:00Z", "2026-03-08T13:00:00Z",
        "2026-03-09T13:00:00Z"]
    assert walk(nine, utc(2026, 10, 30, 12), 4) == [  # Nov 1: 02:00 EDT -> 01:00 EST
        "2026-10-30T13:00:00Z", "2026-10-31T13:00:00Z", "2026-11-01T14:00:00Z",
        "2026-11-02T14:00:00Z"]
    night = zoned_crontab(minute="*/30", hour="0-3", timezone="America/New_York", app=app)
    # Spring: 02:00 and 02:30 do not exist; they land on 03:00 and 03:30 EDT, once each.
    assert walk(night, utc(2026, 3, 8, 4), 7) == [
        "2026-03-08T05:00:00Z", "2026-03-08T05:30:00Z", "2026-03-08T06:00:00Z",
        "2026-03-08T06:30:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z",
        "2026-03-09T04:00:00Z"]
    # Autumn: the repeated hour 01:00-01:59 is run once (EDT), then 02:00 EST.
    assert walk(night, utc(2026, 11, 1, 3), 9) == [
        "2026-11-01T04:00:00Z", "2026-11-01T04:30:00Z", "2026-11-01T05:00:00Z",
        "2026-11-01T05:30:00Z", "2026-11-01T07:00:00Z", "2026-11-01T07:30:00Z",
        "2026-11-01T08:00:00Z", "2026-11-01T08:30:00Z", "2026-11-02T05:00:00Z"]


def test_a_zoned_crontab_sends_every_minute_it_names_when_the_utc_date_differs(
        app: Celery) -> None:
    """The hour after midnight in Paris, the evening in New York: another date in UTC."""
    paris = zoned_crontab(minute="*/20", hour="0", timezone="Europe/Paris", app=app)
    assert walk(paris, utc(2026, 3, 28, 12), 6) == [  # CET, then CEST (Mar 29)
        "2026-03-28T23:00:00Z", "2026-03-28T23:20:00Z", "2026-03-28T23:40:00Z",
        "2026-03-29T22:00:00Z", "2026-03-29T22:20:00Z", "2026-03-29T22:40:00Z"]
    new_york = zoned_crontab(minute="*/20", hour="22", timezone="America/New_York",
                             app=app)
    assert walk(new_york, utc(2026, 10, 31, 12), 6) == [  # EDT, then EST (Nov 1)
        "2026-11-01T02:00:00Z", "2026-11-01T02:20:00Z", "2026-11-01T02:40:00Z",
        "2026-11-02T03:00:00Z", "2026-11-02T03:20:00Z", "2026-11-02T03:40:00Z"]


@pytest.mark.parametrize("zone", ["Europe/Paris", "America/New_York",
                                  "Australia/Lord_Howe", "Asia/Kolkata", "UTC"])
def test_a_zoned_crontab_gives_celerys_own_instants_for_an_app_in_that_zone(
        app: Celery, zone: str) -> None:
    """Whatever the app's timezone, a crontab in zone Z gives, instant for instant, what
    Celery's own crontab gives in an app whose timezone is Z: Celery's arithmetic."""
    rng = random.Random(zone)
    same = make_app(zone)
    specs = [{"minute": "*/20", "hour": "0-3"}, {"minute": "30", "hour": "2"},
             {"minute": "0,30", "hour": "1,2,3", "day_of_week": "sun"},
             {"minute": "15", "hour": "23,0,1"}, {"minute": "5", "day_of_month": "1,15"}]
    starts = [utc(2026, 3, 7), utc(2026, 3, 27), utc(2026, 10, 24), utc(2026, 10, 31),
              utc(2026, 4, 3)] + [utc(2026, 1, 1) + rng.randrange(366 * 86_400_000)
                                  for _ in range(3)]
    for spec in specs:
        mine = zoned_crontab(**spec, timezone=zone, app=app)
        theirs = crontab(**spec, app=same)
        for start in starts:
            assert walk(mine, start, 40) == walk(theirs, start, 40), (spec, iso(start))


def test_a_zoned_crontab_keeps_its_zone_through_copies_and_pickles(app: Celery) -> None:
    cron = zoned_crontab(minute="0", hour="9", timezone="Europe/Paris", app=app)
    for twin in (copy.copy(cron), pickle.loads(pickle.dumps(cron))):
        assert twin == cron and twin.zone_name == "Europe/Paris"
        assert walk(twin, utc(2026, 3, 27, 12), 3) == walk(cron, utc(2026, 3, 27, 12), 3)
    # Zones tell crontabs apart, and Celery's own crontab is none of them.
    assert cron != zoned_crontab(minute="0", hour="9", timezone="Europe/Berlin")
    assert cron != crontab(minute="0", hour="9") and crontab(minute="0", hour="9") != cron
    assert describe(cron) == "at 09:00 Europe/Paris"


# -- beat-claims' clocked: one instant, as django-celery-beat's ------------------------

def test_a_clocked_schedule_is_one_absolute_instant() -> None:
    at = utc(2026, 12, 24, 18) + 250
    once = clocked(at)
    assert occurrences.clocked_instant(once) == at
    assert next_after(once, at + 60_000, at - 1) == at  # whatever the anchor
    assert next_after(once, 0, at) is None
    assert due_between(once, 0, at - 1, at + 1, keep=5) == occurrences.DueWindow(
        [at], 1, True)
    assert due_between(once, 0, at, at + 120_000, keep=5).total == 0
    assert describe(once) == "once at 2026-12-24 18:00:00.250 UTC"
    assert pickle.loads(pickle.dumps(once)) == once and copy.copy(once) == once
    # Celery's own beat would send it once: due when it has come, not after it ran.
    now = datetime.fromtimestamp(at / 1000 + 5, tz=timezone.utc)
    late = clocked(at, nowfun=lambda: now)
    assert late.is_due(now - timedelta(days=1)).is_due
    assert not late.is_due(now).is_due


# -- validation: refused where it enters, naming the entry, the field and the value ----

def base(**changes: Any) -> dict[str, Any]:
    return {"task": "proj.tasks.report", "schedule": {"every": 30}, **changes}


@pytest.mark.parametrize(("changes", "field", "shown"), [
    ({"task": ""}, "task", "''"),
    ({"task": "proj tasks.report"}, "task", "'proj tasks.report'"),
    ({"task": "proj..report"}, "task", "'proj..report'"),
    ({"task": 42}, "task", "42"),
    ({"task": "t" * 201}, "task", "'tttt"),
    ({"schedule": {"every": 0}}, "schedule.every", "0"),
    ({"schedule": {"every": -5}}, "schedule.every", "-5"),
    ({"schedule": {"every": 0.0001}}, "schedule.every", "0.0001"),
    ({"schedule": {"every": 11 * 366 * 86400}}, "schedule.every", "ten years"),
    ({"schedule": {"every": 1e300}}, "schedule.every", "ten years"),
    ({"schedule": {"every": "30"}}, "schedule.every", "'30'"),
    ({"schedule": {"every": True}}, "schedule.every", "True"),
    ({"schedule": {"every": 30, "crontab": {}}}, "schedule", "is not a schedule"),
    ({"schedule": {"weekly": 1}}, "schedule", "'weekly'"),
    ({"schedule": 30}, "schedule", "30"),
    ({"schedule": {"crontab": {"minute": "61"}}}, "schedule.crontab.minute",
     "'61' is not a valid minute"),
    ({"schedule": {"crontab": {"hour": "24"}}}, "schedule.crontab.hour", "'24'"),
    ({"schedule": {"crontab": {"day_of_week": "funday"}}}, "schedule.crontab.day_of_week",
     "'funday'"),
    ({"schedule": {"crontab": {"day_of_month": "0"}}}, "schedule.crontab.day_of_month",
     "'0'"),
    ({"schedule": {"crontab": {"month_of_year": "13"}}},
     "schedule.crontab.month_of_year", "'13'"),
    ({"schedule": {"crontab": {"minute": "*/"}}}, "schedule.crontab.minute", "'*/'"),
    ({"schedule": {"crontab": {"minute": ""}}}, "schedule.crontab.minute", "''"),
    ({"schedule": {"crontab": {"minute": [1, 2]}}}, "schedule.crontab.minute", "[1, 2]"),
    ({"schedule": {"crontab": {"minutes": "5"}}}, "schedule.crontab", "'minutes'"),
    ({"schedule": {"crontab": {"day_of_month": "30", "month_of_year": "2"}}},
     "schedule.crontab", "'30'"),
    ({"schedule": {"crontab": {"timezone": "Europe/Pariss"}}},
     "schedule.crontab.timezone", "'Europe/Pariss'"),
    ({"schedule": {"crontab": {"timezone": "../../etc/passwd"}}},
     "schedule.crontab.timezone", "'../../etc/passwd'"),
    ({"schedule": {"crontab": {"timezone": "localtime"}}}, "schedule.crontab.timezone",
     "'localtime'"),
    ({"schedule": {"crontab": {"timezone": 1}}}, "schedule.crontab.timezone", "1"),
    ({"schedule": {"solar": {"event": "teatime", "latitude": 1, "longitude": 2}}},
     "schedule.solar.event", "'teatime'"),
    ({"schedule": {"solar": {"event": "sunset", "latitude": 90.5, "longitude": 2}}},
     "schedule.solar.latitude", "90.5"),
    ({"schedule": {"solar": {"event": "sunset", "latitude": 1, "longitude": -181}}},
     "schedule.solar.longitude", "-181"),
    ({"schedule": {"solar": {"event": "sunset", "latitude": 1}}}, "schedule.solar",
     "'longitude' is missing"),
    ({"schedule": {"clocked": "2026-12-24T18:00:00"}}, "schedule.clocked",
     "'2026-12-24T18:00:00'"),
    ({"schedule": {"clocked": "2026-12-24"}}, "schedule.clocked", "'2026-12-24'"),
    ({"schedule": {"clocked": "2026-02-30T18:00:00Z"}}, "schedule.clocked",
     "'2026-02-30T18:00:00Z'"),
    ({"schedule": {"clocked": "2026-12-24T18:00:00.000001Z"}}, "schedule.clocked",
     "finer than a millisecond"),
    ({"schedule": {"clocked": "1969-12-31T23:59:59Z"}}, "schedule.clocked", "before 1970"),
    ({"schedule": {"clocked": 1798135200}}, "schedule.clocked", "1798135200"),
    ({"args": {"a": 1}}, "args", "a dict is not a JSON array"),
    ({"kwargs": [1]}, "kwargs", "a list is not a JSON object"),
    ({"options": {"countdown": 5}}, "options", "'countdown'"),
    ({"options": {"priority": 256}}, "options.priority", "256"),
    ({"options": {"priority": -1}}, "options.priority", "-1"),
    ({"options": {"priority": 1.5}}, "options.priority", "1.5"),
    ({"options": {"priority": True}}, "options.priority", "True"),
    ({"options": {"queue": ""}}, "options.queue", "''"),
    ({"options": {"queue": 5}}, "options.queue", "5"),
    ({"options": {"routing_key": "r" * 256}}, "options.routing_key", "'rrr"),
    ({"options": {"exchange": None}}, "options.exchange", "None"),
    ({"options": {"expires": 0}}, "options.expires", "0"),
    ({"options": {"expires": "tomorrow"}}, "options.expires", "'tomorrow'"),
    ({"options": {"soft_time_limit": -1}}, "options.soft_time_limit", "-1"),
    ({"options": {"time_limit": float("inf")}}, "options.time_limit", "inf"),
    ({"options": {"headers": []}}, "options.headers", "a list is not a JSON object"),
    ({"options": []}, "options", "a list is not a JSON object"),
    ({"enabled": "yes"}, "enabled", "'yes'"),
    ({"description": "d" * 1001}, "description", "'ddd"),
    ({"description": 5}, "description", "5"),
    ({"claims": []}, "claims", "a list is not a JSON object"),
    ({"claims": {"catch_up": ["all"]}}, "claims.catch_up", "['all']"),
])
def test_a_bad_field_is_refused_naming_the_entry_the_field_and_the_value(
        changes: dict[str, Any], field: str, shown: str) -> None:
    message = refused("nightly", base(**changes))
    assert message.startswith(f"entry 'nightly': {field}: "), message
    assert shown in message, message
    assert len(message) < 500, message  # a long value is cut


@pytest.mark.parametrize(("claims", "key"), [
    ({"catch_up": "everything"}, "catch_up"),
    ({"overlap": "queue"}, "overlap"),
    ({"max_catch_up": 0}, "max_catch_up"),
    ({"reclaim_after": -1}, "reclaim_after"),
    ({"jitter": 86401}, "jitter"),
    ({"catchup": "all"}, "catchup"),
])
def test_claims_are_refused_by_the_beats_own_checks(claims: dict[str, Any],
                                                    key: str) -> None:
    """The same message a beat gives for that ``claims`` in ``beat_schedule``."""
    with pytest.raises(ConfigurationError) as beat:
        Settings(url="").policy_for("nightly", claims)
    with pytest.raises(DefinitionError) as err:
        validate("nightly", base(claims=claims))
    assert str(err.value) == str(beat.value)
    assert err.value.field == f"claims.{key}"


def test_a_bad_argument_is_named_by_place_and_type_never_by_value() -> None:
    secret = "hunter2-s3cret"

    class Token:
        def __repr__(self) -> str:
            return secret

    cases = [
        (base(args=[secret, float("nan")]), "args[1]", "not finite"),
        (base(args=[secret, Token()]), "args[1]", "a Token is not a JSON value"),
        (base(kwargs={"password": secret, "at": datetime.now()}), "kwargs['at']",
         "a datetime is not a JSON value"),
        (base(kwargs={"deep": [{"x": secret, "y": float("inf")}]}), "kwargs['deep'][0]['y']",
         "not finite"),
        (base(kwargs={secret: 1, 2: secret}), "kwargs", "a key of type int"),
        (base(args=[secret, {1, 2}]), "args[1]", "a set is not a JSON value"),
        (base(args=[secret, "\ud800" + secret]), "args[1]", "not valid Unicode"),
        (base(options={"headers": {"Authorization": secret, "n": float("nan")}}),
         "options.headers['n']", "not finite"),
        (base(args=[secret] * 10_000), "", f"more than {MAX_DEFINITION_BYTES} bytes"),
    ]
    for obj, field, problem in cases:
        message = refused("nightly", obj)
        assert f"entry 'nightly': {field}" in message and problem in message, message
        assert secret not in message, message
    # In JSON text as well: the parser's messages quote nothing of the text.
    text = '{"task": "t", "schedule": {"every": 1}, "args": ["' + secret + '", NaN]}'
    message = refused("nightly", text)
    assert "args[1]" in message and secret not in message
    message = refused("nightly", '{"task": "t", "args": ["' + secret + '" 1]}')
    assert "not JSON" in message and "line 1" in message and secret not in message


def test_a_definitions_repr_shows_none_of_its_arguments_or_options() -> None:
    secret = "hunter2-s3cret"
    d = validate("nightly", base(args=[secret], kwargs={"password": secret},
                                 options={"headers": {"Authorization": secret}}))
    assert secret not in repr(d) and "nightly" not in repr(d) and "task=" in repr(d)


def test_a_definition_is_a_json_object_with_known_fields() -> None:
    assert "unknown field 'schedul'" in refused("e", {"task": "t", "schedul": {}})
    assert refused("e", {"task": "t"}) == "entry 'e': schedule: missing"
    assert refused("e", {"schedule": {"every": 1}}) == "entry 'e': task: missing"
    assert "not a list" in refused("e", [1])
    assert "not a list" in refused("e", "[1]")
    assert "appears twice" in refused(
        "e", '{"task": "a", "task": "b", "schedule": {"every": 1}}')
    assert "nested too deeply" in refused("e", "[" * 50_000)
    assert "nested deeper than 64" in refused("e", base(args=json.loads("[" * 80 + "]" * 80)))


@pytest.mark.parametrize("name", ["", 5, None, "x" * 1025, "\ud800"])
def test_a_name_that_cannot_be_stored_is_refused(name: Any) -> None:
    with pytest.raises(DefinitionError) as err:
        validate(name, base())
    assert str(err.value).startswith("entry name")


def test_a_definition_larger_than_64_kib_is_refused_where_it_enters() -> None:
    empty = validate("e", base(args=[""])).to_json()
    room = MAX_DEFINITION_BYTES - len(empty.encode())
    largest = validate("e", base(args=["é" * (room // 2) + "a" * (room % 2)]))
    assert len(largest.to_json().encode()) == MAX_DEFINITION_BYTES
    assert validate("e", largest.to_json()) == largest
    message = refused("e", base(args=["é" * (room // 2) + "a" * (room % 2 + 1)]))
    assert f"more than {MAX_DEFINITION_BYTES}" in message
    message = refused("e", largest.to_json() + " " * (MAX_DEFINITION_BYTES + 1))
    assert "bytes of JSON text: more than" in message
    # Whatever the values, a definition within the bound is taken: the early refusal
    # (before the whole of a huge one is walked) never counts more than the JSON takes.
    for filler in ([0.5] * 16_000, [None] * 13_000, [10**20] * 2_900, [{}] * 21_000,
                   [[]] * 21_000, [True] * 13_000, [{"k": 1}] * 8_000):
        definition = validate("e", base(args=filler))
        assert len(definition.to_json().encode()) <= MAX_DEFINITION_BYTES


def test_solar_without_ephem_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                  app: Celery) -> None:
    sunset = base(schedule={"solar": {"event": "sunset", "latitude": 48.85,
                                      "longitude": 2.35}})
    definition = validate("dusk", sunset)
    monkeypatch.setitem(sys.modules, "ephem", None)  # import ephem raises ImportError
    message = refused("dusk", sunset)
    assert "schedule.solar" in message and "pip install 'beat-claims[solar]'" in message
    with pytest.raises(DefinitionError, match=r"pip install 'beat-claims\[solar\]'"):
        definition.schedule_entry("dusk", app)


def test_validation_copies_and_never_changes_what_it_was_given() -> None:
    given = base(args=[[1, 2]], kwargs={"k": {"v": 1}}, options={"headers": {"h": [1]}},
                 claims={"catch_up": "all"})
    before = copy.deepcopy(given)
    definition = validate("e", given)
    assert given == before
    given["args"][0].append(3)
    given["kwargs"]["k"]["v"] = 2
    given["options"]["headers"]["h"].append(2)
    assert definition == validate("e", before)


# -- the canonical form and the digest ---------------------------------------------------

def test_equal_definitions_give_equal_text_and_digest_whatever_their_spelling() -> None:
    spellings = [
        '{"task":"proj.tasks.report","schedule":{"every":30}}',
        '{ "schedule" : {"every": 30.0},\n  "task": "proj.tasks.report", "args": [],'
        ' "kwargs": {}, "options": {}, "claims": null, "enabled": true,'
        ' "description": ""}',
        {"task": "proj.tasks.report", "schedule": {"every": 30}, "args": (),
         "kwargs": None, "description": None},
    ]
    definitions = [validate("e", s) for s in spellings]
    assert len({d.to_json() for d in definitions}) == 1
    assert len({d.digest() for d in definitions}) == 1
    assert definitions[0] == definitions[1] and hash(definitions[0]) == hash(definitions[2])
    assert definitions[0].to_json() == (
        '{"args":[],"claims":{},"description":"","enabled":true,"kwargs":{},"options":{},'
        '"schedule":{"every":30},"task":"proj.tasks.report"}')
    # Stable across processes and releases: a change here changes what beats compare.
    assert definitions[0].digest() == "0c2b42a1ec489d8695fb55357c009a97"
    cron = validate("e", base(schedule={"crontab": {"minute": 5, "timezone": "UTC"}}))
    assert json.loads(cron.to_json())["schedule"] == {"crontab": {
        "minute": "5", "hour": "*", "day_of_week": "*", "day_of_month": "*",
        "month_of_year": "*", "timezone": "UTC"}}
    at = validate("e", base(schedule={"clocked": "2026-12-24T19:00:00+01:00"},
                            options={"expires": "2026-12-24T19:00:00.500+01:00"}))
    assert json.loads(at.to_json())["schedule"] == {"clocked": "2026-12-24T18:00:00.000Z"}
    assert json.loads(at.to_json())["options"] == {"expires": "2026-12-24T18:00:00.500Z"}


@pytest.mark.parametrize("change", [
    {"task": "proj.tasks.other"}, {"schedule": {"every": 31}}, {"args": [2]},
    {"args": [1.0]}, {"args": [True]}, {"args": []}, {"kwargs": {"a": 1}},
    {"options": {"queue": "q"}}, {"claims": {"catch_up": "all"}}, {"enabled": False},
    {"description": "d"},
    {"schedule": {"crontab": {"minute": "*/5"}}},
    {"schedule": {"crontab": {"minute": "*/5", "timezone": "UTC"}}},
])
def test_any_change_gives_another_digest(change: dict[str, Any]) -> None:
    plain = validate("e", base(args=[1]))  # (1, 1.0 and true are three arguments)
    changed = validate("e", {**base(args=[1]), **change})
    assert changed.digest() != plain.digest() and changed != plain


def test_the_canonical_text_reads_back_as_the_same_definition() -> None:
    full = validate("e", {
        "task": "proj.tasks.report",
        "schedule": {"crontab": {"minute": "*/5", "hour": "8-18", "day_of_week": "mon-fri",
                                 "timezone": "Europe/Paris"}},
        "args": [1, "a", None, 2.5, [True, {"x": []}]], "kwargs": {"k": "v", "é": "ü"},
        "options": {"queue": "q", "routing_key": "r", "exchange": "x", "priority": 9,
                    "expires": 60, "headers": {"h": 1}, "soft_time_limit": 10,
                    "time_limit": 20.5},
        "claims": {"catch_up": "latest", "max_catch_up": 3, "overlap": "skip",
                   "jitter": 1.5, "run_timeout": None},
        "enabled": False, "description": "nightly report"})
    again = validate("e", full.to_json())
    assert again == full and again.to_json() == full.to_json()
    assert isinstance(full.schedule, Cron) and full.schedule.timezone == "Europe/Paris"
    assert validate("e", base(schedule={"every": 2.5})).schedule == Every(2.5)
    assert validate("e", base(schedule={"clocked": "2026-01-01T00:00:00Z"})).schedule == (
        Clocked(utc(2026, 1, 1)))
    assert validate("e", base(schedule={"solar": {
        "event": "sunrise", "latitude": 0, "longitude": 0}})).schedule == Solar(
        "sunrise", 0, 0)


# -- beat_schedule entries as definitions, and back ----------------------------------------

def _round_trip(app: Celery, name: str, original: ClaimsEntry) -> ClaimsEntry:
    definition = Definition.from_entry(name, original)
    assert isinstance(definition, Definition), definition
    return validate(name, definition.to_json()).schedule_entry(name, app)


def _same_instants(a: Any, b: Any, anchor: int, starts: list[int], n: int = 30) -> None:
    for start in starts:
        assert walk(a, start, n, anchor) == walk(b, start, n, anchor), iso(start)
    window = (starts[0], starts[0] + 40 * 86_400_000)
    assert due_between(a, anchor, *window, keep=7) == due_between(b, anchor, *window, keep=7)


STARTS = [utc(2026, 3, 27, 12), utc(2026, 10, 24, 3), utc(2026, 6, 1) + 1234]


@pytest.mark.parametrize("make", [
    lambda app: 30,
    lambda app: 7.5,
    lambda app: timedelta(minutes=3),
    lambda app: schedule(timedelta(seconds=0.25), relative=True),
    lambda app: crontab(minute="*/7", hour="3-5,22", day_of_week="mon-fri"),
    lambda app: crontab(minute=0, hour=[2, 3], day_of_month="1-7", month_of_year="*/2"),
    lambda app: crontab(minute={0, 30}, hour=2),
    lambda app: zoned_crontab(minute="30", hour="2", timezone="Europe/Paris"),
    lambda app: zoned_crontab(minute="*/20", hour="0-3", timezone="America/New_York"),
    lambda app: solar("sunset", 48.85, 2.35),
    lambda app: solar("dawn_astronomical", -33.9, 151.2),
    lambda app: clocked(utc(2026, 11, 1, 5, 30)),
], ids=["int", "float", "timedelta", "relative", "crontab", "crontab-days", "crontab-set",
        "paris", "new-york", "solar", "solar-south", "clocked"])
def test_a_beat_schedule_entry_round_trips_to_the_same_instants(
        make: Callable[[Celery], Any]) -> None:
    app = make_app("Europe/Paris")  # a crontab without a zone keeps following the app's
    original = entry(app, "nightly", task="proj.tasks.report", schedule=make(app),
                     args=(1, "a"), kwargs={"k": [1, 2]})
    back = _round_trip(app, "nightly", original)
    assert (back.task, list(back.args), back.kwargs) == ("proj.tasks.report", [1, "a"],
                                                         {"k": [1, 2]})
    assert back.schedule == original.schedule or isinstance(original.schedule, schedule)
    _same_instants(original.schedule, back.schedule, utc(2026, 1, 1) + 77, STARTS)


def test_a_django_celery_beat_clocked_entry_round_trips_to_the_same_instant(
        app: Celery) -> None:
    from django_celery_beat.clockedschedule import clocked as dcb_clocked

    at = datetime(2026, 11, 1, 5, 30, 0, 250_000, tzinfo=timezone.utc)
    original = entry(app, task="t", schedule=dcb_clocked(at))
    back = _round_trip(app, "e", original)
    assert isinstance(back.schedule, clocked)
    _same_instants(original.schedule, back.schedule, utc(2027, 1, 1),
                   [utc(2026, 1, 1), to_ms(at) - 1, to_ms(at)])


def _published(app: Celery, e: ClaimsEntry) -> dict[str, Any]:
    """The message Celery publishes for the entry (as the scheduler's ``apply_async``)."""
    seen: list[dict[str, Any]] = []

    def capture(sender: Any = None, body: Any = None, exchange: Any = None,
                routing_key: Any = None, headers: Any = None, properties: Any = None,
                **_: Any) -> None:
        seen.append({"body": body, "exchange": exchange, "routing_key": routing_key,
                     "headers": {k: v for k, v in headers.items() if k not in (
                         "id", "root_id", "origin", "argsrepr", "kwargsrepr")},
                     "priority": properties.get("priority")})

    signals.before_task_publish.connect(capture, weak=False)
    try:
        app.send_task(e.task, _evaluate_entry_args(e.args), _evaluate_entry_kwargs(e.kwargs),
                      task_id="fixed", **e.options)
    finally:
        signals.before_task_publish.disconnect(capture)
    (message,) = seen
    return message


def test_a_round_trip_publishes_the_same_message(app: Celery) -> None:
    options = {"queue": "reports", "routing_key": "reports.nightly", "exchange": "jobs",
               "priority": 7, "headers": {"tenant": "acme"}, "soft_time_limit": 10,
               "time_limit": 20.5,
               "expires": datetime(2030, 1, 1, 12, tzinfo=timezone.utc)}
    claims = {"catch_up": "all", "jitter": 2}
    original = entry(app, task="proj.tasks.report", schedule=30, args=[1, "a"],
                     kwargs={"k": {"v": None}}, options=options, claims=claims)
    back = _round_trip(app, "e", original)
    assert back.options == original.options and back.claims == claims
    assert _published(app, back) == _published(app, original)
    # Seconds-from-now expiry stays a number; a time stays that instant.
    relative = entry(app, task="t", schedule=30, options={"expires": 60})
    assert _round_trip(app, "e", relative).options == {"expires": 60}
    iso_expiry = entry(app, task="t", schedule=30, options={"expires": "2030-01-01T12:00Z"})
    assert _round_trip(app, "e", iso_expiry).options == {"expires": datetime(
        2030, 1, 1, 12, tzinfo=timezone.utc)}
    # No claims: none (as a beat_schedule entry without them).
    assert _round_trip(app, "e", entry(app, task="t", schedule=30)).claims is None


class EveryOtherDay(BaseSchedule):
    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return timedelta(days=2)


def test_an_entry_that_cannot_be_stored_says_why_and_stays_the_beats_own(
        app: Celery) -> None:
    from django_celery_beat.tzcrontab import TzAwareCrontab

    secret = "hunter2-s3cret"
    cases = [
        (dict(schedule=30, args=[BeatLazyFunc(lambda: secret)]), "args[0]",
         "a BeatLazyFunc is not a JSON value"),
        (dict(schedule=30, kwargs={"at": datetime(2026, 1, 1, tzinfo=timezone.utc),
                                   "pw": secret}), "kwargs['at']", "a datetime"),
        (dict(schedule=30, args=[secret, object()]), "args[1]", "a object"),
        (dict(schedule=EveryOtherDay()), "schedule", "EveryOtherDay is none of the kinds"),
        (dict(schedule=TzAwareCrontab(minute="0", tz=timezone.utc)), "schedule",
         "TzAwareCrontab is none of the kinds"),
        (dict(schedule=30, options={"countdown": 5}), "options", "'countdown'"),
        (dict(schedule=30, options={"link": secret}), "options", "'link'"),
        (dict(schedule=30, claims={"catch_up": "everything"}), "claims", "everything"),
        (dict(schedule=0.0001), "schedule.every", "shorter than a millisecond"),
    ]
    for spec, field, problem in cases:
        result = Definition.from_entry("nightly", entry(app, "nightly", task="t", **spec))
        assert isinstance(result, Unstorable), (spec, result)
        assert f"entry 'nightly': {field}" in result.reason, result.reason
        assert problem in result.reason and secret not in result.reason, result.reason


def test_definitions_import_without_the_scheduler_and_build_its_entries() -> None:
    """No import cycle: the scheduler will import this module, which builds its entries."""
    code = ("import sys; from celery import Celery;"
            " from beat_claims.definitions import validate;"
            " assert 'beat_claims.scheduler' not in sys.modules;"
            " d = validate('e', {'task': 't', 'schedule': {'every': 5}});"
            " print(type(d.schedule_entry('e', Celery(set_as_current=False))).__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ClaimsEntry"
