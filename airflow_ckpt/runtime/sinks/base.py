"""Two-phase-commit sinks: exactly-once output tied to checkpoint completion.

Flink's ``TwoPhaseCommitSinkFunction`` mapped onto micro-batches: a transaction is a
batch. ``pre_commit(batch)`` makes the batch's output durable but invisible;
``commit(batch)`` publishes it once a checkpoint covering the batch completed;
``abort(batch)`` discards it. On restore from checkpoint ``k`` (batch ``b``) the
transactions listed in ``k``'s manifest are committed (recover-and-commit) and every
other pending one is aborted: its batch is replayed. In AT_LEAST_ONCE mode output is
committed right away and a replay after restore may repeat it.

A batch id is not the batch's data: after a restore older than the sink's output Spark
plans those batch ids again, possibly over other offsets. The runtime therefore hands
each sink the batch's source offsets (:meth:`TwoPhaseCommitSink.batch_offsets`); a sink
records them with the transaction and, when a committed batch id is staged again, skips
the replay only if it read the same offsets; otherwise the job's
:class:`~airflow_ckpt.runtime.sinks.offsets.ReplayPolicy` (:attr:`replay_policy`)
decides: EXACTLY_ONCE raises :class:`~airflow_ckpt.errors.SinkReplayMismatchError`,
AT_LEAST_ONCE publishes the replay as extra output, reported first (the built-in sinks
do so through :class:`~airflow_ckpt.runtime.sinks.transactions.SinkTransactions`, which
also recognises a replay under a shifted batch id, e.g. after a rescale, by its start).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_ckpt.runtime.sinks.offsets import REFUSE, ReplayPolicy

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_ckpt.runtime.sinks.offsets import BatchOffsets

log = logging.getLogger("airflow_ckpt.sinks")


class TwoPhaseCommitSink(ABC):
    """A sink whose transactions are micro-batches. Implementations must be idempotent:
    ``commit`` and ``abort`` may be called again for the same batch after a crash."""

    #: set by the runtime (:meth:`track_offsets`); None when the sink runs on its own
    _offsets_reader: Callable[[int], BatchOffsets | None] | None = None
    #: set by the runtime (:meth:`track_offsets`); refuse when the sink runs on its own
    _replays: ReplayPolicy = REFUSE
    #: True while :meth:`recover` runs
    _recovering = False

    def track_offsets(self, reader: Callable[[int], BatchOffsets | None],
                      replays: ReplayPolicy | None = None) -> None:
        """Called by the runtime when the sink is registered: ``reader(batch_id)`` gives
        the source offsets of the batch being staged (from the query's offsets log);
        ``replays`` is the job's mode's policy for a replay that read other offsets."""
        self._offsets_reader = reader
        if replays is not None:
            self._replays = replays

    @property
    def replay_policy(self) -> ReplayPolicy:
        """What a committed batch staged again with other offsets becomes: refused
        (EXACTLY_ONCE, and without the runtime) or published as extra output
        (AT_LEAST_ONCE); pass it to ``SinkTransactions.record`` or call its ``judge``."""
        return self._replays

    def batch_offsets(self, batch_id: int) -> BatchOffsets | None:
        """The source offsets of ``batch_id`` (call it while staging the batch), or None
        if the sink runs without the runtime. Record them with the transaction; a
        committed batch staged again with other offsets must be judged by
        :attr:`replay_policy` (refused or published as extra output), never dropped."""
        reader = self._offsets_reader
        return reader(batch_id) if reader is not None else None

    def committed_batches(self) -> list[int]:
        """Batch ids this sink committed, ascending. The runtime compares them with the
        restored checkpoint's batch to report, before any batch runs, that batches will
        be replayed over committed output. The default knows none."""
        return []

    def fence(self, gate: Callable[[], None],  # noqa: B027 - optional hook
              confirm: Callable[[], None] = lambda: None) -> None:
        """Gate the driver-side writes of this sink with the job's lease (called when the
        sink is registered). A sink writing through ``job.storage`` is gated already,
        and so is one that keeps storage of its own in its ``storage`` attribute: the
        runtime wraps it before this call, gated and waiting through storage outages
        (runtime/storage/outage.py). Any other storage the sink wraps in a
        :class:`~airflow_ckpt.runtime.storage.fenced.FencedStorage`. ``confirm`` raises
        if another driver claimed the job: call it after reading what a commit decision
        or a delete rests on and before making it (the built-in sinks do so through
        :class:`~airflow_ckpt.runtime.sinks.transactions.SinkTransactions`; docs/sinks.md
        explains why)."""

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

    def commit_batches(self, batch_ids: Iterable[int]) -> None:
        """Publish the pre-committed batches a completed checkpoint covers (Flink's
        ``notifyCheckpointComplete``: every pending transaction up to it). The default
        calls :meth:`commit` for each, ascending; a sink whose commits each confirm the
        lease may read what each decision rests on, confirm once and decide each (the
        built-in sinks: ``SinkTransactions.decide_all``)."""
        for batch_id in sorted(set(batch_ids)):
            self.commit(batch_id)

    @abstractmethod
    def abort(self, batch_id: int) -> None:
        """Discard a pre-committed batch. A no-op if nothing is staged."""

    @abstractmethod
    def pending(self) -> list[int]:
        """Batch ids pre-committed and neither committed nor aborted, ascending."""

    def tracked_pending(self) -> list[int]:
        """:meth:`pending` as the running driver asks it, at every checkpoint barrier and
        completion; a sink that tracks its own writes answers without a request. The
        default is :meth:`pending`."""
        return self.pending()

    def recover(self, commit: Iterable[int]) -> None:
        """After restore: commit the checkpoint's transactions, abort all others."""
        keep = set(commit)
        self._recovering = True
        try:
            for batch_id in self.tracked_pending():
                if batch_id in keep:
                    log.info("recover-and-commit transaction of batch %d", batch_id)
                    self.commit(batch_id)
                else:
                    log.info("aborting transaction of batch %d (it will be replayed)",
                             batch_id)
                    self.abort(batch_id)
        finally:
            self._recovering = False

    @property
    def _seeks_extra(self) -> bool:
        """Whether ``commit`` looks for extra publications of the batch (replays that
        read other offsets, AT_LEAST_ONCE; a LIST per commit): where this job publishes
        them, and in :meth:`recover` (an earlier life may have). ``abort`` always looks."""
        return self._replays.publish_other or self._recovering
