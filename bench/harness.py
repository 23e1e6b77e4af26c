"""Running the example query for the benchmarks: plain Spark or under ``CheckpointedJob``.

The query is the example job's (``spark_jobs/odd_even_sums.py``): a file source over text
files of integers (``maxFilesPerTrigger=1``, so one batch per input file), the running
count and sum per parity in Spark's state store, ``availableNow`` trigger, output in
update mode through ``foreachBatch`` into a :class:`JsonLinesSink` on the storage under
test. Both variants write the same rows to the same sink on the same storage:

* **plain**: Spark's own ``checkpointLocation`` on local disk, and a plain
  ``foreachBatch`` that collects the batch and writes it as one object, published at
  once (what the sink's committed ``part-<batch>`` file holds: one PUT per batch);
* **checkpointed**: ``CheckpointedJob.run`` with ``job.exactly_once(sink)``: restore,
  the checkpoint coordinator (barriers, sync hard-link capture, async upload to the
  storage, retention and GC), commits on checkpoint completion, the final checkpoint.

The checkpointed run also PUTs one object per batch inside the batch (the pre-commit) and
publishes it later, off the batch's path, when a checkpoint completes (copy + delete).
So the difference between the two is what the runtime adds. Every run is checked against
the ground truth of its input (outside the timed section): a benchmark of a wrong run
would be meaningless.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.testing.numbers import GroundTruth, verify_output

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

#: shuffle partitions, as in ``spark_jobs/odd_even_sums.py``: 4 state store partitions
SHUFFLE_PARTITIONS = 4
JOB = "bench"
SINK_PREFIX = "_out"

BatchFunction = Callable[["DataFrame", int], None]


def spark_session() -> SparkSession:
    """The one local SparkSession every in-process run shares (``local[2]``)."""
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("airflow-ckpt-bench")
        .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def example_query(spark: SparkSession, input_dir: Path, each_batch: BatchFunction
                  ) -> DataStreamWriter:
    """The example job's query (parity running sums), writing through ``each_batch``."""
    from pyspark.sql import functions as F

    numbers = (
        spark.readStream.option("maxFilesPerTrigger", 1)
        .text(str(input_dir))
        .select(F.col("value").cast("long").alias("n"))
        .where(F.col("n").isNotNull())
    )
    parity = F.when(F.col("n") % 2 == 0, "even").otherwise("odd")
    agg = numbers.groupBy(parity.alias("key")).agg(
        F.count("*").alias("count"), F.sum("n").alias("sum")
    )
    return (agg.writeStream.outputMode("update").foreachBatch(each_batch)
            .trigger(availableNow=True))


@dataclass(slots=True)
class RunResult:
    """One measured run of the example query.

    ``wall_s``: from building the query (or the job) to its end, including, for a
    checkpointed run, restore, every checkpoint and the final one. ``checkpoints``: the
    manifests of the checkpoints completed during the run, as written to ``_metadata``.
    ``uploaded_bytes``: the sum of ``checkpointed_size`` over the job's
    ``checkpoint_completed`` history events.
    """

    variant: str  # "plain", "incremental" or "full"
    backend: str  # "s3" or "file"
    repeat: int
    wall_s: float
    batches: int
    correct: bool
    checkpoints: list[Manifest] = field(default_factory=list)
    uploaded_bytes: int = 0
    history_checkpoints: int = 0

    @property
    def label(self) -> str:
        return self.variant if self.variant == "plain" else f"{self.variant}/{self.backend}"

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly summary (per-checkpoint timings included)."""
        return {
            "variant": self.variant,
            "backend": self.backend,
            "repeat": self.repeat,
            "wall_s": round(self.wall_s, 3),
            "batches": self.batches,
            "batches_per_s": round(self.batches_per_s, 3),
            "correct": self.correct,
            "uploaded_bytes": self.uploaded_bytes,
            "history_checkpoints": self.history_checkpoints,
            "checkpoints": [
                {
                    "id": m.checkpoint_id,
                    "trigger": m.trigger,
                    "batch_id": m.batch_id,
                    "files": len(m.files),
                    "state_size": m.state_size,
                    "checkpointed_size": m.checkpointed_size,
                    "start_delay_ms": m.timings.start_delay_ms,
                    "sync_ms": m.timings.sync_duration_ms,
                    "async_ms": m.timings.async_duration_ms,
                    "end_to_end_ms": m.timings.end_to_end_duration_ms,
                }
                for m in self.checkpoints
            ],
        }


def _check(sink: JsonLinesSink, truth: GroundTruth) -> tuple[int, bool]:
    verdict = verify_output(sink, truth, finished=True)
    return len(sink.committed_batches()), verdict.ok


def run_plain(spark: SparkSession, storage: CheckpointStorage, input_dir: Path,
              truth: GroundTruth, workdir: Path, *, backend: str, repeat: int) -> RunResult:
    """The baseline: a plain Spark query with its own checkpointLocation."""
    sink = JsonLinesSink(storage, SINK_PREFIX)

    def each_batch(df: DataFrame, batch_id: int) -> None:
        rows = [row.asDict(recursive=True) for row in df.collect()]
        body = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows)
        storage.put_bytes(sink.part_key(batch_id), body.encode())  # visible at once

    start = time.perf_counter()
    query = (example_query(spark, input_dir, each_batch)
             .option("checkpointLocation", str(workdir / "plain")).start())
    query.awaitTermination()
    wall = time.perf_counter() - start
    error = query.exception()
    if error is not None:
        raise error
    batches, ok = _check(sink, truth)
    return RunResult("plain", backend, repeat, wall, batches, ok)


def run_checkpointed(spark: SparkSession, storage: CheckpointStorage, input_dir: Path,
                     truth: GroundTruth, workdir: Path, config: Mapping[str, Any], *,
                     backend: str, repeat: int) -> RunResult:
    """The example query under ``CheckpointedJob`` with checkpoint ``config``."""
    start = time.perf_counter()
    job = CheckpointedJob(
        spark, job=JOB, storage=storage, checkpoint_config=config,
        restart_strategy={"type": "none"}, restore="latest", workdir=workdir,
        run_id=f"bench-{uuid.uuid4().hex[:8]}",
    )
    # Retention deletes subsumed _metadata while the job runs; keep every manifest.
    completed_manifests: list[Manifest] = []
    job.on_checkpoint(completed_manifests.append)
    sink = JsonLinesSink(storage, SINK_PREFIX)
    write = job.exactly_once(sink)
    job.run(lambda: example_query(spark, input_dir, write))
    wall = time.perf_counter() - start
    batches, ok = _check(sink, truth)
    completed = JobHistory(storage, JOB).events([ev.CHECKPOINT_COMPLETED])
    variant = "incremental" if config.get("execution.checkpointing.incremental") else "full"
    return RunResult(
        variant, backend, repeat, wall, batches, ok,
        checkpoints=[m for m in completed_manifests if not m.is_savepoint],
        uploaded_bytes=sum(int(e.data["checkpointed_size"]) for e in completed),
        history_checkpoints=len(completed),
    )
