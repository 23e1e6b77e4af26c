"""``fixed-delay``: Flink's ``FixedDelayRestartBackoffTimeStrategy``.

``notifyFailure`` increments ``currentRestartAttempt`` (and always returns true);
``canRestart`` is ``currentRestartAttempt <= attempts``; the backoff is always
``delay``. So with ``attempts = N`` the first N failures are restarted and
failure N+1 fails the job. The counter never resets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.restart.base import RestartStrategy, check_state_header, fmt_ms, state_int
from airflow_ckpt.restart.options import FIXED_DELAY, FixedDelayOptions


class FixedDelayRestartStrategy(RestartStrategy):
    """Restart at most ``attempts`` times, waiting ``delay`` each time."""

    name = FIXED_DELAY

    def __init__(self, options: FixedDelayOptions, state: Mapping[str, Any] | None = None) -> None:
        self.config = options
        self._current_restart_attempt = 0
        if state is not None and check_state_header(state, self.name):
            problems: dict[str, str] = {}
            self._current_restart_attempt = state_int(state, "current_restart_attempt", problems, 0)
            if problems:
                raise ConfigError("restart strategy state", problems)

    def notify_failure(self, now_ms: int) -> bool:
        self._current_restart_attempt += 1
        return True

    def can_restart(self, now_ms: int) -> bool:
        return self._current_restart_attempt <= self.config.attempts

    def backoff_time_ms(self, now_ms: int) -> int:
        return self.config.delay_ms

    def current_attempt(self, now_ms: int) -> int:
        return self._current_restart_attempt

    def _limit_text(self, attempt: int) -> str:
        return f"failure {attempt}, at most {self.config.attempts} restarts"

    def state_dict(self) -> dict[str, Any]:
        return {**self._state_header(), "current_restart_attempt": self._current_restart_attempt}

    def options(self) -> dict[str, Any]:
        return {
            "type": self.name,
            "fixed-delay.attempts": self.config.attempts,
            "fixed-delay.delay": fmt_ms(self.config.delay_ms),
        }

    def describe(self) -> str:
        c = self.config
        return f"{self.name}(attempts={c.attempts}, delay={fmt_ms(c.delay_ms)})"
