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

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from airflow_ckpt.errors import (
    CheckpointDeclinedError,
    CheckpointError,
    CheckpointFailureLimitError,
    ConcurrentDriverError,
    LeaseExpiredError,
    ObjectAlreadyExistsError,
    OutcomeUnknownError,
)
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.checkpoint.metadata import Manifest, Timings, Trigger, parse_manifest
from airflow_ckpt.runtime.checkpoint.snapshot import CapturedSnapshot, capture, latest_batch
from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
from airflow_ckpt.runtime.checkpoint.upload import DigestCache, UploadTarget, upload_snapshot
from airflow_ckpt.runtime.checkpoint.workdir_check import WorkdirNotSharedError, check_captured
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout

log = logging.getLogger("airflow_ckpt.checkpoint")


@dataclass
class PendingCheckpoint:
    """A triggered checkpoint or savepoint that has not completed or failed yet."""

    checkpoint_id: int
    trigger: Trigger
    trigger_ts: float  # wall clock (reported); intervals and timeouts use monotonic time
    deadline: float  # time.monotonic() after which the checkpoint expires
    savepoint_id: str | None = None
    request_id: str | None = None
    barrier_batch: int | None = None
    captured: bool = False
    acked: set[str] = field(default_factory=set)
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    manifest: Manifest | None = None
    path: str | None = None  # URI of the completed checkpoint/savepoint directory
    failure: str | None = None
    # pending -> completing (its _metadata is being written) -> completed, or -> failed.
    # The timeout tick may fail only a *pending* checkpoint: once the async phase claimed
    # completion, the marker write decides (it is bounded by the lease's write time).
    state: str = "pending"
    _state_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def is_savepoint(self) -> bool:
        return self.savepoint_id is not None

    def move(self, to: str, *, allowed: tuple[str, ...]) -> bool:
        """Atomically move to state ``to`` if the current state is in ``allowed``."""
        with self._state_lock:
            if self.state not in allowed:
                return False
            self.state = to
            return True


class CheckpointFailureManager:
    """Counts consecutive failed checkpoints; more than ``tolerable`` is fatal (Flink's)."""

    def __init__(self, tolerable: int) -> None:
        self.tolerable = tolerable
        self.consecutive = 0
        self.fatal: (CheckpointError | ConcurrentDriverError | LeaseExpiredError
                     | OutcomeUnknownError | None) = None

    def on_success(self) -> None:
        self.consecutive = 0

    def on_failure(self, checkpoint_id: int, reason: str) -> None:
        self.consecutive += 1
        if self.consecutive > self.tolerable and self.fatal is None:
            self.fatal = CheckpointFailureLimitError(
                f"{self.consecutive} consecutive checkpoints failed (tolerable: "
                f"{self.tolerable}); last: chk-{checkpoint_id}: {reason}"
            )


class InlineExecutor(Executor):
    """Runs each submitted call in the caller's thread: at once, or with ``deferred``
    when :meth:`run_deferred` is called. An ``Exception`` is kept in the future as a
    pool would; anything else (the process is going down) propagates to the caller, as
    it would end a pool's worker and the process."""

    def __init__(self, deferred: bool = False) -> None:
        self.deferred = deferred
        self._queue: list[tuple[Future[object], Callable[[], object]]] = []

    def submit(self, fn: Callable[..., object], /, *args: object,  # type: ignore[override]
               **kwargs: object) -> Future[object]:
        future: Future[object] = Future()
        self._queue.append((future, partial(fn, *args, **kwargs)))
        if not self.deferred:
            self.run_deferred()
        return future

    def run_deferred(self) -> None:
        queue, self._queue = self._queue, []
        for future, call in queue:
            try:
                future.set_result(call())
            except Exception as exc:
                future.set_exception(exc)


def _savepoint_exists(savepoint_id: str | None) -> str:
    return (f"savepoint id {savepoint_id!r} already exists and a savepoint is never "
            "overwritten: choose another savepoint_id, or dispose of the old savepoint "
            "first (airflow-ckpt dispose)")


# Callbacks the job facade registers.
CompletionListener = Callable[[Manifest], None]
#: niceness added to the upload and async-phase threads (see background_priority)
BACKGROUND_NICENESS = 5


def background_priority() -> None:
    """Lower the calling thread's CPU priority by :data:`BACKGROUND_NICENESS`.

    Why: in local mode (and on any driver that also computes) the batches and the
    checkpoint uploads share the driver's cores. Hashing and uploading are background
    work whose only deadline is the checkpoint timeout, while every CPU second they take
    from a running batch shows up as batch latency. On Linux ``setpriority`` on a thread
    id changes that thread alone; lowering is always permitted. The lease heartbeat
    keeps the normal priority: its timeliness is what fencing relies on.
    """
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid)
                       + BACKGROUND_NICENESS)
    except (AttributeError, OSError):  # not Linux, or not permitted: keep the priority
        log.debug("could not lower the priority of %s", threading.current_thread().name)


TransactionSource = Callable[[int], tuple[int, ...]]  # barrier batch -> pending txn ids


class CheckpointCoordinator:
    """One per running query. Start with :meth:`start`, end with :meth:`shutdown`."""

    def __init__(
        self,
        *,
        storage: CheckpointStorage,
        job: str,
        workdir: Path,
        config: CheckpointConfig,
        store: CompletedCheckpointStore,
        history: JobHistory,
        next_checkpoint_id: int,
        spark_version: str,
        last_checkpointed_batch: int | None = None,
        restored_from: str | None = None,
        upload_threads: int = 8,
        poll_interval_s: float = 0.05,
        fence: Callable[[], None] = lambda: None,
        confirm: Callable[[], None] = lambda: None,
        lease_epoch: int | None = None,
        threaded: bool = True,
        digests: DigestCache | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.storage = storage
        self.layout = JobLayout(job)
        self.workdir = workdir
        self.staging_root = workdir.parent / f".{workdir.name}.staging"
        self.config = config
        self.store = store
        self.history = history
        self.spark_version = spark_version
        self.restored_from = restored_from
        self.poll_interval_s = poll_interval_s
        #: raises if this driver should not start a write now (the lease's gate)
        self.fence = fence
        #: raises ConcurrentDriverError if another driver claimed the job (storage only;
        #: ``JobLease.confirm``): called after a completion marker is durable, before
        #: anything acts on it
        self.confirm = confirm
        self.failures = CheckpointFailureManager(config.tolerable_failed)
        self.listeners: list[CompletionListener] = []
        self.transaction_source: TransactionSource = lambda _batch: ()
        #: called with a checkpoint id before it is used (the lease reserves ids)
        self.id_guard: Callable[[int], None] = lambda _checkpoint_id: None
        self.lease_epoch = lease_epoch
        #: when periodic checkpoints are due (interval, min-pause): Flink's injected
        #: ``Clock``; timeouts stay on the monotonic clock
        self.clock = clock
        self._next_id = next_checkpoint_id
        self.first_id = next_checkpoint_id  # ids from here on are this coordinator's
        self._last_batch = last_checkpointed_batch
        self._last_trigger = clock()
        self._last_completion = float("-inf")
        self._lock = threading.Lock()
        self._pending: list[PendingCheckpoint] = []
        self._digests = digests if digests is not None else DigestCache()
        # threaded=False: no background thread, uploads and async phases run inline and
        # the caller drives the coordinator with tick(). Every storage mutation then
        # happens in one deterministic order: what crash-point enumeration needs.
        self.threaded = threaded
        self._files: Executor = (
            ThreadPoolExecutor(upload_threads, thread_name_prefix="ckpt-upload",
                               initializer=background_priority)
            if threaded else InlineExecutor())
        # Not threaded, an async phase runs at the *next* tick: batches run in between,
        # as they do while a real async phase uploads.
        self._phases: Executor = (
            ThreadPoolExecutor(max(config.max_concurrent, 1) + 1, thread_name_prefix="ckpt-async",
                               initializer=background_priority)
            if threaded else InlineExecutor(deferred=True))
        self._query_ended = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ckpt-coordinator", daemon=True)

    # ------------------------------------------------------------------ lifecycle
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
        """Wait until ``p`` completed or failed (ticking it along when not threaded)."""
        while not self.threaded and not p.done.is_set():
            self.tick()
        p.done.wait()

    def drain(self) -> None:
        """The query has ended: wait until every checkpoint triggered so far has
        completed or failed.

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
                             "is the end of batch %d instead", "savepoint" if p.is_savepoint
                             else "checkpoint", p.checkpoint_id, p.barrier_batch, last)
                    p.barrier_batch = last
        for p in pending:
            self.wait(p)

    def resume(self) -> None:
        """The query runs again after :meth:`drain` (a stop was refused): periodic
        checkpoints are triggered again, and their failures count again."""
        with self._lock:
            self._query_ended = False

    @property
    def fatal(self) -> BaseException | None:
        """Set when the job must fail (too many failed checkpoints, another driver)."""
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
    ) -> PendingCheckpoint:
        """Trigger a checkpoint (or, with ``savepoint_id``, a savepoint) now.

        The barrier is placed at the next batch boundary (see module doc). Returns the
        pending checkpoint; wait on ``pending.done``.
        """
        with self._lock:
            twin = savepoint_id is not None and any(
                q.savepoint_id == savepoint_id for q in self._pending)
            pending = self._new_pending(trigger, savepoint_id, request_id)
        if twin:
            self._fail(pending, f"savepoint id {savepoint_id!r} is already being taken by "
                                "another request")
            return pending
        self._log_triggered(pending)
        return pending

    def _new_pending(self, trigger: Trigger, savepoint_id: str | None = None,
                     request_id: str | None = None) -> PendingCheckpoint:
        """Create and register a pending checkpoint; the caller holds ``self._lock``."""
        self.id_guard(self._next_id)
        pending = PendingCheckpoint(
            checkpoint_id=self._next_id,
            trigger=trigger,
            trigger_ts=time.time(),
            deadline=time.monotonic() + self.config.timeout_s,
            savepoint_id=savepoint_id,
            request_id=request_id,
        )
        self._next_id += 1
        self._last_trigger = self.clock()
        pending.barrier_batch = self._barrier_for_trigger(trigger)
        self._pending.append(pending)
        return pending

    @staticmethod
    def _log_triggered(pending: PendingCheckpoint) -> None:
        log.info(
            "triggered %s %d (%s) barrier at end of batch %s",
            "savepoint" if pending.is_savepoint else "checkpoint",
            pending.checkpoint_id, pending.trigger, pending.barrier_batch,
        )

    def _barrier_for_trigger(self, trigger: Trigger) -> int:
        """The batch whose end is the barrier; -1 for the empty state before batch 0."""
        committed = latest_batch(self.workdir, "commits")
        offered = latest_batch(self.workdir, "offsets")
        if trigger in ("initial", "final", "stop"):
            # The query is not running (not yet, or no longer): its last committed batch.
            return -1 if committed is None else committed
        if offered is not None and (committed is None or offered > committed):
            return offered  # batch `offered` is running: barrier at its end
        if committed is None:
            return 0  # nothing ran yet: the first batch
        return committed

    def _periodic_due(self, now: float) -> bool:
        cfg = self.config
        if self._query_ended:
            return False  # the final checkpoint follows; a periodic one would repeat it
        if self.failures.fatal is not None:
            return False  # the job is failing; no later checkpoint can succeed
        if now - self._last_trigger < cfg.interval_s:
            return False
        if now - self._last_completion < cfg.min_pause_s:
            return False
        if len(self._pending) >= cfg.max_concurrent:
            return False
        committed = latest_batch(self.workdir, "commits")
        offered = latest_batch(self.workdir, "offsets")
        newest = max(b for b in (committed, offered, -1) if b is not None)
        # Nothing new since the last checkpoint: its state is still current.
        return self._last_batch is None or newest > self._last_batch

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
            periodic = self._new_pending("periodic") if self._periodic_due(self.clock()) \
                else None
        if periodic is not None:
            self._log_triggered(periodic)
        now = time.monotonic()
        with self._lock:
            pending = list(self._pending)
        committed: int | None = None
        listed = False  # Spark's commit log is listed only when a barrier waits on it
        for p in pending:
            if p.done.is_set():
                continue
            if now > p.deadline and p.state == "pending":
                self._fail(p, f"expired after {self.config.timeout_s:g} s before completing")
                continue
            if p.captured:
                continue
            barrier = p.barrier_batch if p.barrier_batch is not None else 0
            if barrier != -1 and not listed:
                committed, listed = latest_batch(self.workdir, "commits"), True
            if barrier == -1 or (committed is not None and committed >= barrier):
                self._sync_phase(p, time.time())

    def _sync_phase(self, p: PendingCheckpoint, barrier_ts: float) -> None:
        p.captured = True
        start = time.monotonic()
        staging = self.staging_root / f"chk-{p.checkpoint_id}-{uuid.uuid4().hex[:6]}"
        try:
            if p.barrier_batch == -1:
                snap = CapturedSnapshot(-1, (), (), [], (), staging)
            else:
                snap = capture(self.workdir, p.barrier_batch or 0, staging)
                check_captured(self.workdir, snap)  # executors' state on other hosts
        except CheckpointDeclinedError as exc:
            if isinstance(exc, WorkdirNotSharedError):
                self.failures.fatal = exc  # no later checkpoint could see the state either
            self._fail(p, str(exc))
            return
        sync_ms = int((time.monotonic() - start) * 1000)
        self._phases.submit(self._async_phase, p, snap, barrier_ts, sync_ms)

    def _async_phase(
        self, p: PendingCheckpoint, snap: CapturedSnapshot, barrier_ts: float, sync_ms: int
    ) -> None:
        start = time.monotonic()
        if p.is_savepoint:  # self-contained: one object per file, never merged
            # Under a directory of its own checkpoint id (ids are never reused, also not
            # across drivers): two drivers answering the same request never write the
            # same object, so whichever marker lands first names files nobody else wrote.
            target = UploadTarget(
                p.checkpoint_id, f"savepoints/sp-{p.savepoint_id}/{p.checkpoint_id}/", False)
        else:
            cfg = self.config
            target = UploadTarget(
                p.checkpoint_id, f"chk-{p.checkpoint_id}/", cfg.incremental,
                cfg.file_merging_max_file_size if cfg.file_merging else 0, self.lease_epoch,
            )
        try:
            if p.savepoint_id is not None and self._answered_by_existing(p):
                return
            result = upload_snapshot(
                self.storage, self.layout, snap, target,
                executor=self._files, digests=self._digests, shared=self.store.shared,
                deadline=p.deadline, on_ack=p.acked.add, cancelled=p.cancelled,
                reusable=self.store.shared_index() if target.incremental else None,
            )
            async_ms = int((time.monotonic() - start) * 1000)
            completed = time.time()
            manifest = Manifest(
                job=self.layout.job,
                checkpoint_id=p.checkpoint_id,
                kind="savepoint" if p.is_savepoint else "checkpoint",
                trigger=p.trigger,
                batch_id=snap.batch_id,
                spark_version=self.spark_version,
                query_id=self._query_id(),
                mode=self.config.mode,
                source_offsets=snap.source_offsets,
                operators=snap.operators,
                files=result.files,
                state_size=result.state_size,
                checkpointed_size=result.checkpointed_size,
                num_subtasks=len(snap.subtasks),
                num_acknowledged_subtasks=len(p.acked),
                timings=Timings(
                    trigger_ts=p.trigger_ts,
                    barrier_ts=barrier_ts,
                    completed_ts=completed,
                    start_delay_ms=max(int((barrier_ts - p.trigger_ts) * 1000), 0),
                    sync_duration_ms=sync_ms,
                    async_duration_ms=async_ms,
                    end_to_end_duration_ms=int((completed - p.trigger_ts) * 1000),
                ),
                savepoint_id=p.savepoint_id,
                extra={"request_id": p.request_id} if p.request_id else {},
                pending_transactions=self.transaction_source(snap.batch_id),
                restored_from=self.restored_from,
                lease_epoch=self.lease_epoch,
            )
            if (p.cancelled.is_set() or time.monotonic() > p.deadline
                    or not p.move("completing", allowed=("pending",))):
                raise CheckpointDeclinedError("checkpoint expired or was cancelled")
            metadata_key = (
                self.layout.savepoint_metadata(p.savepoint_id) if p.savepoint_id
                else self.layout.checkpoint_metadata(p.checkpoint_id)
            )
            interleave.point(interleave.COMPLETE_BEFORE_METADATA)
            try:
                self.fence()
                # The completion marker, written last and create-only.
                self.storage.put_bytes(metadata_key, manifest.to_json(), create_only=True)
            except (ConcurrentDriverError, LeaseExpiredError) as exc:
                self.failures.fatal = exc
                raise CheckpointDeclinedError(str(exc)) from exc
            except ObjectAlreadyExistsError as exc:
                if p.is_savepoint:
                    # Another driver's answer to this very request landed first (it was
                    # deposed mid-way): that savepoint answers it; or a request re-used
                    # an id: fail that request only.
                    if self._answered_by_existing(p, claimed=True):
                        return
                    raise CheckpointDeclinedError(_savepoint_exists(p.savepoint_id)) from exc
                self.failures.fatal = ConcurrentDriverError(
                    f"{metadata_key} was written by someone else: another driver is running "
                    f"job {self.layout.job!r}; stop one of them"
                )
                raise CheckpointDeclinedError(str(exc)) from exc
            except OutcomeUnknownError as exc:
                # The marker may have landed, now or later: this checkpoint is neither
                # failed nor completed. Only a new epoch can settle it (its claim-then-
                # adopt counts the marker if it landed before, never if after), so
                # this driver stops and a restart decides.
                self._abandon(p, exc, f"the completion marker {metadata_key} may or may "
                                      f"not have been written ({exc})")
                return
            try:
                self.confirm()  # the marker counts only if no successor claimed before it
            except ConcurrentDriverError as exc:
                self._abandon(p, exc, f"{exc}; whether its marker counts is the successor's "
                                      "decision")
                return
            except Exception as exc:
                # The marker is durable but the confirmation could not be made (the
                # listing of lease/ failed): not failed (the catalog counts the marker
                # unless a successor claimed first), not completed (a successor may have).
                # As for a marker of unknown outcome, only a new epoch settles it.
                unknown = OutcomeUnknownError(
                    f"{metadata_key} is written, but the lease could not be confirmed "
                    f"after it ({type(exc).__name__}: {exc})")
                self._abandon(p, unknown, str(unknown))
                return
        except CheckpointDeclinedError as exc:
            self._fail(p, str(exc), allowed=("pending", "completing"))
            return
        except Exception as exc:  # any storage error declines this checkpoint only
            self._fail(p, f"{type(exc).__name__}: {exc}", allowed=("pending", "completing"))
            return
        finally:
            snap.discard()
        self._complete(p, manifest)

    def _answered_by_existing(self, p: PendingCheckpoint, *, claimed: bool = False) -> bool:
        """A savepoint id that already completed is never written to again.

        If the existing savepoint answers this very request (the driver crashed between
        its ``_metadata`` and the answer, or a deposed driver's marker for the same
        request landed first), complete the request with it; otherwise decline the
        request. Returns True if ``p`` is settled. ``claimed``: ``p`` is ``completing``
        already (its own marker write met the existing one).
        """
        assert p.savepoint_id is not None
        key = self.layout.savepoint_metadata(p.savepoint_id)
        if not self.storage.exists(key):
            return False  # nothing completed under this id yet
        existing = parse_manifest(self.storage.get_bytes(key), where=key)
        if p.request_id is None or existing.extra.get("request_id") != p.request_id:
            raise CheckpointDeclinedError(_savepoint_exists(p.savepoint_id))
        log.info("savepoint %s already answers request %s", p.savepoint_id, p.request_id)
        if not claimed and not p.move("completing", allowed=("pending",)):
            return True  # failed meanwhile (timeout): settled
        p.move("completed", allowed=("completing",))
        with self._lock:
            if p in self._pending:
                self._pending.remove(p)
        self.store.shared.release(p.checkpoint_id)
        p.manifest = existing
        p.path = self.storage.uri.rstrip("/") + "/" + self.layout.savepoint_dir(
            p.savepoint_id).rstrip("/")
        p.done.set()
        return True

    def _complete(self, p: PendingCheckpoint, manifest: Manifest) -> None:
        p.move("completed", allowed=("completing",))
        with self._lock:
            if p in self._pending:
                self._pending.remove(p)
            if not p.is_savepoint:
                self._last_batch = max(manifest.batch_id, self._last_batch or -1)
            self._last_completion = self.clock()
        p.manifest = manifest
        dir_key = (
            self.layout.savepoint_dir(p.savepoint_id) if p.savepoint_id
            else self.layout.checkpoint_dir(manifest.checkpoint_id)
        )
        p.path = path = self.storage.uri.rstrip("/") + "/" + dir_key.rstrip("/")
        self.failures.on_success()
        t = manifest.timings
        log.info(
            "completed %s %d: batch=%d state_size=%d uploaded=%d files=%d subtasks=%d/%d "
            "start_delay=%dms sync=%dms async=%dms end_to_end=%dms",
            manifest.kind, manifest.checkpoint_id, manifest.batch_id, manifest.state_size,
            manifest.checkpointed_size, len(manifest.files),
            manifest.num_acknowledged_subtasks, manifest.num_subtasks, t.start_delay_ms,
            t.sync_duration_ms, t.async_duration_ms, t.end_to_end_duration_ms,
        )
        # Each step on its own: a failure of one (e.g. the history append) must not skip
        # the others, above all the listeners that commit the sinks' transactions. The
        # history step waits through a storage outage, and past the outage budget keeps
        # the event for the history's next append (JobHistory.append_when_reachable). A
        # commit that fails here stays pending: the next completion commits it, and
        # every later manifest lists it for recover-and-commit.
        interleave.point(interleave.COMPLETE_BEFORE_ADD)
        steps: list[tuple[str, Callable[[], object]]] = []
        if p.is_savepoint:
            steps.append(("release", lambda: self.store.shared.release(p.checkpoint_id)))
            steps.append(("history", lambda: self.history.append_when_reachable(
                ev.SAVEPOINT_COMPLETED, path=path, request_id=p.request_id,
                **manifest.history_entry())))
        else:
            steps.append(("store", lambda: self.store.add(manifest)))
            steps.append(("history", lambda: self.history.append_when_reachable(
                ev.CHECKPOINT_COMPLETED, path=path, **manifest.history_entry())))
        steps.extend((f"listener {i}", partial(listener, manifest))
                     for i, listener in enumerate(self.listeners))
        try:
            for name, step in steps:
                try:
                    step()
                except Exception:
                    log.exception("after completing %d: %s failed", manifest.checkpoint_id, name)
        finally:
            p.done.set()

    def _abandon(self, p: PendingCheckpoint, fatal: ConcurrentDriverError | OutcomeUnknownError,
                 reason: str) -> None:
        """Give ``p`` up after its marker write, without saying it failed: its marker may
        count for a successor. Nothing acts on it (no commit, no answer, no history
        event, reservations kept: this driver collects nothing any more); the driver
        stops (``fatal``)."""
        p.move("failed", allowed=("completing",))
        with self._lock:
            if p in self._pending:
                self._pending.remove(p)
        self.failures.fatal = fatal
        p.failure = reason
        p.cancelled.set()
        log.error("%s %d abandoned: %s", "savepoint" if p.is_savepoint else "checkpoint",
                  p.checkpoint_id, reason)
        p.done.set()

    def _fail(
        self, p: PendingCheckpoint, reason: str, *, allowed: tuple[str, ...] = ("pending",)
    ) -> None:
        if not p.move("failed", allowed=allowed):
            return  # completing or completed already: the marker write decides
        with self._lock:
            if p in self._pending:
                self._pending.remove(p)
        p.cancelled.set()
        p.failure = reason
        self.store.shared.release(p.checkpoint_id)
        if not self._stop.is_set() and not self._query_ended and not p.is_savepoint:
            # Like Flink, only checkpoints count towards tolerable-failed-checkpoints; and
            # only while the query runs: a checkpoint of an ended query fails the step
            # that waits for it (the final checkpoint is retried, a stop is refused).
            self.failures.on_failure(p.checkpoint_id, reason)
        kind = "savepoint" if p.is_savepoint else "checkpoint"
        log.warning("%s %d failed: %s", kind, p.checkpoint_id, reason)
        try:
            self.history.append_when_reachable(
                ev.SAVEPOINT_FAILED if p.is_savepoint else ev.CHECKPOINT_FAILED,
                id=p.checkpoint_id, status="FAILED", is_savepoint=p.is_savepoint,
                trigger=p.trigger, trigger_timestamp=int(p.trigger_ts * 1000),
                failure_message=reason, request_id=p.request_id,
            )
        finally:
            p.done.set()

    def _query_id(self) -> str:
        try:
            return str(json.loads((self.workdir / "metadata").read_text())["id"])
        except (OSError, ValueError, KeyError):
            return ""
