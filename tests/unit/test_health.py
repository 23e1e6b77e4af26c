"""The shared stale-checkpoint rule."""

from __future__ import annotations

from airflow_ckpt.health import checkpoint_age_s, checkpoints_stale


def test_stale_after_the_multiple_of_the_interval() -> None:
    assert not checkpoints_stale(1000.0, 10.0, 1030.0)  # exactly 3 intervals: not yet
    assert checkpoints_stale(1000.0, 10.0, 1030.5)
    assert not checkpoints_stale(1000.0, 10.0, 1030.5, multiple=5)
    assert checkpoints_stale(1000.0, 10.0, 1012.0, multiple=1)


def test_before_the_first_checkpoint_the_start_counts() -> None:
    assert checkpoints_stale(None, 10.0, 1100.0, since_ts=1000.0)
    assert not checkpoints_stale(None, 10.0, 1020.0, since_ts=1000.0)
    assert not checkpoints_stale(None, 10.0, 1e9)  # nothing to judge by


def test_unknown_interval_or_clock_skew_is_not_stale() -> None:
    assert not checkpoints_stale(1000.0, None, 1e9)
    assert not checkpoints_stale(1000.0, 0, 1e9)
    assert checkpoint_age_s(1000.0, None, 900.0) == 0.0  # a driver clock ahead of ours
