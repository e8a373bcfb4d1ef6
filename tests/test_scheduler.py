"""The Scheduler, tick by tick in this process, against a real redis-server and broker."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from kombu.exceptions import OperationalError

from beat_claims import occurrences
from beat_claims.runs import Owner, RunState, iso, task_id_for
from beat_claims.settings import ConfigurationError
from beat_claims.stores.base import ClaimPlan, Reclaim

from .conftest import RedisServer, seed_settled_epoch
from .inprocess import beats, make, make_app, messages, occurrences_sent, run_for
from .processes import wait_for


@pytest.fixture(autouse=True)
def settled_store(request: pytest.FixtureRequest) -> None:
    """The store on the test's redis-server has run a while (a settled epoch): no test
    here is about a new store's start, and their beats claim at once rather than after
    the new epoch's settle period of a TTL (a store wiped or restarted by a test begins
    a new epoch all the same)."""
    if "server" in request.fixturenames:
        seed_settled_epoch(request.getfixturevalue("server"))


def no_duplicates(sent: list[tuple[str, str]]) -> None:
    dup = {k: n for k, n in Counter(sent).items() if n > 1}
    assert dup == {}


def test_sends_with_claim_header_and_derived_task_id_without_mutating_options(
        server: RedisServer) -> None:
    options = {"headers": {"mine": 1}, "queue": "celery"}
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1),
                                  "options": options}})
    s = make(app)
    run_for(2.6, s)
    msgs = messages(server)
    assert len(msgs) >= 2
    m = msgs[0]
    assert set(m["claims"]) == {"entry", "due", "token", "prefix", "store"}
    assert m["claims"]["prefix"] == "beat-claims" and m["claims"]["store"]
    assert m["claims"]["entry"] == "e" and m["claims"]["due"].endswith("Z")
    due_ms = s.store.history("e")[-1].due
    assert msgs[0]["claims"]["due"] == iso(due_ms)
    assert m["id"] == task_id_for("e", due_ms, "beat-claims")
    assert m["headers"]["mine"] == 1
    assert options == {"headers": {"mine": 1}, "queue": "celery"}
    assert s.schedule["e"].options == options
    s.close()


def test_two_schedulers_send_each_occurrence_once(server: RedisServer) -> None:
    app = make_app(server, {
        "a": {"task": "t.noop", "schedule": timedelta(seconds=1)},
        "b": {"task": "t.noop", "schedule": timedelta(seconds=0.5)},
    })
    one, two = beats(app, app)
    run_for(4, one, two)
    sent = occurrences_sent(server)
    assert len(sent) >= 8
    no_duplicates(sent)
    # Consecutive occurrences: nothing missed.
    for name, period in (("a", 1000), ("b", 500)):
        dues = sorted(r.due for r in one.store.history(name))
        assert all(b - a == period for a, b in itertools.pairwise(dues))
    one.close()
    two.close()


def test_close_releases_unsent_claims_idempotently_even_when_reentered(
        server: RedisServer) -> None:
    app = make_app(server)
    a = make(app)
    held: list[Any] = []
    a.sender.send = lambda claims, schedule: held.extend(claims)  # type: ignore[method-assign]
    run_for(1.6, a)
    assert held, "a claim was made"
    # close() re-entered from a signal handler while it releases: the nested call is a no-op.
    real_release = a.store.release
    calls = []

    def release_reentered(*args: Any, **kwargs: Any) -> int:
        calls.append(1)
        a.close()
        return real_release(*args, **kwargs)

    a.store.release = release_reentered  # type: ignore[method-assign]
    a.close()
    a.close()
    assert len(calls) == 1
    states = {r.due: r.state for r in a.store.history("every-1s")}
    assert set(states.values()) == {RunState.DUE}
    assert messages(server) == []
    # The same Scheduler object, started again, sends what it released: once each.
    del a.sender.send
    a.store.release = real_release  # type: ignore[method-assign]
    run_for(1.2, a)
    sent = occurrences_sent(server)
    no_duplicates(sent)
    assert {iso(d) for d in states} <= {due for _, due in sent}
    a.close()


def test_released_runs_are_sent_by_another_beat_at_its_next_sweep(server: RedisServer) -> None:
    app = make_app(server, beat_claims_heartbeat_interval=1.5)
    seed_settled_epoch(server)  # (claims at once, not after a TTL of 4.5 s)
    a, b = beats(app, app)
    run_for(0.3, b)  # b is up and has looked at the store once
    a.sender.send = lambda claims, schedule: None  # type: ignore[method-assign]
    run_for(1.6, a)
    released = [r.due for r in a.store.history("every-1s") if r.state.held]
    assert released
    a.close()
    # b has not restarted: its next sweep (within one heartbeat interval) finds them.
    wait_for(lambda: (b.tick() is not None and
                      {iso(d) for d in released} <= {due for _, due in occurrences_sent(server)}),
             2.5, "b to send what a released")
    no_duplicates(occurrences_sent(server))
    b.close()


def test_a_claim_that_waits_past_reclaim_after_is_not_sent_by_its_stale_owner(
        server: RedisServer) -> None:
    """Hard case 2: A claims, is delayed past reclaim_after; B takes over and sends;
    A resumes and its check before publish refuses."""
    app = make_app(server, beat_claims_reclaim_after=1.0, beat_claims_heartbeat_interval=0.3)
    a, b = beats(app, app)
    stalled: list[Any] = []
    real_send = a.sender.send
    a.sender.send = lambda claims, schedule: stalled.extend(claims)  # type: ignore[method-assign]
    run_for(1.3, a)
    assert stalled
    # A is alive (same process) but slow: B waits for reclaim_after, then takes over.
    taken = {(c.entry, iso(c.due)) for c in stalled}
    wait_for(lambda: b.tick() is not None and taken <= set(occurrences_sent(server)),
             6, "b to reclaim and send")
    before = occurrences_sent(server)
    real_send(stalled, a.schedule)  # A wakes up and tries to send what it had claimed
    assert occurrences_sent(server) == before
    no_duplicates(occurrences_sent(server))
    a.close()
    b.close()


def test_abandoned_claim_is_reclaimed_by_a_long_lived_beat_without_restart(
        server: RedisServer) -> None:
    """Hard case 5: B saw A's live claim earlier; once it is abandoned B takes it over."""
    app = make_app(server, beat_claims_reclaim_after=2.0, beat_claims_heartbeat_interval=0.3)
    a, b = beats(app, app)
    a.sender.send = lambda claims, schedule: None  # type: ignore[method-assign]
    run_for(1.2, a)
    claimed = [r.due for r in a.store.history("every-1s") if r.state.held]
    assert claimed
    run_for(0.5, b)  # b sees the live, young claim and leaves it
    assert iso(claimed[0]) not in {d for _, d in occurrences_sent(server)}
    wait_for(lambda: b.tick() is not None and
             iso(claimed[0]) in {d for _, d in occurrences_sent(server)}, 6,
             "b to take over the abandoned claim")
    no_duplicates(occurrences_sent(server))
    b.close()


@pytest.mark.parametrize(("error", "logged"), [
    # kombu: the broker cannot be reached (the broker's words, logged whole)
    (OperationalError, ("given back", "broker said no")),
    # this message's own problem (a custom apply_async): its type, not its message, which
    # may quote an argument (beat_claims_exception_messages is off)
    (ConnectionError, ("due again: ConnectionError\n",)),
], ids=["broker-outage", "message-error"])
def test_publish_error_releases_the_claim_and_it_is_sent_later(
        server: RedisServer, caplog: pytest.LogCaptureFixture, error: type[Exception],
        logged: tuple[str, ...]) -> None:
    app = make_app(server)
    s = make(app)
    real = s._publish
    failures = []

    def broken(*args: Any) -> Any:
        if not failures:
            failures.append(1)
            raise error("broker said no")
        return real(*args)

    s._publish = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR):
        run_for(2.5, s)
    assert all(text in caplog.text for text in logged), caplog.text
    if error is not OperationalError:  # neither as the old line had it nor as a traceback's
        assert "('broker said no')" not in caplog.text
        assert "Error: broker said no" not in caplog.text
    sent = occurrences_sent(server)
    no_duplicates(sent)
    history = {iso(r.due): r.state for r in s.store.history("every-1s")}
    assert set(d for _, d in sent) == {d for d, st in history.items() if st is RunState.SENT}
    first = min(history)
    assert (("every-1s", first) in sent), "the failed occurrence was sent on a later try"
    s.close()


def test_store_outage_sends_nothing_logs_once_and_catches_up(
        server: RedisServer, broker: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """Hard case 6: the store refuses writes (read-only replica): nothing sent unclaimed.
    The broker is another server, so it would accept what the beat sent."""
    app = make_app(server, broker=broker, beat_claims_catch_up="all")
    s = make(app)
    wait_for(lambda: occurrences_sent(broker), 15, "a first run sent", interval=0.05,
             between=s.tick)
    before = len(occurrences_sent(broker))
    admin = server.client()
    admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # read-only, unreachable master
    try:
        with caplog.at_level(logging.WARNING, logger="celery.beat.claims"):
            run_for(4, s)
        assert len(occurrences_sent(broker)) == before
        assert caplog.text.count("store unreachable") == 1
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")
    with caplog.at_level(logging.WARNING, logger="celery.beat.claims"):
        # the outage's occurrences (4 s of an every-second entry), caught up
        wait_for(lambda: len(occurrences_sent(broker)) >= before + 5, 20,
                 "the outage's runs to be caught up", interval=0.05, between=s.tick)
    assert "store reachable again" in caplog.text
    sent = occurrences_sent(broker)
    no_duplicates(sent)
    dues = sorted(r.due for r in s.store.history("every-1s"))
    assert all(b - a == 1000 for a, b in itertools.pairwise(dues)), "caught up, oldest first"
    assert {r.state for r in s.store.history("every-1s")} <= {RunState.SENT, RunState.CLAIMED}
    s.close()


def test_store_wiped_does_not_rerun_what_already_ran(server: RedisServer) -> None:
    """Hard case 7: Redis restarted without persistence."""
    app = make_app(server)
    s = make(app)
    run_for(2.2, s)
    sent_before = occurrences_sent(server)
    last = max(d for _, d in sent_before)
    server.restart()
    run_for(3, s)
    sent_after = occurrences_sent(server)  # the broker db was wiped too: only new sends
    assert sent_after, "entries start again from their next occurrence"
    assert all(d > last for _, d in sent_after)
    s.close()


def test_catch_up_all_and_latest_after_every_beat_was_down(server: RedisServer) -> None:
    """Hard case 4 (in process; tests/test_hard_cases.py runs it with real beats)."""
    app = make_app(server, {
        "all": {"task": "t.noop", "schedule": timedelta(seconds=1),
                "claims": {"catch_up": "all"}},
        "latest": {"task": "t.noop", "schedule": timedelta(seconds=1)},
    }, beat_claims_catch_up_grace=0.5)
    s = make(app)
    run_for(1.3, s)
    s.close()
    time.sleep(3.6)  # three occurrences fall due while no beat runs
    t = make(app)
    run_for(0.4, t)
    hist_all = sorted(t.store.history("all"), key=lambda r: r.due)
    assert [r.state for r in hist_all].count(RunState.SKIPPED) == 0
    assert all(b.due - a.due == 1000 for a, b in itertools.pairwise(hist_all))
    sent_all = [d for e, d in occurrences_sent(server) if e == "all"]
    assert sent_all == sorted(sent_all) and len(sent_all) == len(hist_all)
    hist_latest = sorted(t.store.history("latest"), key=lambda r: r.due)
    skipped = [r for r in hist_latest if r.state is RunState.SKIPPED]
    assert len(skipped) >= 2 and all(r.reason == "catch_up" for r in skipped)
    t.close()


def test_bad_entry_policy_fails_at_start(server: RedisServer) -> None:
    app = make_app(server, {"x": {"task": "t.noop", "schedule": 5.0,
                                  "claims": {"overlap": "sometimes"}}})
    with pytest.raises(ConfigurationError, match=r"'x'.*overlap.*'sometimes'"):
        make(app)


def test_a_second_stop_signal_during_close_does_not_cut_the_release_short(
        server: RedisServer) -> None:
    """Celery's handler calls close() and raises SystemExit; a second SIGTERM arriving while
    close() releases is held until the release is done."""
    app = make_app(server)
    s = make(app)
    s.sender.send = lambda claims, schedule: None  # type: ignore[method-assign]
    run_for(1.3, s)
    assert s.holdings.held
    fired = []

    def celery_like_handler(signum: int, frame: Any) -> None:
        fired.append(signum)
        s.close()
        raise SystemExit()

    old = signal.signal(signal.SIGTERM, celery_like_handler)
    real_release = s.store.release

    def release_then_signal(*args: Any, **kwargs: Any) -> int:
        os.kill(os.getpid(), signal.SIGTERM)  # arrives in the middle of close()
        time.sleep(0.05)
        return real_release(*args, **kwargs)

    s.store.release = release_then_signal  # type: ignore[method-assign]
    try:
        with pytest.raises(SystemExit):
            s.close()  # the held signal is delivered once close() has finished
    finally:
        signal.signal(signal.SIGTERM, old)
    assert fired and s._closed
    assert {r.state for r in s.store.history("every-1s")} == {RunState.DUE}
    assert not [o for o in s.store.owners() if o.owner.id == s.owner.id and o.alive]


def _claim_behind_the_beats_back(s: Any, name: str) -> int:
    """A claim of ``s``'s owner that ``s`` never heard of (as if the reply had timed out)."""
    state = s.claimer.states[name]
    after = state.checkpoint if state.checkpoint is not None else state.anchor
    due = occurrences.next_after(s.schedule[name].schedule, state.anchor, after)
    made = s.store.claim(s.owner, [ClaimPlan(name, state, (due,))])[0]
    assert [c.due for c in made.claims] == [due]
    return due


def test_a_claim_whose_reply_was_lost_is_taken_back_by_its_own_beat(
        server: RedisServer) -> None:
    app = make_app(server, beat_claims_heartbeat_interval=0.3)
    a = make(app)
    orphan_due = _claim_behind_the_beats_back(a, "every-1s")
    wait_for(lambda: a.tick() is not None and iso(orphan_due) in
             {d for _, d in occurrences_sent(server)}, 5, "a to take it back and send it")
    no_duplicates(occurrences_sent(server))
    a.close()


def test_a_claim_whose_reply_was_lost_is_found_by_another_beat_when_its_beat_dies(
        server: RedisServer) -> None:
    app = make_app(server, beat_claims_heartbeat_interval=0.3)
    a, b = beats(app, app)
    orphan_due = _claim_behind_the_beats_back(a, "every-1s")
    a.store.leave(a.owner)  # a dies before its next sweep: nobody remembers the claim
    a._closed = True
    wait_for(lambda: b.tick() is not None and iso(orphan_due) in
             {d for _, d in occurrences_sent(server)}, 6, "b to take it back and send it")
    no_duplicates(occurrences_sent(server))
    b.close()


def test_a_taken_over_claim_survives_the_death_of_the_beat_that_took_it(
        server: RedisServer) -> None:
    """The beat that takes a claim back and claims it anew holds it in the store's records:
    if that beat dies too, a third one finds it."""
    app = make_app(server, beat_claims_heartbeat_interval=0.3)
    a, b, c = beats(app, app, app)
    for s in (a, b):
        s.sender.send = lambda claims, schedule: None  # type: ignore[method-assign]
    run_for(1.3, a)
    claimed = [r.due for r in a.store.history("every-1s") if r.state.held]
    assert claimed
    a.store.leave(a.owner)  # a dies (no release)
    a._closed = True
    wait_for(lambda: b.tick() is not None and any(
        r.owner == b.owner.id and r.due == claimed[0] for r in b.store.history("every-1s")),
        5, "b to take over")
    b.store.leave(b.owner)  # b dies before sending what it took over
    b._closed = True
    wait_for(lambda: c.tick() is not None and iso(claimed[0]) in
             {d for _, d in occurrences_sent(server)}, 6, "c to take over from b")
    no_duplicates(occurrences_sent(server))
    c.close()


def test_catch_up_window_also_applies_to_released_runs(server: RedisServer) -> None:
    app = make_app(server, {"w": {"task": "t.noop", "schedule": timedelta(seconds=1),
                                  "claims": {"catch_up_window": 1.5}}})
    a = make(app)
    a.sender.send = lambda claims, schedule: None  # type: ignore[method-assign]
    run_for(1.3, a)
    released = [r.due for r in a.store.history("w") if r.state.held]
    assert released
    a.close()
    time.sleep(2.0)  # the released run is now older than the window
    b = make(app)
    run_for(0.5, b)
    runs = {r.due: r for r in b.store.history("w")}
    assert all(runs[d].state is RunState.SKIPPED and runs[d].reason == "catch_up_window"
               for d in released)
    assert iso(released[0]) not in {d for _, d in occurrences_sent(server)}
    b.close()


def test_a_batch_that_stalls_mid_publish_is_checked_again_before_the_rest_is_sent(
        server: RedisServer) -> None:
    """A beat paused after its batch's check must not wake up and publish the whole batch:
    after half a heartbeat interval the rest is checked again."""
    schedule = {f"e{i}": {"task": "t.noop", "schedule": timedelta(seconds=1)}
                for i in range(3)}
    app = make_app(server, schedule, beat_claims_heartbeat_interval=0.4)
    a = make(app)
    other = Owner(id="other", host="elsewhere", pid=1, started_at=1.0)
    real = a._publish
    published: list[str] = []

    def stalls_once(entry: Any, claim: Any, task_id: str) -> Any:
        if not published:  # a pause; meanwhile another beat takes the batch over
            time.sleep(0.3)
            checked = [claim, *a.holdings.checked]
            a.store.reclaim([Reclaim(c.entry, c.due, c.token) for c in checked], "other")
            a.store.claim(other, [ClaimPlan(c.entry, None) for c in checked])
        published.append(entry.name)
        return real(entry, claim, task_id)

    a._publish = stalls_once  # type: ignore[method-assign]
    wait_for(lambda: a.tick() is not None and published, 6, "the first publish")
    assert len(published) == 1, published  # only the one in flight
    assert len(occurrences_sent(server)) == 1
    assert {a.store.history(name)[0].owner for name in schedule} == {"other"}
    a.close()


def test_an_unexpected_error_in_a_tick_does_not_stop_the_beat(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    app = make_app(server)
    s = make(app)
    real = s.store.claim
    calls: list[int] = []

    def fails_once(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("a bug")
        return real(*args)

    s.store.claim = fails_once  # type: ignore[method-assign]
    wait_for(lambda: s.claimer.next_due() is not None
             and s.claimer.next_due() <= s.clock.now(), 3, "an occurrence to fall due",
             interval=0.02)
    waits: list[float] = []
    with caplog.at_level(logging.ERROR, logger="celery.beat.claims"):
        # (a tick may first renew the heartbeat and sweep, on a loaded machine, say)
        wait_for(lambda: calls, 5, "a tick that claims", interval=0.02,
                 between=lambda: waits.append(s.tick()))
    assert 0 < waits[-1] <= 30
    assert "unexpected error in a tick" in caplog.text
    wait_for(lambda: s.tick() is not None and occurrences_sent(server), 8, "a send")
    s.close()


def _waiting(s: Any) -> Any:
    """Tick ``s`` until its entry "b" has a run waiting; that run."""
    return wait_for(lambda: next((r for r in s.store.history("b")
                                  if r.state is RunState.WAITING), None), 10,
                    "a run waiting", interval=0.02, between=s.tick)


def test_a_buffered_run_is_sent_whatever_the_catch_up_policy_unless_no_beat_ran(
        server: RedisServer) -> None:
    """overlap="buffer_one" with catch_up="none": the waiting run is sent when the previous
    run ends, however late that is, while a beat ran without a break; one whose turn came
    while no beat ran is judged by the catch-up policy like any missed occurrence."""
    from beat_claims.enums import Reason
    from beat_claims.stores.base import Outcome

    app = make_app(server, {"b": {"task": "t.noop", "schedule": timedelta(seconds=0.5),
                                  "claims": {"overlap": "buffer_one", "catch_up": "none",
                                             "run_timeout": 60}}},
                   beat_claims_catch_up_grace=0.1)
    s = make(app)
    try:
        waiting = _waiting(s)
        [busy] = [r for r in s.store.history("b") if r.state is RunState.SENT]
        run_for(1.5, s)  # the waiting run is now well over a grace late
        assert s.store.finish([Outcome("b", busy.due, busy.token, RunState.DONE)]) == [True]
        sent = wait_for(lambda: [r for r in s.store.history("b") if r.due >= waiting.due
                                 and r.state is RunState.SENT], 10, "the waiting run sent",
                        interval=0.02, between=s.tick)
        assert sent[-1].reason is None
        assert not [r for r in s.store.history("b") if r.reason is Reason.CATCH_UP]
        # A run waiting when the beat stopped, whose turn came while none ran: missed.
        [busy] = sent
        waiting = _waiting(s)
    finally:
        s.close()
    wait_for(lambda: s.store.now() > waiting.due + 1000, 5, "its turn to pass a grace")
    assert s.store.finish([Outcome("b", busy.due, busy.token, RunState.DONE)]) == [True]
    again = make(app)
    try:
        wait_for(lambda: next((r for r in again.store.history("b") if r.due == waiting.due
                               and r.reason is Reason.CATCH_UP), None), 10,
                 "the run whose turn came while no beat ran skipped", interval=0.02,
                 between=again.tick)
    finally:
        again.close()


def test_a_pause_resumed_before_the_store_was_wiped_is_not_restored(
        server: RedisServer) -> None:
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=0.5)}})
    s = make(app)
    try:
        assert s.store.pause("e", "alice@ops", "billing is down") is not None
        run_for(1.2, s)
        assert "e" in s.knowledge.paused
        assert s.store.resume("e", "bob@ops") is not None
        wait_for(lambda: "e" not in s.knowledge.paused, 5, "a run claimed after the resume",
                 interval=0.02, between=s.tick)
        server.client(0).flushdb()
        before = len(messages(server))
        wait_for(lambda: len(messages(server)) > before + 1, 15, "runs sent after the wipe",
                 interval=0.02, between=s.tick)
        [record] = s.store.entries(["e"])
    finally:
        s.close()
    assert record.paused is None


def _record(paused: Any = None, resumed_at: int | None = None,
            last_paused_at: int | None = None) -> Any:
    from beat_claims.stores.base import EntryRecord
    return EntryRecord("e", "every 1s", 0, None, 1, paused, "bob@ops" if resumed_at else None,
                       resumed_at, last_paused_at)


def test_the_writes_of_an_entry_removed_are_forgotten_not_those_of_the_entry_made_anew() -> None:
    """The store answered a beat's writes of an entry removed (a prune); meanwhile the name
    was made anew and the beat claimed a run of the new entry. Only the writes of the entry
    removed are no longer asked after (and the claim and check of their run, which the
    mark stood for): the new entry's claim still is."""
    from beat_claims.beat.knowledge import Knowledge, Known
    from beat_claims.stores.base import Claim

    k = Knowledge()
    k.entries["e"] = Known(anchor=1000, checkpoint=None, token=0)
    old = [Claim("e", 2000, 5)]
    k.claimed(old)
    k.checked(old)
    k.marked_sent(old)
    [removed] = k.written()
    k.entries["e"] = Known(anchor=9000, checkpoint=None, token=0)  # (made anew)
    k.claimed([Claim("e", 10_000, 90)])
    assert [w.token for w in k.written()] == [90, 5]
    k.removed([removed])
    assert [(w.token, w.anchor) for w in k.written()] == [(90, 9000)]


def test_a_known_pause_takes_in_only_later_state_from_the_store() -> None:
    """What a beat knows of a pause follows the store's records forwards only: a store that
    went back (a wipe, an older snapshot not noticed yet) never makes it forget the pause,
    unless the store shows a resume at or after the pause began."""
    from beat_claims.beat.knowledge import Knowledge
    from beat_claims.stores.base import EntryRecord, Pause

    k = Knowledge()
    known = Pause("alice@ops", "down", 1000)
    # No record, no pause and no resume since, an earlier resume, an earlier pause, and
    # another entry's record.
    went_back = [None, _record(), _record(resumed_at=999, last_paused_at=500),
                 _record(Pause("zoe@ops", "older", 999)),
                 EntryRecord("other", "", 0, None, 1, None, "bob@ops", 5000, 1000)]
    for record in went_back:
        k.paused["e"] = known
        assert k.check_pause("e", record) is None
        assert k.paused["e"] == known
    # The same pause, paused again (who and note change, not the instant): the store's.
    again = Pause("carol@ops", "still down", 1000)
    assert k.check_pause("e", _record(again)) == "updated" and k.paused["e"] == again
    assert k.check_pause("e", _record(again)) is None
    # A later pause replaces it; a resume at or after it forgets it.
    later = Pause("carol@ops", "second", 3000)
    assert k.check_pause("e", _record(later)) == "updated" and k.paused["e"] == later
    assert k.check_pause("e", _record(resumed_at=3000, last_paused_at=3000)) == "resumed"
    assert "e" not in k.paused
    assert k.check_pause("e", _record(later)) is None and "e" not in k.paused


def test_known_pauses_are_checked_in_turn_the_skipped_first() -> None:
    from beat_claims.beat.knowledge import Knowledge
    from beat_claims.stores.base import Pause

    k = Knowledge()
    for i in range(250):
        k.paused[f"e{i:03}"] = Pause("alice@ops", "", i)
    seen: Counter[str] = Counter()
    for _ in range(5):
        turn = k.pauses_to_check(100)
        assert len(turn) == len(set(turn)) == 100
        seen.update(turn)
    assert set(seen) == set(k.paused) and max(seen.values()) - min(seen.values()) <= 1
    k.skipped_paused(["e200", "e007", "unknown"])
    assert k.pauses_to_check(100, stale_only=True) == ["e007", "e200"]
    assert k.pauses_to_check(100, stale_only=True) == []
    k.skipped_paused(["e123"])
    assert k.pauses_to_check(100)[0] == "e123"
    del k.paused["e123"]
    k.skipped_paused(["e123"])
    assert k.pauses_to_check(3, stale_only=True) == []
