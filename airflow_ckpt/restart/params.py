"""Restart-strategy params (Flink option names) -> validated options -> strategy.

Keys are Flink's ``restart-strategy.*`` option names, with or without the
``restart-strategy.`` prefix: ``type`` (also ``restart-strategy.type`` and Flink's
deprecated ``restart-strategy``), ``fixed-delay.attempts``, ``failure-rate.delay``...
A key whose value is ``None`` counts as not given (its default applies), so a
form can send every field.

* ``type`` is case-insensitive; Flink's aliases are accepted: ``none``/``off``/
  ``disable``, ``fixed-delay``/``fixeddelay``, ``failure-rate``/``failurerate``,
  ``exponential-delay``/``exponentialdelay``.
* No type given -> ``exponential-delay``: Flink 2.x's default when checkpointing is
  enabled (``RestartBackoffTimeStrategyFactoryLoader.getDefaultRestartStrategyFactory``),
  and this package always checkpoints.
* Durations go through :func:`airflow_ckpt.options.parse_duration` (Flink forms
  such as "500 ms", "10 s", "1 min", "1 h"; plain numbers are *seconds* here, not
  Flink's milliseconds) and are then truncated to whole milliseconds, like Flink's
  ``Duration.toMillis()``.
* Integers and floats may also be given as strings ("3", "1.5"), as Flink's
  configuration accepts; ``attempts-before-reset-backoff`` also takes "infinite"
  (Flink's documented default, ``Integer.MAX_VALUE``).

Unknown keys, options of another strategy type, wrong types and out-of-range values
are all reported together in one :class:`~airflow_ckpt.errors.ConfigError`.
"""

from __future__ import annotations

import difflib
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.options import DURATION_FORMS, parse_duration, parse_float, parse_int
from airflow_ckpt.restart._java import INT_MAX, LONG_MAX
from airflow_ckpt.restart.base import RestartStrategy, fmt_ms
from airflow_ckpt.restart.exponential_delay import ExponentialDelayRestartStrategy
from airflow_ckpt.restart.failure_rate import FailureRateRestartStrategy
from airflow_ckpt.restart.fixed_delay import FixedDelayRestartStrategy
from airflow_ckpt.restart.no_restart import NoRestartStrategy
from airflow_ckpt.restart.options import (
    EXPONENTIAL_DELAY,
    FAILURE_RATE,
    FIXED_DELAY,
    NONE,
    ExponentialDelayOptions,
    FailureRateOptions,
    FixedDelayOptions,
    NoRestartOptions,
    StrategyOptions,
)

WHAT = "restart strategy"
PREFIX = "restart-strategy."
TYPE_KEY = "type"
#: Every spelling of the type key: short, full, and Flink's deprecated full key.
TYPE_KEYS: tuple[str, ...] = (TYPE_KEY, PREFIX + TYPE_KEY, "restart-strategy")
DEFAULT_TYPE = EXPONENTIAL_DELAY

#: Accepted ``type`` values (lower case) -> canonical name (Flink's RestartStrategyType).
TYPE_ALIASES: dict[str, str] = {
    "none": NONE,
    "off": NONE,
    "disable": NONE,
    "fixed-delay": FIXED_DELAY,
    "fixeddelay": FIXED_DELAY,
    "failure-rate": FAILURE_RATE,
    "failurerate": FAILURE_RATE,
    "exponential-delay": EXPONENTIAL_DELAY,
    "exponentialdelay": EXPONENTIAL_DELAY,
}

INFINITE = "infinite"


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One ``restart-strategy.<key>`` option: its strategy, field, kind and range."""

    key: str  # without the prefix, e.g. "fixed-delay.attempts"
    strategy: str
    field: str  # the options dataclass field
    kind: str  # "int" | "float" | "duration"
    minimum: float  # int/float: lowest value; duration: lowest number of milliseconds
    maximum: float | None = None  # int/float only
    exclusive_minimum: bool = False  # float only
    infinite: bool = False  # int only: "infinite" means Integer.MAX_VALUE
    description: str = ""

    @property
    def default(self) -> Any:
        """Flink's default, in the normalised form ``RestartStrategy.options()`` uses."""
        value = getattr(_DEFAULTS[self.strategy], self.field)
        return fmt_ms(value) if self.kind == "duration" else value

    def allowed(self) -> str:
        """The accepted values, for error messages."""
        if self.kind == "duration":
            return f"a duration >= {fmt_ms(int(self.minimum))} ({DURATION_FORMS})"
        if self.kind == "int":
            text = f"an integer in [{int(self.minimum)}, {INT_MAX}]"
            return text + ' or "infinite"' if self.infinite else text
        low = f"> {self.minimum}" if self.exclusive_minimum else f">= {self.minimum}"
        high = f" and <= {self.maximum}" if self.maximum is not None else ""
        return f"a number {low}{high}"

    def parse(self, value: Any) -> Any:
        """The validated value (ms for durations); ``ValueError`` names what's allowed."""
        parser: Callable[[Any], Any] = {
            "int": self._parse_int,
            "float": self._parse_float,
            "duration": self._parse_duration,
        }[self.kind]
        try:
            return parser(value)
        except ValueError:
            raise ValueError(f"{value_problem(self)}, got {value!r}") from None

    def _parse_int(self, value: Any) -> int:
        if self.infinite and isinstance(value, str) and value.strip().lower() == INFINITE:
            return INT_MAX
        return parse_int(value, int(self.minimum), INT_MAX)

    def _parse_float(self, value: Any) -> float:
        return parse_float(value, self.minimum, self.maximum,
                           exclusive_minimum=self.exclusive_minimum)

    def _parse_duration(self, value: Any) -> int:
        seconds = parse_duration(value)
        # Duration.toMillis() truncates; the epsilon absorbs binary floating point
        # noise such as 0.29 * 1000 == 289.99999999999997.
        ms = math.floor(seconds * 1000 + 1e-6)
        if not self.minimum <= ms <= LONG_MAX:
            raise ValueError
        return ms


_DEFAULTS: dict[str, Any] = {
    FIXED_DELAY: FixedDelayOptions(),
    FAILURE_RATE: FailureRateOptions(),
    EXPONENTIAL_DELAY: ExponentialDelayOptions(),
}

#: All strategy options, keyed by their name without the prefix.
OPTION_SPECS: dict[str, OptionSpec] = {
    spec.key: spec
    for spec in (
        OptionSpec(
            "fixed-delay.attempts",
            FIXED_DELAY,
            "attempts",
            "int",
            0,
            description="Restarts allowed before the job fails.",
        ),
        OptionSpec(
            "fixed-delay.delay",
            FIXED_DELAY,
            "delay_ms",
            "duration",
            0,
            description="Delay between two consecutive restart attempts.",
        ),
        OptionSpec(
            "failure-rate.max-failures-per-interval",
            FAILURE_RATE,
            "max_failures_per_interval",
            "int",
            1,
            description="Maximum number of restarts in the interval before the job fails.",
        ),
        OptionSpec(
            "failure-rate.failure-rate-interval",
            FAILURE_RATE,
            "failure_rate_interval_ms",
            "duration",
            1,
            description="Time interval for measuring the failure rate.",
        ),
        OptionSpec(
            "failure-rate.delay",
            FAILURE_RATE,
            "delay_ms",
            "duration",
            0,
            description="Delay between two consecutive restart attempts.",
        ),
        OptionSpec(
            "exponential-delay.initial-backoff",
            EXPONENTIAL_DELAY,
            "initial_backoff_ms",
            "duration",
            1,
            description="Starting duration between restarts.",
        ),
        OptionSpec(
            "exponential-delay.max-backoff",
            EXPONENTIAL_DELAY,
            "max_backoff_ms",
            "duration",
            1,
            description="The highest possible duration between restarts.",
        ),
        OptionSpec(
            "exponential-delay.backoff-multiplier",
            EXPONENTIAL_DELAY,
            "backoff_multiplier",
            "float",
            1.0,
            exclusive_minimum=True,
            description="Backoff is multiplied by this after every failure, up to max-backoff.",
        ),
        OptionSpec(
            "exponential-delay.reset-backoff-threshold",
            EXPONENTIAL_DELAY,
            "reset_backoff_threshold_ms",
            "duration",
            1,
            description="How long the job must run without failure to reset the backoff.",
        ),
        OptionSpec(
            "exponential-delay.jitter-factor",
            EXPONENTIAL_DELAY,
            "jitter_factor",
            "float",
            0.0,
            maximum=1.0,
            description="Jitter as a portion of the backoff, added or subtracted at random.",
        ),
        OptionSpec(
            "exponential-delay.attempts-before-reset-backoff",
            EXPONENTIAL_DELAY,
            "attempts_before_reset_backoff",
            "int",
            1,
            infinite=True,
            description="Restart attempts allowed before the backoff is reset; then the job fails.",
        ),
    )
}


def options_of(strategy: str) -> list[str]:
    """Option keys (without prefix) of one canonical strategy type, ``type`` first."""
    return [TYPE_KEY] + [key for key, spec in OPTION_SPECS.items() if spec.strategy == strategy]


def _canonical_key(key: str) -> str | None:
    if key in TYPE_KEYS:
        return TYPE_KEY
    short = key[len(PREFIX) :] if key.startswith(PREFIX) else key
    return short if short in OPTION_SPECS else None


def _unknown_key_problem(key: str, strategy: str | None) -> str:
    if strategy:
        text = f"unknown option; allowed for type {strategy}: {', '.join(options_of(strategy))}"
    else:
        text = f"unknown option; allowed: {', '.join([TYPE_KEY, *OPTION_SPECS])}"
    text += f" (each also with the '{PREFIX}' prefix)"
    short = key[len(PREFIX) :] if key.startswith(PREFIX) else key
    close = difflib.get_close_matches(short, [TYPE_KEY, *OPTION_SPECS], n=1)
    if close:
        text += f"; did you mean {close[0]!r}?"
    return text


def type_problem() -> str:
    """What a bad ``type`` is told (the parser adds ``, got <value>``; the schema uses it
    as is): one text for the trigger form and the operator."""
    return f"expected one of {', '.join(TYPE_ALIASES)} (any case)"


def value_problem(spec: OptionSpec) -> str:
    """What a bad value of ``spec`` is told (the parser adds ``, got <value>``)."""
    return f"expected {spec.allowed()}"


def foreign_option_problem(spec: OptionSpec, strategy: str, type_given: bool) -> str:
    """What an option of another strategy type is told."""
    how = f"type is {strategy}" if type_given else f"type is not set (defaults to {DEFAULT_TYPE})"
    return (f"is an option of the {spec.strategy} strategy, but {how}; "
            f"remove it or set type: {spec.strategy}")


def parse_restart_params(params: Mapping[str, Any] | None) -> StrategyOptions:
    """Validate ``params`` into the frozen options of one strategy type.

    Raises one ``ConfigError("restart strategy", problems)`` naming every bad key.
    ``None`` params mean "all defaults" (exponential-delay).
    """
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise ConfigError(
            WHAT, {"<params>": f"expected a mapping of option -> value, got {params!r}"}
        )

    problems: dict[str, str] = {}
    given: dict[str, tuple[str, Any]] = {}  # canonical key -> (key as given, value)
    for key, value in params.items():
        if not isinstance(key, str):
            problems[repr(key)] = "option names must be strings"
            continue
        canonical = _canonical_key(key.strip())
        if canonical is None:
            problems[key] = ""  # message filled in once the type is known
            continue
        if value is None:
            continue
        if canonical in given:
            first = given[canonical][0]
            message = f"given twice (as {first!r} and {key!r}); give it once"
            problems[first] = problems[key] = message
            continue
        given[canonical] = (key, value)

    # The type.
    strategy: str | None = DEFAULT_TYPE
    type_given = TYPE_KEY in given
    if type_given:
        type_key, raw_type = given.pop(TYPE_KEY)
        resolved = TYPE_ALIASES.get(raw_type.strip().lower()) if isinstance(raw_type, str) else None
        if resolved is None:
            problems.setdefault(type_key, f"{type_problem()}, got {raw_type!r}")
            strategy = None
        else:
            strategy = resolved

    for key, message in list(problems.items()):
        if message == "":
            problems[key] = _unknown_key_problem(key, strategy)

    # The strategy's options.
    values: dict[str, Any] = {}
    for canonical, (key, raw) in given.items():
        spec = OPTION_SPECS[canonical]
        if strategy is not None and spec.strategy != strategy:
            problems.setdefault(key, foreign_option_problem(spec, strategy, type_given))
            continue
        try:
            values[spec.field] = (key, spec.parse(raw))
        except ValueError as exc:
            problems.setdefault(key, str(exc))

    if strategy == EXPONENTIAL_DELAY:
        initial = values.get(
            "initial_backoff_ms", (None, _DEFAULTS[EXPONENTIAL_DELAY].initial_backoff_ms)
        )
        maximum = values.get("max_backoff_ms", (None, _DEFAULTS[EXPONENTIAL_DELAY].max_backoff_ms))
        if initial[1] > maximum[1]:
            message = (
                f"initial-backoff ({fmt_ms(initial[1])}) cannot be higher than "
                f"max-backoff ({fmt_ms(maximum[1])})"
            )
            for key in (initial[0], maximum[0]):
                if key is not None:
                    problems.setdefault(key, message)

    if problems or strategy is None:
        raise ConfigError(WHAT, problems)
    fields = {name: parsed for name, (_, parsed) in values.items()}
    if strategy == NONE:
        return NoRestartOptions()
    if strategy == FIXED_DELAY:
        return FixedDelayOptions(**fields)
    if strategy == FAILURE_RATE:
        return FailureRateOptions(**fields)
    return ExponentialDelayOptions(**fields)


def strategy_from_options(
    options: StrategyOptions,
    state: Mapping[str, Any] | None = None,
    rng: random.Random | int | None = None,
) -> RestartStrategy:
    """Build the strategy for validated ``options``, continuing from ``state``."""
    if isinstance(options, NoRestartOptions):
        return NoRestartStrategy(options, state)
    if isinstance(options, FixedDelayOptions):
        return FixedDelayRestartStrategy(options, state)
    if isinstance(options, FailureRateOptions):
        return FailureRateRestartStrategy(options, state)
    if isinstance(rng, int) and not isinstance(rng, bool):
        rng = random.Random(rng)
    elif rng is not None and not isinstance(rng, random.Random):
        raise TypeError(f"rng must be a random.Random, an int seed or None, got {rng!r}")
    return ExponentialDelayRestartStrategy(options, state, rng)


def restart_strategy_from_params(
    params: Mapping[str, Any] | None,
    state: Mapping[str, Any] | None = None,
    *,
    rng: random.Random | int | None = None,
) -> RestartStrategy:
    """Build a restart strategy from Flink-named ``params``.

    ``state``: a previous ``strategy.state_dict()`` (possibly via JSON) to continue
    the same failure window / backoff; an empty state, or the state of a different
    strategy type, starts fresh; a malformed one raises
    ``ConfigError("restart strategy state", ...)``.

    ``rng``: the jitter source of exponential-delay (a ``random.Random`` or an int
    seed; default: a fresh, OS-seeded ``random.Random``). It is not part of the
    state.

    Raises ``ConfigError("restart strategy", problems)`` naming every bad key.
    """
    return strategy_from_options(parse_restart_params(params), state, rng)
