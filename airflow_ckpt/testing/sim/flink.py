"""A reference model of Flink's restart strategies, written apart from :mod:`airflow_ckpt.restart`.

:func:`expected_decisions` feeds a sequence of failure timestamps (epoch seconds, in the
order the failures were decided) to Flink's rules and returns the decision of each as
``(restart, attempt, delay_ms)``. The rules, from Flink's
``FixedDelayRestartBackoffTimeStrategy``, ``FailureRateRestartBackoffTimeStrategy`` and
``ExponentialDelayRestartBackoffTimeStrategy`` (``jitter-factor`` 0 only: the simulation
needs no random backoff):

* fixed-delay: failure k is restarted while k <= attempts, after ``delay``;
* failure-rate: the newest ``max + 1`` failure times are kept; a failure is refused when
  ``max + 1`` of them lie within ``interval`` (inclusive); attempt = failures in the window;
* exponential-delay: a failure at or before the pending restart's time is merged into
  it; one ``reset-backoff-threshold`` after it the attempt count resets; the backoff is
  ``min(initial * multiplier ** k, max)`` (k attempts so far, at least ``initial``);
  refused once the count exceeds ``attempts-before-reset-backoff``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Decision = tuple[bool, int, int]  # restart, attempt, delay in ms


@dataclass(frozen=True, slots=True)
class FixedDelay:
    attempts: int
    delay_ms: int

    def params(self) -> dict[str, object]:
        return {"type": "fixed-delay", "fixed-delay.attempts": self.attempts,
                "fixed-delay.delay": f"{self.delay_ms} ms"}


@dataclass(frozen=True, slots=True)
class FailureRate:
    max_failures: int
    interval_ms: int
    delay_ms: int

    def params(self) -> dict[str, object]:
        return {"type": "failure-rate",
                "failure-rate.max-failures-per-interval": self.max_failures,
                "failure-rate.failure-rate-interval": f"{self.interval_ms} ms",
                "failure-rate.delay": f"{self.delay_ms} ms"}


@dataclass(frozen=True, slots=True)
class ExponentialDelay:
    initial_ms: int
    max_ms: int
    multiplier: float
    reset_ms: int
    attempts: int

    def params(self) -> dict[str, object]:
        return {"type": "exponential-delay",
                "exponential-delay.initial-backoff": f"{self.initial_ms} ms",
                "exponential-delay.max-backoff": f"{self.max_ms} ms",
                "exponential-delay.backoff-multiplier": self.multiplier,
                "exponential-delay.reset-backoff-threshold": f"{self.reset_ms} ms",
                "exponential-delay.jitter-factor": 0.0,
                "exponential-delay.attempts-before-reset-backoff": self.attempts}


Strategy = FixedDelay | FailureRate | ExponentialDelay


def expected_decisions(strategy: Strategy, failures_s: Sequence[float]) -> list[Decision]:
    """Flink's decision for each failure of ``failures_s`` (see the module doc)."""
    times = [round(t * 1000) for t in failures_s]
    out: list[Decision] = []
    if isinstance(strategy, FixedDelay):
        for k, _ in enumerate(times, start=1):
            ok = k <= strategy.attempts
            out.append((ok, k, strategy.delay_ms if ok else 0))
    elif isinstance(strategy, FailureRate):
        kept: list[int] = []
        for now in times:
            kept = [*kept, now][-(strategy.max_failures + 1):]
            full = len(kept) > strategy.max_failures
            ok = not (full and now - kept[0] <= strategy.interval_ms)
            attempt = sum(1 for t in kept if now - t <= strategy.interval_ms)
            out.append((ok, attempt, strategy.delay_ms if ok else 0))
    else:
        count, pending = 0, -(2 ** 31)
        for now in times:
            if now > pending:
                if now - pending >= strategy.reset_ms:
                    count = 0
                base = int(strategy.initial_ms * strategy.multiplier ** count)
                pending = now + max(strategy.initial_ms, min(base, strategy.max_ms))
                count += 1
            ok = count <= strategy.attempts
            out.append((ok, count, max(0, pending - now) if ok else 0))
    return out
