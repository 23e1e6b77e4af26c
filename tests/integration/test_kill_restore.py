"""kill -9 of a real driver at random points; the restored result equals the ground truth.

Real parts only: the example job runs as its own ``python`` driver process with local
Spark, checkpoints go to the real moto S3 endpoint on 127.0.0.1 through boto3. The
ground truth comes from the input files alone. Kills land at random moments: JVM
start, restore, mid-batch, mid-upload, between upload and ``_metadata``.
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.sinks import JsonLinesSink, ParquetSink
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.testing.numbers import (
    PAUSE_AT,
    PAUSED_FILE,
    JobSpec,
    after_checkpoint,
    after_seconds,
    finished_job_problems,
    kill_hard,
    killed_run_problems,
    run_with_kills,
    start_job,
    verify_output,
    wait_for_file,
    write_numbers,
)
from airflow_ckpt.testing.s3_server import S3Endpoint

pytestmark = pytest.mark.integration

KILLS = 3


@pytest.mark.parametrize(
    "variant", [
        pytest.param(["--state-store", "hdfs"], id="hdfs-odd-even", marks=pytest.mark.soak),
        pytest.param(["--state-store", "rocksdb", "--keyed"], id="rocksdb-keyed"),
    ],
)
def test_random_kills_then_exact_result(
    variant: list[str], s3_endpoint: S3Endpoint, s3_uri: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("KILL_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    print(f"KILL_SEED={seed}")
    truth = write_numbers(tmp_path / "in", files=16, per_file=50, keyed="--keyed" in variant)
    spec = JobSpec(
        job="kill-test", storage_uri=s3_uri, input_dir=tmp_path / "in",
        output_uri=s3_uri + "-out",
        checkpoint_config={
            "execution.checkpointing.interval": "300 ms",
            "execution.checkpointing.num-retained": 2,
            "execution.checkpointing.incremental": True,
        },
        confs={"spark.airflow_ckpt.demo.batch_delay_s": "0.3"},
        extra_args=variant, workdir=tmp_path / "driver",
    )
    env = s3_endpoint.env()
    storage = s3_endpoint.storage(s3_uri)
    sink = JsonLinesSink(s3_endpoint.storage(spec.output_uri), "")

    def after_kill(round_: int) -> None:
        # Two-phase commit: no output is visible unless a completed checkpoint covers it.
        problems = killed_run_problems(storage, spec.job, sink, truth)
        assert not problems, f"seed {seed}, kill {round_ + 1}: {problems}"

    # the JVM takes ~5 s to start: kills land in it, in restore, mid-batch, mid-upload
    kills = run_with_kills(spec, env, tmp_path / "driver.log", kills=KILLS,
                           moment=after_seconds(6.0, 14.0, rng), after_kill=after_kill)
    assert kills >= 1, f"seed {seed}: the driver finished before the first kill"

    verdict = verify_output(sink, truth, finished=True)
    assert verdict.ok, f"seed {seed}: {verdict.problems}"
    problems = finished_job_problems(storage, spec.job, num_retained=2)
    assert not problems, f"seed {seed}: {problems}"


@pytest.mark.soak
def test_a_second_driver_of_the_same_job_is_refused_and_loses_nothing(
    s3_endpoint: S3Endpoint, s3_uri: str, tmp_path: Path
) -> None:
    truth = write_numbers(tmp_path / "in", files=10, per_file=20)
    spec = JobSpec(
        job="two-drivers", storage_uri=s3_uri, input_dir=tmp_path / "in",
        output_uri=s3_uri + "-out",
        checkpoint_config={"execution.checkpointing.interval": "500 ms"},
        confs={"spark.airflow_ckpt.demo.batch_delay_s": "4"},
        workdir=tmp_path / "a",
    )
    env = s3_endpoint.env()
    storage = s3_endpoint.storage(s3_uri)
    first = start_job(spec, env, tmp_path / "a.log")
    try:
        deadline = time.time() + 120
        while not CheckpointCatalog(storage, spec.job).checkpoint_ids():
            assert time.time() < deadline and first.poll() is None, (tmp_path / "a.log").read_text()
            time.sleep(0.5)
        second_spec = dataclasses.replace(spec, workdir=tmp_path / "b")
        second = start_job(second_spec, env, tmp_path / "b.log")
        assert second.wait(timeout=180) != 0, (tmp_path / "b.log").read_text()[-3000:]
        log = (tmp_path / "b.log").read_text()
        assert "ConcurrentDriverError" in log and "is being run by another driver" in log
        assert first.wait(timeout=300) == 0, (tmp_path / "a.log").read_text()[-3000:]
    finally:
        kill_hard(first)
    verdict = verify_output(JsonLinesSink(s3_endpoint.storage(spec.output_uri), ""), truth,
                            finished=True)
    assert verdict.ok, verdict.problems


# ------------------------------------------------------------------ ParquetSink

#: where a driver life is killed; the pause points block the thread that reaches them
#: (the other threads, the query's included, run on) until the kill lands
PARQUET_PHASES: dict[str, tuple[str, int, int] | None] = {
    # executors uploaded the batch's staged files; the _txn record is not written
    "staging": (interleave.SINK_STAGED_BEFORE_RECORD, 1, 3),
    # the commit decision is durable; the n-th file (of 4 per batch) is about to publish
    "commit": (interleave.SINK_BEFORE_PUBLISH_FILE, 2, 7),
    # the checkpoint's _metadata is durable; its pending transactions not yet committed
    "metadata": (interleave.COMPLETE_BEFORE_ADD, 2, 3),
    # a random moment within ~2 batches after this life's first checkpoint
    "random": None,
}


def _plain_dataset(s3_endpoint: S3Endpoint, uri: str) -> pa.Table:
    """The table as a plain pyarrow reader sees it, straight from the S3 endpoint or the
    local directory."""
    from pyarrow import fs

    if uri.startswith("file://"):
        source, filesystem = urlparse(uri).path, fs.LocalFileSystem()
    else:
        url = urlparse(s3_endpoint.url)
        source = uri.removeprefix("s3://")
        filesystem = fs.S3FileSystem(
            access_key=s3_endpoint.access_key_id, secret_key=s3_endpoint.secret_access_key,
            region=s3_endpoint.region_name, endpoint_override=url.netloc, scheme=url.scheme,
        )
    try:
        return ds.dataset(source, filesystem=filesystem, format="parquet").to_table()
    except FileNotFoundError:  # nothing written under the table directory yet
        return pa.table({})


def _visible_problems(table: pa.Table, latest_batch: int | None) -> list[str]:
    """A plain reader's view after a kill: no number twice, no batch newer than the
    latest completed checkpoint."""
    problems = []
    numbers = table.column("n").to_pylist() if table.num_rows else []
    if len(numbers) != len(set(numbers)):
        problems.append(f"{len(numbers) - len(set(numbers))} numbers visible twice")
    batches = set(table.column("batch").to_pylist()) if table.num_rows else set()
    if batches and (latest_batch is None or max(batches) > latest_batch):
        problems.append(f"batch {max(batches)} visible; latest checkpoint: {latest_batch}")
    return problems


def _landed_in(phase: str, sink: ParquetSink, storage: CheckpointStorage, job: str) -> bool:
    """Whether what the dead driver left shows the phase it was killed in."""
    txns = {int(i.key.rsplit("/", 1)[-1][:-5]) for i in sink.storage.list("_txn/")}
    staged = {int(d) for d in sink.storage.list_dirs("_staging/") if d.isdigit()}
    committed = set(sink.committed_batches())
    if phase == "staging":  # staged files of a batch without its record
        return bool(staged - txns - committed)
    if phase == "commit":  # a decision whose clean-up did not run
        return bool(committed & txns)
    if phase == "metadata":  # the newest marker's transactions are not committed yet
        latest = CheckpointCatalog(storage, job).latest_checkpoint()
        return latest is not None and bool(set(latest.pending_transactions) - committed)
    return True


@pytest.mark.timeout(900)  # five driver lives: ~2 min idle, 5-9 min on a loaded 2-core CI
@pytest.mark.parametrize("table", [
    pytest.param("s3"),
    pytest.param("file", marks=pytest.mark.soak),
])
def test_parquet_sink_under_kills_during_staging_commit_and_after_the_marker(
    table: str, s3_endpoint: S3Endpoint, s3_uri: str, tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The real driver writes through ``job.exactly_once(ParquetSink(...))`` (on S3 the
    executors stage Parquet files with pyarrow and boto3, on ``file://`` with Spark's own
    writer); it is killed once in each phase, in a seeded order, at a seeded arrival;
    after each kill a plain reader sees no number twice and nothing newer than the
    latest checkpoint; at the end pyarrow, pandas and ``spark.read.parquet`` see every
    input number exactly once, and nothing is staged or pending."""
    seed = int(os.environ.get("KILL_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    phases = rng.sample(sorted(PARQUET_PHASES), len(PARQUET_PHASES))
    print(f"KILL_SEED={seed} phases={phases}")
    truth = write_numbers(tmp_path / "in", files=16, per_file=100)
    storage = s3_endpoint.storage(s3_uri)
    if table == "file":
        table_uri = (tmp_path / "table").as_uri()
        sink = ParquetSink(table_uri)  # the test's own reader
    else:
        table_uri = s3_uri + "-table"
        sink = ParquetSink(table_uri, endpoint_url=s3_endpoint.url,
                           region_name=s3_endpoint.region_name,
                           aws_access_key_id=s3_endpoint.access_key_id,
                           aws_secret_access_key=s3_endpoint.secret_access_key)
    job = "parquet-kill"
    paused = tmp_path / "paused"
    paused.mkdir()

    def spec_of(round_: int) -> JobSpec:
        confs = {"spark.airflow_ckpt.demo.batch_delay_s": "0.2"}
        plan = PARQUET_PHASES[phases[round_]] if round_ < len(phases) else None
        if plan is not None:
            point, low, high = plan
            confs[PAUSE_AT] = f"{point}:{rng.randint(low, high)}"
            confs[PAUSED_FILE] = str(paused / f"life-{round_}")
        print(f"life {round_}: {phases[round_] if round_ < len(phases) else 'to the end'} "
              f"{confs.get(PAUSE_AT, '')}")
        return JobSpec(
            job=job, storage_uri=s3_uri, input_dir=tmp_path / "in", output_uri=table_uri,
            checkpoint_config={
                "execution.checkpointing.interval": "300 ms",
                "execution.checkpointing.num-retained": 2,
                "execution.checkpointing.incremental": True,
            },
            confs=confs, workdir=tmp_path / "driver",
            extra_args=["--distinct", "--sink", "parquet", "--state-store", "rocksdb"],
        )

    random_moment = after_checkpoint(storage, job, rng, within_s=2.0)

    def moment(proc: subprocess.Popen[bytes], round_: int) -> bool:
        if phases[round_] == "random":
            return random_moment(proc, round_)
        return wait_for_file(paused / f"life-{round_}", proc, timeout_s=300)

    landed: list[str] = []

    def after_kill(round_: int) -> None:
        latest = CheckpointCatalog(storage, job).latest_checkpoint()
        problems = _visible_problems(_plain_dataset(s3_endpoint, table_uri),
                                     latest.batch_id if latest else None)
        assert not problems, f"seed {seed}, kill {round_ + 1} ({phases[round_]}): {problems}"
        assert _landed_in(phases[round_], sink, storage, job), (
            f"seed {seed}: kill {round_ + 1} did not leave a {phases[round_]} state: "
            f"pending {sink.pending()}, committed {sink.committed_batches()}")
        landed.append(phases[round_])

    kills = run_with_kills(spec_of, s3_endpoint.env(), tmp_path / "driver.log",
                           kills=len(phases), moment=moment, after_kill=after_kill)
    print(f"kills landed: {landed}")
    assert kills >= 3, f"seed {seed}: only {landed} landed before the driver finished"

    expected = list(range(1, truth.numbers + 1))
    # plain readers, none knowing about this project: pyarrow on the table itself ...
    seen = _plain_dataset(s3_endpoint, table_uri)
    assert sorted(seen.column("n").to_pylist()) == expected, f"seed {seed}"
    # ... and pandas and Spark on a verbatim copy of every object under the table
    # directory (the wheel's Spark has no s3a)
    copy = tmp_path / "table-copy"
    for info in sink.storage.list(""):
        target = copy.joinpath(*info.key.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(sink.storage.get_bytes(info.key))
    assert sorted(pd.read_parquet(copy)["n"].tolist()) == expected
    spark = request.getfixturevalue("spark")
    rows = spark.read.parquet(str(copy)).select("n", "batch").collect()
    assert sorted(r["n"] for r in rows) == expected
    # every file's rows are of its own batch; batches 0..k each committed once
    for info in sink.storage.list(""):
        if info.key.startswith("part-"):
            part = pq.read_table(copy / info.key)
            assert set(part.column("batch").to_pylist()) == {int(info.key.split("-")[1])}
    assert sink.committed_batches() == list(range(len(sink.committed_batches())))
    assert sink.pending() == []
    assert not sink.storage.list("_staging/") and not sink.storage.list("_txn/")
    problems = finished_job_problems(storage, job, num_retained=2)
    assert not problems, f"seed {seed}: {problems}"
