"""``celery -A APP claims ...``: see what every beat claimed, sent and recorded."""

from __future__ import annotations

import json
from typing import Any

import click
from celery.bin.base import CeleryCommand, handle_preload_options

from . import inspect


def _app(ctx: click.Context) -> Any:
    return ctx.obj.app


@click.group()
@click.pass_context
@handle_preload_options
def claims(ctx: click.Context) -> None:
    """Inspect beat-claims: entries, claims, outcomes and history."""


@claims.command(cls=CeleryCommand)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Every entry: next run, last outcome, current claims, counts by state."""
    doc = inspect.status(_app(ctx))
    click.echo(json.dumps(doc, indent=2) if as_json else status_table(doc))


def status_table(doc: dict[str, Any]) -> str:
    """The status document as a table for people."""
    alive = sum(1 for o in doc["owners"] if o["alive"])
    lines = [f"beats alive: {alive} of {len(doc['owners'])} registered",
             f"{'ENTRY':30} {'NEXT DUE':26} {'LAST':10} {'LAST DUE':26} CLAIMS  COUNTS"]
    for e in doc["entries"]:
        last = e["last_run"] or {}
        counts = " ".join(f"{k}={v}" for k, v in e["counts"].items() if v)
        lines.append(f"{e['name'][:30]:30} {e['next_due'] or '-':26}"
                     f" {last.get('state', '-'):10} {last.get('due') or '-':26}"
                     f" {len(e['claims']):6}  {counts}")
    return "\n".join(lines)


@claims.command(cls=CeleryCommand)
@click.argument("entry")
@click.option("--limit", type=int, default=20, show_default=True, help="Newest N runs.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_context
def history(ctx: click.Context, entry: str, limit: int, as_json: bool) -> None:
    """The runs of ENTRY, newest first."""
    doc = inspect.history(_app(ctx), entry, limit)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(history_table(doc))


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
