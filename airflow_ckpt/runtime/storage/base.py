"""The checkpoint storage interface every backend implements.

Keys are ``/``-separated paths relative to the storage root (``s3://bucket/prefix`` or
``file:///path``); they never start with ``/``. A "prefix" is a key prefix, normally
ending in ``/``.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import io
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One stored object: its key (relative to the root), size in bytes, mtime (epoch s)."""

    key: str
    size: int
    last_modified: float


@dataclass(frozen=True, slots=True)
class Versioned:
    """An object's bytes and the version tag (ETag) to condition a replacement on."""

    data: bytes
    etag: str


def etag_of(data: bytes) -> str:
    """The ETag a single-request write of ``data`` gets: its MD5 in hex, as S3's."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class CheckpointStorage(ABC):
    """Durable object storage for checkpoints, savepoints, control requests and history.

    Contract of every method: when it returns, what it wrote is durable and visible to
    every later reader (S3 is strongly read-after-write consistent; the file backend
    fsyncs). Errors are :class:`airflow_ckpt.errors.StorageError` subclasses.
    """

    #: the URI this storage was opened with, e.g. ``s3://bucket/prefix``
    uri: str

    @abstractmethod
    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        """Write ``data`` at ``key``; return the new object's ETag.

        Conditions, each decided atomically by the storage (S3 ``If-None-Match: *`` /
        ``If-Match``; a link or a locked compare-and-rename on files):

        * ``create_only``: if ``key`` exists with other bytes, raise
          ``ObjectAlreadyExistsError`` and leave it untouched;
        * ``if_match``: replace only the version whose ETag is ``if_match``; another
          version (or none) raises ``PreconditionFailedError``, the object untouched.

        Without either, an existing object is replaced atomically.

        *Three outcomes.* A write whose answer is lost may have been applied. When its
        retry meets the condition it set itself up for (412), the stored object is read
        back: the caller's own bytes there mean the write is done (it returns), other
        bytes mean not done (the errors above), and a read-back that fails after its own
        retries raises ``OutcomeUnknownError``: never a failure or another writer
        without evidence. So a conditional write that finds exactly its bytes in place
        succeeds; callers make the bytes unique where "who wrote it" matters.
        """

    @abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """Read the whole object. Raises ``ObjectNotFoundError`` if absent."""

    def get_versioned(self, key: str) -> Versioned:
        """The object's bytes and ETag, read together (``ObjectNotFoundError`` if
        absent): what a compare-and-swap (``put_bytes(if_match=...)``) conditions on.
        This default derives the ETag from the bytes, which is what S3 returns for an
        object written in one request."""
        data = self.get_bytes(key)
        return Versioned(data, etag_of(data))

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object is stored at exactly ``key``."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (recursive), sorted by key."""

    def list_after(self, prefix: str, start_after: str) -> builtins.list[ObjectInfo]:
        """Like :meth:`list`, but only keys sorting after ``start_after`` (S3 ``StartAfter``).

        Lets an incremental reader of an append-only prefix continue where it stopped
        without listing what it has seen. This default filters a full listing; backends
        that can skip server side override it.
        """
        return [info for info in self.list(prefix) if info.key > start_after]

    @abstractmethod
    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """The immediate "sub-directories" under ``prefix``: names without ``/``, sorted."""

    @abstractmethod
    def upload_file(self, path: Path, key: str) -> None:
        """Upload a local file (multipart for large files). Replaces an existing object."""

    def upload_file_hashed(self, path: Path, key: str) -> str:
        """:meth:`upload_file`, and return the SHA-256 of the bytes uploaded.

        Backends that can hash the bytes while they send them override it (one read of
        the file, :class:`~airflow_ckpt.runtime.storage.hashing.HashingReader`); this
        default reads the file twice, to hash it and to upload it."""
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
        self.upload_file(path, key)
        return digest.hexdigest()

    @abstractmethod
    def download_file(self, key: str, path: Path) -> None:
        """Download ``key`` to ``path`` (parents are created; written atomically)."""

    @contextlib.contextmanager
    def open_stream(self, key: str, start: int = 0,
                    length: int | None = None) -> Iterator[BinaryIO]:
        """Read ``key`` as a stream of bytes: one request, no metadata lookup first.

        Restore reads through this so that it can hash while it writes and needs no
        per-file HEAD (the manifest already records size and SHA-256). The caller
        verifies the bytes: a backend need not check them (S3 skips its CRC32 here).
        With ``start`` / ``length`` the stream begins at byte ``start`` and holds at
        least ``length`` bytes where the object has them (fewer when it is shorter,
        none when it ends before ``start``); the caller reads what it needs.
        Raises ``ObjectNotFoundError`` if absent. The default reads the whole object.
        """
        data = self.get_bytes(key)
        yield io.BytesIO(data[start:] if length is None else data[start:start + length])

    @abstractmethod
    def copy(self, src_key: str, dst_key: str) -> None:
        """Copy one object to another key (server side where the backend can)."""

    @abstractmethod
    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete the given keys; absent keys (and repeats) are ignored.

        When it returns, none of ``keys`` is stored, durably. The keys go out in the
        order given: on S3 in ``DeleteObjects`` requests of at most 1,000 keys each (one
        request for up to 1,000: what a caller batches costs one request, not one per
        key), within which S3 keeps no order; on files one at a time. If it raises, any
        of the keys may be deleted or left (a request cut off, a key refused, the
        requests after it not sent): the error names a key left, and on S3 how many of
        the request's keys failed and how many were not sent. A caller that needs one
        set of keys gone before another makes two calls."""

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under ``prefix``."""
        self.delete_many(info.key for info in self.list(prefix))

    def abort_incomplete_uploads(self, prefix: str) -> int:
        """Abort multipart uploads under ``prefix`` that were started and never
        completed (their parts cost storage and are invisible to listings); returns how
        many. Only the holder of a job's lease may call it for the job's prefix: another
        writer's upload in progress would fail. Backends without multipart: 0."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Release clients and thread pools."""
