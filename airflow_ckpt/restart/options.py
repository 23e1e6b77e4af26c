"""Validated option values of each restart strategy, frozen, with Flink 2.x defaults.

Defaults and ranges come from Flink 2.x:

* defaults: ``flink-core/src/main/java/org/apache/flink/configuration/RestartStrategyOptions.java``
  (the ``restart-strategy.*`` ``ConfigOption`` definitions);
* ranges: the ``checkArgument`` preconditions in the constructors of
  ``flink-runtime/src/main/java/org/apache/flink/runtime/executiongraph/failover/
  {FixedDelay,FailureRate,ExponentialDelay}RestartBackoffTimeStrategy.java``.

Durations are whole milliseconds, as in Flink (``Duration.toMillis()``); the
constructors raise ``ValueError`` exactly where Flink's preconditions throw
``IllegalArgumentException``. User-facing validation (one ``ConfigError`` naming
every bad key) happens earlier, in :mod:`airflow_ckpt.restart.params`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from airflow_ckpt.restart._java import INT_MAX, LONG_MAX

# Canonical strategy names (Flink's RestartStrategyType main values, except that
# NO_RESTART_STRATEGY, whose main value is "disable", is called "none" here).
NONE = "none"
FIXED_DELAY = "fixed-delay"
FAILURE_RATE = "failure-rate"
EXPONENTIAL_DELAY = "exponential-delay"
STRATEGY_TYPES: tuple[str, ...] = (NONE, FIXED_DELAY, FAILURE_RATE, EXPONENTIAL_DELAY)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _check_ms(value: int, minimum: int, what: str) -> None:
    _check(
        isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= LONG_MAX,
        f"{what} must be an integer number of milliseconds >= {minimum}, got {value!r}",
    )


def _check_int(value: int, minimum: int, what: str) -> None:
    _check(
        isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= INT_MAX,
        f"{what} must be an integer in [{minimum}, {INT_MAX}], got {value!r}",
    )


@dataclass(frozen=True, slots=True)
class NoRestartOptions:
    """``restart-strategy.type: none`` (also ``off``, ``disable``): never restart."""

    type: ClassVar[str] = NONE


@dataclass(frozen=True, slots=True)
class FixedDelayOptions:
    """``restart-strategy.type: fixed-delay``.

    ``attempts``: restarts allowed before the job fails (Flink default 1, >= 0).
    ``delay_ms``: wait before each restart (Flink default 1 s, >= 0).
    """

    type: ClassVar[str] = FIXED_DELAY

    attempts: int = 1
    delay_ms: int = 1_000

    def __post_init__(self) -> None:
        _check_int(self.attempts, 0, "Maximum number of restart attempts")
        _check_ms(self.delay_ms, 0, "Backoff time between restart attempts")


@dataclass(frozen=True, slots=True)
class FailureRateOptions:
    """``restart-strategy.type: failure-rate``.

    ``max_failures_per_interval``: restarts allowed within one interval (default 1, > 0).
    ``failure_rate_interval_ms``: the interval (default 1 min, > 0 ms).
    ``delay_ms``: wait before each restart (default 1 s, >= 0).
    """

    type: ClassVar[str] = FAILURE_RATE

    max_failures_per_interval: int = 1
    failure_rate_interval_ms: int = 60_000
    delay_ms: int = 1_000

    def __post_init__(self) -> None:
        _check_int(
            self.max_failures_per_interval, 1, "Maximum number of restart attempts per time unit"
        )
        _check_ms(self.failure_rate_interval_ms, 1, "Failures interval")
        _check_ms(self.delay_ms, 0, "Backoff time")


@dataclass(frozen=True, slots=True)
class ExponentialDelayOptions:
    """``restart-strategy.type: exponential-delay`` (Flink 2.x's default with checkpointing).

    ``initial_backoff_ms`` (default 1 s, >= 1 ms) grows by ``backoff_multiplier``
    (default 1.5, > 1) per attempt up to ``max_backoff_ms`` (default 1 min, >= 1 ms,
    >= initial); ``jitter_factor`` (default 0.1, in [0, 1]) randomises it;
    ``reset_backoff_threshold_ms`` (default 1 h, >= 1 ms) of failure-free running
    resets it; ``attempts_before_reset_backoff`` (default Integer.MAX_VALUE, i.e.
    "infinite", >= 1) bounds the attempts between resets.
    """

    type: ClassVar[str] = EXPONENTIAL_DELAY

    initial_backoff_ms: int = 1_000
    max_backoff_ms: int = 60_000
    backoff_multiplier: float = 1.5
    reset_backoff_threshold_ms: int = 3_600_000
    jitter_factor: float = 0.1
    attempts_before_reset_backoff: int = INT_MAX

    def __post_init__(self) -> None:
        _check_ms(self.initial_backoff_ms, 1, "Initial backoff")
        _check_ms(self.max_backoff_ms, 1, "Maximum backoff")
        _check(
            self.initial_backoff_ms <= self.max_backoff_ms,
            "Initial backoff cannot be higher than maximum backoff.",
        )
        _check(
            isinstance(self.backoff_multiplier, float | int)
            and not isinstance(self.backoff_multiplier, bool)
            and 1 < self.backoff_multiplier < float("inf"),
            "Backoff multiplier must be a finite number greater than 1, "
            f"got {self.backoff_multiplier!r}",
        )
        _check_ms(
            self.reset_backoff_threshold_ms, 1, "Threshold duration for exponential backoff reset"
        )
        _check(
            isinstance(self.jitter_factor, float | int)
            and not isinstance(self.jitter_factor, bool)
            and 0 <= self.jitter_factor <= 1,
            f"Jitter factor must be >= 0 and <= 1, got {self.jitter_factor!r}",
        )
        _check_int(self.attempts_before_reset_backoff, 1, "The attemptsBeforeResetBackoff")


StrategyOptions = (
    NoRestartOptions | FixedDelayOptions | FailureRateOptions | ExponentialDelayOptions
)
