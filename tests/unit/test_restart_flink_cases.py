"""Flink's own unit tests for the restart strategies, ported case by case.

Sources (Apache Flink 2.x, flink-runtime/src/test/java/org/apache/flink/runtime/
executiongraph/failover/): FixedDelayRestartBackoffTimeStrategyTest,
FailureRateRestartBackoffTimeStrategyTest, ExponentialDelayRestartBackoffTimeStrategyTest
(commit bb437bd07f583ffa4c86bc525659abe477d6d051) and
RestartBackoffTimeStrategyFactoryLoaderTest. Flink's ``ManualClock`` becomes an
integer ``clock`` in milliseconds passed to the Flink-named methods.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from airflow_ckpt.restart import (
    ExponentialDelayOptions,
    ExponentialDelayRestartStrategy,
    FailureRateOptions,
    FailureRateRestartStrategy,
    FixedDelayOptions,
    FixedDelayRestartStrategy,
    NoRestartStrategy,
    restart_strategy_from_params,
)
from airflow_ckpt.restart._java import INT_MAX

INT_MAX_MS = INT_MAX  # Flink passes Integer.MAX_VALUE as a threshold in ms in some tests


def exp(
    initial: int,
    maximum: int,
    multiplier: float,
    reset: int,
    jitter: float,
    attempts: int,
    rng: random.Random | None = None,
) -> ExponentialDelayRestartStrategy:
    """Flink's constructor argument order (minus the clock)."""
    return ExponentialDelayRestartStrategy(
        ExponentialDelayOptions(initial, maximum, multiplier, reset, jitter, attempts),
        rng=rng or random.Random(0),
    )


# ------------------------------------------------------------------------ fixed-delay


def test_fixed_delay_number_of_restarts() -> None:
    strategy = FixedDelayRestartStrategy(FixedDelayOptions(attempts=3, delay_ms=0))
    for _ in range(3):
        assert strategy.notify_failure(0) is True
        # two calls to canRestart to make sure it does not maintain the counter
        assert strategy.can_restart(0)
        assert strategy.can_restart(0)
    strategy.notify_failure(0)
    assert not strategy.can_restart(0)


def test_fixed_delay_backoff_time() -> None:
    strategy = FixedDelayRestartStrategy(FixedDelayOptions(attempts=1, delay_ms=10_000))
    assert strategy.backoff_time_ms(0) == 10_000


def test_fixed_delay_zero_attempts_never_restarts() -> None:
    strategy = restart_strategy_from_params({"type": "fixed-delay", "fixed-delay.attempts": 0})
    decision = strategy.on_failure(1_700_000_000.0)
    assert (decision.restart, decision.delay_s, decision.attempt) == (False, 0.0, 1)


# ----------------------------------------------------------------------- failure-rate


def test_failure_rate_many_failures_within_rate() -> None:
    interval_ms = 1
    clock = 0
    strategy = FailureRateRestartStrategy(FailureRateOptions(1, interval_ms, 0))
    for _ in range(3):
        strategy.notify_failure(clock)
        assert strategy.can_restart(clock)
        clock += interval_ms + 1
    assert strategy.can_restart(clock)


def test_failure_rate_failures_exceeding_rate() -> None:
    strategy = FailureRateRestartStrategy(FailureRateOptions(3, 10_000, 0))
    for _ in range(3):
        strategy.notify_failure(0)
        assert strategy.can_restart(0)
    strategy.notify_failure(0)
    assert not strategy.can_restart(0)


def test_failure_rate_backoff_time() -> None:
    strategy = FailureRateRestartStrategy(FailureRateOptions(1, 1, 10_000))
    assert strategy.backoff_time_ms(0) == 10_000


def test_failure_rate_interval_boundary_is_inclusive() -> None:
    # canRestart is (now - earliest) > interval: a failure exactly one interval after
    # the earliest kept one still counts against the rate.
    strategy = FailureRateRestartStrategy(FailureRateOptions(1, 1_000, 0))
    strategy.notify_failure(0)
    strategy.notify_failure(1_000)
    assert not strategy.can_restart(1_000)
    strategy.notify_failure(2_001)
    assert strategy.can_restart(2_001)


# ------------------------------------------------------------------ exponential-delay


def test_exponential_max_attempts() -> None:
    max_attempts = 13
    max_backoff = 3
    clock = 0
    strategy = exp(1, max_backoff, 1.2, 10, 0.25, max_attempts)
    for _ in range(max_attempts + 1):
        assert strategy.can_restart(clock)
        assert strategy.notify_failure(clock) is True
        clock += max_backoff + 1
    assert not strategy.can_restart(clock)


def test_exponential_not_call_notify_failure() -> None:
    strategy = exp(42, 45, 2.0, 8, 0, 10)
    with pytest.raises(RuntimeError, match=r"Please call notifyFailure first\."):
        strategy.backoff_time_ms(0)


def test_exponential_initial_backoff() -> None:
    strategy = exp(42, 45, 2.0, 8, 0, INT_MAX)
    strategy.notify_failure(0)
    assert strategy.backoff_time_ms(0) == 42


def test_exponential_max_backoff() -> None:
    strategy = exp(1, 6, 2.0, 8, 0.25, INT_MAX)
    for _ in range(10):
        strategy.notify_failure(0)
        assert strategy.backoff_time_ms(0) <= 6


def test_exponential_reset_backoff() -> None:
    initial, threshold = 1, 8
    clock = 0
    strategy = exp(initial, 5, 2.0, threshold, 0.25, INT_MAX)
    assert strategy.notify_failure(clock)

    clock += threshold + strategy.backoff_time_ms(clock) - 1
    assert strategy.notify_failure(clock)
    assert strategy.backoff_time_ms(clock) == 2, "Backoff should be increased"

    clock += threshold + strategy.backoff_time_ms(clock)
    assert strategy.notify_failure(clock)
    assert strategy.backoff_time_ms(clock) == initial, "Backoff should be reset"


def test_exponential_backoff_multiplier() -> None:
    max_backoff = 300
    clock = 0
    strategy = exp(4, max_backoff, 2.3, INT_MAX_MS, 0, 10)
    for expected in (4, 9, 21):  # 4, 4 * 2.3, 4 * 2.3 * 2.3 (truncated)
        assert strategy.notify_failure(clock)
        assert strategy.backoff_time_ms(clock) == expected
        clock += max_backoff + 1


def _random_range(
    make: Callable[[], ExponentialDelayRestartStrategy],
    clock: list[int],
    advance: int,
    failures: int,
    samples: int = 400,
) -> set[int]:
    """Flink's assertCorrectRandomRangeWithFailureCount: the set of backoffs seen."""
    seen: set[int] = set()
    for _ in range(samples):
        strategy = make()
        for _ in range(failures):
            clock[0] += advance
            assert strategy.notify_failure(clock[0])
        seen.add(strategy.backoff_time_ms(clock[0]))
    return seen


def test_exponential_jitter() -> None:
    rng = random.Random(1)
    clock = [0]

    def make() -> ExponentialDelayRestartStrategy:
        return exp(2, 7, 2.0, INT_MAX_MS, 0.25, INT_MAX, rng)

    assert _random_range(make, clock, 8, 2) == {3, 4, 5}
    assert _random_range(make, clock, 8, 3) == {6, 7}
    assert _random_range(make, clock, 8, 4) == {7}


def test_exponential_jitter_no_higher_than_max() -> None:
    rng = random.Random(2)
    clock = [0]

    def make() -> ExponentialDelayRestartStrategy:
        return exp(1, 7, 2.0, INT_MAX_MS, 1.0, INT_MAX, rng)

    assert _random_range(make, clock, 8, 1) == {1, 2}
    assert _random_range(make, clock, 8, 2) == {1, 2, 3, 4}
    assert _random_range(make, clock, 8, 3) == {1, 2, 3, 4, 5, 6, 7}


def test_exponential_multiple_settings() -> None:
    initial, max_backoff, threshold = 1, 9, 80
    clock = 0
    strategy = exp(initial, max_backoff, 2.0, threshold, 0.25, INT_MAX)

    # initial data
    assert strategy.notify_failure(clock)
    assert strategy.can_restart(clock)
    assert strategy.backoff_time_ms(clock) == initial

    # backoff is initial after the first failure
    clock += threshold + 1
    assert strategy.notify_failure(clock)
    assert strategy.can_restart(clock)
    assert strategy.backoff_time_ms(clock) == initial

    # backoff increases until the threshold is reached
    clock += 4
    assert strategy.notify_failure(clock)
    assert strategy.can_restart(clock)
    assert strategy.backoff_time_ms(clock) == 2

    # backoff is reset after the threshold is reached
    clock += threshold + 9 + 1
    assert strategy.notify_failure(clock)
    assert strategy.can_restart(clock)
    assert strategy.backoff_time_ms(clock) == 1
    clock += max_backoff + 1

    # backoff still increases
    assert strategy.notify_failure(clock)
    assert strategy.can_restart(clock)
    assert strategy.backoff_time_ms(clock) == 2


def _check_merged(
    clock: list[int], expected_backoff: int, strategy: ExponentialDelayRestartStrategy
) -> None:
    """Flink's checkMultipleExceptionsAreMerged."""
    expected_new_attempt = True
    for advance in range(expected_backoff):
        for _ in range(10):
            assert strategy.notify_failure(clock[0]) is expected_new_attempt
            expected_new_attempt = False  # only the first one is a new attempt
            assert strategy.can_restart(clock[0])
            assert strategy.backoff_time_ms(clock[0]) == expected_backoff - advance
        clock[0] += 1


def test_exponential_merge_multiple_exceptions_into_one_attempt() -> None:
    clock = [0]
    initial, multiplier, max_backoff = 2, 2.0, 6
    strategy = exp(initial, max_backoff, multiplier, 80, 0.0, 3)

    backoff = initial
    _check_merged(clock, backoff, strategy)  # all failures at the same time merged

    clock[0] += 1  # a new round: a new attempt
    backoff = int(backoff * multiplier)
    _check_merged(clock, backoff, strategy)

    clock[0] += 1
    backoff = max_backoff
    _check_merged(clock, backoff, strategy)

    clock[0] += 1  # a new round reaching maxAttempts
    assert strategy.notify_failure(clock[0]) is True
    assert not strategy.can_restart(clock[0])


def test_exponential_merging_works_with_resetting() -> None:
    clock = [0]
    initial, multiplier, max_backoff, threshold = 2, 2.0, 6, 80
    strategy = exp(initial, max_backoff, multiplier, threshold, 0.0, 3)
    for _ in range(10):
        backoff = initial
        _check_merged(clock, backoff, strategy)
        clock[0] += 1
        backoff = int(backoff * multiplier)
        _check_merged(clock, backoff, strategy)
        clock[0] += 1
        backoff = max_backoff
        _check_merged(clock, backoff, strategy)
        clock[0] += threshold  # after the threshold the strategy is reset


# ------------------------------------------------------- Java arithmetic, reproduced


class _FixedDraw(random.Random):
    """Returns a fixed jitter draw (clamped to the allowed range)."""

    def __init__(self, draw: int) -> None:
        super().__init__(0)
        self.draw = draw

    def randint(self, a: int, b: int) -> int:
        return max(a, min(self.draw, b))


@pytest.mark.parametrize(("draw", "expected_ms"), [(1, 1_000), (0, 60_000), (-5, 60_000)])
def test_exponential_saturated_backoff_wraps_like_java(draw: int, expected_ms: int) -> None:
    # After ~91 attempts without a reset (defaults), initial * 1.5^k exceeds
    # Long.MAX_VALUE: the cast saturates, and a positive jitter makes the long sum
    # wrap negative, so Flink's max(initial, min(sum, max)) yields initial-backoff.
    strategy = ExponentialDelayRestartStrategy(
        ExponentialDelayOptions(jitter_factor=0.1),
        state={
            "type": "exponential-delay",
            "format": 1,
            "current_restart_attempt": 120,
            "next_restart_timestamp_ms": 0,
        },
        rng=_FixedDraw(draw),
    )
    assert strategy.notify_failure(60_001)
    assert strategy.backoff_time_ms(60_001) == expected_ms


def test_exponential_saturated_backoff_without_jitter_is_max() -> None:
    strategy = ExponentialDelayRestartStrategy(
        ExponentialDelayOptions(jitter_factor=0.0),
        state={
            "type": "exponential-delay",
            "format": 1,
            "current_restart_attempt": 5000,
            "next_restart_timestamp_ms": 0,
        },
    )
    assert strategy.notify_failure(60_001)  # 1.5 ** 5000 overflows a double: inf
    assert strategy.backoff_time_ms(60_001) == 60_000


def test_exponential_jitter_one_after_saturation_does_not_raise() -> None:
    # Java's nextLong(-MAX, MAX + 1) would throw here; we draw from [-MAX, MAX].
    strategy = ExponentialDelayRestartStrategy(
        ExponentialDelayOptions(jitter_factor=1.0),
        state={
            "type": "exponential-delay",
            "format": 1,
            "current_restart_attempt": 200,
            "next_restart_timestamp_ms": 0,
        },
        rng=random.Random(3),
    )
    assert strategy.notify_failure(60_001)
    assert 1_000 <= strategy.backoff_time_ms(60_001) <= 60_000


# ---------------------------------------------------------------- none and the loader


def test_no_restart_strategy() -> None:
    strategy = NoRestartStrategy()
    assert strategy.notify_failure(0) is True
    assert not strategy.can_restart(0)
    assert strategy.backoff_time_ms(0) == 0


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("none", "none"),
        ("off", "none"),
        ("disable", "none"),
        ("NONE", "none"),
        ("fixed-delay", "fixed-delay"),
        ("fixeddelay", "fixed-delay"),
        ("FixedDelay", "fixed-delay"),
        ("failure-rate", "failure-rate"),
        ("failurerate", "failure-rate"),
        ("exponential-delay", "exponential-delay"),
        ("exponentialdelay", "exponential-delay"),
        ("Exponential-Delay", "exponential-delay"),
    ],
)
def test_loader_type_aliases(value: str, name: str) -> None:
    for key in ("type", "restart-strategy.type", "restart-strategy"):
        assert restart_strategy_from_params({key: value}).name == name


def test_loader_default_is_exponential_delay_with_flink_defaults() -> None:
    strategy = restart_strategy_from_params({})
    assert isinstance(strategy, ExponentialDelayRestartStrategy)
    assert strategy.config == ExponentialDelayOptions(
        initial_backoff_ms=1_000,
        max_backoff_ms=60_000,
        backoff_multiplier=1.5,
        reset_backoff_threshold_ms=3_600_000,
        jitter_factor=0.1,
        attempts_before_reset_backoff=2**31 - 1,
    )


def test_loader_defaults_of_each_type() -> None:
    fixed = restart_strategy_from_params({"type": "fixed-delay"})
    assert fixed.options() == {
        "type": "fixed-delay",
        "fixed-delay.attempts": 1,
        "fixed-delay.delay": "1 s",
    }
    rate = restart_strategy_from_params({"type": "failure-rate"})
    assert rate.options() == {
        "type": "failure-rate",
        "failure-rate.max-failures-per-interval": 1,
        "failure-rate.failure-rate-interval": "1 min",
        "failure-rate.delay": "1 s",
    }
