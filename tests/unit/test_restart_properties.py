"""Property tests: random failure timelines against independent reference models.

The reference models below are written from Flink's documented semantics
(docs "Task Failure Recovery" and the option descriptions in
RestartStrategyOptions), not from the implementation:

* fixed-delay: the first ``attempts`` failures are restarted after ``delay``;
* failure-rate: a failure is restarted unless more than ``max`` failures
  (including it) happened within the last ``interval`` (inclusive);
* exponential-delay: the backoff starts at ``initial``, is multiplied per attempt
  and capped at ``max``; failures during a pending restart are merged into it;
  ``reset-threshold`` of running after the restart time resets the backoff and the
  attempt count; more than ``attempts`` attempts since a reset fail the job.

Timestamps are whole milliseconds from a realistic epoch, fed as float seconds.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ckpt.restart import RestartDecision, restart_strategy_from_params

EPOCH_MS = 1_700_000_000_000
INT_MAX = 2**31 - 1


@dataclass(frozen=True)
class Expected:
    restart: bool
    delay_ms: int
    attempt: int
    new_attempt: bool = True


def check(decision: RestartDecision, expected: Expected) -> None:
    got = Expected(
        decision.restart, round(decision.delay_s * 1000), decision.attempt, decision.new_attempt
    )
    assert got == expected
    assert decision.delay_s == got.delay_ms / 1000  # whole milliseconds


def timeline(max_gap: int, max_size: int = 40) -> st.SearchStrategy[list[int]]:
    """Non-decreasing failure timestamps (ms): bursts, short gaps and long pauses."""
    gap = st.one_of(
        st.just(0), st.integers(0, 10), st.integers(0, max_gap // 10 + 1), st.integers(0, max_gap)
    )
    return st.lists(gap, min_size=1, max_size=max_size).map(
        lambda gaps: [EPOCH_MS + sum(gaps[: i + 1]) for i in range(len(gaps))]
    )


def run(params: dict[str, Any], times: list[int], rng: Any = 0) -> list[RestartDecision]:
    strategy = restart_strategy_from_params(params, rng=rng)
    return [strategy.on_failure(t / 1000) for t in times]


# -------------------------------------------------------------------- references


def ref_fixed_delay(attempts: int, delay: int, times: list[int]) -> list[Expected]:
    out = []
    for n, _ in enumerate(times, start=1):
        out.append(Expected(n <= attempts, delay if n <= attempts else 0, n))
    return out


def ref_failure_rate(
    max_failures: int, interval: int, delay: int, times: list[int]
) -> list[Expected]:
    out = []
    for i, now in enumerate(times):
        in_window = sum(1 for t in times[: i + 1] if now - t <= interval)
        ok = in_window <= max_failures
        out.append(Expected(ok, delay if ok else 0, min(in_window, max_failures + 1)))
    return out


def ref_exponential(
    initial: int,
    maximum: int,
    multiplier: float,
    reset: int,
    attempts: int,
    times: list[int],
    jitter: float = 0.0,
    rng: random.Random | None = None,
) -> list[Expected]:
    out = []
    pending_until: int | None = None  # when the pending restart happens
    streak = 0  # attempts since the last reset
    for now in times:
        if pending_until is not None and now <= pending_until:
            ok = streak <= attempts
            out.append(Expected(ok, pending_until - now if ok else 0, streak, False))
            continue
        if pending_until is None or now - pending_until >= reset:
            streak = 0
        try:
            base = math.floor(initial * multiplier**streak)
        except OverflowError:
            base = maximum
        if jitter:
            assert rng is not None
            spread = math.floor(base * jitter)
            base += rng.randint(-spread, spread)
        backoff = max(initial, min(base, maximum))
        pending_until = now + backoff
        streak += 1
        ok = streak <= attempts
        out.append(Expected(ok, backoff if ok else 0, streak))
    return out


# ----------------------------------------------------------------- strategies


def fixed_params() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "type": st.just("fixed-delay"),
            "fixed-delay.attempts": st.integers(0, 30),
            "fixed-delay.delay": st.integers(0, 10_000).map(lambda ms: f"{ms} ms"),
        }
    )


def rate_params() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "type": st.just("failure-rate"),
            "failure-rate.max-failures-per-interval": st.integers(1, 6),
            "failure-rate.failure-rate-interval": st.integers(1, 5_000).map(lambda ms: f"{ms} ms"),
            "failure-rate.delay": st.integers(0, 1_000).map(lambda ms: f"{ms} ms"),
        }
    )


@st.composite
def exp_params(draw: st.DrawFn, jitter: bool = False) -> dict[str, Any]:
    initial = draw(st.integers(1, 50))
    return {
        "type": "exponential-delay",
        "exponential-delay.initial-backoff": f"{initial} ms",
        "exponential-delay.max-backoff": f"{draw(st.integers(initial, 2_000))} ms",
        "exponential-delay.backoff-multiplier": draw(
            st.one_of(
                st.sampled_from([1.2, 1.5, 2.0, 2.3]),
                st.floats(1.01, 3.0, allow_nan=False, allow_infinity=False),
            )
        ),
        "exponential-delay.reset-backoff-threshold": f"{draw(st.integers(1, 3_000))} ms",
        "exponential-delay.jitter-factor": draw(st.floats(0.01, 1.0)) if jitter else 0,
        "exponential-delay.attempts-before-reset-backoff": draw(
            st.one_of(st.integers(1, 12), st.just(INT_MAX))
        ),
    }


def ms(params: dict[str, Any], key: str) -> int:
    return int(params[key].removesuffix(" ms"))


def exp_args(p: dict[str, Any]) -> tuple[int, int, float, int, int]:
    return (
        ms(p, "exponential-delay.initial-backoff"),
        ms(p, "exponential-delay.max-backoff"),
        p["exponential-delay.backoff-multiplier"],
        ms(p, "exponential-delay.reset-backoff-threshold"),
        p["exponential-delay.attempts-before-reset-backoff"],
    )


# -------------------------------------------------------------- model comparisons


@settings(max_examples=200, deadline=None)
@given(fixed_params(), timeline(20_000))
def test_fixed_delay_matches_reference(params: dict[str, Any], times: list[int]) -> None:
    expected = ref_fixed_delay(
        params["fixed-delay.attempts"], ms(params, "fixed-delay.delay"), times
    )
    for decision, exp in zip(run(params, times), expected, strict=True):
        check(decision, exp)


@settings(max_examples=300, deadline=None)
@given(rate_params(), timeline(3_000, max_size=60))
def test_failure_rate_matches_reference(params: dict[str, Any], times: list[int]) -> None:
    expected = ref_failure_rate(
        params["failure-rate.max-failures-per-interval"],
        ms(params, "failure-rate.failure-rate-interval"),
        ms(params, "failure-rate.delay"),
        times,
    )
    for decision, exp in zip(run(params, times), expected, strict=True):
        check(decision, exp)


@settings(max_examples=400, deadline=None)
@given(exp_params(), timeline(4_000, max_size=60))
def test_exponential_delay_without_jitter_matches_reference(
    params: dict[str, Any], times: list[int]
) -> None:
    expected = ref_exponential(*exp_args(params), times)
    for decision, exp in zip(run(params, times), expected, strict=True):
        check(decision, exp)


@settings(max_examples=300, deadline=None)
@given(exp_params(jitter=True), timeline(4_000, max_size=30), st.integers(0, 2**32))
def test_exponential_delay_with_jitter(params: dict[str, Any], times: list[int], seed: int) -> None:
    """Every delay within Flink's bounds; identical to the reference given the same draws."""
    initial, maximum, multiplier, _, _ = exp_args(params)
    jitter = params["exponential-delay.jitter-factor"]
    decisions = run(params, times, rng=random.Random(seed))
    expected = ref_exponential(*exp_args(params), times, jitter, random.Random(seed))
    for decision, exp in zip(decisions, expected, strict=True):
        check(decision, exp)
        delay = round(decision.delay_s * 1000)
        if not decision.restart:
            continue
        if decision.new_attempt:
            base = math.floor(initial * multiplier ** (decision.attempt - 1))
            spread = math.floor(base * jitter)
            assert max(initial, min(base - spread, maximum)) <= delay
            assert delay <= max(initial, min(base + spread, maximum))
            assert initial <= delay <= maximum
        else:
            assert 0 <= delay <= maximum


def test_jitter_draws_cover_the_whole_range() -> None:
    params = {
        "type": "exponential-delay",
        "exponential-delay.initial-backoff": "1 s",
        "exponential-delay.max-backoff": "1 min",
        "exponential-delay.jitter-factor": 0.1,
    }
    rng = random.Random(7)
    second = set()
    for _ in range(3_000):
        strategy = restart_strategy_from_params(params, rng=rng)
        strategy.on_failure(100.0)
        second.add(round(strategy.on_failure(102.0).delay_s * 1000))
    assert min(second) == 1_350 and max(second) == 1_650  # 1500 ms +- 150 ms, ends included


# -------------------------------------------------------------- state round trip


def any_params() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.just({"type": "none"}),
        fixed_params(),
        rate_params(),
        exp_params(),
        exp_params(jitter=True),
    )


@settings(max_examples=300, deadline=None)
@given(any_params(), timeline(4_000, max_size=40), st.data(), st.integers(0, 2**32))
def test_state_round_trip_through_json_continues_identically(
    params: dict[str, Any], times: list[int], data: st.DataObject, seed: int
) -> None:
    split = data.draw(st.integers(0, len(times)))
    uninterrupted = run(params, times, rng=random.Random(seed))

    rng = random.Random(seed)  # the jitter source is not state; it carries over
    first = restart_strategy_from_params(params, rng=rng)
    decisions = [first.on_failure(t / 1000) for t in times[:split]]
    state = json.loads(json.dumps(first.state_dict()))
    second = restart_strategy_from_params(json.loads(json.dumps(params)), state=state, rng=rng)
    decisions += [second.on_failure(t / 1000) for t in times[split:]]

    assert decisions == uninterrupted
    assert (
        second.state_dict()
        == restart_strategy_from_params(params, state=second.state_dict()).state_dict()
    )


def test_state_of_another_type_or_empty_starts_fresh() -> None:
    fixed = restart_strategy_from_params({"type": "fixed-delay"})
    fixed.on_failure(1.0)
    rate = restart_strategy_from_params({"type": "failure-rate"}, state=fixed.state_dict())
    assert rate.state_dict()["failure_timestamps_ms"] == []
    again = restart_strategy_from_params({"type": "fixed-delay"}, state={})
    assert again.on_failure(2.0).attempt == 1


def test_failure_rate_state_trimmed_when_limit_lowered() -> None:
    params = {"type": "failure-rate", "failure-rate.max-failures-per-interval": 5}
    strategy = restart_strategy_from_params(params)
    for t in range(6):
        strategy.on_failure(float(t))
    lowered = restart_strategy_from_params(
        {**params, "failure-rate.max-failures-per-interval": 2}, state=strategy.state_dict()
    )
    assert lowered.state_dict()["failure_timestamps_ms"] == [3000, 4000, 5000]
