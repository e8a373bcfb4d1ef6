"""An outage of the store or of the broker: logged once when it starts, reminded at a
bounded rate while it lasts, logged once when it ends; retried with backoff."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

#: The longest wait between two tries.
MAX_BACKOFF = 30.0
#: While an outage lasts, a reminder at most this often.
REMIND_EVERY = 300.0


class Outage:
    def __init__(self, what: str, where: str, logger: logging.Logger, consequence: str,
                 max_backoff: float = MAX_BACKOFF,
                 waiting: Callable[[], int] | None = None) -> None:
        self.what = what
        self.waiting_runs = waiting
        self.max_backoff = max_backoff
        self.where = where
        self.logger = logger
        self.consequence = consequence
        self.since: float | None = None
        self.backoff = 0.0
        self.retry_at = 0.0
        self._reminded = 0.0

    @property
    def active(self) -> bool:
        return self.since is not None

    def waiting(self) -> float:
        """Seconds until the next try (0: try now)."""
        return max(0.0, self.retry_at - time.monotonic())

    def down(self, exc: BaseException) -> float:
        """A try failed: note it, log it if it is news, and return the wait before the
        next one."""
        now = time.monotonic()
        if self.since is None:
            self.since = self._reminded = now
            self.logger.error("beat-claims: %s unreachable (%s; %s: %s); %s. Retrying with"
                              " backoff; logged once per outage.", self.what, self.where,
                              type(exc).__name__, exc, self.consequence)
        elif now - self._reminded >= REMIND_EVERY:
            self._reminded = now
            waiting = (f"; {self.waiting_runs()} entr(ies) have occurrences waiting"
                       if self.waiting_runs is not None else "")
            self.logger.error("beat-claims: %s still unreachable after %.0fs (%s: %s)%s",
                              self.what, now - self.since, type(exc).__name__, exc, waiting)
        self.backoff = min(self.max_backoff, max(0.5, self.backoff * 2))
        self.retry_at = now + self.backoff
        return self.backoff

    def up(self) -> None:
        if self.since is not None:
            self.logger.warning("beat-claims: %s reachable again after %.1fs; catching up"
                                " by policy", self.what, time.monotonic() - self.since)
        self.since = None
        self.backoff = 0.0
        self.retry_at = 0.0
