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
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.testing.s3_server import S3Endpoint
from tests.fixtures.hdfs import kill_once_then_exact, numbers_job_on_hdfs
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
    spark: Any, hdfs_dir: str, isolated_worker: tuple[SparkStandalone, Path],
    s3_endpoint: S3Endpoint, s3_uri: str, tmp_path: Path,
) -> None:
    cluster, driver_local = isolated_worker
    seed = int(os.environ.get("KILL_SEED", time.time_ns() % 100_000))
    print(f"KILL_SEED={seed}")
    spec, truth = numbers_job_on_hdfs("hdfs-other-host", hdfs_dir, tmp_path, s3_uri,
                                      files=8, per_file=30, master=cluster.master_url)
    kill_once_then_exact(spark, spec, truth, s3_endpoint, tmp_path / "driver.log",
                         seed=seed, within_s=1.5, env={"TMPDIR": str(driver_local)})
    work = cluster.log_dir / "work"
    assert sorted(work.glob("app-*")), "no executor ran on the namespaced worker"
    assert list((driver_local / "airflow_ckpt").iterdir()), "the driver staged nothing"
