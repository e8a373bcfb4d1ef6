"""The beat's long-lived objects, kept out of the garbage collector's full walks."""

from __future__ import annotations

import gc
import threading

_frozen = False  # (read and written by the main thread only)


def freeze_long_lived() -> bool:
    """Once per process, when the schedule is first registered: what is alive then (Celery's
    app, the modules, the schedule, the heap of due instants) lives as long as the beat, and
    a full collection would walk all of it again in the middle of a burst (one took 40-50 ms
    at 5,000 entries). Frozen (:func:`gc.freeze`), a full collection walks only what came
    later. Garbage is collected first, so nothing unreachable is kept; an object frozen and
    dropped later is still freed when nothing refers to it (only a cycle of such objects
    stays, at most what was alive at this instant). The freeze is the whole process's: a
    beat ticked in a thread of another program (Celery's embedded beat as a thread) leaves
    that program's heap alone. True when it froze."""
    global _frozen
    if threading.current_thread() is not threading.main_thread():
        return False
    if _frozen:
        return False
    _frozen = True
    gc.collect()
    gc.freeze()
    return True
