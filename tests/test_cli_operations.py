"""The CLI's write actions end to end: real ``celery ... claims`` processes, a real beat,
real stores (Redis and SQLite): pause, trigger, resume, backfill and release, each
recorded with who asked; a request that cannot be done is one line and exit code 1."""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.schedules import schedule

from beat_claims import operations
from beat_claims.enums import Reason, RunState
from beat_claims.runs import Owner, Run, iso
from beat_claims.settings import ConfigurationError, Settings
from beat_claims.stores import open_store
from beat_claims.stores.base import ClaimPlan, EntrySeed, EntryState, Store

from .conftest import RedisServer, free_port, seed_settled_epoch
from .inprocess import settled_epoch_at
from .processes import Fleet, fleet, wait_for
from .test_cli import Ran, cli, cli_steps, one_line, step

pytestmark = pytest.mark.integration

#: A beat that fell silent while holding a claim: alive (its heartbeat is renewed by the
#: test), never sending.
STUCK = Owner("5c0ffee5c0ffee00", "stuck-host", 4242, 1_796_000_000.0)


@dataclass
class Target:
    """A store the CLI, the beats and the test share (Redis is also the broker)."""

    kind: str
    url: str
    server: RedisServer
    store: Store

    def conf(self, **more: Any) -> dict[str, str]:
        return {"BC_CONF": json.dumps({"beat_claims_url": self.url, **more})}

    def cli(self, *args: str, schedule: dict[str, Any], conf: dict[str, Any] | None = None,
            **env: str) -> Ran:
        return cli(self.server, *args, schedule=schedule, **self.conf(**(conf or {})), **env)

    def steps(self, *steps: tuple[tuple[str, ...], str], schedule: dict[str, Any],
              conf: dict[str, Any] | None = None, **env: str) -> list[Ran]:
        """What :meth:`cli` gives for each of ``steps`` (:func:`step`), run one after the
        other in one ``celery`` process."""
        return cli_steps(self.server, list(steps), schedule=schedule,
                         **self.conf(**(conf or {})), **env)

    def fleet(self, tmp_path: Path, schedule: dict[str, Any],
              conf: dict[str, Any] | None = None, **env: str
              ) -> AbstractContextManager[Fleet]:
        return fleet(self.server.url, self.server.broker_url(), tmp_path, schedule,
                     **self.conf(**(conf or {})), **env)

    def settled(self) -> None:
        """The store has run a while (its epoch settled): the beats claim at once, not
        after a new store's settle period."""
        if self.kind == "redis":
            seed_settled_epoch(self.server)
        else:
            settled_epoch_at(self.url)

    def runs(self, entry: str) -> dict[int, Run]:
        return {r.due: r for r in self.store.history(entry)}

    def state(self, entry: str) -> EntryState:
        [found] = self.store.entries([entry])
        assert found.anchor is not None
        return EntryState(found.anchor, found.checkpoint, found.token)


def targets(kind: str, server: RedisServer, tmp_path: Path) -> Iterator[Target]:
    """The fixtures' body: a fresh store of ``kind`` (``redis``: the server's first db)."""
    url = server.url if kind == "redis" else f"sqlite:///{tmp_path}/claims.db"
    t = Target(kind, url, server, open_store(Settings(url=url)))
    yield t
    t.store.close()


@pytest.fixture(params=["redis", "sqlite"])
def target(request: pytest.FixtureRequest, server: RedisServer,
           tmp_path: Path) -> Iterator[Target]:
    yield from targets(request.param, server, tmp_path)



def hold_a_claim(t: Target, entry: str) -> int:
    """STUCK claims the entry's next occurrence and keeps it: the due instant."""
    t.store.heartbeat(STUCK, 120)
    state = t.state(entry)
    due = (state.checkpoint or state.anchor) + 1000
    [result] = t.store.claim(STUCK, [ClaimPlan(entry, state, (due,))])
    assert [c.due for c in result.claims] == [due], result
    return due


def as_json(ran: Ran) -> dict[str, Any]:
    assert ran.code == 0, ran
    doc: dict[str, Any] = json.loads(ran.out)
    return doc


def ms(text: str) -> int:
    return operations.parse_instant(text, "instant")


SCHEDULE = {"tick": {"every": 1}, "hourly": {"every": 3600}}
FAST = {"tick": {"every": 0.1}}


@pytest.mark.parametrize("target", ["redis"], indirect=True)  # others: tests/contract
def test_pause_trigger_resume_backfill_release_with_a_real_beat(
        target: Target, tmp_path: Path) -> None:
    t = target
    t.settled()  # the beat claims at once, without settling first
    with t.fleet(tmp_path, SCHEDULE) as f:
        f.beat()
        wait_for(lambda: any(r.state is RunState.SENT for r in t.runs("tick").values()), 40,
                 "the beat to send tick")

        # pause: who, why, since when; from then on every occurrence is skipped (paused).
        paused = as_json(t.cli("pause", "tick", "--note", "maintenance", "--by", "alice",
                               "-j", schedule=SCHEDULE))
        assert (paused["entry"], paused["paused"], paused["paused_by"],
                paused["paused_note"]) == ("tick", True, "alice", "maintenance")
        paused_at = ms(paused["paused_at"])

        def after_pause() -> list[Run]:
            return [r for d, r in t.runs("tick").items() if d > paused_at and not r.manual]

        wait_for(lambda: len(after_pause()) >= 2, 20, "two occurrences due while paused")

        # trigger while paused: an operator's request is sent; who asked is the default.
        triggered = as_json(t.cli("trigger", "tick", "-j", schedule=SCHEDULE))
        me = f"{getpass.getuser()}@{socket.gethostname()}"
        assert (triggered["by"], triggered["in_schedule"]) == (me, True)
        due = triggered["due_ms"]
        wait_for(lambda: (r := t.runs("tick").get(due)) is not None
                 and r.state is RunState.SENT, 20, "the triggered run to be sent")
        assert (t.runs("tick")[due].manual, t.runs("tick")[due].requested_by) == (True, me)

        resumed = as_json(t.cli("resume", "tick", "--by", "bob", "-j", schedule=SCHEDULE))
        assert (resumed["paused"], resumed["resumed"], resumed["resumed_by"]) == (
            False, True, "bob")
        resumed_at = ms(resumed["resumed_at"])
        wait_for(lambda: any(d > resumed_at and r.state is RunState.SENT and not r.manual
                             for d, r in t.runs("tick").items()), 20,
                 "an occurrence after the resume to be sent")
        # Every occurrence of the paused stretch has its record by now: skipped (paused),
        # or sent where the beat claimed it just after the resume.
        grid = operations.backfill_dues(schedule(timedelta(seconds=1)), t.state("tick").anchor,
                                        paused_at, resumed_at, 1000)
        before = t.runs("tick")
        assert set(grid) <= set(before)
        skipped = [before[d] for d in grid if before[d].state is RunState.SKIPPED]
        on_time = [d for d in grid if before[d] not in skipped]  # claimed after the resume
        assert len(skipped) >= 2 and {r.reason for r in skipped} == {Reason.PAUSED}
        assert not on_time or min(on_time) > skipped[-1].due

        # backfill what the pause skipped: created, and sent by the beat, once each.
        done = as_json(t.cli("backfill", "tick", "--from", iso(paused_at) or "",
                             "--to", iso(resumed_at) or "", "--by", "carol", "-j",
                             schedule=SCHEDULE))
        assert done["by"] == "carol" and done["occurrences"] == len(grid)
        assert [ms(d) for d in done["created"]] == [r.due for r in skipped]
        assert [ms(k["due"]) for k in done["kept"]] == on_time
        assert {k["state"] for k in done["kept"]} <= {"claimed", "sending", "sent"}

        def backfilled() -> list[Run]:
            return [t.runs("tick")[r.due] for r in skipped]

        wait_for(lambda: all(r.state is RunState.SENT for r in backfilled()), 20,
                 "every backfilled run to be sent")
        assert {(r.manual, r.requested_by) for r in backfilled()} == {(True, "carol")}
        again = as_json(t.cli("backfill", "tick", "--from", iso(paused_at) or "",
                              "--to", iso(resumed_at) or "", "-j", schedule=SCHEDULE))
        assert again["created"] == [] and {k["state"] for k in again["kept"]} == {"sent"}

        # release: a claim held by a beat that never sends is due again; the live beat
        # sends it with a fresh token.
        held = hold_a_claim(t, "hourly")
        old_token = t.runs("hourly")[held].token
        freed = as_json(t.cli("release", "hourly", iso(held) or "", "--by", "dave", "-j",
                              schedule=SCHEDULE))
        assert (freed["released"], freed["due_ms"], freed["by"]) == (True, held, "dave")
        wait_for(lambda: t.runs("hourly")[held].state is RunState.SENT, 20,
                 "the released run to be sent by the live beat")
        assert t.runs("hourly")[held].token > old_token
        line = one_line(t.cli("release", "hourly", str(held), schedule=SCHEDULE))
        assert "is sent, not claimed: nothing was released" in line


@pytest.mark.parametrize("target", ["redis"], indirect=True)
def test_requests_that_cannot_be_done_are_one_line(target: Target) -> None:
    t = target
    t.store.heartbeat(STUCK, 120)
    t.store.register([EntrySeed("tick", "every 0.1s"), EntrySeed("gone", "every 0.1s")])
    anchor = t.state("tick").anchor
    wait_for(lambda: t.store.now() > anchor + 1000, 15, "ten occurrences of tick")
    future = iso(t.store.now() + 3_600_000) or ""
    second = ("--from", iso(anchor) or "", "--to", iso(anchor + 1000) or "")
    # One process for the commands of each configuration.
    nosuch, in_future, bad, helped = t.steps(
        step("pause", "nosuch"), step("backfill", "tick", "--from", iso(anchor) or "",
                                      "--to", future),
        step("backfill", "tick", "--from", "yesterday", "--to", future),
        step("backfill", "--help"), schedule=FAST)
    line = one_line(nosuch)
    assert "no entry 'nosuch' in the store" in line and "tick" in line
    line = one_line(in_future)
    assert "in the future of the store's clock" in line and "trigger" in line
    [over] = t.steps(step("backfill", "tick", *second), schedule=FAST,
                     conf={"beat_claims_backfill_limit": 3})
    line = one_line(over)
    assert "tick has 9 occurrences" in line and "beat_claims_backfill_limit=3" in line
    assert t.runs("tick") == {}  # nothing was created
    # Within the backfill limit, but more than the entry's history keeps: refused by the
    # store, in one line naming the setting, and nothing recorded.
    [beyond] = t.steps(step("backfill", "tick", *second), schedule=FAST,
                       conf={"beat_claims_history_limit": 3})
    line = one_line(beyond)
    assert "beat_claims_history_limit=3" in line and "Nothing was recorded" in line, line
    assert t.runs("tick") == {}
    assert bad.code == 2 and "ISO 8601" in bad.err and "Traceback" not in bad.err, bad
    assert "without an offset it is UTC" in bad.err or "without an offset it is UTC" in \
        helped.out
    # The same refusals, as the admin meets them (no process needed).
    every = schedule(timedelta(seconds=0.1))
    with pytest.raises(operations.OperationError, match="is not before"):
        operations.backfill(t.store, "tick", every, anchor + 5000, anchor + 5000, "x", 10)
    with pytest.raises(operations.OperationError, match="not in this app's schedule"):
        operations.backfill(t.store, "gone", None, anchor, anchor + 1000, "x", 10)  # past
    with pytest.raises(operations.UnknownEntry):
        operations.release(t.store, "nosuch", anchor, "x")


def test_a_backfill_never_runs_again_what_the_trimmed_history_forgot(
        target: Target, tmp_path: Path) -> None:
    """A beat and a worker ran tick every 0.2 s for a while, with a history of 5 runs: the
    first occurrences that ran are no longer in the store. A backfill from the entry's
    anchor is refused, naming the horizon and the setting, and records nothing (it used to
    run them again, with new tokens); one after the horizon keeps every run, as they all
    ran."""
    t = target
    conf = {"beat_claims_history_limit": 5}
    every = {"tick": {"every": 0.2}}
    t.settled()
    ran: set[int] = set()

    def ran_many() -> bool:
        ran.update(r.due for r in t.runs("tick").values() if r.state is RunState.DONE)
        return len(ran) >= 20

    with t.fleet(tmp_path, every, conf=conf) as f:
        f.worker()
        beat = f.beat()
        wait_for(ran_many, 60, "tick to run 20 times")
        f.stop(beat)
        wait_for(lambda: all(r.state.final for r in t.runs("tick").values()), 30,
                 "the worker to finish what the beat sent")
    before = t.runs("tick")
    # Three occurrences in a row that ran and were trimmed (the store no longer holds them;
    # within what one backfill may create, beside no live run). On a loaded machine a late
    # occurrence may be skipped by the catch-up policy: the three are the first such row.
    trimmed = sorted(due for due in ran if due not in before)
    first = next((due for due in trimmed if {due + 200, due + 400} <= ran), None)
    assert first is not None, f"no three runs in a row among those trimmed: {trimmed}"
    [horizon] = [e.history_horizon for e in t.store.entries(["tick"])]
    assert horizon is not None and horizon >= first, (horizon, first)
    # Both backfills in one process: the store is unchanged after them (below).
    refusal, keeping = t.steps(
        step("backfill", "tick", "--from", iso(first) or "", "--to", iso(first + 600) or ""),
        step("backfill", "tick", "--from", iso(horizon + 1) or "",
             "--to", iso(max(ran) + 1) or "", "-j"), schedule=every, conf=conf)
    refused = one_line(refusal)
    assert "beat_claims_history_limit=5" in refused, refused
    assert "nothing was recorded" in refused, refused
    assert iso(horizon) in refused, refused
    kept = as_json(keeping)
    assert kept["created"] == [] and kept["kept"], kept  # what it holds ran: kept
    assert t.runs("tick") == before  # nothing was created


def test_a_write_action_on_an_unreachable_store_is_one_line() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    line = one_line(cli(None, "pause", "tick", BC_REDIS_URL=url, BC_BROKER_URL=url))
    assert "store unreachable" in line


def test_backfill_computes_what_the_beat_computes_and_stops_counting_at_the_limit(
        ) -> None:
    from celery.schedules import crontab

    anchor = ms("2026-01-01T00:00:00.250Z")
    every_minute = schedule(timedelta(minutes=1))
    dues = operations.backfill_dues(every_minute, anchor, anchor - 600_000,
                                    anchor + 180_250, 100)
    # After the anchor only, on its phase, [from, to).
    assert dues == [anchor + 60_000, anchor + 120_000, anchor + 180_000]
    nightly = crontab(minute="0", hour="2")
    dues = operations.backfill_dues(nightly, anchor, ms("2026-01-03T02:00:00Z"),
                                    ms("2026-01-05T02:00:00Z"), 100)
    assert [iso(d) for d in dues] == ["2026-01-03T02:00:00.000Z", "2026-01-04T02:00:00.000Z"]
    calls = []
    counting = crontab(minute="*")
    real = counting.remaining_estimate

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    counting.remaining_estimate = counted  # type: ignore[method-assign]
    with pytest.raises(operations.OperationError, match="more than 5 occurrences"):
        operations.backfill_dues(counting, anchor, anchor, anchor + 365 * 86_400_000, 5)
    assert len(calls) <= 7  # a year of minutes, walked six steps
    with pytest.raises(operations.OperationError, match="525599 occurrences"):
        operations.backfill_dues(every_minute, anchor, anchor, anchor + 365 * 86_400_000, 5)


@pytest.mark.parametrize(("setting", "value"), [("beat_claims_backfill_limit", 0),
                                                ("beat_claims_backfill_limit", "many"),
                                                ("beat_claims_health_grace", -1)])
def test_the_new_settings_are_validated(setting: str, value: Any) -> None:
    app = Celery("s", set_as_current=False)
    app.conf.update({"broker_url": "redis://127.0.0.1:1/0", setting: value})
    with pytest.raises(ConfigurationError, match=setting):
        Settings.from_app(app)
    app.conf.update({setting: 7})
    assert getattr(Settings.from_app(app), setting.removeprefix("beat_claims_")) == 7
