"""DelegatingStorage: a view of another storage that passes every call straight through.

The base of the storage views (:class:`~airflow_ckpt.runtime.storage.fenced.FencedStorage`
gates the mutations, :class:`~airflow_ckpt.runtime.storage.observed.ObservedStorage`
shows the listings to a listener): each overrides only what it changes, and a method
added to the interface is forwarded in one place. Anything a wrapped backend offers
beyond the interface passes through as well.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from airflow_ckpt.runtime.storage.base import CheckpointStorage, ObjectInfo, Versioned


class DelegatingStorage(CheckpointStorage):
    """``inner``, unchanged."""

    def __init__(self, inner: CheckpointStorage) -> None:
        self.inner = inner
        self.uri = inner.uri

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        return self.inner.put_bytes(key, data, create_only=create_only, if_match=if_match)

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

    def list_after(self, prefix: str, start_after: str) -> builtins.list[ObjectInfo]:
        return self.inner.list_after(prefix, start_after)

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        return self.inner.list_dirs(prefix)

    def upload_file(self, path: Path, key: str) -> None:
        self.inner.upload_file(path, key)

    def upload_file_hashed(self, path: Path, key: str) -> str:
        return self.inner.upload_file_hashed(path, key)

    def download_file(self, key: str, path: Path) -> None:
        self.inner.download_file(key, path)

    def copy(self, src_key: str, dst_key: str) -> None:
        self.inner.copy(src_key, dst_key)

    def delete_many(self, keys: Iterable[str]) -> None:
        self.inner.delete_many(keys)

    def abort_incomplete_uploads(self, prefix: str) -> int:
        return self.inner.abort_incomplete_uploads(prefix)

    def close(self) -> None:
        self.inner.close()
