"""``celery -A APP claims ...``: see what every beat claimed, sent and recorded, and act on
it: pause, resume, trigger, backfill, release, prune; a health probe and a fleet exporter.

A command that reads the schedule first loads the app as ``celery beat`` does
(:func:`load_app`): in a Django project that sets Django up, so it reads the schedule the
beats run, django-celery-beat's rows included.

A user's mistake (no ``-A``, a setting, a store that does not answer, an entry the store
does not know, a request that cannot be done) is one line on stderr and exit code 1; a
traceback only for a bug. This module parses and prints: what the actions do is in
:mod:`beat_claims.operations`, :mod:`beat_claims.health` and :mod:`beat_claims.exporter`.
"""

from __future__ import annotations

import json
import sys
import weakref
from collections.abc import Callable
from typing import Any

import click
from celery.bin.base import CeleryCommand, handle_preload_options

from . import exporter as fleet_exporter
from . import health as fleet_health
from . import inspect, operations, redbeat_import
from . import unstarted as fleet_unstarted
from .definitions import DefinitionError
from .entries import EntryError
from .runs import iso
from .settings import ConfigurationError, Settings
from .stores.base import StoreConfigurationError, StoreError
from .urls import redact_url

#: Runs ``history`` shows unless told otherwise.
DEFAULT_LIMIT = 20
#: ``prune`` leaves an entry alone if it ran within this many days.
DEFAULT_PRUNE_DAYS = 7.0

json_option = click.option("-j", "--json", "as_json", is_flag=True,
                           help="Print one JSON document.")
by_option = click.option("--by", metavar="NAME", default=None,
                         help="Who asks, recorded with the action (default: <OS user>@<host>).")


def entry_action(*params: Callable[[Any], Any]) -> Callable[[Callable[..., None]], Any]:
    """A write action's command: ENTRY, then ``params``, ``--by`` and ``-j/--json``."""
    def wrap(f: Callable[..., None]) -> Any:
        f = by_option(json_option(click.pass_context(f)))
        for param in reversed(params):
            f = param(f)
        return claims.command(cls=CeleryCommand)(click.argument("entry")(f))
    return wrap


class Instant(click.ParamType):
    """An ISO 8601 instant (naive: UTC) as UTC ms; with ``allow_ms``, UTC ms too."""

    name = "INSTANT"

    def __init__(self, allow_ms: bool = False) -> None:
        self.allow_ms = allow_ms

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return operations.parse_instant(str(value), param.name if param else "value",
                                            self.allow_ms)
        except operations.OperationError as exc:
            self.fail(str(exc), param, ctx)


def _app(ctx: click.Context) -> Any:
    return ctx.obj.app


def _fail(message: str) -> None:
    click.echo(f"beat-claims: {message}", err=True)
    sys.exit(1)


def _run(ctx: click.Context, what: Callable[[], Any]) -> Any:
    """``what()``, with a user's mistake said in one line (exit code 1)."""
    app = _app(ctx)
    try:
        return what()
    except ConfigurationError as exc:
        hint = ""
        if not app.main or app.main in ("__main__", "default"):
            hint = " (no Celery app: run it as `celery -A proj claims ...`)"
        _fail(f"{exc}{hint}")
    except StoreConfigurationError as exc:
        _fail(str(exc))
    except StoreError as exc:
        _fail(f"store unreachable: {exc}")
    except (inspect.UnknownEntry, operations.OperationError, EntryError,
            DefinitionError) as exc:
        _fail(str(exc))


def _print(as_json: bool, doc: dict[str, Any], text: str) -> None:
    click.echo(json.dumps(doc, indent=2) if as_json else text)


@click.group()
@click.pass_context
@handle_preload_options
def claims(ctx: click.Context) -> None:
    """Inspect beat-claims (entries, claims, outcomes, history), act on entries (pause,
    resume, trigger, backfill, release, prune), probe the fleet's health, export its
    metrics."""


#: The apps this process loaded as a beat does (once each: Django's checks run there).
_loaded: weakref.WeakSet[Any] = weakref.WeakSet()


def load_app(app: Any) -> None:
    """Load the app as a beat does before it reads its schedule: Celery's
    ``loader.import_default_modules()`` (what ``celery beat`` runs at start, through
    ``loader.init_worker()``, and ``celery shell`` too). In a Django project, Celery's
    Django fixup sets Django up there (``django.setup()``, and Django's checks), so that
    django-celery-beat's rows and beat-claims' own DatabaseScheduler read as the beats read
    them. Once per app; only where the schedule is read (a liveness probe does not pay
    for it). A project that cannot be loaded is one line and exit code 1, as the beat
    would fail."""
    if app in _loaded:
        return
    try:
        app.loader.import_default_modules()
    except Exception as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        _fail(f"cannot load the app {app.main or ''} as a beat does: {type(exc).__name__}: "
              + "; ".join(lines)[:500])
    _loaded.add(app)


@claims.command(cls=CeleryCommand)
@json_option
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Every entry: next run, last outcome, current claims, counts by state; and the
    beats. Times are ISO 8601 UTC."""
    doc = _run(ctx, lambda: inspect.status(_app(ctx), schedules=_schedules(_app(ctx))))
    click.echo(json.dumps(doc, indent=2) if as_json else status_table(doc))


def status_table(doc: dict[str, Any]) -> str:
    """The status document as a table for people."""
    owners = doc["owners"]
    alive = [o for o in owners if o["alive"]]
    lines = [f"beats alive: {len(alive)} of {len(owners)} registered"
             + (": " + ", ".join(f"{o['beat']} ({o['id'][:8]})" for o in alive)
                if alive else "")]
    after = doc.get("unstarted_after")
    waiting = [e["name"] for e in doc["entries"] if e.get("unstarted")]
    if waiting and after is not None:
        lines.append(f"WARNING: {fleet_unstarted.summary(waiting, after)}")
    differing = [e for e in doc["entries"] if e.get("beat_schedule_differs_in")]
    if differing:
        lines.append(f"WARNING: {len(differing)} entry(ies) defined otherwise in the"
                     " beat_schedule of live beats (each occurrence is sent by the store's"
                     " definition): " + "; ".join(
                         f"{e['name']} in {', '.join(e['beat_schedule_differs_in'])}"
                         for e in differing[:10]))
    lines.append(f"{'ENTRY':30} {'NEXT DUE':26} {'LAST':10} {'LAST DUE':26} CLAIMS  COUNTS")
    for e in doc["entries"]:
        last = e["last_run"] or {}
        counts = " ".join(f"{k}={v}" for k, v in e["counts"].items() if v)
        name = e["name"] if e["in_schedule"] else f"{e['name']} (removed)"
        paused = e.get("paused")
        if paused:
            counts = (f"PAUSED since {paused['at']} by {paused['by']}"
                      + (f" ({paused['note']})" if paused["note"] else "") + f"; {counts}")
        if e.get("beat_schedule_differs_in"):
            counts = f"DIFFERS in {len(e['beat_schedule_differs_in'])} beat(s); {counts}"
        waits = e.get("unstarted")
        if waits:
            counts = (f"NOT STARTED: {waits['runs']} run(s) sent, the oldest"
                      f" {waits['seconds']:g} s ago; {counts}")
        lines.append(f"{name[:30]:30} {e['next_due'] or '-':26}"
                     f" {last.get('state', '-'):10} {last.get('due') or '-':26}"
                     f" {len(e['claims']):6}  {counts}")
    return "\n".join(lines)


@claims.command(cls=CeleryCommand)
@click.argument("entry")
@click.option("--limit", type=click.IntRange(min=1), default=DEFAULT_LIMIT,
              show_default=True, help="The newest N runs.")
@json_option
@click.pass_context
def history(ctx: click.Context, entry: str, limit: int, as_json: bool) -> None:
    """The runs of ENTRY (an entry's name, as in beat_schedule), newest first."""
    doc = _run(ctx, lambda: inspect.history(_app(ctx), entry, limit))
    click.echo(json.dumps(doc, indent=2) if as_json else history_table(doc))


def history_table(doc: dict[str, Any]) -> str:
    """The history document as a table for people."""
    lines = [f"{'DUE':26} {'STATE':10} {'TOKEN':>5} {'WORKER':24} DETAIL"]
    for run in doc["runs"]:
        detail = run["reason"] or run["exc_type"] or ""
        if run["exc_message"]:
            detail += f": {run['exc_message']}"
        if run.get("manual"):
            detail = f"manual ({run.get('requested_by') or '?'}) {detail}".rstrip()
        lines.append(f"{run['due']:26} {run['state']:10} {run['token']:>5}"
                     f" {run['worker'] or '-':24} {detail}")
    return "\n".join(lines)


@claims.command(cls=CeleryCommand)
@click.option("--older-than", "days", type=click.FloatRange(min=0),
              default=DEFAULT_PRUNE_DAYS, show_default=True,
              help="Only entries that have not been active for this many days.")
@click.option("--yes", is_flag=True, help="Remove them. Without it, prune only lists what"
              " it would remove, and why.")
@click.option("--dry-run", is_flag=True, help="List only (what prune does without --yes).")
@json_option
@click.pass_context
def prune(ctx: click.Context, days: float, yes: bool, dry_run: bool, as_json: bool) -> None:
    """List the entries of the store that may go, and why, and with --yes remove them (with
    their runs and task ids): entries in no schedule of this app (nor held by an enabled
    django-celery-beat row), that no live beat registered, with no run claimed, being
    sent, sent or started, and not active for --older-than days."""
    if yes and dry_run:
        raise click.UsageError("--dry-run lists only; --yes removes: give one of them")
    app = _app(ctx)

    def act() -> operations.Prune:
        scheduled = set(_schedules(app, strict=True)) | _enabled_rows()
        return operations.prune(inspect.open_store(app), scheduled, days * 86400, yes,
                                ttl=ttl)

    ttl = _run(ctx, lambda: Settings.from_app(app).heartbeat_ttl)
    result = _run(ctx, act)
    if as_json:
        click.echo(json.dumps(result.as_dict(dry_run=not yes), indent=2))
        return
    click.echo(prune_text(result, yes, days, ttl))


def prune_text(result: operations.Prune, removed: bool, days: float, ttl: float = 0.0
               ) -> str:
    """What a prune did, or would do, for people."""
    lines = []
    if removed:
        lines.append(f"removed {len(result.removed)} entr(ies)"
                     + (": " + ", ".join(result.removed) if result.removed else ""))
    else:
        lines.append(f"would remove {len(result.removable)} entr(ies)"
                     + (" (run it again with --yes to remove them):" if result.removable
                        else ""))
        lines += [f"  {r.entry}: {r.why(result.now)}" for r in result.removable]
    if result.kept_registered:
        lines.append(f"kept {len(result.kept_registered)} a live beat registered: "
                     + ", ".join(f"{e} ({', '.join(b)})" for e, b in result.kept_registered))
    if result.kept_live:
        lines.append(f"kept {len(result.kept_live)} with a live run: "
                     + ", ".join(result.kept_live))
    if result.kept_recent:
        within = (f"{days:g} day(s)" if days * 86400 >= ttl else
                  f"the beats' heartbeat TTL ({ttl:g} s: every live beat heartbeats since)")
        lines.append(f"kept {len(result.kept_recent)} active within {within}: "
                     + ", ".join(result.kept_recent))
    lines.append(f"kept {result.kept_scheduled} in this app's schedule")
    return "\n".join(lines)


def _schedules(app: Any, strict: bool = False) -> dict[str, Any]:
    """Every entry this app schedules: beat_schedule, and django-celery-beat's rows when
    the Django app and its database scheduler are in use. With ``strict``, rows that
    cannot be read are an error (OperationError), not beat_schedule alone."""
    load_app(app)
    try:
        from .contrib.django.status import schedules
    except Exception:
        return inspect.beat_schedules(app)
    try:
        found = schedules(app)
    except Exception as exc:
        if strict:
            raise operations.OperationError(
                f"the schedule's rows cannot be read ({type(exc).__name__}: {exc}):"
                " nothing was removed") from exc
        found = None
    return found if found is not None else inspect.beat_schedules(app)


def _enabled_rows() -> set[str]:
    """The names of django-celery-beat's enabled rows, whichever scheduler the app names
    (a beat may be given -S on its command line): they hold their entries."""
    try:
        from .contrib.django.status import enabled_rows
    except Exception:
        return set()
    try:
        return enabled_rows()
    except Exception as exc:
        raise operations.OperationError(
            f"django-celery-beat's rows cannot be read ({type(exc).__name__}: {exc}):"
            " nothing was removed") from exc


# -- write actions ------------------------------------------------------------------------
@entry_action(click.option("--note", default="",
                           help="Why: recorded with the pause."))
def pause(ctx: click.Context, entry: str, note: str, by: str | None, as_json: bool) -> None:
    """Pause ENTRY on every beat: each of its occurrences is recorded skipped (paused)
    instead of being sent, until resume. Runs already sent are not touched; trigger and
    backfill still send."""
    who = _run(ctx, lambda: operations.who(by))
    done = _run(ctx, lambda: operations.pause(inspect.open_store(_app(ctx)), entry, who,
                                              note))
    doc = operations.entry_doc(done)
    _print(as_json, doc, f"paused {entry} (by {doc['paused_by']} since {doc['paused_at']}"
           + (f": {note}" if note else "") + "): its occurrences are skipped until resume")


@entry_action()
def resume(ctx: click.Context, entry: str, by: str | None, as_json: bool) -> None:
    """Resume ENTRY: occurrences due from now on are sent again (those skipped while it
    was paused stay skipped: backfill them to run them)."""
    who = _run(ctx, lambda: operations.who(by))
    done, ended = _run(ctx, lambda: operations.resume(inspect.open_store(_app(ctx)), entry,
                                                      who))
    doc = dict(operations.entry_doc(done), resumed=ended)
    _print(as_json, doc, f"resumed {entry} (by {doc['resumed_by']} at {doc['resumed_at']})"
           if ended else f"{entry} was not paused: nothing was recorded")


@entry_action()
def trigger(ctx: click.Context, entry: str, by: str | None, as_json: bool) -> None:
    """Run ENTRY now: a run due now is recorded, and a beat claims and sends it like any
    other occurrence. Scheduled occurrences neither move nor are skipped. Refused (exit
    code 1, nothing recorded) when no live beat schedules ENTRY."""
    app = _app(ctx)
    who = _run(ctx, lambda: operations.who(by))
    done = _run(ctx, lambda: operations.trigger(inspect.open_store(app), entry, who))
    doc = {"entry": entry, "due": iso(done.due), "due_ms": done.due, "by": who,
           "in_schedule": entry in _schedules(app),
           "beats": None if done.beats is None else list(done.beats)}
    heartbeat = _run(ctx, lambda: Settings.from_app(app).heartbeat_interval)
    _print(as_json, doc, f"triggered a run of {entry} due {iso(done.due)} (by {who}): a beat"
           f" claims and sends it within about {heartbeat:g} s"
           + (f" (live beats that schedule it: {', '.join(done.beats)})" if done.beats
              else ""))
    if done.beats is None and not as_json:
        click.echo(f"beat-claims: warning: which beats schedule {entry} is not recorded"
                   " (registered by a beat-claims older than 0.2): only a beat that has it"
                   " sends the run", err=True)


@entry_action(
    click.option("--from", "start", type=Instant(), required=True,
                 help="The first instant (included), ISO 8601; without an offset it is UTC."),
    click.option("--to", "end", type=Instant(), required=True,
                 help="The last instant (excluded), ISO 8601, not after the store's clock;"
                      " without an offset it is UTC."))
def backfill(ctx: click.Context, entry: str, start: int, end: int, by: str | None,
             as_json: bool) -> None:
    """Run once each occurrence of ENTRY's schedule in [--from, --to) that has not run:
    a manual run is recorded at each instant that has none or whose run ended without
    running (skipped, lost, cancelled), and the beats send them oldest first. Occurrences
    that ran, run or are on their way are kept. At most beat_claims_backfill_limit
    occurrences (default 1000) per request. The occurrences are those every beat
    computes: after the instant the store first saw the entry (its anchor)."""
    app = _app(ctx)
    who = _run(ctx, lambda: operations.who(by))

    def act() -> operations.Backfill:
        settings = Settings.from_app(app)
        return operations.backfill(inspect.open_store(app), entry, _schedules(app).get(entry),
                                   start, end, who, settings.backfill_limit)

    done = _run(ctx, act)
    doc = done.as_dict()
    kept = ", ".join(f"{k['due']} ({k['state']})" for k in doc["kept"][:10])
    more = f" and {len(doc['kept']) - 10} more" if len(doc["kept"]) > 10 else ""
    _print(as_json, doc, f"backfill of {entry} from {doc['from']} to {doc['to']} (by {who}):"
           f" {doc['occurrences']} occurrence(s); created {len(doc['created'])} run(s), the"
           " beats send them oldest first; kept " + str(len(doc["kept"]))
           + (f": {kept}{more}" if kept else "")
           + (f" (the store first saw {entry} at {doc['anchor']}: nothing was due before)"
              if done.start <= done.anchor else ""))


@entry_action(click.argument("due", type=Instant(allow_ms=True)))
def release(ctx: click.Context, entry: str, due: int, by: str | None, as_json: bool) -> None:
    """Release the claim on the run of ENTRY due at DUE (ISO 8601, naive: UTC; or UTC ms,
    as due_ms in history -j), whichever beat holds it: the run is due again and a beat
    sends it with a fresh token (the old holder's check before publish refuses it)."""
    who = _run(ctx, lambda: operations.who(by))
    done = _run(ctx, lambda: operations.release(inspect.open_store(_app(ctx)), entry, due,
                                                who))
    if not done.released:
        _fail(done.why_not)
    _print(as_json, {"entry": entry, "due": iso(due), "due_ms": due, "released": True,
                     "by": who},
           f"released the claim of {entry} due {iso(due)} (by {who}): the run is due again"
           " and a beat sends it")


# -- probes -------------------------------------------------------------------------------
def _which_beat(value: str | None) -> tuple[str | None, int | None]:
    """``--beat``'s value: "" (any beat of this host), ``PID`` (of this host) or
    ``HOST:PID``, as (host, pid); None for the whole fleet."""
    if not value:
        return None, None
    host, sep, pid = value.rpartition(":")
    if not pid.isdigit() or int(pid) <= 0 or (sep and not host):
        raise click.BadParameter(f"{value!r}: a beat is PID or HOST:PID (as in `claims"
                                 " status`), or nothing for any beat of this host",
                                 param_hint="--beat")
    return host or None, int(pid)


@claims.command(cls=CeleryCommand)
@click.option("--grace", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="SECONDS", help="How late an occurrence, or a run due again, may be"
              " before its entry is overdue (default: beat_claims_health_grace, else three"
              " heartbeat intervals + 30 s).")
@click.option("--beat", "beat", is_flag=False, flag_value="", default=None,
              metavar="[PID|HOST:PID]",
              help="Only check that a beat of this host is alive (a container's liveness"
                   " probe); with PID, the beat of this host with that pid; with HOST:PID,"
                   " that beat (as `claims status` names it).")
@click.option("--max-entries", type=click.IntRange(min=1), default=fleet_health.MAX_ENTRIES,
              show_default=True, help="Entries examined for overdue occurrences (the first"
              " by name).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=inspect.STORE_TIMEOUT,
              show_default=True, help="Seconds to wait for each answer of the store.")
@json_option
@click.pass_context
def health(ctx: click.Context, grace: float | None, beat: str | None, max_entries: int,
           timeout: float, as_json: bool) -> None:
    """Exit 0 when the fleet is healthy, else 1 saying which checks failed: the store
    answers, a beat is alive, no claim is held longer than its reclaim_after, no entry
    that is not paused is overdue (its next occurrence, or a run due again, later than
    the grace), no run is sent and not started for longer than
    beat_claims_unstarted_after. Reads only."""
    app = _app(ctx)
    host, pid = _which_beat(beat)

    def check() -> fleet_health.Report:
        settings = Settings.from_app(app)
        try:
            store = inspect.open_store(app, timeout)
        except StoreError as exc:
            return fleet_health.Report([fleet_health.Finding("store", False,
                                                             f"unreachable: {exc}")])
        if beat is not None:
            return fleet_health.beat(store, host, pid)
        schedules = _schedules(app)
        policies = operations.policies(app, settings, list(schedules))
        # Entries created at run time: every beat sends them (a dynamic definition
        # shadows a beat_schedule entry of its name).
        try:
            dynamic, dynamic_policies = inspect.dynamic_schedules(app, store, settings,
                                                                  max_entries)
        except StoreError:  # the store check below says so
            dynamic, dynamic_policies = {}, {}
        schedules.update(dynamic)
        policies.update(dynamic_policies)
        return fleet_health.fleet(
            store, schedules, policies,
            settings.policy, settings.overdue_after if grace is None else grace, max_entries,
            settings.unstarted_after)

    report = _run(ctx, check)
    _print(as_json, report.as_dict(), report.text())
    sys.exit(0 if report.ok else 1)


@claims.command(cls=CeleryCommand)
@click.option("--port", type=click.IntRange(1, 65535), required=True, help="Port to serve.")
@click.option("--addr", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--cache", "cache_seconds", type=click.FloatRange(min=0),
              default=fleet_exporter.CACHE_SECONDS, show_default=True,
              help="Scrapes within this many seconds of a read share it.")
@click.option("--max-entries", type=click.IntRange(min=1), default=fleet_exporter.MAX_ENTRIES,
              show_default=True, help="Entries exported per scrape (the first by name).")
@click.option("--history", type=click.IntRange(min=1), default=fleet_exporter.HISTORY,
              show_default=True, help="Runs read per entry (the newest).")
@click.pass_context
def exporter(ctx: click.Context, port: int, addr: str, cache_seconds: float,
             max_entries: int, history: int) -> None:
    """Serve Prometheus metrics of the whole fleet on /metrics, read from the store: per
    entry its last outcome, runs by state, lateness, pause and runs sent and not started;
    live beats; stale claims."""
    app = _app(ctx)

    def start() -> tuple[Any, Settings]:
        fleet_exporter.require_client()
        settings = Settings.from_app(app)
        return inspect.open_store(app), settings

    store, settings = _run(ctx, start)

    def read() -> fleet_exporter.Snapshot:
        return fleet_exporter.read(
            store, lambda names: operations.policies(app, settings, names), settings.policy,
            max_entries, history, settings.unstarted_after)

    collector = fleet_exporter.FleetCollector(read, cache_seconds)

    def ready(_server: Any) -> None:
        click.echo(f"beat-claims exporter: serving http://{addr}:{port}/metrics for"
                   f" {store.description}")

    try:
        fleet_exporter.serve(collector, port, addr, ready)
    except OSError as exc:
        _fail(f"--port {port}: cannot serve on {addr}:{port} ({exc.strerror or exc})")
    except KeyboardInterrupt:
        pass


@claims.group("import", cls=click.Group)
def import_entries() -> None:
    """Make entries another scheduler created at run time entries of the store."""


@import_entries.command("redbeat", cls=CeleryCommand)
@click.option("--url", default=None, metavar="URL",
              help="RedBeat's Redis (default: redbeat_redis_url, else the broker URL).")
@click.option("--key-prefix", default=None, metavar="PREFIX",
              help="RedBeat's key prefix (default: redbeat_key_prefix, else 'redbeat:').")
@click.option("--yes", is_flag=True, help="Create them (without it: only show what would be"
              " done).")
@json_option
@click.pass_context
def import_redbeat(ctx: click.Context, url: str | None, key_prefix: str | None, yes: bool,
                   as_json: bool) -> None:
    """Read the entries RedBeat created (its `redbeat:*` keys, read only) and show what
    becomes of each: created as an entry of origin redbeat whose next run is RedBeat's next
    run, left alone (the store defines it already, or RedBeat took it from beat_schedule),
    or refused (why). With --yes, create them; run it again to create what a failure left
    out. Stop RedBeat's beats first: what they send after the import is sent twice."""
    app = _app(ctx)
    conf = app.conf
    source = url or conf.get("redbeat_redis_url") or conf.broker_url or ""
    prefix = key_prefix or conf.get("redbeat_key_prefix") or redbeat_import.DEFAULT_PREFIX

    def run() -> list[redbeat_import.PlannedImport]:
        client = redbeat_import.connect(source)
        store = inspect.open_store(app)
        entries = list(redbeat_import.read(client, prefix, str(app.timezone)))
        rows = redbeat_import.plan(store, entries)
        return redbeat_import.apply(store, rows, app=app) if yes else rows

    try:
        rows = _run(ctx, run)
    except redbeat_import.RedBeatReadError as exc:
        _fail(str(exc))
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.action.value] = counts.get(row.action.value, 0) + 1
    doc = {"dry_run": not yes, "source": redact_url(source), "prefix": prefix,
           "counts": counts, "entries": [r.as_json() for r in rows]}
    lines = [f"{'entry':32} {'action':8} {'next run (RedBeat)':26} detail"]
    for r in rows:
        j = r.as_json()
        lines.append(f"{r.entry.name[:32]:32} {j['action']:8} {j['next_run'] or '-':26}"
                     f" {j['detail']}")
    done = "created" if yes else "would create (run again with --yes)"
    lines.append(f"{counts.get('create', 0)} {done}; " + ", ".join(
        f"{n} {a}" for a, n in sorted(counts.items()) if a != "create"))
    _print(as_json, doc, "\n".join(lines))


from . import cli_entries  # noqa: E402,F401 (registers `claims entries`)
