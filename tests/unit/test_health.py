"""The shared checkpoint-progress (stale checkpoints) rule: supervisor, sensor, UI."""

from __future__ import annotations

import pytest

from airflow_ckpt.health import checkpoint_age_s, checkpoint_progress, checkpoints_stale


def test_stale_flag_after_the_multiple_of_the_interval() -> None:
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


def test_unknown_without_a_checkpoint_or_interval() -> None:
    assert checkpoint_progress(None, 10.0, 1000.0) == "unknown"
    assert checkpoint_progress(990.0, 0.0, 1000.0) == "unknown"


@pytest.mark.parametrize(("age", "expected"), [(0.0, "ok"), (29.9, "ok"), (30.0, "ok"),
                                               (30.1, "stale"), (1e6, "stale")])
def test_stale_after_the_multiple_of_the_interval(age: float, expected: str) -> None:
    assert checkpoint_progress(1000.0, 10.0, 1000.0 + age) == expected


def test_custom_multiple_and_validation() -> None:
    assert checkpoint_progress(1000.0, 10.0, 1015.0, multiple=1.0) == "stale"
    assert checkpoint_progress(1000.0, 10.0, 1015.0, multiple=2.0) == "ok"
    with pytest.raises(ValueError):
        checkpoint_progress(1000.0, 10.0, 1015.0, multiple=0)


def test_checkpoint_sensor_can_wait_for_healthy() -> None:
    from airflow_ckpt.sensors.checkpoint import CheckpointSensor

    sensor = CheckpointSensor(task_id="s", job_name="job", checkpoint_storage="file:///tmp/x",
                              new_only=False, wait_for_healthy=True,
                              checkpoint_interval="10 s", checkpoint_progress_multiple=2)
    condition = sensor._condition()
    assert condition.healthy_interval_s == 10.0 and condition.healthy_multiple == 2.0
    with pytest.raises(ValueError, match="checkpoint_interval"):
        CheckpointSensor(task_id="s2", job_name="job", checkpoint_storage="file:///tmp/x",
                         wait_for_healthy=True)
