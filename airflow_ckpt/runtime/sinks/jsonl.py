"""The small, human-readable sink: one JSON-lines object per batch, written by the driver."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from airflow_ckpt.errors import (
    CorruptCheckpointError,
    ObjectAlreadyExistsError,
    ObjectNotFoundError,
    SinkReplayMismatchError,
)
from airflow_ckpt.runtime.sinks.base import TwoPhaseCommitSink
from airflow_ckpt.runtime.sinks.transactions import AttemptOutcome, SinkTransactions, Transaction
from airflow_ckpt.runtime.storage.base import CheckpointStorage

log = logging.getLogger("airflow_ckpt.sinks")


class JsonLinesSink(TwoPhaseCommitSink):
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

    def __init__(self, storage: CheckpointStorage, prefix: str, *,
                 ids: Callable[[], uuid.UUID] = uuid.uuid4) -> None:
        self.storage = storage
        self.ids = ids
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.transactions = SinkTransactions(storage, self.prefix, name=repr(self))
        self._lock = threading.Lock()

    def fence(self, gate: Callable[[], None],
              confirm: Callable[[], None] = lambda: None) -> None:
        """The storage is gated already (the job's, or wrapped by the runtime);
        decisions confirm the lease."""
        self.transactions = SinkTransactions(self.storage, self.prefix, confirm, repr(self))

    def __repr__(self) -> str:
        return f"JsonLinesSink({self.storage.uri.rstrip('/') + '/' + self.prefix!r})"

    def _pending_prefix(self, batch_id: int) -> str:
        return f"{self.prefix}_pending/{batch_id:012d}/"

    def part_key(self, batch_id: int, replay: str = "") -> str:
        """The published object of the batch (``replay``: of its extra publication)."""
        tag = f".{replay}" if replay else ""
        return f"{self.prefix}part-{batch_id:012d}{tag}.jsonl"

    def pre_commit(self, batch_id: int, rows: Sequence[dict[str, Any]]) -> None:
        body = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows)
        attempt = self.ids().hex[:16]
        staged = f"{self._pending_prefix(batch_id)}{attempt}.jsonl"
        self.storage.put_bytes(staged, body.encode(), create_only=True)
        try:
            superseded = self.transactions.record(Transaction(
                batch_id, attempt, "staged", offsets=self.batch_offsets(batch_id)),
                self.replay_policy, describe=self._describe)
        except (ObjectAlreadyExistsError, SinkReplayMismatchError) as exc:
            # committed already: the replay is never published; its own staging goes
            self.storage.delete_many([staged])
            if isinstance(exc, SinkReplayMismatchError):
                raise
            log.warning("%s: skipping the replay of batch %d: %s", self, batch_id, exc)
            return
        if superseded is not None:
            self.storage.delete_many(
                [f"{self._pending_prefix(batch_id)}{superseded.attempt}.jsonl"])

    def _slots(self, batch_id: int, extra: bool = True) -> list[str]:
        """The batch's extra publications with a record (if ``extra``), then the batch
        itself (""): an extra one is finished first, as the batch's own clean-up deletes
        every attempt staged under ``_pending/<batch>/``."""
        return [*(self.transactions.replays(batch_id) if extra else ()), ""]

    def commit(self, batch_id: int) -> None:
        with self._lock:
            for replay in self._slots(batch_id, self._seeks_extra):
                self._commit(batch_id, replay)

    @staticmethod
    def _describe(txn: Transaction) -> dict[str, Any]:
        """The commit decision for a staged transaction: the attempt published."""
        return {"batch": txn.batch, "attempt": txn.attempt}

    def _commit(self, batch_id: int, replay: str) -> None:
        decision = self.transactions.decide(batch_id, self._describe, replay)
        if decision is None:
            return  # never staged (aborted, or a crash before its record)
        staged = f"{self._pending_prefix(batch_id)}{decision['attempt']}.jsonl"
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
        self.transactions.discard(staged if replay else self._pending_prefix(batch_id))
        self.transactions.finish(batch_id, replay, attempt=decision["attempt"])

    def abort(self, batch_id: int) -> None:
        with self._lock:
            for replay in self._slots(batch_id):
                if self.transactions.decision(batch_id, replay) is not None:
                    self._commit(batch_id, replay)  # decided: roll the commit forward
                    continue
                aborted = self.transactions.abort(batch_id, replay)
                if aborted is AttemptOutcome.COMMIT:
                    self._commit(batch_id, replay)  # its commit won: roll it forward
                    continue
                if not replay:
                    self.transactions.discard(self._pending_prefix(batch_id))
                elif isinstance(aborted, Transaction):
                    self.transactions.discard(
                        f"{self._pending_prefix(batch_id)}{aborted.attempt}.jsonl")

    def pending(self) -> list[int]:
        return self.transactions.staged()

    def recover(self, commit: Iterable[int]) -> None:
        """As the base class, and abort what a crash left staged without a record;
        refuse a restored transaction aborted since (``SinkTransactionAbortedError``)."""
        keep = set(commit)
        self.transactions.require_committable(keep)
        super().recover(keep)
        pending = set(self.pending())
        for name in self.storage.list_dirs(self.prefix + "_pending/"):
            if name.isdigit() and int(name) not in pending:
                self.abort(int(name))

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
