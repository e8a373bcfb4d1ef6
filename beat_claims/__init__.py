"""beat-claims: many Celery beats, each occurrence claimed before it is sent, and recorded."""

from celery import Celery

from .runs import Owner, Run, RunState
from .scheduler import Scheduler
from .settings import ConfigurationError

__version__ = "0.1.0"


def install(app: Celery) -> None:
    """Install the worker side (outcomes and fencing) on a Celery app."""
    from .worker import install as _install

    _install(app)


__all__ = ["ConfigurationError", "Owner", "Run", "RunState", "Scheduler", "__version__",
           "install"]
