"""The admin's SVG timelines, as text: every run a mark of its state, every text escaped
(an entry's name, a beat's host, an exception's type are whatever they are), nothing
external referenced."""

from __future__ import annotations

import re

from beat_claims.contrib.django.timeline import NAMED, FleetCounts, after, entry_svg, fleet_svg
from beat_claims.runs import Run, RunState

NOW = 1_800_000_000_000
HOSTILE = '<script>alert("x")</script>&'


def run(due: int, state: str, **more: object) -> dict[str, object]:
    return {"entry": HOSTILE, "due": "2027-01-15T08:00:00.000Z", "due_ms": due,
            "state": state, "owner": "beat-1", "sent_at": None, "started_at": None,
            "finished_at": None, "reason": None, "exc_type": None, **more}


def label(ms: int) -> str:
    return f"t{ms}"


def test_an_entrys_timeline_has_a_mark_a_run_in_its_states_shape() -> None:
    runs = [run(NOW - 20_000, "skipped", reason="overlap"),
            run(NOW - 10_000, "lost", sent_at="2027-01-15T08:00:00.100Z"),
            run(NOW, "failed", exc_type=HOSTILE, sent_at="2027-01-15T08:00:00.100Z",
                started_at="2027-01-15T08:00:00.200Z", finished_at="2027-01-15T08:00:01.000Z")]
    svg = str(entry_svg(runs, label))
    marks = re.findall(r'<g class="bc-tl-run" data-state="(\w+)">.*?<(\w+) class="bc-tl-mark',
                       svg)
    assert sorted(marks) == [("failed", "circle"), ("lost", "path"), ("skipped", "polygon")]
    assert "<script" not in svg and "&lt;script&gt;" in svg
    assert "href" not in svg and "url(" not in svg  # no external asset
    assert str(entry_svg([], label)) == ""


def test_the_fleets_timeline_has_a_lane_a_beat_with_its_last_hour() -> None:
    runs = [run(NOW - 60_000, "done", sent_at=None),
            run(NOW - 120_000, "skipped", owner=None),
            run(NOW - 2 * 3_600_000, "done")]  # before the hour: left out
    svg = str(fleet_svg(runs, {"beat-1": HOSTILE}, NOW, label))
    lanes = re.findall(r'<g class="bc-fleet-lane" data-beat="([^"]*)">', svg)
    assert sorted(lanes) == ["&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;",
                             "(no beat)"]
    assert svg.count('class="bc-tl-mark') == 2 and "<script" not in svg


def test_a_runs_times_are_said_after_its_due_instant() -> None:
    assert [after(0, t) for t in (12, 1500, 180_000, 5_400_000, 3 * 86_400_000)] == [
        "+12 ms", "+1.5 s", "+3 min", "+1.5 h", "+3 d"]


def test_the_fleets_hour_is_counted_as_runs_are_read_in_memory_bounded_by_beats_and_minutes(
        ) -> None:
    """The entries page reads every entry's history once: the fleet's timeline counts each
    run as it is read (a cell a beat and a minute, a few entry names each), never keeps the
    runs, so a fleet of many entries does not hold all their runs at once."""
    counts = FleetCounts(since=NOW - 3_600_000)
    counts.add_runs(Run(f"entry-{i}", NOW - 1 - (i % 3_600) * 1000, RunState.DONE,
                        owner=f"beat-{i % 2}", sent_at=NOW - (i % 3_600) * 1000)
                    for i in range(20_000))
    assert counts.size() <= 2 * 61 * (1 + NAMED), counts.size()
    svg = str(counts.svg({"beat-0": "A", "beat-1": "B"}, NOW, label))
    assert re.findall(r'data-beat="(\w)"', svg) == ["A", "B"]
    [title] = re.findall(r"<title>(A, t\d+: [^<]*)</title>", svg)[:1]
    assert "more" in title, title
