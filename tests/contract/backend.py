"""What the contract suite needs of a backend: stores, and the faults it can cause."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import pytest

from beat_claims.stores.base import Store, WorkerProcess


@dataclass(frozen=True)
class Backend:
    """How the suite gets stores of one backend, and breaks them."""

    open: Callable[[pytest.FixtureRequest, int], AbstractContextManager[Store]]
    """``open(request, history_limit)``: a fresh, empty store, closed on exit."""
    reopen: Callable[[Store], Store]
    """Another client of the same store (what another process would open)."""
    corrupt_run: Callable[[Store, str, int, str], None]
    """``corrupt_run(store, entry, due, raw)``: the run's stored record becomes ``raw``
    (a JSON text, or not even that)."""
    corrupt_entry_field: Callable[[Store, str, str, str], None]
    """``corrupt_entry_field(store, entry, field, raw)``: one of the entry's stored fields
    (``anchor``, ``checkpoint``, ``token``) becomes ``raw``."""
    wipe: Callable[[Store], None]
    """The store loses everything (a restart without persistence, a FLUSHALL)."""
    restart: Callable[[Store], None]
    """The store's server restarts, with the data it had (as from a snapshot taken just
    before); returns once it answers again."""
    corrupt_worker_record: Callable[[Store, WorkerProcess, str], None]
    """``corrupt_worker_record(store, process, raw)``: the stored liveness record of a worker
    process that had a heartbeat becomes ``raw`` (a JSON text, or not even that)."""
    copy: Callable[[Store], Callable[[], None]]
    """``copy(store)``: a copy of the store's data taken now; calling what it returns puts
    the store back to that copy (a restore from an older copy: whatever was written since
    is gone), as an operator would with the backend's own tools."""
    drop_next_due: Callable[[Store, str], None]
    """``drop_next_due(store, entry)``: the entry has no ``next_due`` at all, as a store of
    the layout before the due index holds it (or one written by such a version)."""
    drop_entry_record: Callable[[Store, str], None]
    """``drop_entry_record(store, entry)``: the entry's own record is gone, its runs stay (a
    key evicted or deleted, a table restored from an older copy apart from the others);
    skips the test where the store cannot hold runs without their entry."""
    round_trips: Callable[[Store], Callable[[], int]]
    """``round_trips(store)``: from now on, count the store's round trips to its server
    (Redis pipelines, PostgreSQL statements, SQLite transactions); what it returns reads
    the count."""


def counting(store: Store, method: str) -> Callable[[], int]:
    """Count the calls of the store's ``method`` (its one way to its server) from now on."""
    calls = [0]
    real = getattr(store, method)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    setattr(store, method, counted)
    return lambda: calls[0]
