"""The MySQL store's rows of one chunk of claims, checks or outcomes, read at once.

The transitions (``sqlite.RowStore``) read and write one row at a time: on a server that is
a round trip each, a few per item. For the calls of the hot path (claim, check, record_sent,
release, reclaim, finish) the store reads up front, in a few statements, every row the
chunk's items are about (their entries' rows, locked; every unfinished run of those entries;
the runs at the instants the items name; for a claim, the history's size, its oldest runs and
the lost keep, what a trim reads) and answers the transitions' reads from that copy; their writes go
to the copy and are sent at the end, in a few multi-row statements, before the commit.

What it does not hold, it never guesses: a read of a row it does not know goes to the
server (after the writes held so far are sent), and any statement it does not know how to
answer is sent as it is, once the held writes are sent; one that writes makes it forget
everything it held (later reads go to the server). The transaction and its row locks are
the same either way: only the number of round trips changes.

The savepoints of the items are not taken (each would be a round trip): an item that fails
(a record that cannot be read) raises ``ItemFailed``, and the store runs the chunk again,
from the start, the slow way (a savepoint per item, every statement sent).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

#: The run's columns, as this copy keeps them (after entry and due).
RUN_COLUMNS = ("record", "kind", "since", "owner", "token", "busy", "place", "lost_at")
#: The entry's columns the transitions of the hot path read, and those they write.
ENTRY_COLUMNS = ("description", "anchor", "checkpoint", "token", "paused_at", "last_paused_at",
                 "resumed_at", "version", "horizon", "next_due", "registrants")
ENTRY_WRITTEN = ("description", "anchor", "checkpoint", "token", "next_due", "horizon",
                 "registrants")
#: Reads of other tables that a transaction of the hot path never writes: answered once.
KEPT_READS = ("owners_alive",)
#: Rows of one multi-row statement at most.
ROWS_PER_STATEMENT = 1000

Row = dict[str, Any]
Key = tuple[str, int]
Statement = tuple[str, Sequence[Any]]


class ItemFailed(Exception):
    """An item failed where its savepoint would have been rolled back: run the chunk again,
    a savepoint per item."""


class Cursor:
    """What sqlite3's cursor gives: rows read at once, and the rows a write changed."""

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int = -1) -> None:
        self._rows = rows
        self._at = 0
        self.rowcount = rowcount

    def fetchone(self) -> tuple[Any, ...] | None:
        if self._at >= len(self._rows):
            return None
        self._at += 1
        return self._rows[self._at - 1]

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._at = self._rows[self._at:], len(self._rows)
        return rows

    def __iter__(self) -> Any:
        return iter(self.fetchall())


#: A statement, and what takes its answer.
First = tuple[str, Sequence[Any], Callable[[Cursor], None]]


class Rows:
    """The copy of one transaction's rows (see the module's doc). ``send_many(statements)``
    runs statements on the server, in one round trip; ``sql`` the store's statements by
    name; ``runs`` and ``entries`` the tables' quoted names; ``first``: a statement sent
    with the first of them, and what takes its answer (the transaction's clock)."""

    def __init__(self, send_many: Callable[[Sequence[Statement]], list[Cursor]],
                 sql: dict[str, str], runs: str, entries: str, savepoints: Sequence[str],
                 due_at_once: int = 0, base: str = "", first: First | None = None) -> None:
        self._send_batch = send_many
        self._first = first
        self._due_at_once = due_at_once
        self._runs_table, self._entries_table = runs, entries
        # The runs' indexes the reads name (see ``load``).
        self._by_kind = f"{runs} FORCE INDEX (`{base}_runs_kind`)"
        self._by_key = f"{runs} FORCE INDEX (PRIMARY)"
        self._by_place = f"{runs} FORCE INDEX (`{base}_runs_history`)"
        # (each statement the copy answers, by its text: the method that answers it)
        self._answers: dict[str, Callable[..., Any]] = {
            text: getattr(self, f"_{name}") for name, text in sql.items()
            if hasattr(self, f"_{name}")}
        self._kept = {sql[name] for name in KEPT_READS}
        self._read: dict[tuple[str, tuple[Any, ...]], list[tuple[Any, ...]]] = {}
        self._make, self._undo, self._release = savepoints
        self.entries: dict[str, Row | None] = {}
        self.runs: dict[Key, Row | None] = {}
        self.by_entry: dict[str, set[int]] = {}
        self.live: set[str] = set()  # entries whose unfinished runs are all in ``runs``
        self.lost: set[str] = set()  # entries whose lost keep (place 'x') is all in ``runs``
        self.counts: dict[str, dict[str, int]] = {}  # entry -> place -> runs
        self.oldest: dict[str, tuple[int | None, bool]] = {}  # entry -> (bound, complete)
        self.deleted: list[Key] = []
        self.dirty_runs: set[Key] = set()
        self.dirty_entries: set[str] = set()

    # -- reading up front -----------------------------------------------------------------
    def load(self, names: Sequence[str], keys: Iterable[Key], claims: dict[str, int] | None,
             limit: int) -> None:
        """Lock and read the entries' rows, their unfinished runs and the runs at ``keys``;
        with ``claims`` (entry -> runs a claim may add), the history's size and the oldest
        runs a trim would read."""
        marks = ", ".join(["%s"] * len(names))
        reads: list[Statement] = [(
            f"SELECT name, {', '.join(ENTRY_COLUMNS)} FROM {self._entries_table}"
            f" WHERE name IN ({marks}) ORDER BY name FOR UPDATE", names)]
        keys = sorted(set(keys))
        columns = ", ".join(("entry", "due", *RUN_COLUMNS))
        # Each part names its index: left to choose, MariaDB's optimizer weighs every index
        # of the runs for each value of a long IN list (a chunk's 100 keys: 20 ms of the
        # server's time, instead of 1 ms). A run found by two parts is the same row.
        statement = (f"SELECT {columns} FROM {self._by_kind} WHERE entry IN ({marks})"
                     " AND kind IN ('due', 'waiting', 'held', 'open')")
        params: list[Any] = list(names)
        if keys:
            statement += (f" UNION ALL SELECT {columns} FROM {self._by_key} WHERE (entry, due)"
                          f" IN ({', '.join(['(%s, %s)'] * len(keys))})")
            params += [v for key in keys for v in key]
        if claims is not None:  # (and the lost keep: a trim reads it)
            statement += (f" UNION ALL SELECT {columns} FROM {self._by_place} WHERE entry IN"
                          f" ({marks}) AND place = 'x'")
            params += list(names)
            self.lost.update(names)
        reads.append((statement, params))
        if claims is not None:  # (the history's size)
            reads.append((f"SELECT entry, place, COUNT(*) FROM {self._by_place} WHERE entry"
                          f" IN ({marks}) AND place IN ('h', 'x') GROUP BY entry, place",
                          names))
        # (one round trip: the entries locked first, the runs read under their locks)
        answers = self._send_many(reads)
        for row in answers[0].fetchall():
            self.entries[row[0]] = dict(zip(ENTRY_COLUMNS, row[1:]))
        for name in names:
            self.entries.setdefault(name, None)
            self.by_entry.setdefault(name, set())
        for row in answers[1].fetchall():
            self._know((row[0], int(row[1])), dict(zip(RUN_COLUMNS, row[2:])))
        for key in keys:
            if key not in self.runs:
                self._know(key, None)
        self.live.update(names)
        if claims is None:
            return
        for name in names:
            self.counts[name] = {"h": 0, "x": 0}
        for entry, place, n in answers[2].fetchall():
            self.counts[entry][str(place)] = int(n)
        full = {name: self.counts[name]["h"] + claims.get(name, 0) - limit for name in names}
        trimmed = sorted(name for name, excess in full.items() if excess > 0)
        if not trimmed:
            return
        most = max(full[name] for name in trimmed) + 64
        found: dict[str, list[int]] = {name: [] for name in trimmed}
        for row in self._send(
                f"SELECT {columns} FROM (SELECT {columns}, ROW_NUMBER() OVER (PARTITION BY"
                f" entry ORDER BY due) AS n FROM {self._by_place} WHERE entry IN"
                f" ({', '.join(['%s'] * len(trimmed))}) AND place = 'h') AS oldest"
                " WHERE n <= %s", [*trimmed, most]).fetchall():
            key = (row[0], int(row[1]))
            if key not in self.runs:
                self._know(key, dict(zip(RUN_COLUMNS, row[2:])))
            found[row[0]].append(key[1])
        for name, dues in found.items():
            self.oldest[name] = (max(dues) if dues else None, len(dues) < most)

    def _know(self, key: Key, row: Row | None) -> None:
        self.runs[key] = row
        self.by_entry.setdefault(key[0], set()).add(key[1])

    # -- the statements ---------------------------------------------------------------------
    def execute(self, statement: str, params: Sequence[Any] = ()) -> Cursor:
        if statement in (self._make, self._release):
            return Cursor([])
        if statement == self._undo:
            raise ItemFailed()
        handler = self._answers.get(statement)
        if handler is not None:
            answer = handler(*params)
            if answer is not NotImplemented:
                return answer
        if statement in self._kept:
            read = (statement, tuple(params))
            if read not in self._read:
                self._read[read] = self._send(statement, params).fetchall()
            return Cursor(list(self._read[read]))
        [cur] = self.flush((statement, params))  # (after the writes held, with them)
        if not statement.lstrip().upper().startswith("SELECT") and (
                self._runs_table in statement or self._entries_table in statement):
            self.forget()  # a write this copy does not follow: read from the server now
        return cur

    def forget(self) -> None:
        self.entries.clear()
        self.runs.clear()
        self.by_entry.clear()
        self.live.clear()
        self.lost.clear()
        self.counts.clear()
        self.oldest.clear()

    def flush(self, *then: Statement) -> list[Cursor]:
        """Send the writes held so far (a few multi-row statements), and ``then`` after
        them, in one round trip: the answers to ``then``."""
        writes: list[Statement] = []
        for part in _parts(self.deleted):
            # (a join with the keys: a DELETE with a list of (entry, due) pairs scans the
            # table on MariaDB)
            keys = " UNION ALL ".join(["SELECT %s AS entry, %s AS due"] * len(part))
            writes.append((f"DELETE r FROM {self._runs_table} AS r JOIN ({keys}) AS k"
                           " ON r.entry = k.entry AND r.due = k.due",
                           [v for key in part for v in key]))
        self.deleted = []
        rows = sorted(key for key in self.dirty_runs if self.runs.get(key) is not None)
        self.dirty_runs.clear()
        for part in _parts(rows):
            values = ", ".join([f"({', '.join(['%s'] * (2 + len(RUN_COLUMNS)))})"] * len(part))
            writes.append((
                f"INSERT INTO {self._runs_table} (entry, due, {', '.join(RUN_COLUMNS)})"
                f" VALUES {values} ON DUPLICATE KEY UPDATE "
                + ", ".join(f"{c} = VALUES({c})" for c in RUN_COLUMNS),
                [v for key in part for v in (*key, *(
                    self.runs[key][c] for c in RUN_COLUMNS))]))  # type: ignore[index]
        names = sorted(name for name in self.dirty_entries if self.entries.get(name))
        self.dirty_entries.clear()
        for part in _parts(names):
            values = ", ".join([f"(%s, {', '.join(['%s'] * len(ENTRY_WRITTEN))})"]
                               * len(part))
            writes.append((
                f"INSERT INTO {self._entries_table} (name, {', '.join(ENTRY_WRITTEN)})"
                f" VALUES {values} ON DUPLICATE KEY UPDATE "
                + ", ".join(f"{c} = VALUES({c})" for c in ENTRY_WRITTEN),
                [v for name in part for v in (name, *(
                    self.entries[name][c] for c in ENTRY_WRITTEN))]))  # type: ignore[index]
        if not writes and not then:
            return []
        return self._send_many([*writes, *then])[len(writes):]

    def begin(self) -> None:
        """Send the first statement now if nothing was sent yet (the transitions read the
        clock it reads)."""
        if self._first is not None:
            self._send_many([])

    def _send_many(self, statements: Sequence[Statement]) -> list[Cursor]:
        """Statements in one round trip (the first statement before them, once)."""
        first, self._first = self._first, None
        if first is None:
            return self._send_batch(statements) if statements else []
        found = self._send_batch([(first[0], first[1]), *statements])
        first[2](found[0])
        return found[1:]

    def _send(self, statement: str, params: Sequence[Any]) -> Cursor:
        return self._send_many([(statement, params)])[0]

    # -- runs ----------------------------------------------------------------------------
    def _row(self, entry: str, due: int) -> Row | Any | None:
        """The run's row (None: there is none), read from the server when not known."""
        key = (entry, int(due))
        if key not in self.runs:
            [read] = self.flush((f"SELECT {', '.join(RUN_COLUMNS)} FROM {self._runs_table}"
                                 " WHERE entry = %s AND due = %s", key))
            found = read.fetchone()
            self._know(key, None if found is None else dict(zip(RUN_COLUMNS, found)))
        return self.runs[key]

    def _run_get(self, entry: str, due: int) -> Cursor:
        row = self._row(entry, due)
        return Cursor([] if row is None else [(row["record"],)])

    def _count(self, entry: str, place: Any, by: int) -> None:
        if place in ("h", "x") and entry in self.counts:
            self.counts[entry][place] += by

    def _run_insert(self, entry: str, due: int, record: str, kind: Any, since: Any,
                    owner: Any, token: Any, busy: Any) -> Cursor | Any:
        key = (entry, int(due))
        if key not in self.runs or self.runs[key] is not None:
            return NotImplemented  # (the server says: a duplicate)
        self._know(key, dict(zip(RUN_COLUMNS, (record, kind, since, owner, token, busy, "h",
                                               None))))
        self._count(entry, "h", 1)
        self.dirty_runs.add(key)
        return Cursor([], 1)

    def _held(self, entry: str, due: int) -> Row | Cursor | Any:
        """The run's known row to write; else what the write answers: NotImplemented (not
        known: the server's), or nothing changed (there is none)."""
        key = (entry, int(due))
        if key not in self.runs:
            return NotImplemented
        row = self.runs[key]
        return Cursor([], 0) if row is None else row

    def _write_run(self, entry: str, due: int, **values: Any) -> Cursor | Any:
        row = self._held(entry, due)
        if not isinstance(row, dict):
            return row
        key = (entry, int(due))
        if "place" in values:
            self._count(entry, row["place"], -1)
            self._count(entry, values["place"], 1)
        row.update(values)
        self.dirty_runs.add(key)
        return Cursor([], 1)

    def _run_update(self, record: str, kind: Any, since: Any, owner: Any, token: Any,
                    busy: Any, entry: str, due: int) -> Cursor | Any:
        return self._write_run(entry, due, record=record, kind=kind, since=since,
                               owner=owner, token=token, busy=busy)

    def _run_unindex(self, entry: str, due: int) -> Cursor | Any:
        return self._write_run(entry, due, kind=None, since=None, owner=None, token=None,
                               busy=None)

    def _run_place(self, place: Any, lost_at: Any, entry: str, due: int) -> Cursor | Any:
        return self._write_run(entry, due, place=place, lost_at=lost_at)

    def _run_delete(self, entry: str, due: int) -> Cursor | Any:
        row = self._held(entry, due)
        if not isinstance(row, dict):
            return row
        key = (entry, int(due))
        self._count(entry, row["place"], -1)
        self.runs[key] = None
        self.dirty_runs.discard(key)
        self.deleted.append(key)
        return Cursor([], 1)

    def _live(self, entry: str, keep: Callable[[Row], bool]) -> Cursor | Any:
        if entry not in self.live:
            return NotImplemented
        out = []
        for due in sorted(self.by_entry.get(entry, ())):
            row = self.runs[(entry, due)]
            if row is not None and keep(row):
                out.append((due, row["record"]))
        return Cursor(out)

    def _runs_due(self, entry: str) -> Cursor | Any:
        return self._live(entry, lambda row: row["kind"] == "due")

    def _runs_waiting(self, entry: str) -> Cursor | Any:
        return self._live(entry, lambda row: row["kind"] == "waiting")

    def _runs_busy(self, entry: str) -> Cursor | Any:
        return self._live(entry, lambda row: row["busy"] == 1)

    def _history_count(self, entry: str) -> Cursor | Any:
        return Cursor([(self.counts[entry]["h"],)]) if entry in self.counts else NotImplemented

    def _lost_count(self, entry: str) -> Cursor | Any:
        return Cursor([(self.counts[entry]["x"],)]) if entry in self.counts else NotImplemented

    def _history_oldest(self, entry: str, n: int) -> Cursor | Any:
        if entry not in self.oldest:
            return NotImplemented
        bound, complete = self.oldest[entry]
        rows = [(due, row) for due in sorted(self.by_entry.get(entry, ()))
                if (row := self.runs[(entry, due)]) is not None and row["place"] == "h"]
        if not complete:
            rows = [(due, row) for due, row in rows if bound is not None and due <= bound]
            if len(rows) < n:
                return NotImplemented
        return Cursor([(due, row["record"]) for due, row in rows[:n]])

    def _kept_lost(self, entry: str) -> list[tuple[int, int]] | Any:
        """The entry's lost keep, (lost_at, due) in that order."""
        if entry not in self.lost:
            return NotImplemented
        return sorted((int(row["lost_at"] or 0), due) for due in self.by_entry.get(entry, ())
                      if (row := self.runs[(entry, due)]) is not None and row["place"] == "x")

    def _lost_expired(self, entry: str, before: int) -> Cursor | Any:
        kept = self._kept_lost(entry)
        if kept is NotImplemented:
            return NotImplemented
        return Cursor([(due,) for at, due in kept if at < before])

    def _lost_oldest(self, entry: str, n: int, skip: int) -> Cursor | Any:
        kept = self._kept_lost(entry)
        if kept is NotImplemented:
            return NotImplemented
        return Cursor([(due,) for _, due in kept[skip:skip + n]])

    # -- entries -------------------------------------------------------------------------
    def _entry(self, name: str) -> Row | Any | None:
        return self.entries.get(name, NotImplemented)

    def _read_entry(self, name: str, answer: Callable[[Row], tuple[Any, ...]]) -> Cursor | Any:
        row = self._entry(name)
        if row is NotImplemented:
            return NotImplemented
        return Cursor([] if row is None else [answer(row)])

    def _entry_get(self, name: str) -> Cursor | Any:
        return self._read_entry(name, lambda e: (e["anchor"], e["checkpoint"], e["token"]))

    def _entry_pause_of(self, name: str) -> Cursor | Any:
        return self._read_entry(name, lambda e: (int(e["paused_at"] is not None),
                                                 e["last_paused_at"], e["resumed_at"]))

    def _entry_paused(self, name: str) -> Cursor | Any:
        return self._read_entry(name, lambda e: (int(e["paused_at"] is not None),))

    def _next_state(self, name: str) -> Cursor | Any:
        return self._read_entry(name, lambda e: (e["anchor"], e["checkpoint"], e["version"]))

    def _entry_horizon(self, name: str) -> Cursor | Any:
        return self._read_entry(name, lambda e: (e["horizon"],))

    def _write_entry(self, name: str, **values: Any) -> Cursor | Any:
        row = self._entry(name)
        if row is NotImplemented:
            return NotImplemented
        if row is None:
            return Cursor([], 0)
        row.update(values)
        self.dirty_entries.add(name)
        return Cursor([], 1)

    def _entry_put(self, name: str, description: str, anchor: Any, checkpoint: Any,
                   token: Any) -> Cursor | Any:
        """A new entry (indexed due at once), or the entry's description, anchor,
        checkpoint and token."""
        row = self._entry(name)
        if row is NotImplemented:
            return NotImplemented
        if row is None:
            row = self.entries[name] = {**dict.fromkeys(ENTRY_COLUMNS), "version": 0,
                                        "next_due": self._due_at_once}
        row.update(description=description, anchor=anchor, checkpoint=checkpoint,
                   token=token)
        self.dirty_entries.add(name)
        return Cursor([], 1)

    def _entry_registrants(self, name: str) -> Cursor | Any:
        return self._read_entry(name, lambda e: (e["registrants"],))

    def _entry_registrants_set(self, registrants: str, name: str) -> Cursor | Any:
        return self._write_entry(name, registrants=registrants)

    def _next_set(self, next_due: Any, name: str) -> Cursor | Any:
        return self._write_entry(name, next_due=next_due)

    def _entry_move(self, checkpoint: Any, token: Any, name: str) -> Cursor | Any:
        return self._write_entry(name, checkpoint=checkpoint, token=token)

    def _entry_horizon_set(self, horizon: Any, name: str) -> Cursor | Any:
        return self._write_entry(name, horizon=horizon)


def _parts(items: Sequence[Any]) -> list[Sequence[Any]]:
    return [items[i:i + ROWS_PER_STATEMENT] for i in range(0, len(items), ROWS_PER_STATEMENT)]


__all__ = ["Cursor", "First", "ItemFailed", "Rows", "Statement"]
