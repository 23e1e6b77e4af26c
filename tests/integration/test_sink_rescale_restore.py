"""Real Spark (local mode, RocksDB state): restoring an older savepoint with another
number of state partitions while the sink is ahead (issue 29).

Spark's offline state repartitioning (``state_partitions``) appends a repartition batch
that takes the restored batch ``b``'s offsets as id ``b+1``; every later batch reads
under an id one higher than in the run that first published it. The sink recognises
those replays by where they start (``SinkTransactions``: a look down its decisions after
a discontinuity) and skips them, so the output is exact.

The query counts each number's occurrences (``groupBy(n).count()``, update mode: a row
``(n, k)`` each time ``n`` is seen for the ``k``-th time) over a file source, one file per
batch, each number in two files; ``ParquetSink`` on ``file://``. The ground truth is
computed from the input files alone: for a number seen ``k`` times, the rows ``(n, 1)``
.. ``(n, k)``, each exactly once. A replay published twice repeats rows; one dropped
loses rows; state lost or split wrongly by the rescale repeats ``(n, 1)``.

1. run 1 is stopped with a savepoint (``upgrade``) after a few batches;
2. run 2 restores it and runs further over new files: the sink is ahead;
3. run 3 restores ``upgrade`` again with ``state_partitions`` 5 (the savepoint has 3):
   the replays of run 2's batches come under shifted ids and are skipped, new files
   published; on main it failed for good (``SinkReplayMismatchError``, ``job_failed``);
4. run 4 resumes with ``restore=latest`` over more files (on main it resumed run 3's
   rescaled initial checkpoint and failed the same way).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.control.channel import ControlChannel, ControlRequest
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.sinks import ParquetSink
from airflow_ckpt.runtime.storage import CheckpointStorage

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

JOB = "rescaler"
#: numbers per file; file ``i`` holds ``STEP * i`` .. ``STEP * i + PER_FILE - 1``
PER_FILE, STEP = 20, 10
#: no periodic checkpoint: a run's batches are committed by its final checkpoint
CONFIG = {"execution.checkpointing.interval": "1 h"}
PROVIDER = "spark.sql.streaming.stateStore.providerClass"


@pytest.fixture
def rocksdb(spark: Any) -> Iterator[Any]:
    spark.conf.set(PROVIDER,
                   "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    yield spark
    spark.conf.unset(PROVIDER)


def add_files(input_dir: Path, first: int, count: int) -> None:
    """Files ``first`` .. ``first + count - 1``, modification times in that order (the
    file source's order), each written whole."""
    input_dir.mkdir(parents=True, exist_ok=True)
    for i in range(first, first + count):
        tmp = input_dir / f".f{i:05d}.tmp"
        tmp.write_text("".join(f"{n}\n" for n in range(STEP * i, STEP * i + PER_FILE)))
        stamp = 1_700_000_000 + i
        os.utime(tmp, (stamp, stamp))
        tmp.rename(input_dir / f"f{i:05d}.txt")


def ground_truth(input_dir: Path, files: int | None = None) -> list[tuple[int, int]]:
    """From the input files alone (the first ``files`` of them, or all): ``(n, k)`` for
    every ``k``-th occurrence of ``n``."""
    seen: Counter[int] = Counter()
    for path in sorted(input_dir.glob("f*.txt"))[:files]:
        seen.update(int(line) for line in path.read_text().split())
    return sorted((n, k) for n, times in seen.items() for k in range(1, times + 1))


def published(table: Path) -> list[tuple[int, int]]:
    """What a plain reader reads from the table directory."""
    data = pq.read_table(table).to_pydict()
    return sorted(zip(data["n"], data["count"], strict=True))


def run(spark: Any, storage: CheckpointStorage, table: Path, input_dir: Path, workdir: Path,
        *, restore: str, state_partitions: int | None = None,
        stop_after: int | None = None) -> str | None:
    """One run; ``stop_after``: request a stop-with-savepoint ``upgrade`` from that
    batch on (the query then runs until stopped) and return the savepoint's path."""
    job = CheckpointedJob(spark, job=JOB, storage=storage, restore=restore, workdir=workdir,
                          state_partitions=state_partitions, checkpoint_config=CONFIG,
                          restart_strategy={"type": "none"})
    write = job.exactly_once(ParquetSink(table.as_uri()))
    stop: list[ControlRequest] = []

    def each_batch(df: Any, batch_id: int) -> None:
        write(df, batch_id)
        if stop_after is not None and batch_id >= stop_after and not stop:
            stop.append(ControlChannel(storage, JOB).request_savepoint(
                stop=True, savepoint_id="upgrade", timeout_s=600))

    def build() -> Any:
        from pyspark.sql import functions as F

        numbers = (spark.readStream.option("maxFilesPerTrigger", 1).text(str(input_dir))
                   .select(F.col("value").cast("long").alias("n")))
        writer = (numbers.groupBy("n").count().writeStream.outputMode("update")
                  .foreachBatch(each_batch))
        return writer if stop_after is not None else writer.trigger(availableNow=True)

    job.run(build)
    if not stop:
        return None
    answer = ControlChannel(storage, JOB).result(stop[0].request_id)
    assert answer is not None and answer.status == "completed", answer
    return answer.savepoint_path


def test_restoring_an_older_savepoint_with_a_rescale_while_the_sink_is_ahead_is_exact(
        rocksdb: Any, file_storage: CheckpointStorage, tmp_path: Path) -> None:
    input_dir, table = tmp_path / "in", tmp_path / "table"
    add_files(input_dir, 0, 4)
    path = run(rocksdb, file_storage, table, input_dir, tmp_path / "w1", restore="latest",
               stop_after=1)
    assert path is not None
    catalog = CheckpointCatalog(file_storage, JOB)
    savepoint = catalog.savepoint("upgrade")
    assert {op.num_partitions for op in savepoint.operators} == {3}
    # one file per batch: batches 0..b read files 0..b
    assert published(table) == ground_truth(input_dir, savepoint.batch_id + 1)

    add_files(input_dir, 4, 4)
    run(rocksdb, file_storage, table, input_dir, tmp_path / "w2", restore=path)
    ahead = ParquetSink(table.as_uri()).committed_batches()
    assert ahead[-1] >= savepoint.batch_id + 2, ahead  # the sink is ahead of the savepoint
    assert published(table) == ground_truth(input_dir)

    add_files(input_dir, 8, 2)
    run(rocksdb, file_storage, table, input_dir, tmp_path / "w3", restore=path,
        state_partitions=5)
    latest = catalog.latest_checkpoint()
    assert latest is not None and {op.num_partitions for op in latest.operators} == {5}
    history = JobHistory(file_storage, JOB)
    assert not history.events([ev.JOB_FAILED])
    reported = history.events([ev.SINK_AHEAD])[-1].data
    assert (reported["restored_batch"], reported["last_batch"]) == (savepoint.batch_id,
                                                                    ahead[-1])
    assert published(table) == ground_truth(input_dir)  # nothing lost, nothing twice

    add_files(input_dir, 10, 2)
    run(rocksdb, file_storage, table, input_dir, tmp_path / "w4", restore="latest")
    assert published(table) == ground_truth(input_dir)
    assert not history.events([ev.JOB_FAILED])
