"""``failure-rate``: Flink's ``FailureRateRestartBackoffTimeStrategy``.

Flink keeps the timestamps of the most recent ``max-failures-per-interval + 1``
failures in a queue. ``notifyFailure`` drops the oldest one when the queue is
"full" (holds more than ``max-failures-per-interval``) and appends the new one;
``canRestart`` is true unless the queue is full *and* ``now - oldest <=
failure-rate-interval``. In words: the job fails once more than
``max-failures-per-interval`` failures fall within one interval (both ends
inclusive); otherwise it restarts after ``delay``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.restart._java import LONG_MAX, LONG_MIN, long_sub
from airflow_ckpt.restart.base import RestartStrategy, check_state_header, fmt_ms
from airflow_ckpt.restart.options import FAILURE_RATE, FailureRateOptions


class FailureRateRestartStrategy(RestartStrategy):
    """Restart unless more than N failures happened within the interval."""

    name = FAILURE_RATE

    def __init__(self, options: FailureRateOptions, state: Mapping[str, Any] | None = None) -> None:
        self.config = options
        self._failure_timestamps: deque[int] = deque()
        if state is not None and check_state_header(state, self.name):
            stamps = state.get("failure_timestamps_ms")
            if not isinstance(stamps, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and LONG_MIN <= t <= LONG_MAX
                for t in stamps
            ):
                raise ConfigError(
                    "restart strategy state",
                    {"failure_timestamps_ms": f"expected a list of epoch ms, got {stamps!r}"},
                )
            # Flink's queue never holds more than max + 1 entries; if the limit was
            # lowered since the state was saved, keep the newest ones.
            self._failure_timestamps.extend(stamps[-(options.max_failures_per_interval + 1) :])

    def _is_failure_timestamps_queue_full(self) -> bool:
        return len(self._failure_timestamps) > self.config.max_failures_per_interval

    def notify_failure(self, now_ms: int) -> bool:
        if self._is_failure_timestamps_queue_full():
            self._failure_timestamps.popleft()
        self._failure_timestamps.append(now_ms)
        return True

    def can_restart(self, now_ms: int) -> bool:
        if self._is_failure_timestamps_queue_full():
            earliest = self._failure_timestamps[0]
            return long_sub(now_ms, earliest) > self.config.failure_rate_interval_ms
        return True

    def backoff_time_ms(self, now_ms: int) -> int:
        return self.config.delay_ms

    def current_attempt(self, now_ms: int) -> int:
        interval = self.config.failure_rate_interval_ms
        return sum(1 for t in self._failure_timestamps if long_sub(now_ms, t) <= interval)

    def _limit_text(self, attempt: int) -> str:
        c = self.config
        return (
            f"{attempt} failure(s) within {fmt_ms(c.failure_rate_interval_ms)}, "
            f"at most {c.max_failures_per_interval} allowed"
        )

    def state_dict(self) -> dict[str, Any]:
        return {**self._state_header(), "failure_timestamps_ms": list(self._failure_timestamps)}

    def options(self) -> dict[str, Any]:
        c = self.config
        return {
            "type": self.name,
            "failure-rate.max-failures-per-interval": c.max_failures_per_interval,
            "failure-rate.failure-rate-interval": fmt_ms(c.failure_rate_interval_ms),
            "failure-rate.delay": fmt_ms(c.delay_ms),
        }

    def describe(self) -> str:
        c = self.config
        return (
            f"{self.name}(max-failures-per-interval={c.max_failures_per_interval}, "
            f"failure-rate-interval={fmt_ms(c.failure_rate_interval_ms)}, "
            f"delay={fmt_ms(c.delay_ms)})"
        )
