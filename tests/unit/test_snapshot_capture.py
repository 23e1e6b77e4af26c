"""Sync phase: which files of a Spark working directory a checkpoint at batch b takes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from airflow_ckpt.errors import CheckpointDeclinedError
from airflow_ckpt.runtime.checkpoint.snapshot import capture, latest_batch

OFFSET = (
    'v1\n{"batchWatermarkMs":0,"conf":{"spark.sql.shuffle.partitions":"2"}}\n{"logOffset":%d}\n'
)


def make_workdir(root: Path, batches: int, running: bool = True) -> Path:
    """A working directory shaped like Spark 4.2's after ``batches`` committed batches."""
    w = root / "work"
    files = {"metadata": '{"id":"q1"}', "state/0/_metadata/metadata":
             'v1\n{"stateStoreInfo":[{"storeName":"default","numPartitions":2}]}'}
    for b in range(batches):
        files[f"offsets/{b}"] = OFFSET % b
        files[f"commits/{b}"] = "v1\n{}"
        files[f"sources/0/{b}"] = f"v1\n{{\"batchId\":{b}}}"
        for p in (0, 1):
            files[f"state/0/{p}/{b + 1}.delta"] = f"delta {b + 1}"
    if running:  # batch `batches` started: offsets written, state being written
        files[f"offsets/{batches}"] = OFFSET % batches
        files[f"state/0/0/{batches + 1}.delta"] = "next"
    files["state/0/1/SSTs/abc.sst"] = "sst"
    files["state/0/0/_metadata/schema"] = "schema"
    files["commits/.0.crc"] = "crc"
    files["state/0/1/.7.delta.tmp"] = "tmp"
    for rel, body in files.items():
        (w / rel).parent.mkdir(parents=True, exist_ok=True)
        (w / rel).write_text(body)
    return w


def test_captures_exactly_the_files_of_batch_b(tmp_path: Path) -> None:
    w = make_workdir(tmp_path, batches=4)
    assert latest_batch(w, "commits") == 3 and latest_batch(w, "offsets") == 4
    snap = capture(w, 2, tmp_path / "stage")
    paths = {f.path for f in snap.files}
    assert "offsets/2" in paths and "offsets/3" not in paths and "commits/3" not in paths
    assert {"state/0/0/3.delta", "state/0/1/3.delta"} <= paths  # version b + 1
    assert "state/0/0/4.delta" not in paths  # a later batch's state
    assert {"metadata", "state/0/_metadata/metadata", "state/0/0/_metadata/schema",
            "state/0/1/SSTs/abc.sst", "sources/0/2"} <= paths
    assert not any(p.endswith((".crc", ".tmp")) for p in paths)
    assert snap.batch_id == 2 and snap.source_offsets == [{"logOffset": 2}]
    assert [(o.operator_id, o.num_partitions) for o in snap.operators] == [(0, 2)]
    assert set(snap.subtasks) == {"logs", "0/0", "0/1", "0/_metadata"}
    for f in snap.files:  # hard links, not copies
        assert os.stat(f.staged).st_ino == os.stat(w / f.path).st_ino
    snap.discard()
    assert not (tmp_path / "stage").exists() and (w / "offsets/2").exists()


def test_links_survive_spark_deleting_the_originals(tmp_path: Path) -> None:
    w = make_workdir(tmp_path, batches=3, running=False)
    snap = capture(w, 2, tmp_path / "stage")
    (w / "state/0/0/1.delta").unlink()  # Spark's maintenance removes an old version
    staged = next(f.staged for f in snap.files if f.path == "state/0/0/1.delta")
    assert staged.read_text() == "delta 1"


def test_uncommitted_batch_is_declined(tmp_path: Path) -> None:
    w = make_workdir(tmp_path, batches=2)
    with pytest.raises(CheckpointDeclinedError, match="batch 2 is not committed"):
        capture(w, 2, tmp_path / "stage")


def test_partition_count_follows_the_offset_log_after_a_repartition(tmp_path: Path) -> None:
    w = make_workdir(tmp_path, batches=2, running=False)
    (w / "offsets/1").write_text(OFFSET.replace('"2"', '"5"') % 1)
    snap = capture(w, 1, tmp_path / "stage")
    assert [o.num_partitions for o in snap.operators] == [5]
    assert json.loads((w / "metadata").read_text())["id"] == "q1"


def test_a_log_file_purged_during_the_walk_is_skipped(tmp_path: Path) -> None:
    """Issue 8 defect 7: Spark purges old ``commits/``/``offsets/`` right after
    ``commits/b``, exactly while the sync phase walks the directory. Forced here: the
    first link the walk attempts finds its file gone."""
    from airflow_ckpt.runtime import interleave

    w = make_workdir(tmp_path, batches=4)
    purged: list[str] = []

    def spark_purges_old_logs() -> None:
        if not purged:
            for old in ("commits/0", "offsets/0", "state/0/0/1.delta"):
                os.remove(w / old)
                purged.append(old)

    with interleave.installed(interleave.CAPTURE_BEFORE_LINK, spark_purges_old_logs):
        snap = capture(w, 3, tmp_path / "stage")
    paths = {f.path for f in snap.files}
    assert purged and not paths & set(purged)
    assert {"metadata", "offsets/3", "commits/3", "state/0/0/4.delta"} <= paths


def test_a_vanished_required_file_declines_and_leaves_no_staging(tmp_path: Path) -> None:
    from airflow_ckpt.runtime import interleave

    w = make_workdir(tmp_path, batches=4)

    def offsets_gone() -> None:
        (w / "offsets" / "3").unlink(missing_ok=True)

    with interleave.installed(interleave.CAPTURE_BEFORE_LINK, offsets_gone), \
            pytest.raises(CheckpointDeclinedError, match="offsets/3"):
        capture(w, 3, tmp_path / "stage")
    assert not (tmp_path / "stage").exists()


def test_any_capture_error_removes_the_staging_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = make_workdir(tmp_path, batches=2)

    def disk_full(*_a: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "link", disk_full)
    with pytest.raises(OSError, match="No space"):
        capture(w, 1, tmp_path / "stage")
    assert not (tmp_path / "stage").exists()
