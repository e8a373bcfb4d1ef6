"""Bad input never stops the beat (invariant 8): refused where it enters, named, and the
other entries go on; a transition the store refuses is never silently dropped."""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta

import pytest

from beat_claims.enums import Reason, RunState
from beat_claims.runs import Owner, Run, iso
from beat_claims.scheduler import Scheduler
from beat_claims.stores.base import ClaimPlan, EntrySeed, LiveQuery
from beat_claims.stores.redis import BUCKETS, RedisStore, digest, function_name

from .conftest import RedisServer
from .contract.conftest import BACKENDS
from .faults import proxy
from .inprocess import make, make_app, occurrences_sent, run_for
from .processes import wait_for

pytestmark = pytest.mark.usefixtures("settled_store")

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
        s.claimer.check_with_claim = False  # a claim, then its own check
        lossy.drop_reply_to(function_name("check"))
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


# -- keys of the wrong type, records that cannot be read ----------------------------------
def _dead_owners_claim(store: RedisStore, entry: str) -> int:
    """A claim of ``entry``'s first occurrence by a beat on another host that then died
    (between its claim and its check); returns its due instant."""
    dead = Owner("dead-owner", "elsewhere", 1, 1.0, "boot:1")
    store.heartbeat(dead, 0.2)
    [state] = store.register([EntrySeed(entry)]).values()
    due = state.anchor + 100
    [result] = store.claim(dead, [ClaimPlan(entry, state, (due,))])
    assert [c.due for c in result.claims] == [due]
    store.leave(dead)
    return due


def _token_as_text(server: RedisServer, store: RedisStore, entry: str, due: int) -> None:
    """The run's record stays valid JSON, with its token a string: a field of the wrong
    type."""
    runs_key = store.entry_keys(entry)[1]
    client = server.client()
    record = json.loads(client.hget(runs_key, str(due)))
    record["token"] = str(record["token"])
    client.hset(runs_key, str(due), json.dumps(record))


def _another_buckets_held_index(entry: str) -> str:
    """The key of the held index of a bucket that is not ``entry``'s."""
    other = (int(digest(entry)[:4], 16) % BUCKETS + 1) % BUCKETS
    return f"{{beat-claims:{other:02d}}}:held"


def test_a_bucket_index_of_the_wrong_type_does_not_stop_the_sweep_of_the_others(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """One bucket's held index is a string: that bucket is skipped; a dead beat's claim in
    another bucket is still taken back and sent, and the beat does not take the bad key
    for an outage."""
    store = RedisStore.from_url(server.url)
    due = _dead_owners_claim(store, "e")
    server.client().set(_another_buckets_held_index("e"), "not a zset")
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(milliseconds=100),
                                  "claims": {"catch_up": "all", "reclaim_after": 2}}})
    with caplog.at_level(logging.ERROR, logger="celery.beat.claims"):
        s = make(app)
        wait_for(lambda: iso(due) in {d for _, d in occurrences_sent(server)}, 10,
                 "the dead beat's claim to be taken back and sent", interval=0.05,
                 between=s.tick)
    assert "unreachable" not in caplog.text
    s.close()


def test_a_bucket_index_of_the_wrong_type_is_named_as_the_key_to_repair(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """The error about a bucket index of the wrong type names that key (its advice is to
    delete it), not the bucket's other index, which is sound."""
    store = RedisStore.from_url(server.url)
    bad_key = _another_buckets_held_index("e")
    server.client().set(bad_key, "not a zset")
    with caplog.at_level(logging.ERROR, logger="celery.beat.claims"):
        found = store.live_runs(LiveQuery("me", frozenset(), 0, 0, 0))
    assert not found.complete
    assert bad_key in caplog.text, caplog.text


def test_a_shared_key_of_the_wrong_type_does_not_stop_a_starting_beat(
        server: RedisServer) -> None:
    """The shared anchoring key is a hash: a beat that starts still registers its entries
    and sends."""
    server.client().hset("{beat-claims}:anchoring", "x", "1")
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(milliseconds=200)}})
    s = Scheduler(app=app)
    wait_for(lambda: occurrences_sent(server), 10, "a beat started on a bad anchoring key to"
             " send", interval=0.05, between=s.tick)
    s.close()


def test_a_held_claim_whose_record_cannot_be_read_is_reported_not_taken_back_for_ever(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """A dead beat's claim whose record has a field of the wrong type: the sweep cannot
    take it back. It is named once and taken out of the held index; no sweep logs 'took
    back' for a reclaim the store refused."""
    store = RedisStore.from_url(server.url)
    due = _dead_owners_claim(store, "e")
    _token_as_text(server, store, "e", due)
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=60)}})
    with caplog.at_level(logging.INFO, logger="celery.beat.claims"):
        s = make(app)
        run_for(3, s)  # six sweeps
    took = [r.getMessage() for r in caplog.records if "took back" in r.getMessage()]
    assert not took, took[:2]
    unreadable = [r.getMessage() for r in caplog.records if iso(due) in r.getMessage()
                  and "cannot be read" in r.getMessage()]
    assert len(unreadable) == 1, unreadable
    held_key = store.entry_keys("e")[7]
    assert [m for m in server.client().zrange(held_key, 0, -1) if str(due) in m] == []
    s.close()


def test_a_held_run_whose_record_cannot_be_read_is_reported_when_its_entry_falls_due(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """The same record for an entry due every 100 ms (catch_up=all): whatever step of the
    beat meets it, it is named (an error with its instant), never silently dropped, and
    the occurrence is not sent."""
    store = RedisStore.from_url(server.url)
    due = _dead_owners_claim(store, "e")
    _token_as_text(server, store, "e", due)
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(milliseconds=100),
                                  "claims": {"catch_up": "all"}}})

    def named() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
                and iso(due) in r.getMessage() and "cannot be read" in r.getMessage()]

    with caplog.at_level(logging.INFO, logger="celery.beat.claims"):
        s = make(app)
        wait_for(lambda: named() and len(occurrences_sent(server)) >= 2, 10,
                 f"the unreadable run due {iso(due)} to be reported, and later ones sent",
                 interval=0.05, between=s.tick)
    assert iso(due) not in {d for _, d in occurrences_sent(server)}
    s.close()


def test_a_corrupt_token_counter_is_repaired_without_handing_out_a_token_again(
        server: RedisServer) -> None:
    """The entry's token field is corrupt. Another beat handed out three tokens since this
    beat last looked; the repair from what this beat knows must leave a gap above them: no
    token is handed out again for another occurrence."""
    app = make_app(server, {"e": {"task": "t.noop", "schedule": timedelta(seconds=1),
                                  "claims": {"catch_up": "all"}}})
    a = make(app)
    store = a.store
    state = a.claimer.states["e"]
    other = Owner("other-beat", "elsewhere", 1, 1.0, "boot:1")
    store.heartbeat(other, 30)
    checkpoint = state.checkpoint or state.anchor
    dues = tuple(checkpoint + 1000 * k for k in (1, 2, 3))
    [result] = store.claim(other, [ClaimPlan("e", state, dues)])
    used = {c.token: c.due for c in result.claims}
    assert len(used) == 3
    server.client().hset(store.entry_keys("e")[0], "token", "garbage")
    wait_for(lambda: len([r for r in store.history("e") if r.due > max(dues)]) >= 2, 10,
             "two occurrences claimed after the repair", interval=0.05, between=a.tick)
    again = {r.token: iso(r.due) for r in store.history("e")
             if r.token in used and r.due != used[r.token]}
    assert not again, f"tokens handed out twice, for other occurrences: {again}"
    a.close()


def test_an_entry_the_store_refused_to_register_is_registered_once_it_accepts_it(
        server: RedisServer) -> None:
    """An entry whose key has the wrong type is refused at registration (the others run);
    once an operator repairs the key, the same beat registers and sends it, without a
    restart."""
    keys = RedisStore.from_url(server.url).entry_keys("bad")
    client = server.client()
    client.set(keys[0], "the wrong type")
    app = make_app(server, {
        "bad": {"task": "t.noop", "schedule": timedelta(milliseconds=300)},
        "good": {"task": "t.noop", "schedule": timedelta(milliseconds=300)}})
    s = Scheduler(app=app)
    wait_for(lambda: "good" in {e for e, _ in occurrences_sent(server)}, 10,
             "the other entry to be sent", interval=0.05, between=s.tick)
    assert "bad" not in s.claimer.states
    client.delete(keys[0])  # an operator repairs it
    wait_for(lambda: "bad" in {e for e, _ in occurrences_sent(server)}, 10,
             "the repaired entry to be registered and sent", interval=0.05, between=s.tick)
    s.close()
