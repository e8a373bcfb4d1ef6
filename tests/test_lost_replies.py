"""Every transition with its reply lost: the store executed the call, the client saw the
connection drop (a real TCP proxy in front of a real redis-server throws the reply away).
Each affected occurrence is still sent once (or recorded), never stuck, and with
``overlap: "skip"`` later occurrences are not skipped for ever because of it. The same for
a beat killed between two of its writes; and an operator's request asked again with its
request id after a lost reply records one run."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from beat_claims.enums import RunState
from beat_claims.occurrences import jitter_offset
from beat_claims.runs import iso
from beat_claims.scheduler import Scheduler
from beat_claims.stores.base import Delivery, EntrySeed, Outcome, StoreError, WorkerProcess
from beat_claims.stores.redis import RedisStore, function_name

from .conftest import RedisServer, seed_settled_epoch
from .faults import Proxy, proxy
from .inprocess import beats, joined, make, make_app, messages, occurrences_sent, run_for
from .processes import wait_for

ENTRY = "e"
PERIOD = 500
WORKER = WorkerProcess("fake-worker@test", 1, "boot:1")


@pytest.fixture
def lossy(server: RedisServer) -> Iterator[Proxy]:
    with proxy(server.port) as p:
        yield p


def app_for(server: RedisServer, url: str, overlap: str = "allow", jitter: float = 0,
            **conf: Any) -> Any:
    claims: dict[str, Any] = {"overlap": overlap, "run_timeout": 30}
    if jitter:
        claims["jitter"] = jitter
    return make_app(server, {ENTRY: {"task": "t.noop", "schedule": timedelta(
        milliseconds=PERIOD), "claims": claims}}, beat_claims_url=url,
        beat_claims_heartbeat_interval=0.3, beat_claims_catch_up="all", **conf)


def worker_step(s: Scheduler, server: RedisServer) -> None:
    """What a worker with the hooks does with every message published: start its run (by
    the message's token), finish it."""
    for message in messages(server):
        meta = message["claims"]
        if not meta or message["id"] in _done:
            continue
        _done.add(message["id"])
        due = next(r.due for r in s.store.history(ENTRY) if iso(r.due) == meta["due"])
        if s.store.start(Delivery(ENTRY, due, meta["token"], WORKER)).ok:
            s.store.finish([Outcome(ENTRY, due, meta["token"], RunState.DONE)])


_done: set[str] = set()


def tick_all(*schedulers: Scheduler, work: bool = False) -> None:
    for s in schedulers:
        s.tick()
        if work:
            worker_step(s, _server[0])


_server: list[RedisServer] = []


@pytest.fixture(autouse=True)
def _remember(server: RedisServer) -> Iterator[None]:
    """The test's server remembered; its store has run a while (a settled epoch): no test
    here is about a new store's start, and their beats claim at once rather than after the
    new epoch's settle period of a TTL."""
    _server[:] = [server]
    _done.clear()
    seed_settled_epoch(server)
    yield


def work_for(seconds: float, *schedulers: Scheduler) -> None:
    """Tick the beats, and finish every sent run as a worker would, for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        tick_all(*schedulers, work=True)
        time.sleep(0.02)


def settled_history(server: RedisServer, s: Scheduler, work: bool, *others: Scheduler
                    ) -> list[Any]:
    """Run a while longer, until nothing is claimed, being sent or due again (but the
    newest), then the history."""
    work_for(8 * PERIOD / 1000, s, *others)

    def quiet() -> bool:
        tick_all(s, *others, work=work)
        live = [r for r in s.store.history(ENTRY)
                if r.state in (RunState.DUE, RunState.CLAIMED, RunState.SENDING)
                and r.due < max(x.due for x in s.store.history(ENTRY)) - 3 * PERIOD]
        return not live

    wait_for(quiet, 10, "every run claimed to be sent or recorded", interval=0.05)
    return s.store.history(ENTRY)


def assert_each_sent_once(server: RedisServer, history: list[Any], overlap: str) -> None:
    sent = [due for entry, due in occurrences_sent(server) if entry == ENTRY]
    assert {k: n for k, n in Counter(sent).items() if n > 1} == {}, "sent twice"
    dues = sorted(r.due for r in history)
    assert all(b - a == PERIOD for a, b in itertools.pairwise(dues)), "an occurrence is missing"
    by_due = {r.due: r for r in history}
    old = [d for d in dues if d < dues[-1] - 3 * PERIOD]
    for due in old:
        run = by_due[due]
        assert run.state in (RunState.SENT, RunState.DONE, RunState.SKIPPED), run
        if run.state is not RunState.SKIPPED:
            assert iso(due) in sent
    if overlap == "skip":
        # Not skipped for ever: occurrences after the lost reply were sent and done.
        after = [by_due[d].state for d in old if d > old[len(old) // 2]]
        assert RunState.DONE in after, [by_due[d].state for d in old]


@pytest.mark.parametrize("checked", [True, False], ids=["checked-with-it", "claim-only"])
@pytest.mark.parametrize("overlap", ["allow", "skip"])
def test_a_lost_reply_to_a_claim(server: RedisServer, lossy: Proxy, overlap: str,
                                 checked: bool) -> None:
    """Checked with it (SendAtOnce), the lost claim left runs being sent that this beat
    never heard of; else, claimed ones."""
    s = make(app_for(server, lossy.url(), overlap))
    s.claimer.check_with_claim = checked
    run_for(0.6, s)
    lossy.drop_reply_to(function_name("claim"))
    wait_for(lambda: tick_all(s, work=True) or lossy.pending() == 0, 5, "the lost reply")
    work_for(1.0, s)
    assert_each_sent_once(server, settled_history(server, s, True), overlap)
    s.close()


def test_a_lost_reply_to_a_claim_of_a_jittered_entry_checked_with_it(
        server: RedisServer, lossy: Proxy) -> None:
    """A jittered entry's occurrences whose instant has come are checked with their claim
    (SendAtOnce, no check call of their own); the reply to one such claim is lost, leaving
    runs being sent that this beat never heard of: taken back, and each occurrence is still
    sent once, never before its instant."""
    s = make(app_for(server, lossy.url(), jitter=0.3))
    checks: list[int] = []
    real_check = s.store.check

    def counted(*args: Any, **kw: Any) -> Any:
        checks.append(1)
        return real_check(*args, **kw)

    s.store.check = counted  # type: ignore[method-assign]
    wait_for(lambda: run_for(0.1, s) or s.sender.published >= 1, 10, "a first send")
    assert not checks, (s.sender.published, len(checks))
    lossy.drop_reply_to(function_name("claim"))
    wait_for(lambda: tick_all(s, work=True) or lossy.pending() == 0, 5, "the lost reply")
    work_for(1.0, s)
    history = settled_history(server, s, True)
    assert_each_sent_once(server, history, "allow")
    early = [(iso(r.due), r.sent_at - r.due - jitter_offset(ENTRY, r.due, 0.3))
             for r in history if r.sent_at is not None
             and r.sent_at < r.due + jitter_offset(ENTRY, r.due, 0.3) - 50]
    assert early == [], early
    assert any(r.reclaimed_from is not None for r in history), history
    s.close()


@pytest.mark.parametrize("overlap", ["allow", "skip"])
def test_a_lost_reply_to_the_check_before_publish(server: RedisServer, lossy: Proxy,
                                                  overlap: str) -> None:
    s = make(app_for(server, lossy.url(), overlap))
    s.claimer.check_with_claim = False  # a claim, then its own check (checked with it: above)
    run_for(0.6, s)
    lossy.drop_reply_to(function_name("check"))
    wait_for(lambda: tick_all(s, work=True) or lossy.pending() == 0, 5, "the lost reply")
    work_for(1.0, s)
    assert_each_sent_once(server, settled_history(server, s, True), overlap)
    s.close()


@pytest.mark.parametrize("overlap", ["allow", "skip"])
def test_a_lost_reply_to_the_sent_mark(server: RedisServer, lossy: Proxy,
                                       overlap: str) -> None:
    s = make(app_for(server, lossy.url(), overlap))
    run_for(0.6, s)
    lossy.drop_reply_to(function_name("sent"))
    wait_for(lambda: tick_all(s, work=True) or lossy.pending() == 0, 5, "the lost reply")
    work_for(1.0, s)
    assert_each_sent_once(server, settled_history(server, s, True), overlap)
    s.close()


@pytest.mark.parametrize("overlap", ["allow", "skip"])
def test_a_lost_reply_to_a_release(server: RedisServer, lossy: Proxy, overlap: str) -> None:
    """A stopping beat's release executes but its reply is lost; another beat sends what
    was released."""
    a = make(app_for(server, lossy.url(), overlap))
    b = joined(app_for(server, server.url, overlap), a)
    a.sender.send = lambda claims, schedule: None  # type: ignore[method-assign]
    run_for(1.0, a, b)
    # However slow the machine, the stopping beat holds something to release.
    held = set(wait_for(lambda: set(a.holdings.held), 15, "a claim held by the first beat",
                        interval=0.05, between=lambda: (a.tick(), b.tick())))
    lossy.drop_reply_to(function_name("release"))
    a.close()
    assert lossy.pending() == 0
    history = settled_history(server, b, True)
    assert {ref.due for ref in held} <= {r.due for r in history
                                         if r.state in (RunState.DONE, RunState.SKIPPED)}
    assert_each_sent_once(server, history, overlap)
    b.close()


@pytest.mark.parametrize("overlap", ["allow", "skip"])
def test_a_lost_reply_to_a_take_over(server: RedisServer, lossy: Proxy, overlap: str) -> None:
    """A beat dies holding claims; the beat that takes them back loses the reply."""
    a = make(app_for(server, server.url, overlap))
    b = joined(app_for(server, lossy.url(), overlap), a)
    a.sender.send = lambda claims, schedule: None  # type: ignore[method-assign]
    run_for(1.0, a)
    held = set(a.holdings.held)
    assert held
    a.store.leave(a.owner)  # a dies: its claims are for others to take back
    a._closed = True
    lossy.drop_reply_to(function_name("reclaim"))
    wait_for(lambda: tick_all(b, work=True) or lossy.pending() == 0, 5, "the lost reply")
    history = settled_history(server, b, True)
    assert {ref.due for ref in held} <= {r.due for r in history
                                         if r.state in (RunState.DONE, RunState.SKIPPED)}
    assert_each_sent_once(server, history, overlap)
    b.close()


class Killed(BaseException):
    """kill -9 of a beat: nothing after it runs in that beat, not even close()."""


@pytest.mark.parametrize("where", ["after-publish", "before-publish"])
def test_a_beat_killed_between_two_writes(server: RedisServer, where: str) -> None:
    """Beat A dies between its publish and its sent mark (or between its check and its
    publish): the run stays 'sending' under a dead owner. Beat B takes it back once A's
    heartbeat lapses and sends it again with a new token; a worker that takes the
    messages in order runs the occurrence once."""
    app = make_app(server, {ENTRY: {"task": "t.noop", "schedule": timedelta(seconds=1),
                                    "claims": {"catch_up": "all"}}})
    a, b = beats(app, app)
    real = a._publish
    victim: list[Any] = []

    def publish(entry: Any, claim: Any, task_id: str) -> Any:
        victim.append(claim)
        if where == "after-publish":
            real(entry, claim, task_id)
        raise Killed()

    a._publish = publish  # type: ignore[method-assign]

    def step() -> None:
        try:
            a.tick()
        except Killed:
            return
        b.tick()

    wait_for(lambda: victim, 10, "A's first publish", interval=0.02, between=step)
    [claim] = victim
    target = iso(claim.due)

    def resent() -> list[Any]:
        return [m for m in messages(server) if m["claims"] and m["claims"]["due"] == target
                and m["claims"]["token"] != claim.token]

    wait_for(resent, 10, "B to take the dead beat's run back and send it", interval=0.05,
             between=b.tick)
    sent = [m for m in messages(server) if m["claims"] and m["claims"]["due"] == target]
    assert len(sent) == (2 if where == "after-publish" else 1), sent
    ran = []
    for message in messages(server):  # the worker is slow: it takes them after B re-sent
        meta = message["claims"]
        if meta and meta["due"] == target and b.store.start(
                Delivery(ENTRY, claim.due, meta["token"], WORKER)).ok:
            ran.append(meta["token"])
            b.store.finish([Outcome(ENTRY, claim.due, meta["token"], RunState.DONE)])
    assert len(ran) == 1, (target, ran)
    b.close()


def test_a_request_run_asked_again_with_its_request_id_after_a_lost_reply_records_one_run(
        server: RedisServer, lossy: Proxy) -> None:
    """An operator's request whose reply was lost is asked again with the same request
    id: the store records one manual run, and the second answer is its instant."""
    store = RedisStore.from_url(lossy.url())
    store.register([EntrySeed(ENTRY)])
    lossy.drop_reply_to(function_name("request"))
    with pytest.raises(StoreError):
        store.request_run(ENTRY, "operator", "req-1")
    assert lossy.pending() == 0
    due = store.request_run(ENTRY, "operator", "req-1")  # asked again: safe
    manual = [r for r in RedisStore.from_url(server.url).history(ENTRY) if r.manual]
    assert [r.due for r in manual] == [due], f"{len(manual)} manual runs for one request"
    assert store.request_run(ENTRY, "operator", "req-2") not in (None, due)  # another one


def test_an_entry_added_while_registering_again_after_the_store_went_back_is_sent(
        server: RedisServer, lossy: Proxy) -> None:
    """The reply to the registration of what a beat knows after the store went back is
    lost (it registers again at a later tick), and meanwhile its schedule source adds an
    entry (``change_local``: a database row created): the entry is registered and sent
    once that registration is done (it was left out of the schedule's claims for ever)."""
    app = make_app(server, beat_claims_url=lossy.url())
    s = make(app)
    observer = s.store
    # The store went back (a new epoch, as a wipe's), and the reply to the registration
    # of what this beat knows is lost: the beat registers again at a later tick.
    lossy.drop_reply_to(function_name("register"))
    server.client().delete(f"{{{observer.prefix}}}:epoch")  # type: ignore[attr-defined]
    wait_for(lambda: lossy.pending() == 0 and s._went_back_why is not None, 10,
             "the registration after the new epoch cut short", between=s.tick)
    # Meanwhile the schedule source adds an entry (a database row created).
    added = s.Entry(name="added", task="t.noop", schedule=timedelta(seconds=1), app=app)
    s.change_local({"added": added})
    wait_for(lambda: s._went_back_why is None and s._ready, 10,
             "the registration after the new epoch done", between=s.tick)
    try:
        wait_for(lambda: any(entry == "added" for entry, _ in occurrences_sent(server)), 10,
                 "the added entry sent", between=s.tick)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (registered: {'added' in s.claimer.states}, in the"
                             f" schedule: {'added' in s.schedule}, on the heap:"
                             f" {'added' in s.claimer.slots})") from None
    s.close()
