"""Whether this beat keeps up: how late it sends what falls due while it runs.

A beat that cannot send its share as fast as it falls due (more entries than its CPU or
its broker can carry) sends later and later, and nothing else says so: the fleet looks
healthy. Each minute this counts the occurrences the beat sent more than :data:`LATE_MS`
after their instant (due, plus the entry's jitter offset), of those due while the beat ran
without a break (a catch-up after an outage or a restart is late by design, as is a run
taken due again: released, taken back, an ``overlap="buffer_one"`` run's turn; and an
operator's run has no instant of the schedule), and says so in one warning a minute while
more than one in a hundred is late (the 99th percentile past a second), and once when it
keeps up again. Counters only: what it keeps does not grow with what is sent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..metrics import Metrics
from ..runs import iso

#: A send later than this after its instant is late.
LATE_MS = 1000
#: The span of each count, and the most often the warning is repeated.
WINDOW_MS = 60_000
#: Late sends a window tolerates, per send: the 99th percentile within LATE_MS.
TOLERATED = 0.01


@dataclass
class _Window:
    started: int
    sent: int = 0
    late: int = 0
    worst: int = 0  # ms


class Lateness:
    def __init__(self, logger: logging.Logger, metrics: Metrics) -> None:
        self.logger = logger
        self.metrics = metrics
        self.window: _Window | None = None
        self.behind = False

    def sent(self, late_ms: int, now: int) -> None:
        """An occurrence due at ``now - late_ms`` (store clock, ms) was sent at ``now``.

        A window is the minute from its first send: the first send after it judges it
        (its own sends, over its minute: a beat idle for hours is not judged over them) and
        opens the next. A store clock that went back before the window began counts
        afresh from here (the window would not end until it came back)."""
        window = self.window
        if window is not None and not window.started <= now < window.started + WINDOW_MS:
            if now >= window.started:
                self._judge(window)
            window = None
        if window is None:
            window = self.window = _Window(now)
        window.sent += 1
        if late_ms > LATE_MS:
            window.late += 1
            window.worst = max(window.worst, late_ms)
            self.metrics.count("sent_late")

    def _judge(self, window: _Window) -> None:
        seconds = WINDOW_MS / 1000
        if window.late > window.sent * TOLERATED:
            self.behind = True
            self.logger.warning(
                "beat-claims: falling behind: %d of the %d occurrences this beat sent in the"
                " %.0fs from %s went out more than %.0fs after their instant (the latest"
                " %.1fs late); it sent %.1f a second. More beats share the load (each claims"
                " what falls due as it can send it)", window.late, window.sent, seconds,
                iso(window.started), LATE_MS / 1000, window.worst / 1000,
                window.sent / seconds)
        elif self.behind:
            self.behind = False
            self.logger.warning("beat-claims: keeping up again: %d occurrences sent in the"
                                " %.0fs from %s, none more than %.0fs after its instant but"
                                " %d", window.sent, seconds, iso(window.started),
                                LATE_MS / 1000, window.late)
