"""``none`` (also ``off``, ``disable``): Flink's ``NoRestartBackoffTimeStrategy``.

Every failure is final: ``canRestart()`` is always false. ``notifyFailure`` returns
true and the backoff is 0 (never asked for, since no restart happens). The only
state kept is a count of failures, for :attr:`RestartDecision.attempt`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.restart.base import RestartStrategy, check_state_header, state_int
from airflow_ckpt.restart.options import NONE, NoRestartOptions


class NoRestartStrategy(RestartStrategy):
    """Never restart."""

    name = NONE

    def __init__(
        self, options: NoRestartOptions | None = None, state: Mapping[str, Any] | None = None
    ) -> None:
        self.config = options or NoRestartOptions()
        self._failures = 0
        if state is not None and check_state_header(state, self.name):
            problems: dict[str, str] = {}
            self._failures = state_int(state, "failures", problems, 0)
            if problems:
                raise ConfigError("restart strategy state", problems)

    def notify_failure(self, now_ms: int) -> bool:
        self._failures += 1
        return True

    def can_restart(self, now_ms: int) -> bool:
        return False

    def backoff_time_ms(self, now_ms: int) -> int:
        return 0

    def current_attempt(self, now_ms: int) -> int:
        return self._failures

    def _limit_text(self, attempt: int) -> str:
        return f"failure {attempt}; this strategy never restarts"

    def state_dict(self) -> dict[str, Any]:
        return {**self._state_header(), "failures": self._failures}

    def options(self) -> dict[str, Any]:
        return {"type": self.name}

    def describe(self) -> str:
        return self.name
