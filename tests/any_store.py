"""Schedulers ticked in this process against a real store of each kind (Redis, SQLite,
PostgreSQL, MySQL), a worker's part done from the broker's messages, copies of the store taken
and put back in place, and what the beats logged about a store that went back.

The broker is the Redis fixture server's db 1 (tests/inprocess.py); the store is that
server's db 0, a SQLite file of the test's own, or a PostgreSQL database of its own."""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from celery import Celery

from beat_claims.enums import RunState
from beat_claims.inspect import open_store
from beat_claims.runs import iso
from beat_claims.stores.base import Delivery, Outcome, Store, WorkerProcess

from .conftest import RedisServer
from .inprocess import make_app, messages, settled_epoch_at
from .test_integration_fleet import claims_url
from .test_store_put_back import (
    Copy,
    mysql_data_only,
    postgres_data_only,
    redis_restore_keys,
    sqlite_backup_api,
)

#: What a beat logs when it takes its store for one that lost writes (any way it found out).
WENT_BACK = "the store may have lost writes"
WORKER = WorkerProcess("w1@test", 11, "boot:11")


class StoreUnderTest:
    """A store of one kind for the test: its URL, and how to copy it and put the copy back
    in place (SQLite's backup API, a PostgreSQL or MySQL data-only dump loaded again, every
    Redis key RESTOREd): its epoch and identity are the copy's, as in the same file, server or
    process."""

    def __init__(self, kind: str, url: str, server: RedisServer) -> None:
        self.kind, self.url, self.server = kind, url, server

    def copy(self) -> Copy:
        if self.kind == "sqlite":
            return sqlite_backup_api(self.url)
        if self.kind == "postgres":
            return postgres_data_only(self.url)
        if self.kind == "mysql":
            return mysql_data_only(self.url)
        return redis_restore_keys(self.server)(self.url)

    def app(self, schedule: dict[str, Any], **conf: Any) -> Celery:
        return make_app(self.server, schedule, beat_claims_url=self.url, **conf)

    def open(self) -> Store:
        """A client of the test's own (a worker's, an operator's): it never heartbeats."""
        app = Celery("observer", set_as_current=False)
        app.conf.beat_claims_url = self.url
        return open_store(app)

    def settled(self) -> None:
        """The store has run a while: its epoch exists and has settled, as after a beat
        with a short TTL that heartbeated a moment ago and stopped. The beats of a test with
        long heartbeat intervals then claim at their first heartbeat (a beat that finds a
        recent heartbeat and no live beat joins at once), rather than after the new epoch's
        settle period of one of their TTLs (15 s at the default interval)."""
        settled_epoch_at(self.url)


@contextlib.contextmanager
def store_of(kind: str, server: RedisServer, tmp_path: Path) -> Iterator[StoreUnderTest]:
    """A fresh store of ``kind`` (redis, sqlite, postgres or mysql) for one test: the fixture
    ``any_store`` (tests/conftest.py) makes one of each."""
    with claims_url(kind, server, tmp_path) as url:
        yield StoreUnderTest(kind, url, server)


class Worker:
    """What a worker with the hooks does with every message on the broker, once each: start
    its run by the message's token and, if the store lets it, finish it. ``executed``: the
    (entry, due, token) of every delivery that ran."""

    def __init__(self, store: Store, broker: RedisServer) -> None:
        self.store, self.broker = store, broker
        self.taken = 0
        self.executed: list[tuple[str, str, int]] = []

    def step(self) -> None:
        found = messages(self.broker)
        for message in found[self.taken:]:
            meta = message["claims"]
            if not meta:
                continue
            entry = meta["entry"]
            due = next((r.due for r in self.store.history(entry) if iso(r.due) == meta["due"]),
                       None)
            if due is not None and self.store.start(
                    Delivery(entry, due, meta["token"], WORKER)).ok:
                self.executed.append((entry, meta["due"], meta["token"]))
                self.store.finish([Outcome(entry, due, meta["token"], RunState.DONE)])
        self.taken = len(found)


def published(broker: RedisServer) -> list[tuple[str, str, int]]:
    """(entry, due, token) of every message beat-claims published, oldest first."""
    return [(m["claims"]["entry"], m["claims"]["due"], m["claims"]["token"])
            for m in messages(broker) if m["claims"]]


def sent_twice(broker: RedisServer) -> dict[str, Any]:
    """What was published more than once: occurrences (with their tokens), and tokens used
    for two occurrences (with their instants). Empty when nothing was."""
    tokens: dict[tuple[str, str], list[int]] = defaultdict(list)
    dues: dict[tuple[str, int], list[str]] = defaultdict(list)
    for entry, due, token in published(broker):
        tokens[(entry, due)].append(token)
        dues[(entry, token)].append(due)
    found = {"occurrences": {k: v for k, v in tokens.items() if len(v) > 1},
             "tokens": {k: v for k, v in dues.items() if len(set(v)) > 1}}
    return {what: twice for what, twice in found.items() if twice}


def went_back_lines(records: list[logging.LogRecord]) -> list[str]:
    """The beats' lines saying they took the store for one that lost writes."""
    return [r.getMessage() for r in records if WENT_BACK in r.getMessage()]
