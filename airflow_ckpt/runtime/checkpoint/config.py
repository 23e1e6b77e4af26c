"""CheckpointConfig: Flink's checkpointing options, validated once, frozen.

Keys are Flink's (``execution.checkpointing.interval`` ...); the
``execution.checkpointing.`` prefix may be left out. Defaults are Flink 2.x's, with
three documented exceptions: ``interval`` defaults to 10 s (Flink leaves checkpointing
off, which would make this library pointless), ``externalized-checkpoint-retention``
defaults to RETAIN_ON_CANCELLATION (checkpoints here are always externalized), and
``file-merging.enabled`` defaults to true (small checkpoint files are merged into one
object per checkpoint; see :mod:`airflow_ckpt.runtime.checkpoint.upload`).

One option keeps Flink's state-backend name: ``state.storage.fs.memory-threshold``
(default 20 kb, at most 1 mb, as Flink's): a file of a checkpoint or savepoint below it
travels inside ``_metadata`` instead of in an object of its own (0: never). A checkpoint
of small state is then one PUT, its marker.

Three options keep the Flink Kubernetes operator's names (without its ``kubernetes.operator.``
prefix): ``savepoint.history.max.count`` (default 10) and ``savepoint.history.max.age``
(default 24 h; 0: no age limit), how many of the savepoints the job took itself
(periodically, or on a request that named none) it keeps, and
``periodic-savepoint.interval`` (default 0: off), how often the driver takes one
(see :mod:`airflow_ckpt.runtime.checkpoint.savepoint_history` and docs/savepoints.md).

One option is this library's own, named Flink's way beside
``tolerable-failed-checkpoints``: ``tolerable-storage-outage`` (default 5 min), how long
the storage may stay unreachable before the job fails (see
:mod:`airflow_ckpt.runtime.storage.outage`). Flink has no equivalent: its file systems block on
an unreachable store until the checkpoint times out, which this budget makes explicit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.options import (
    DURATION_FORMS,
    MEMORY_SIZE_FORMS,
    format_duration,
    format_memory_size,
    parse_bool,
    parse_choice,
    parse_duration,
    parse_int,
    parse_memory_size,
)

PREFIX = "execution.checkpointing."
MODES = ("EXACTLY_ONCE", "AT_LEAST_ONCE")
RETENTIONS = ("RETAIN_ON_CANCELLATION", "DELETE_ON_CANCELLATION")


def _positive_duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"expected a duration > 0 ({DURATION_FORMS}), got {value!r}")
    return seconds


#: the smallest ``file-merging.max-file-size`` accepted
MIN_MERGED_FILE_SIZE = 64 << 10


def _file_size(value: Any) -> int:
    size = parse_memory_size(value)
    if size < MIN_MERGED_FILE_SIZE:
        raise ValueError(f"expected a memory size >= 64 kb ({MEMORY_SIZE_FORMS}), "
                         f"got {value!r}")
    return size


#: Flink's cap of ``state.storage.fs.memory-threshold``
MAX_MEMORY_THRESHOLD = 1 << 20


def _memory_threshold(value: Any) -> int:
    size = parse_memory_size(value)
    if size > MAX_MEMORY_THRESHOLD:
        raise ValueError(f"expected a memory size <= 1 mb ({MEMORY_SIZE_FORMS}), got {value!r}")
    return size


#: options outside ``execution.checkpointing.``: full key -> (field name, parser)
_FULL_KEY_OPTIONS: dict[str, tuple[str, Any]] = {
    "state.storage.fs.memory-threshold": ("memory_threshold", _memory_threshold),
    "savepoint.history.max.count": ("savepoint_history_max_count",
                                    partial(parse_int, minimum=1)),
    "savepoint.history.max.age": ("savepoint_history_max_age_s", parse_duration),
    "periodic-savepoint.interval": ("periodic_savepoint_interval_s", parse_duration),
}

# option suffix -> (field name, parser)
_OPTIONS: dict[str, tuple[str, Any]] = {
    "interval": ("interval_s", _positive_duration),
    "min-pause": ("min_pause_s", parse_duration),
    "timeout": ("timeout_s", _positive_duration),
    "max-concurrent-checkpoints": ("max_concurrent", partial(parse_int, minimum=1)),
    "tolerable-failed-checkpoints": ("tolerable_failed", partial(parse_int, minimum=0)),
    "num-retained": ("num_retained", partial(parse_int, minimum=1)),
    "mode": ("mode", partial(parse_choice, allowed=MODES)),
    "incremental": ("incremental", parse_bool),
    "externalized-checkpoint-retention": ("retention", partial(parse_choice, allowed=RETENTIONS)),
    "file-merging.enabled": ("file_merging", parse_bool),
    "file-merging.max-file-size": ("file_merging_max_file_size", _file_size),
    "tolerable-storage-outage": ("tolerable_outage_s", parse_duration),
}


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    """Validated checkpointing options. Build with :meth:`from_dict`."""

    interval_s: float = 10.0
    min_pause_s: float = 0.0
    timeout_s: float = 600.0
    max_concurrent: int = 1
    tolerable_failed: int = 0
    num_retained: int = 1
    mode: str = "EXACTLY_ONCE"
    incremental: bool = False
    retention: str = "RETAIN_ON_CANCELLATION"
    #: small files of a checkpoint travel merged into one object (see upload.py)
    file_merging: bool = True
    file_merging_max_file_size: int = 32 << 20
    #: files below this many bytes travel inline in ``_metadata`` (0: none do)
    memory_threshold: int = 20 << 10
    #: how long storage requests wait (capped backoff) for an unreachable storage before
    #: the job fails with the outage's first error; 0: no waiting (liveness only: no
    #: guarantee rests on it, see runtime/storage/outage.py)
    tolerable_outage_s: float = 300.0
    #: the job's own savepoints kept (the Flink operator's savepoint history, see
    #: runtime/checkpoint/savepoint_history.py): at most this many ...
    savepoint_history_max_count: int = 10
    #: ... and none older than this, but the newest (0: no age limit)
    savepoint_history_max_age_s: float = 86400.0
    #: the driver takes a savepoint this often, on its own clock (0: never)
    periodic_savepoint_interval_s: float = 0.0

    @property
    def exactly_once(self) -> bool:
        return self.mode == "EXACTLY_ONCE"

    @classmethod
    def from_dict(cls, options: Mapping[str, Any] | None) -> CheckpointConfig:
        """Validate Flink-named options; one ``ConfigError`` names every bad key."""
        values: dict[str, Any] = {}
        problems: dict[str, str] = {}
        for key, raw in (options or {}).items():
            suffix = key[len(PREFIX):] if key.startswith(PREFIX) else key
            option = _FULL_KEY_OPTIONS.get(key) or _OPTIONS.get(suffix)
            if option is None:
                allowed = ", ".join([*(PREFIX + name for name in _OPTIONS), *_FULL_KEY_OPTIONS])
                problems[key] = f"unknown option; allowed: {allowed}"
                continue
            field_name, parse = option
            try:
                values[field_name] = parse(raw)
            except ValueError as exc:
                problems[key] = str(exc)
        if problems:
            raise ConfigError("checkpoint config", problems)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Flink-named options (durations rendered as Flink strings)."""
        out: dict[str, Any] = {}
        named = [*((PREFIX + suffix, o) for suffix, o in _OPTIONS.items()),
                 *_FULL_KEY_OPTIONS.items()]
        for key, (field_name, _) in named:
            value = getattr(self, field_name)
            if field_name.endswith("_s"):
                value = format_duration(value)
            elif field_name.endswith(("_size", "_threshold")):
                value = format_memory_size(value)
            out[key] = value
        return out
