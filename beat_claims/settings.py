"""``beat_claims_*`` settings and per-entry ``claims`` overrides, read and validated once.

A bad value fails the beat at start with a message that names the setting (or the entry and
key) and the value, rather than surfacing later as a confusing runtime error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, TypeVar

from celery import Celery
from celery.schedules import crontab

from .enums import CatchUp, Overlap
from .urls import redact_url

ENTRY_KEYS = ("catch_up", "max_catch_up", "catch_up_window", "overlap", "reclaim_after",
              "run_timeout", "jitter")
#: The largest jitter accepted (a day): a spread, not a second schedule.
MAX_JITTER = 24 * 3600.0
#: The longest window, interval or timeout accepted (ten years): beyond it instants in
#: milliseconds lose their precision in the store's number types.
MAX_SECONDS = 10 * 366 * 24 * 3600.0
#: A run with no outcome this long after it was sent or started is presumed lost, unless
#: the entry's ``run_timeout`` says otherwise (None: never).
DEFAULT_RUN_TIMEOUT = 24 * 3600.0
#: A run ``sent`` and not started by any worker this long is reported (a warning of the
#: beats, ``claims status``, ``claims health``), unless ``beat_claims_unstarted_after``
#: says otherwise (None: never). Well under the default run_timeout, above a queue's usual
#: wait.
DEFAULT_UNSTARTED_AFTER = 300.0
#: How many runs one backfill request may create, unless ``beat_claims_backfill_limit``
#: says otherwise.
DEFAULT_BACKFILL_LIMIT = 1000
#: A delivery's wait for a store that does not answer: long enough for a restart, a
#: Sentinel or Patroni failover; bounded, as deliveries wait in the pool's slots.
DEFAULT_WORKER_STORE_WAIT = 30.0
MAX_WORKER_STORE_WAIT = 600.0
#: The longest entry name, in bytes of UTF-8.
MAX_NAME_BYTES = 1024
#: Every ``beat_claims_*`` setting: any other name with the prefix is a typo, refused.
SETTINGS = ("url", "key_prefix", "sentinel_master", "heartbeat_interval", "reclaim_after",
            "catch_up", "max_catch_up", "catch_up_window", "catch_up_grace", "overlap",
            "run_timeout", "history_limit", "publish_retries", "result_backend_recovery",
            "recovery_batch", "metrics_port", "entry_claims", "worker_timeout", "jitter",
            "worker_unprotected", "backfill_limit", "health_grace", "claim_ahead",
            "worker_heartbeat_interval", "exception_messages", "unstarted_after",
            "worker_store_wait")

E = TypeVar("E", bound=Enum)


class ConfigurationError(ValueError):
    """A ``beat_claims_*`` setting or an entry's ``claims`` option is invalid."""


@dataclass(frozen=True)
class Policy:
    """What to do with one entry's missed, overlapping and abandoned runs."""

    catch_up: CatchUp = CatchUp.LATEST
    max_catch_up: int = 100
    catch_up_window: float | None = None
    overlap: Overlap = Overlap.ALLOW
    reclaim_after: float = 300.0
    run_timeout: float | None = DEFAULT_RUN_TIMEOUT
    jitter: float = 0.0  # seconds: each occurrence is sent at due + a fixed offset below it

    def __post_init__(self) -> None:
        # Names as written in settings ("latest") are the enums' values.
        object.__setattr__(self, "catch_up", CatchUp(self.catch_up))
        object.__setattr__(self, "overlap", Overlap(self.overlap))


@dataclass(frozen=True)
class Settings:
    url: str
    key_prefix: str = "beat-claims"
    heartbeat_interval: float = 5.0
    catch_up_grace: float = 2.0
    history_limit: int = 100
    result_backend_recovery: bool = True
    recovery_batch: int = 100
    publish_retries: int = 3
    worker_timeout: float = 1.0
    #: How long a delivery waits for a store that does not answer (an outage: a restart, a
    #: failover) before it runs unfenced; 0: at once. Counted from the outage's start.
    worker_store_wait: float = DEFAULT_WORKER_STORE_WAIT
    worker_unprotected: bool = False
    #: How often a worker process renews its liveness record in the store (its TTL: three
    #: intervals): what a redelivery of a run it started judges it by.
    worker_heartbeat_interval: float = 5.0
    #: Claim a burst's next chunk in a thread while the current one is sent: True, False,
    #: or None (``"auto"``): when this process may use two cores more than the beats alive
    #: on its host.
    claim_ahead: bool | None = None
    sentinel_master: str | None = None
    metrics_port: int | None = None
    backfill_limit: int = DEFAULT_BACKFILL_LIMIT
    health_grace: float | None = None
    #: Keep exception messages in run records (argument values masked): off by default,
    #: as a message may quote the task's arguments (``beat_claims.exception_text``).
    exception_messages: bool = False
    #: Seconds a run may stay ``sent`` without a worker starting it before it is reported
    #: (None: never).
    unstarted_after: float | None = DEFAULT_UNSTARTED_AFTER
    #: Whether ``beat_claims_run_timeout`` was set (else the default's day applies, which
    #: nobody chose: see the start-up warning about overlap policies).
    run_timeout_set: bool = False
    policy: Policy = Policy()
    #: The default policy of crontab entries, when Celery's ``beat_cron_starting_deadline``
    #: is their catch-up window (``beat_claims.celery_settings``); None: ``policy``.
    cron_policy: Policy | None = None

    @property
    def heartbeat_ttl(self) -> float:
        """A beat whose heartbeat is older than this is dead: three missed renewals."""
        return 3 * self.heartbeat_interval

    @property
    def overdue_after(self) -> float:
        """How late an occurrence may be before ``celery claims health`` calls its entry
        overdue: ``beat_claims_health_grace``, by default one heartbeat TTL (a store that
        restarted settles that long before any beat claims) plus 30 s."""
        if self.health_grace is not None:
            return self.health_grace
        return self.heartbeat_ttl + 30.0

    @classmethod
    def from_app(cls, app: Celery) -> Settings:
        conf = app.conf
        _refuse_unknown(conf)
        url = conf.get("beat_claims_url") or _default_url(conf.get("broker_url") or "")
        master = conf.get("beat_claims_sentinel_master") or (
            (conf.get("broker_transport_options") or {}).get("master_name"))
        if url.startswith("sentinel://") and not master:
            raise ConfigurationError(
                f"beat_claims_sentinel_master is not set for the Sentinel URL {redact_url(url)!r}"
                " (nor broker_transport_options['master_name'])")
        prefix = conf.get("beat_claims_key_prefix") or "beat-claims"
        if not isinstance(prefix, str) or any(c in prefix for c in "{} \n"):
            raise ConfigurationError(
                f"beat_claims_key_prefix={prefix!r}: must be a string without braces or spaces"
            )
        policy = Policy(
            catch_up=_choice("beat_claims_catch_up", conf.get("beat_claims_catch_up", "latest"),
                             CatchUp),
            max_catch_up=_positive_int("beat_claims_max_catch_up",
                                       conf.get("beat_claims_max_catch_up", 100)),
            catch_up_window=_optional_seconds("beat_claims_catch_up_window",
                                              conf.get("beat_claims_catch_up_window")),
            overlap=_choice("beat_claims_overlap", conf.get("beat_claims_overlap", "allow"),
                            Overlap),
            reclaim_after=_seconds("beat_claims_reclaim_after",
                                   conf.get("beat_claims_reclaim_after", 300)),
            run_timeout=_optional_seconds("beat_claims_run_timeout",
                                          conf.get("beat_claims_run_timeout",
                                                   DEFAULT_RUN_TIMEOUT)),
            jitter=_jitter("beat_claims_jitter", conf.get("beat_claims_jitter", 0.0)),
        )
        deadline = cron_starting_deadline(conf)
        # beat-claims' own window, when set, is every entry's (named at start).
        cron_policy = (replace(policy, catch_up_window=deadline)
                       if deadline is not None and policy.catch_up_window is None else None)
        return cls(
            url=url,
            key_prefix=prefix,
            heartbeat_interval=_seconds("beat_claims_heartbeat_interval",
                                        conf.get("beat_claims_heartbeat_interval", 5.0)),
            catch_up_grace=_seconds("beat_claims_catch_up_grace",
                                    conf.get("beat_claims_catch_up_grace", 2.0)),
            history_limit=_positive_int("beat_claims_history_limit",
                                        conf.get("beat_claims_history_limit", 100)),
            result_backend_recovery=_flag("beat_claims_result_backend_recovery",
                                          conf.get("beat_claims_result_backend_recovery",
                                                   True)),
            recovery_batch=_positive_int("beat_claims_recovery_batch",
                                         conf.get("beat_claims_recovery_batch", 100)),
            publish_retries=_positive_int("beat_claims_publish_retries",
                                          conf.get("beat_claims_publish_retries", 3)),
            worker_timeout=_seconds("beat_claims_worker_timeout",
                                    conf.get("beat_claims_worker_timeout", 1.0)),
            worker_store_wait=_seconds_between(
                "beat_claims_worker_store_wait",
                conf.get("beat_claims_worker_store_wait", DEFAULT_WORKER_STORE_WAIT),
                MAX_WORKER_STORE_WAIT, "ten minutes"),
            worker_unprotected=_flag("beat_claims_worker_unprotected",
                                     conf.get("beat_claims_worker_unprotected", False)),
            worker_heartbeat_interval=_worker_heartbeat_interval(
                conf.get("beat_claims_worker_heartbeat_interval", 5.0)),
            claim_ahead=_auto_flag("beat_claims_claim_ahead",
                                   conf.get("beat_claims_claim_ahead", "auto")),
            sentinel_master=master,
            metrics_port=(None if conf.get("beat_claims_metrics_port") is None else
                          _positive_int("beat_claims_metrics_port",
                                        conf.get("beat_claims_metrics_port"))),
            backfill_limit=_positive_int("beat_claims_backfill_limit",
                                         conf.get("beat_claims_backfill_limit",
                                                  DEFAULT_BACKFILL_LIMIT)),
            health_grace=_optional_seconds("beat_claims_health_grace",
                                           conf.get("beat_claims_health_grace")),
            exception_messages=_flag("beat_claims_exception_messages",
                                     conf.get("beat_claims_exception_messages", False)),
            unstarted_after=_optional_seconds("beat_claims_unstarted_after",
                                              conf.get("beat_claims_unstarted_after",
                                                       DEFAULT_UNSTARTED_AFTER)),
            run_timeout_set="beat_claims_run_timeout" in conf,
            policy=policy,
            cron_policy=cron_policy,
        )

    def default_policy(self, schedule: Any = None) -> Policy:
        """The defaults of an entry with ``schedule``: a crontab's catch-up window is
        Celery's ``beat_cron_starting_deadline`` when that is set (Celery applies it to
        crontab entries alone)."""
        if self.cron_policy is not None and isinstance(schedule, crontab):
            return self.cron_policy
        return self.policy

    def policy_for(self, entry_name: str, options: Any, schedule: Any = None) -> Policy:
        """The entry's policy: the defaults (for its ``schedule``, when given) overridden
        by its ``claims`` dict."""
        if options is None:
            return self.default_policy(schedule)
        if not isinstance(options, dict):
            raise ConfigurationError(
                f"entry {entry_name!r}: 'claims' must be a dict, got {options!r}")
        unknown = sorted(set(options) - set(ENTRY_KEYS))
        if unknown:
            raise ConfigurationError(
                f"entry {entry_name!r}: unknown key claims[{unknown[0]!r}]"
                f" (known: {', '.join(ENTRY_KEYS)})")
        where = f"entry {entry_name!r}: claims"
        changes: dict[str, Any] = {}
        for key, value in options.items():
            label = f"{where}[{key!r}]"
            if key == "catch_up":
                changes[key] = _choice(label, value, CatchUp)
            elif key == "overlap":
                changes[key] = _choice(label, value, Overlap)
            elif key == "max_catch_up":
                changes[key] = _positive_int(label, value)
            elif key == "reclaim_after":
                changes[key] = _seconds(label, value)
            elif key == "jitter":
                changes[key] = _jitter(label, value)
            else:
                changes[key] = _optional_seconds(label, value)
        return replace(self.default_policy(schedule), **changes)


def cron_starting_deadline(conf: Any) -> float | None:
    """Celery's ``beat_cron_starting_deadline`` in seconds (None: not set). Celery skips a
    crontab entry's missed run older than this; 0 skips every missed one."""
    value = conf.get("beat_cron_starting_deadline")
    if value is None:
        return None
    name = "beat_cron_starting_deadline"
    seconds = _number(name, value)
    if seconds < 0:
        raise ConfigurationError(f"{name}={value!r}: must be 0 or more seconds")
    return seconds


def max_loop_interval(conf: Any, given: Any = None) -> float | None:
    """The longest sleep between two ticks Celery's beat service asks for: ``given`` (what
    it passed the scheduler, ``celery beat --max-interval``) or ``beat_max_loop_interval``
    (None: neither, Celery's default). Celery's loop sleeps only for a positive interval: a
    value that is not one would make the beat tick without sleeping, forever."""
    name, value = (("--max-interval (max_interval)", given) if given
                   else ("beat_max_loop_interval", conf.get("beat_max_loop_interval")))
    if not value:  # (0, None: Celery's default)
        return None
    seconds = _number(name, value)
    if seconds <= 0:
        raise ConfigurationError(f"{name}={value!r}: must be a positive number of seconds")
    return seconds


def _refuse_unknown(conf: Any) -> None:
    """A misspelt setting would leave the beat on its defaults without a word."""
    import difflib

    known = {f"beat_claims_{name}" for name in SETTINGS}
    # Lower case: Celery's names (Django's CELERY_BEAT_CLAIMS_X arrives as beat_claims_x;
    # BEAT_CLAIMS_CELERY_APP and BEAT_CLAIMS_CHECK_STORE are Django's own settings).
    for key in sorted(k for k in conf if str(k).startswith("beat_claims_")):
        if key not in known:
            close = difflib.get_close_matches(str(key).lower(), sorted(known), n=1)
            hint = (f"did you mean {close[0]}?" if close else
                    f"known: {', '.join(sorted(known))}")
            raise ConfigurationError(f"{key}: unknown beat-claims setting ({hint})")


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name}={value!r}: must be True or False")
    return value


def _auto_flag(name: str, value: Any) -> bool | None:
    if value is None or value == "auto":
        return None
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name}={value!r}: must be True, False or 'auto'")
    return value


def _default_url(broker_url: str) -> str:
    url = broker_url.split(";")[0].strip()
    if url.startswith(("redis://", "rediss://", "unix://", "sentinel://")):
        return broker_url.strip() if url.startswith("sentinel://") else url
    raise ConfigurationError(
        "beat_claims_url is not set and the broker is not Redis "
        f"(broker_url={redact_url(url)!r}): set beat_claims_url to a redis://, rediss:// or"
        " sentinel:// URL"
    )


def _choice(name: str, value: Any, choices: type[E]) -> E:
    if isinstance(value, choices):
        return value
    names = [c.value for c in choices]
    if value not in names:
        raise ConfigurationError(f"{name}={value!r}: must be one of {', '.join(names)}")
    return choices(value)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ConfigurationError(f"{name}={value!r}: must be a number of seconds")
    if hasattr(value, "total_seconds"):
        value = value.total_seconds()
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigurationError(f"{name}={value!r}: must be a number of seconds") from None
    if not math.isfinite(seconds):
        raise ConfigurationError(f"{name}={value!r}: must be a finite number of seconds")
    if seconds > MAX_SECONDS:
        raise ConfigurationError(
            f"{name}={value!r}: must be at most {MAX_SECONDS:.0f} seconds (ten years)")
    return seconds


def _seconds(name: str, value: Any) -> float:
    seconds = _number(name, value)
    if not seconds > 0:
        raise ConfigurationError(f"{name}={value!r}: must be greater than 0 seconds")
    return seconds


#: The worker heartbeat interval accepted: a redelivery may wait four intervals in the
#: receiving process (a TTL and one interval) before it is run or refused.
WORKER_HEARTBEAT_RANGE = (0.1, 60.0)


def _worker_heartbeat_interval(value: Any) -> float:
    name = "beat_claims_worker_heartbeat_interval"
    seconds = _seconds(name, value)
    low, high = WORKER_HEARTBEAT_RANGE
    if not low <= seconds <= high:
        raise ConfigurationError(
            f"{name}={value!r}: must be between {low} and {high:.0f} seconds (a redelivery"
            " may wait four intervals for the process that started its run)")
    return seconds


def _seconds_between(name: str, value: Any, high: float, said: str) -> float:
    """Seconds from 0 (included) to ``high`` (``said`` in words)."""
    seconds = _number(name, value)
    if not 0 <= seconds <= high:
        raise ConfigurationError(
            f"{name}={value!r}: must be between 0 and {high:.0f} seconds ({said})")
    return seconds


def _jitter(name: str, value: Any) -> float:
    return _seconds_between(name, value, MAX_JITTER, "a day")


def _optional_seconds(name: str, value: Any) -> float | None:
    return None if value is None else _seconds(name, value)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigurationError(f"{name}={value!r}: must be a positive integer")
    if value > 2**31:
        raise ConfigurationError(f"{name}={value!r}: must be at most {2**31}")
    return value


def entry_name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be an entry's name in the store, or None when it can."""
    if not isinstance(name, str) or not name:
        return f"entry name {name!r}: must be a non-empty string"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return (f"entry name {name!r}: cannot be stored (not valid Unicode text:"
                f" {exc.reason} at position {exc.start})")
    if size > MAX_NAME_BYTES:
        return f"entry name {name[:40]!r}...: longer than {MAX_NAME_BYTES} bytes"
    return None
