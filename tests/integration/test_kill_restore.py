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
import time
from pathlib import Path

import pytest

from airflow_ckpt.runtime import history as ev
from airflow_ckpt.runtime.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history import JobHistory
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.testing.numbers import JobSpec, kill_hard, start_job, verify_output, write_numbers
from airflow_ckpt.testing.s3_server import S3Endpoint

pytestmark = pytest.mark.integration

KILLS = 3


@pytest.mark.parametrize(
    "variant", [["--state-store", "hdfs"], ["--state-store", "rocksdb", "--keyed"]],
    ids=["hdfs-odd-even", "rocksdb-keyed"],
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
    catalog = CheckpointCatalog(storage, spec.job)
    log = tmp_path / "driver.log"
    kills = 0
    for _ in range(KILLS):
        proc = start_job(spec, env, log)
        time.sleep(rng.uniform(6.0, 14.0))  # the JVM takes ~5 s to start
        if proc.poll() is not None:  # finished before this kill: a valid, shorter story
            assert proc.returncode == 0, log.read_text()[-3000:]
            break
        kill_hard(proc)
        kills += 1
        # Two-phase commit: no output is visible unless a completed checkpoint covers it.
        latest = catalog.latest_checkpoint()
        committed = sink.committed_batches()
        if committed:
            assert latest is not None and max(committed) <= latest.batch_id, (
                f"seed {seed}: batch {max(committed)} visible, latest checkpoint covers "
                f"{latest.batch_id if latest else None}"
            )
        partial = verify_output(sink, truth, finished=False)
        assert partial.ok, f"seed {seed}: {partial.problems}"
    assert kills >= 1, f"seed {seed}: the driver finished before the first kill"
    proc = start_job(spec, env, log)
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]

    verdict = verify_output(sink, truth, finished=True)
    assert verdict.ok, f"seed {seed}: {verdict.problems}"
    events = JobHistory(storage, spec.job).events()
    assert [e for e in events if e.type == ev.JOB_FINISHED]
    # Every restore came from a completed checkpoint (one with _metadata).
    for restored in (e for e in events if e.type == ev.RESTORED):
        assert restored.data["path"].endswith(f"chk-{restored.data['checkpoint_id']}")
    # Retention: only num-retained checkpoints remain, all of them complete.
    assert len(catalog.checkpoint_ids()) <= 2
    assert catalog.checkpoint_ids() == catalog.checkpoint_ids(completed_only=False)


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
