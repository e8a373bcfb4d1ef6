"""Settings and per-entry policies fail at start with a message naming what is wrong;
the catch-up planner decides which missed occurrences run."""

from __future__ import annotations

import pytest
from celery import Celery

from beat_claims.catch_up import plan
from beat_claims.settings import ConfigurationError, Policy, Settings


def make_app(**conf: object) -> Celery:
    app = Celery("s", set_as_current=False)
    app.conf.broker_url = "redis://127.0.0.1:1/0"
    app.conf.update(conf)
    return app


def test_defaults_take_the_redis_broker_url() -> None:
    s = Settings.from_app(make_app())
    assert s.url == "redis://127.0.0.1:1/0"
    assert s.key_prefix == "beat-claims"
    assert s.heartbeat_interval == 5.0
    assert s.policy.reclaim_after == 300.0 and s.policy.catch_up == "latest"


@pytest.mark.parametrize(("value", "read"), [("auto", None), (None, None), (True, True),
                                             (False, False)])
def test_claim_ahead_is_auto_by_default_or_forced(value: object, read: bool | None) -> None:
    assert Settings.from_app(make_app()).claim_ahead is None
    assert Settings.from_app(make_app(beat_claims_claim_ahead=value)).claim_ahead is read


def test_non_redis_broker_without_url_is_a_clear_error() -> None:
    app = make_app(broker_url="amqp://guest:secret@localhost:5672//")
    with pytest.raises(ConfigurationError) as err:
        Settings.from_app(app)
    assert "beat_claims_url" in str(err.value) and "secret" not in str(err.value)


@pytest.mark.parametrize(("setting", "value"), [
    ("beat_claims_reclaim_after", 0),
    ("beat_claims_reclaim_after", -5),
    ("beat_claims_heartbeat_interval", "soon"),
    ("beat_claims_catch_up", "everything"),
    ("beat_claims_overlap", "queue"),
    ("beat_claims_history_limit", 0),
    ("beat_claims_run_timeout", 0),
    ("beat_claims_key_prefix", "a{b}"),
    ("beat_claims_claim_ahead", "yes"),
    ("beat_claims_claim_ahead", 1),
    ("beat_claims_result_backend_recovery", "False"),  # was taken for True
])
def test_bad_setting_names_setting_and_value(setting: str, value: object) -> None:
    with pytest.raises(ConfigurationError) as err:
        Settings.from_app(make_app(**{setting: value}))
    assert setting in str(err.value) and repr(value) in str(err.value)


def test_entry_overrides_and_their_errors() -> None:
    s = Settings.from_app(make_app())
    p = s.policy_for("nightly", {"catch_up": "all", "overlap": "skip", "run_timeout": 3600})
    assert (p.catch_up, p.overlap, p.run_timeout, p.max_catch_up) == ("all", "skip", 3600.0, 100)
    for claims, needle in [({"catchup": "all"}, "'catchup'"),
                           ({"catch_up": "most"}, "'most'"),
                           ({"reclaim_after": 0}, "reclaim_after"),
                           ({"catch_up_window": -1}, "catch_up_window")]:
        with pytest.raises(ConfigurationError) as err:
            s.policy_for("nightly", claims)
        assert "'nightly'" in str(err.value) and needle in str(err.value)


NOW = 1_000_000
GRACE = 10_000


def test_latest_runs_the_newest_and_skips_the_rest() -> None:
    due = [NOW - 300_000, NOW - 200_000, NOW - 100_000]
    p = plan(Policy(catch_up="latest"), due, 3, NOW, GRACE, 100)
    assert p.run == [NOW - 100_000]
    assert p.skip == [(NOW - 300_000, "catch_up"), (NOW - 200_000, "catch_up")]


def test_latest_prefers_an_on_time_occurrence() -> None:
    due = [NOW - 300_000, NOW - 1_000]
    p = plan(Policy(catch_up="latest"), due, 2, NOW, GRACE, 100)
    assert p.run == [NOW - 1_000] and p.skip == [(NOW - 300_000, "catch_up")]


def test_all_runs_each_oldest_first_up_to_max() -> None:
    due = [NOW - 400_000, NOW - 300_000, NOW - 200_000, NOW - 100_000]
    p = plan(Policy(catch_up="all", max_catch_up=3), due, 4, NOW, GRACE, 100)
    assert p.run == due[1:]
    assert p.skip == [(NOW - 400_000, "max_catch_up")]


def test_none_skips_missed_and_runs_on_time() -> None:
    due = [NOW - 300_000, NOW - 2_000]
    p = plan(Policy(catch_up="none"), due, 2, NOW, GRACE, 100)
    assert p.run == [NOW - 2_000] and p.skip == [(NOW - 300_000, "catch_up")]


def test_window_skips_old_ones_whatever_the_policy() -> None:
    due = [NOW - 300_000, NOW - 100_000, NOW - 50_000]
    p = plan(Policy(catch_up="all", catch_up_window=120), due, 3, NOW, GRACE, 100)
    assert p.run == [NOW - 100_000, NOW - 50_000]
    assert p.skip == [(NOW - 300_000, "catch_up_window")]


def test_skips_beyond_the_record_limit_are_counted_not_listed() -> None:
    due = [NOW - k * 1000 for k in range(50, 10, -1)]
    p = plan(Policy(catch_up="latest"), due, 1000, NOW, GRACE, 5)
    assert len(p.skip) == 5 and p.unrecorded == 1000 - 40 + 34


def test_overlap_skip_runs_only_the_newest_of_a_catch_up_batch() -> None:
    due = [NOW - 300_000, NOW - 200_000, NOW - 1_000]
    p = plan(Policy(catch_up="all", overlap="skip"), due, 3, NOW, GRACE, 100)
    assert p.run == [NOW - 1_000]
    assert p.skip == [(NOW - 300_000, "overlap"), (NOW - 200_000, "overlap")]


@pytest.mark.parametrize("setting", [
    "beat_claims_reclaim_after", "beat_claims_heartbeat_interval",
    "beat_claims_catch_up_window", "beat_claims_run_timeout", "beat_claims_catch_up_grace",
])
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 1e300, "inf"],
                         ids=["inf", "-inf", "nan", "huge", "inf-text"])
def test_infinite_nan_or_huge_seconds_are_refused_naming_the_setting(
        setting: str, value: object) -> None:
    with pytest.raises(ConfigurationError) as err:
        Settings.from_app(make_app(**{setting: value}))
    assert setting in str(err.value) and repr(value) in str(err.value)


@pytest.mark.parametrize("key", ["catch_up_window", "reclaim_after", "run_timeout"])
def test_infinite_or_nan_entry_claims_are_refused_naming_the_entry_and_key(key: str) -> None:
    s = Settings.from_app(make_app())
    for value in (float("inf"), float("nan")):
        with pytest.raises(ConfigurationError) as err:
            s.policy_for("nightly", {key: value})
        assert "'nightly'" in str(err.value) and key in str(err.value)


def test_entry_names_that_cannot_be_stored_are_named() -> None:
    from beat_claims.settings import entry_name_problem

    assert entry_name_problem("ok name/with: anything") is None
    assert "cannot be stored" in (entry_name_problem("bad\udc80") or "")
    assert "non-empty" in (entry_name_problem("") or "")
    assert "longer than" in (entry_name_problem("x" * 2000) or "")
