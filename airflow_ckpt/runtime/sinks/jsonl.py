"""The small, human-readable sink: one JSON-lines object per batch, written by the driver."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

from airflow_ckpt.errors import ObjectNotFoundError
from airflow_ckpt.runtime.sinks.base import TwoPhaseCommitSink
from airflow_ckpt.runtime.storage.base import CheckpointStorage


class JsonLinesSink(TwoPhaseCommitSink):
    """Writes each batch as one JSON-lines object in checkpoint-style storage.

    ``<prefix>/_pending/<batch>.jsonl`` while pre-committed, ``<prefix>/part-<batch>.jsonl``
    once committed. Readers read only ``part-*``. Commit is copy-then-delete, so a
    crash between the two leaves a committed part and a stale pending file, which
    the next commit or abort of that batch removes.
    """

    def __init__(self, storage: CheckpointStorage, prefix: str) -> None:
        self.storage = storage
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._lock = threading.Lock()

    def _pending_key(self, batch_id: int) -> str:
        return f"{self.prefix}_pending/{batch_id:012d}.jsonl"

    def part_key(self, batch_id: int) -> str:
        return f"{self.prefix}part-{batch_id:012d}.jsonl"

    def pre_commit(self, batch_id: int, rows: Sequence[dict[str, Any]]) -> None:
        body = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows)
        self.storage.put_bytes(self._pending_key(batch_id), body.encode())

    def commit(self, batch_id: int) -> None:
        with self._lock:
            pending = self._pending_key(batch_id)
            try:
                self.storage.copy(pending, self.part_key(batch_id))
            except ObjectNotFoundError:
                return  # committed already (or never staged)
            self.storage.delete_many([pending])

    def abort(self, batch_id: int) -> None:
        with self._lock:
            self.storage.delete_many([self._pending_key(batch_id)])

    def pending(self) -> list[int]:
        out = []
        for info in self.storage.list(self.prefix + "_pending/"):
            name = info.key.rsplit("/", 1)[-1]
            if name.endswith(".jsonl") and name[:-6].isdigit():
                out.append(int(name[:-6]))
        return sorted(out)

    def committed_rows(self) -> list[dict[str, Any]]:
        """Every committed row, in batch order (what a downstream reader sees)."""
        rows: list[dict[str, Any]] = []
        for info in self.storage.list(self.prefix + "part-"):
            for line in self.storage.get_bytes(info.key).decode().splitlines():
                if line:
                    rows.append(json.loads(line))
        return rows

    def committed_batches(self) -> list[int]:
        return [
            int(i.key.rsplit("part-", 1)[1].split(".")[0])
            for i in self.storage.list(self.prefix + "part-")
        ]
