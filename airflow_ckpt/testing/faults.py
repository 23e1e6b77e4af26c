"""FailingPuts: a storage whose chosen writes fail, for tests of what the runtime does
after a storage error it cannot retry away (a 5xx after the client's own retries, a
refused request).

    storage = FailingPuts(open_storage(uri), final_checkpoint_marker, times=1)

The chosen ``put_bytes`` calls write nothing and raise
:class:`~airflow_ckpt.errors.StorageError` (a definite failure) or the error ``error``
makes (e.g. ``OutcomeUnknownError``: the writer cannot tell); every other call passes
straight through.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from airflow_ckpt.errors import StorageError
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.fenced import FencedStorage

#: decides from a put's key and bytes whether it fails
PutMatcher = Callable[[str, bytes], bool]


class FailingPuts(FencedStorage):
    """``inner`` whose first ``times`` puts matching ``match`` fail (``times`` None:
    every matching put fails). ``failed`` lists the keys of the puts that failed."""

    def __init__(self, inner: CheckpointStorage, match: PutMatcher, times: int | None = 1,
                 error: type[StorageError] = StorageError) -> None:
        super().__init__(inner, lambda: None)
        self.match = match
        self.times = times
        self.error = error
        self.failed: list[str] = []

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        if self.match(key, data) and (self.times is None or len(self.failed) < self.times):
            self.failed.append(key)
            raise self.error(f"injected failure of the put of {key}")
        return self.inner.put_bytes(key, data, create_only=create_only, if_match=if_match)


def checkpoint_marker(trigger: str, batch_id: int | None = None) -> PutMatcher:
    """Matches the ``_metadata`` put of a checkpoint (not a savepoint) with this
    ``trigger`` (``periodic``, ``final``, ...), and with ``batch_id`` if given."""

    def match(key: str, data: bytes) -> bool:
        if not key.endswith("/_metadata") or "/chk-" not in "/" + key:
            return False
        manifest = json.loads(data)
        return bool(manifest["trigger"] == trigger
                    and (batch_id is None or manifest["batch_id"] == batch_id))

    return match


def control_answer(key: str, data: bytes) -> bool:
    """Matches the put of an answer to a control request."""
    return key.endswith(".result.json") and "/control/" in key


def savepoint_marker(key: str, data: bytes) -> bool:
    """Matches the ``_metadata`` put of a savepoint."""
    return key.endswith("/_metadata") and "/savepoints/" in key
