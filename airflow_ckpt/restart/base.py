"""The restart-strategy contract: ``on_failure(now)`` -> :class:`RestartDecision`.

Each strategy mirrors one Flink ``RestartBackoffTimeStrategy`` and keeps its three
methods (in integer epoch milliseconds, like Flink's clock):

* :meth:`RestartStrategy.notify_failure` records a failure and returns whether it
  starts a new attempt (``false`` only for exponential-delay, which merges failures
  that arrive while a restart is still pending);
* :meth:`RestartStrategy.can_restart` says whether the job may be restarted;
* :meth:`RestartStrategy.backoff_time_ms` says how long to wait before restarting.

:meth:`RestartStrategy.on_failure` runs them in the order Flink's
``ExecutionFailureHandler.handleFailure`` does — ``notifyFailure`` -> ``canRestart``
-> ``getBackoffTime`` (the latter only when a restart is allowed) — all at the same
instant ``now`` (the failure timestamp).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.options import format_duration
from airflow_ckpt.restart.options import STRATEGY_TYPES

STATE_FORMAT = 1


@dataclass(frozen=True, slots=True)
class RestartDecision:
    """What to do about one failure.

    ``restart``: whether the job may be restarted (Flink's ``canRestart()``).

    ``delay_s``: seconds to wait before restarting (Flink's ``getBackoffTime()``, a
    whole number of milliseconds); ``0.0`` when ``restart`` is false.

    ``attempt``: the count the strategy's limit is checked against, after
    recording this failure (1-based):

    * ``fixed-delay``: failures so far; restart while ``attempt <= attempts``;
    * ``failure-rate``: failures within the last ``failure-rate-interval`` (among
      the ones Flink keeps); restart while ``attempt <= max-failures-per-interval``;
    * ``exponential-delay``: restart attempts since the backoff was last reset;
      merged failures repeat the current attempt; restart while
      ``attempt <= attempts-before-reset-backoff``;
    * ``none``: failures so far.

    ``new_attempt``: Flink's ``notifyFailure`` result — false when this failure was
    merged into a restart that is still pending (exponential-delay only); such a
    failure must not trigger a second restart.

    ``reason``: one human-readable sentence explaining the decision.
    """

    restart: bool
    delay_s: float
    attempt: int
    new_attempt: bool = True
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for history events and XCom)."""
        return {
            "restart": self.restart,
            "delay_s": self.delay_s,
            "attempt": self.attempt,
            "new_attempt": self.new_attempt,
            "reason": self.reason,
        }


def epoch_ms(now: float) -> int:
    """``now`` (epoch seconds) as whole epoch milliseconds, Flink's clock unit.

    Rounds to the nearest millisecond (so ``1.001`` is 1001 ms despite binary
    floating point). Raises ``ValueError`` for NaN, infinities, negatives and bools.
    """
    if isinstance(now, bool) or not isinstance(now, int | float):
        raise ValueError(f"now must be epoch seconds (a number), got {now!r}")
    if not math.isfinite(now) or now < 0:
        raise ValueError(f"now must be finite epoch seconds >= 0, got {now!r}")
    return round(now * 1000)


def fmt_ms(ms: int) -> str:
    """A millisecond duration in Flink's notation ("500 ms", "10 s", "1 min")."""
    return format_duration(ms / 1000)


class RestartStrategy(ABC):
    """A Flink restart strategy with JSON-serialisable state.

    Build one with :func:`airflow_ckpt.restart.restart_strategy_from_params`. Not
    thread-safe: one strategy per job, fed failures in timestamp order.
    """

    #: canonical type: "none" | "fixed-delay" | "failure-rate" | "exponential-delay"
    name: ClassVar[str]

    # ----------------------------------------------------------------- Flink's API

    @abstractmethod
    def notify_failure(self, now_ms: int) -> bool:
        """Flink ``notifyFailure``: record a failure at ``now_ms``; is it a new attempt?"""

    @abstractmethod
    def can_restart(self, now_ms: int) -> bool:
        """Flink ``canRestart`` evaluated at ``now_ms``."""

    @abstractmethod
    def backoff_time_ms(self, now_ms: int) -> int:
        """Flink ``getBackoffTime`` evaluated at ``now_ms`` (milliseconds)."""

    @abstractmethod
    def current_attempt(self, now_ms: int) -> int:
        """The :attr:`RestartDecision.attempt` count at ``now_ms``."""

    # ------------------------------------------------------------- this package's API

    def on_failure(self, now: float) -> RestartDecision:
        """Record a failure that happened at ``now`` (epoch seconds) and decide.

        Same sequence as Flink: notifyFailure -> canRestart -> getBackoffTime.
        The state changes even when the answer is "no restart".
        """
        now_ms = epoch_ms(now)
        new_attempt = self.notify_failure(now_ms)
        attempt = self.current_attempt(now_ms)
        if self.can_restart(now_ms):
            delay_ms = self.backoff_time_ms(now_ms)
            reason = f"restart in {fmt_ms(delay_ms)} ({self._limit_text(attempt)})"
            if not new_attempt:
                reason += "; failure merged into the pending restart"
            return RestartDecision(True, delay_ms / 1000, attempt, new_attempt, reason)
        reason = f"recovery is suppressed by {self.describe()} ({self._limit_text(attempt)})"
        return RestartDecision(False, 0.0, attempt, new_attempt, reason)

    @abstractmethod
    def _limit_text(self, attempt: int) -> str:
        """Short text relating ``attempt`` to the strategy's limit."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state; pass it back as ``state=`` to continue."""

    @abstractmethod
    def options(self) -> dict[str, Any]:
        """Canonical Flink option names (without ``restart-strategy.``) -> values.

        Includes ``type`` and every option of the strategy (defaults filled in);
        durations are rendered in Flink notation. Feeding the result back to
        ``restart_strategy_from_params`` gives an equivalent strategy.
        """

    @abstractmethod
    def describe(self) -> str:
        """One line naming the type and every option value.

        E.g. ``failure-rate(max-failures-per-interval=3, failure-rate-interval=5 min,
        delay=10 s)``.
        """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()} state={self.state_dict()}>"

    # ------------------------------------------------------------------ state helpers

    def _state_header(self) -> dict[str, Any]:
        return {"type": self.name, "format": STATE_FORMAT}


def state_int(state: Mapping[str, Any], key: str, problems: dict[str, str], minimum: int) -> int:
    """Read an integer field of a saved state, recording a problem if it is bad."""
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        problems[key] = f"expected an integer >= {minimum}, got {value!r}"
        return minimum
    return value


def check_state_header(state: Mapping[str, Any], name: str) -> bool:
    """Validate the common header; False means "start fresh".

    An empty state, or the state of another strategy type (the restart strategy was
    changed between runs), starts fresh.

    Raises ``ConfigError("restart strategy state", ...)`` for a malformed state.
    """
    if not isinstance(state, Mapping):
        raise ConfigError(
            "restart strategy state", {"<state>": f"expected a mapping, got {state!r}"}
        )
    if not state:
        return False
    kind = state.get("type")
    if kind not in STRATEGY_TYPES:
        raise ConfigError(
            "restart strategy state",
            {"type": f"expected one of {', '.join(STRATEGY_TYPES)}, got {kind!r}"},
        )
    if kind != name:
        return False
    if state.get("format") != STATE_FORMAT:
        raise ConfigError(
            "restart strategy state",
            {"format": f"unsupported format {state.get('format')!r}; expected {STATE_FORMAT}"},
        )
    return True
