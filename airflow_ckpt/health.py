"""The checkpoint-progress health rule (Flink Kubernetes operator's ``checkpoint-progress``).

Pure and Airflow-free: the supervisor (trigger), the :class:`CheckpointSensor` and the UI
apply the same rule. A job whose driver is alive and whose last completed checkpoint is
more than ``multiple`` checkpoint intervals old is not making recoverable progress (a
restart would replay all of it): ``stale``. ``unknown`` when there is nothing to judge by.
"""

from __future__ import annotations

from typing import Literal

Progress = Literal["ok", "stale", "unknown"]

#: default multiple of the checkpoint interval after which progress counts as stalled
DEFAULT_MULTIPLE = 3.0


def checkpoint_age_s(last_completed_ts: float | None, since_ts: float | None,
                     now: float) -> float | None:
    """Seconds since the last completed checkpoint, else since ``since_ts`` (the job's
    start), else None. Never negative (clocks of different hosts may disagree)."""
    ref = last_completed_ts if last_completed_ts is not None else since_ts
    return None if ref is None else max(0.0, now - ref)


def checkpoint_progress(
    last_completed_ts: float | None,
    interval_s: float | None,
    now: float,
    multiple: float = DEFAULT_MULTIPLE,
    *,
    since_ts: float | None = None,
) -> Progress:
    """``ok`` / ``stale`` / ``unknown`` for a job's checkpoint progress at ``now``.

    The reference is the last completion or, before the first one, ``since_ts`` (the
    job's start). No reference or no interval: ``unknown``. Times are epoch seconds;
    ``last_completed_ts`` is the driver's wall clock, so the rule tolerates clock skew up
    to the slack ``multiple * interval_s`` leaves. Apply it only while the driver is
    alive: a dead or finished driver takes no checkpoints by design.
    """
    if multiple <= 0:
        raise ValueError(f"multiple must be positive, got {multiple!r}")
    age = checkpoint_age_s(last_completed_ts, since_ts, now)
    if age is None or not interval_s or interval_s <= 0:
        return "unknown"
    return "stale" if age > multiple * interval_s else "ok"


def checkpoints_stale(
    last_completed_ts: float | None,
    interval_s: float | None,
    now: float,
    multiple: float = DEFAULT_MULTIPLE,
    *,
    since_ts: float | None = None,
) -> bool:
    """:func:`checkpoint_progress` is ``stale`` (a non-positive ``multiple``: never)."""
    return multiple > 0 and checkpoint_progress(
        last_completed_ts, interval_s, now, multiple, since_ts=since_ts) == "stale"
