"""'Now' by the store: its clock at the last reading plus monotonic time since.

The beat host's wall clock is never read for scheduling: a step of it (NTP, a VM resumed,
an operator) between two heartbeats changes nothing. Intervals (heartbeat, re-checks,
backoff) are measured with the monotonic clock alone.
"""

from __future__ import annotations

import time


class StoreClock:
    def __init__(self) -> None:
        self._store_ms: int | None = None
        self._mono = 0.0

    @property
    def known(self) -> bool:
        return self._store_ms is not None

    def set(self, store_ms: int, asked_at: float, answered_at: float) -> None:
        """The store read ``store_ms`` somewhere between two monotonic instants: take the
        middle (the error is at most half the round trip)."""
        self._store_ms = store_ms
        self._mono = (asked_at + answered_at) / 2

    def now(self) -> int:
        """The store's clock now, in UTC ms (0 before the first reading)."""
        if self._store_ms is None:
            return 0
        return self._store_ms + int((time.monotonic() - self._mono) * 1000)

    def seconds_since_reading(self) -> float:
        return time.monotonic() - self._mono if self._store_ms is not None else float("inf")
