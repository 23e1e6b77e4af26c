"""Pure job-health rules shared by the UI plugin and the supervisor (no I/O, no Airflow).

``checkpoints_stale`` is Flink-free on purpose: Flink has no such alarm, but a streaming
job whose driver is alive and whose last completed checkpoint is several checkpoint
intervals old is not making recoverable progress (a restart would replay all of it).
"""

from __future__ import annotations

#: A checkpoint is overdue after this many checkpoint intervals without a completion.
DEFAULT_STALE_MULTIPLE = 3.0


def checkpoint_age_s(last_completed_ts: float | None, since_ts: float | None,
                     now: float) -> float | None:
    """Seconds since the last completed checkpoint, else since ``since_ts`` (the job's
    start), else None. Never negative (clocks of different hosts may disagree)."""
    ref = last_completed_ts if last_completed_ts is not None else since_ts
    return None if ref is None else max(0.0, now - ref)


def checkpoints_stale(
    last_completed_ts: float | None,
    interval_s: float | None,
    now: float,
    multiple: float = DEFAULT_STALE_MULTIPLE,
    *,
    since_ts: float | None = None,
) -> bool:
    """Whether checkpoints are overdue: the last completion (or, before the first one,
    ``since_ts``, the job's start) is more than ``multiple`` x ``interval_s`` seconds
    before ``now``. Unknown interval or reference time: not stale (nothing to judge by).

    All times are epoch seconds. Apply it only while the driver is alive: a dead or
    finished driver takes no checkpoints by design.
    """
    if not interval_s or interval_s <= 0 or multiple <= 0:
        return False
    age = checkpoint_age_s(last_completed_ts, since_ts, now)
    return age is not None and age > multiple * interval_s
