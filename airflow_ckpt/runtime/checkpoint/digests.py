"""Content digests of a checkpoint's files: SHA-256 while copying, of a local file, and
the cache of digests of immutable local files (the uploader reads a file once; a restore
seeds the cache with what it verified, so the first checkpoint after it hashes only what
Spark wrote new). Shared by the checkpoint path (upload) and the restore path
(materialise)."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

#: bytes read or copied at a time
CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a local file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def copy_hashed(src: BinaryIO, dst: BinaryIO, update: Callable[[bytes], object],
                limit: int | None = None) -> int:
    """Copy ``limit`` bytes of ``src`` (all of it if None) to ``dst`` in 1 MiB chunks,
    passing each chunk to ``update`` (a digest's); returns the bytes copied."""
    size = 0
    while limit is None or size < limit:
        chunk = src.read(CHUNK if limit is None else min(CHUNK, limit - size))
        if not chunk:
            break
        update(chunk)
        dst.write(chunk)
        size += len(chunk)
    return size


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
