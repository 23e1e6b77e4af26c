"""File merging: small files of a checkpoint travel as segments of one object.

Drives the real upload path (``upload_snapshot``), the real store (retention and garbage
collection) and the real restore download (``materialize``) against a local storage that
counts its writes.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_ckpt.errors import CorruptCheckpointError
from airflow_ckpt.runtime.checkpoint.executors import InlineExecutor
from airflow_ckpt.runtime.checkpoint.metadata import FileEntry, Manifest, parse_manifest
from airflow_ckpt.runtime.checkpoint.snapshot import CapturedFile, CapturedSnapshot
from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
from airflow_ckpt.runtime.checkpoint.upload import (
    MERGE_FILES_BELOW,
    DigestCache,
    UploadResult,
    UploadTarget,
    merge_groups,
    upload_snapshot,
)
from airflow_ckpt.runtime.restore.materialize import materialize
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.fenced import FencedStorage
from airflow_ckpt.runtime.storage.layout import MERGED_DIR, JobLayout
from tests.fixtures.snapshots import make_manifest

JOB = "merging"
L = JobLayout(JOB)
CAP = 64 << 10  # merged objects of at most 64 KiB in these tests


class CountingStorage(FencedStorage):
    """The storage, with every object write recorded (key, bytes)."""

    def __init__(self, inner: CheckpointStorage) -> None:
        super().__init__(inner, lambda: None)
        self.writes: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def upload_file(self, path: Path, key: str) -> None:
        with self._lock:
            self.writes.append((key, path.stat().st_size))
        super().upload_file(path, key)


def _snapshot(tmp: Path, name: str, files: dict[str, bytes]) -> CapturedSnapshot:
    staging = tmp / name
    out = []
    for rel, data in sorted(files.items()):
        path = staging / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        subtask = "logs" if not rel.startswith("state/") else "/".join(rel.split("/")[1:3])
        out.append(CapturedFile(rel, path, len(data), subtask, rel.startswith("state/")))
    return CapturedSnapshot(0, tuple(out), (), [], tuple(sorted({f.subtask for f in out})),
                            staging)


def _upload(storage: CheckpointStorage, store: CompletedCheckpointStore, snap: CapturedSnapshot,
            checkpoint_id: int, *, incremental: bool = True, cap: int = CAP,
            digests: DigestCache | None = None) -> tuple[UploadResult, set[str]]:
    acked: set[str] = set()
    target = UploadTarget(checkpoint_id, f"chk-{checkpoint_id}/", incremental, cap)
    result = upload_snapshot(
        storage, L, snap, target, executor=InlineExecutor(), digests=digests or DigestCache(),
        shared=store.shared, deadline=time.monotonic() + 60, on_ack=acked.add,
        cancelled=threading.Event(),
        reusable=store.shared_index() if incremental else None)
    return result, acked


def _complete(storage: CheckpointStorage, store: CompletedCheckpointStore, checkpoint_id: int,
              result: UploadResult) -> Manifest:
    manifest = make_manifest(JOB, checkpoint_id, files=result.files, batch_id=checkpoint_id)
    stashed = store.stashed()
    storage.put_bytes(L.checkpoint_metadata(checkpoint_id), manifest.to_json(), create_only=True)
    store.confirmed(stashed)  # as the coordinator's confirmation after the marker
    store.add(manifest)
    return manifest


def _batch(n: int) -> dict[str, bytes]:
    """What one micro-batch leaves: three log entries and a changelog per partition (the
    same bytes for the same ``n``)."""
    files = {f"offsets/{n}": b"v1\n{}\n" + bytes([n]) * 40,
             f"commits/{n}": b"v1\n{}\n" + str(n).encode(),
             f"sources/0/{n}": b"v1\n" + str(n).encode() * 30}
    rng = random.Random(n)
    for part in range(2):
        files[f"state/0/{part}/{n + 1}.changelog"] = rng.randbytes(3000 + n)
    return files


def _restored(storage: CheckpointStorage, manifest: Manifest, tmp_path: Path) -> dict[str, bytes]:
    """Every file of ``manifest`` as restore writes it: working-dir path -> bytes."""
    out = materialize(storage, manifest, L.root, tmp_path / "restored", only_needed=False)
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


@pytest.fixture
def setup(file_storage: CheckpointStorage) -> tuple[CountingStorage, CompletedCheckpointStore]:
    storage = CountingStorage(file_storage)
    store = CompletedCheckpointStore(storage, JOB, num_retained=2)
    store.recover()
    return storage, store


def test_small_files_travel_as_one_object_and_restore_byte_for_byte(
    setup: tuple[CountingStorage, CompletedCheckpointStore], tmp_path: Path
) -> None:
    storage, store = setup
    files = {**_batch(0), **_batch(1), "state/0/0/SSTs/big.sst": os.urandom(MERGE_FILES_BELOW)}
    result, acked = _upload(storage, store, _snapshot(tmp_path, "s1", files), 1, cap=1 << 22)
    manifest = _complete(storage, store, 1, result)

    # one merged object for the 10 small files, the big one alone
    assert len(storage.writes) == 2
    merged = [e for e in manifest.files if e.merged]
    assert len(merged) == 10 and len({e.key for e in merged}) == 1
    big = next(e for e in manifest.files if e.path.endswith(".sst"))
    assert not big.merged and big.key == L.shared_file(big.sha256)[len(L.root):]
    assert acked == {"logs", "0/0", "0/1"}
    assert result.checkpointed_size == sum(len(b) for b in files.values())

    stored = parse_manifest(storage.get_bytes(L.checkpoint_metadata(1)))
    assert _restored(storage, stored, tmp_path) == files


def test_the_next_checkpoint_references_stored_segments_and_uploads_only_new_files(
    setup: tuple[CountingStorage, CompletedCheckpointStore], tmp_path: Path
) -> None:
    storage, store = setup
    first = _complete(storage, store, 1,
                      _upload(storage, store, _snapshot(tmp_path, "s1", _batch(0)), 1)[0])
    storage.writes.clear()
    result, _ = _upload(storage, store,
                        _snapshot(tmp_path, "s2", {**_batch(0), **_batch(1)}), 2)
    second = _complete(storage, store, 2, result)

    assert len(storage.writes) == 1  # batch 1's five files, merged; batch 0's reused
    assert storage.writes[0][1] == result.checkpointed_size == sum(
        len(b) for b in _batch(1).values())
    old = {e.path: e for e in first.files}
    for e in second.files:
        if e.path in old:
            assert (e.key, e.offset) == (old[e.path].key, old[e.path].offset)
    out = materialize(storage, second, L.root, tmp_path / "restored", only_needed=False)
    assert len([p for p in out.rglob("*") if p.is_file()]) == 10


def test_a_merged_object_is_collected_only_when_no_retained_checkpoint_uses_a_segment(
    setup: tuple[CountingStorage, CompletedCheckpointStore], tmp_path: Path
) -> None:
    storage, store = setup
    keys = []
    # num_retained=2: checkpoint 1's object stays while checkpoint 2 (which reuses
    # batch 0's segments) is retained, and goes once both 1 and 2 are subsumed and
    # checkpoint 4 no longer holds batch 0 (Spark purged it). A subsumed checkpoint's
    # files go one confirmation (here: the next checkpoint's) after its marker.
    for n, batches in enumerate([[0], [0, 1], [1, 2], [2, 3]], start=1):
        files: dict[str, bytes] = {}
        for b in batches:
            files.update(_batch(b))
        result, _ = _upload(storage, store, _snapshot(tmp_path, f"s{n}", files), n)
        manifest = _complete(storage, store, n, result)
        keys.append({e.key for e in manifest.files})
        stored = {i.key[len(L.root):] for i in storage.list(L.shared_prefix)}
        referenced = set().union(*(k for k in keys[-3:]))
        assert stored == referenced
    store.confirmed(store.stashed())
    store.subsume_and_collect()
    stored = {i.key[len(L.root):] for i in storage.list(L.shared_prefix)}
    assert stored == set().union(*(k for k in keys[-2:]))
    first_object = next(iter(keys[0]))
    assert first_object not in stored


def test_groups_are_cut_at_the_maximum_merged_size(tmp_path: Path) -> None:
    files = {f"offsets/{i}": os.urandom(20 << 10) for i in range(7)}
    snap = _snapshot(tmp_path, "s", files)
    groups = merge_groups(snap.files, UploadTarget(1, "chk-1/", True, CAP))
    assert [len(g) for g in groups] == [3, 3, 1]
    assert all(sum(f.size for f in g) <= CAP for g in groups)
    # merging off (savepoints, or file-merging.enabled=false): a unit per file
    assert [len(g) for g in merge_groups(snap.files, UploadTarget(1, "sp/", False))] == [1] * 7


def test_full_checkpoints_keep_merged_objects_in_their_own_directory(
    setup: tuple[CountingStorage, CompletedCheckpointStore], tmp_path: Path
) -> None:
    storage, store = setup
    result, _ = _upload(storage, store, _snapshot(tmp_path, "s1", _batch(0)), 1,
                        incremental=False)
    assert len(storage.writes) == 1
    key = storage.writes[0][0]
    assert key.startswith(L.checkpoint_dir(1) + MERGED_DIR)
    assert all(e.key == key[len(L.root):] and not e.shared for e in result.files)
    manifest = _complete(storage, store, 1, result)
    out = materialize(storage, manifest, L.root, tmp_path / "restored", only_needed=False)
    assert (out / "offsets/0").read_bytes() == _batch(0)["offsets/0"]


def _merged_manifest(storage: CheckpointStorage, store: CompletedCheckpointStore,
                     tmp_path: Path) -> Manifest:
    result, _ = _upload(storage, store, _snapshot(tmp_path, "s1", _batch(0)), 1)
    return _complete(storage, store, 1, result)


def _flip_a_byte(storage: CheckpointStorage, manifest: Manifest) -> None:
    entry = next(e for e in manifest.files if e.path == "state/0/1/1.changelog")
    data = bytearray(storage.get_bytes(L.root + entry.key))
    data[(entry.offset or 0) + 7] ^= 0xFF
    storage.put_bytes(L.root + entry.key, bytes(data))


def _truncate(storage: CheckpointStorage, manifest: Manifest) -> None:
    key = L.root + manifest.files[0].key
    storage.put_bytes(key, storage.get_bytes(key)[:100])


@pytest.mark.parametrize(("damage", "message"), [
    (_flip_a_byte, r"'state/0/1/1.changelog'.*SHA-256"),
    (_truncate, r"has \d+ bytes, the manifest records"),
])
def test_a_damaged_or_truncated_merged_object_names_the_file(
    setup: tuple[CountingStorage, CompletedCheckpointStore], tmp_path: Path,
    damage: Callable[[CheckpointStorage, Manifest], None], message: str,
) -> None:
    storage, store = setup
    manifest = _merged_manifest(storage, store, tmp_path)
    damage(storage, manifest)
    with pytest.raises(CorruptCheckpointError, match=message):
        materialize(storage, manifest, L.root, tmp_path / "restored", only_needed=False)


def test_overlapping_segments_are_a_damaged_manifest(
    setup: tuple[CountingStorage, CompletedCheckpointStore], tmp_path: Path
) -> None:
    storage, store = setup
    manifest = _merged_manifest(storage, store, tmp_path)
    a, b = manifest.files[:2]
    bad = FileEntry(b.path, b.key, b.size, b.sha256, b.shared, (a.offset or 0) + 1)
    files = tuple(bad if e is b else e for e in manifest.files)
    damaged = make_manifest(JOB, 1, files=files, batch_id=1)
    with pytest.raises(CorruptCheckpointError, match="overlaps"):
        materialize(storage, damaged, L.root, tmp_path / "restored", only_needed=False)


def test_identical_small_files_share_one_segment(
    setup: tuple[CountingStorage, CompletedCheckpointStore], tmp_path: Path
) -> None:
    storage, store = setup
    # the same bytes in one directory and in several (the empty deltas of partitions)
    same = b"v1\n{}\n"
    files = {"commits/0": same, "commits/1": same, "state/0/0/1.delta": b"",
             "state/0/1/1.delta": b"", "state/0/2/1.delta": b""}
    result, _ = _upload(storage, store, _snapshot(tmp_path, "s1", files), 1)
    by_path = {e.path: e for e in result.files}
    a, b = by_path["commits/0"], by_path["commits/1"]
    assert (a.key, a.offset) == (b.key, b.offset) and storage.writes[0][1] == len(same)
    assert len({by_path[f"state/0/{p}/1.delta"].offset for p in range(3)}) == 1
    assert _restored(storage, _complete(storage, store, 1, result), tmp_path) == files


def test_a_segment_whose_object_was_collected_is_uploaded_again(
    setup: tuple[CountingStorage, CompletedCheckpointStore], tmp_path: Path
) -> None:
    storage, store = setup
    manifest = _merged_manifest(storage, store, tmp_path)
    segments = store.shared_index()
    # the collector decided the object is garbage (tombstoned) and deleted it
    key = L.root + manifest.files[0].key
    store.shared.collectable([key], set())
    storage.delete_many([key])
    store.shared.deleted([key])
    storage.writes.clear()
    target = UploadTarget(2, "chk-2/", True, CAP)
    result = upload_snapshot(
        storage, L, _snapshot(tmp_path, "s2", _batch(0)), target, executor=InlineExecutor(),
        digests=DigestCache(), shared=store.shared, deadline=time.monotonic() + 60,
        on_ack=lambda _s: None, cancelled=threading.Event(), reusable=segments)
    assert len(storage.writes) == 1
    out = materialize(storage, _complete(storage, store, 2, result), L.root,
                      tmp_path / "restored", only_needed=False)
    assert (out / "offsets/0").read_bytes() == _batch(0)["offsets/0"]
