"""What the contract suite needs of a backend: stores, and the faults it can cause."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

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
