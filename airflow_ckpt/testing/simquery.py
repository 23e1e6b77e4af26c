"""A simulated micro-batch query: the part of Spark a :class:`CheckpointedJob` drives,
deterministic and without a JVM, for tests that run the real runtime many times.

:class:`SimulatedSpark` stands in for the ``SparkSession`` (``version``, ``conf``) and
hands the runtime a :class:`Writer` (``option("checkpointLocation", ...)``, ``start``);
``start`` returns the subclass's :class:`SimulatedQuery`, which runs one batch per
``awaitTermination`` call as Spark's ``MicroBatchExecution`` does: it plans the batch,
writes its ``offsets/<b>`` entry, calls the ``foreachBatch`` function with the batch's
rows, then writes the state and ``commits/<b>``. A subclass says what each step writes.
:func:`run_to_end` runs a job over it in one order of events.

Used by the crash-point enumeration (``airflow_ckpt.testing.crashpoints``) and the
restore-case tests of the sinks.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.job import checkpointed_job as job_module
from airflow_ckpt.runtime.sinks import TwoPhaseCommitSink

#: the ``foreachBatch`` function: (the batch's frame, batch id)
BatchFn = Callable[[Any, int], None]


class Conf:
    """``spark.conf``: the given values, else the default."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class Row(dict[str, Any]):
    def asDict(self, recursive: bool = False) -> dict[str, Any]:
        return dict(self)


class Frame:
    """A micro-batch's DataFrame, as far as a sink's default ``stage`` reads it."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def collect(self) -> list[Row]:
        return [Row(r) for r in self.rows]


def write_file(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (a temporary file renamed), creating parents."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.rename(path)


class SimulatedQuery(ABC):
    """A streaming query over ``workdir``: one batch per :meth:`awaitTermination` call.
    ``on_batch(b)`` runs when batch ``b`` starts; an exception of the ``foreachBatch``
    function ``fn`` (or of :meth:`_after_batch`) fails the query, as in Spark."""

    def __init__(self, workdir: Path, fn: BatchFn, on_batch: Callable[[int], None]) -> None:
        self.workdir, self.fn, self.on_batch = workdir, fn, on_batch
        self.error: BaseException | None = None
        self.stopped = False

    @abstractmethod
    def _plan(self) -> int | None:
        """The batch to run next, or None when the input is exhausted."""

    @abstractmethod
    def _input(self, batch_id: int) -> list[dict[str, Any]]:
        """Write the batch's ``offsets/<b>`` entry; return its rows."""

    def _after_batch(self, batch_id: int) -> None:  # noqa: B027 - optional hook
        """Called after ``fn`` returned, before the batch commits (a failure here fails
        the query like one in ``fn``)."""

    @abstractmethod
    def _finish(self, batch_id: int) -> None:
        """Write the batch's state version and ``commits/<b>`` (and purge old entries)."""

    @property
    def isActive(self) -> bool:
        return not self.stopped and self.error is None and self._plan() is not None

    def awaitTermination(self, timeout: float | None = None) -> bool:
        batch_id = self._plan() if self.isActive else None
        if batch_id is None:
            return True
        self.on_batch(batch_id)
        rows = self._input(batch_id)
        try:
            self.fn(Frame(rows), batch_id)
            self._after_batch(batch_id)
        except Exception as exc:
            self.error = exc
            return True
        self._finish(batch_id)
        return not self.isActive

    def exception(self) -> BaseException | None:
        return self.error

    def stop(self) -> None:
        self.stopped = True


class Writer:
    """``df.writeStream.foreachBatch(fn)``: remembers the checkpoint location."""

    def __init__(self, spark: SimulatedSpark, fn: BatchFn) -> None:
        self.spark, self.fn, self.location = spark, fn, ""

    def option(self, key: str, value: str) -> Writer:
        if key == "checkpointLocation":
            self.location = value
        return self

    def start(self) -> SimulatedQuery:
        return self.spark.query(Path(self.location), self.fn)


class SimulatedSpark(ABC):
    """The part of ``SparkSession`` the runtime uses, plus a deterministic query."""

    version = "4.2.0-simulated"

    def __init__(self, on_batch: Callable[[int], None]) -> None:
        self.conf = Conf({})
        self.on_batch = on_batch

    def writer(self, fn: BatchFn) -> Writer:
        return Writer(self, fn)

    @abstractmethod
    def query(self, workdir: Path, fn: BatchFn) -> SimulatedQuery:
        """The query the writer starts over ``workdir``."""


def run_to_end(job: CheckpointedJob, spark: SimulatedSpark, sink: TwoPhaseCommitSink) -> str:
    """Run ``job`` (built with ``threaded=False``) over ``spark``'s query writing through
    ``sink`` until it ends; returns the outcome. One order of events however fast the
    machine: every look at the job's clock is an hour later (a checkpoint is due at
    every tick after a new batch) and the control channel is polled at every step."""
    job.clock = itertools.count(step=3600.0).__next__
    previous = job_module.CONTROL_POLL_S
    job_module.CONTROL_POLL_S = 0.0
    try:
        return job.run(lambda: spark.writer(job.exactly_once(sink))).outcome  # type: ignore[arg-type,return-value]
    finally:
        job_module.CONTROL_POLL_S = previous
