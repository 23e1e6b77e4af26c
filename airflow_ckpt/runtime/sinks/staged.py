"""StagedSink: the driver side shared by the built-in sinks (JSON lines, Parquet).

Each attempt of a batch is staged under keys of its own, ``<root><batch>/<attempt>...``
(nobody else ever writes them), recorded and decided by
:class:`~airflow_ckpt.runtime.sinks.transactions.SinkTransactions`, and published by
the sink (:meth:`StagedSink._publish`: copies or renames named by the decision). What
the two sinks share is how a commit, an abort and a recovery walk a batch's
publications and clean up after them:

* **commit**: decide (every batch a checkpoint commits: their records read, the lease
  confirmed once, each decided), publish each, then one delete for all of them holding
  the published attempts' staged data, the records and the attempts' outcomes
  (:meth:`SinkTransactions.finish_all`): the attempts' keys are their own and their data is
  published, so the delete needs no lease confirmation and may land late.
* **abort** and **recovery**: the batch's whole staging (every attempt, a deposed
  driver's included) is listed, the lease confirmed, then deleted
  (:meth:`SinkTransactions.discard`): only there can another driver's data be among the
  keys. Attempts a commit did not delete (a replay skipped, a superseded staging whose
  delete failed, a deposed driver's late upload) are left for that sweep: recovery
  aborts, or rolls forward, every batch with staging and no pending record.
"""

from __future__ import annotations

import logging
import threading
from abc import abstractmethod
from collections.abc import Iterable
from typing import Any

from airflow_ckpt.errors import ObjectAlreadyExistsError, SinkReplayMismatchError
from airflow_ckpt.runtime.sinks.base import TwoPhaseCommitSink
from airflow_ckpt.runtime.sinks.transactions import (
    AttemptOutcome,
    Finished,
    SinkTransactions,
    Transaction,
)
from airflow_ckpt.runtime.storage.base import CheckpointStorage

log = logging.getLogger("airflow_ckpt.sinks")


class StagedSink(TwoPhaseCommitSink):
    """A two-phase-commit sink whose attempts are staged under attempt-scoped keys (see
    the module doc). Subclasses set :attr:`storage`, :attr:`transactions`,
    :attr:`staging_root` and :attr:`attempt_suffix`, and implement :meth:`_describe`
    and :meth:`_publish`."""

    storage: CheckpointStorage
    transactions: SinkTransactions
    #: where the batches' staging lives: ``<staging_root><batch>/<attempt><suffix>``
    staging_root: str
    #: what follows an attempt id in its staged keys ("/" for a directory of files)
    attempt_suffix: str
    _lock: threading.Lock

    def _staging(self, batch_id: int, attempt: str | None = None) -> str:
        """The prefix of the batch's staged data (every attempt), or of one attempt's."""
        base = f"{self.staging_root}{batch_id:012d}/"
        return f"{base}{attempt}{self.attempt_suffix}" if attempt else base

    def _attempt_keys(self, batch_id: int, attempt: str) -> list[str]:
        """The keys one attempt staged (listed: its prefix is its own)."""
        return [info.key for info in self.storage.list(self._staging(batch_id, attempt))]

    @abstractmethod
    def _describe(self, txn: Transaction) -> dict[str, Any]:
        """The commit decision for a staged transaction (a pure function of it)."""

    @abstractmethod
    def _publish(self, batch_id: int, replay: str, decision: dict[str, Any]) -> None:
        """Make the decided attempt visible to readers; idempotent (a commit may run
        again after a crash, its staging possibly gone)."""

    def _slots(self, batch_id: int, extra: bool = True) -> list[str]:
        """The batch's extra publications with a record (if ``extra``), then the batch
        itself (""): an extra one is finished first, as an abort of the batch deletes
        every attempt staged under ``<staging_root><batch>/``."""
        return [*(self.transactions.replays(batch_id) if extra else ()), ""]

    def commit(self, batch_id: int) -> None:
        self.commit_batches((batch_id,))

    def commit_batches(self, batch_ids: Iterable[int]) -> None:
        """Every record read, the lease confirmed once, each batch decided
        (:meth:`SinkTransactions.decide_all`), each published, then all cleaned up in
        one delete (:meth:`SinkTransactions.finish_all`). If a publication raises, the ones
        before it are published and not yet cleaned up: their decisions stand, and the
        next commit or recovery finishes them (a commit is idempotent)."""
        with self._lock:
            slots = [(batch_id, replay) for batch_id in sorted(set(batch_ids))
                     for replay in self._slots(batch_id, self._seeks_extra)]
            decisions = self.transactions.decide_all(slots, self._describe)
            finished = [self._published(batch_id, replay, decision, sweep=self._recovering,
                                        restored=self._recovering)
                        for (batch_id, replay), decision in zip(slots, decisions, strict=True)]
            self.transactions.finish_all([f for f in finished if f is not None])

    def _commit(self, batch_id: int, replay: str, *, sweep: bool) -> None:
        """Decide, publish and clean up one publication of the batch (:meth:`_published`)."""
        finished = self._published(batch_id, replay, self.transactions.decide(
            batch_id, self._describe, replay), sweep=sweep)
        self.transactions.finish_all([finished] if finished is not None else [])

    def _published(self, batch_id: int, replay: str, decision: dict[str, Any] | None, *,
                   sweep: bool, restored: bool = False) -> Finished | None:
        """Publish one decided publication of the batch and return what cleaning it up
        deletes (:meth:`SinkTransactions.finish_all`; None: nothing was staged); ``sweep``:
        first delete the batch's other attempts (abort and recovery: listed, then
        confirmed). ``restored``: the batch is a restored snapshot's, whose decision must
        be of the input the restored batch read; a record superseded after
        :meth:`recover` judged it (a deposed driver's swap landing late) raises here,
        before publishing."""
        if decision is None:
            return None  # never staged (aborted, or a crash before its record)
        if restored and not replay:
            self.transactions.require_restored_input(batch_id, decision.get("offsets"),
                                                     self.batch_offsets)
        self._publish(batch_id, replay, decision)
        attempt = decision["attempt"]
        if sweep and not replay:
            self.transactions.discard(self._staging(batch_id))
            return Finished(batch_id, replay, attempt)
        return Finished(batch_id, replay, attempt, tuple(self._attempt_keys(batch_id, attempt)))

    def abort(self, batch_id: int) -> None:
        with self._lock:
            for replay in self._slots(batch_id):
                if self.transactions.decision(batch_id, replay) is not None:
                    log.warning("%s: batch %d: abort after its commit decision; finishing "
                                "the commit (its output may be visible already)", self,
                                batch_id)
                    self._commit(batch_id, replay, sweep=True)
                    continue
                aborted = self.transactions.abort(batch_id, replay)
                if aborted is AttemptOutcome.COMMIT:
                    self._commit(batch_id, replay, sweep=True)  # its commit won: roll forward
                    continue
                if not replay:
                    self.transactions.discard(self._staging(batch_id))
                elif isinstance(aborted, Transaction):
                    self.transactions.discard(self._staging(batch_id, aborted.attempt))

    def pending(self) -> list[int]:
        """As storage holds them now (any reader, e.g. a check after a run)."""
        return self.transactions.listed()

    def tracked_pending(self) -> list[int]:
        """As this sink knows them: listed once, then its own writes (see
        :meth:`SinkTransactions.staged`): no request at a barrier or a completion."""
        return self.transactions.staged()

    def recover(self, commit: Iterable[int]) -> None:
        """As the base class, and abort the staging a crash left without a record;
        refuse a restored transaction aborted since (``SinkTransactionAbortedError``).
        Lists the records afresh (:meth:`SinkTransactions.restart`): an earlier life
        may have left any."""
        keep = set(commit)
        self.transactions.restart()
        # Listed before the restored batches are judged: one a successor aborts after
        # the judgement is listed staged, and its commit's confirm raises; one it
        # aborted before is refused here (a kept batch missing from the listing would
        # otherwise be neither committed nor refused).
        self.tracked_pending()
        self.transactions.require_committable(keep, self.batch_offsets)
        super().recover(keep)
        pending = set(self.tracked_pending())
        for name in self.storage.list_dirs(self.staging_root):
            if name.isdigit() and int(name) not in pending:
                self.abort(int(name))

    def _record(self, txn: Transaction) -> None:
        """Record the staged attempt ``txn`` (:meth:`SinkTransactions.record`) and delete
        the staging of an attempt that will never be published: this one if the batch
        is committed already (its replay skipped, or refused: raised), or the one it
        superseded (its outcome is ``abort``). Either attempt's keys are its own, so
        the delete needs no lease confirmation."""
        try:
            superseded = self.transactions.record(txn, self.replay_policy,
                                                  describe=self._describe)
        except (ObjectAlreadyExistsError, SinkReplayMismatchError) as exc:
            # committed already: the replay is never published; its own staging goes
            self.storage.delete_many(self._attempt_keys(txn.batch, txn.attempt))
            if isinstance(exc, SinkReplayMismatchError):
                raise
            log.warning("%s: skipping the replay of batch %d (attempt %s): %s", self,
                        txn.batch, txn.attempt, exc)
            return
        if superseded is not None:  # a replay replaces an earlier attempt's staging
            self.storage.delete_many(self._attempt_keys(txn.batch, superseded.attempt))
