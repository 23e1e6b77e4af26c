"""CheckpointConfig: Flink names and defaults, one error naming every bad key."""

from __future__ import annotations

import pytest

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig


def test_defaults_are_flinks_with_the_documented_exceptions() -> None:
    cfg = CheckpointConfig.from_dict({})
    assert (cfg.min_pause_s, cfg.timeout_s, cfg.max_concurrent, cfg.tolerable_failed) == (
        0.0, 600.0, 1, 0)
    assert (cfg.num_retained, cfg.mode, cfg.incremental) == (1, "EXACTLY_ONCE", False)
    assert cfg.interval_s == 10.0 and cfg.retention == "RETAIN_ON_CANCELLATION"
    assert cfg.file_merging is True and cfg.file_merging_max_file_size == 32 << 20


@pytest.mark.parametrize(("raw", "size"), [
    ("32mb", 32 << 20), ("32 MB", 32 << 20), ("512 kb", 512 << 10), ("1g", 1 << 30),
    (1 << 20, 1 << 20), ("65536", 64 << 10), ("64 kibibytes", 64 << 10),
])
def test_file_merging_sizes_are_flink_memory_sizes(raw: object, size: int) -> None:
    cfg = CheckpointConfig.from_dict({"execution.checkpointing.file-merging.max-file-size": raw,
                                      "file-merging.enabled": "false"})
    assert cfg.file_merging_max_file_size == size and cfg.file_merging is False
    assert CheckpointConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("raw", ["huge", "1.5 mb", "-1", 1000, True, "32 parsecs"])
def test_bad_file_merging_sizes_are_named(raw: object) -> None:
    with pytest.raises(ConfigError, match=r"file-merging\.max-file-size.*memory size"):
        CheckpointConfig.from_dict({"file-merging.max-file-size": raw})


def test_prefixed_and_short_names_and_flink_durations() -> None:
    cfg = CheckpointConfig.from_dict({
        "execution.checkpointing.interval": "500 ms", "min-pause": "1 min",
        "timeout": 30, "mode": "at_least_once", "incremental": "true", "num-retained": "3",
    })
    assert (cfg.interval_s, cfg.min_pause_s, cfg.timeout_s) == (0.5, 60.0, 30.0)
    assert cfg.mode == "AT_LEAST_ONCE" and not cfg.exactly_once
    assert cfg.incremental is True and cfg.num_retained == 3
    assert CheckpointConfig.from_dict(cfg.to_dict()) == cfg


def test_every_bad_key_is_named_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        CheckpointConfig.from_dict({
            "interval": "soon", "num-retained": 0, "mode": "SOMETIMES", "incremental": 2,
            "max-concurrent-checkpoints": 1.5, "bogus": 1, "timeout": "0 s",
        })
    assert set(err.value.problems) == {
        "interval", "num-retained", "mode", "incremental", "max-concurrent-checkpoints",
        "bogus", "timeout",
    }
    text = str(err.value)
    assert "EXACTLY_ONCE, AT_LEAST_ONCE" in text and "execution.checkpointing.interval" in text
