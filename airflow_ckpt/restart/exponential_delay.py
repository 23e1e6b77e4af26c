"""``exponential-delay``: Flink's ``ExponentialDelayRestartBackoffTimeStrategy``.

State: ``currentRestartAttempt`` and ``nextRestartTimestamp`` (initially
``Integer.MIN_VALUE``). On a failure at ``now`` (``notifyFailure``):

1. if ``now <= nextRestartTimestamp`` the failure arrived while a restart is still
   pending: it is merged into that attempt — nothing changes, result ``false``;
2. else if ``now - nextRestartTimestamp >= reset-backoff-threshold`` (the job ran
   that long since its last restart), ``currentRestartAttempt`` resets to 0;
3. ``nextRestartTimestamp = now + backoff`` where, with ``k`` the attempt count
   before this failure::

       base    = (long) (initial-backoff * Math.pow(backoff-multiplier, k))
       offset  = (long) (base * jitter-factor)
       jitter  = jitter-factor == 0 ? 0 : uniform integer in [-offset, offset]
       backoff = max(initial-backoff, min(base + jitter, max-backoff))

4. ``currentRestartAttempt += 1``; result ``true``.

``canRestart`` is ``currentRestartAttempt <= attempts-before-reset-backoff`` and
``getBackoffTime`` is ``max(0, nextRestartTimestamp - now)`` — for a merged failure
that is the time left until the pending restart.

Java quirk reproduced: ``base`` saturates at ``Long.MAX_VALUE`` once the power
overflows (about 91 attempts without a reset at the defaults) and ``base + jitter``
then wraps to a negative number for any positive jitter, so Flink's backoff drops
to ``initial-backoff`` for those draws. One deliberate difference: where Java's
``nextLong(-offset, offset + 1)`` would throw (``offset == Long.MAX_VALUE``, only
possible with ``jitter-factor = 1`` after saturation) the draw is still made from
``[-offset, offset]``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.restart._java import (
    INT_MAX,
    INT_MIN,
    LONG_MAX,
    LONG_MIN,
    double_to_long,
    long_add,
    long_sub,
    pow_,
)
from airflow_ckpt.restart.base import RestartStrategy, check_state_header, fmt_ms, state_int
from airflow_ckpt.restart.options import EXPONENTIAL_DELAY, ExponentialDelayOptions

#: Flink's DEFAULT_NEXT_RESTART_TIMESTAMP (a long holding Integer.MIN_VALUE).
DEFAULT_NEXT_RESTART_TIMESTAMP = INT_MIN


class ExponentialDelayRestartStrategy(RestartStrategy):
    """Exponentially growing, jittered backoff with reset after a quiet period."""

    name = EXPONENTIAL_DELAY

    def __init__(
        self,
        options: ExponentialDelayOptions,
        state: Mapping[str, Any] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = options
        self._rng = rng if rng is not None else random.Random()
        self._current_restart_attempt = 0
        self._next_restart_timestamp = DEFAULT_NEXT_RESTART_TIMESTAMP
        if state is not None and check_state_header(state, self.name):
            problems: dict[str, str] = {}
            self._current_restart_attempt = state_int(state, "current_restart_attempt", problems, 0)
            nxt = state.get("next_restart_timestamp_ms")
            if isinstance(nxt, bool) or not isinstance(nxt, int) or not LONG_MIN <= nxt <= LONG_MAX:
                problems["next_restart_timestamp_ms"] = f"expected epoch milliseconds, got {nxt!r}"
            else:
                self._next_restart_timestamp = nxt
            if problems:
                raise ConfigError("restart strategy state", problems)

    # ----------------------------------------------------------------- Flink's API

    def can_restart(self, now_ms: int) -> bool:
        return self._current_restart_attempt <= self.config.attempts_before_reset_backoff

    def backoff_time_ms(self, now_ms: int) -> int:
        if self._next_restart_timestamp == DEFAULT_NEXT_RESTART_TIMESTAMP:
            raise RuntimeError("Please call notifyFailure first.")
        return max(0, long_sub(self._next_restart_timestamp, now_ms))

    def notify_failure(self, now_ms: int) -> bool:
        # Merge multiple failures into one attempt while a restart is pending.
        if now_ms <= self._next_restart_timestamp:
            return False
        if long_sub(now_ms, self._next_restart_timestamp) >= self.config.reset_backoff_threshold_ms:
            self._current_restart_attempt = 0
        self._next_restart_timestamp = long_add(now_ms, self._calculate_actual_backoff_time())
        self._current_restart_attempt += 1
        return True

    def _calculate_actual_backoff_time(self) -> int:
        c = self.config
        current_backoff = double_to_long(
            c.initial_backoff_ms * pow_(c.backoff_multiplier, self._current_restart_attempt)
        )
        jittered = long_add(current_backoff, self._calculate_jitter_backoff_ms(current_backoff))
        return max(c.initial_backoff_ms, min(jittered, c.max_backoff_ms))

    def _calculate_jitter_backoff_ms(self, current_backoff_ms: int) -> int:
        if self.config.jitter_factor == 0:
            return 0
        offset = double_to_long(current_backoff_ms * self.config.jitter_factor)
        return self._rng.randint(-offset, offset)

    # ------------------------------------------------------------- this package's API

    def current_attempt(self, now_ms: int) -> int:
        return self._current_restart_attempt

    def _limit_text(self, attempt: int) -> str:
        limit = self.config.attempts_before_reset_backoff
        bound = "unlimited attempts" if limit == INT_MAX else f"at most {limit} attempts"
        return f"attempt {attempt} since the backoff was reset, {bound}"

    def state_dict(self) -> dict[str, Any]:
        return {
            **self._state_header(),
            "current_restart_attempt": self._current_restart_attempt,
            "next_restart_timestamp_ms": self._next_restart_timestamp,
        }

    def options(self) -> dict[str, Any]:
        c = self.config
        return {
            "type": self.name,
            "exponential-delay.initial-backoff": fmt_ms(c.initial_backoff_ms),
            "exponential-delay.max-backoff": fmt_ms(c.max_backoff_ms),
            "exponential-delay.backoff-multiplier": c.backoff_multiplier,
            "exponential-delay.reset-backoff-threshold": fmt_ms(c.reset_backoff_threshold_ms),
            "exponential-delay.jitter-factor": c.jitter_factor,
            "exponential-delay.attempts-before-reset-backoff": c.attempts_before_reset_backoff,
        }

    def describe(self) -> str:
        c = self.config
        attempts = (
            "infinite"
            if c.attempts_before_reset_backoff == INT_MAX
            else c.attempts_before_reset_backoff
        )
        return (
            f"{self.name}(initial-backoff={fmt_ms(c.initial_backoff_ms)}, "
            f"max-backoff={fmt_ms(c.max_backoff_ms)}, "
            f"backoff-multiplier={c.backoff_multiplier}, "
            f"reset-backoff-threshold={fmt_ms(c.reset_backoff_threshold_ms)}, "
            f"jitter-factor={c.jitter_factor}, "
            f"attempts-before-reset-backoff={attempts})"
        )
