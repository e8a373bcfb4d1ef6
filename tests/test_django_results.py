"""django-celery-results: outcomes no worker reported are read from ``TaskResult`` by the
beat, and the periodic task name is recorded on the result.

The beat is a real Scheduler ticked in this process; the worker (in the second test) is a
real Celery worker in a thread, without beat-claims' worker side: the fleet this recovery
exists for.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from django.db import connections
from django_celery_results.models import TaskResult

import beat_claims.worker
from beat_claims.runs import Run, RunState
from beat_claims.scheduler import Scheduler
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer
from .djangosite.celery import app as site
from .djangosite.testing import PREFIX, poll, site_app
from .inprocess import settled

ENTRY = "results-every-second"


@site.task(name="djangosite.results_probe", shared=False)
def probe() -> str:
    return "probed"


def schedule(task: str) -> dict[str, Any]:
    return {ENTRY: {"task": task, "schedule": timedelta(seconds=1)}}


@pytest.fixture
def store(server: RedisServer) -> RedisStore:
    return RedisStore.from_url(server.url, PREFIX)


def sent_runs(store: RedisStore, beat: Scheduler, count: int) -> list[Run]:
    def enough() -> list[Run] | None:
        sent = [r for r in store.history(ENTRY) if r.state is RunState.SENT]
        return sent[:count] if len(sent) >= count else None

    return poll(enough, 15, f"{count} sent runs", between=beat.tick)


def recovered(store: RedisStore, beat: Scheduler, run: Run, state: RunState) -> Run:
    """Tick the beat until it has read the run's outcome from the result backend."""
    return poll(lambda: next((r for r in store.history(ENTRY)
                              if r.due == run.due and r.state is state), None),
                15, f"{run.due} to be recovered as {state.value}", between=beat.tick)


@pytest.mark.django_db(transaction=True)  # committed rows: the beat reads them in a thread
def test_the_beat_reads_outcomes_from_task_results(server: RedisServer,
                                                   store: RedisStore) -> None:
    with site_app(server.url, server.broker_url(), beat_schedule=schedule("site.tick")) as app:
        assert app.conf.result_backend == "django-db"
        beat = Scheduler(app=app)
        settled(beat)
        try:
            ok, bad = sent_runs(store, beat, 2)
            # What a worker without the hooks leaves: rows in django-celery-results only.
            app.backend.mark_as_done(ok.task_id, "fine")
            app.backend.mark_as_failure(bad.task_id, ValueError("boom"))
            assert TaskResult.objects.filter(task_id__in=[ok.task_id, bad.task_id]).count() == 2
            done = recovered(store, beat, ok, RunState.DONE)
            failed = recovered(store, beat, bad, RunState.FAILED)
        finally:
            beat.close()
    assert done.started_at is None  # no worker hook recorded it: the backend did
    # The type is kept; the message only with beat_claims_exception_messages.
    assert (failed.exc_type, failed.exc_message or "") == ("ValueError", "")


@pytest.fixture
def without_worker_hooks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The worker side off (its signal handlers do nothing without an app)."""
    monkeypatch.setattr(beat_claims.worker._context, "app", None)
    yield


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_records_the_periodic_task_name_and_the_beat_the_outcome(
        server: RedisServer, store: RedisStore, without_worker_hooks: None,
        worker_closes_its_connections: None) -> None:
    with site_app(server.url, server.broker_url(), result_extended=True,
                  beat_schedule=schedule(probe.name)) as app:
        beat = Scheduler(app=app)
        settled(beat)
        try:
            with _worker(app):
                [run] = sent_runs(store, beat, 1)
                result = poll(lambda: TaskResult.objects.filter(
                    task_id=run.task_id, status="SUCCESS").first(), 15,
                    "the worker to store the result")
            assert result.periodic_task_name == ENTRY
            assert result.task_name == probe.name
            done = recovered(store, beat, run, RunState.DONE)
        finally:
            beat.close()
    assert done.started_at is None and done.task_id == result.task_id


@pytest.fixture
def worker_closes_its_connections() -> Iterator[None]:
    """The worker thread's database connection must not outlive it (PostgreSQL refuses to
    drop a test database with open connections)."""
    from celery import signals

    def close(**kwargs: Any) -> None:
        connections.close_all()

    signals.task_postrun.connect(close, weak=False)
    yield
    signals.task_postrun.disconnect(close)


def _worker(app: Celery) -> Any:
    return start_worker(app, pool="solo", concurrency=1, perform_ping_check=False,
                        shutdown_timeout=10, loglevel="WARNING")
