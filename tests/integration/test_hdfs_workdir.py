"""Spark's working directory on a real HDFS (Hadoop's mini cluster, tests/fixtures/hdfs.py).

* The capture through the driver JVM's ``FileSystem``: with snapshots allowed, a file
  Spark deletes during the capture is still captured (the snapshot pins it, the analogue
  of a hard link); without, it is skipped, like a vanished link. No snapshot is left.
* Restore materialises into HDFS, whole.
* kill -9 of a real driver (local Spark, RocksDB, keyed) whose checkpointLocation is on
  ``hdfs://``: the output after restores equals the ground truth.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.workdir import location, read_text, replace_with
from airflow_ckpt.runtime.workdir.hadoop import SNAPSHOT_PREFIX, HadoopWorkdir
from airflow_ckpt.testing.hdfs_cluster import MiniHdfs, hadoop_fs, make_dir
from airflow_ckpt.testing.s3_server import S3Endpoint
from tests.fixtures.hdfs import kill_once_then_exact, numbers_job_on_hdfs, write_files

pytestmark = pytest.mark.integration

#: a working directory as Spark leaves it after batch 1 committed, batch 2 running
LAYOUT = {
    "metadata": '{"id":"q-1"}',
    "offsets/0": 'v1\n{"conf":{"spark.sql.shuffle.partitions":"2"}}\n{"logOffset":0}',
    "offsets/1": 'v1\n{"conf":{"spark.sql.shuffle.partitions":"2"}}\n{"logOffset":1}',
    "offsets/2": 'v1\n{"conf":{"spark.sql.shuffle.partitions":"2"}}\n{"logOffset":2}',
    "commits/0": "v1\n{}", "commits/1": "v1\n{}",
    "state/0/0/1.delta": "p0v1", "state/0/0/2.delta": "p0v2", "state/0/0/3.delta": "next",
    "state/0/1/1.delta": "p1v1", "state/0/1/2.delta": "p1v2",
}


def _workdir(spark: Any, hdfs: MiniHdfs, name: str, tmp_path: Path, *,
             snapshots: bool) -> HadoopWorkdir:
    base = make_dir(spark, f"{hdfs.uri}/{name}", snapshots=snapshots)
    write_files(spark, base + "/work", LAYOUT)
    return HadoopWorkdir.of(spark, base + "/work", tmp_path / "local")


@pytest.mark.parametrize("snapshots", [True, False], ids=["snapshot", "list-and-copy"])
def test_capture_pins_files_spark_deletes_meanwhile_only_with_a_snapshot(
    spark: Any, hdfs: MiniHdfs, tmp_path: Path, snapshots: bool
) -> None:
    workdir = _workdir(spark, hdfs, f"pin-{snapshots}", tmp_path, snapshots=snapshots)
    fs, path = hadoop_fs(spark, workdir.location)
    purged = f"{workdir.location}/state/0/1/1.delta"

    def maintenance() -> None:  # Spark deletes an old version while the capture runs
        fs.delete(path(purged), False)

    with interleave.installed(interleave.CAPTURE_BEFORE_LINK, maintenance):
        snap = workdir.capture(1, tmp_path / "staging" / "chk-1")
    captured = {f.path: f.staged.read_text() for f in snap.files}
    # batch 1's files (state versions <= 2); batch 2's offsets and version 3 are not
    expected = {k: v for k, v in LAYOUT.items()
                if k not in ("offsets/2", "state/0/0/3.delta")}
    if not snapshots:
        del expected["state/0/1/1.delta"]  # deleted before its copy: skipped
    assert captured == expected
    assert snap.batch_id == 1 and snap.source_offsets == [{"logOffset": 1}]
    assert [(o.operator_id, o.num_partitions) for o in snap.operators] == [(0, 2)]
    assert not fs.exists(path(purged))
    if snapshots:
        root = path(workdir.location).getParent()
        assert fs.getFileStatus(root).isSnapshotEnabled()
        left = [s.getPath().getName() for s in fs.listStatus(path(f"{root}/.snapshot"))]
        assert not [n for n in left if n.startswith(SNAPSHOT_PREFIX)], left


def test_a_local_staging_path_with_a_space_or_percent_sign_is_captured_and_installed(
    spark: Any, hdfs: MiniHdfs, tmp_path: Path
) -> None:
    """The local side was named by ``Path.as_uri()``, which Hadoop's ``Path(String)``
    does not decode: a staging directory ``a b`` received its files under ``a%20b``.
    The restore's parallel copy keeps empty directories too."""
    workdir = _workdir(spark, hdfs, "odd-local-names", tmp_path / "local 100%", snapshots=True)
    snap = workdir.capture(1, tmp_path / "stag ing %20" / "chk-1")
    assert {f.path for f in snap.files} == set(LAYOUT) - {"offsets/2", "state/0/0/3.delta"}
    assert all(f.staged.read_text() == LAYOUT[f.path] for f in snap.files)
    (snap.staging_dir / "sources" / "0").mkdir(parents=True)  # an empty directory
    replace_with(workdir, snap.staging_dir)
    assert read_text(workdir, "commits/1") == LAYOUT["commits/1"]
    assert workdir.exists("sources/0") and workdir.names("sources/0") == []


def test_the_first_capture_deletes_the_snapshots_a_killed_driver_left_and_no_other(
    spark: Any, hdfs: MiniHdfs, tmp_path: Path
) -> None:
    workdir = _workdir(spark, hdfs, "leftover", tmp_path, snapshots=True)
    other = HadoopWorkdir.of(spark, workdir.location + "-other", tmp_path / "other")
    fs, path = hadoop_fs(spark, workdir.location)
    root = path(workdir.location).getParent()
    dead = workdir.snapshot_prefix + "chk-1-abc123-def456"  # killed mid-capture
    kept = other.snapshot_prefix + "chk-1-abc123-def456"  # another working directory's
    fs.createSnapshot(root, dead)
    fs.createSnapshot(root, kept)
    fs.delete(path(f"{workdir.location}/state/0/0/1.delta"), False)  # pinned by both
    snap = workdir.capture(1, tmp_path / "staging" / "chk-1")
    assert {f.path for f in snap.files} >= {"commits/1", "state/0/0/2.delta"}
    left = [s.getPath().getName() for s in fs.listStatus(path(f"{root}/.snapshot"))]
    assert left == [kept]
    workdir.capture(1, tmp_path / "staging" / "chk-1b")  # one look per driver
    assert [s.getPath().getName()
            for s in fs.listStatus(path(f"{root}/.snapshot"))] == [kept]
    fs.deleteSnapshot(root, kept)


def test_restore_replaces_the_hdfs_working_directory_whole(
    spark: Any, hdfs: MiniHdfs, tmp_path: Path
) -> None:
    workdir = _workdir(spark, hdfs, "restore", tmp_path, snapshots=True)
    restored = tmp_path / "materialised"
    (restored / "commits").mkdir(parents=True)
    (restored / "commits" / "0").write_text("v1\n{}")
    (restored / "metadata").write_text('{"id":"q-2"}')
    replace_with(workdir, restored)
    assert sorted(workdir.names("")) == ["commits", "metadata"]
    assert read_text(workdir, "metadata") == '{"id":"q-2"}'
    assert workdir.names("commits") == ["0"]
    assert not restored.exists()
    with pytest.raises(FileNotFoundError):
        workdir.read_bytes("offsets/0")
    with pytest.raises(FileNotFoundError):
        workdir.names("offsets")
    parent = location(workdir).rsplit("/", 1)[0]
    fs, path = hadoop_fs(spark, parent)
    assert [s.getPath().getName() for s in fs.listStatus(path(parent))] == ["work"]


@pytest.mark.timeout(900)
def test_random_kills_with_the_working_directory_on_hdfs_then_exact_result(
    spark: Any, hdfs_dir: str, s3_endpoint: S3Endpoint, s3_uri: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("KILL_SEED", time.time_ns() % 100_000))
    print(f"KILL_SEED={seed}")
    spec, truth = numbers_job_on_hdfs("hdfs-kill", hdfs_dir, tmp_path, s3_uri,
                                      files=8, per_file=50)
    kill_once_then_exact(spark, spec, truth, s3_endpoint, tmp_path / "driver.log",
                         seed=seed, within_s=2.0)
