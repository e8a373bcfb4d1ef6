"""The MySQL store's calls of a burst, without a beat: what each client library costs.

N entries due at once, claimed as a beat's sender claims them (100 a call, each claim
checked before publish in the same call: ``SendAtOnce``) and their sent marks written (100
a call), ``--rounds`` times, on a fresh database of the machine's MySQL or MariaDB
(``BC_MYHOST``, ``BC_MYPORT``, ``BC_MYUSER``, ``BC_MYPASSWORD``; 127.0.0.1:3306, root);
between rounds (not measured) the runs are finished, as workers would. For each client
library installed (``--drivers``), in turns: the wall-clock and CPU seconds of each round
(this process's CPU: the client's and the store's Python, not the server's) and the
store's round trips (``MySQLStore.round_trips``). Prints a table, then one JSON line.

    python bench/mysql_store.py --entries 1000 --rounds 8
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any

from beat_claims.enums import RunState
from beat_claims.runs import Owner
from beat_claims.stores.base import (
    ClaimPlan,
    ClaimStatus,
    EntrySeed,
    EntryState,
    Outcome,
    SendAtOnce,
)
from beat_claims.stores.mysql import MySQLStore
from beat_claims.stores.mysql_driver import DRIVERS, choose

#: Entries a call, as the beat's sender claims and marks them (claimer.CLAIM_CHUNK).
PER_CALL = 100


def _burst(store: MySQLStore, owner: Owner, states: dict[str, EntryState], k: int
           ) -> tuple[dict[str, EntryState], list[Outcome]]:
    """One burst: every entry claimed (checked at once) and marked sent, 100 a call."""
    names = sorted(states)
    done: list[Outcome] = []
    for start in range(0, len(names), PER_CALL):
        part = names[start:start + PER_CALL]
        results = store.claim(owner, [ClaimPlan(
            name, states[name], (states[name].anchor + 60_000 * k,),
            send=SendAtOnce((f"task-{name}-{k}",))) for name in part])
        if any(r.status is not ClaimStatus.OK or len(r.checked) != 1 for r in results):
            sys.exit(f"a claim failed: {results[0]}")
        claims = [c for r in results for c in r.claims]
        if store.record_sent(owner, claims) != len(claims):
            sys.exit("a sent mark was refused")
        states.update((r.entry, r.state) for r in results)
        done += [Outcome(c.entry, c.due, c.token, RunState.DONE) for c in claims]
    return states, done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1000, help="entries due at once (1000)")
    parser.add_argument("--rounds", type=int, default=8, help="bursts per library (8)")
    parser.add_argument("--drivers", default=",".join(n for n, _ in DRIVERS),
                        help="client libraries, comma-separated (every one installed)")
    args = parser.parse_args(argv)
    if not 1 <= args.entries <= 100_000 or not 1 <= args.rounds <= 100:
        sys.exit("--entries: 1 to 100,000; --rounds: 1 to 100")
    modules = dict(DRIVERS)
    drivers = [d for d in args.drivers.split(",") if d in modules
               and importlib.util.find_spec(modules[d])]
    if not drivers:
        sys.exit(f"--drivers: none of {args.drivers!r} is installed")
    host = os.environ.get("BC_MYHOST", "127.0.0.1")
    port = os.environ.get("BC_MYPORT", "3306")
    user = os.environ.get("BC_MYUSER", "root")
    password = os.environ.get("BC_MYPASSWORD", "")
    auth = f"{user}:{password}" if password else user
    database = f"bc_bench_store_{uuid.uuid4().hex[:8]}"
    admin = choose().module.connect(host=host, port=int(port), user=user, password=password,
                                    autocommit=True)
    admin.cursor().execute(f"CREATE DATABASE `{database}`")
    owner = Owner(id="bench-beat", host="bench", pid=os.getpid(), started_at=time.time())
    rounds: dict[str, list[dict[str, Any]]] = {d: [] for d in drivers}
    try:
        stores = {d: MySQLStore.from_url(f"mysql://{auth}@{host}:{port}/{database}?driver={d}",
                                         f"bench_{d}") for d in drivers}
        states = {d: s.register([EntrySeed(f"entry-{i:06d}") for i in range(args.entries)],
                                owner) for d, s in stores.items()}
        for k in range(1, args.rounds + 1):
            for d, store in stores.items():  # (in turns: the machine's drift spread over all)
                trips, wall, cpu = store.round_trips, time.perf_counter(), time.process_time()
                states[d], done = _burst(store, owner, states[d], k)
                rounds[d].append({"seconds": round(time.perf_counter() - wall, 4),
                                  "cpu_seconds": round(time.process_time() - cpu, 4),
                                  "round_trips": store.round_trips - trips})
                store.finish(done)
        for store in stores.values():
            store.close()
    finally:
        with contextlib.suppress(Exception):
            admin.cursor().execute(f"DROP DATABASE `{database}`")
        admin.close()
    summary = {d: {"seconds": statistics.median(r["seconds"] for r in runs),
                   "cpu_seconds": statistics.median(r["cpu_seconds"] for r in runs),
                   "round_trips": statistics.median(r["round_trips"] for r in runs),
                   "rounds": runs} for d, runs in rounds.items()}
    print(f"{'library':12s} {'wall s':>8s} {'CPU s':>8s} {'round trips':>12s}"
          f"   (medians of {args.rounds} bursts of {args.entries})")
    for d, row in summary.items():
        print(f"{d:12s} {row['seconds']:8.3f} {row['cpu_seconds']:8.3f}"
              f" {row['round_trips']:12.0f}")
    print(json.dumps({"benchmark": "mysql_store", "date": time.strftime(
        "%Y-%m-%dT%H:%M:%S+0000", time.gmtime()), "entries": args.entries,
        "rounds": args.rounds, "drivers": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
