"""Real Spark: adopt a plain Spark query and leave again (issue 29 item 3).

A keyed running sum over a file source (``groupBy(key).sum``, output mode update, one
file per batch) goes through three lives, each writing ``(batch, key, sum)`` rows:

1. plain Spark with its own ``checkpointLocation``: batches 0..2, then it stops;
2. ``airflow-ckpt import`` of that directory as a savepoint of a job in S3 (the real
   endpoint), and a ``CheckpointedJob`` restoring it (``restore=<savepoint>``) through
   ``ParquetSink`` exactly once: batches 3..5, its final checkpoint at batch 5;
3. ``airflow-ckpt export`` of that checkpoint to a new directory, and plain Spark
   again on it: batches 6..7.

Both Spark checkpoint directories (the one imported, the one exported to) are local, or
on a real HDFS (Hadoop's mini cluster, tests/fixtures/hdfs.py; snapshots allowed, so
the import pins its batch with one).

The ground truth is the input alone: every batch id appears once in all the output
(a batch run twice writes its file twice: the plain sink's exclusive create fails the
query, the Parquet sink commits a batch id once), and the last sum of every key equals
the sum of its numbers over all the files (the state crossed both borders intact).
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_ckpt.cli import main as cli_main
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.sinks import ParquetSink
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.testing import S3Endpoint
from airflow_ckpt.testing.hdfs_cluster import hadoop_fs
from airflow_ckpt.testing.numbers import write_numbers
from tests.fixtures.hdfs import read_files, write_files

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

JOB = "adopted"
PER_FILE = 40
KEYS = 7


@pytest.fixture
def aws_env(s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials and region from the environment, as an admin's shell has them."""
    for name, value in s3_endpoint.env().items():
        if name != "AWS_ENDPOINT_URL":  # the CLI gets --endpoint-url
            monkeypatch.setenv(name, value)


def cli(endpoint: S3Endpoint, storage: CheckpointStorage, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = cli_main(["--storage", storage.uri, "--endpoint-url", endpoint.url, *argv], out=out)
    return code, out.getvalue()


def add_files(input_dir: Path, files: int, first_file: int) -> None:
    """Input files with increasing modification times (the file source's order)."""
    write_numbers(input_dir, files=files, per_file=PER_FILE, first_file=first_file,
                  start=first_file * PER_FILE + 1)
    for i in range(first_file, first_file + files):
        stamp = 1_700_000_000 + i
        os.utime(input_dir / f"f{i:05d}.txt", (stamp, stamp))


def ground_truth(files: int) -> dict[int, int]:
    sums: dict[int, int] = defaultdict(int)
    for n in range(1, files * PER_FILE + 1):
        sums[n % KEYS] += n
    return dict(sums)


def running_sums(spark: Any, input_dir: Path) -> Any:
    """The query: per key, the running sum of the numbers read so far (Spark state)."""
    from pyspark.sql import functions as F

    numbers = (spark.readStream.option("maxFilesPerTrigger", 1).text(str(input_dir))
               .select(F.col("value").cast("long").alias("n")))
    return (numbers.groupBy((F.col("n") % KEYS).alias("key"))
            .agg(F.sum("n").alias("total")))


def plain_spark(spark: Any, input_dir: Path, checkpoint: str, out: Path) -> None:
    """Plain Spark, no airflow-ckpt: its own checkpointLocation; each batch's rows go to
    ``out/<batch>.json``, created exclusively (a batch run again fails the query)."""
    out.mkdir(parents=True, exist_ok=True)

    def each_batch(df: Any, batch_id: int) -> None:
        rows = [[batch_id, r["key"], r["total"]] for r in df.collect()]
        with (out / f"{batch_id}.json").open("x") as fh:
            json.dump(rows, fh)

    query = (running_sums(spark, input_dir).writeStream.outputMode("update")
             .foreachBatch(each_batch).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None


def plain_rows(out: Path) -> list[list[int]]:
    return [row for f in sorted(out.glob("*.json")) for row in json.loads(f.read_text())]


def checkpointed(spark: Any, storage: CheckpointStorage, input_dir: Path, table: str,
                 workdir: Path, restore: str) -> None:
    job = CheckpointedJob(
        spark, job=JOB, storage=storage, restore=restore, workdir=workdir,
        checkpoint_config={"execution.checkpointing.interval": "1 min"},
        restart_strategy={"type": "none"})
    write = job.exactly_once(ParquetSink(table))

    def each_batch(df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        write(df.withColumn("batch", F.lit(batch_id)), batch_id)

    job.run(lambda: running_sums(spark, input_dir).writeStream.outputMode("update")
            .foreachBatch(each_batch).trigger(availableNow=True))


def last_sums(rows: list[list[int]]) -> dict[int, int]:
    """Each key's sum in the newest batch that emitted it."""
    latest: dict[int, tuple[int, int]] = {}
    for batch, key, total in rows:
        if key not in latest or batch > latest[key][0]:
            latest[key] = (batch, total)
    return {key: total for key, (_, total) in latest.items()}


def batch_ids(rows: list[list[int]]) -> list[int]:
    return sorted({row[0] for row in rows})


#: Spark confs of each state store: the default (HDFS-backed: ``.delta``/``.snapshot``
#: files) and RocksDB with changelog checkpointing (``.changelog`` files; ``.zip`` and
#: ``SSTs/`` once maintenance uploaded a snapshot)
STATE_STORES = {
    "hdfs": {},
    "rocksdb": {
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    },
}


#: the RocksDB variant runs in make soak (make test keeps the default store's round trip)
@pytest.fixture(params=["hdfs", pytest.param("rocksdb", marks=pytest.mark.soak)])
def state_store(spark: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """The session's state store for one test (Spark pins it in the checkpoint's first
    offset log entry; every later query on the checkpoint reads it from there)."""
    confs = STATE_STORES[request.param]
    for key, value in confs.items():
        spark.conf.set(key, value)
    yield request.param
    for key in confs:
        spark.conf.unset(key)


def state_suffixes(spark: Any, checkpoint: str) -> set[str]:
    return {Path(rel).suffix for rel in read_files(spark, f"{checkpoint}/state")}


@pytest.fixture(params=["local", "hdfs"])
def spark_dirs(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the plain Spark checkpoints go (a URI): a local directory, or one on HDFS."""
    if request.param == "hdfs":
        return str(request.getfixturevalue("hdfs_dir"))
    (tmp_path / "spark").mkdir()
    return (tmp_path / "spark").as_uri()


def left_behind(spark: Any, spark_dirs: str) -> list[str]:
    """What import and export may have left beside the checkpoints: hidden staging
    directories, HDFS snapshots."""
    fs, path = hadoop_fs(spark, spark_dirs)
    names = [s.getPath().getName() for s in fs.listStatus(path(spark_dirs))]
    if fs.getFileStatus(path(spark_dirs)).isSnapshotEnabled():
        names += [s.getPath().getName() for s in fs.listStatus(path(f"{spark_dirs}/.snapshot"))]
    return [n for n in names if n not in ("own-checkpoint", "exported")]


def test_plain_spark_to_checkpointed_job_and_back_is_exact(
        spark: Any, s3_endpoint: S3Endpoint, s3_storage: CheckpointStorage, aws_env: None,
        tmp_path: Path, state_store: str, spark_dirs: str) -> None:
    input_dir, plain_out = tmp_path / "in", tmp_path / "plain-out"
    # 1. plain Spark: batches 0..2
    add_files(input_dir, 3, 0)
    own = f"{spark_dirs}/own-checkpoint"
    plain_spark(spark, input_dir, own, plain_out)
    assert batch_ids(plain_rows(plain_out)) == [0, 1, 2]
    assert last_sums(plain_rows(plain_out)) == ground_truth(3)
    assert (".changelog" if state_store == "rocksdb" else ".delta") in state_suffixes(spark,
                                                                                       own)

    # 2. import: a savepoint of JOB; the checkpointed job restores it: batches 3..5
    code, out = cli(s3_endpoint, s3_storage, "import", own, "--job", JOB,
                    "--savepoint-name", "from-spark")
    assert code == 0, out
    sp = CheckpointCatalog(s3_storage, JOB).savepoint("from-spark")
    assert (sp.kind, sp.batch_id, sp.extra["imported_from"]) == ("savepoint", 2, own)
    assert left_behind(spark, spark_dirs) == []  # staging links, snapshots removed
    (imported,) = JobHistory(s3_storage, JOB).events([ev.SAVEPOINT_COMPLETED])
    assert imported.data["imported_from"] == own
    assert imported.data["savepoint_id"] == "from-spark"
    code, _ = cli(s3_endpoint, s3_storage, "import", own, "--job", JOB,
                  "--savepoint-name", "from-spark")
    assert code == 1  # a savepoint is never replaced

    add_files(input_dir, 3, 3)
    table = tmp_path / "table"
    checkpointed(spark, s3_storage, input_dir, table.as_uri(), tmp_path / "work",
                 restore="savepoints/sp-from-spark")
    assert ParquetSink(table.as_uri()).committed_batches() == [3, 4, 5]  # none again
    parquet = pq.read_table(table).to_pylist()
    job_rows = [[r["batch"], r["key"], r["total"]] for r in parquet]
    (restored,) = JobHistory(s3_storage, JOB).events([ev.RESTORED])
    assert (restored.data["kind"], restored.data["batch_id"]) == ("savepoint", 2)
    assert last_sums(plain_rows(plain_out) + job_rows) == ground_truth(6)

    # 3. export the job's final checkpoint; plain Spark resumes from it: batches 6..7
    final = CheckpointCatalog(s3_storage, JOB).latest_checkpoint()
    assert final is not None and final.batch_id == 5
    exported = f"{spark_dirs}/exported"
    write_files(spark, exported, {"stray": "x"})
    code, _ = cli(s3_endpoint, s3_storage, "export", f"{JOB}/chk-{final.checkpoint_id}",
                  exported)
    assert code == 1 and read_files(spark, exported) == {"stray": b"x"}  # refused, untouched
    fs, path = hadoop_fs(spark, exported)
    fs.delete(path(exported), True)
    code, out = cli(s3_endpoint, s3_storage, "export", f"{JOB}/chk-{final.checkpoint_id}",
                    exported)
    assert code == 0, out
    assert left_behind(spark, spark_dirs) == []
    add_files(input_dir, 2, 6)
    later_out = tmp_path / "later-out"
    plain_spark(spark, input_dir, exported, later_out)
    assert batch_ids(plain_rows(later_out)) == [6, 7]
    assert sorted(int(rel) for rel in read_files(spark, f"{exported}/commits")
                  if rel.isdigit())[-3:] == [5, 6, 7]

    everything = plain_rows(plain_out) + job_rows + plain_rows(later_out)
    for key in range(KEYS):  # every batch once, each emitting every key once
        assert sorted(row[0] for row in everything if row[1] == key) == list(range(8))
    assert last_sums(everything) == ground_truth(8)


def test_import_refuses_what_is_not_a_stopped_spark_checkpoint(
        spark: Any, s3_endpoint: S3Endpoint, s3_storage: CheckpointStorage, aws_env: None,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    input_dir = tmp_path / "in"
    add_files(input_dir, 2, 0)
    own = tmp_path / "own"
    plain_spark(spark, input_dir, str(own), tmp_path / "out")

    def refused(source: Path | str, *extra: str) -> str:
        code, _ = cli(s3_endpoint, s3_storage, "import", str(source), "--job", JOB, *extra)
        assert code == 1
        return capsys.readouterr().err

    not_spark = tmp_path / "not-spark"
    not_spark.mkdir()
    (not_spark / "part-0000.parquet").write_text("x")
    assert "not a Spark checkpoint directory" in refused(not_spark)
    running = tmp_path / "running"
    shutil.copytree(own, running)
    shutil.copy(running / "offsets" / "1", running / "offsets" / "2")  # planned, no commit
    message = refused(running)
    assert "batch 2 is planned" in message and "seems to be running" in message
    assert "hdfs://" not in message
    assert "s3a:// is not a filesystem" in refused("s3a://bucket/ckpt")
    assert CheckpointCatalog(s3_storage, JOB).savepoint_dirs() == []  # nothing written

    code, out = cli(s3_endpoint, s3_storage, "import", str(running), "--job", JOB,
                    "--allow-uncommitted-batch", "--json")
    assert code == 0, out
    assert json.loads(out)["batch_id"] == 1
    assert json.loads(out)["savepoint_id"].endswith("-b1")  # the default name

