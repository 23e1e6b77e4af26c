"""Async phase of a checkpoint: hash and upload captured files in background threads.

Incremental mode stores each file once, content-addressed, in ``shared/``: a file
whose bytes are already stored is referenced, not uploaded again. Otherwise every
file goes under the checkpoint's (or savepoint's) own directory.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from airflow_ckpt.errors import CheckpointDeclinedError
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.layout import JobLayout
from airflow_ckpt.runtime.materialize import sha256_of
from airflow_ckpt.runtime.metadata import FileEntry
from airflow_ckpt.runtime.snapshot import CapturedFile, CapturedSnapshot
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.store import SharedFileRegistry


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


@dataclass(frozen=True, slots=True)
class UploadTarget:
    """Where a snapshot goes: its own directory, and whether it may use ``shared/``."""

    checkpoint_id: int
    dir_key: str  # relative to the job root, e.g. "chk-7/" or "savepoints/sp-x/"
    incremental: bool


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
) -> UploadResult:
    """Upload every captured file; durable in storage when this returns.

    ``on_ack(subtask)`` is called once per subtask when all its files are durable.
    Raises ``CheckpointDeclinedError`` on a storage error, when ``deadline``
    (``time.monotonic()``) passes, or when ``cancelled`` is set; already uploaded files then stay
    as orphans for the garbage collector (shared) or the abandoned-checkpoint sweep.
    """
    remaining: dict[str, int] = {}
    for f in snapshot.files:
        remaining[f.subtask] = remaining.get(f.subtask, 0) + 1
    lock = threading.Lock()

    def one(f: CapturedFile) -> tuple[FileEntry, int]:
        if cancelled.is_set() or time.monotonic() > deadline:
            raise CheckpointDeclinedError("checkpoint expired or was cancelled")
        interleave.point(interleave.UPLOAD_BEFORE_FILE)
        sha = digests.digest(f.staged)
        uploaded = 0
        if target.incremental:
            key = layout.shared_file(sha)
            if shared.reserve(target.checkpoint_id, key):
                storage.upload_file(f.staged, key)
                shared.uploaded(key)
                uploaded = f.size
        else:
            key = layout.root + target.dir_key + f.path
            storage.upload_file(f.staged, key)
            uploaded = f.size
        with lock:
            remaining[f.subtask] -= 1
            done = remaining[f.subtask] == 0
        if done:
            on_ack(f.subtask)
        entry = FileEntry(f.path, key[len(layout.root):], f.size, sha, target.incremental)
        return entry, uploaded

    futures = [executor.submit(one, f) for f in snapshot.files]
    entries: list[FileEntry] = []
    checkpointed = 0
    error: BaseException | None = None
    for future in futures:
        try:
            entry, uploaded = future.result(timeout=max(deadline - time.monotonic(), 0.001))
        except BaseException as exc:
            error = error or exc
            cancelled.set()
            continue
        entries.append(entry)
        checkpointed += uploaded
    if error is not None:
        if isinstance(error, CheckpointDeclinedError):
            raise error
        raise CheckpointDeclinedError(f"upload failed: {error}") from error
    digests.prune()
    state_size = sum(e.size for e in entries)
    return UploadResult(tuple(entries), state_size, checkpointed)
