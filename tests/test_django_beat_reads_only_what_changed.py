"""DatabaseScheduler with many rows: a change reaches every beat by reading what changed.

Two real ``celery beat -S ...DatabaseScheduler`` processes and a worker on a PostgreSQL
test database of ROWS ``PeriodicTask`` rows (``bench/django_rows.py`` measures 100,000,
and django-celery-beat's own scheduler beside). One row's interval is changed with
``save()``, one row disabled, one deleted: each beat sends by the new definitions within
one interval of the change, and says that it read those rows alone.
"""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("django_celery_beat")

from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from beat_claims.runs import RunState, iso, to_ms
from beat_claims.stores.redis import RedisStore

from .conftest import RedisServer
from .processes import wait_for
from .test_django_beat import dues_of, every, executions, row, site, site_env

pytestmark = pytest.mark.usefixtures("settled_store")

#: Rows in the table: as many as keep the test within a minute on two cores shared with
#: other work (about 30 s). At 20,000 and 30,000, with the test site's 1 s heartbeat, the
#: beats stalled for seconds after registering every row (docs/benchmarks.md).
ROWS = 10000
#: A beat's "read N changed rows" line (DatabaseScheduler._refresh).
READ = re.compile(r"database rows \(the change marker moved\): read (\d+) changed rows of"
                  r" (\d+) enabled, (\d+) gone")


def bulk_rows(n: int) -> None:
    """``n`` rows due once an hour (none is due during the test), as an import makes them."""
    hourly = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.HOURS)
    PeriodicTask.objects.bulk_create(
        [PeriodicTask(name=f"bulk-{i:06d}", task="djangosite.record", interval=hourly,
                      args=f"[{i}]") for i in range(n)], batch_size=5000)


def sent(store: RedisStore, name: str) -> list[tuple[int, int]]:
    """(due, sent_at) of the occurrences of ``name`` the store says were sent."""
    return sorted((r.due, r.sent_at or 0) for r in store.history(name) if r.state in (
        RunState.SENT, RunState.STARTED, RunState.DONE))


def _steady(runs: list[tuple[int, int]]) -> bool:
    """The last three occurrences of a row due every second were sent on time."""
    return len(runs) >= 3 and all(sent_at - due < 500 for due, sent_at in runs[-3:])


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_change_to_one_row_of_many_reaches_both_beats_reading_only_that_row(
        server: RedisServer, broker: RedisServer, tmp_path: Path) -> None:
    bulk_rows(ROWS)
    target = row("target", interval=every(60))  # nothing due in the test before the change
    to_disable = row("to-disable", interval=every(1))
    to_delete = row("to-delete", interval=every(1))
    store = RedisStore.from_url(server.url, "beat-claims")
    delay = 1.0  # the site's max_interval: how often a beat checks the change marker
    with site(site_env(server, broker), tmp_path) as fleet:
        fleet.worker(concurrency=2)
        beats = [fleet.beat(), fleet.beat()]
        for beat in beats:
            fleet.wait_log(beat, f"({ROWS + 3} from the database)", 60)
        # Sending steadily (the first seconds after registering every row are busy).
        wait_for(lambda: _steady(sent(store, "to-disable")) and _steady(
            sent(store, "to-delete")), 60, "the beats to send the rows due every second")

        target.interval = every(2)
        target.save()  # the admin's form: date_changed and the change marker move
        changed_at = to_ms(timezone.now())
        to_disable.enabled = False
        to_disable.save()
        disabled_at = to_ms(timezone.now())
        to_delete.delete()
        deleted_at = to_ms(timezone.now())

        # By the new interval: on a 2 s grid (the first may be the latest occurrence missed
        # since the entry's anchor, as catch_up "latest" says), the first sent within one
        # check of the marker and one interval.
        def since_change() -> list[tuple[int, int]]:
            return [(d, s) for d, s in sent(store, "target") if s >= changed_at]

        wait_for(lambda: len(since_change()) >= 3, 20, "three sends of target by its new"
                 " interval")
        runs = since_change()
        dues = [d for d, _ in runs]
        assert all(b - a == 2000 for a, b in itertools.pairwise(dues)), [
            iso(d) for d in dues]
        first_sent = runs[0][1]
        latency = (first_sent - changed_at) / 1000
        assert latency <= delay + 2 + 1, (iso(changed_at), [(iso(d), iso(s)) for d, s in runs])
        # Nothing of the disabled and deleted rows is due after one check of the marker.
        for name, at in (("to-disable", disabled_at), ("to-delete", deleted_at)):
            late = [iso(d) for d, _ in sent(store, name) if d > at + int(delay * 1000) + 500]
            assert late == [], (name, iso(at), late)

        # Each beat read the changed rows alone, and applied the three changes.
        reads: dict[int, list[tuple[int, int, int]]] = {}
        for beat in beats:
            text = fleet.log(beat)
            assert "entry target: changed" in text, text[-3000:]
            assert "entry to-disable: no longer scheduled" in text, text[-3000:]
            assert "entry to-delete: no longer scheduled" in text, text[-3000:]
            reads[beat.pid] = [(int(n), int(of), int(gone)) for n, of, gone in READ.findall(text)]
            assert reads[beat.pid], text[-3000:]
            assert all(n <= 3 for n, _, _ in reads[beat.pid]), reads
            assert sum(n + gone for n, _, gone in reads[beat.pid]) >= 3, reads
            assert ROWS + 1 in {of for _, of, _ in reads[beat.pid]}, reads
        worker_ran = dues_of(executions(broker), "target")
        assert worker_ran[:3] == dues[:3], ([iso(d) for d in worker_ran], [iso(d) for d in dues])
        sys.stdout.write(f"rows {ROWS + 3}; save() to the first send by the new interval:"
                         f" {latency:.2f}s; reads: {reads}\n")
