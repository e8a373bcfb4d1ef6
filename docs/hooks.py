"""MkDocs hooks: the settings reference, generated from ``beat_claims/settings.py``, and
the home page, which is the README (one text, read on GitHub and on the site).

The names, their order and their defaults come from the code at build time
(``settings.SETTINGS`` and ``Settings.from_app`` on an app that sets none), the bounds from
its constants; only what each setting does is written here. A setting of the code without
a meaning here, or a meaning of a name the code does not have, fails the build: the
reference cannot drift from the code.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

#: Where the generated tables go, in docs/reference/settings.md.
MARKER = "<!-- beat-claims:settings-reference -->"
#: Where the README goes, in docs/index.md.
README_MARKER = "<!-- beat-claims:readme -->"
ROOT = Path(__file__).resolve().parent.parent

#: Defaults the code computes from other settings (or leaves to a reader): said in words.
COMPUTED_DEFAULTS = {
    "url": "the broker URL if it is `redis://`, `rediss://`, `unix://` or `sentinel://`",
    "sentinel_master": '`broker_transport_options["master_name"]`',
    "health_grace": "three heartbeat intervals + 30 s",
    "entry_claims": "none",
    "claim_ahead": "`auto`",
}

#: What each setting does: (unit of its value, meaning). Markdown, links relative to
#: docs/reference/; ``{max_jitter}`` and the like are the code's bounds.
MEANINGS: dict[str, tuple[str, str]] = {
    'url': ('',
        'the store: Redis, Sentinel, Redis Cluster, PostgreSQL, MySQL or SQLite, every URL '
        'form in [Stores](../stores.md). ACL users and TLS via the URL '
        "(`rediss://user:pass@host:6380/0`); Sentinel as Celery's broker takes it "
        '(`sentinel://h1:26379;sentinel://h2:26379/0`). Required (error at start) when the '
        'broker is not Redis'),
    'sentinel_master': ('',
        "the Sentinel master's name, required with a `sentinel://` URL"),
    'key_prefix': ('',
        "names what the store keeps: the keys' prefix (Redis), the tables' prefix (SQLite, "
        'MySQL), the schema (PostgreSQL). No braces, spaces or newlines. One per environment '
        '([Deploying](../deploying.md))'),
    'heartbeat_interval': ('s',
        'heartbeat renewal; a beat is dead after 3 missed intervals. The beat loop wakes at '
        'least this often'),
    'reclaim_after': ('s',
        'a claim older than this is taken over even from a live owner (> 0)'),
    'catch_up': ('',
        '`latest`, `all` or `none` ([Configuration](../configuration.md#catch-up-policies))'),
    'max_catch_up': ('',
        'with `all`, at most this many missed occurrences run; older ones are `skipped`'),
    'catch_up_window': ('s',
        'missed occurrences older than this many seconds are `skipped` whatever the policy'),
    'catch_up_grace': ('s',
        'an occurrence due less than this long ago is on time (never "missed")'),
    'overlap': ('',
        "`skip`: an occurrence due while the entry's previous run is claimed, sent or started"
        ' is recorded `skipped` (decided atomically in the store, across all beats); '
        '`buffer_one`: the newest such occurrence waits and is sent when the previous run '
        'ends ([Operating a fleet](../operating.md#operating-a-fleet))'),
    'jitter': ('s',
        'each occurrence is sent at due + a fixed offset in `[0, jitter)` (0 to {max_jitter} '
        's; [Operating a fleet](../operating.md#operating-a-fleet))'),
    'run_timeout': ('s',
        'a run `sent`/`started` this long (by default a day) without an outcome becomes '
        '`lost` (`None`: never)'),
    'history_limit': ('',
        'runs kept per entry. Final ones are trimmed first; a run sent and never started that'
        ' is pushed out is recorded `lost` (reason `history_limit`); runs presumed lost stay '
        'a week more for a late delivery (at most `history_limit` of them); runs claimed, '
        'being sent or started are never dropped. A backfill refuses instants the trimmed '
        'history no longer knows ([Operating a fleet](../operating.md#operating-a-fleet))'),
    'publish_retries': ('',
        'a publish that fails for the message itself is tried again this many times (at the '
        'next sweeps), then the run is `failed` (`publish_error`)'),
    'result_backend_recovery': ('',
        'resolve unreported outcomes from the result backend (`True` or `False`)'),
    'claim_ahead': ('',
        'in a burst, claim the next 100 entries in a thread while the current 100 are sent '
        '([How it works](../concepts.md), "Sending"): `auto`: when this host has at least two'
        ' cores more than live beats; `True` always; `False` never'),
    'recovery_batch': ('',
        'result-backend lookups per pass (a pass every 10 heartbeat intervals, at most half '
        'an interval long)'),
    'metrics_port': ('',
        "serve Prometheus metrics on this port (`pip install 'beat-claims[metrics]'`): "
        '`beat_claims_runs_total{event=claimed\\|sent\\|skipped\\|waiting\\|released\\|taken_over\\|not_sent\\|publish_failed\\|sent_late}`,'
        ' `beat_claims_held_claims`, `beat_claims_store_up`, '
        '`beat_claims_last_heartbeat_seconds`. A port already taken is logged, and the beat '
        'keeps scheduling'),
    'backfill_limit': ('',
        'runs one `backfill` request may create (≥ 1)'),
    'health_grace': ('s',
        'how late an occurrence, or a run due again, may be before `claims health` calls its '
        'entry overdue'),
    'exception_messages': ('',
        "`True`: run records (and beat-claims' log lines) keep an exception's message as well"
        " as its type, with every value of the task's arguments found in it masked (`True` or"
        ' `False`; beats and workers: [Exception messages and task '
        'arguments](../operating.md#exception-messages-and-task-arguments))'),
    'unstarted_after': ('s',
        'a run `sent` and not started by any worker this long is reported: a warning of each '
        'beat, `claims status`, `claims health`, the exporter ([Operating a '
        'fleet](../operating.md#operating-a-fleet), "Runs sent and not started"; `None`: '
        'never)'),
    'entry_claims': ('',
        'with `DatabaseScheduler`: entry name → `claims` dict, for database rows (and '
        '`beat_schedule` entries without their own `claims`)'),
    'worker_timeout': ('s',
        'how long a worker waits for each reply of the store (> 0; a new connection adds at '
        'most 2 s)'),
    'worker_store_wait': ('s',
        'how long a delivery waits for a store that does not answer (a restart, a failover) '
        "before it runs unfenced, counted from the outage's start (0 to {max_store_wait} s; "
        '0: at once)'),
    'worker_unprotected': ('',
        '`True`: a worker whose beat-claims configuration is wrong starts anyway; it runs '
        'periodic tasks unfenced and records no outcome, and says so in one line'),
    'worker_heartbeat_interval': ('s',
        'how often each worker process renews its liveness record in the store '
        '({worker_hb_low} to {worker_hb_high} s); the record lapses after three intervals '
        '(its TTL). A redelivery of a run another process started may wait up to a TTL plus '
        'an interval for it '
        '([Workers](../workers.md#a-redelivery-of-a-run-another-process-started))'),
}


def _bounds() -> dict[str, str]:
    from beat_claims import settings

    low, high = settings.WORKER_HEARTBEAT_RANGE
    return {"max_jitter": _number(settings.MAX_JITTER),
            "max_store_wait": _number(settings.MAX_WORKER_STORE_WAIT),
            "worker_hb_low": _number(low), "worker_hb_high": _number(high)}


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else str(value)


def _defaults() -> dict[str, Any]:
    """Every setting's value when an app sets none (a Redis broker, so that the URL's
    default applies), as the beat reads them."""
    from celery import Celery

    from beat_claims.settings import Settings

    app = Celery("settings-reference", broker="redis://127.0.0.1:6379/0", set_as_current=False)
    read = Settings.from_app(app)
    values = {name: getattr(read, name) for name in read.__dataclass_fields__}
    values.update({name: getattr(read.policy, name)
                   for name in read.policy.__dataclass_fields__})
    return values


def _default(name: str, unit: str, values: dict[str, Any]) -> str:
    if name in COMPUTED_DEFAULTS:
        return COMPUTED_DEFAULTS[name]
    if name not in values:
        raise PluginError(f"settings reference: no default for beat_claims_{name}: the code"
                          " reads it elsewhere; say it in COMPUTED_DEFAULTS (docs/hooks.py)")
    value = values[name]
    if value is None:
        return "none"
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, bool):
        return f"`{value}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`" + (f" {unit}" if unit else "")


def settings_reference() -> str:
    """The tables of every ``beat_claims_*`` setting: the beats' (and everyone's), then the
    workers' own."""
    from beat_claims import settings

    names = list(settings.SETTINGS)
    missing = [n for n in names if n not in MEANINGS]
    extra = [n for n in MEANINGS if n not in names]
    if missing or extra:
        raise PluginError(
            "settings reference out of step with beat_claims/settings.py: "
            + "; ".join(filter(None, [
                missing and "no meaning in docs/hooks.py for " + ", ".join(missing),
                extra and "not a setting any more: " + ", ".join(extra)])))
    values, bounds = _defaults(), _bounds()
    per_entry = set(settings.ENTRY_KEYS)

    def table(selected: list[str]) -> str:
        lines = ["| setting | Django | default | meaning |", "|---|---|---|---|"]
        for name in selected:
            unit, meaning = MEANINGS[name]
            text = re.sub(r"\{(\w+)\}", lambda m: bounds.get(m.group(1), m.group(0)), meaning)
            if name in per_entry:
                text += f" (per entry: `claims: {{\"{name}\": ...}}`)"
            lines.append(f"| `beat_claims_{name}` | `CELERY_BEAT_CLAIMS_{name.upper()}` |"
                         f" {_default(name, unit, values)} | {text} |")
        return "\n".join(lines)

    workers = [n for n in names if n.startswith("worker_")]
    others = [n for n in names if n not in workers]
    return (table(others) + "\n\n## Workers' own settings\n\n"
            "Read by workers only ([Workers](../workers.md)).\n\n" + table(workers) + "\n")


def readme_for_the_site() -> str:
    """README.md with its links made the site's: ``docs/X.md`` is ``X.md``; a link to
    another file of the repository (outside the site) is its text alone."""

    def link(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if re.match(r"[a-z]+://", target) or target.startswith("#"):
            return match.group(0)
        if target.startswith("docs/") and target != "docs/":
            return f"[{text}]({target[len('docs/'):]})"
        return text

    return re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", link, (ROOT / "README.md").read_text())


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Put the generated tables where the settings page has the marker, and the README
    where the home page has its own."""
    for src, marker, make in (("reference/settings.md", MARKER, settings_reference),
                              ("index.md", README_MARKER, readme_for_the_site)):
        if page.file.src_uri == src:
            if marker not in markdown:
                raise PluginError(f"docs/{src} lacks {marker}")
            return markdown.replace(marker, make())
    return markdown
