"""Stopping a beat cleanly: SIGTERM and SIGINT while it gives back its claims, and the
callers (Celery's beat service, its stop handler) that change what a stop or an error does.

Nothing that waits (a store call, the claim thread) runs inside a signal handler, where the
code it interrupted may hold what that would wait for: a stop signal that arrives while
the beat gives back is held, and delivered once it is done.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from celery import signals

_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


#: The handlers replaced, and the signals that arrived meanwhile.
Held = tuple[dict[Any, Any], list[int]]


def hold_stop_signals() -> Held | None:
    """Defer SIGTERM/SIGINT while close() gives back claims: a second Ctrl-C must not cut
    it short. (Blocking the signal in this thread is not enough: another thread may take
    it, and Python runs the handler here all the same.)"""
    if threading.current_thread() is not threading.main_thread():
        return None
    pending: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        pending.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in _STOP_SIGNALS}
    return previous, pending


def deliver_held(held: Held | None) -> None:
    """Put the previous handlers back, then deliver what arrived meanwhile, once each."""
    if held is None:
        return
    previous, pending = held
    for sig, handler in previous.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    for sig in dict.fromkeys(pending):
        signal.raise_signal(sig)


def built_by_celery_beat() -> bool:
    """Whether Celery's beat service is building this scheduler (``celery beat``, ``worker
    -B``, or its banner): a configuration error is then one line and an exit, not a
    traceback. Built by other code (a test, a script), the error is raised as it is."""
    return _called_from("celery.beat", "get_scheduler")


def in_celery_stop_handler() -> bool:
    """Whether ``celery beat``'s SIGTERM/SIGINT handler is running (it closes the scheduler,
    then raises SystemExit, and the service closes it again on its way out)."""
    return _called_from("celery.apps.beat", "_sync")


def _called_from(module: str, function: str) -> bool:
    """Whether ``function`` of ``module`` is among the callers of the caller."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__") == module and frame.f_code.co_name == function:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


@signals.beat_embedded_init.connect
def _stop_cleanly_when_embedded(sender: Any = None, **kwargs: Any) -> None:
    """``worker -B`` runs beat in a child process that is stopped with SIGTERM: exit
    through the normal path so that close() gives back what this beat claimed."""
    from ..scheduler import Scheduler  # (imported by then: it imports this module)

    if threading.current_thread() is not threading.main_thread():
        return
    scheduler = getattr(sender, "scheduler", None)
    if not isinstance(scheduler, Scheduler):
        return

    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit()

    signal.signal(signal.SIGTERM, _exit)
