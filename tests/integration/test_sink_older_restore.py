"""Real Spark: a restore of an older checkpoint after later batches were committed
(issue 19 item 2). ``ParquetSink`` on ``file://`` behind ``job.exactly_once`` over a file
source; the first run commits batches 0..3 (one file each), more input arrives, and the
second run restores the checkpoint of batch 1. Spark plans batches 2 and 3 again:

* with ``maxFilesPerTrigger`` 1 they read the same files: skipped, and the output is
  exactly the ground truth (every number once);
* reading every available file (``maxFilesPerTrigger`` 10) is first refused before the
  query starts (``SourceSettingsChangedError``: the checkpoint recorded 1); with
  ``allow_source_changes`` batch 2 lists six files under the same ``logOffset``: the
  sink refuses with ``SinkReplayMismatchError`` and the output is what the first run
  committed, every number once (on main the replay was dropped silently and the numbers
  of the new files never published);
* the same under ``AT_LEAST_ONCE``: the replay is published as extra output, so every
  number reaches the table (those of files 2 and 3 twice) and the job finishes (before,
  it was refused as under ``EXACTLY_ONCE``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_ckpt.errors import SinkReplayMismatchError, SourceSettingsChangedError
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.sinks import ParquetSink
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.testing.numbers import write_numbers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

JOB = "older"
PER_FILE = 25


def run(spark: Any, storage: CheckpointStorage, table: str, input_dir: Path, workdir: Path,
        *, restore: str, files_per_batch: int, mode: str = "EXACTLY_ONCE",
        allow_source_changes: bool = False) -> None:
    job = CheckpointedJob(
        spark, job=JOB, storage=storage, restore=restore, workdir=workdir,
        allow_source_changes=allow_source_changes,
        checkpoint_config={"execution.checkpointing.interval": "100 ms",
                           "execution.checkpointing.num-retained": 10,
                           "execution.checkpointing.mode": mode},
        restart_strategy={"type": "none"},
    )
    write = job.exactly_once(ParquetSink(table))

    def each_batch(df: Any, batch_id: int) -> None:
        write(df, batch_id)
        time.sleep(0.4)  # a periodic checkpoint covers every batch

    def build() -> Any:
        from pyspark.sql import functions as F

        numbers = (spark.readStream.option("maxFilesPerTrigger", files_per_batch)
                   .text(str(input_dir)).select(F.col("value").cast("long").alias("n")))
        return numbers.writeStream.foreachBatch(each_batch).trigger(availableNow=True)

    job.run(build)


def add_files(input_dir: Path, files: int, first_file: int) -> None:
    """Input files with increasing modification times (the file source's order)."""
    write_numbers(input_dir, files=files, per_file=PER_FILE, first_file=first_file,
                  start=first_file * PER_FILE + 1)
    for i in range(first_file, first_file + files):
        stamp = 1_700_000_000 + i
        os.utime(input_dir / f"f{i:05d}.txt", (stamp, stamp))


def published(table: Path) -> list[int]:
    """What a plain reader reads from the table directory."""
    return sorted(pq.read_table(table).column("n").to_pylist())


@pytest.mark.parametrize("files_per_batch", [1, 10], ids=["same-offsets", "other-offsets"])
def test_restoring_an_older_checkpoint_is_exactly_once_or_refused(
        spark: Any, file_storage: CheckpointStorage, tmp_path: Path,
        files_per_batch: int) -> None:
    input_dir, table = tmp_path / "in", tmp_path / "table"
    add_files(input_dir, 4, 0)
    run(spark, file_storage, table.as_uri(), input_dir, tmp_path / "w1", restore="latest",
        files_per_batch=1)
    assert ParquetSink(table.as_uri()).committed_batches() == [0, 1, 2, 3]
    older = next(m for m in CheckpointCatalog(file_storage, JOB).completed_checkpoints()
                 if m.batch_id == 1)
    add_files(input_dir, 4, 4)

    restore = f"chk-{older.checkpoint_id}"
    if files_per_batch == 1:
        run(spark, file_storage, table.as_uri(), input_dir, tmp_path / "w2", restore=restore,
            files_per_batch=files_per_batch)
        assert published(table) == list(range(1, 8 * PER_FILE + 1))  # the ground truth
    else:
        with pytest.raises(SourceSettingsChangedError, match=(
                r"source 0 \(text\): maxFilesPerTrigger was '1', now '10'")):
            run(spark, file_storage, table.as_uri(), input_dir, tmp_path / "w2",
                restore=restore, files_per_batch=files_per_batch)
        assert ParquetSink(table.as_uri()).committed_batches() == [0, 1, 2, 3]
        with pytest.raises(SinkReplayMismatchError) as raised:
            run(spark, file_storage, table.as_uri(), input_dir, tmp_path / "w2",
                restore=restore, files_per_batch=files_per_batch, allow_source_changes=True)
        refusal = raised.value
        assert refusal.batch_id == 2 and "(1 files)" in refusal.committed
        assert "(6 files)" in refusal.replay and restore in str(refusal)
        assert published(table) == list(range(1, 4 * PER_FILE + 1))  # nothing lost
        assert not list((table / "_staging").glob("*/*"))  # the replay's files are gone
        failed = JobHistory(file_storage, JOB).events([ev.JOB_FAILED])
        assert failed[-1].data["error"] == "SinkReplayMismatchError"
    ahead = JobHistory(file_storage, JOB).events([ev.SINK_AHEAD])[-1]
    assert (ahead.data["restored_batch"], ahead.data["first_batch"],
            ahead.data["last_batch"]) == (1, 2, 3)


def test_at_least_once_publishes_a_replay_that_read_other_files_as_extra_output(
        spark: Any, file_storage: CheckpointStorage, tmp_path: Path) -> None:
    mode = "AT_LEAST_ONCE"
    input_dir, table = tmp_path / "in", tmp_path / "table"
    add_files(input_dir, 4, 0)
    run(spark, file_storage, table.as_uri(), input_dir, tmp_path / "w1", restore="latest",
        files_per_batch=1, mode=mode)
    older = next(m for m in CheckpointCatalog(file_storage, JOB).completed_checkpoints()
                 if m.batch_id == 1)
    add_files(input_dir, 4, 4)
    run(spark, file_storage, table.as_uri(), input_dir, tmp_path / "w2",
        restore=f"chk-{older.checkpoint_id}", files_per_batch=10, mode=mode,
        allow_source_changes=True)
    # batch 2 replayed over files 2..7: every number there, files 2 and 3 twice
    assert published(table) == sorted([*range(1, 8 * PER_FILE + 1),
                                       *range(2 * PER_FILE + 1, 4 * PER_FILE + 1)])
    (extra,) = JobHistory(file_storage, JOB).events([ev.SINK_REPLAY_PUBLISHED])
    assert extra.data["batch"] == 2 and "(1 files)" in extra.data["committed_offsets"]
    assert "(6 files)" in extra.data["replay_offsets"]
    assert not JobHistory(file_storage, JOB).events([ev.JOB_FAILED])
    assert not list((table / "_staging").glob("*/*"))
