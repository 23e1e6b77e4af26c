"""materialize(): download + verify every file of a manifest."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from airflow_ckpt.errors import (
    CorruptCheckpointError,
    RestoreError,
    RestoreRefusal,
    RestoreRefusedError,
)
from airflow_ckpt.runtime.checkpoint import digests as digests_module
from airflow_ckpt.runtime.checkpoint.digests import DigestCache
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.restore.choose import restore
from airflow_ckpt.runtime.restore.materialize import materialize
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


# ------------------------------------------------------------------ digests of restored files


def test_a_restore_records_the_verified_digests_so_nothing_is_hashed_again(
    file_storage: CheckpointStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = write_snapshot(file_storage, "job-a", 4, contents=FILES)
    digests = DigestCache()
    workdir = tmp_path / "wd"
    restore(file_storage, "job-a", "chk-4", workdir, JobHistory(file_storage, "job-a"), digests)

    def no_reading(path: Path) -> str:
        raise AssertionError(f"{path} was hashed again")

    monkeypatch.setattr(digests_module, "sha256_of", no_reading)
    by_path = {f.path: f.sha256 for f in manifest.files}
    for rel, content in FILES.items():
        assert digests.digest(workdir / rel) == by_path[rel] == hashlib.sha256(content).hexdigest()


def test_a_failed_restore_records_no_digest(file_storage: CheckpointStorage,
                                            tmp_path: Path) -> None:
    write_snapshot(file_storage, "job-a", 4, contents=FILES)
    file_storage.put_bytes("job-a/chk-4/commits/3", b"v1\n[]\n")  # damaged
    digests = DigestCache()
    with pytest.raises(RestoreError, match="SHA-256"):
        restore(file_storage, "job-a", "chk-4", tmp_path / "wd",
                JobHistory(file_storage, "job-a"), digests)
    assert len(digests) == 0


def test_the_digest_cache_forgets_files_no_snapshot_uses(tmp_path: Path) -> None:
    old, kept = tmp_path / "old", tmp_path / "kept"
    old.write_bytes(b"purged by Spark")
    kept.write_bytes(b"still live")
    digests = DigestCache()
    digests.digest(old)
    digests.digest(kept)
    digests.prune()  # both were used by the last snapshot
    assert len(digests) == 2
    digests.digest(kept)
    digests.prune()
    assert len(digests) == 1
    assert digests.digest(kept) == hashlib.sha256(b"still live").hexdigest()


def test_every_damaged_object_is_named_not_just_the_first(
    file_storage: CheckpointStorage, tmp_path: Path,
) -> None:
    """Issue 25 item 2: a fallback distrusted only the first damaged object; later
    checkpoints reused the others by content and completed over damaged bytes."""
    manifest = write_snapshot(file_storage, "job-a", 4, contents=FILES)
    file_storage.put_bytes("job-a/chk-4/commits/3", b"v1\n[]\n")
    file_storage.delete_many(["job-a/chk-4/state/0/0/4.delta"])
    with pytest.raises(CorruptCheckpointError) as caught:
        materialize(file_storage, manifest, "job-a/", tmp_path / "wd")
    assert caught.value.keys == {"job-a/chk-4/commits/3", "job-a/chk-4/state/0/0/4.delta"}


def test_a_fallback_distrusts_every_damaged_object_of_the_checkpoint_it_skipped(
    file_storage: CheckpointStorage, tmp_path: Path,
) -> None:
    write_snapshot(file_storage, "job-a", 3, contents=FILES)
    write_snapshot(file_storage, "job-a", 4, contents=FILES)
    file_storage.put_bytes("job-a/chk-4/commits/3", b"v1\n[]\n")
    file_storage.delete_many(["job-a/chk-4/offsets/3"])
    history = JobHistory(file_storage, "job-a")
    restored = restore(file_storage, "job-a", "latest", tmp_path / "wd", history)
    assert restored.manifest is not None and restored.manifest.checkpoint_id == 3
    assert restored.damaged_keys == {"job-a/chk-4/commits/3", "job-a/chk-4/offsets/3"}


def test_an_in_process_fallback_never_resumes_an_older_run(
    file_storage: CheckpointStorage, tmp_path: Path,
) -> None:
    """Found by the simulation's sink world (seed 509 once it modelled restore=none): a
    run started anew (restore=none, its initial checkpoint 3) restarted in-process,
    found checkpoint 3 damaged and fell back to checkpoint 2 of the older run, whose
    pending transaction the new start had aborted: the batch was never published.
    With the run's floor, the fallback stops at the run's own checkpoints."""
    for checkpoint_id in (1, 2, 3):
        write_snapshot(file_storage, "job-a", checkpoint_id, contents=FILES)
    file_storage.delete_many(["job-a/chk-3/offsets/3"])
    history = JobHistory(file_storage, "job-a")
    older = restore(file_storage, "job-a", "latest", tmp_path / "wd", history)
    assert older.manifest is not None and older.manifest.checkpoint_id == 2  # no floor
    with pytest.raises(RestoreRefusedError, match="would resume an older run's state") as refused:
        restore(file_storage, "job-a", "latest", tmp_path / "wd", history, floor=3)
    assert refused.value.reason is RestoreRefusal.RUN_UNRESTORABLE
    file_storage.delete_many(["job-a/chk-3/_metadata"])  # the run's checkpoints gone
    with pytest.raises(RestoreRefusedError) as refused:
        restore(file_storage, "job-a", "latest", tmp_path / "wd", history, floor=3)
    assert refused.value.reason is RestoreRefusal.RUN_CHECKPOINTS_GONE
