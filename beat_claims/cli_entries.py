"""``celery -A proj claims entries ...``: the entries of the store at run time (add, edit,
enable, disable, remove, show, list, export, import), through :class:`beat_claims.entries.
Entries`.

A definition's arguments (args, kwargs, options) are the user's configuration: ``show``
and ``export`` print them, on stdout, as asked; no other command prints them, and nothing
logs them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

import click
from celery.bin.base import CeleryCommand

from . import schedule_words
from .cli import _app, _fail, _print, _run, by_option, claims, json_option
from .definitions import MAX_DEFINITION_BYTES, Definition
from .entries import (
    DEFAULT_PAGE,
    BulkResult,
    Entries,
    ImportPlan,
    StoredEntry,
    apply_import,
    plan_import,
)
from .enums import Origin
from .runs import iso

#: The origins ``export`` leaves out: their truth is elsewhere (beat_schedule, Django's
#: database).
NOT_EXPORTED = (Origin.CONFIG, Origin.DJANGO)
#: The largest JSON document ``--json`` reads (a definition is at most 64 KiB of JSON).
MAX_JSON_IN = 4 * MAX_DEFINITION_BYTES

out_option = click.option("-j", "as_json", is_flag=True, help="Print one JSON document.")
json_in_option = click.option(
    "--json", "json_in", type=click.File("r"), metavar="FILE|-",
    help="The definition's fields as one JSON object (from FILE, or - for stdin); the"
         " options given beside it win.")
version_option = click.option(
    "--version", "version", type=click.IntRange(min=1), metavar="N",
    help="The version you read (show, list): refused when the entry changed since.")


def _field_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options that give a definition's fields."""
    options = [
        click.option("--task", help="The task's name."),
        click.option("--every", type=float, metavar="SECONDS",
                     help="Schedule: every SECONDS, counted from the entry's anchor."),
        click.option("--crontab", metavar="'M H DOM MON DOW'",
                     help="Schedule: a crontab of five fields (minute hour day_of_month"
                          " month_of_year day_of_week), at the app's timezone unless"
                          " --timezone."),
        click.option("--timezone", metavar="ZONE", help="The crontab's timezone."),
        click.option("--clocked", metavar="INSTANT",
                     help="Schedule: once, at INSTANT (ISO 8601 with its offset)."),
        click.option("--schedule", "schedule_json", metavar="JSON",
                     help="Schedule in its JSON form ({\"every\": 30}, {\"crontab\": {...}},"
                          " {\"solar\": {...}}, {\"clocked\": \"...\"})."),
        click.option("--args", "args_json", metavar="JSON", help="The task's args (array)."),
        click.option("--kwargs", "kwargs_json", metavar="JSON",
                     help="The task's kwargs (object)."),
        click.option("--options", "options_json", metavar="JSON",
                     help="apply_async options (queue, priority, expires, ...)."),
        click.option("--claims", "claims_json", metavar="JSON",
                     help="beat-claims' policy for the entry (catch_up, overlap, ...)."),
        click.option("--description", help="What the entry is for."),
        click.option("--enabled/--disabled", default=None, help="Sent, or not."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _fields(json_in: IO[str] | None, **given: Any) -> dict[str, Any]:
    """The definition's fields from ``--json`` and the options (which win)."""
    fields: dict[str, Any] = {}
    if json_in is not None:
        text = json_in.read(MAX_JSON_IN + 1)
        if len(text) > MAX_JSON_IN:
            _fail(f"--json: more than {MAX_JSON_IN} characters")
        try:
            doc = json.loads(text)
        except ValueError as exc:
            _fail(f"--json: not JSON ({exc})")
        if not isinstance(doc, dict):
            _fail(f"--json: a {type(doc).__name__} is not an object of fields")
        fields.update(doc)
    schedule = _schedule(given)
    if schedule is not None:
        fields["schedule"] = schedule
    for option, key in (("args_json", "args"), ("kwargs_json", "kwargs"),
                        ("options_json", "options"), ("claims_json", "claims")):
        if given[option] is not None:
            try:
                fields[key] = json.loads(given[option])
            except ValueError as exc:
                _fail(f"--{key}: not JSON ({exc})")
    for key in ("task", "description"):
        if given[key] is not None:
            fields[key] = given[key]
    if given["enabled"] is not None:
        fields["enabled"] = given["enabled"]
    return fields


def _schedule(given: dict[str, Any]) -> Any:
    """The schedule the options give (None: none); two of them is a usage error."""
    kinds = [k for k in ("every", "crontab", "clocked", "schedule_json") if given[k] is not None]
    if len(kinds) > 1:
        raise click.UsageError("give one schedule: " + ", ".join(
            "--" + k.removesuffix("_json") for k in kinds))
    if given["timezone"] is not None and kinds != ["crontab"]:
        raise click.UsageError("--timezone goes with --crontab")
    if not kinds:
        return None
    kind = kinds[0]
    if kind == "every":
        return {"every": given["every"]}
    if kind == "clocked":
        return {"clocked": given["clocked"]}
    if kind == "crontab":
        parts = given["crontab"].split()
        if len(parts) != 5:
            raise click.BadParameter(f"{given['crontab']!r}: five fields (minute hour"
                                     " day_of_month month_of_year day_of_week)",
                                     param_hint="--crontab")
        cron = dict(zip(("minute", "hour", "day_of_month", "month_of_year", "day_of_week"),
                        parts))
        if given["timezone"] is not None:
            cron["timezone"] = given["timezone"]
        return {"crontab": cron}
    try:
        return json.loads(given["schedule_json"])
    except ValueError as exc:
        raise click.BadParameter(f"not JSON ({exc})", param_hint="--schedule") from None


def _entries(ctx: click.Context, by: str | None = None) -> Entries:
    app = _app(ctx)
    made: Entries = _run(ctx, lambda: Entries(app, by=by))
    ctx.call_on_close(made.close)
    return made


# -- what is printed ----------------------------------------------------------------------
def summary_doc(entry: StoredEntry) -> dict[str, Any]:
    """An entry without its arguments: what every command but show and export prints."""
    d = entry.definition
    return {"name": entry.name, "version": entry.version,
            "task": d.task if d else None, "schedule": d.schedule.to_json() if d else None,
            "enabled": entry.enabled, "description": d.description if d else None,
            "origin": entry.origin.value, "changed_by": entry.changed_by,
            "changed_at": iso(entry.changed_at) if entry.changed_at else None,
            **({"problem": entry.problem} if entry.problem else {})}


def summary_text(entry: StoredEntry) -> str:
    d = entry.definition
    if d is None:
        return f"{entry.name} (version {entry.version}): {entry.problem}"
    return (f"{entry.name} (version {entry.version}): {d.task}, "
            f"{schedule_words.describe(d.schedule)}"
            + ("" if d.enabled else ", disabled"))


def _done(as_json: bool, entry: StoredEntry, text: str) -> None:
    _print(as_json, summary_doc(entry), text)


def export_doc(name: str, definition: Definition) -> dict[str, Any]:
    """What export writes of an entry (and import reads): its name and its definition."""
    return {"name": name, **definition.as_dict()}


# -- commands -----------------------------------------------------------------------------
@claims.group()
def entries() -> None:
    """The entries of the store at run time: every beat follows their definitions. A
    change takes effect from the entry's first occurrence after it; the occurrences of
    the old definition due since the last claim are recorded skipped (changed, or
    disabled). Entries defined in beat_schedule are changed there."""


def _command(name: str | None = None, help_text: str | None = None
             ) -> Callable[[Callable[..., None]], Any]:
    """A command of ``claims entries`` (``name``: when the function's name cannot be it;
    ``help_text``: when its docstring cannot)."""
    def wrap(f: Callable[..., None]) -> Any:
        return entries.command(name, cls=CeleryCommand, help=help_text)(
            click.pass_context(f))
    return wrap


@_command()
@click.argument("name")
@_field_options
@json_in_option
@by_option
@out_option
def add(ctx: click.Context, name: str, json_in: IO[str] | None, by: str | None,
        as_json: bool, **given: Any) -> None:
    """Create the entry NAME (--task and a schedule, or --json FILE)."""
    fields = _fields(json_in, **given)
    fields.pop("name", None)
    store = _entries(ctx, by)
    done = _run(ctx, lambda: store.bulk_create([{"name": name, **fields}])[0])
    entry = _raised(done)
    _done(as_json, entry, f"created {summary_text(entry)}: the beats send it from its first"
                          " occurrence from now on")


@_command()
@click.argument("name")
@version_option
@_field_options
@json_in_option
@by_option
@out_option
def edit(ctx: click.Context, name: str, version: int | None, json_in: IO[str] | None,
         by: str | None, as_json: bool, **given: Any) -> None:
    """Change fields of the entry NAME at --version (the one you read): refused, and
    nothing written, when it changed since."""
    if version is None:
        raise click.UsageError("--version N: the version you read (claims entries show"
                               f" {name}); a change made since is refused, not written over")
    fields = _fields(json_in, **given)
    fields.pop("name", None)
    if not fields:
        raise click.UsageError("nothing to change: give fields (--task, --every, ...,"
                               " or --json FILE)")
    store = _entries(ctx, by)
    done = _run(ctx, lambda: store.bulk_update([{"name": name, **fields,
                                                 "version": version}])[0])
    entry = _raised(done)
    _done(as_json, entry, f"changed {summary_text(entry)}: it governs from its first"
                          " occurrence from now on")


def _switch(verb: str, enabled: bool, help_text: str) -> None:
    """``enable`` or ``disable``: one command each, the same but for the flag."""
    @_command(verb, help_text)
    @click.argument("name")
    @version_option
    @by_option
    @out_option
    def switch(ctx: click.Context, name: str, version: int | None, by: str | None,
               as_json: bool) -> None:
        store = _entries(ctx, by)
        entry = _run(ctx, lambda: (store.enable if enabled else store.disable)(name, version))
        _done(as_json, entry, f"{verb}d {summary_text(entry)}")


_switch("enable", True, "Enable the entry NAME: sent again from its first occurrence from"
        " now on (those due while it was disabled are recorded skipped, disabled).")
_switch("disable", False, "Disable the entry NAME: no beat sends it from now on (runs"
        " already claimed go on).")


@_command()
@click.argument("name")
@version_option
@click.option("--yes", is_flag=True, help="Remove it. Without it, remove only shows what"
                                          " it would remove.")
@by_option
@out_option
def remove(ctx: click.Context, name: str, version: int | None, yes: bool, by: str | None,
           as_json: bool) -> None:
    """Remove the entry NAME's definition (with --yes): no beat sends it after; runs
    already claimed or sent finish."""
    store = _entries(ctx, by)
    entry = _run(ctx, lambda: store.get(name))
    doc = summary_doc(entry)
    if not yes:
        _print(as_json, dict(doc, removed=False),
                   f"would remove {summary_text(entry)} (run it again with --yes to remove"
                   " it)")
        return
    gone = _run(ctx, lambda: store.delete(name, version or entry.version))
    _print(as_json, dict(doc, removed=True, version=gone),
               f"removed {name} (was version {entry.version}; its tombstone is version"
               f" {gone}): no beat sends it after; runs under way finish")


@_command()
@click.argument("name")
@json_option
def show(ctx: click.Context, name: str, as_json: bool) -> None:
    """The entry NAME's definition, its arguments included, its version (for edit), who
    changed it last and when."""
    store = _entries(ctx)
    entry = _run(ctx, lambda: store.get(name))
    if as_json:
        click.echo(json.dumps(entry.as_dict(), indent=2))
        return
    lines = [summary_text(entry)]
    for key, value in entry.as_dict().items():
        if key != "name":
            lines.append(f"  {key}: {json.dumps(value)}")
    click.echo("\n".join(lines))


@_command("list")
@click.option("--after", default="", metavar="NAME", help="Start after this name.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=DEFAULT_PAGE,
              show_default=True, help="At most this many.")
@json_option
def list_(ctx: click.Context, after: str, limit: int, as_json: bool) -> None:
    """The entries with a definition in the store, in name order (without their
    arguments: show prints them)."""
    store = _entries(ctx)
    found = _run(ctx, lambda: store.list(after, limit))
    if as_json:
        click.echo(json.dumps({"entries": [summary_doc(e) for e in found],
                               "next_after": found[-1].name if len(found) == limit else None},
                              indent=2))
        return
    lines = [f"{'ENTRY':30} {'VERSION':>7} {'ORIGIN':7} {'ENABLED':7} {'TASK':30} SCHEDULE"]
    for e in found:
        d = e.definition
        lines.append(f"{e.name[:30]:30} {e.version:>7} {e.origin.value:7}"
                     f" {'yes' if e.enabled else 'no':7} {(d.task if d else '?')[:30]:30}"
                     f" {schedule_words.describe(d.schedule) if d else e.problem}")
    if len(found) == limit:
        lines.append(f"(more: --after {found[-1].name})")
    click.echo("\n".join(lines))



@_command()
@click.option("--output", "-o", type=click.File("w"), default="-", metavar="FILE|-",
              help="Where to write (default: stdout).")
@click.option("--array", is_flag=True, help="One JSON array (default: JSON lines, one"
                                            " entry a line).")
def export(ctx: click.Context, output: IO[str], array: bool) -> None:
    """Write every dynamic entry's definition (not those of beat_schedule nor of
    django-celery-beat's rows), its arguments included, as import reads them: to keep
    them, or to put them back in a store that came back empty."""
    store = _entries(ctx)
    bad: list[str] = []

    def write() -> int:
        count = 0
        for entry in store.iterate():
            if entry.origin in NOT_EXPORTED:
                continue
            if entry.definition is None:
                bad.append(f"{entry.name}: {entry.problem}")
                continue
            text = json.dumps(export_doc(entry.name, entry.definition), ensure_ascii=False)
            if array:
                output.write(("[\n" if count == 0 else ",\n") + text)
            else:
                output.write(text + "\n")
            count += 1
        if array:
            output.write("[]\n" if count == 0 else "\n]\n")
        return count

    count = _run(ctx, write)
    output.flush()
    click.echo(f"exported {count} entr(ies)", err=True)
    if bad:
        _fail(f"{len(bad)} entr(ies) not exported, their definition cannot be read: "
              + "; ".join(bad[:10]))


@_command("import")
@click.argument("source", type=click.File("r"), metavar="FILE|-")
@click.option("--yes", is_flag=True, help="Write. Without it, import only shows what it"
                                          " would do.")
@by_option
@json_option
def import_(ctx: click.Context, source: IO[str], yes: bool, by: str | None,
            as_json: bool) -> None:
    """Create or change the entries FILE holds (as export writes them: JSON lines, or one
    JSON array), so that the store holds these definitions: entries it lacks are created,
    those that differ changed (at the version read now: one changed meanwhile is refused),
    entries it has and FILE has not are left alone. Shows what it would do, and writes
    with --yes."""
    items = _read_items(source)
    store = _entries(ctx, by)
    plan = _run(ctx, lambda: plan_import(store, items))
    results = _run(ctx, lambda: apply_import(store, plan)) if yes else []
    failed = [r for r in results if r.error is not None]
    if as_json:
        click.echo(json.dumps(_import_doc(plan, results, yes), indent=2))
    else:
        click.echo(_import_text(plan, results, yes))
    if failed or plan.refused:
        sys.exit(1)



def _read_items(source: IO[str]) -> list[Any]:
    """The items of FILE: one JSON array, or JSON lines (blank lines skipped)."""
    name = getattr(source, "name", "FILE")
    first = source.read(1)
    while first.isspace():
        first = source.read(1)
    if first == "[":
        try:
            found = json.loads(first + source.read())
        except ValueError as exc:
            _fail(f"{name}: not a JSON array ({exc})")
        return list(found)
    out = []
    for number, line in enumerate(_lines(first, source), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError as exc:
            _fail(f"{name}: line {number} is not JSON ({exc})")
    return out


def _lines(first: str, source: IO[str]) -> Iterator[str]:
    rest = source.readline()
    yield first + rest
    yield from source


def _import_doc(plan: ImportPlan, results: list[BulkResult], written: bool
                ) -> dict[str, Any]:
    return {"written": written,
            "create": [n for n, _ in plan.create],
            "update": [{"name": n, "version": v} for n, v, _ in plan.update],
            "unchanged": list(plan.unchanged),
            "refused": [{"name": n, "why": why} for n, why in plan.refused],
            "results": [{"name": r.name, "version": r.entry.version if r.entry else None,
                         "error": str(r.error) if r.error else None} for r in results]}


def _import_text(plan: ImportPlan, results: list[BulkResult], written: bool) -> str:
    def names(items: list[str]) -> str:
        return (": " + ", ".join(items[:20]) + (f" and {len(items) - 20} more"
                                                if len(items) > 20 else "")) if items else ""

    verb = ("", "") if written else ("would ", " (run it again with --yes to write)")
    lines = [f"{verb[0]}create {len(plan.create)}{names([n for n, _ in plan.create])}",
             f"{verb[0]}change {len(plan.update)}{names([n for n, _, _ in plan.update])}",
             f"unchanged {len(plan.unchanged)}{names(list(plan.unchanged))}"]
    lines += [f"refused {n}: {why}" for n, why in plan.refused]
    lines += [f"failed {r.error}" for r in results if r.error is not None]
    if verb[1] and (plan.create or plan.update):
        lines[-1] += verb[1]
    return "\n".join(lines)


def _raised(result: BulkResult) -> StoredEntry:
    """The entry written, or the reason it was not, as one line and exit code 1."""
    if result.error is not None:
        _fail(str(result.error))
    assert result.entry is not None
    return result.entry


__all__ = ["entries", "export_doc", "summary_doc"]

