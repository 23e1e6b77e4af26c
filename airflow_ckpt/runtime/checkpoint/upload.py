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

Inline files (Flink's ``state.storage.fs.memory-threshold``): a file below the threshold
is not uploaded at all; its bytes travel in the manifest (``FileEntry.inline``), as
Flink keeps small state handles in ``_metadata``. A checkpoint of small state is then
one PUT, its marker; restore writes the file from the manifest and checks its size and
SHA-256 like any other. Savepoints inline too: they stay self-contained.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from airflow_ckpt.errors import CheckpointDeclinedError
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.checkpoint.digests import DigestCache, copy_hashed
from airflow_ckpt.runtime.checkpoint.metadata import FileEntry, OperatorInfo
from airflow_ckpt.runtime.checkpoint.snapshot import CapturedFile, CapturedSnapshot
from airflow_ckpt.runtime.checkpoint.store import SharedFileRegistry
from airflow_ckpt.runtime.clock import SYSTEM_CLOCK, Clock
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout


class ManifestFields(TypedDict):
    """The :class:`~airflow_ckpt.runtime.checkpoint.metadata.Manifest` fields an upload
    decides (typed, so the coordinator's and the importer's ``Manifest(**fields)`` are
    checked field by field)."""

    batch_id: int
    source_offsets: list[Any]
    operators: tuple[OperatorInfo, ...]
    files: tuple[FileEntry, ...]
    state_size: int
    checkpointed_size: int
    num_subtasks: int


@dataclass(frozen=True, slots=True)
class UploadResult:
    files: tuple[FileEntry, ...]
    state_size: int  # bytes of state the checkpoint references
    checkpointed_size: int  # bytes uploaded by this checkpoint

    def manifest_fields(self, snapshot: CapturedSnapshot) -> ManifestFields:
        """The fields of a manifest that the uploaded ``snapshot`` and this upload
        decide (what it read, what it references and what it sent)."""
        return {"batch_id": snapshot.batch_id, "source_offsets": snapshot.source_offsets,
                "operators": snapshot.operators, "files": self.files,
                "state_size": self.state_size, "checkpointed_size": self.checkpointed_size,
                "num_subtasks": len(snapshot.subtasks)}


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
    #: files below this many bytes travel in the manifest (0: none)
    memory_threshold: int = 0

    @classmethod
    def checkpoint(cls, checkpoint_id: int, config: CheckpointConfig,
                   epoch: int | None) -> UploadTarget:
        """A checkpoint's: ``chk-<id>/``, incremental and merged as ``config`` says."""
        return cls(checkpoint_id, f"chk-{checkpoint_id}/", config.incremental,
                   config.file_merging_max_file_size if config.file_merging else 0, epoch,
                   config.memory_threshold)

    @classmethod
    def savepoint(cls, checkpoint_id: int, savepoint_id: str,
                  memory_threshold: int = 0) -> UploadTarget:
        """A savepoint's: self-contained, one object per file, never merged. Under a
        directory of its own checkpoint id (ids are never reused, also not across
        drivers): two drivers answering the same request never write the same object,
        so whichever marker lands first names files nobody else wrote."""
        return cls(checkpoint_id, f"savepoints/sp-{savepoint_id}/{checkpoint_id}/", False,
                   memory_threshold=memory_threshold)

    def inlines(self, f: CapturedFile) -> bool:
        return f.size < self.memory_threshold

    @classmethod
    def imported(cls, checkpoint_id: int, savepoint_id: str, token: str) -> UploadTarget:
        """An imported Spark checkpoint's (``airflow-ckpt import``): a savepoint's, in a
        directory named by a random ``token`` too. An importer holds no lease and
        reserves no ids, so its ``checkpoint_id`` may be another writer's as well; the
        token alone keeps their objects apart."""
        return cls(checkpoint_id, f"savepoints/sp-{savepoint_id}/import-{token}/", False)

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
    clock: Clock = SYSTEM_CLOCK,
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
    (``clock.monotonic()``) passes, or when ``cancelled`` is set; already uploaded files then stay
    as orphans for the garbage collector (shared) or the abandoned-checkpoint sweep.

    Files below ``target.memory_threshold`` are not uploaded: their bytes go in their
    entries (``FileEntry.inline``), read once.

    The steps: 1. set the inline files apart, cut the others into upload units
    (:func:`merge_groups`); 2. upload each
    unit in ``executor`` (:meth:`_SnapshotUpload.unit`: a file alone, or a merged
    object), acknowledging a subtask when its last file is durable; 3. collect the
    entries in the snapshot's file order, cancelling the rest at the first error
    (:meth:`_SnapshotUpload.collect`); 4. forget the digests no snapshot uses any more.
    """
    upload = _SnapshotUpload(storage, layout, snapshot, target, digests, shared, deadline,
                             on_ack, cancelled, reusable or {}, clock)
    inline = [f for f in snapshot.files if target.inlines(f)]
    units = merge_groups([f for f in snapshot.files if not target.inlines(f)], target)
    futures = [executor.submit(upload.unit, group, i) for i, group in enumerate(units)]
    if inline:
        futures.append(executor.submit(upload.inlined, inline))
    result = upload.collect(futures)
    digests.prune()
    return result


class _SnapshotUpload:
    """One call of :func:`upload_snapshot`: its arguments and the subtasks' counts."""

    def __init__(self, storage: CheckpointStorage, layout: JobLayout,
                 snapshot: CapturedSnapshot, target: UploadTarget, digests: DigestCache,
                 shared: SharedFileRegistry, deadline: float, on_ack: Callable[[str], None],
                 cancelled: threading.Event, reusable: Mapping[str, FileEntry],
                 clock: Clock) -> None:
        self.storage, self.layout, self.snapshot, self.target = storage, layout, snapshot, target
        self.digests, self.shared, self.deadline = digests, shared, deadline
        self.on_ack, self.cancelled, self.reusable = on_ack, cancelled, reusable
        self.clock = clock
        self._lock = threading.Lock()
        #: files of each subtask not yet durable
        self._remaining: dict[str, int] = {}
        for f in snapshot.files:
            self._remaining[f.subtask] = self._remaining.get(f.subtask, 0) + 1

    def unit(self, group: list[CapturedFile], index: int) -> tuple[list[FileEntry], int]:
        """Upload one unit (a file alone, or merged group ``index``); acknowledge the
        subtasks whose last file it was. Returns its entries and the bytes uploaded."""
        self._check()
        interleave.point(interleave.UPLOAD_BEFORE_FILE)
        if len(group) == 1 and not self.target.merges(group[0]):
            result = self._alone(group[0])
        else:
            result = self._merged(group, index)
        self._acknowledge(group)
        return result

    def inlined(self, files: list[CapturedFile]) -> tuple[list[FileEntry], int]:
        """The entries of files that travel in the manifest (read once, hashed from the
        bytes read); acknowledge the subtasks whose last files they were."""
        self._check()
        entries = []
        for f in files:
            data = f.staged.read_bytes()
            entries.append(FileEntry.inlined(f.path, data, hashlib.sha256(data).hexdigest()))
        self._acknowledge(files)
        return entries, sum(e.size for e in entries)

    def collect(self, futures: list[Future[tuple[list[FileEntry], int]]]) -> UploadResult:
        """Wait for every unit (until the deadline); the first error cancels the rest
        and is raised as ``CheckpointDeclinedError``."""
        by_path: dict[str, FileEntry] = {}
        checkpointed = 0
        error: BaseException | None = None
        for future in futures:
            try:
                entries, uploaded = future.result(
                    timeout=max(self.deadline - self.clock.monotonic(), 0.001))
            except BaseException as exc:
                error = error or exc
                self.cancelled.set()
                continue
            by_path.update((e.path, e) for e in entries)
            checkpointed += uploaded
        if error is not None:
            if isinstance(error, CheckpointDeclinedError):
                raise error
            raise CheckpointDeclinedError(f"upload failed: {error}") from error
        files = tuple(by_path[f.path] for f in self.snapshot.files)
        return UploadResult(files, sum(e.size for e in files), checkpointed)

    def _check(self) -> None:
        if self.cancelled.is_set() or self.clock.monotonic() > self.deadline:
            raise CheckpointDeclinedError("checkpoint expired or was cancelled")

    def _acknowledge(self, group: list[CapturedFile]) -> None:
        acked = []
        with self._lock:
            for f in group:
                self._remaining[f.subtask] -= 1
                if self._remaining[f.subtask] == 0:
                    acked.append(f.subtask)
        for subtask in acked:
            self.on_ack(subtask)

    def _store(self, path: Path, key: str) -> bool:
        """Upload ``path`` to ``key`` unless content addressing finds it stored; True if
        it was uploaded."""
        incremental = self.target.incremental
        if incremental and not self.shared.reserve(self.target.checkpoint_id, key):
            return False
        if incremental:
            self.shared.attempted(key)
        self.storage.upload_file(path, key)
        if incremental:
            self.shared.uploaded(key)
        return True

    def _entry(self, f: CapturedFile, key: str, sha: str,
               offset: int | None = None) -> FileEntry:
        return FileEntry(f.path, key[len(self.layout.root):], f.size, sha,
                         self.target.incremental, offset)

    def _reuse(self, f: CapturedFile, sha: str) -> FileEntry | None:
        """A retained checkpoint's shared copy of these bytes (a file, or a segment of a
        merged object), pinned for this checkpoint; None if there is none to pin."""
        old = self.reusable.get(sha)
        if old is None or not self.target.incremental:
            return None
        key = self.layout.root + old.key
        # reserve() pins the object; False: it is stored and stays so
        if self.shared.reserve(self.target.checkpoint_id, key):
            return None
        return self._entry(f, key, sha, old.offset)

    def _alone(self, f: CapturedFile) -> tuple[list[FileEntry], int]:
        target = self.target
        if not target.incremental:
            # The key does not depend on the bytes: hash them as they are sent (one read).
            key = self.layout.root + target.dir_key + f.path
            sha = self.storage.upload_file_hashed(f.staged, key)
            self.digests.remember(f.staged, sha)
            return [self._entry(f, key, sha)], f.size
        sha = self.digests.digest(f.staged)
        if (found := self._reuse(f, sha)) is not None:
            return [found], 0
        key = self.layout.shared_file(sha, target.epoch)
        return [self._entry(f, key, sha)], f.size if self._store(f.staged, key) else 0

    def _merged(self, group: list[CapturedFile], index: int) -> tuple[list[FileEntry], int]:
        out: dict[str, FileEntry] = {}
        fresh: list[tuple[CapturedFile, str]] = []
        for f in group:
            self._check()
            sha = self.digests.digest(f.staged)
            if (found := self._reuse(f, sha)) is not None:
                out[f.path] = found
            else:
                fresh.append((f, sha))
        if not fresh:
            return [out[f.path] for f in group], 0
        path = self.snapshot.staging_dir / f".merged-{index}"
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
        target = self.target
        key = (self.layout.shared_file(digest.hexdigest(), target.epoch) if target.incremental
               else self.layout.merged_file(target.checkpoint_id, digest.hexdigest()))
        uploaded = size if self._store(path, key) else 0
        path.unlink()
        for f, sha in fresh:
            out[f.path] = self._entry(f, key, sha, offsets[sha])
        return [out[f.path] for f in group], uploaded
