"""Two-phase-commit sinks: exactly-once output tied to checkpoint completion.

Flink's ``TwoPhaseCommitSinkFunction`` mapped onto micro-batches: a transaction is a
batch. ``pre_commit(batch)`` makes the batch's output durable but invisible;
``commit(batch)`` publishes it once a checkpoint covering the batch completed;
``abort(batch)`` discards it. On restore from checkpoint ``k`` (batch ``b``) the
transactions listed in ``k``'s manifest are committed (recover-and-commit) and every
other pending one is aborted: its batch is replayed. In AT_LEAST_ONCE mode output is
committed right away and a replay after restore may repeat it.
"""

from __future__ import annotations

import json
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_ckpt.errors import ObjectNotFoundError
from airflow_ckpt.runtime.storage.base import CheckpointStorage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("airflow_ckpt.sinks")


class TwoPhaseCommitSink(ABC):
    """A sink whose transactions are micro-batches. Implementations must be idempotent:
    ``commit`` and ``abort`` may be called again for the same batch after a crash."""

    def stage(self, df: DataFrame, batch_id: int) -> None:
        """Pre-commit the batch held in ``df`` (called from ``foreachBatch`` on the driver).

        The default collects the rows into the driver and calls :meth:`pre_commit`:
        fine for small outputs. A sink for real volume overrides this so that the
        executors write the data and the driver handles only file lists.
        """
        self.pre_commit(batch_id, [row.asDict(recursive=True) for row in df.collect()])

    @abstractmethod
    def pre_commit(self, batch_id: int, rows: Sequence[dict[str, Any]]) -> None:
        """Durably stage the batch's output, invisible to readers. May replace an
        earlier staging of the same batch (a replay after restore)."""

    @abstractmethod
    def commit(self, batch_id: int) -> None:
        """Publish a pre-committed batch. A no-op if already committed."""

    @abstractmethod
    def abort(self, batch_id: int) -> None:
        """Discard a pre-committed batch. A no-op if nothing is staged."""

    @abstractmethod
    def pending(self) -> list[int]:
        """Batch ids pre-committed and neither committed nor aborted, ascending."""

    def recover(self, commit: Iterable[int]) -> None:
        """After restore: commit the checkpoint's transactions, abort all others."""
        keep = set(commit)
        for batch_id in self.pending():
            if batch_id in keep:
                log.info("recover-and-commit transaction of batch %d", batch_id)
                self.commit(batch_id)
            else:
                log.info("aborting transaction of batch %d (it will be replayed)", batch_id)
                self.abort(batch_id)


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
