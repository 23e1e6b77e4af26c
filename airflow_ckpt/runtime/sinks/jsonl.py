"""The small, human-readable sink: one JSON-lines object per batch, written by the driver."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from airflow_ckpt.errors import CorruptCheckpointError, ObjectNotFoundError
from airflow_ckpt.runtime.sinks.staged import StagedSink
from airflow_ckpt.runtime.sinks.transactions import SinkTransactions, Transaction
from airflow_ckpt.runtime.storage.base import CheckpointStorage


class JsonLinesSink(StagedSink):
    """Writes each batch as one JSON-lines object in checkpoint-style storage.

    ``<prefix>/_pending/<batch>/<attempt>.jsonl`` while pre-committed (one fresh key per
    attempt, created create-only), ``<prefix>/part-<batch>.jsonl`` once committed.
    Readers read only ``part-*``. Which attempt a batch commits is decided by
    :class:`~airflow_ckpt.runtime.sinks.transactions.SinkTransactions` (``_txn/`` and
    ``_committed/`` under the prefix), so a deposed driver's late write never changes
    it. Commit is copy-then-delete: a crash between the two leaves the decision, and the
    next commit or abort of that batch finishes it. A committed batch staged again is
    skipped if it read the source offsets its decision recorded; otherwise it is refused
    (``SinkReplayMismatchError``, EXACTLY_ONCE) or published as extra output
    ``part-<batch>.<tag>.jsonl`` (AT_LEAST_ONCE); see ``docs/sinks.md``.

    ``ids``: fresh random ids (each pre-commit's attempt key).
    """

    attempt_suffix = ".jsonl"

    def __init__(self, storage: CheckpointStorage, prefix: str, *,
                 ids: Callable[[], uuid.UUID] = uuid.uuid4) -> None:
        self.storage = storage
        self.ids = ids
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.staging_root = f"{self.prefix}_pending/"
        self.transactions = SinkTransactions(storage, self.prefix, name=repr(self))
        self._lock = threading.Lock()

    def fence(self, gate: Callable[[], None],
              confirm: Callable[[], None] = lambda: None) -> None:
        """The storage is gated already (the job's, or wrapped by the runtime);
        decisions confirm the lease."""
        self.transactions = SinkTransactions(self.storage, self.prefix, confirm, repr(self))

    def __repr__(self) -> str:
        return f"JsonLinesSink({self.storage.uri.rstrip('/') + '/' + self.prefix!r})"

    def _attempt_keys(self, batch_id: int, attempt: str) -> list[str]:
        """One attempt stages one key: known, never listed."""
        return [self._staging(batch_id, attempt)]

    def part_key(self, batch_id: int, replay: str = "") -> str:
        """The published object of the batch (``replay``: of its extra publication)."""
        tag = f".{replay}" if replay else ""
        return f"{self.prefix}part-{batch_id:012d}{tag}.jsonl"

    def pre_commit(self, batch_id: int, rows: Sequence[dict[str, Any]]) -> None:
        body = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows)
        attempt = self.ids().hex[:16]
        staged = self._staging(batch_id, attempt)
        self.storage.put_bytes(staged, body.encode(), create_only=True)
        self._record(Transaction(batch_id, attempt, "staged",
                                 offsets=self.batch_offsets(batch_id)))

    @staticmethod
    def _describe(txn: Transaction) -> dict[str, Any]:
        """The commit decision for a staged transaction: the attempt published."""
        return {"batch": txn.batch, "attempt": txn.attempt}

    def _publish(self, batch_id: int, replay: str, decision: dict[str, Any]) -> None:
        staged = self._staging(batch_id, decision["attempt"])
        part = self.part_key(batch_id, replay)
        try:
            self.storage.copy(staged, part)
        except ObjectNotFoundError:
            # Published by an earlier commit whose clean-up removed the staging.
            if not self.storage.exists(part):
                raise CorruptCheckpointError(
                    f"{self.storage.uri}: batch {batch_id} was committed but neither "
                    f"its staged object {staged} nor {part} exists; "
                    "the sink's directory was modified outside the sink") from None

    def committed_rows(self) -> list[dict[str, Any]]:
        """Every committed row, in batch order (what a downstream reader sees)."""
        rows: list[dict[str, Any]] = []
        for info in self.storage.list(self.prefix + "part-"):
            for line in self.storage.get_bytes(info.key).decode().splitlines():
                if line:
                    rows.append(json.loads(line))
        return rows

    def committed_batches(self) -> list[int]:
        return sorted({
            int(i.key.rsplit("part-", 1)[1].split(".")[0])
            for i in self.storage.list(self.prefix + "part-")
        })
