"""A multi-host Spark cluster with no shared POSIX directory, its working directory on
HDFS: the kill test is exact.

A Spark standalone worker runs in its own mount namespace (``unshare --mount
--propagation private``, as in ``test_executors_on_other_hosts.py``) with a private
tmpfs over the driver's local directory (its ``TMPDIR``, where the runtime stages
captures and restores): no directory of the driver's is shared with the worker and its
executors. Spark's checkpointLocation is ``hdfs://`` on the mini cluster
(tests/fixtures/hdfs.py), which both reach over 127.0.0.1; snapshots are allowed on its
parent. The driver is killed (``kill -9``, process group) after a checkpoint and
restarted with ``restore=latest``; the output equals the ground truth, and the
executors ran on the namespaced worker. The input files stay readable by the worker
(they are the source, not the working directory). Marked ``soak`` (a mini cluster, a
standalone cluster and three driver lives: several minutes on 2 cores).
"""

from __future__ import annotations

import os
import random
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.testing.hdfs_cluster import MiniHdfs, hadoop_fs, make_dir
from airflow_ckpt.testing.numbers import (
    JobSpec,
    after_checkpoint,
    finished_job_problems,
    killed_run_problems,
    run_with_kills,
    verify_output,
    write_numbers,
)
from airflow_ckpt.testing.s3_server import S3Endpoint
from tests.fixtures.spark_standalone import (
    SparkStandalone,
    mount_namespace_problem,
    standalone_cluster,
)

pytestmark = [pytest.mark.integration, pytest.mark.soak]


@pytest.fixture(scope="module")
def isolated_worker(tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[tuple[SparkStandalone, Path]]:
    """A standalone cluster whose worker cannot see the driver's local directory; yields
    the cluster and that directory (the driver's ``TMPDIR``)."""
    base = tmp_path_factory.mktemp("hdfs_other_host")
    probe = base / "probe"
    probe.mkdir()
    if problem := mount_namespace_problem(probe):
        pytest.skip(f"cannot simulate a second host: {problem}")
    driver_local, cluster_dir = base / "driver-local", base / "cluster"
    driver_local.mkdir()
    cluster_dir.mkdir()
    script = (f"set -e; mount -t tmpfs -o size=64m other-host {shlex.quote(str(driver_local))}; "
              'exec "$@"')
    wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "worker"]
    with standalone_cluster(cluster_dir, worker_wrapper=wrapper) as cluster:
        yield cluster, driver_local


@pytest.mark.timeout(1200)
def test_kill_test_on_hdfs_through_a_worker_sharing_no_directory(
    spark: Any, hdfs: MiniHdfs, isolated_worker: tuple[SparkStandalone, Path],
    s3_endpoint: S3Endpoint, s3_uri: str, tmp_path: Path,
) -> None:
    cluster, driver_local = isolated_worker
    seed = int(os.environ.get("KILL_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    print(f"KILL_SEED={seed}")
    base = make_dir(spark, f"{hdfs.uri}/jobs/other-host", snapshots=True)
    truth = write_numbers(tmp_path / "in", files=8, per_file=30, keyed=True)
    spec = JobSpec(
        job="hdfs-other-host", storage_uri=s3_uri, input_dir=tmp_path / "in",
        output_uri=s3_uri + "-out",
        checkpoint_config={"execution.checkpointing.interval": "300 ms",
                           "execution.checkpointing.num-retained": 2,
                           "execution.checkpointing.incremental": True},
        confs={"spark.airflow_ckpt.demo.batch_delay_s": "0.3"},
        extra_args=["--state-store", "rocksdb", "--keyed"], workdir=base,
        master=cluster.master_url,
    )
    storage = s3_endpoint.storage(s3_uri)
    sink = JsonLinesSink(s3_endpoint.storage(spec.output_uri), "")

    def after_kill(round_: int) -> None:
        problems = killed_run_problems(storage, spec.job, sink, truth)
        assert not problems, f"seed {seed}, kill {round_ + 1}: {problems}"

    env = {**s3_endpoint.env(), "TMPDIR": str(driver_local)}
    kills = run_with_kills(spec, env, tmp_path / "driver.log", kills=1, timeout_s=900,
                           moment=after_checkpoint(storage, spec.job, rng, within_s=1.5,
                                                   timeout_s=900),
                           after_kill=after_kill)
    assert kills == 1, f"seed {seed}: the driver finished before the kill"
    verdict = verify_output(sink, truth, finished=True)
    assert verdict.ok, f"seed {seed}: {verdict.problems}"
    assert not finished_job_problems(storage, spec.job, num_retained=2)
    work = cluster.log_dir / "work"
    assert sorted(work.glob("app-*")), "no executor ran on the namespaced worker"
    fs, path = hadoop_fs(spark, base)
    assert fs.exists(path(f"{base}/work/state/0")), "Spark's state is not on HDFS"
    assert list((driver_local / "airflow_ckpt").iterdir()), "the driver staged nothing"
