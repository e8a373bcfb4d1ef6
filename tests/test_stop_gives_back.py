"""A real beat stopped with SIGTERM gives back every claim it holds and did not send, the
youngest included (claimed in its last tick, claimed ahead, being published when the stop
came): once it has exited, the store shows none held by it, each one is due again, and
another beat sends each of them at once (no heartbeat to lapse, no ``reclaim_after``).

Its own claims are found in the store whatever their age by the beat's clock: that clock
is the store's as read at the last heartbeat, and it lags when the heartbeat's reply comes
late (a loaded host, a slow network); a claim made since is younger than that clock says.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from beat_claims.runs import RunState, iso
from beat_claims.stores.base import LiveQuery
from beat_claims.stores.redis import RedisStore, function_name

from .conftest import RedisServer
from .faults import proxy
from .processes import Fleet, fleet, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("settled_store")]

#: Three claim chunks due together every second (the second claimed ahead, in the claim
#: thread, while the first is sent), and entries whose claims are held until their jitter.
BURST = 250
SCHEDULE = {
    **{f"burst-{i:03d}": {"every": 1} for i in range(BURST)},
    **{f"jittered-{i}": {"every": 1, "claims": {"jitter": 0.8}} for i in range(10)},
}
#: Later than any instant in the store's records: every held claim is older.
EVER = 2 ** 53 - 1
SENDING = re.compile(r"Sending due task \S+ .* due (\S+) token")


def held_by(store: RedisStore, owner: str) -> list[tuple[str, str | None]]:
    """The runs the store shows ``owner`` holding (claimed or being sent), however young."""
    held = store.live_runs(LiveQuery(owner, frozenset(), held_before=EVER, mine_before=EVER,
                                     dead_before=EVER)).held
    return sorted((h.entry, iso(h.due)) for h in held if h.owner == owner)


def due_again(store: RedisStore) -> set[tuple[str, int]]:
    return {(r.entry, r.due) for name in SCHEDULE for r in store.history(name)
            if r.state is RunState.DUE}


def stop_in_a_burst(f: Fleet, beat: subprocess.Popen[bytes]) -> None:
    """SIGTERM once the beat has begun to send a burst, and before it sent half of it."""
    def in_a_burst() -> bool:
        sent = Counter(SENDING.findall(f.log(beat)))
        return any(10 <= n < BURST // 2 for n in sent.values())

    wait_for(in_a_burst, 30, "the beat in the middle of a burst", interval=0.002)
    f.stop(beat, signal.SIGTERM)


@pytest.mark.parametrize("heartbeat_reply", ["prompt", "late"])
def test_a_beat_stopped_in_a_burst_holds_no_claim_and_another_sends_them_at_once(
        server: RedisServer, broker: RedisServer, tmp_path: Path,
        heartbeat_reply: str) -> None:
    store = RedisStore.from_url(server.url, "beat-claims")
    conf = json.dumps({"beat_claims_claim_ahead": True, "beat_claims_catch_up": "all"})
    with proxy(server.port) as slow, \
            fleet(server.url, broker.broker_url(), tmp_path, SCHEDULE, BC_CONF=conf) as f:
        if heartbeat_reply == "late":
            # The store reads its clock at once; its answer reaches the beat 0.6 s later:
            # the beat's clock lags the store's by 0.3 s until the next heartbeat.
            slow.delay_replies_to(function_name("heartbeat"), 0.6)
        first = f.beat(BC_REDIS_URL=slow.url())
        f.wait_log(first, "claiming")
        [owner] = wait_for(lambda: [o.owner.id for o in store.owners() if o.alive], 10,
                           "the beat's heartbeat")
        stop_in_a_burst(f, first)
        assert first.returncode == 0, f.log(first)[-3000:]
        left = held_by(store, owner)
        assert left == [], (f"{len(left)} claim(s) still held by the stopped beat: {left[:5]}"
                            f"\n{f.log(first)[-3000:]}")
        given_back = due_again(store)
        assert given_back, "the stop came when the beat held nothing"
        second = f.beat()
        wait_for(lambda: not given_back & due_again(store), 15,
                 f"another beat to send the {len(given_back)} run(s) given back")
        f.stop(second, signal.SIGTERM)
