"""Async phase of a checkpoint: hash and upload captured files in background threads.

Incremental mode stores each file once, content-addressed, in ``shared/``: a file
whose bytes are already stored is referenced, not uploaded again. Otherwise every
file goes under the checkpoint's (or savepoint's) own directory.

File merging (Flink's ``execution.checkpointing.file-merging.*``): a micro-batch writes
a handful of small files per batch (offset, commit and source log entries, one state
changelog or delta per partition), so a checkpoint every few batches would cost one
PUT per small file, and the garbage collector one key each later. With merging, the
small files of a checkpoint travel concatenated in one object (the "physical file"),
each recorded in the manifest as a segment of it (``FileEntry.offset``); restore reads
the segments back with one ranged GET per merged object. A merged object lives until
no retained manifest references any of its segments: the files of a micro-batch are
purged by Spark together, so little space is held by dead segments. Savepoints are
never merged (they stay self-contained, one object per file).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from airflow_ckpt.errors import CheckpointDeclinedError
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.checkpoint.metadata import FileEntry
from airflow_ckpt.runtime.checkpoint.snapshot import CapturedFile, CapturedSnapshot
from airflow_ckpt.runtime.checkpoint.store import SharedFileRegistry
from airflow_ckpt.runtime.restore.materialize import copy_hashed, sha256_of
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout


class DigestCache:
    """sha256 of immutable files, keyed by inode identity so each file is read once.

    Bounded by :meth:`prune`: a long-running job writes new files every batch, and an
    entry no snapshot uses any more is dropped, so the cache holds about one snapshot's
    files rather than every file the job ever wrote.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[tuple[int, int, int, int], str] = {}
        self._used: set[tuple[int, int, int, int]] = set()

    @staticmethod
    def _identity(path: Path) -> tuple[int, int, int, int]:
        st = os.stat(path)
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

    def remember(self, path: Path, sha256: str) -> None:
        """Record the digest of a file just verified (restore's downloads), so that the
        first checkpoint after a restore does not read the restored state again."""
        ident = self._identity(path)
        with self._lock:
            self._cache[ident] = sha256
            self._used.add(ident)

    def digest(self, path: Path) -> str:
        ident = self._identity(path)
        with self._lock:
            known = self._cache.get(ident)
            self._used.add(ident)
        if known is None:
            known = sha256_of(path)
            with self._lock:
                self._cache[ident] = known
        return known

    def prune(self) -> None:
        """Forget every file not asked about (or remembered) since the last prune. A
        snapshot in flight meanwhile at worst hashes a file again."""
        with self._lock:
            self._cache = {k: v for k, v in self._cache.items() if k in self._used}
            self._used = set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)


@dataclass(frozen=True, slots=True)
class UploadResult:
    files: tuple[FileEntry, ...]
    state_size: int  # bytes of state the checkpoint references
    checkpointed_size: int  # bytes uploaded by this checkpoint


#: files below this size are merged (when the target merges); larger ones travel alone
MERGE_FILES_BELOW = 1 << 20


@dataclass(frozen=True, slots=True)
class UploadTarget:
    """Where a snapshot goes: its own directory, whether it may use ``shared/``, and the
    size cap of a merged object (0: every file is its own object)."""

    checkpoint_id: int
    dir_key: str  # relative to the job root, e.g. "chk-7/" or "savepoints/sp-x/"
    incremental: bool
    merged_file_size: int = 0
    #: the lease epoch of the uploading driver: new shared keys carry it
    epoch: int | None = None

    def merges(self, f: CapturedFile) -> bool:
        return f.size < min(MERGE_FILES_BELOW, self.merged_file_size)


def merge_groups(files: Sequence[CapturedFile], target: UploadTarget) -> list[list[CapturedFile]]:
    """The upload units of a snapshot: each file that is not merged alone, the others
    in path order, cut into groups of at most ``target.merged_file_size`` bytes."""
    units: list[list[CapturedFile]] = []
    group: list[CapturedFile] = []
    size = 0
    for f in files:
        if not target.merges(f):
            units.append([f])
            continue
        if group and size + f.size > target.merged_file_size:
            units.append(group)
            group, size = [], 0
        group.append(f)
        size += f.size
    if group:
        units.append(group)
    return units


def upload_snapshot(
    storage: CheckpointStorage,
    layout: JobLayout,
    snapshot: CapturedSnapshot,
    target: UploadTarget,
    *,
    executor: Executor,
    digests: DigestCache,
    shared: SharedFileRegistry,
    deadline: float,
    on_ack: Callable[[str], None],
    cancelled: threading.Event,
    reusable: Mapping[str, FileEntry] | None = None,
) -> UploadResult:
    """Upload every captured file; durable in storage when this returns.

    Small files (see :meth:`UploadTarget.merges`) are merged: concatenated into one
    object per group, each recorded as a segment (``FileEntry.offset``) of it. In
    ``shared/`` a merged object is content-addressed like any file (within the
    uploader's lease epoch, ``target.epoch``); a file whose bytes a retained checkpoint
    already holds in ``shared/`` (``reusable``: by SHA-256, from the retained manifests;
    a whole file or a segment of a merged object) is referenced there, not uploaded
    again.

    ``on_ack(subtask)`` is called once per subtask when all its files are durable.
    Raises ``CheckpointDeclinedError`` on a storage error, when ``deadline``
    (``time.monotonic()``) passes, or when ``cancelled`` is set; already uploaded files then stay
    as orphans for the garbage collector (shared) or the abandoned-checkpoint sweep.
    """
    remaining: dict[str, int] = {}
    for f in snapshot.files:
        remaining[f.subtask] = remaining.get(f.subtask, 0) + 1
    lock = threading.Lock()
    known = reusable or {}

    def check() -> None:
        if cancelled.is_set() or time.monotonic() > deadline:
            raise CheckpointDeclinedError("checkpoint expired or was cancelled")

    def store(path: Path, key: str) -> bool:
        """Upload ``path`` to ``key`` unless content addressing finds it stored; True if
        it was uploaded."""
        if target.incremental and not shared.reserve(target.checkpoint_id, key):
            return False
        storage.upload_file(path, key)
        if target.incremental:
            shared.uploaded(key)
        return True

    def entry(f: CapturedFile, key: str, sha: str, offset: int | None = None) -> FileEntry:
        return FileEntry(f.path, key[len(layout.root):], f.size, sha, target.incremental,
                         offset)

    def reuse(f: CapturedFile, sha: str) -> FileEntry | None:
        """A retained checkpoint's shared copy of these bytes (a file, or a segment of a
        merged object), pinned for this checkpoint; None if there is none to pin."""
        old = known.get(sha)
        # reserve() pins the object; False: it is stored and stays so
        if (old is not None and target.incremental
                and not shared.reserve(target.checkpoint_id, layout.root + old.key)):
            return entry(f, layout.root + old.key, sha, old.offset)
        return None

    def alone(f: CapturedFile) -> tuple[list[FileEntry], int]:
        sha = digests.digest(f.staged)
        if (found := reuse(f, sha)) is not None:
            return [found], 0
        key = (layout.shared_file(sha, target.epoch) if target.incremental
               else layout.root + target.dir_key + f.path)
        return [entry(f, key, sha)], f.size if store(f.staged, key) else 0

    def merged(group: list[CapturedFile], index: int) -> tuple[list[FileEntry], int]:
        out: dict[str, FileEntry] = {}
        fresh: list[tuple[CapturedFile, str]] = []
        for f in group:
            check()
            sha = digests.digest(f.staged)
            if (found := reuse(f, sha)) is not None:
                out[f.path] = found
            else:
                fresh.append((f, sha))
        if not fresh:
            return [out[f.path] for f in group], 0
        path = snapshot.staging_dir / f".merged-{index}"
        offsets: dict[str, int] = {}
        digest = hashlib.sha256()
        with path.open("wb") as dst:
            for f, sha in fresh:
                if sha in offsets:
                    continue  # the same bytes twice: one segment serves both
                offsets[sha] = dst.tell()
                with f.staged.open("rb") as src:
                    copy_hashed(src, dst, digest.update)
            size = dst.tell()
        key = (layout.shared_file(digest.hexdigest(), target.epoch) if target.incremental
               else layout.merged_file(target.checkpoint_id, digest.hexdigest()))
        uploaded = size if store(path, key) else 0
        path.unlink()
        for f, sha in fresh:
            out[f.path] = entry(f, key, sha, offsets[sha])
        return [out[f.path] for f in group], uploaded

    def run(group: list[CapturedFile], index: int) -> tuple[list[FileEntry], int]:
        check()
        interleave.point(interleave.UPLOAD_BEFORE_FILE)
        if len(group) == 1 and not target.merges(group[0]):
            result = alone(group[0])
        else:
            result = merged(group, index)
        acked = []
        with lock:
            for f in group:
                remaining[f.subtask] -= 1
                if remaining[f.subtask] == 0:
                    acked.append(f.subtask)
        for subtask in acked:
            on_ack(subtask)
        return result

    units = merge_groups(snapshot.files, target)
    futures = [executor.submit(run, group, i) for i, group in enumerate(units)]
    by_path: dict[str, FileEntry] = {}
    checkpointed = 0
    error: BaseException | None = None
    for future in futures:
        try:
            entries, uploaded = future.result(timeout=max(deadline - time.monotonic(), 0.001))
        except BaseException as exc:
            error = error or exc
            cancelled.set()
            continue
        by_path.update((e.path, e) for e in entries)
        checkpointed += uploaded
    if error is not None:
        if isinstance(error, CheckpointDeclinedError):
            raise error
        raise CheckpointDeclinedError(f"upload failed: {error}") from error
    digests.prune()
    files = tuple(by_path[f.path] for f in snapshot.files)
    return UploadResult(files, sum(e.size for e in files), checkpointed)
