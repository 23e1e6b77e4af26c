"""materialize(): download + verify every file of a manifest."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from airflow_ckpt.errors import CorruptCheckpointError
from airflow_ckpt.runtime.materialize import materialize
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from tests.fixtures.snapshots import write_snapshot

FILES = {
    "offsets/3": b"v1\n{\"batchWatermarkMs\":0}\n",
    "commits/3": b"v1\n{}\n",
    "state/0/0/4.delta": bytes(range(256)) * 40,
    "metadata": b'{"id":"q"}',
}


def test_materialize_restores_every_file(file_storage: CheckpointStorage, tmp_path: Path) -> None:
    manifest = write_snapshot(file_storage, "job-a", 4, contents=FILES)
    out = materialize(file_storage, manifest, "job-a/", tmp_path / "wd")
    assert out == tmp_path / "wd"
    got = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert got == FILES


def test_materialize_savepoint_files(file_storage: CheckpointStorage, tmp_path: Path) -> None:
    manifest = write_snapshot(file_storage, "job-a", 9, savepoint_id="x1", contents=FILES)
    assert all(f.key.startswith("savepoints/sp-x1/") for f in manifest.files)
    out = materialize(file_storage, manifest, "job-a", tmp_path / "sp")
    assert (out / "state/0/0/4.delta").read_bytes() == FILES["state/0/0/4.delta"]


def test_changed_bytes_are_reported_by_name(file_storage: CheckpointStorage,
                                            tmp_path: Path) -> None:
    manifest = write_snapshot(file_storage, "job-a", 4, contents=FILES)
    # same size, different content: only the checksum can tell
    file_storage.put_bytes("job-a/chk-4/commits/3", b"v1\n[]\n")
    with pytest.raises(CorruptCheckpointError, match=r"'commits/3'.*SHA-256"):
        materialize(file_storage, manifest, "job-a/", tmp_path / "wd")


def test_truncated_file_is_reported(file_storage: CheckpointStorage, tmp_path: Path) -> None:
    manifest = write_snapshot(file_storage, "job-a", 4, contents=FILES)
    file_storage.put_bytes("job-a/chk-4/state/0/0/4.delta", b"short")
    with pytest.raises(CorruptCheckpointError, match=r"'state/0/0/4.delta'.*5 bytes"):
        materialize(file_storage, manifest, "job-a/", tmp_path / "wd")


def test_missing_file_is_reported(file_storage: CheckpointStorage, tmp_path: Path) -> None:
    manifest = write_snapshot(file_storage, "job-a", 4, contents=FILES)
    file_storage.delete_many(["job-a/chk-4/offsets/3"])
    with pytest.raises(CorruptCheckpointError, match=r"'offsets/3'.*missing"):
        materialize(file_storage, manifest, "job-a/", tmp_path / "wd")


@pytest.mark.parametrize("bad", ["../escape", "/etc/passwd", "a/../../b", ""])
def test_paths_cannot_escape_dest(file_storage: CheckpointStorage, tmp_path: Path,
                                  bad: str) -> None:
    manifest = write_snapshot(file_storage, "job-a", 4, contents={"ok": b"1"})
    evil = dataclasses.replace(manifest.files[0], path=bad)
    manifest = dataclasses.replace(manifest, files=(evil,))
    with pytest.raises(CorruptCheckpointError, match="not a relative path"):
        materialize(file_storage, manifest, "job-a/", tmp_path / "wd")
    assert not (tmp_path / "escape").exists()
