"""ObservedStorage: a view of a storage that shows every listing it returns to a listener.

The driver's lease lists ``<job>/lease/`` at every heartbeat; handing the lease this
view lets the control channel read the doorbells in that listing without a request of
its own (see :class:`airflow_ckpt.runtime.control.Doorbell`). Everything else passes
straight through, unchanged.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from airflow_ckpt.runtime.storage.base import CheckpointStorage, ObjectInfo, Versioned

#: (the prefix of a complete listing, the objects under it): called after each listing
ListingListener = Callable[[str, "builtins.list[ObjectInfo]"], None]


class ObservedStorage(CheckpointStorage):
    """``inner``, with ``listener(prefix, objects)`` told of every complete listing.

    A :meth:`list_after` is complete for the prefix ``start_after`` cannot cut into: the
    listener hears ``(prefix, objects)`` only when nothing under the returned range was
    skipped, i.e. it is told about a prefix only what a full listing would say.
    """

    def __init__(self, inner: CheckpointStorage, listener: ListingListener) -> None:
        self.inner = inner
        self.listener = listener
        self.uri = inner.uri

    def __repr__(self) -> str:
        return f"ObservedStorage({self.inner!r})"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # listings: observed
    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        found = self.inner.list(prefix)
        self.listener(prefix, found)
        return found

    def list_after(self, prefix: str, start_after: str) -> builtins.list[ObjectInfo]:
        found = self.inner.list_after(prefix, start_after)
        if start_after < prefix:  # nothing under the prefix was skipped
            self.listener(prefix, found)
        return found

    # everything else: straight through
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

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        return self.inner.list_dirs(prefix)

    def upload_file(self, path: Path, key: str) -> None:
        self.inner.upload_file(path, key)

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
