"""Params -> strategy: validation (every bad key named), options(), describe(), schema."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.restart import (
    ExponentialDelayOptions,
    FailureRateOptions,
    FixedDelayOptions,
    parse_restart_params,
    restart_params_json_schema,
    restart_strategy_from_params,
)

SCHEMA = restart_params_json_schema()
VALIDATOR = Draft202012Validator(SCHEMA)


def problems_of(params: Any) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        restart_strategy_from_params(params)
    assert info.value.what == "restart strategy"
    return info.value.problems


# ------------------------------------------------------------------- hand-written


def test_brief_example() -> None:
    params = {
        "type": "failure-rate",
        "failure-rate.max-failures-per-interval": 3,
        "failure-rate.failure-rate-interval": "5 min",
        "failure-rate.delay": "10 s",
    }
    strategy = restart_strategy_from_params(params)
    assert strategy.name == "failure-rate"
    assert strategy.describe() == (
        "failure-rate(max-failures-per-interval=3, failure-rate-interval=5 min, delay=10 s)"
    )
    assert strategy.options() == params
    assert parse_restart_params(params) == FailureRateOptions(3, 300_000, 10_000)
    assert VALIDATOR.is_valid(params)


def test_prefixed_keys_and_string_numbers() -> None:
    options = parse_restart_params(
        {
            "restart-strategy.type": "exponential-delay",
            "restart-strategy.exponential-delay.initial-backoff": "500 ms",
            "exponential-delay.max-backoff": 120,
            "exponential-delay.backoff-multiplier": "2",
            "exponential-delay.jitter-factor": 0,
            "exponential-delay.attempts-before-reset-backoff": "infinite",
            "exponential-delay.reset-backoff-threshold": "10 min",
        }
    )
    assert options == ExponentialDelayOptions(500, 120_000, 2.0, 600_000, 0.0, 2**31 - 1)


def test_none_values_count_as_not_given() -> None:
    options = parse_restart_params(
        {"type": "fixed-delay", "fixed-delay.delay": None, "failure-rate.delay": None}
    )
    assert options == FixedDelayOptions()
    assert parse_restart_params({"type": None}) == ExponentialDelayOptions()
    assert parse_restart_params(None) == ExponentialDelayOptions()


def test_durations_truncate_to_milliseconds_like_duration_to_millis() -> None:
    assert parse_restart_params({"type": "fixed-delay", "fixed-delay.delay": "1500 us"}) == (
        FixedDelayOptions(1, 1)
    )
    assert parse_restart_params({"type": "fixed-delay", "fixed-delay.delay": 0.29}) == (
        FixedDelayOptions(1, 290)
    )


def test_every_bad_key_is_named_with_allowed_values() -> None:
    problems = problems_of(
        {
            "type": "fixed-delay",
            "fixed-delay.attempts": -1,
            "restart-strategy.fixed-delay.delay": "soon",
            "failure-rate.delay": "1 s",
            "exponential-delay.jitter-factor": 0.5,
            "retries": 3,
        }
    )
    assert set(problems) == {
        "fixed-delay.attempts",
        "restart-strategy.fixed-delay.delay",
        "failure-rate.delay",
        "exponential-delay.jitter-factor",
        "retries",
    }
    assert "[0, 2147483647]" in problems["fixed-delay.attempts"]
    assert '"10 s"' in problems["restart-strategy.fixed-delay.delay"]
    assert "set type: failure-rate" in problems["failure-rate.delay"]
    assert "fixed-delay.attempts" in problems["retries"]


def test_bad_type_lists_the_aliases_and_still_checks_values() -> None:
    problems = problems_of({"type": "sometimes", "fixed-delay.attempts": "many", "x": 1})
    assert set(problems) == {"type", "fixed-delay.attempts", "x"}
    assert "exponentialdelay" in problems["type"]


def test_options_of_the_default_type_are_checked_against_it() -> None:
    problems = problems_of({"fixed-delay.attempts": 3})
    assert "type is not set (defaults to exponential-delay)" in problems["fixed-delay.attempts"]


def test_given_twice_and_non_string_keys() -> None:
    problems = problems_of(
        {
            "fixed-delay.delay": "1 s",
            "restart-strategy.fixed-delay.delay": "2 s",
            "type": "fixed-delay",
            7: 1,
        }
    )
    assert set(problems) == {"fixed-delay.delay", "restart-strategy.fixed-delay.delay", "7"}


def test_initial_backoff_above_max_names_both_keys() -> None:
    problems = problems_of(
        {"exponential-delay.initial-backoff": "2 min", "exponential-delay.max-backoff": "1 min"}
    )
    assert set(problems) == {"exponential-delay.initial-backoff", "exponential-delay.max-backoff"}
    # only one given: the default of the other counts
    problems = problems_of({"exponential-delay.max-backoff": "500 ms"})
    assert set(problems) == {"exponential-delay.max-backoff"}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("failure-rate.max-failures-per-interval", 0),
        ("failure-rate.failure-rate-interval", "0 ms"),
        ("failure-rate.failure-rate-interval", "999 us"),
        ("failure-rate.delay", -1),
        ("failure-rate.max-failures-per-interval", 2**31),
        ("failure-rate.max-failures-per-interval", 1.5),
        ("failure-rate.max-failures-per-interval", True),
    ],
)
def test_flink_ranges_failure_rate(key: str, value: Any) -> None:
    assert set(problems_of({"type": "failure-rate", key: value})) == {key}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("exponential-delay.initial-backoff", "0 ms"),
        ("exponential-delay.backoff-multiplier", 1),
        ("exponential-delay.backoff-multiplier", "nan"),
        ("exponential-delay.backoff-multiplier", float("inf")),
        ("exponential-delay.reset-backoff-threshold", 0),
        ("exponential-delay.jitter-factor", 1.01),
        ("exponential-delay.jitter-factor", -0.1),
        ("exponential-delay.attempts-before-reset-backoff", 0),
        ("exponential-delay.attempts-before-reset-backoff", "forever"),
    ],
)
def test_flink_ranges_exponential_delay(key: str, value: Any) -> None:
    assert set(problems_of({"type": "exponential-delay", key: value})) == {key}


def test_params_must_be_a_mapping() -> None:
    assert set(problems_of(["type", "none"])) == {"<params>"}


def test_describe_of_every_type() -> None:
    assert restart_strategy_from_params({"type": "off"}).describe() == "none"
    assert (
        restart_strategy_from_params(
            {"type": "fixed-delay", "fixed-delay.attempts": 3, "fixed-delay.delay": "10 s"}
        ).describe()
        == "fixed-delay(attempts=3, delay=10 s)"
    )
    assert restart_strategy_from_params({}).describe() == (
        "exponential-delay(initial-backoff=1 s, max-backoff=1 min, backoff-multiplier=1.5, "
        "reset-backoff-threshold=1 h, jitter-factor=0.1, attempts-before-reset-backoff=infinite)"
    )


def test_decision_json_form() -> None:
    decision = restart_strategy_from_params({"type": "fixed-delay"}).on_failure(10.0)
    assert json.loads(json.dumps(decision.to_dict()))["delay_s"] == 1.0


@pytest.mark.parametrize("now", [float("nan"), float("inf"), -1.0, True, "10"])
def test_on_failure_rejects_bad_timestamps(now: Any) -> None:
    with pytest.raises(ValueError):
        restart_strategy_from_params({"type": "fixed-delay"}).on_failure(now)


# ------------------------------------------------------------------------ schema


def test_schema_is_valid_draft_2020_12() -> None:
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    json.dumps(SCHEMA)
    for example in SCHEMA["examples"]:
        assert VALIDATOR.is_valid(example)
        restart_strategy_from_params(example)


@pytest.mark.parametrize(
    "params",
    [
        {"type": "fixed-delay", "failure-rate.delay": "1 s"},
        {"fixed-delay.attempts": 1},
        {"type": "none", "exponential-delay.jitter-factor": 0.2},
        {"type": "bogus"},
        {"typo": 1},
        {"type": "fixed-delay", "fixed-delay.attempts": -1},
        {"type": "fixed-delay", "fixed-delay.delay": "10 parsecs"},
        {"exponential-delay.backoff-multiplier": 1.0},
    ],
)
def test_schema_rejects_what_the_parser_rejects(params: dict[str, Any]) -> None:
    assert not VALIDATOR.is_valid(params)
    problems_of(params)


# --------------------------------------------------------------------- properties

OWN_VALID: dict[str, list[Any]] = {
    "fixed-delay.attempts": [0, 1, 3, "5", 2**31 - 1, 4.0],
    "fixed-delay.delay": [0, "0 ms", "10 s", 1.5, "2 min", "100ms"],
    "failure-rate.max-failures-per-interval": [1, 3, "7"],
    "failure-rate.failure-rate-interval": ["1 ms", "5 min", 60, "1 h"],
    "failure-rate.delay": [0, "10 s", "1 MIN"],
    "exponential-delay.initial-backoff": ["1 ms", "500 ms", "1 s", 1],
    "exponential-delay.max-backoff": ["1 min", "2 min", 300],
    "exponential-delay.backoff-multiplier": [1.1, 1.5, "2.0", 3],
    "exponential-delay.reset-backoff-threshold": ["1 h", "10 min", 5],
    "exponential-delay.jitter-factor": [0, 0.1, "0.5", 1],
    "exponential-delay.attempts-before-reset-backoff": [1, 10, "infinite", "3"],
}
# Invalid values the schema can detect too (no out-of-range duration strings).
OWN_INVALID: dict[str, list[Any]] = {
    "fixed-delay.attempts": [-1, "x", 2.5, True, 2**31],
    "fixed-delay.delay": [-1, "soon", "1 fortnight", False],
    "failure-rate.max-failures-per-interval": [0, -3, "one"],
    "failure-rate.failure-rate-interval": [0, 0.0001, "later"],
    "failure-rate.delay": [-0.5, "x"],
    "exponential-delay.initial-backoff": [0, "fast"],
    "exponential-delay.max-backoff": [0, "slow", []],
    "exponential-delay.backoff-multiplier": [1, 0.5, "x", "1e400x"],
    "exponential-delay.reset-backoff-threshold": [0, "never"],
    "exponential-delay.jitter-factor": [-0.1, 1.5, "lots"],
    "exponential-delay.attempts-before-reset-backoff": [0, "forever", 1.5],
}
TYPES = {
    "none": "none",
    "fixed-delay": "fixed-delay",
    "failure-rate": "failure-rate",
    "exponential-delay": "exponential-delay",
    "off": "none",
    "fixeddelay": "fixed-delay",
    "failurerate": "failure-rate",
    "exponentialdelay": "exponential-delay",
}
UNKNOWN = [
    "retries",
    "fixed-delay.atempts",
    "restart-strategy.delay",
    "jitter",
    "exponential-delay",
]


@st.composite
def params_with_known_problems(draw: st.DrawFn) -> tuple[dict[str, Any], set[str]]:
    spelled_type = draw(st.sampled_from(sorted(TYPES)))
    canonical = TYPES[spelled_type]
    params: dict[str, Any] = {}
    bad: set[str] = set()
    if draw(st.booleans()) or canonical != "exponential-delay":
        params[draw(st.sampled_from(["type", "restart-strategy.type", "restart-strategy"]))] = (
            spelled_type
        )
    for key in sorted(OWN_VALID):
        choice = draw(st.sampled_from(["skip", "skip", "valid", "invalid"]))
        spelled = draw(st.sampled_from([key, "restart-strategy." + key]))
        if choice == "skip":
            continue
        own = key.startswith(canonical + ".")
        if choice == "valid" or not own:
            params[spelled] = draw(st.sampled_from(OWN_VALID[key]))
            if not own:
                bad.add(spelled)  # an option of another strategy type
        else:
            params[spelled] = draw(st.sampled_from(OWN_INVALID[key]))
            bad.add(spelled)
    for key in draw(st.lists(st.sampled_from(UNKNOWN), unique=True, max_size=2)):
        params[key] = draw(st.integers())
        bad.add(key)
    return params, bad


@settings(max_examples=300, deadline=None)
@given(params_with_known_problems())
def test_exactly_the_bad_keys_are_named(case: tuple[dict[str, Any], set[str]]) -> None:
    params, bad = case
    if bad:
        assert set(problems_of(params)) == bad
        assert not VALIDATOR.is_valid(params)
    else:
        strategy = restart_strategy_from_params(params)
        assert VALIDATOR.is_valid(params), list(VALIDATOR.iter_errors(params))
        # options() is canonical and feeds back to an equal configuration
        again = restart_strategy_from_params(strategy.options())
        assert again.options() == strategy.options()
        assert again.describe() == strategy.describe()
        assert getattr(again, "config", None) == getattr(strategy, "config", None)
        assert VALIDATOR.is_valid(strategy.options())


@st.composite
def valid_params(draw: st.DrawFn) -> dict[str, Any]:
    spelled_type = draw(st.sampled_from(sorted(TYPES)))
    canonical = TYPES[spelled_type]
    params: dict[str, Any] = {"type": spelled_type}
    for key in sorted(OWN_VALID):
        if key.startswith(canonical + ".") and draw(st.booleans()):
            params[draw(st.sampled_from([key, "restart-strategy." + key]))] = draw(
                st.sampled_from(OWN_VALID[key])
            )
        elif draw(st.booleans()):
            params[key] = None  # a form sending every field, unset ones as null
    return params


@settings(max_examples=200, deadline=None)
@given(valid_params())
def test_valid_params_pass_parser_and_schema(params: dict[str, Any]) -> None:
    assert VALIDATOR.is_valid(params), list(VALIDATOR.iter_errors(params))
    strategy = restart_strategy_from_params(params)
    assert strategy.name == TYPES[params["type"]]
    again = restart_strategy_from_params(json.loads(json.dumps(strategy.options())))
    assert getattr(again, "config", None) == getattr(strategy, "config", None)


def test_now_is_rounded_to_the_nearest_millisecond() -> None:
    from airflow_ckpt.restart.base import epoch_ms

    assert epoch_ms(1.001) == 1001  # 1.001 * 1000 == 1000.9999999999999
    assert epoch_ms(1_700_000_000.123) == 1_700_000_000_123
    assert epoch_ms(5) == 5000


# ------------------------------------------------------- trigger-form messages (issue 11)


def form_error(value: dict[str, Any]) -> str:
    """What Airflow's trigger form reports for ``value`` (``Param.resolve``: jsonschema
    with the registered format checkers, which run the parser on the whole object)."""
    from airflow.sdk import Param
    from airflow.sdk.exceptions import ParamValidationError

    param = Param({"type": "fixed-delay"}, schema=SCHEMA)
    with pytest.raises(ParamValidationError) as err:
        param.resolve(value)
    return str(err.value)


@pytest.mark.parametrize(("value", "explained_by"), [
    ({"type": "fixd-delay"}, "type"),
    ({"fixed-delay.delay": "1 s"}, "fixed-delay.delay"),  # no type: exponential-delay
    ({"type": "fixed-delay", "exponential-delay.max-backoff": "1 min"},
     "exponential-delay.max-backoff"),
    ({"type": "fixed-delay", "fixed-delay.attempts": "three"}, "fixed-delay.attempts"),
    ({"type": "failure-rate", "failure-rate.delay": "10 parsecs"}, "failure-rate.delay"),
])
def test_form_messages_are_the_parsers_explanations(value: dict[str, Any],
                                                    explained_by: str) -> None:
    """Not ``'1 s' is not of type 'null'`` / ``... is not valid under any of the given
    schemas``: the form shows the parser's explanation for that key."""
    message = form_error(value)
    assert "is not of type" not in message and "any of the given schemas" not in message
    with pytest.raises(ConfigError) as parsed:
        restart_strategy_from_params(value)
    [(_key, problem)] = parsed.value.problems.items()
    assert f"{explained_by}: " in message
    assert problem.split(", got ")[0] in message


def test_form_accepts_any_case_type_like_the_parser() -> None:
    assert VALIDATOR.is_valid({"type": "Fixed-Delay", "fixed-delay.attempts": 2})
    assert not VALIDATOR.is_valid({"type": "Fixed-Delay", "failure-rate.delay": "1 s"})
