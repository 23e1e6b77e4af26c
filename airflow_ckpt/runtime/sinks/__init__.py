"""Two-phase-commit sinks: exactly-once output tied to checkpoint completion.

* :class:`TwoPhaseCommitSink`: the protocol (``stage``/``pre_commit``/``commit``/``abort``).
* :class:`ParquetSink`: executors write Parquet in parallel; the driver handles file lists.
* :class:`JsonLinesSink`: one JSON-lines object per batch, written by the driver (small,
  human-readable output).

Guarantees per mode and how to wrap a sink of one's own: ``docs/sinks.md``.
"""

from airflow_ckpt.runtime.sinks.base import TwoPhaseCommitSink
from airflow_ckpt.runtime.sinks.jsonl import JsonLinesSink
from airflow_ckpt.runtime.sinks.parquet import ParquetSink, StagedBatch

__all__ = ["JsonLinesSink", "ParquetSink", "StagedBatch", "TwoPhaseCommitSink"]
