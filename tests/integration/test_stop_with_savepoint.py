"""Stop-with-savepoint in one real local SparkSession, with the final checkpoint's
``_metadata`` put failing once (issue 20 item 8), then an upgrade from the savepoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.snapshot import latest_batch
from airflow_ckpt.runtime.control.channel import ControlChannel, ControlRequest
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.testing.faults import FailingPuts, checkpoint_marker
from airflow_ckpt.testing.numbers import verify_output, write_numbers

pytestmark = pytest.mark.integration

JOB = "stopper"
#: no periodic checkpoint comes between the stop and its final checkpoint
CONFIG = {"execution.checkpointing.interval": "1 h"}


def build(spark: Any, input_dir: Path, each_batch: Any, *, available_now: bool) -> Any:
    from pyspark.sql import functions as F

    numbers = spark.readStream.option("maxFilesPerTrigger", 1).text(str(input_dir))
    n = F.col("value").cast("long")
    key = F.when(n % 2 == 0, "even").otherwise("odd")
    agg = numbers.groupBy(key.alias("key")).agg(F.count("*").alias("count"),
                                                F.sum(n).alias("sum"))
    writer = agg.writeStream.outputMode("update").foreachBatch(each_batch)
    return writer.trigger(availableNow=True) if available_now else writer


def test_a_stop_whose_final_checkpoint_marker_fails_once_stops_at_its_savepoint(
    spark: Any, file_storage: CheckpointStorage, tmp_path: Path
) -> None:
    """The query runs until stopped (no end of input: only the stop ends it). The stop
    is requested from batch 2; the final checkpoint's marker put fails once. Before,
    the savepoint was answered "completed", then the failed final checkpoint ended the
    run with RestartsExhaustedError (with a restart strategy: the job ran on past the
    savepoint). Now the final checkpoint is taken again and the job stops at the
    savepoint's batch; a job started from the savepoint then produces every number's
    sum exactly once (nothing repeated, nothing lost)."""
    input_dir = tmp_path / "in"
    truth = write_numbers(input_dir, files=6, per_file=30)
    faulty = FailingPuts(file_storage, checkpoint_marker("final"), times=1)
    job = CheckpointedJob(spark, job=JOB, storage=faulty, checkpoint_config=CONFIG,
                          restart_strategy={"type": "none"}, workdir=tmp_path / "w")
    sink = JsonLinesSink(job.storage, "_out")
    write = job.exactly_once(sink)
    stop: list[ControlRequest] = []

    def each_batch(df: Any, batch_id: int) -> None:
        write(df, batch_id)
        if batch_id == 2 and not stop:
            stop.append(ControlChannel(file_storage, JOB).request_savepoint(
                stop=True, savepoint_id="upgrade", timeout_s=600))

    result = job.run(lambda: build(spark, input_dir, each_batch, available_now=False))

    assert faulty.failed, "the final checkpoint's marker put never failed"
    assert result.outcome == "stopped"
    answer = ControlChannel(file_storage, JOB).result(stop[0].request_id)
    assert answer is not None and answer.status == "completed", answer
    stopped_at = latest_batch(job.workdir, "commits")
    savepoint = CheckpointCatalog(file_storage, JOB).savepoint("upgrade")
    assert result.last_checkpoint is not None
    assert answer.batch_id == savepoint.batch_id == result.last_checkpoint.batch_id == stopped_at
    assert max(sink.committed_batches()) == stopped_at  # nothing committed past it
    assert sink.pending() == []
    assert job.history.events([ev.RESTART, ev.FAILURE, ev.JOB_FAILED]) == []
    stopped = job.history.last(ev.JOB_STOPPED)
    assert stopped is not None and stopped.data["savepoint"] == answer.savepoint_path

    # The upgrade: a new run from the savepoint, to the end of the input.
    upgraded = CheckpointedJob(spark, job=JOB, storage=file_storage, checkpoint_config=CONFIG,
                               restart_strategy={"type": "none"}, workdir=tmp_path / "w2",
                               restore=answer.savepoint_path)
    write2 = upgraded.exactly_once(JsonLinesSink(upgraded.storage, "_out"))
    upgraded.run(lambda: build(spark, input_dir, write2, available_now=True))
    verdict = verify_output(JsonLinesSink(file_storage, "_out"), truth, finished=True)
    assert verdict.ok, verdict.problems
