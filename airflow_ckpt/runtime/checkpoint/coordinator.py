"""CheckpointCoordinator: triggers checkpoints, places barriers at batch boundaries,
drives the sync and async phases, and completes checkpoints by writing ``_metadata``.

Flink's coordinator injects barrier ``n`` into the sources; a micro-batch engine
already has barriers: the end of every batch. At trigger time the coordinator looks
at the working directory: if batch ``o`` is running (``offsets/o`` without
``commits/o``) the barrier is the end of ``o``; if the query is idle the barrier is
the last committed batch. The time from trigger to that boundary is the checkpoint's
*start delay* (Flink's alignment metric).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace

from airflow_ckpt.errors import (
    AirflowCkptError,
    CheckpointDeclinedError,
)
from airflow_ckpt.runtime.checkpoint.completion import (
    CompletionListener,
    log_completed,
    notify_completed,
)
from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.checkpoint.executors import InlineExecutor, checkpoint_executors
from airflow_ckpt.runtime.checkpoint.failures import (
    CheckpointFailureManager,
    CheckpointFailureReason,
)
from airflow_ckpt.runtime.checkpoint.lease_view import LeaseView
from airflow_ckpt.runtime.checkpoint.marker import write_marker
from airflow_ckpt.runtime.checkpoint.metadata import (
    Manifest,
    SourceSettings,
    Timings,
    Trigger,
    parse_manifest,
)
from airflow_ckpt.runtime.checkpoint.pending import PendingCheckpoint, PendingState
from airflow_ckpt.runtime.checkpoint.savepoint_history import IN_HISTORY
from airflow_ckpt.runtime.checkpoint.snapshot import (
    CapturedSnapshot,
    barrier_batch,
    capture,
    latest_batch,
    query_id,
)
from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
from airflow_ckpt.runtime.checkpoint.triggering import PeriodicSavepointTrigger, PeriodicTrigger
from airflow_ckpt.runtime.checkpoint.upload import (
    DigestCache,
    UploadResult,
    UploadTarget,
    upload_snapshot,
)
from airflow_ckpt.runtime.checkpoint.workdir_check import WorkdirNotSharedError, check_captured
from airflow_ckpt.runtime.clock import SYSTEM_CLOCK, Clock, IdSource, random_id
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout
from airflow_ckpt.runtime.workdir import Workdir, location, staging_root

log = logging.getLogger("airflow_ckpt.checkpoint")


def _savepoint_exists(savepoint_id: str | None) -> str:
    return (f"savepoint id {savepoint_id!r} already exists and a savepoint is never "
            "overwritten: choose another savepoint_id, or dispose of the old savepoint "
            "first (airflow-ckpt dispose)")


Reason = CheckpointFailureReason
#: the states a failure may still move a pending checkpoint out of
_UNSETTLED = (PendingState.PENDING, PendingState.COMPLETING)

TransactionSource = Callable[[int], tuple[int, ...]]  # barrier batch -> pending txn ids
#: a coordinator alone on its storage (tests)
NO_LEASE = LeaseView()


def _extra(p: PendingCheckpoint) -> dict[str, object]:
    """The manifest's ``extra``: the request a savepoint answers, and whether it belongs
    to the savepoint history (``IN_HISTORY``, see savepoint_history.py)."""
    extra: dict[str, object] = {"request_id": p.request_id} if p.request_id else {}
    if p.in_history:
        extra[IN_HISTORY] = True
    return extra


class CheckpointCoordinator:
    """One per running query. Start with :meth:`start`, end with :meth:`shutdown`."""

    def __init__(
        self,
        *,
        storage: CheckpointStorage,
        job: str,
        workdir: Workdir,
        config: CheckpointConfig,
        store: CompletedCheckpointStore,
        history: JobHistory,
        next_checkpoint_id: int,
        spark_version: str,
        last_checkpointed_batch: int | None = None,
        restored_from: str | None = None,
        lease: LeaseView = NO_LEASE,
        transactions: TransactionSource = lambda _batch: (),
        listeners: Sequence[CompletionListener] = (),
        upload_threads: int = 8,
        poll_interval_s: float = 0.05,
        threaded: bool = True,
        digests: DigestCache | None = None,
        clock: Clock = SYSTEM_CLOCK,
        ids: IdSource = random_id,
        trigger_clock: Callable[[], float] | None = None,
        sources: tuple[SourceSettings, ...] | None = None,
    ) -> None:
        """``storage``: gated by the lease (every write passes its gate once);
        ``lease``: the rest of what the checkpoint path needs of the lease;
        ``transactions``: the sinks' pending transactions up to a barrier batch, listed
        in the manifest; ``listeners``: called with each completed manifest (the sinks
        commit); ``clock``: timeouts, durations and reported timestamps; ``ids``: names
        of staging directories; ``trigger_clock``: when periodic checkpoints are due
        (``clock.monotonic`` unless a test needs every look to find one due);
        ``sources``: the query's sources' settings the manifests record, until
        :meth:`record_sources` (the restored checkpoint's: its state was read so)."""
        self.storage = storage
        self.layout = JobLayout(job)
        self.workdir = workdir
        self.staging_root = staging_root(workdir)
        self.config = config
        self.store = store
        self.history = history
        self.spark_version = spark_version
        self.restored_from = restored_from
        self._sources = sources
        self.poll_interval_s = poll_interval_s
        self.lease = lease
        self.transactions = transactions
        self.listeners = tuple(listeners)
        self.clock = clock
        self.ids = ids
        self.failures = CheckpointFailureManager(config.tolerable_failed)
        self.periodic = PeriodicTrigger(config, workdir, trigger_clock or clock.monotonic,
                                        last_checkpointed_batch)
        self.periodic_savepoints = PeriodicSavepointTrigger(
            config.periodic_savepoint_interval_s, trigger_clock or clock.monotonic)
        self._next_id = next_checkpoint_id
        self.first_id = next_checkpoint_id  # ids from here on are this coordinator's
        self._lock = threading.Lock()
        self._pending: list[PendingCheckpoint] = []
        # held from a checkpoint's retention floor to its marker's confirmation (and
        # store.marked): markers count in id order (see _write_marker)
        self._marking = threading.Lock()
        self._last_marked = 0
        self._digests = digests if digests is not None else DigestCache()
        # threaded=False: no background thread, uploads and async phases run inline and
        # the caller drives the coordinator with tick(). Every storage mutation then
        # happens in one deterministic order: what crash-point enumeration needs.
        self.threaded = threaded
        self._files, self._phases = checkpoint_executors(threaded, upload_threads,
                                                         config.max_concurrent)
        self._query_ended = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ckpt-coordinator", daemon=True)

    # ------------------------------------------------------------------ lifecycle
    @property
    def next_checkpoint_id(self) -> int:
        """The id the next checkpoint or savepoint this coordinator triggers takes
        (every id from :attr:`first_id` below it was taken, a savepoint's too)."""
        return self._next_id

    def record_sources(self, sources: tuple[SourceSettings, ...] | None) -> None:
        """The query's sources' settings, recorded by every manifest from the next one
        on (called before the query starts: its first batch reads with them)."""
        self._sources = sources

    def start(self) -> None:
        if self.threaded:
            self._thread.start()

    def tick(self) -> None:
        """One step of the coordinator's loop (what its thread does every poll); not
        threaded, it first runs the async phases the previous step started."""
        if isinstance(self._phases, InlineExecutor):
            self._phases.run_deferred()
        self._tick()

    def shutdown(self, wait: bool = True) -> None:
        """Stop triggering; cancel pending checkpoints; wait for threads to end."""
        self._stop.set()
        with self._lock:
            pending = list(self._pending)
        for p in pending:
            p.cancelled.set()
        if self._thread.is_alive():
            self._thread.join()
        self._phases.shutdown(wait=wait)
        self._files.shutdown(wait=wait)

    def wait(self, p: PendingCheckpoint) -> None:
        """Wait until ``p`` settled: completed, failed or abandoned (ticking it along when
        not threaded)."""
        while not self.threaded and not p.done.is_set():
            self.tick()
        p.done.wait()

    def drain(self) -> None:
        """The query has ended: wait until every checkpoint triggered so far has settled
        (completed, failed or abandoned: then :attr:`fatal` is set).

        One whose barrier batch never committed (the query stopped inside it) is taken
        at the last committed batch instead: the state the query ended with, a batch
        boundary like any barrier. So a stop is not a checkpoint failure, and a savepoint
        requested while the stopped batch ran still completes. Nothing is triggered
        periodically until :meth:`resume`.
        """
        committed = latest_batch(self.workdir, "commits")  # final: the query has ended
        last = -1 if committed is None else committed
        with self._lock:
            self._query_ended = True  # no more periodic triggers: see _periodic_due
            pending = list(self._pending)
            for p in pending:
                if not p.captured and p.barrier_batch is not None and p.barrier_batch > last:
                    log.info("%s %d: the query ended before batch %d committed; its barrier "
                             "is the end of batch %d instead", p.kind, p.checkpoint_id,
                             p.barrier_batch, last)
                    p.barrier_batch = last
        for p in pending:
            self.wait(p)

    def resume(self) -> None:
        """The query runs again after :meth:`drain` (a stop was refused): periodic
        checkpoints are triggered again, and their failures count again."""
        with self._lock:
            self._query_ended = False

    @property
    def fatal(self) -> AirflowCkptError | None:
        """Set when the driver must stop (a fatal ``CheckpointFailureReason``: another
        driver, a lost lease, a marker of unknown outcome, the executors' state out of
        sight; or too many failed checkpoints): decided by the failure manager alone."""
        return self.failures.fatal

    @property
    def pending_count(self) -> int:
        with self._lock:
            return len(self._pending)

    # ------------------------------------------------------------------ triggering
    def trigger(
        self,
        trigger: Trigger,
        *,
        savepoint_id: str | None = None,
        request_id: str | None = None,
        in_history: bool = False,
    ) -> PendingCheckpoint:
        """Trigger a checkpoint (or, with ``savepoint_id``, a savepoint) now.

        The barrier is placed at the next batch boundary (see module doc). Returns the
        pending checkpoint; wait on ``pending.done``. ``in_history``: a savepoint the
        job takes for itself (a request that named none), which the savepoint history's
        retention may dispose of later; any other savepoint is kept.
        """
        with self._lock:
            twin = savepoint_id is not None and any(
                q.savepoint_id == savepoint_id for q in self._pending)
            pending = self._new_pending(trigger, savepoint_id, request_id, in_history)
        if twin:
            self._fail(pending, Reason.SAVEPOINT_ID_IN_USE, f"savepoint id {savepoint_id!r} "
                       "is already being taken by another request")
            return pending
        self._log_triggered(pending)
        return pending

    def _new_pending(self, trigger: Trigger, savepoint_id: str | None = None,
                     request_id: str | None = None,
                     in_history: bool = False) -> PendingCheckpoint:
        """Create and register a pending checkpoint; the caller holds ``self._lock``."""
        self.lease.reserve_ids(self._next_id)
        pending = PendingCheckpoint(
            checkpoint_id=self._next_id,
            trigger=trigger,
            trigger_ts=self.clock.time(),
            deadline=self.clock.monotonic() + self.config.timeout_s,
            savepoint_id=savepoint_id,
            request_id=request_id,
            in_history=in_history,
        )
        self._next_id += 1
        self.periodic.triggered()
        pending.barrier_batch = barrier_batch(
            self.workdir, running=trigger not in ("initial", "final", "stop"))
        self._pending.append(pending)
        return pending

    @staticmethod
    def _log_triggered(pending: PendingCheckpoint) -> None:
        log.info(
            "triggered %s %d (%s) barrier at end of batch %s", pending.kind,
            pending.checkpoint_id, pending.trigger, pending.barrier_batch,
        )

    def _periodic_due(self) -> bool:
        """Whether a periodic checkpoint is due; the caller holds ``self._lock``."""
        if self._query_ended:
            return False  # the final checkpoint follows; a periodic one would repeat it
        if self.failures.fatal is not None:
            return False  # the job is failing; no later checkpoint can succeed
        return self.periodic.due(len(self._pending))

    def _periodic_savepoint_due(self) -> bool:
        """Whether a periodic savepoint is due (``periodic-savepoint.interval`` on this
        driver's own clock; none while one is pending); the caller holds the lock."""
        if self._query_ended or self.failures.fatal is not None:
            return False
        if any(p.trigger == "periodic" and p.is_savepoint for p in self._pending):
            return False
        return self.periodic_savepoints.fire()

    # ------------------------------------------------------------------ main loop
    def _run(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            try:
                self._tick()
            except Exception:  # keep the coordinator alive; the failure is logged
                log.exception("checkpoint coordinator tick failed")

    def _tick(self) -> None:
        with self._lock:
            # The due check and the trigger under one hold of the lock: a periodic
            # checkpoint is never triggered after drain() ended periodic triggering
            # (drain would not wait for it; its barrier batch might never commit).
            periodic = self._new_pending("periodic") if self._periodic_due() else None
            savepoint = (self._new_pending("periodic", f"periodic-{self._next_id}",
                                           in_history=True)
                         if self._periodic_savepoint_due() else None)
        for triggered in (periodic, savepoint):
            if triggered is not None:
                self._log_triggered(triggered)
        now = self.clock.monotonic()
        with self._lock:
            pending = list(self._pending)
        committed: int | None = None
        listed = False  # Spark's commit log is listed only when a barrier waits on it
        for p in pending:
            if p.done.is_set():
                continue
            if now > p.deadline and p.state is PendingState.PENDING:
                self._fail(p, Reason.EXPIRED,
                           f"expired after {self.config.timeout_s:g} s before completing")
                continue
            if p.captured:
                continue
            barrier = p.barrier_batch if p.barrier_batch is not None else 0
            if barrier != -1 and not listed:
                committed, listed = latest_batch(self.workdir, "commits"), True
            if barrier == -1 or (committed is not None and committed >= barrier):
                self._sync_phase(p, self.clock.time())

    def _sync_phase(self, p: PendingCheckpoint, barrier_ts: float) -> None:
        p.captured = True
        start = self.clock.monotonic()
        staging = self.staging_root / f"chk-{p.checkpoint_id}-{self.ids()[:6]}"
        try:
            if p.barrier_batch == -1:
                snap = CapturedSnapshot(-1, (), (), [], (), staging)
            else:
                snap = capture(self.workdir, p.barrier_batch or 0, staging)
                check_captured(location(self.workdir), snap)  # executors' state on other hosts
        except WorkdirNotSharedError as exc:  # no later checkpoint could see the state
            self._fail(p, Reason.WORKDIR_NOT_SHARED, str(exc), error=exc)
            return
        except CheckpointDeclinedError as exc:
            self._fail(p, Reason.DECLINED, str(exc))
            return
        sync_ms = int((self.clock.monotonic() - start) * 1000)
        self._phases.submit(self._async_phase, p, snap, barrier_ts, sync_ms)

    def _async_phase(
        self, p: PendingCheckpoint, snap: CapturedSnapshot, barrier_ts: float, sync_ms: int
    ) -> None:
        """The async phase, in the background: every step below either hands on or
        settles ``p`` itself (completed, failed or abandoned) and stops the phase.

        1. a savepoint id that completed already is never written again
           (:meth:`_answered_by_existing`);
        2. upload the snapshot's files (:meth:`_upload`): durable when it returns;
        3. describe them in the manifest (:meth:`_manifest`);
        4. claim completion (``PENDING`` -> ``COMPLETING``): from here on the timeout
           cannot fail ``p``, the marker write decides;
        5. write the completion marker ``_metadata``, create-only, through the lease's
           gate, and 6. confirm the lease after it (:meth:`_write_marker`);
        7. complete: the store, the history, the listeners (:meth:`_complete`).
        """
        start = self.clock.monotonic()
        try:
            if p.savepoint_id is not None and self._answered_by_existing(p):
                return
            result = self._upload(p, snap)
            manifest = self._manifest(p, snap, result, barrier_ts, sync_ms,
                                      async_ms=int((self.clock.monotonic() - start) * 1000))
            if (p.cancelled.is_set() or self.clock.monotonic() > p.deadline
                    or not p.move(PendingState.COMPLETING, allowed=(PendingState.PENDING,))):
                self._fail(p, Reason.EXPIRED, "checkpoint expired or was cancelled")
                return
            written = self._write_marker(p, manifest)
            if written is None:
                return
            manifest = written
        except CheckpointDeclinedError as exc:
            self._fail(p, Reason.ASYNC_EXCEPTION, str(exc), allowed=_UNSETTLED)
            return
        except Exception as exc:  # any storage error declines this checkpoint only
            self._fail(p, Reason.ASYNC_EXCEPTION, f"{type(exc).__name__}: {exc}",
                       allowed=_UNSETTLED)
            return
        finally:
            snap.discard()
        self._complete(p, manifest)

    def _upload(self, p: PendingCheckpoint, snap: CapturedSnapshot) -> UploadResult:
        """Step 2: upload the snapshot's files (durable when this returns); raises
        ``CheckpointDeclinedError`` on a storage error, the deadline or a cancel."""
        target = (UploadTarget.savepoint(p.checkpoint_id, p.savepoint_id,
                                         self.config.memory_threshold) if p.savepoint_id
                  else UploadTarget.checkpoint(p.checkpoint_id, self.config, self.lease.epoch))
        return upload_snapshot(
            self.storage, self.layout, snap, target,
            executor=self._files, digests=self._digests, shared=self.store.shared,
            deadline=p.deadline, on_ack=p.acked.add, cancelled=p.cancelled,
            reusable=self.store.shared_index() if target.incremental else None,
            clock=self.clock,
        )

    def _manifest(self, p: PendingCheckpoint, snap: CapturedSnapshot, result: UploadResult,
                  barrier_ts: float, sync_ms: int, *, async_ms: int) -> Manifest:
        """Step 3: the manifest of the uploaded snapshot (what ``_metadata`` says)."""
        completed = self.clock.time()
        return Manifest(
            job=self.layout.job,
            checkpoint_id=p.checkpoint_id,
            kind=p.kind,
            trigger=p.trigger,
            spark_version=self.spark_version,
            query_id=query_id(self.workdir),
            mode=self.config.mode,
            num_acknowledged_subtasks=len(p.acked),
            timings=Timings.measured(trigger_ts=p.trigger_ts, barrier_ts=barrier_ts,
                                     completed_ts=completed, sync_ms=sync_ms,
                                     async_ms=async_ms),
            **result.manifest_fields(snap),
            savepoint_id=p.savepoint_id,
            extra=_extra(p),
            pending_transactions=self.transactions(snap.batch_id),
            restored_from=self.restored_from,
            lease_epoch=self.lease.epoch,
            sources=self._sources,
        )

    def _marker_key(self, p: PendingCheckpoint) -> str:
        return (self.layout.savepoint_metadata(p.savepoint_id) if p.savepoint_id
                else self.layout.checkpoint_metadata(p.checkpoint_id))

    def _write_marker(self, p: PendingCheckpoint, manifest: Manifest) -> Manifest | None:
        """Steps 5 and 6: write ``_metadata`` for ``p`` (``COMPLETING``) and confirm the
        lease after it (:func:`~airflow_ckpt.runtime.checkpoint.marker.write_marker`).

        A checkpoint's marker is written under ``_marking``, with the retention floor
        computed there: every lower checkpoint id's marker is then either written and
        counted (:meth:`CompletedCheckpointStore.marked`) or never written, since a
        checkpoint that reaches its marker after a higher id's is subsumed (Flink's
        ``CHECKPOINT_SUBSUMED``), also after an abandoned one's (its marker may count).
        So no floor misses a checkpoint that completes, with any
        ``max-concurrent-checkpoints``.

        The manifest as written: the marker is durable and counts. None: ``p`` is
        settled: subsumed, answered by a savepoint that landed first, failed (fatal, but
        for a savepoint whose id names another request's savepoint: that request fails
        alone), or abandoned.
        """
        if p.is_savepoint:
            return manifest if self._write_marker_now(p, manifest) else None
        with self._marking:
            if p.checkpoint_id < self._last_marked:
                self._fail(p, Reason.SUBSUMED, f"checkpoint {self._last_marked} reached its "
                           "marker first", allowed=_UNSETTLED)
                return None
            manifest = replace(manifest,
                               retention_floor=self.store.retention_floor(p.checkpoint_id))
            written = self._write_marker_now(p, manifest)
            if written or p.state is PendingState.ABANDONED:
                # an abandoned marker may count too (a successor adopts it if it landed
                # before its claim), with a floor above every id not marked yet
                self._last_marked = p.checkpoint_id
            return manifest if written else None

    def _write_marker_now(self, p: PendingCheckpoint, manifest: Manifest) -> bool:
        """:meth:`_write_marker`'s write: True when the marker is durable and counts."""
        stashed = self.store.stashed()
        failure = write_marker(self.storage, self._marker_key(p), manifest.to_json(),
                               job=self.layout.job, confirm=self.lease.confirm)
        if failure is None:
            # the confirmation after the marker also clears the deletes the store
            # stashed before it (their markers are gone): see store.py
            self.store.confirmed(stashed)
            if not p.is_savepoint:
                # counted by the next checkpoint's retention floor from now on: it may
                # write its marker before _complete tells the store (see store.marked)
                self.store.marked(p.checkpoint_id)
            return True
        if failure.reason is Reason.CONCURRENT_DRIVER and p.is_savepoint:
            # Another driver's answer to this very request landed first (it was deposed
            # mid-way): that savepoint answers it; or a request re-used an id: fail that
            # request only.
            if not self._answered_by_existing(p, claimed=True):
                self._fail(p, Reason.SAVEPOINT_EXISTS, _savepoint_exists(p.savepoint_id),
                           allowed=_UNSETTLED)
        elif failure.reason.abandons:
            # The marker may count, now or later: this checkpoint is neither failed nor
            # completed. Only a new epoch can settle it (its claim-then-adopt counts the
            # marker if it landed before, never if after), so this driver stops and a
            # restart decides.
            self._abandon(p, failure.reason, failure.error, failure.message)
        else:
            self._fail(p, failure.reason, failure.message, error=failure.error,
                       allowed=_UNSETTLED)
        return False

    def _answered_by_existing(self, p: PendingCheckpoint, *, claimed: bool = False) -> bool:
        """A savepoint id that already completed is never written to again.

        If the existing savepoint answers this very request (the driver crashed between
        its ``_metadata`` and the answer, or a deposed driver's marker for the same
        request landed first), complete the request with it; otherwise fail the request
        (``SAVEPOINT_EXISTS``). Returns True if ``p`` is settled. ``claimed``: ``p`` is
        ``COMPLETING`` already (its own marker write met the existing one).
        """
        assert p.savepoint_id is not None
        key = self.layout.savepoint_metadata(p.savepoint_id)
        if not self.storage.exists(key):
            return False  # nothing completed under this id yet
        existing = parse_manifest(self.storage.get_bytes(key), where=key)
        if p.request_id is None or existing.extra.get("request_id") != p.request_id:
            self._fail(p, Reason.SAVEPOINT_EXISTS, _savepoint_exists(p.savepoint_id),
                       allowed=_UNSETTLED)
            return True
        log.info("savepoint %s already answers request %s", p.savepoint_id, p.request_id)
        if not claimed and not p.move(PendingState.COMPLETING, allowed=(PendingState.PENDING,)):
            return True  # failed meanwhile (timeout): settled
        p.move(PendingState.COMPLETED, allowed=(PendingState.COMPLETING,))
        self._settled(p)
        self.store.shared.release(p.checkpoint_id)
        p.manifest = existing
        p.path = self.storage.uri.rstrip("/") + "/" + self.layout.savepoint_dir(
            p.savepoint_id).rstrip("/")
        p.done.set()
        return True

    def _settled(self, p: PendingCheckpoint) -> None:
        """``p`` is no longer pending."""
        with self._lock:
            if p in self._pending:
                self._pending.remove(p)

    def _complete(self, p: PendingCheckpoint, manifest: Manifest) -> None:
        p.move(PendingState.COMPLETED, allowed=(PendingState.COMPLETING,))
        with self._lock:
            if p in self._pending:
                self._pending.remove(p)
            self.periodic.completed(None if p.is_savepoint else manifest.batch_id)
        p.manifest = manifest
        dir_key = (
            self.layout.savepoint_dir(p.savepoint_id) if p.savepoint_id
            else self.layout.checkpoint_dir(manifest.checkpoint_id)
        )
        p.path = self.storage.uri.rstrip("/") + "/" + dir_key.rstrip("/")
        self.failures.on_success()
        log_completed(manifest)
        try:
            notify_completed(manifest, p.path, store=self.store, history=self.history,
                             listeners=self.listeners, request_id=p.request_id)
        finally:
            p.done.set()

    def _abandon(self, p: PendingCheckpoint, reason: CheckpointFailureReason,
                 fatal: AirflowCkptError, message: str) -> None:
        """Give ``p`` up after its marker write, without saying it failed: its marker may
        count for a successor. Nothing acts on it (no commit, no answer, no history
        event, reservations kept: this driver collects nothing any more); the driver
        stops (``fatal``)."""
        p.move(PendingState.ABANDONED, allowed=(PendingState.COMPLETING,))
        self._settled(p)
        self.failures.on_failure(reason, p.checkpoint_id, message, error=fatal)
        p.failure = message
        p.cancelled.set()
        log.error("%s %d abandoned: %s", p.kind, p.checkpoint_id, message)
        p.done.set()

    def _fail(
        self, p: PendingCheckpoint, reason: CheckpointFailureReason, message: str, *,
        error: AirflowCkptError | None = None,
        allowed: tuple[PendingState, ...] = (PendingState.PENDING,),
    ) -> None:
        """Fail ``p`` for ``reason`` unless it left the ``allowed`` states already (the
        marker write decides then); ``error``: the job's fatal error, for a fatal
        reason."""
        if not p.move(PendingState.FAILED, allowed=allowed):
            return  # completing or completed already: the marker write decides
        self._settled(p)
        p.cancelled.set()
        p.failure = message
        self.store.shared.release(p.checkpoint_id)
        # Like Flink, only checkpoints count towards tolerable-failed-checkpoints; and
        # only while the query runs: a checkpoint of an ended query fails the step that
        # waits for it (the final checkpoint is retried, a stop is refused).
        self.failures.on_failure(
            reason, p.checkpoint_id, message, error=error,
            countable=not self._stop.is_set() and not self._query_ended and not p.is_savepoint)
        log.warning("%s %d failed (%s): %s", p.kind, p.checkpoint_id, reason.label, message)
        try:
            self.history.append_when_reachable(
                ev.SAVEPOINT_FAILED if p.is_savepoint else ev.CHECKPOINT_FAILED,
                id=p.checkpoint_id, status="FAILED", is_savepoint=p.is_savepoint,
                trigger=p.trigger, trigger_timestamp=int(p.trigger_ts * 1000),
                failure_message=message, request_id=p.request_id,
            )
        finally:
            p.done.set()
