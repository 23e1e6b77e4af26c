"""The pure stale-checkpoint rule (issue 10 part 2)."""

from __future__ import annotations

import pytest

from airflow_ckpt.health import checkpoint_progress


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
