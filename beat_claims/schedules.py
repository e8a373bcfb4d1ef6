"""beat-claims' own Celery schedules, for what Celery's cannot say: a crontab in its own
timezone, and one instant.

Celery's ``crontab`` has no timezone of its own: it reads the app's (``tz``, a cached
property), and a timezone set on an instance is lost by every copy (``__reduce__`` keeps
the fields only), so ``occurrences.py``, which works on copies, would fire it at the
app's wall times. ``zoned_crontab`` carries its zone through copies and pickles, and
Celery's own crontab arithmetic reads it there (``occurrences.py`` takes the next wall
time from Celery's ``remaining_delta`` in the schedule's zone and counts it in UTC, DST
included).
``clocked`` is one absolute instant, in UTC milliseconds as the store keeps instants:
``occurrences.clocked_instant`` reads it as it reads django-celery-beat's (which this
module does not import).
"""

from __future__ import annotations

from datetime import datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from celery.schedules import CRON_REPR, BaseSchedule, crontab, schedstate
from celery.utils.time import maybe_make_aware

from .runs import from_ms, iso


class zoned_crontab(crontab):  # (lower case, as Celery's schedules)
    """A crontab whose fields are wall times in ``timezone`` (an IANA name), whatever the
    app's timezone: at 02:30 Europe/Paris every day is 00:30Z in summer, 01:30Z in winter.
    """

    def __init__(self, minute: Any = "*", hour: Any = "*", day_of_week: Any = "*",
                 day_of_month: Any = "*", month_of_year: Any = "*",
                 timezone: str = "UTC", **kwargs: Any) -> None:
        self.zone_name = timezone
        self.zone = ZoneInfo(timezone)
        super().__init__(minute, hour, day_of_week, day_of_month, month_of_year, **kwargs)

    @property
    def tz(self) -> tzinfo:
        """Celery's crontab reads its timezone here (the app's, for its own crontab)."""
        return self.zone

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self._orig_minute, self._orig_hour, self._orig_day_of_week,
                                 self._orig_day_of_month, self._orig_month_of_year,
                                 self.zone_name), self._orig_kwargs)

    def __repr__(self) -> str:
        return f"{CRON_REPR.format(self)[:-1]} {self.zone_name}>"

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, crontab):
            return (isinstance(other, zoned_crontab) and other.zone_name == self.zone_name
                    and bool(super().__eq__(other)))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # (as Celery's crontab: equal when equal)


class clocked(BaseSchedule):  # (lower case, as Celery's schedules)
    """One instant, ``at_ms`` (UTC milliseconds): due once, then never again."""

    def __init__(self, at_ms: int, nowfun: Any = None, app: Any = None) -> None:
        self.at_ms = int(at_ms)
        super().__init__(nowfun=nowfun, app=app)

    @property
    def clocked_time(self) -> datetime:
        return from_ms(self.at_ms)

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        left: timedelta = self.clocked_time - maybe_make_aware(self.now())
        return left

    def is_due(self, last_run_at: datetime) -> Any:
        """For Celery's own beat: due once the instant has come, unless it ran since."""
        left = self.remaining_estimate(last_run_at).total_seconds()
        if left > 0:
            return schedstate(is_due=False, next=left)
        ran = last_run_at is not None and maybe_make_aware(last_run_at) >= self.clocked_time
        return schedstate(is_due=not ran, next=24 * 3600.0)

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__class__, (self.at_ms, self.nowfun)

    def __repr__(self) -> str:
        return f"<clocked: {iso(self.at_ms)}>"

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, clocked):
            return other.at_ms == self.at_ms
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


__all__ = ["clocked", "zoned_crontab"]
