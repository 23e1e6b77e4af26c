"""FencedStorage: a view of a storage whose every mutation first passes a gate.

The driver writes checkpoints, shared files, sink output and control answers through
one of these, gated by :meth:`airflow_ckpt.runtime.lease.JobLease.gate`: once the
driver's lease could have expired, no new write starts (self-fencing). Reads pass
straight through; so does anything a wrapped backend offers beyond the interface.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from airflow_ckpt.runtime.storage.base import CheckpointStorage, ObjectInfo, Versioned


class FencedStorage(CheckpointStorage):
    """``inner`` with ``gate()`` called before every put, upload, copy and delete."""

    def __init__(self, inner: CheckpointStorage, gate: Callable[[], None]) -> None:
        self.inner = inner
        self.gate = gate
        self.uri = inner.uri

    def __repr__(self) -> str:
        return f"FencedStorage({self.inner!r})"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # mutations: gated
    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        self.gate()
        return self.inner.put_bytes(key, data, create_only=create_only, if_match=if_match)

    def upload_file(self, path: Path, key: str) -> None:
        self.gate()
        self.inner.upload_file(path, key)

    def copy(self, src_key: str, dst_key: str) -> None:
        self.gate()
        self.inner.copy(src_key, dst_key)

    def delete_many(self, keys: Iterable[str]) -> None:
        batch = list(keys)
        if batch:
            self.gate()
            self.inner.delete_many(batch)

    def abort_incomplete_uploads(self, prefix: str) -> int:
        self.gate()
        return self.inner.abort_incomplete_uploads(prefix)

    # reads: straight through
    def get_bytes(self, key: str) -> bytes:
        return self.inner.get_bytes(key)

    def get_versioned(self, key: str) -> Versioned:
        return self.inner.get_versioned(key)

    @contextlib.contextmanager
    def open_stream(self, key: str, start: int = 0,
                    length: int | None = None) -> Iterator[BinaryIO]:
        with self.inner.open_stream(key, start, length) as stream:
            yield stream

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        return self.inner.list(prefix)

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        return self.inner.list_dirs(prefix)

    def download_file(self, key: str, path: Path) -> None:
        self.inner.download_file(key, path)

    def close(self) -> None:
        self.inner.close()
