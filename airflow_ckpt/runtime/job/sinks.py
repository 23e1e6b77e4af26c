"""The job's sinks: registered, fenced, recovered against the restored checkpoint, and
committed when a checkpoint covering their batches completes (the two-phase commit's
driver side; docs/sinks.md)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow_ckpt.errors import SinkReplayMismatchError
from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.restore.choose import RestoreResult
from airflow_ckpt.runtime.sinks import TwoPhaseCommitSink
from airflow_ckpt.runtime.sinks.offsets import ReplayPolicy, read_batch_offsets
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.runtime.storage.outage import OutageRidingStorage
from airflow_ckpt.runtime.workdir import Workdir

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("airflow_ckpt.job")


class JobSinks:
    """The sinks of one job and their transactions across its attempts.

    ``driver_view`` wraps a storage as the driver writes to it (gated by the lease,
    waiting through outages); a sink with storage of its own writes through it.
    """

    def __init__(
        self, *, lease: JobLease, history: JobHistory, run_id: str, workdir: Workdir,
        exactly_once: bool, driver_view: Callable[[CheckpointStorage], CheckpointStorage],
    ) -> None:
        self.lease = lease
        self.history = history
        self.run_id = run_id
        self.workdir = workdir
        self.exactly_once_mode = exactly_once
        self.driver_view = driver_view
        self.sinks: list[TwoPhaseCommitSink] = []
        # Sinks registered inside ``build`` belong to one attempt: they are dropped when
        # the next attempt calls ``build`` again (which registers them anew).
        self._attempt_sinks: list[TwoPhaseCommitSink] = []
        #: True while the job calls ``build`` (sinks registered then are the attempt's)
        self.building = False
        # The restored checkpoint's transactions: committed by each sink as it registers
        # (recover-and-commit), and carried into every checkpoint of this attempt until a
        # sink has recovered them, so a crash before ``build`` ran never loses them.
        self._restored_txns: tuple[int, ...] | None = None
        self._recovered: list[TwoPhaseCommitSink] = []
        #: what the attempt restored (path, batch; batch -1 for a fresh start)
        self.restored_at: tuple[str | None, int] = (None, -1)
        #: a sink's refusal of a replay: the query fails with it, and it is final
        self.refused: SinkReplayMismatchError | None = None

    def exactly_once(self, sink: TwoPhaseCommitSink) -> Callable[[DataFrame, int], None]:
        """A ``foreachBatch`` function writing through ``sink`` (see
        :meth:`CheckpointedJob.exactly_once
        <airflow_ckpt.runtime.job.checkpointed_job.CheckpointedJob.exactly_once>`)."""
        self.register(sink)

        def write(df: DataFrame, batch_id: int) -> None:
            try:
                sink.stage(df, batch_id)
            except SinkReplayMismatchError as exc:
                self.refused = exc.with_restored(self.restored_at[0])
                raise self.refused from None
            if not self.exactly_once_mode:
                sink.commit(batch_id)

        return write

    def register(self, sink: TwoPhaseCommitSink) -> None:
        if not any(sink is s for s in self.sinks):
            self._wrap_sink_storage(sink)
            if "confirm" in inspect.signature(sink.fence).parameters:
                sink.fence(self.lease.gate, confirm=self.lease.confirm)
            else:  # a sink written for the one-argument hook
                sink.fence(self.lease.gate)
            sink.track_offsets(lambda batch_id: read_batch_offsets(self.workdir, batch_id),
                               ReplayPolicy(not self.exactly_once_mode,
                                            self._report_replay_published))
            self.sinks.append(sink)
            if self.building:
                self._attempt_sinks.append(sink)
        if self._restored_txns is not None and not any(sink is s for s in self._recovered):
            sink.recover(self._restored_txns)
            self._recovered.append(sink)
            self._report_committed_ahead(sink)

    def _wrap_sink_storage(self, sink: TwoPhaseCommitSink) -> None:
        """A sink with storage of its own (its ``storage`` attribute, e.g. an output
        bucket) writes through the views the job's storage has: gated by the lease, and
        waiting through outages within the budget. Done before ``fence``, which builds
        the sink's transactions on that storage."""
        own = getattr(sink, "storage", None)
        if isinstance(own, CheckpointStorage) and not isinstance(own, OutageRidingStorage):
            sink.storage = self.driver_view(own)  # type: ignore[attr-defined]

    def _report_committed_ahead(self, sink: TwoPhaseCommitSink) -> None:
        """Say (log and history) before any batch runs that the sink committed batches
        after the restored one: Spark plans those batch ids again, and each replay is
        skipped if it reads the offsets the sink recorded, refused otherwise."""
        path, batch = self.restored_at
        ahead = [b for b in sink.committed_batches() if b > batch]
        if not ahead:
            return
        log.warning(
            "%s committed batches %d..%d, after the restored %s (batch %d): Spark replans "
            "them; each replay is skipped if it reads the source offsets the sink "
            "recorded and %s if not", sink, ahead[0], ahead[-1], path or "fresh start",
            batch, "refused (SinkReplayMismatchError)" if self.exactly_once_mode
            else "published as extra output (AT_LEAST_ONCE)")
        self.history.append(ev.SINK_AHEAD, run_id=self.run_id, sink=repr(sink),
                            restored=path, restored_batch=batch, first_batch=ahead[0],
                            last_batch=ahead[-1], batches=len(ahead))

    def _report_replay_published(self, sink: str, batch_id: int, committed: str,
                                 replay: str) -> None:
        """AT_LEAST_ONCE: a sink is about to publish a replay of a committed batch that
        read other offsets as extra output; recorded before the sink records it."""
        self.history.append(ev.SINK_REPLAY_PUBLISHED, run_id=self.run_id, sink=sink,
                            batch=batch_id, committed_offsets=committed,
                            replay_offsets=replay, restored=self.restored_at[0])

    def recover(self, restored: RestoreResult) -> None:
        """Start of an attempt: forget the previous attempt's ``build`` sinks and recover
        the sinks registered so far against the restored checkpoint."""
        self.sinks = [s for s in self.sinks if not any(s is a for a in self._attempt_sinks)]
        self._attempt_sinks = []
        self._recovered = []
        self._restored_txns = restored.manifest.pending_transactions if restored.manifest else ()
        self.restored_at = (restored.path, restored.batch_id if restored.batch_id is not None
                            else -1)
        for sink in list(self.sinks):
            self.register(sink)

    def pending_transactions(self, batch_id: int) -> tuple[int, ...]:
        pending = {b for s in self.sinks for b in s.tracked_pending() if b <= batch_id}
        if not self._recovered:
            pending.update(self._restored_txns or ())  # no sink has committed them yet
        return tuple(sorted(pending))

    def commit_transactions(self, manifest: Manifest) -> None:
        if manifest.is_savepoint:
            # A savepoint commits nothing, a checkpoint covering the batch does (also at
            # a stop: its final checkpoint, taken before the savepoint).
            return
        for sink in self.sinks:
            # all of them at once: the built-in sinks confirm the lease once for them
            sink.commit_batches([b for b in sink.tracked_pending() if b <= manifest.batch_id])
