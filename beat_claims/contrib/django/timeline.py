"""Timelines the admin draws on the server, as inline SVG (no script, no external asset):
an entry's recent runs (due instant, sent, started, finished, coloured by state; skipped
and lost in shapes of their own), and the fleet's last hour, a lane a beat (what each
sent, minute by minute).

Colours come from the page's style (``bc-tl-<state>`` classes), so both of the admin's
themes apply. Every text is escaped; a run's arguments are never read here (the run
documents carry none).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any

from django.utils.safestring import SafeString, mark_safe

from beat_claims.runs import Run

#: The drawing's coordinates (it scales to the width of its box).
WIDTH = 1000
LABEL = 170  # the fleet's lane labels
LANE = 14
AXIS = 18
#: The most lanes an entry's overlapping runs are spread over.
MAX_LANES = 6
MINUTE = 60_000
HOUR = 3_600_000


@dataclass(frozen=True)
class Span:
    """One run on the time axis (UTC milliseconds; None where it has no such instant)."""

    due: int
    state: str
    sent: int | None
    started: int | None
    finished: int | None
    title: str

    @property
    def end(self) -> int:
        """Where its drawing ends: when it finished if it ran (a run that never started,
        skipped or lost, ends where it was sent, or at its due instant)."""
        if self.started is None:
            return max(self.due, self.sent or self.due)
        return max(t for t in (self.due, self.sent, self.started, self.finished) if t)


def ms(value: str | None) -> int | None:
    """An ISO 8601 UTC instant of a run document, in milliseconds."""
    if not value:
        return None
    return round(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)


def entry_svg(runs: list[dict[str, Any]], label: Callable[[int], str]) -> SafeString:
    """An entry's runs (status documents, newest first) on one time axis: a mark at each
    due instant (a diamond when skipped, a cross when lost), a thin line to when it was
    sent, a thicker one to when it started and a bar to when it finished. ``label`` says
    an instant as the page says times."""
    spans = [Span(r["due_ms"], r["state"], ms(r.get("sent_at")), ms(r.get("started_at")),
                  ms(r.get("finished_at")), _run_title(r)) for r in runs]
    if not spans:
        return mark_safe("")
    start = min(s.due for s in spans)
    end = max(max(s.end for s in spans), start + 1000)
    scale = (WIDTH - 20) / (end - start)

    def x(t: int) -> float:
        return round(10 + (t - start) * scale, 1)

    lanes: list[float] = []
    parts = []
    for span in sorted(spans, key=lambda s: s.due):
        lane = next((i for i, free in enumerate(lanes) if free < x(span.due) - 6), None)
        if lane is None and len(lanes) < MAX_LANES:
            lanes.append(0.0)
            lane = len(lanes) - 1
        elif lane is None:  # the lane free the soonest
            lane = min(range(len(lanes)), key=lanes.__getitem__)
        lanes[lane] = x(span.end)
        parts.append(_run_mark(span, x, 6 + lane * LANE + LANE / 2))
    height = 6 + len(lanes) * LANE + AXIS
    axis = _axis(start, end, x, height - AXIS, label)
    return _svg("bc-timeline", height, f"Runs from {label(start)} to {label(end)}",
                parts + axis)


#: The most entries named in a cell of the fleet's timeline (the others are counted).
NAMED = 5


class FleetCounts:
    """The fleet's recent runs, counted as they are read (the entries page reads every
    entry's history once): a cell a beat and a minute, with its runs by state and at most
    :data:`NAMED` entry names, so that what is kept grows with the beats and the minutes,
    never with the runs. ``since``: runs sent (or due, when not sent) before it are left
    out."""

    def __init__(self, since: int) -> None:
        self.since = since
        #: (owner, minute) -> runs by state; names: the first NAMED entries, with counts.
        self.states: dict[tuple[str, int], Counter[str]] = defaultdict(Counter)
        self.names: dict[tuple[str, int], Counter[str]] = defaultdict(Counter)

    def add(self, entry: str, state: str, owner: str | None, at: int) -> None:
        """One run: its entry, state, beat (None: none) and when it was sent (or due)."""
        if at < self.since:
            return
        cell = (owner or "", at // MINUTE)
        self.states[cell][state] += 1
        named = self.names[cell]
        if entry in named or len(named) < NAMED:
            named[entry] += 1

    def add_runs(self, runs: Iterable[Run]) -> None:
        for run in runs:
            self.add(run.entry, run.state.value, run.owner, run.sent_at or run.due)

    def size(self) -> int:
        """How many counters it keeps (bounded by beats x minutes x (states + NAMED))."""
        return sum(len(c) for c in self.states.values()) + sum(
            len(c) for c in self.names.values())

    def svg(self, beats: dict[str, str], now: int, label: Callable[[int], str]
            ) -> SafeString:
        """The hour before ``now``, by whole minutes: a lane a beat (``beats``: owner id ->
        its name) that sent or recorded a run in it, each minute a bar of its runs stacked
        by state, the entries named in its title."""
        start, first = now - HOUR, (now - HOUR) // MINUTE
        cells: dict[str, dict[int, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        names: dict[str, dict[int, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        for (owner, minute), counts in self.states.items():
            if not first <= minute <= (now - 1) // MINUTE:
                continue
            lane = beats.get(owner, owner[:8]) if owner else "(no beat)"
            cells[lane][minute - first] += counts
            names[lane][minute - first] += self.names[(owner, minute)]
        if not cells:
            return mark_safe("")
        width = (WIDTH - LABEL - 10) / 61  # (an hour spans 61 minutes of the clock)

        def x(t: int) -> float:
            return round(LABEL + (t - first * MINUTE) / MINUTE * width, 1)

        peak = max(sum(c.values()) for lane in cells.values() for c in lane.values())
        parts = []
        for i, lane in enumerate(sorted(cells)):
            top = 6 + i * (LANE + 6)
            marks = [f'<text class="bc-tl-label" x="{LABEL - 6}" y="{top + LANE - 3}"'
                     f' text-anchor="end">{escape(_short(lane, 26))}</text>']
            for slot, counts in sorted(cells[lane].items()):
                title = escape(f"{lane}, {label((first + slot) * MINUTE)}:"
                               f" {_said(counts, names[lane][slot])}")
                bottom = float(top + LANE)
                for state, n in sorted(counts.items(), key=lambda kv: _order(kv[0])):
                    high = max(2.0, LANE * n / peak)
                    bottom -= high
                    marks.append(f'<rect class="bc-tl-mark bc-tl-{escape(state)}"'
                                 f' x="{LABEL + slot * width:.1f}" y="{bottom:.1f}"'
                                 f' width="{max(width - 2, 1):.1f}" height="{high:.1f}">'
                                 f"<title>{title}</title></rect>")
            parts.append(f'<g class="bc-fleet-lane" data-beat="{escape(lane)}">'
                         + "".join(marks) + "</g>")
        height = 6 + len(cells) * (LANE + 6) + AXIS
        axis = _axis(start, now, x, height - AXIS, label)
        return _svg("bc-fleet", height, f"Runs sent by each beat from {label(start)} to"
                    f" {label(now)}", parts + axis)


def _said(counts: Counter[str], named: Counter[str]) -> str:
    """A cell's runs by state, and the entries named (``a x2, b and 40 more``)."""
    entries = ", ".join(f"{e} x{n}" if n > 1 else e for e, n in named.most_common())
    more = sum(counts.values()) - sum(named.values())
    if more > 0:
        entries += f" and {more} more"
    return ", ".join(f"{n} {state}" for state, n in counts.most_common()) + f" ({entries})"


def fleet_svg(runs: Iterable[dict[str, Any]], beats: dict[str, str], now: int,
              label: Callable[[int], str]) -> SafeString:
    """The last hour before ``now`` of ``runs`` (status documents): see
    :meth:`FleetCounts.svg`."""
    counts = FleetCounts(now - HOUR)
    for run in runs:
        at = ms(run.get("sent_at")) or run["due_ms"]
        if at < now:
            counts.add(run["entry"], run["state"], run.get("owner"), at)
    return counts.svg(beats, now, label)


def _run_mark(span: Span, x: Callable[[int], float], y: float) -> str:
    state = escape(span.state)
    shapes = []
    if span.sent:
        shapes.append(f'<line class="bc-tl-wait" x1="{x(span.due)}" y1="{y}"'
                      f' x2="{x(span.sent)}" y2="{y}"/>')
    if span.sent and span.started:
        shapes.append(f'<line class="bc-tl-queue bc-tl-{state}" x1="{x(span.sent)}"'
                      f' y1="{y}" x2="{x(span.started)}" y2="{y}"/>')
    if span.started:
        until = span.finished or span.end
        shapes.append(f'<rect class="bc-tl-bar bc-tl-{state}" x="{x(span.started)}"'
                      f' y="{y - 3}" width="{max(x(until) - x(span.started), 2):.1f}"'
                      f' height="6"/>')
    cx = x(span.due)
    if span.state == "skipped":
        mark = (f'<polygon class="bc-tl-mark bc-tl-{state}" points="{cx},{y - 5}'
                f" {cx + 5},{y} {cx},{y + 5} {cx - 5},{y}\"/>")
    elif span.state == "lost":
        d = 4.5
        mark = (f'<path class="bc-tl-mark bc-tl-{state}" d="M{cx - d},{y - d + 1.5}'
                f"l1.5,-1.5 l{d - 1.5},{d - 1.5} l{d - 1.5},-{d - 1.5} l1.5,1.5"
                f" l-{d - 1.5},{d - 1.5} l{d - 1.5},{d - 1.5} l-1.5,1.5"
                f" l-{d - 1.5},-{d - 1.5} l-{d - 1.5},{d - 1.5} l-1.5,-1.5"
                f' l{d - 1.5},-{d - 1.5}z"/>')
    else:
        mark = f'<circle class="bc-tl-mark bc-tl-{state}" cx="{cx}" cy="{y}" r="3.5"/>'
    return (f'<g class="bc-tl-run" data-state="{state}"><title>{escape(span.title)}</title>'
            + "".join(shapes) + mark + "</g>")


def _run_title(run: dict[str, Any]) -> str:
    due = run["due_ms"]
    said = [f"{run['state']}, due {run['due']}"]
    for field, name in (("sent_at", "sent"), ("started_at", "started"),
                        ("finished_at", "finished")):
        at = ms(run.get(field))
        if at is not None:
            said.append(f"{name} {after(due, at)}")
    detail = run.get("reason") or run.get("exc_type")
    if detail:
        said.append(str(detail))
    return ", ".join(said)


def after(due: int, at: int) -> str:
    """How long after ``due`` an instant came: ``+12 ms``, ``+1.5 s``, ``+3 min``."""
    gap = at - due
    sign = "+" if gap >= 0 else "-"
    gap = abs(gap)
    if gap < 1000:
        return f"{sign}{gap} ms"
    if gap < 60_000:
        return f"{sign}{gap / 1000:.1f} s"
    if gap < HOUR:
        return f"{sign}{gap / MINUTE:.0f} min"
    if gap < 48 * HOUR:
        return f"{sign}{gap / HOUR:.1f} h"
    return f"{sign}{gap / (24 * HOUR):.0f} d"


def _axis(start: int, end: int, x: Callable[[int], float], y: float,
          label: Callable[[int], str]) -> list[str]:
    return [f'<line class="bc-tl-axis" x1="{x(start)}" y1="{y}" x2="{x(end)}" y2="{y}"/>',
            f'<text class="bc-tl-label" x="{x(start)}" y="{y + 13}">'
            f"{escape(label(start))}</text>",
            f'<text class="bc-tl-label" x="{x(end)}" y="{y + 13}" text-anchor="end">'
            f"{escape(label(end))}</text>"]


def _svg(ident: str, height: float, title: str, parts: list[str]) -> SafeString:
    return mark_safe(  # every text in it is escaped above
        f'<svg id="{ident}" class="bc-tl" viewBox="0 0 {WIDTH} {height:.0f}"'
        f' role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(title)}</title>" + "".join(parts) + "</svg>")


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


#: The order states are stacked in (finished first, from the bottom).
ORDER = ("done", "failed", "lost", "skipped", "cancelled", "started", "sent", "sending",
         "claimed", "due", "waiting")


def _order(state: str) -> int:
    return ORDER.index(state) if state in ORDER else len(ORDER)
