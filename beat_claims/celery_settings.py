"""Celery's own ``beat_*`` settings under beat-claims: each honoured, mapped, or named.

- ``beat_schedule``, ``beat_scheduler``, ``beat_enable_remote_control``,
  ``beat_remote_control_max_tick_age``: read by Celery, as with any scheduler.
- ``beat_max_loop_interval`` (``--max-interval``): no sleep between two ticks is longer,
  outages included; the beat also wakes every ``beat_claims_heartbeat_interval`` to renew
  its heartbeat, so a longer value has no effect beyond that.
- ``beat_cron_starting_deadline``: the catch-up window of crontab entries (Celery applies
  it to those alone): a missed run older than it is skipped (and recorded so), the newest
  one within it runs; unless ``beat_claims_catch_up_window`` is set (then that applies to
  every entry) or an entry's own ``claims`` says otherwise (``Settings.default_policy``).
- ``beat_sync_every``, ``beat_schedule_filename`` (``--schedule``): nothing to sync, no
  file; the store holds what a beat must remember, written as it happens.

A setting given a value beat-claims does not apply as Celery would is named at start, in
one WARNING line (:func:`not_applied`): a setting that silently does nothing would let a
user believe it does. Defaults are never named.
"""

from __future__ import annotations

from typing import Any

from .settings import Settings, cron_starting_deadline, max_loop_interval

#: Celery's default ``beat_schedule_filename``.
DEFAULT_SCHEDULE_FILENAME = "celerybeat-schedule"


def not_applied(conf: Any, settings: Settings, *, schedule_filename: Any = None,
                max_interval: Any = None) -> list[str]:
    """Each of Celery's ``beat_*`` settings set to a value beat-claims does not apply as
    Celery would: the setting, its value and what the beat does instead. A value no beat
    can run with is refused (:class:`ConfigurationError`, naming the setting).
    ``schedule_filename`` and ``max_interval``: what Celery's beat service passed the
    scheduler (the command line's ``--schedule`` and ``--max-interval``, else the
    settings)."""
    notes = []
    asked = max_interval or conf.get("beat_max_loop_interval")
    loop = max_loop_interval(conf, max_interval)  # (refused when not a positive number)
    if loop is not None and loop > settings.heartbeat_interval:
        notes.append(f"beat_max_loop_interval={asked!r} (the beat wakes at least every"
                     f" beat_claims_heartbeat_interval, {settings.heartbeat_interval:g} s,"
                     " to renew its heartbeat)")
    deadline = cron_starting_deadline(conf)
    window = settings.policy.catch_up_window
    if deadline is not None and window is not None:
        notes.append(f"beat_cron_starting_deadline={conf.get('beat_cron_starting_deadline')!r}"
                     f" (beat_claims_catch_up_window={window:g} s applies to every entry"
                     " instead)")
    sync_every = conf.get("beat_sync_every")
    if sync_every:
        notes.append(f"beat_sync_every={sync_every!r} (nothing to sync: claims and runs are"
                     " written to the store as they happen)")
    filename = schedule_filename or conf.get("beat_schedule_filename")
    if filename and filename != DEFAULT_SCHEDULE_FILENAME:
        notes.append(f"beat_schedule_filename={filename!r} (no schedule file: the store holds"
                     " what a beat must remember)")
    return notes


def start_line(notes: list[str]) -> str | None:
    """The one line a beat logs at start for ``notes`` (None: nothing to say)."""
    if not notes:
        return None
    return ("beat-claims: Celery settings not applied as Celery would: " + "; ".join(notes))
