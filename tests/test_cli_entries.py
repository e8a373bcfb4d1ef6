"""``celery -A proj claims entries ...`` end to end: real ``celery`` processes on real stores
(SQLite, Redis, PostgreSQL): add, list, show, edit (a stale version refused), enable,
disable, remove (only with --yes), export and import (a store that came back empty gets
its dynamic entries back). A definition's arguments are printed by show and export only;
a mistake is one line and exit code 1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from beat_claims.definitions import validate
from beat_claims.enums import Origin
from beat_claims.stores.base import DefinitionWrite, Store
from beat_claims.stores.postgres import PostgresStore
from beat_claims.stores.redis import RedisStore
from beat_claims.stores.sqlite import SQLiteStore

from .contract.backend_postgres import address
from .contract.conftest import BACKENDS
from .test_cli import Ran, cli, cli_steps, one_line, step

pytestmark = pytest.mark.integration

#: An argument the entries carry that only show and export may print.
SECRET = "s3cr3t-token"


@dataclass
class Target:
    """A store the CLI and the test share."""

    store: Store
    url: str

    def __call__(self, *args: str, stdin: str | None = None) -> Ran:
        conf = {"beat_claims_url": self.url, "beat_claims_key_prefix": self.store.prefix}
        return cli(None, "entries", *args, stdin=stdin, BC_CONF=json.dumps(conf))

    def ok(self, *args: str, stdin: str | None = None) -> str:
        return ok(self(*args, stdin=stdin))

    def each(self, *steps: tuple[tuple[str, ...], str]) -> Iterator[Ran]:
        """What each of ``steps`` (:func:`step`) gave, run one after the other in one
        ``celery`` process (each as ``celery`` runs it): a process's start, not one each."""
        conf = {"beat_claims_url": self.url, "beat_claims_key_prefix": self.store.prefix}
        return iter(cli_steps(None, [(("entries", *args), stdin) for args, stdin in steps],
                              BC_CONF=json.dumps(conf)))


def ok(ran: Ran) -> str:
    """The output of a command that succeeded."""
    assert ran.code == 0 and "Traceback" not in ran.err, ran
    return ran.out


def _url(store: Store, request: pytest.FixtureRequest) -> str:
    if isinstance(store, SQLiteStore):
        return f"sqlite:///{store.path}"
    if isinstance(store, RedisStore):
        return str(request.getfixturevalue("server").url)
    assert isinstance(store, PostgresStore)
    return address(store)


@pytest.fixture(params=["postgres", "redis", "sqlite"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _target(kind: str, request: pytest.FixtureRequest) -> Iterator[Target]:
    with BACKENDS[kind].open(request, 100) as store:
        yield Target(store, _url(store, request))


@pytest.fixture
def target(kind: str, request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from _target(kind, request)


@pytest.fixture
def other(kind: str, request: pytest.FixtureRequest) -> Iterator[Target]:
    """Another store of the same kind, empty (a store that came back empty)."""
    yield from _target(kind, request)


def test_add_list_show_edit_enable_disable_and_remove(target: Target) -> None:
    ran = target.each(
        step("add", "nightly", "--task", "proj.report", "--crontab", "0 3 * * *",
             "--args", json.dumps([1, SECRET]), "--kwargs", '{"mode": "full"}',
             "--by", "alice@ops"),
        step("add", "fast", "--json", "-", "-j", stdin=json.dumps(
            {"task": "proj.ping", "schedule": {"every": 30}, "description": "a ping"})),
        step("list", "-j"), step("list"), step("show", "nightly", "-j"), step("show", "nightly"),
        step("edit", "nightly", "--version", "1", "--every", "60"),
        step("edit", "nightly", "--version", "1", "--every", "90"),
        step("edit", "nightly", "--every", "90"), step("show", "nightly", "-j"),
        step("disable", "fast"), step("enable", "fast", "-j"),
        step("remove", "fast"), step("show", "fast", "-j"), step("remove", "fast", "--yes"),
        step("show", "fast"))
    out = ok(next(ran))
    assert out.startswith("created nightly (version 1): proj.report, at 03:00 UTC"), out
    assert SECRET not in out
    made = json.loads(ok(next(ran)))
    assert {k: made[k] for k in ("name", "version", "task", "schedule", "enabled",
                                 "origin")} == {
        "name": "fast", "version": 1, "task": "proj.ping", "schedule": {"every": 30},
        "enabled": True, "origin": "api"}

    listed = json.loads(ok(next(ran)))
    assert [(e["name"], e["version"]) for e in listed["entries"]] == [("fast", 1),
                                                                      ("nightly", 1)]
    table = ok(next(ran))
    assert "nightly" in table and "at 03:00 UTC" in table
    assert SECRET not in json.dumps(listed) + table  # arguments: show and export only

    shown = json.loads(ok(next(ran)))
    assert (shown["args"], shown["kwargs"], shown["version"], shown["changed_by"]) == (
        [1, SECRET], {"mode": "full"}, 1, "alice@ops")
    assert SECRET in ok(next(ran))

    out = ok(next(ran))
    assert out.startswith("changed nightly (version 2): proj.report, every minute"), out
    stale = one_line(next(ran))
    assert stale == ("beat-claims: entry 'nightly': version 1 is stale, the store holds"
                     " version 2: nothing was written (read it again and edit that version)")
    unnamed = next(ran)
    assert unnamed.code == 2 and "--version N: the version you read" in unnamed.err, unnamed
    assert json.loads(ok(next(ran)))["schedule"] == {"every": 60}

    assert ok(next(ran)).startswith("disabled fast (version 2)")
    assert json.loads(ok(next(ran)))["enabled"] is True

    would = ok(next(ran))
    assert would.startswith("would remove fast (version 3)") and "--yes" in would, would
    assert json.loads(ok(next(ran)))["version"] == 3
    gone = ok(next(ran))
    assert gone.startswith("removed fast (was version 3; its tombstone is version 4)"), gone
    assert one_line(next(ran)) == (
        "beat-claims: no entry 'fast' in the store (deleted)")


def test_export_then_import_into_an_empty_store_brings_the_dynamic_entries_back(
        target: Target, other: Target, tmp_path: Path) -> None:
    for ran in target.each(
            step("add", "a", "--task", "proj.t", "--every", "30", "--args", json.dumps([SECRET])),
            step("add", "b", "--task", "proj.t", "--crontab", "*/5 * * * *", "--timezone",
                 "Europe/Paris", "--options", '{"queue": "slow"}', "--disabled"),
            step("add", "c", "--task", "proj.t", "--clocked", "2030-01-01T00:00:00Z",
                 "--claims", '{"catch_up": "none"}')):
        ok(ran)
    config = validate("config", {"task": "proj.t", "schedule": {"every": 5}}).to_json()
    target.store.write_definitions([DefinitionWrite("config", config, 0, Origin.CONFIG,
                                                    "beat")])
    ran = target.each(step("export"), step("export", "--array"))
    lines = ok(next(ran)).splitlines()
    assert [json.loads(line)["name"] for line in lines] == ["a", "b", "c"]  # not config
    assert json.loads(lines[0])["args"] == [SECRET]
    array = ok(next(ran))
    assert [e["name"] for e in json.loads(array)] == ["a", "b", "c"]
    exported = tmp_path / "entries.jsonl"
    exported.write_text("\n".join(lines) + "\n")
    # A changed file (imported last) changes what differs, at the version read then.
    changed = [json.loads(line) for line in lines]
    changed[0]["schedule"] = {"every": 45}
    edited = tmp_path / "edited.jsonl"
    edited.write_text("\n".join(json.dumps(e) for e in changed))

    dry = other.ok("import", str(exported))
    assert dry.splitlines()[0] == "would create 3: a, b, c", dry
    assert other.store.definitions() == []
    done = json.loads(other.ok("import", str(exported), "--yes", "-j"))
    assert (done["written"], done["create"]) == (True, ["a", "b", "c"])
    assert [r["error"] for r in done["results"]] == [None, None, None]
    wanted = {d.name: d.definition for d in target.store.definitions(["a", "b", "c"])}
    assert {d.name: d.definition for d in other.store.definitions()} == wanted
    ran = other.each(step("import", "-", "--yes", stdin=array),
                     step("import", str(edited), "--yes"), step("show", "a", "-j"))
    again = ok(next(ran))
    assert "unchanged 3: a, b, c" in again, again
    out = ok(next(ran))
    assert "change 1: a" in out and "unchanged 2: b, c" in out, out
    assert json.loads(ok(next(ran)))["version"] == 2


@pytest.mark.parametrize("kind", ["sqlite"])  # (the CLI's refusals: the same on every store)
def test_a_mistake_is_one_line_naming_it_and_nothing_is_written(target: Target,
                                                                tmp_path: Path) -> None:
    lines = tmp_path / "bad.jsonl"
    lines.write_text('{"name": "ok", "task": "proj.t", "schedule": {"every": 5}}\n'
                     '{"name": "worse", "task": "proj.t", "schedule": {"every": -5}}\n')
    ran = target.each(
        step("add", "e", "--task", "proj.t", "--crontab", "61 * * * *"),
        step("add", "e", "--task", "proj.t", "--every", "5", "--options", '{"priority": 300}'),
        step("add", "e", "--task", "proj.t", "--every", "5", "--crontab", "* * * * *"),
        step("import", str(lines), "--yes"))
    bad = one_line(next(ran))
    assert bad.startswith("beat-claims: entry 'e': schedule.crontab.minute: '61' is not a"
                          " valid minute"), bad
    bad = one_line(next(ran))
    assert "entry 'e': options.priority: 300 is not a priority" in bad
    both = next(ran)
    assert both.code == 2 and "give one schedule: --every, --crontab" in both.err, both
    refused = one_line(next(ran))
    assert "entry 'worse': schedule.every: -5 is not a positive number" in refused
    assert target.store.definitions() == []

    config = validate("config", {"task": "proj.t", "schedule": {"every": 5}}).to_json()
    target.store.write_definitions([DefinitionWrite("config", config, 0, Origin.CONFIG,
                                                    "beat")])
    ran = target.each(step("edit", "config", "--version", "1", "--every", "9"),
                      step("remove", "config", "--yes"))
    assert "is defined in beat_schedule" in one_line(next(ran))
    assert "is defined in beat_schedule" in one_line(next(ran))
    assert [d.version for d in target.store.definitions()] == [1]


@pytest.mark.parametrize("kind", ["redis"])
def test_a_stored_definition_that_cannot_be_read_is_listed_without_its_text(
        target: Target, request: pytest.FixtureRequest) -> None:
    """A record whose definition is no longer JSON (a bad restore, a hand edit) is listed
    with its problem, naming the field: never with the text, which holds the arguments;
    nor does one nested too deeply to parse stop the others being read."""
    assert isinstance(target.store, RedisStore)
    target.ok("add", "broken", "--task", "t.noop", "--every", "60",
              "--args", json.dumps([SECRET]))
    request.getfixturevalue("server").client().hset(
        target.store.entry_keys("broken")[0], "definition", json.dumps([SECRET])[:-1])
    [found] = target.store.definitions(["broken"])
    assert found.corrupt and "definition" in found.corrupt, found
    assert SECRET not in found.corrupt, found.corrupt
    # Nested deeper than a JSON parser goes: that record's problem too, not the call's.
    target.ok("add", "deep", "--task", "t.noop", "--every", "60")
    request.getfixturevalue("server").client().hset(
        target.store.entry_keys("deep")[0], "definition", "[" * 50_000 + "]" * 50_000)
    assert "definition" in target.store.definitions(["deep"])[0].corrupt
    for ran in target.each(step("list"), step("list", "-j")):
        assert "broken" in ran.out and "definition" in ran.out, ran
        assert "deep" in ran.out, ran
        assert SECRET not in ran.out + ran.err, ran
