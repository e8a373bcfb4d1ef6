"""``celery claims`` as a Celery user expects it: real ``celery`` processes against a
private store. A user's mistake is one line and exit code 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from beat_claims.enums import RunState
from beat_claims.runs import Owner, iso
from beat_claims.stores.base import Check, ClaimPlan, EntrySeed, Outcome
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer, free_port
from .processes import ROOT

SCHEDULE = {"ok": {"every": 60}, "boom": {"every": 60, "task": "fail"}}


@dataclass
class Ran:
    code: int
    out: str
    err: str


def _environ(server: RedisServer | None, schedule: dict[str, Any] | None,
             env: dict[str, str]) -> dict[str, str]:
    environ = {**os.environ, "BC_SCHEDULE": json.dumps(schedule or SCHEDULE),
               "PYTHONPATH": str(ROOT), **env}
    if server is not None:
        environ.update(BC_REDIS_URL=server.url, BC_BROKER_URL=server.broker_url())
    return environ


def cli(server: RedisServer | None, *args: str, app: bool = True,
        schedule: dict[str, Any] | None = None, stdin: str | None = None, **env: str) -> Ran:
    where = ["-A", "tests.proj.app"] if app else []
    done = subprocess.run([sys.executable, "-m", "celery", *where, "claims", *args], cwd=ROOT,
                          env=_environ(server, schedule, env), capture_output=True, text=True,
                          timeout=60, input=stdin)
    return Ran(done.returncode, done.stdout, done.stderr)


#: ``celery -A tests.proj.app claims ARGS`` for each ARGS of argv[1] (JSON), in one process
#: (Celery's own command line, as ``python -m celery`` runs it): [code, stdout, stderr] each.
_MANY = """
import contextlib, io, json, sys
from celery.bin.celery import celery
done = []
for args in json.loads(sys.argv[1]):
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            celery.main(args=["-A", "tests.proj.app", "claims", *args],
                        standalone_mode=False, auto_envvar_prefix="CELERY")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    done.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(done))
"""


def cli_each(server: RedisServer, commands: list[tuple[str, ...]],
             schedule: dict[str, Any] | None = None, **env: str) -> list[Ran]:
    """What :func:`cli` gives for each of ``commands``, with one process's start for all
    (a command's output does not depend on the ones before it)."""
    done = subprocess.run([sys.executable, "-c", _MANY, json.dumps(commands)], cwd=ROOT,
                          env=_environ(server, schedule, env), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return [Ran(code, out, err) for code, out, err in json.loads(done.stdout)]


#: ``celery -A APP claims ARGS`` (APP: argv[2]) for each [ARGS, STDIN] of argv[1] (JSON),
#: one after the other in one process, each as ``python -m celery`` runs it (Celery's
#: command line in its standalone mode: its exit code, click's usage errors shown), on
#: STDIN: [code, stdout, stderr] each.
_STEPS = """
import contextlib, io, json, sys
from celery.bin.celery import celery
done = []
for args, stdin in json.loads(sys.argv[1]):
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode()))
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            celery.main(args=["-A", sys.argv[2], "claims", *args], prog_name="celery",
                        auto_envvar_prefix="CELERY")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    done.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(done))
"""


def step(*args: str, stdin: str = "") -> tuple[tuple[str, ...], str]:
    """One command of :func:`cli_steps`: its arguments, and what it reads on stdin."""
    return args, stdin


def cli_steps(server: RedisServer | None, steps: list[tuple[tuple[str, ...], str]],
              schedule: dict[str, Any] | None = None, app: str = "tests.proj.app",
              environ: dict[str, str] | None = None, **env: str) -> list[Ran]:
    """What :func:`cli` gives for each of ``steps`` run one after the other (each sees what
    the ones before it wrote to the store), with one process's start for all: ``celery -A
    app``, in ``environ`` when given (the whole environment: another project's), else in
    :func:`cli`'s."""
    done = subprocess.run([sys.executable, "-c", _STEPS, json.dumps(steps), app], cwd=ROOT,
                          env=environ or _environ(server, schedule, env), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [Ran(code, out, err) for code, out, err in json.loads(done.stdout)]


def one_line(ran: Ran) -> str:
    lines = [line for line in ran.err.splitlines() if line.strip()]
    assert ran.code == 1 and len(lines) == 1 and "Traceback" not in ran.err, ran
    return lines[0]


@pytest.fixture
def store(server: RedisServer) -> RedisStore:
    """A store as beats left it: two entries of the schedule with runs, one entry that
    is no longer in the schedule, a beat alive."""
    s = RedisStore.from_url(server.url)
    beat = Owner("0123456789abcdef", "beat-host", 4242, 1_796_000_000.5)
    s.heartbeat(beat, 60)
    states = s.register([EntrySeed(n, "every 60s") for n in ("ok", "boom", "gone")])
    for name, state in states.items():
        [result] = s.claim(beat, [ClaimPlan(name, state, (state.anchor + 1000,))])
        [claim] = result.claims
        s.check(beat, [Check(claim, f"task-{name}")])
        s.record_sent(beat, [claim])
        s.finish([Outcome(name, claim.due, claim.token, RunState.DONE)])
    return s


def test_status_names_beats_as_host_pid_with_their_id_and_times_in_iso(
        server: RedisServer, store: RedisStore) -> None:
    ran, table = cli_steps(server, [step("status", "-j"), step("status")])
    assert ran.code == 0 and table.code == 0, (ran, table)
    doc = json.loads(ran.out)
    [owner] = doc["owners"]
    assert owner["beat"] == "beat-host:4242" and owner["id"] == "0123456789abcdef"
    assert owner["started_at"].endswith("Z") and owner["expires_at"].endswith("Z")
    by_name = {e["name"]: e for e in doc["entries"]}
    assert by_name["gone"]["in_schedule"] is False and by_name["ok"]["in_schedule"] is True
    assert "beat-host:4242 (01234567)" in table.out
    assert "gone (removed)" in table.out and "ok (removed)" not in table.out


def test_history_of_an_unknown_entry_is_an_error(server: RedisServer,
                                                  store: RedisStore) -> None:
    line = one_line(cli(server, "history", "nosuch"))
    assert "no entry 'nosuch'" in line and "ok" in line


@pytest.mark.parametrize("limit", ["0", "-1", "many"])
def test_history_limit_must_be_a_positive_integer(server: RedisServer, store: RedisStore,
                                                  limit: str) -> None:
    ran = cli(server, "history", "ok", "--limit", limit)
    assert ran.code == 2 and "--limit" in ran.err and "Traceback" not in ran.err, ran


def test_history_json_has_a_short_flag_and_help_says_the_defaults(
        server: RedisServer, store: RedisStore) -> None:
    ran, helped = cli_steps(server, [step("history", "ok", "-j"), step("history", "--help")])
    assert ran.code == 0 and json.loads(ran.out)["entry"] == "ok"
    assert helped.code == 0 and "ENTRY (an entry's name" in helped.out
    assert "default: 20" in helped.out


def test_without_an_app_it_says_so_in_one_line(server: RedisServer) -> None:
    line = one_line(cli(None, "status", app=False))
    assert "beat_claims_url" in line and "celery -A proj claims" in line


def test_an_unreachable_store_is_one_line(tmp_path: Any) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    line = one_line(cli(None, "status", BC_REDIS_URL=url, BC_BROKER_URL=url))
    assert "store unreachable" in line and "Connection refused" in line


def test_prune_lists_entries_no_schedule_has_and_removes_them_only_with_yes(
        server: RedisServer, store: RedisStore) -> None:
    # One process for the five commands: each dry run left "gone" in the store, as the last
    # command (--yes) finds it there and removes it, and nothing else. (Beats of a short
    # heartbeat interval: "gone" ran longer than their heartbeat TTL before.)
    ran = cli_steps(server, [
        step("prune", "-j"), step("prune", "--older-than", "0"),
        step("prune", "--older-than", "0", "--dry-run"), step("prune", "--older-than", "0", "-j"),
        step("prune", "--older-than", "0", "--yes")], BC_HEARTBEAT="0.05")
    recent = json.loads(ran[0].out)
    assert recent == {"dry_run": True, "removable": [], "removed": [], "kept_scheduled": 2,
                      "kept_registered": [], "kept_live": [],
                      "kept_recent": ["gone"]}  # it ran a moment ago
    for listed in ran[1:3]:
        assert listed.code == 0 and "would remove 1 entr(ies)" in listed.out, listed
        assert "gone: not in this app's schedule" in listed.out and "--yes" in listed.out, \
            listed
    [removable] = json.loads(ran[3].out)["removable"]
    assert removable["entry"] == "gone" and removable["last_active"].endswith("Z")
    assert "older than 0.2" in removable["why"]  # registered before registrants were kept
    assert ran[4].code == 0 and "removed 1 entr(ies): gone" in ran[4].out, ran[4]
    assert {e.name for e in store.entries()} == {"ok", "boom"}
    assert store.history("gone") == []


def test_prune_keeps_an_entry_active_within_the_beats_heartbeat_ttl_whatever_older_than(
        server: RedisServer, store: RedisStore) -> None:
    """Until every live beat has heartbeated since its last run, a beat may still ask the
    store after its writes of it: removed sooner, they would look lost (a store put back)."""
    listed, said = cli_steps(server, [step("prune", "--older-than", "0", "-j"),
                                      step("prune", "--older-than", "0", "--yes")],
                             BC_HEARTBEAT="100")
    assert json.loads(listed.out)["kept_recent"] == ["gone"], listed
    assert "removed 0 entr(ies)" in said.out, said
    assert "kept 1 active within the beats' heartbeat TTL (300 s" in said.out, said
    assert "gone" in {e.name for e in store.entries()}


def test_status_shows_a_paused_entry_with_who_why_and_since_when(
        server: RedisServer, store: RedisStore) -> None:
    record = store.pause("ok", "alice@ops", "billing migration")
    assert record is not None and record.paused is not None
    ran, table = cli_steps(server, [step("status", "--json"), step("status")])
    doc = json.loads(ran.out)
    by_name = {e["name"]: e for e in doc["entries"]}
    assert by_name["ok"]["paused"] == {"by": "alice@ops", "note": "billing migration",
                                       "at": iso(record.paused.at)}
    assert by_name["boom"]["paused"] is None
    [line] = [row for row in table.out.splitlines() if row.startswith("ok ")]
    assert "PAUSED since" in line and "alice@ops" in line and "billing migration" in line
