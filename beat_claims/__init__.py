"""beat-claims: many Celery beats, each occurrence claimed before it is sent, and recorded."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery import Celery

from .enums import CatchUp, Overlap, Reason, RunState
from .runs import Owner, Run
from .settings import ConfigurationError
from .urls import hide_from_celerys_reports

hide_from_celerys_reports()

if TYPE_CHECKING:
    from .scheduler import Scheduler

__version__ = "0.2.0.dev0"


def install(app: Celery) -> None:
    """Install the worker side (outcomes and fencing) on a Celery app."""
    from .worker import install as _install

    _install(app)


def __getattr__(name: str) -> Any:
    # The beat side is imported on first use: a worker that only installs the hooks does
    # not load it.
    if name == "Scheduler":
        from .scheduler import Scheduler

        return Scheduler
    raise AttributeError(f"module 'beat_claims' has no attribute {name!r}")


__all__ = ["CatchUp", "ConfigurationError", "Overlap", "Owner", "Reason", "Run", "RunState",
           "Scheduler", "__version__", "install"]
