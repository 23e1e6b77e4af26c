"""The checkpoint-progress health rule (Flink Kubernetes operator's ``checkpoint-progress``).

Pure and Airflow-free: the supervisor (trigger), the :class:`CheckpointSensor` and the UI
apply the same rule. A job whose last completed checkpoint is older than ``multiple``
checkpoint intervals is ``stale``; ``unknown`` when there is no completed checkpoint yet
(or no interval is configured) to judge by.
"""

from __future__ import annotations

from typing import Literal

Progress = Literal["ok", "stale", "unknown"]

#: default multiple of the checkpoint interval after which progress counts as stalled
DEFAULT_MULTIPLE = 3.0


def checkpoint_progress(
    last_completed_ts: float | None, interval_s: float, now: float,
    multiple: float = DEFAULT_MULTIPLE,
) -> Progress:
    """``ok`` / ``stale`` / ``unknown`` for a job's checkpoint progress at ``now``.

    ``last_completed_ts`` and ``now`` must come from the same clock (the manifest's
    completion time is the driver's wall clock; callers compare it with their own, so
    the rule tolerates clock skew up to the slack ``multiple * interval_s`` leaves).
    """
    if multiple <= 0:
        raise ValueError(f"multiple must be positive, got {multiple!r}")
    if last_completed_ts is None or interval_s <= 0:
        return "unknown"
    return "stale" if now - last_completed_ts > multiple * interval_s else "ok"
