"""Bad input never stops the beat (invariant 8): refused where it enters, named, and the
other entries go on; a transition the store refuses is never silently dropped."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest

from beat_claims.enums import Reason, RunState
from beat_claims.runs import Run, iso
from beat_claims.stores.base import EntrySeed
from beat_claims.stores.redis import _sha

from .conftest import RedisServer
from .contract.conftest import BACKENDS
from .faults import proxy
from .inprocess import make, make_app, occurrences_sent, run_for
from .processes import wait_for

EVERY_SECOND = timedelta(seconds=1)


def test_an_entry_name_that_cannot_be_stored_is_refused_and_the_others_run(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    bad = "report-\udc80"  # a lone surrogate: not text any store can hold
    app = make_app(server, {bad: {"task": "t.noop", "schedule": EVERY_SECOND},
                            "ok": {"task": "t.noop", "schedule": EVERY_SECOND}})
    with caplog.at_level(logging.ERROR, logger="celery.beat.claims"):
        s = make(app)
        run_for(2.2, s)
    assert "entry name 'report-\\udc80'" in caplog.text and "not scheduled" in caplog.text
    assert bad not in s.schedule
    assert len([e for e, _ in occurrences_sent(server) if e == "ok"]) >= 2
    s.close()


def test_a_record_with_a_wrong_typed_field_is_local_to_its_entry(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """Valid JSON, a string where a number belongs: the other entries of the same batch
    keep working, and the log never calls it an outage."""
    names = ["a", "b", "c"]
    app = make_app(server, {n: {"task": "t.noop", "schedule": EVERY_SECOND} for n in names},
                   beat_claims_heartbeat_interval=0.3)
    s = make(app)
    run_for(1.2, s)
    victim = s.store.history("b")[0]
    corrupt = BACKENDS["redis"].corrupt_run
    corrupt(s.store, "b", victim.due,
            f'{{"due": {victim.due}, "state": "claimed", "token": "seven",'
            f' "owner": "{s.owner.id}", "claimed_at": "yesterday"}}')
    entry_field = BACKENDS["redis"].corrupt_entry_field
    entry_field(s.store, "c", "checkpoint", "not-a-number")
    sent_before = {n: len([d for e, d in occurrences_sent(server) if e == n]) for n in names}
    with caplog.at_level(logging.WARNING, logger="celery.beat.claims"):
        run_for(2.5, s)
    sent_after = {n: len([d for e, d in occurrences_sent(server) if e == n]) for n in names}
    assert all(sent_after[n] >= sent_before[n] + 2 for n in names), (sent_before, sent_after)
    assert "unreachable" not in caplog.text
    assert "cannot be read" in caplog.text or "unreadable" in caplog.text
    sent = occurrences_sent(server)
    assert len(sent) == len(set(sent))
    s.close()


def test_a_claim_being_sent_when_its_window_passes_is_recorded_not_stuck(
        server: RedisServer) -> None:
    """The check before publish executes (the run is 'sending') but its reply is lost;
    by the time the store answers again the run is older than catch_up_window: it is
    recorded skipped (catch_up_window), neither left 'sending' nor forgotten."""
    with proxy(server.port) as lossy:
        app = make_app(server, {"w": {"task": "t.noop", "schedule": timedelta(seconds=5),
                                      "claims": {"catch_up_window": 0.5}}},
                       beat_claims_url=lossy.url(), beat_claims_heartbeat_interval=0.3,
                       beat_claims_catch_up_grace=0.1)
        s = make(app)
        lossy.drop_reply_to(_sha("check"))
        wait_for(lambda: s.tick() is not None and lossy.pending() == 0, 10, "the check")
        [run] = [r for r in s.store.history("w")]
        assert run.state is RunState.SENDING
        lossy.delay = 0.7  # the store answers, but too late for the window
        s.tick()
        lossy.delay = 0.0
        wait_for(lambda: s.tick() is not None and s.store.history("w")[-1].state.final, 10,
                 "the run to be recorded")
        run = next(r for r in s.store.history("w") if r.due == run.due)
        assert (run.state, run.reason) == (RunState.SKIPPED, Reason.CATCH_UP_WINDOW)
        assert occurrences_sent(server) == []
        s.close()


def test_a_claim_never_overwrites_a_run_already_recorded_at_its_instant(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """An operator's run recorded on the very millisecond of a scheduled occurrence: the
    scheduled claim leaves it as it is (and says so); the occurrence runs once, as the
    operator's run."""
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1)}})
    s = make(app)
    state = s.claimer.states["e"]
    due = state.anchor + ((int(time.time() * 1000) - state.anchor) // 1000 + 2) * 1000
    s.store.register([EntrySeed("e", "every 1s", runs=(
        Run("e", due, RunState.DUE, manual=True, requested_by="op"),))])
    with caplog.at_level(logging.WARNING, logger="celery.beat.claims"):
        wait_for(lambda: s.tick() is not None and time.time() * 1000 > due + 800, 10,
                 "the scheduled instant to pass")
    [run] = [r for r in s.store.history("e") if r.due == due]
    assert run.manual and run.requested_by == "op" and run.state is RunState.SENT
    assert [d for _, d in occurrences_sent(server)].count(iso(due)) == 1
    assert "already has a run" in caplog.text
    s.close()


@pytest.mark.parametrize("spec", [
    {"task": "t.noop", "schedule": float("inf")},
    {"task": "t.noop", "schedule": float("nan")},
    {"task": "t.noop", "schedule": timedelta(days=20 * 366)},
    {"task": "t.noop", "schedule": 5.0, "claims": {"catch_up_window": float("inf")}},
    {"task": "t.noop", "schedule": 5.0, "claims": {"run_timeout": float("nan")}},
], ids=["inf-interval", "nan-interval", "20-years", "inf-window", "nan-timeout"])
def test_an_infinite_or_nan_interval_window_or_timeout_is_refused_at_start_naming_it(
        server: RedisServer, spec: dict[str, object]) -> None:
    from beat_claims.scheduler import Scheduler
    from beat_claims.settings import ConfigurationError

    app = make_app(server, {"nightly": spec})
    with pytest.raises(ConfigurationError, match=r"'nightly'"):
        Scheduler(app=app)
