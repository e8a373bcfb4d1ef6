"""beat-claims: many Celery beats, each occurrence claimed before it is sent, and recorded."""

from .runs import Owner, Run, RunState
from .scheduler import Scheduler
from .settings import ConfigurationError

__version__ = "0.1.0"


def install(app: object) -> None:
    """Install the worker side (outcomes and fencing) on a Celery app."""
    from .worker import install as _install

    _install(app)  # type: ignore[arg-type]


__all__ = ["ConfigurationError", "Owner", "Run", "RunState", "Scheduler", "__version__",
           "install"]
