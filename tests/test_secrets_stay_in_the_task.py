"""Task arguments never reach a run record, a beat-claims log line, ``celery claims``
output, the admin or the exporter.

Real ``celery beat`` and ``celery worker`` processes run tasks called with secret-looking
arguments through every way a run can end (a failure quoting them, retries given up,
``Reject``, ``Ignore``, soft and hard time limits, a revoke, result-backend recovery, a
publish error), on Redis and on SQLite; then every place beat-claims writes is searched
for them. A run record keeps the exception's type; its message only with
``beat_claims_exception_messages``, argument values masked (the last tests).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import MaxRetriesExceededError
from kombu import Message

from beat_claims import worker
from beat_claims.enums import Reason, RunState
from beat_claims.exception_text import MASK, MESSAGE_LIMIT, ExceptionText, recorded_exception
from beat_claims.runs import Owner, Run, iso, task_id_for
from beat_claims.settings import ConfigurationError, Settings
from beat_claims.stores import open_store
from beat_claims.stores.base import Check, ClaimPlan, Delivery, EntrySeed, Store, WorkerProcess

from .conftest import RedisServer, free_port, own_redis, seed_settled_epoch
from .inprocess import settled_epoch_at
from .processes import ROOT, Fleet, executions, running, wait_for
from .test_cli import cli_each

CARD = "card-4111111111111111"
PASSWORD = "hunter2-SECRET"
CVV = "737-SECRET"
#: What must never be found: the values, and the parts of them a careless text would show.
SECRETS = (CARD, "4111111111111111", PASSWORD, "hunter2", CVV, "SECRET")
ARGS = [CARD, {"cvv": CVV}]
KWARGS = {"password": PASSWORD}
#: Entry -> the task (and routing) it runs, and what its first outcome must be: each is
#: one way a run ends.
PATHS: dict[str, tuple[dict[str, Any], RunState, str]] = {
    "failure": ({"task": "secret_fail"}, RunState.FAILED, "ValueError"),
    "retries": ({"task": "secret_retry"}, RunState.FAILED, "MaxRetriesExceededError"),
    "rejected": ({"task": "secret_reject"}, RunState.CANCELLED, "Reject"),
    "ignored": ({"task": "secret_ignore"}, RunState.DONE, "Ignore"),
    "soft-limit": ({"task": "secret_soft_limit"}, RunState.FAILED, "SoftTimeLimitExceeded"),
    "hard-limit": ({"task": "secret_hard_limit"}, RunState.FAILED, "TimeLimitExceeded"),
    "revoked": ({"task": "secret_slow", "claims": {"overlap": "skip"}}, RunState.CANCELLED,
                ""),
    # Run by a worker without beat-claims' hooks: the beat reads the result backend.
    "recovered": ({"task": "secret_fail", "queue": "nohooks"}, RunState.FAILED, "ValueError"),
    # The serializer cannot encode an argument, and its error quotes the value (catch-up
    # "all": a later occurrence does not skip the one being retried).
    "unpublishable": ({"task": "secret_fail", "unencodable": CARD,
                       "claims": {"catch_up": "all"}}, RunState.FAILED,
                      "EncodeError"),
}
#: The format of the processes' log lines: with the logger's name, to pick beat-claims'.
LOG_FORMAT = "[%(asctime)s: %(levelname)s/%(processName)s %(name)s] %(message)s"
OUR_LOGGERS = ("celery.beat.claims", "celery.worker.claims")


def schedule(paths: dict[str, tuple[dict[str, Any], RunState, str]]) -> dict[str, Any]:
    return {name: {"every": 3, "args": ARGS, "kwargs": KWARGS, **item}
            for name, (item, _, _) in paths.items()}


@dataclass
class Finished:
    """What a fleet left: the store, the first final run of each entry, the processes'
    logs, and what the store's readers print (the CLI, the exporter)."""

    kind: str
    url: str
    server: RedisServer
    store: Store
    conf: dict[str, Any]
    first: dict[str, Run] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {"BC_CONF": json.dumps(self.conf)}


def drive(kind: str, server: RedisServer, tmp: Path, conf: dict[str, Any],
          paths: dict[str, tuple[dict[str, Any], RunState, str]]) -> Finished:
    """Beats and workers on a fresh store of ``kind``, until each entry of ``paths`` has a
    final run other than skipped (a run of ``revoked`` is revoked with terminate=True as
    soon as it starts); then stopped."""
    url = server.url if kind == "redis" else f"sqlite:///{tmp}/claims.db"
    conf = {"beat_claims_url": url, "worker_log_format": LOG_FORMAT, **conf}
    done = Finished(kind, url, server, open_store(Settings(url=url)), conf)
    control = Celery("control", set_as_current=False, broker=server.broker_url())
    client = server.client()
    # A 0.5 s heartbeat: the beat reads the result backend (the "recovered" path) every
    # ten heartbeat intervals (beat_claims/beat/recovery.py), 5 s here.
    f = Fleet(server.url, server.broker_url(), tmp, schedule(paths), **done.env,
              BC_RESULT_BACKEND=f"redis://127.0.0.1:{server.port}/2", BC_HEARTBEAT="0.5")
    with running(f):
        f.worker(concurrency=4)
        if "recovered" in paths:
            f.worker("-Q", "nohooks", concurrency=1, BC_NO_INSTALL="1")
        # The store has run a while (its epoch settled): the beat claims at once, not
        # after a new store's settle period.
        if kind == "redis":
            seed_settled_epoch(server)
        else:
            settled_epoch_at(url)
        f.beat()
        revoked: set[str] = set()

        def all_final() -> bool:
            if "revoked" in paths:
                for row in executions(client):
                    if row["entry"] == "revoked" and row["task_id"] not in revoked:
                        revoked.add(row["task_id"])
                        control.control.revoke(row["task_id"], terminate=True)
            for name in paths:
                if name not in done.first:
                    final = sorted((r for r in done.store.history(name) if r.state.final
                                    and r.state is not RunState.SKIPPED), key=lambda r: r.due)
                    if final:
                        done.first[name] = final[0]
            return len(done.first) == len(paths)

        try:
            wait_for(all_final, 90, "a final run of each entry", interval=0.05)
        except AssertionError:
            missing = {name: [(iso(r.due), r.state.value, r.reason) for r in
                              done.store.history(name)] for name in paths
                       if name not in done.first}
            raise AssertionError(f"no final run (other than skipped) of: {missing}") from None
        f.close()
        for proc in f.procs:
            done.logs[f.logs[proc.pid].name] = f.log(proc)
    return done


@pytest.fixture(scope="module", params=["redis", "sqlite"])
def finished(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Finished]:
    """One fleet per store kind, run once for the tests of this module: a server of its
    own (tests elsewhere flush the session's)."""
    with own_redis() as server:
        tmp = tmp_path_factory.mktemp(f"secrets-{request.param}")
        done = drive(request.param, server, tmp, {}, PATHS)
        yield done
        done.store.close()


# -- what the runs say ------------------------------------------------------------------
def test_each_way_a_run_ends_keeps_the_exception_type_and_no_message(
        finished: Finished) -> None:
    """Each path was driven (else the searches below prove nothing), and its record keeps
    the exception's type, no message."""
    seen = {name: (run.state, run.exc_type or "", run.exc_message or "")
            for name, run in finished.first.items()}
    expected = {name: (state, exc_type, "") for name, (_, state, exc_type) in PATHS.items()}
    # A failed publish is counted by its error text: without the message, the type.
    expected["unpublishable"] = (RunState.FAILED, "EncodeError", "EncodeError")
    assert seen == expected
    assert finished.first["unpublishable"].reason is Reason.PUBLISH_ERROR
    assert finished.first["recovered"].started_at is None  # the backend told the beat


# -- where they are searched for ----------------------------------------------------------
def found(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def store_text(done: Finished) -> str:
    """Everything the store holds but entries' definitions: every key of the store's Redis
    database with every field, member and value; or every row of every table of the SQLite
    file, every column. (An entry's definition holds its arguments, as ``beat_schedule``
    does: each beat writes its ``beat_schedule`` entries there, issue 22.)"""
    if done.kind == "sqlite":
        path = done.url.removeprefix("sqlite:///")
        out: list[str] = []
        with sqlite3.connect(path) as db:
            tables = [row[0] for row in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")]
            assert tables, "no tables in the store's file"
            for table in tables:
                out.append(table)
                rows = db.execute(f'SELECT * FROM "{table}"')
                columns = [c[0] for c in rows.description]
                for row in rows:
                    out.extend(v.decode(errors="replace") if isinstance(v, bytes) else str(v)
                               for column, v in zip(columns, row) if column != "definition")
        return "\n".join(out)
    client = done.server.client()  # db 0: the store (the broker is db 1, results db 2)
    out = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        out.append(key)
        if kind == "string":
            out.append(client.get(key) or "")
        elif kind == "hash":
            out.extend(f"{k}={v}" for k, v in client.hgetall(key).items()
                       if k != "definition")
        elif kind == "list":
            out.extend(client.lrange(key, 0, -1))
        elif kind == "set":
            out.extend(client.smembers(key))
        elif kind == "zset":
            out.extend(f"{m} {s}" for m, s in client.zrange(key, 0, -1, withscores=True))
        elif kind == "stream":
            out.extend(str(item) for item in client.xrange(key))
        else:
            raise AssertionError(f"key {key!r} of type {kind}: not searched")
    assert len(out) > 20, "the store is (nearly) empty"
    return "\n".join(out)


def our_log_records(log: str) -> list[str]:
    """The records of beat-claims' loggers in a process's log (a record: its line and the
    lines that follow it, a traceback), and any line that is beat-claims' own."""
    records: list[str] = []
    for line in log.splitlines():
        if re.match(r"\[\d{4}-\d\d-\d\d ", line) or not records:
            records.append(line)
        else:
            records[-1] += "\n" + line
    return [r for r in records
            if any(f" {name}] " in r.split("\n", 1)[0] for name in OUR_LOGGERS)
            or "beat-claims: " in r]


def test_the_store_holds_no_argument_outside_the_entries_definitions(finished: Finished) -> None:
    text = store_text(finished)
    assert not found(text), [line for line in text.splitlines() if found(line)][:5]


def test_no_beat_claims_log_line_holds_an_argument(finished: Finished) -> None:
    """Celery's own lines may print arguments (its business, README); beat-claims' never,
    including the traceback of a publish error."""
    ours = {name: our_log_records(log) for name, log in finished.logs.items()}
    # (worker-1 runs without beat-claims' hooks: no line of ours)
    assert ours["worker-0.log"] and ours["beat-2.log"], f"no beat-claims line: {ours}"
    beat = ours["beat-2.log"]
    assert any("publishing unpublishable" in r and "EncodeError" in r for r in beat), beat
    leaks = [r for records in ours.values() for r in records if found(r)]
    assert not leaks, leaks[:3]


def test_a_schedule_sources_failing_on_sent_is_logged_without_an_argument(
        server: RedisServer, tmp_path: Path) -> None:
    """A schedule source's ``on_sent`` (a database's bookkeeping after a send) fails with
    an error that quotes the entry's arguments: beat-claims' line keeps the type and the
    frames, as for a publish error."""
    env = {"BC_ON_SENT_FAILS": "1", "BC_CONF": json.dumps({"worker_log_format": LOG_FORMAT})}
    with running(Fleet(server.url, server.broker_url(), tmp_path,
                       schedule({"failure": PATHS["failure"]}), **env)) as f:
        beat = f.beat()
        f.wait_log(beat, "on_sent('failure') failed", 60)
        log = f.log(beat)
    ours = our_log_records(log)
    assert any("on_sent('failure') failed: ValueError" in r for r in ours), ours
    leaks = [r for r in ours if found(r)]
    assert not leaks, leaks[:3]


def test_celery_claims_history_and_status_show_no_argument(finished: Finished) -> None:
    outputs = []
    commands = [("status", "-j"), ("status",), *(("history", name, "-j") for name in PATHS),
                ("history", "failure")]
    for ran in cli_each(finished.server, commands, schedule=schedule(PATHS), **finished.env):
        assert ran.code == 0, ran
        outputs.append(ran.out)
    failed = json.loads(outputs[2])["runs"]
    assert any(r["exc_type"] == "ValueError" for r in failed), failed
    leaks = [out for out in outputs if found(out)]
    assert not leaks, leaks[:1]


def test_the_exporter_shows_no_argument(finished: Finished) -> None:
    port = free_port()
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "BC_REDIS_URL": finished.server.url,
               "BC_BROKER_URL": finished.server.broker_url(),
               "BC_SCHEDULE": json.dumps(schedule(PATHS)), **finished.env}
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.proj.app", "claims", "exporter",
         "--port", str(port), "--addr", "127.0.0.1"], cwd=ROOT, env=environ,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        text = wait_for(lambda: _scrape(port), 30, "the exporter to answer")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    assert 'entry="failure"' in text  # the fleet's entries are there
    assert not found(text), [line for line in text.splitlines() if found(line)][:5]


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            return str(reply.read().decode())
    except (urllib.error.URLError, ConnectionError):
        return None


@pytest.mark.django_db
def test_the_admin_pages_show_no_argument(finished: Finished, client: Any) -> None:
    """The entries page and each entry's page, from the store the fleet wrote (the site's
    app schedules the same entries, with their arguments)."""
    from celery.schedules import schedule as every

    from .djangosite.testing import site_app
    from .test_django_admin import login, url

    beat_schedule = {name: {"task": "proj." + item["task"], "schedule": every(3),
                            "args": ARGS, "kwargs": KWARGS}
                     for name, (item, _, _) in PATHS.items()}
    with site_app(finished.url, finished.server.broker_url(), beat_claims_key_prefix=
                  "beat-claims", beat_schedule=beat_schedule,
                  beat_claims_result_backend_recovery=False):
        login(client)
        pages = {"changelist": client.get(url("changelist"))}
        for name in PATHS:
            pages[name] = client.get(url("change", name))
    for name, page in pages.items():
        assert page.status_code == 200, (name, page.status_code)
    html = {name: page.content.decode() for name, page in pages.items()}
    assert "TimeLimitExceeded" in html["hard-limit"]  # its runs are on the page
    leaks = {name: found(text) for name, text in html.items() if found(text)}
    assert not leaks, leaks


@pytest.mark.django_db
def test_a_database_row_whose_arguments_cannot_be_read_is_named_not_quoted(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """django-celery-beat's row with an argument kombu's JSON refuses (an unknown
    ``__type__``: kombu's error quotes the whole object): the line that leaves the row out
    names it and where its JSON failed, never the value."""
    import logging

    from .test_django_beat import every, row, scheduler

    row("bad-type", interval=every(2), args=json.dumps([{"__type__": "x", "__value__": CARD}]))
    row("bad-json", interval=every(2), kwargs=f'{{"password": "{PASSWORD}"')
    with caplog.at_level(logging.WARNING, logger="celery.beat.claims"):
        s = scheduler(server)
    s.close()
    text = caplog.text
    assert "'bad-type' is not scheduled: args, kwargs or headers are not JSON (ValueError)" in text
    assert "'bad-json' is not scheduled: args, kwargs or headers are not JSON (Expecting" in text
    assert not found(text), text


# -- with beat_claims_exception_messages ----------------------------------------------------
def test_with_exception_messages_on_the_message_is_kept_argument_values_masked(
        tmp_path: Path) -> None:
    """A real fleet with the setting on: messages are kept, every argument value in them
    masked; Celery's MaxRetriesExceededError (its message is the arguments) is never
    kept; beat-claims' log lines hold no argument either."""
    paths = {name: PATHS[name] for name in ("failure", "retries", "recovered",
                                            "unpublishable")}
    with own_redis() as server:
        # (the backend keeps the delivery's arguments: the beat masks the recovered
        # outcome's message with them)
        done = drive("redis", server, tmp_path, {"beat_claims_exception_messages": True,
                                                 "result_extended": True}, paths)
        done.store.close()
        text = store_text(done)
    messages = {name: run.exc_message or "" for name, run in done.first.items()}
    assert messages["failure"].startswith(f"bad card ({MASK}, {{{MASK}: {MASK}}}) "
                                          f"{{'password': {MASK}}}"), messages
    assert messages["recovered"] == messages["failure"], messages
    assert messages["unpublishable"] == f"cannot encode {MASK}", messages
    assert messages["retries"] == "", messages
    assert not found(text)
    leaks = [r for log in done.logs.values() for r in our_log_records(log) if found(r)]
    assert not leaks, leaks[:3]


def test_an_outcome_read_from_the_result_backend_keeps_no_message_the_beat_cannot_mask(
        tmp_path: Path) -> None:
    """With the setting on, a run recovered from the result backend: the beat knows the
    entry's arguments as it schedules them now, not those the delivery had (a value the
    beat evaluates at each send, ``BeatLazyFunc``: another token each time; a database
    row edited since). Without the arguments the backend kept (``result_extended``), no
    message is kept."""
    paths = {"recovered": ({"task": "secret_fail", "queue": "nohooks", "lazy_token": True},
                           RunState.FAILED, "ValueError")}
    with own_redis() as server:
        done = drive("redis", server, tmp_path, {"beat_claims_exception_messages": True},
                     paths)
        done.store.close()
        text = store_text(done)
    run = done.first["recovered"]
    assert (run.exc_type, run.exc_message or "") == ("ValueError", ""), run
    assert not found(text), [line for line in text.splitlines() if found(line)][:5]


# -- the one function that decides ----------------------------------------------------------
ON = Settings(url="redis://unused", exception_messages=True)
OFF = Settings(url="redis://unused")


def test_by_default_only_the_type_is_kept() -> None:
    assert recorded_exception(ValueError(f"bad {CARD}"), ARGS, KWARGS, OFF) == ExceptionText(
        "ValueError")


def test_every_form_of_every_value_is_masked_wherever_it_is_nested() -> None:
    args = [CARD, 4111, 3.25, b"raw-SECRET", {"nested-SECRET": [("deep-SECRET",)]},
            True, None]
    message = (f"{CARD} {CARD!r} 4111 3.25 {b'raw-SECRET'!r} raw-SECRET nested-SECRET"
               f" deep-SECRET {PASSWORD!r} True None password")
    text = recorded_exception(ValueError(message), args, KWARGS, ON)
    assert text.message == (f"{MASK} {MASK} {MASK} {MASK} {MASK} {MASK} {MASK} {MASK}"
                            f" {MASK} {MASK} None password")  # (a keyword's name is code)


def test_values_that_overlap_are_masked_as_one_and_short_ones_too() -> None:
    assert recorded_exception(ValueError("x abcd y 7"), ["ab", "bc", "cd", 7], {},
                              ON).message == f"x {MASK} y {MASK}"


def test_an_objects_attributes_are_masked() -> None:
    class Card:
        def __init__(self) -> None:
            self.number = CARD

    text = recorded_exception(ValueError(f"cannot charge {CARD}"), [Card()], {}, ON)
    assert text.message == f"cannot charge {MASK}"


def test_the_message_is_cut_after_masking() -> None:
    """Cut first, the start of a value at the limit would be kept ("ca")."""
    long = ValueError("x" * (MESSAGE_LIMIT - 2) + CARD)
    assert recorded_exception(long, [CARD], {}, ON).message == (
        "x" * (MESSAGE_LIMIT - 2) + MASK[:2])
    huge = ValueError("y" * 100_000 + CARD)
    assert len(recorded_exception(huge, [CARD], {}, ON).message) == MESSAGE_LIMIT


def test_a_value_cut_where_a_long_message_is_searched_is_masked() -> None:
    from beat_claims.exception_text import SCAN_LIMIT, _masked

    text = "z" * (SCAN_LIMIT - 5) + CARD
    assert _masked(text, {CARD}).endswith(MASK)
    assert CARD[:5] not in _masked(text, {CARD})


def test_no_message_when_the_arguments_are_unknown_or_too_many_or_too_deep() -> None:
    exc = ValueError(f"bad {CARD}")
    assert recorded_exception(exc, None, None, ON).message == ""
    assert recorded_exception(exc, [list(range(2000)), CARD], {}, ON).message == ""
    deep: Any = CARD
    for _ in range(20):
        deep = [deep]
    assert recorded_exception(exc, [deep], {}, ON).message == ""


def test_celerys_max_retries_message_is_never_kept() -> None:
    exc = MaxRetriesExceededError(f"Can't retry t[1] args:{tuple(ARGS)} kwargs:{KWARGS}")
    assert recorded_exception(exc, ARGS, KWARGS, ON) == ExceptionText(
        "MaxRetriesExceededError")


def test_the_setting_is_validated() -> None:
    app = Celery("settings", set_as_current=False)
    app.conf.update(beat_claims_url="redis://unused", beat_claims_exception_messages="yes")
    with pytest.raises(ConfigurationError, match="beat_claims_exception_messages='yes'"):
        Settings.from_app(app)
    app.conf.beat_claims_exception_messages = True
    assert Settings.from_app(app).exception_messages is True


# -- the worker's paths no fleet above takes --------------------------------------------
@pytest.fixture
def sent_run(server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Run]:
    """A run a beat sent, and the worker side of this process pointed at its store with
    exception messages on."""
    app = Celery("unit", set_as_current=False)
    app.conf.update(beat_claims_url=server.url, beat_claims_exception_messages=True)
    context = worker._Context()
    context.app = app
    monkeypatch.setattr(worker, "_context", context)
    store = open_store(Settings.from_app(app))
    beat = Owner(id="unit-beat", host="h", pid=1, started_at=1.0)
    state = store.register([EntrySeed("e", "every 1s")])["e"]
    due = state.anchor + 1000
    [claim] = store.claim(beat, [ClaimPlan("e", state, (due,))])[0].claims
    store.check(beat, [Check(claim, task_id_for("e", due))])
    assert store.record_sent(beat, [claim]) == 1
    yield next(r for r in store.history("e") if r.due == due)
    store.close()


def _run(server: RedisServer, due: int) -> Run:
    store = open_store(Settings(url=server.url))
    try:
        return next(r for r in store.history("e") if r.due == due)
    finally:
        store.close()


def test_a_message_the_worker_rejects_keeps_its_arguments_masked(
        server: RedisServer, sent_run: Run) -> None:
    """Celery's ``task_rejected``: the arguments are read from the message's body."""
    header = {"entry": "e", "due": iso(sent_run.due), "token": sent_run.token}
    body = json.dumps([ARGS, KWARGS, {}])
    message = Message(body=body, content_type="application/json",
                      content_encoding="utf-8",
                      headers={"id": sent_run.task_id, "beat_claims": header})
    worker._on_rejected(message=message, exc=ValueError(f"cannot run {ARGS} {KWARGS}"))
    run = _run(server, sent_run.due)
    assert run.state is RunState.CANCELLED and run.exc_type == "ValueError"
    assert run.exc_message == f"cannot run [{MASK}, {{{MASK}: {MASK}}}] {{'password': {MASK}}}"


def test_a_rejected_message_whose_body_cannot_be_read_keeps_no_message(
        server: RedisServer, sent_run: Run) -> None:
    header = {"entry": "e", "due": iso(sent_run.due), "token": sent_run.token}
    message = Message(body=f"not json {CARD}", content_type="application/json",
                      content_encoding="utf-8",
                      headers={"id": sent_run.task_id, "beat_claims": header})
    worker._on_rejected(message=message, exc=ValueError(f"undecodable: {CARD}"))
    run = _run(server, sent_run.due)
    assert (run.state, run.exc_type, run.exc_message or "") == (RunState.CANCELLED,
                                                                "ValueError", "")


def test_an_internal_error_keeps_its_arguments_masked(server: RedisServer,
                                                      sent_run: Run) -> None:
    """Celery's ``task_internal_error`` (an error outside the task's body), for a delivery
    that started the run (the signal carries only the task id)."""
    store = open_store(Settings(url=server.url))
    assert store.start(Delivery("e", sent_run.due, sent_run.token, WorkerProcess("w@h", 2, "p"),
                                task_id=sent_run.task_id or "")).ok
    store.close()
    worker._on_internal_error(task_id=sent_run.task_id, args=ARGS, kwargs=KWARGS,
                              exception=RuntimeError(f"tracer failed on {CARD}"))
    run = _run(server, sent_run.due)
    assert (run.state, run.exc_type, run.exc_message) == (
        RunState.FAILED, "RuntimeError", f"tracer failed on {MASK}")
