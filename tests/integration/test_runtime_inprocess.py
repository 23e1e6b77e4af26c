"""The runtime inside one real local SparkSession: retention, incremental uploads,
in-process restarts, partial and corrupt checkpoints, fresh starts."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.errors import RestoreError
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.restore.choose import restore
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout
from airflow_ckpt.testing.numbers import GroundTruth, verify_output, write_numbers

pytestmark = pytest.mark.integration

CONFIG = {
    "execution.checkpointing.interval": "200 ms",
    "execution.checkpointing.num-retained": 2,
    "execution.checkpointing.incremental": True,
    # these tests damage and copy checkpoint files as objects: none inline (issue 26)
    "state.storage.fs.memory-threshold": 0,
}


def run_job(spark: Any, storage: CheckpointStorage, input_dir: Path, workdir: Path, *,
            restore_target: str = "latest", fail_at: int = -1, fail_times: int = 0,
            restart: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
            state_partitions: int | None = None,
            count_only: bool = False) -> tuple[CheckpointedJob, JsonLinesSink]:
    from pyspark.sql import functions as F

    job = CheckpointedJob(
        spark, job="inproc", storage=storage, checkpoint_config=config or CONFIG,
        restart_strategy=restart or {"type": "none"}, restore=restore_target, workdir=workdir,
        state_partitions=state_partitions,
    )
    sink = JsonLinesSink(storage, "_out")
    write = job.exactly_once(sink)
    remaining = [fail_times]

    def each_batch(df: Any, batch_id: int) -> None:
        time.sleep(0.15)
        write(df, batch_id)
        if batch_id == fail_at and remaining[0] > 0:
            remaining[0] -= 1
            raise RuntimeError(f"injected failure in batch {batch_id}")

    def build() -> Any:
        numbers = spark.readStream.option("maxFilesPerTrigger", 1).text(str(input_dir))
        n = F.col("value").cast("long")
        key = F.when(n % 2 == 0, "even").otherwise("odd")
        aggregates = [F.count("*").alias("count")] + ([] if count_only else [F.sum(n).alias("sum")])
        agg = numbers.groupBy(key.alias("key")).agg(*aggregates)
        return (agg.writeStream.outputMode("update").foreachBatch(each_batch)
                .trigger(availableNow=True))

    job.run(build)
    return job, sink


@pytest.fixture
def numbers(tmp_path: Path) -> tuple[Path, GroundTruth]:
    return tmp_path / "in", write_numbers(tmp_path / "in", files=8, per_file=40)


def test_retention_and_incremental_shared_files(
    spark: Any, s3_storage: CheckpointStorage, numbers: tuple[Path, GroundTruth], tmp_path: Path
) -> None:
    input_dir, truth = numbers
    _, sink = run_job(spark, s3_storage, input_dir, tmp_path / "w")
    assert verify_output(sink, truth, finished=True).ok
    catalog = CheckpointCatalog(s3_storage, "inproc")
    retained = catalog.completed_checkpoints()
    assert len(retained) == 2, [m.checkpoint_id for m in retained]
    assert catalog.checkpoint_ids(completed_only=False) == [m.checkpoint_id for m in retained]
    layout = JobLayout("inproc")
    stored = {i.key for i in s3_storage.list(layout.shared_prefix)}
    referenced = {layout.root + f.key for m in retained for f in m.files if f.shared}
    assert referenced <= stored, "a retained checkpoint references a missing shared file"
    assert stored == referenced, f"unreferenced shared files remain: {stored - referenced}"
    newest = retained[-1]
    assert newest.num_acknowledged_subtasks == newest.num_subtasks > 1
    # Incremental: the newest checkpoint uploaded far less than it references.
    assert 0 <= newest.checkpointed_size < newest.state_size
    completed = JobHistory(s3_storage, "inproc").events([ev.CHECKPOINT_COMPLETED])
    assert len(completed) > 2  # more were taken than retained: subsumption happened


def test_in_process_restart_recovers_exactly(
    spark: Any, s3_storage: CheckpointStorage, numbers: tuple[Path, GroundTruth], tmp_path: Path
) -> None:
    input_dir, truth = numbers
    job, sink = run_job(
        spark, s3_storage, input_dir, tmp_path / "w", fail_at=4, fail_times=2,
        restart={"type": "fixed-delay", "fixed-delay.attempts": 3, "fixed-delay.delay": "100 ms"},
    )
    verdict = verify_output(sink, truth, finished=True)
    assert verdict.ok, verdict.problems
    restarts = job.history.events([ev.RESTART])
    assert [e.data["level"] for e in restarts] == ["query", "query"]
    assert all(e.data["restart"] for e in restarts)
    assert len(job.history.events([ev.RESTORED])) == 2


def test_restart_strategy_exhausted_raises(
    spark: Any, file_storage: CheckpointStorage, numbers: tuple[Path, GroundTruth], tmp_path: Path
) -> None:
    from airflow_ckpt.errors import RestartsExhaustedError

    input_dir, _ = numbers
    with pytest.raises(RestartsExhaustedError, match="injected failure"):
        run_job(spark, file_storage, input_dir, tmp_path / "w", fail_at=1, fail_times=5,
                restart={"type": "fixed-delay", "fixed-delay.attempts": 1,
                         "fixed-delay.delay": "10 ms"})
    history = JobHistory(file_storage, "inproc")
    assert [e.data["restart"] for e in history.events([ev.RESTART])] == [True, False]
    assert history.events([ev.JOB_FAILED])


def test_partial_and_corrupt_checkpoints_are_never_restored(
    spark: Any, file_storage: CheckpointStorage, numbers: tuple[Path, GroundTruth], tmp_path: Path
) -> None:
    input_dir, _ = numbers
    run_job(spark, file_storage, input_dir, tmp_path / "w")
    catalog = CheckpointCatalog(file_storage, "inproc")
    older, newest = catalog.completed_checkpoints()
    layout = JobLayout("inproc")
    # A crash between upload and marker: every file of a newer checkpoint, no _metadata.
    for f in newest.files:
        file_storage.put_bytes(layout.checkpoint_file(99, f.path), b"partial")
    # Damage one file the newest completed checkpoint references but the older does not.
    victim = next(f for f in newest.files if f.key not in {g.key for g in older.files})
    file_storage.put_bytes(layout.root + victim.key, b"garbage")

    history = JobHistory(file_storage, "inproc")
    result = restore(file_storage, "inproc", "latest", tmp_path / "r", history)
    assert result.manifest is not None
    assert result.manifest.checkpoint_id == older.checkpoint_id
    fallback = history.events([ev.RESTORE_FALLBACK])
    assert fallback and fallback[-1].data["path"].endswith(f"chk-{newest.checkpoint_id}")
    with pytest.raises(RestoreError, match=r"sha256|bytes|SHA-256"):
        restore(file_storage, "inproc", f"chk-{newest.checkpoint_id}", tmp_path / "r2", history)
    # Restore only reads: both checkpoints are still there, byte for byte.
    assert catalog.checkpoint_ids() == [older.checkpoint_id, newest.checkpoint_id]
    # The next driver sweeps the abandoned marker-less directory.
    store = CompletedCheckpointStore(file_storage, "inproc", num_retained=2)
    assert store.recover() == 100
    assert 99 not in catalog.checkpoint_ids(completed_only=False)


def test_restore_none_starts_fresh_and_latest_never_goes_back(
    spark: Any, file_storage: CheckpointStorage, numbers: tuple[Path, GroundTruth], tmp_path: Path
) -> None:
    input_dir, truth = numbers
    run_job(spark, file_storage, input_dir, tmp_path / "w")
    before = CheckpointCatalog(file_storage, "inproc").latest_checkpoint()
    assert before is not None
    file_storage.delete_prefix("_out/")
    job, sink = run_job(spark, file_storage, input_dir, tmp_path / "w", restore_target="none")
    # A fresh start reprocesses everything: same ground truth from scratch.
    assert verify_output(sink, truth, finished=True).ok
    initial = [e for e in job.history.events([ev.CHECKPOINT_COMPLETED])
               if e.data["trigger"] == "initial"]
    assert initial and initial[-1].data["batch_id"] == -1
    assert initial[-1].data["id"] > before.checkpoint_id


@pytest.fixture
def rocksdb(spark: Any) -> Any:
    key = "spark.sql.streaming.stateStore.providerClass"
    spark.conf.set(key, "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    yield spark
    spark.conf.unset(key)


def test_restore_with_a_different_number_of_state_partitions(
    rocksdb: Any, file_storage: CheckpointStorage, tmp_path: Path
) -> None:
    first = write_numbers(tmp_path / "in", files=4, per_file=30)
    run_job(rocksdb, file_storage, tmp_path / "in", tmp_path / "w")
    catalog = CheckpointCatalog(file_storage, "inproc")
    before = catalog.latest_checkpoint()
    assert before is not None and {op.num_partitions for op in before.operators} == {3}
    more = write_numbers(tmp_path / "in2", files=4, per_file=30, start=121)
    for f in (tmp_path / "in2").iterdir():
        f.rename(tmp_path / "in" / f"g{f.name}")
    _, sink = run_job(rocksdb, file_storage, tmp_path / "in", tmp_path / "w",
                        restore_target=f"chk-{before.checkpoint_id}", state_partitions=5)
    after = catalog.latest_checkpoint()
    assert after is not None and {op.num_partitions for op in after.operators} == {5}
    expected = {k: (first.totals[k][0] + more.totals[k][0], first.totals[k][1] + more.totals[k][1])
                for k in first.totals}
    final: dict[str, tuple[int, int]] = {}
    for row in sink.committed_rows():
        final[row["key"]] = (row["count"], row["sum"])
    assert final == expected


def test_restoring_state_of_a_different_query_is_a_clear_error(
    spark: Any, file_storage: CheckpointStorage, numbers: tuple[Path, GroundTruth], tmp_path: Path
) -> None:
    from airflow_ckpt.errors import IncompatibleStateError

    input_dir, _ = numbers
    run_job(spark, file_storage, input_dir, tmp_path / "w")
    newest = CheckpointCatalog(file_storage, "inproc").latest_checkpoint()
    assert newest is not None
    (input_dir / "late.txt").write_text("1000\n")
    with pytest.raises(IncompatibleStateError, match="does not fit this query"):
        run_job(spark, file_storage, input_dir, tmp_path / "w2", count_only=True,
                restore_target=f"chk-{newest.checkpoint_id}",
                restart={"type": "fixed-delay", "fixed-delay.attempts": 3})


def test_stateless_query_with_a_failure_outputs_every_number_exactly_once(
    spark: Any, s3_storage: CheckpointStorage, numbers: tuple[Path, GroundTruth], tmp_path: Path
) -> None:
    """No state store at all: offsets and sink transactions alone make it exactly-once."""
    from pyspark.sql import functions as F

    input_dir, truth = numbers
    job = CheckpointedJob(
        spark, job="stateless", storage=s3_storage, checkpoint_config=CONFIG,
        restart_strategy={"type": "fixed-delay", "fixed-delay.attempts": 2,
                          "fixed-delay.delay": "10 ms"},
        workdir=tmp_path / "w",
    )
    sink = JsonLinesSink(s3_storage, "_raw")
    write = job.exactly_once(sink)
    failed = [False]

    def each_batch(df: Any, batch_id: int) -> None:
        time.sleep(0.15)
        write(df, batch_id)  # pre-committed, then the query dies before the batch commits
        if batch_id == 3 and not failed[0]:
            failed[0] = True
            raise RuntimeError("injected failure after pre-commit")

    job.run(lambda: spark.readStream.option("maxFilesPerTrigger", 1).text(str(input_dir))
            .select(F.col("value").cast("long").alias("n"))
            .writeStream.foreachBatch(each_batch).trigger(availableNow=True))
    numbers_out = sorted(int(row["n"]) for row in sink.committed_rows())
    assert numbers_out == list(range(1, truth.numbers + 1))  # none lost, none twice
    assert sink.pending() == []
    manifests = CheckpointCatalog(s3_storage, "stateless").completed_checkpoints()
    assert manifests and all(m.operators == () for m in manifests)
    assert all(not f.path.startswith("state/") for m in manifests for f in m.files)


def test_latest_refuses_a_fresh_start_when_no_retained_checkpoint_verifies(
    spark: Any, file_storage: CheckpointStorage, numbers: tuple[Path, GroundTruth], tmp_path: Path
) -> None:
    """Issue 8 defect 2: before, every checkpoint damaged meant a silent fresh start,
    aborting promised transactions and replaying from batch 0 over published output."""
    input_dir, _ = numbers
    run_job(spark, file_storage, input_dir, tmp_path / "w")
    catalog = CheckpointCatalog(file_storage, "inproc")
    retained = catalog.completed_checkpoints()
    layout = JobLayout("inproc")
    for m in retained:  # damage a file of each, byte for byte the same size
        victim = next(f for f in m.files if f.path.startswith("offsets/"))
        file_storage.put_bytes(layout.root + victim.key, b"x" * victim.size)
    history = JobHistory(file_storage, "inproc")
    with pytest.raises(RestoreError) as err:
        restore(file_storage, "inproc", "latest", tmp_path / "r", history)
    message = str(err.value)
    for m in retained:
        assert f"chk-{m.checkpoint_id}" in message
    assert "restore=none" in message
    # The job fails for good instead of starting over; nothing was committed again.
    before = JsonLinesSink(file_storage, "_out").committed_batches()
    with pytest.raises(RestoreError):
        run_job(spark, file_storage, input_dir, tmp_path / "w")
    assert JsonLinesSink(file_storage, "_out").committed_batches() == before
    assert history.events([ev.JOB_FAILED])[-1].data["error"] == "RestoreRefusedError"


def test_a_fallback_never_subsumes_the_checkpoint_it_restored_from(
    spark: Any, file_storage: CheckpointStorage, numbers: tuple[Path, GroundTruth], tmp_path: Path
) -> None:
    """Issue 8 defect 2, second part: with num-retained 1 the recovered store kept the
    damaged newest checkpoint and deleted the one just restored from."""
    input_dir, _ = numbers
    one = {**CONFIG, "execution.checkpointing.num-retained": 1}
    run_job(spark, file_storage, input_dir, tmp_path / "w", config=one)
    layout = JobLayout("inproc")
    catalog = CheckpointCatalog(file_storage, "inproc")
    (newest,) = catalog.completed_checkpoints()
    # An older checkpoint (a full copy: no shared files) stays restorable; the newest
    # becomes damaged.
    older_id = newest.checkpoint_id - 1
    for f in newest.files:  # each file's bytes (a segment, when merged)
        with file_storage.open_stream(layout.root + f.key, f.offset or 0, f.size) as src:
            file_storage.put_bytes(layout.checkpoint_file(older_id, f.path), src.read(f.size))
    older = Manifest(**{**{k: getattr(newest, k) for k in newest.__dataclass_fields__},
                        "checkpoint_id": older_id, "retention_floor": older_id,
                        "files": tuple(type(f)(f.path, f"chk-{older_id}/{f.path}", f.size,
                                               f.sha256, False) for f in newest.files)})
    file_storage.put_bytes(layout.checkpoint_metadata(older_id), older.to_json())
    # as if that run had retained 2: the newest's retention floor keeps the older one
    file_storage.put_bytes(layout.checkpoint_metadata(newest.checkpoint_id), Manifest(**{
        **{k: getattr(newest, k) for k in newest.__dataclass_fields__},
        "retention_floor": older_id}).to_json())
    victim = next(f for f in newest.files if f.path.startswith("offsets/"))
    file_storage.put_bytes(layout.root + victim.key, b"x" * victim.size)
    (input_dir / "more.txt").write_text("1001\n1002\n")

    job, _ = run_job(spark, file_storage, input_dir, tmp_path / "w", config=one)
    restored = job.history.events([ev.RESTORED])[-1]
    assert restored.data["checkpoint_id"] == older_id
    # It completed a checkpoint of its own, so the pin is gone and retention is 1 again,
    # but at no point was the restored checkpoint deleted while it was the only good one.
    assert len(catalog.checkpoint_ids()) == 1
    assert catalog.checkpoint_ids()[0] > newest.checkpoint_id


def test_a_sink_registered_inside_build_is_recovered(
    spark: Any, file_storage: CheckpointStorage, numbers: tuple[Path, GroundTruth], tmp_path: Path
) -> None:
    """Issue 8 defect 3 (the README's pattern): the driver died between the final
    checkpoint's ``_metadata`` and its commit; the next driver registers its sink inside
    ``build`` and must still commit those transactions."""
    from pyspark.sql import functions as F

    input_dir, truth = numbers

    class DiesBeforeCommit(JsonLinesSink):
        def commit(self, batch_id: int) -> None:
            raise RuntimeError("killed before the commit")

        def commit_batches(self, batch_ids: Iterable[int]) -> None:  # a completion's
            raise RuntimeError("killed before the commit")

    def build_with(sink: JsonLinesSink, job: CheckpointedJob) -> Any:
        n = F.col("value").cast("long")
        key = F.when(n % 2 == 0, "even").otherwise("odd")
        agg = (spark.readStream.option("maxFilesPerTrigger", 2).text(str(input_dir))
               .groupBy(key.alias("key")).agg(F.count("*").alias("count"),
                                             F.sum(n).alias("sum")))
        return (agg.writeStream.outputMode("update")
                .foreachBatch(job.exactly_once(sink)).trigger(availableNow=True))

    first = CheckpointedJob(spark, job="inbuild", storage=file_storage,
                            checkpoint_config=CONFIG, workdir=tmp_path / "w")
    first.run(lambda: build_with(DiesBeforeCommit(file_storage, "_built"), first))
    sink = JsonLinesSink(file_storage, "_built")
    assert sink.committed_batches() == [] and sink.pending()

    second = CheckpointedJob(spark, job="inbuild", storage=file_storage,
                             checkpoint_config=CONFIG, workdir=tmp_path / "w")
    second.run(lambda: build_with(JsonLinesSink(file_storage, "_built"), second))
    assert sink.pending() == []
    assert verify_output(sink, truth, finished=True).ok


def test_a_long_run_past_min_batches_to_retain_never_fails_a_checkpoint(
    spark: Any, s3_storage: CheckpointStorage, tmp_path: Path
) -> None:
    """Issue 8 defect 7: Spark purges old offsets/commits right after ``commits/b``,
    while the sync phase walks the directory; a job past ``minBatchesToRetain`` batches
    died of it. Here it purges at every batch and a checkpoint is due at every batch."""
    truth = write_numbers(tmp_path / "in", files=36, per_file=5)
    spark.conf.set("spark.sql.streaming.minBatchesToRetain", "2")
    try:
        every_batch = {**CONFIG, "execution.checkpointing.interval": "10 ms",
                       "execution.checkpointing.tolerable-failed-checkpoints": 0}
        job, sink = run_job(spark, s3_storage, tmp_path / "in", tmp_path / "w",
                            config=every_batch)
    finally:
        spark.conf.unset("spark.sql.streaming.minBatchesToRetain")
    assert verify_output(sink, truth, finished=True).ok
    assert job.history.events([ev.CHECKPOINT_FAILED]) == []
    assert len(job.history.events([ev.CHECKPOINT_COMPLETED])) >= 10
    assert sorted(int(p.name) for p in (tmp_path / "w" / "work" / "commits").iterdir()
                  if p.name.isdigit())[0] > 2  # Spark did purge while we checkpointed
