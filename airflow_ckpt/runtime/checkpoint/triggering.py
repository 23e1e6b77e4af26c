"""When the next periodic checkpoint is due (Flink's ``CheckpointRequestDecider`` and
the coordinator's interval and min-pause bookkeeping), and the next periodic savepoint
(the Flink Kubernetes operator's ``periodic.savepoint.interval``)."""

from __future__ import annotations

from collections.abc import Callable

from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.checkpoint.snapshot import latest_batch
from airflow_ckpt.runtime.workdir import Workdir


class PeriodicTrigger:
    """Decides whether a periodic checkpoint is due: ``interval`` after the last
    trigger, ``min-pause`` after the last completion, fewer than ``max-concurrent``
    pending, and a batch newer than the last checkpointed one (otherwise the last
    checkpoint's state is still current). Not thread-safe: the coordinator calls it
    under its lock."""

    def __init__(self, config: CheckpointConfig, workdir: Workdir, clock: Callable[[], float],
                 last_checkpointed_batch: int | None) -> None:
        self.config = config
        self.workdir = workdir
        #: Flink's injected ``Clock``, for the interval and the min-pause
        self.clock = clock
        self._last_batch = last_checkpointed_batch
        self._last_trigger = clock()
        self._last_completion = float("-inf")

    def due(self, pending: int) -> bool:
        """Whether a periodic checkpoint is due now, with ``pending`` checkpoints
        pending."""
        cfg, now = self.config, self.clock()
        if now - self._last_trigger < cfg.interval_s:
            return False
        if now - self._last_completion < cfg.min_pause_s:
            return False
        if pending >= cfg.max_concurrent:
            return False
        committed = latest_batch(self.workdir, "commits")
        offered = latest_batch(self.workdir, "offsets")
        newest = max(b for b in (committed, offered, -1) if b is not None)
        return self._last_batch is None or newest > self._last_batch

    def triggered(self) -> None:
        """A checkpoint or savepoint was triggered: the interval starts again."""
        self._last_trigger = self.clock()

    def completed(self, checkpointed_batch: int | None) -> None:
        """A checkpoint (at ``checkpointed_batch``) or a savepoint (None) completed: the
        min-pause starts again."""
        if checkpointed_batch is not None:
            self._last_batch = max(checkpointed_batch, self._last_batch or -1)
        self._last_completion = self.clock()


class PeriodicSavepointTrigger:
    """Decides whether a periodic savepoint is due: ``interval_s`` (> 0) after the
    driver's coordinator started or its last periodic savepoint was triggered, on this
    driver's own clock. The Flink operator compares the last savepoint's timestamp
    with its clock; here no time written by another host is read, so a new driver
    starts a fresh interval (a job resubmitted more often than the interval takes no
    periodic savepoint: the interval is a rate, never a promise). Not thread-safe: the
    coordinator calls it under its lock."""

    def __init__(self, interval_s: float, clock: Callable[[], float]) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._last_trigger = clock()

    def fire(self) -> bool:
        """Whether a periodic savepoint is due now; if so, the interval starts again
        (the caller triggers it)."""
        if self.interval_s <= 0:
            return False
        now = self.clock()
        if now - self._last_trigger < self.interval_s:
            return False
        self._last_trigger = now
        return True
