"""FencedStorage: a view of a storage whose every mutation first passes a gate.

The driver writes checkpoints, shared files, sink output and control answers through
one of these, gated by :meth:`airflow_ckpt.runtime.lease.holder.JobLease.gate`: once the
driver's lease could have expired, no new write starts (self-fencing). Reads pass
straight through (:class:`~airflow_ckpt.runtime.storage.delegating.DelegatingStorage`);
so does anything a wrapped backend offers beyond the interface.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.delegating import DelegatingStorage


class FencedStorage(DelegatingStorage):
    """``inner`` with ``gate()`` called before every put, upload, copy and delete."""

    def __init__(self, inner: CheckpointStorage, gate: Callable[[], None]) -> None:
        super().__init__(inner)
        self.gate = gate

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        self.gate()
        return self.inner.put_bytes(key, data, create_only=create_only, if_match=if_match)

    def upload_file(self, path: Path, key: str) -> None:
        self.gate()
        self.inner.upload_file(path, key)

    def upload_file_hashed(self, path: Path, key: str) -> str:
        self.gate()
        return self.inner.upload_file_hashed(path, key)

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
