"""``celery -A APP claims ...``: see what every beat claimed, sent and recorded.

A user's mistake (no ``-A``, a setting, a store that does not answer, an entry the store
does not know) is one line on stderr and exit code 1; a traceback only for a bug.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click
from celery.bin.base import CeleryCommand, handle_preload_options

from . import inspect
from .settings import ConfigurationError
from .stores.base import StoreConfigurationError, StoreError

#: Runs ``history`` shows unless told otherwise.
DEFAULT_LIMIT = 20
#: ``prune`` leaves an entry alone if it ran within this many days.
DEFAULT_PRUNE_DAYS = 7.0

json_option = click.option("-j", "--json", "as_json", is_flag=True,
                           help="Print one JSON document.")


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
    except inspect.UnknownEntry as exc:
        _fail(str(exc))


@click.group()
@click.pass_context
@handle_preload_options
def claims(ctx: click.Context) -> None:
    """Inspect beat-claims: entries, claims, outcomes and history."""


@claims.command(cls=CeleryCommand)
@json_option
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Every entry: next run, last outcome, current claims, counts by state; and the
    beats. Times are ISO 8601 UTC."""
    doc = _run(ctx, lambda: inspect.status(_app(ctx)))
    click.echo(json.dumps(doc, indent=2) if as_json else status_table(doc))


def status_table(doc: dict[str, Any]) -> str:
    """The status document as a table for people."""
    owners = doc["owners"]
    alive = [o for o in owners if o["alive"]]
    lines = [f"beats alive: {len(alive)} of {len(owners)} registered"
             + (": " + ", ".join(f"{o['beat']} ({o['id'][:8]})" for o in alive)
                if alive else ""),
             f"{'ENTRY':30} {'NEXT DUE':26} {'LAST':10} {'LAST DUE':26} CLAIMS  COUNTS"]
    for e in doc["entries"]:
        last = e["last_run"] or {}
        counts = " ".join(f"{k}={v}" for k, v in e["counts"].items() if v)
        name = e["name"] if e["in_schedule"] else f"{e['name']} (removed)"
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
              help="Only entries that have not run for this many days.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@json_option
@click.pass_context
def prune(ctx: click.Context, days: float, dry_run: bool, as_json: bool) -> None:
    """Remove from the store the entries this app no longer schedules (with their runs
    and task ids). An entry with a run claimed, being sent, sent or started is kept."""
    app = _app(ctx)
    result = _run(ctx, lambda: inspect.prune(app, days * 86400, dry_run,
                                             schedules=_schedules(app)))
    doc = {"dry_run": dry_run, "removed": result.removed, "kept_live": result.kept_live,
           "kept_recent": result.kept_recent}
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb} {len(result.removed)} entr(ies)"
               + (": " + ", ".join(result.removed) if result.removed else ""))
    if result.kept_live:
        click.echo(f"kept {len(result.kept_live)} with a live run: "
                   + ", ".join(result.kept_live))
    if result.kept_recent:
        click.echo(f"kept {len(result.kept_recent)} that ran within {days:g} day(s): "
                   + ", ".join(result.kept_recent))


def _schedules(app: Any) -> dict[str, Any]:
    """Every entry this app schedules: beat_schedule, and django-celery-beat's rows when
    the Django app and its database scheduler are in use."""
    try:
        from .contrib.django.status import schedules
    except Exception:
        return inspect.beat_schedules(app)
    try:
        found = schedules(app)
    except Exception:
        found = None
    return found if found is not None else inspect.beat_schedules(app)
