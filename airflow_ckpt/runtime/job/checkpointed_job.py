"""CheckpointedJob: the facade a PySpark job wraps its streaming query in.

    job = CheckpointedJob(spark)                 # settings from spark.airflow_ckpt.* confs
    sink = JsonLinesSink(job.storage, "out/sums")
    job.run(lambda: df.writeStream.foreachBatch(job.exactly_once(sink)))

``run`` restores (latest retained checkpoint by default), starts the query on a
working directory the runtime owns, takes checkpoints while it runs, answers
savepoint requests, restarts a failed query in-process under the restart strategy,
takes a final checkpoint when the query finishes, and returns or raises.
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_ckpt.driver_output import root_cause
from airflow_ckpt.errors import (
    AirflowCkptError,
    ConcurrentDriverError,
    FinalError,
    IncompatibleStateError,
    JobSettingsError,
    LeaseExpiredError,
    OutcomeUnknownError,
    RestartsExhaustedError,
    SourceDataLostError,
    StorageError,
    StorageOutageError,
)
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.checkpoint.coordinator import CheckpointCoordinator
from airflow_ckpt.runtime.checkpoint.digests import DigestCache
from airflow_ckpt.runtime.checkpoint.lease_view import LeaseView
from airflow_ckpt.runtime.checkpoint.metadata import Manifest, SourceSettings
from airflow_ckpt.runtime.checkpoint.pending import PendingCheckpoint
from airflow_ckpt.runtime.checkpoint.savepoint_history import SavepointHistory, mark_restored
from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
from airflow_ckpt.runtime.control.channel import (
    ControlChannel,
    Doorbell,
)
from airflow_ckpt.runtime.driver.unit import DriverUnit
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import DEFAULT_COMPACTION, JobHistory
from airflow_ckpt.runtime.history.restart_log import RestartLog
from airflow_ckpt.runtime.job.ending import JobResult, QueryEnding
from airflow_ckpt.runtime.job.requests import SavepointRequests
from airflow_ckpt.runtime.job.sinks import JobSinks
from airflow_ckpt.runtime.job.spark_features import require_offline_repartition
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.lease.record import LeaseRecord
from airflow_ckpt.runtime.restore.choose import RestoreResult, restore
from airflow_ckpt.runtime.sinks import TwoPhaseCommitSink
from airflow_ckpt.runtime.sources import kafka
from airflow_ckpt.runtime.sources.settings import check_sources, read_sources
from airflow_ckpt.runtime.sparkconf import RESCALE_PARTITIONS, JobSettings
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.fenced import FencedStorage
from airflow_ckpt.runtime.storage.outage import OutageBudget, OutageRidingStorage
from airflow_ckpt.runtime.workdir import Workdir, is_remote, location
from airflow_ckpt.runtime.workdir.hadoop import HadoopWorkdir

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

log = logging.getLogger("airflow_ckpt.job")

#: how often the driver lists its control requests whatever it heard (one LIST request
#: each; 1,440 a day): how late a request is found at worst, when its doorbell was not
#: heard. A rung doorbell is heard in the lease heartbeat's listing of ``lease/`` (every
#: ``heartbeat_s``, 5 s) at no request of the driver's own; see runtime/control/channel.py
CONTROL_POLL_S = 60.0
#: how long the driver blocks on the query between looks at failures, its lease,
#: cancellation and the doorbell (none of which makes a storage request)
CONTROL_WAKE_S = 1.0


# Spark error classes that mean "the checkpoint's state does not fit this query".
_INCOMPATIBLE = re.compile(
    r"STATE_STORE_[A-Z_]*(?:SCHEMA|INCOMPATIBLE|MISMATCH)[A-Z_]*|STATE_SCHEMA|"
    r"NOT_MATCH_IN_STATE_METADATA|StateSchemaNotCompatible|STATE_STORE_KEY_SCHEMA|"
    r"STATE_STORE_VALUE_SCHEMA|STREAMING_STATEFUL_OPERATOR"
)


def _open(settings: JobSettings) -> CheckpointStorage:
    assert settings.storage_uri is not None  # JobSettings.from_conf refuses none
    return open_storage(settings.storage_uri, endpoint_url=settings.endpoint_url,
                        region_name=settings.region_name)


class CheckpointedJob:
    """Runs one streaming query under Flink-style checkpointing.

    Every argument left as None is read from the Spark conf key in
    :mod:`airflow_ckpt.runtime.sparkconf` (:class:`~airflow_ckpt.runtime.sparkconf.JobSettings`);
    settings are validated there, before any query starts (a bad value raises
    ``JobSettingsError`` naming every bad key, recorded in the job's history as final
    when the job name and storage are valid).
    """

    def __init__(
        self,
        spark: SparkSession,
        *,
        job: str | None = None,
        storage: str | CheckpointStorage | None = None,
        checkpoint_config: Mapping[str, Any] | CheckpointConfig | None = None,
        restart_strategy: Mapping[str, Any] | None = None,
        restore: str | None = None,
        workdir: str | Path | None = None,
        run_id: str | None = None,
        state_partitions: int | None = None,
        allow_source_changes: bool | None = None,
        threaded: bool = True,
    ) -> None:
        conf = spark.conf
        given_uri = storage.uri if isinstance(storage, CheckpointStorage) else storage
        try:
            settings = JobSettings.from_conf(
                lambda key: conf.get(key, None), job=job, storage_uri=given_uri,
                checkpoint_config=checkpoint_config, restart_strategy=restart_strategy,
                restore=restore, workdir=str(workdir) if workdir else None, run_id=run_id,
                state_partitions=state_partitions, allow_source_changes=allow_source_changes)
        except JobSettingsError as error:
            self._record_invalid(error, storage)
            raise
        #: what the operator (or the job itself) set: validated, frozen
        self.settings = settings
        self.spark = spark
        self.job = settings.job
        self.run_id = settings.run_id or f"local-{uuid.uuid4().hex[:12]}"
        self.attempt = settings.attempt
        self.config = settings.checkpoint_config
        # Flink's default strategy when checkpointing is on
        self.restart_params = dict(settings.restart_strategy) or {"type": "exponential-delay"}
        self.restore_target = settings.restore
        self.state_partitions = settings.state_partitions
        #: the restored checkpoint's path and its sources' settings (None: nothing to
        #: compare the query's with)
        self._restored_sources: tuple[str | None, tuple[SourceSettings, ...] | None] = (
            None, None)
        raw_storage = storage if isinstance(storage, CheckpointStorage) else _open(settings)
        #: how long storage requests wait through an outage (runtime/storage/outage.py)
        self.outage = OutageBudget(self.config.tolerable_outage_s)
        #: hears the requesters' doorbells in the listings of ``lease/`` the lease makes
        self.doorbell = Doorbell(self.job)
        # The lease's writes do not wait through outages: its heartbeat fails, and the
        # lease lapses, on time (see _retake_lease); its listings wait like every read.
        self.lease = JobLease(
            self.doorbell.listen(OutageRidingStorage(raw_storage, self.outage, writes=False)),
            self.job, owner=self.run_id)
        #: outages begun before the lease's last successful renewal (see _lapsed_in_outage)
        self._outages_at_renewal = 0
        self.lease.on_renewed = self._note_renewal
        #: every write that changes checkpoints, shared files, sink output or control
        #: answers goes through this view: gated by the lease (self-fencing), and
        #: waiting through storage outages within the budget (each retry gated again)
        self.storage: CheckpointStorage = self._driver_view(raw_storage)
        # History events are create-only and unique: a deposed driver may still record
        # why it stopped.
        # Without threads (``threaded=False``) the history compacts inside the append.
        self.history = JobHistory(
            OutageRidingStorage(raw_storage, self.outage), self.job,
            compaction=replace(DEFAULT_COMPACTION, background=threaded))
        #: digests of the working directory's files, shared by restore and every
        #: coordinator of this driver (restored files are never hashed again)
        self._digests = DigestCache()
        self.control = ControlChannel(self.storage, self.job, doorbell=self.doorbell)
        #: triggers the requested savepoints and answers the requests
        self.savepoint_requests = SavepointRequests(self.control)
        local = Path(tempfile.gettempdir()) / "airflow_ckpt" / self.job
        base = settings.workdir
        #: Spark's checkpointLocation: local, or on HDFS (a remote one is staged locally)
        self.workdir: Workdir = (
            HadoopWorkdir.of(spark, base.rstrip("/") + "/work", local / "hdfs")
            if base and is_remote(base) else (Path(base) if base else local) / "work")
        self.restart_log = RestartLog(self.history, self.restart_params, self.run_id)
        #: the id of this run's initial checkpoint (taken when it did not resume the
        #: job's latest): an in-process restart's fallback never goes below it
        self._run_floor: int | None = None
        #: True while a run that found nothing to restore (a new job, or every marker
        #: gone) has not completed a checkpoint: its first one becomes the floor
        self._floor_at_first = False
        #: the sinks, their recovery and their commits (the two-phase commit's driver side)
        self.sinks = JobSinks(lease=self.lease, history=self.history, run_id=self.run_id,
                              workdir=self.workdir, exactly_once=self.config.exactly_once,
                              driver_view=self._driver_view)
        #: disposes of the savepoints the job took itself beyond the savepoint history's
        #: count and age (savepoint_history.py; what this run restored from is kept)
        self.savepoint_history = SavepointHistory(
            self.storage, self.job, max_count=self.config.savepoint_history_max_count,
            max_age_s=self.config.savepoint_history_max_age_s)
        self._listeners: list[Callable[[Manifest], None]] = [
            self._note_run_floor, self.sinks.commit_transactions,
            self.savepoint_history.on_completed]
        #: how an attempt's query ends (drained, final checkpoint, stop, cancel)
        self.ending = QueryEnding(requests=self.savepoint_requests, history=self.history,
                                  run_id=self.run_id, workdir=self.workdir,
                                  retention=self.config.retention)
        self._cancel = threading.Event()
        #: the driver's Python process and JVM as one unit (installed by ``run``)
        self.unit: DriverUnit | None = None
        #: False: the coordinator runs no threads and is ticked by the run loop, and the
        #: history compacts inline (one deterministic order of storage mutations, for
        #: crash-point enumeration)
        self.threaded = threaded
        #: the driver's monotonic clock: when periodic checkpoints and control polls are
        #: due (a test that needs one order of events injects a clock that always says
        #: "due"; the simulation its virtual clock)
        self.clock: Callable[[], float] = time.monotonic
        #: how the driver waits out a restart delay (the simulation's virtual sleep)
        self.sleep: Callable[[float], None] = time.sleep
        self.coordinator: CheckpointCoordinator | None = None  # of the running attempt
        #: the restore whose source positions the next query start checks against the
        #: sources' retention (once per restore)
        self._unchecked_restore: RestoreResult | None = None

    def on_checkpoint(self, listener: Callable[[Manifest], None]) -> None:
        """Call ``listener`` with the manifest of every checkpoint and savepoint this job
        completes (its ``_metadata`` is durable then), e.g. to export metrics."""
        self._listeners.append(listener)

    # ------------------------------------------------------------------ sinks
    def exactly_once(self, sink: TwoPhaseCommitSink) -> Callable[[DataFrame, int], None]:
        """A ``foreachBatch`` function writing through ``sink`` as a two-phase commit.

        In EXACTLY_ONCE mode a batch is pre-committed here and committed when a
        checkpoint covering it completes; in AT_LEAST_ONCE mode it is committed at once.

        Call it before :meth:`run` or inside ``build``: either way the sink is
        recovered (the restored checkpoint's transactions committed, every other
        pending one aborted) before the query's first batch runs.

        A batch the sink committed already (the restore was older than the sink's
        output) is skipped if it read the same source offsets. Otherwise, in
        EXACTLY_ONCE mode it is refused: the run then fails for good with
        ``SinkReplayMismatchError``; in AT_LEAST_ONCE mode it is published as extra
        output and reported (``sink_replay_published``; docs/sinks.md).
        """
        return self.sinks.exactly_once(sink)

    @staticmethod
    def _record_invalid(error: JobSettingsError, storage: object) -> None:
        """Record invalid settings as the job's final failure (the supervisor then does
        not resubmit), when the job name and storage are valid; best effort."""
        settings = error.settings
        if not isinstance(settings, JobSettings):
            return
        try:
            target = storage if isinstance(storage, CheckpointStorage) else _open(settings)
            JobHistory(target, settings.job).append(
                ev.JOB_FAILED, run_id=settings.run_id, cause=str(error), error="ConfigError")
        except Exception:  # the error itself is what the caller needs
            log.warning("could not record the invalid settings of job %s", settings.job,
                        exc_info=True)

    def _driver_view(self, storage: CheckpointStorage) -> CheckpointStorage:
        """``storage`` as this driver writes to it: gated by the lease, and waiting
        through outages within the budget (outside the gate: each retry is gated)."""
        return OutageRidingStorage(FencedStorage(storage, self.lease.gate), self.outage)

    # ------------------------------------------------------------------ running
    def run(self, build: Callable[[], DataStreamWriter]) -> JobResult:
        """Run the query built by ``build`` until it finishes, is stopped, or fails for good.

        ``build`` returns a fresh ``DataStreamWriter`` (it is called again after an
        in-process restart); the runtime sets its ``checkpointLocation``. Returns a
        :class:`JobResult`; raises ``RestartsExhaustedError`` (chained to the last
        failure) when the restart strategy declines another restart, and
        :class:`~airflow_ckpt.errors.DriverExit` (exit code 143, no history
        event: the supervisor counts the driver's death) on SIGTERM or when the JVM is
        gone (:mod:`airflow_ckpt.runtime.driver.unit`).

        A storage outage shorter than ``tolerable-storage-outage`` fails nothing: every
        request waits for the storage, and a lease that lapsed meanwhile is taken again
        (:mod:`airflow_ckpt.runtime.storage.outage`). A longer one fails the attempt once, with
        the outage's first error as the cause; ``StorageOutageError`` is raised when even
        recording that failure outlasts a second budget (the supervisor counts it).
        """
        self.unit = DriverUnit.install(self.spark, self.job)
        try:
            # A driver started during an outage waits for the storage within the budget
            # (instead of exiting at its first request and crash-looping).
            self.outage.call("acquire the lease", lambda: self.lease.acquire(adopt=self._adopt))
            try:
                return self._run_supervised(build)
            finally:
                self.lease.release()
        except FinalError as exc:
            # A restart cannot fix these (nor the executors' state on other hosts: every
            # later checkpoint would miss it too). The supervisor reads this event and
            # does not resubmit.
            self.history.append(ev.JOB_FAILED, run_id=self.run_id, cause=str(exc)[:2000],
                                error=type(exc).__name__)
            raise
        finally:
            self.unit.close()

    def cancel(self) -> None:
        """Cancel the job (Flink's cancel; any thread): the running query stops within a
        control poll, ``run`` records ``job_stopped`` (``cancelled``) and returns, and
        ``DELETE_ON_CANCELLATION`` discards the retained checkpoints. SIGTERM is no
        cancel: it ends the driver process (see :meth:`run`)."""
        self._cancel.set()

    def _run_supervised(self, build: Callable[[], DataStreamWriter]) -> JobResult:
        started = self.history.append(
            ev.JOB_STARTED, run_id=self.run_id, attempt=self.attempt,
            spark_version=self.spark.version, restore=self.restore_target,
            checkpoint_config=self.config.to_dict(), restart_strategy=self.restart_params,
        )
        # how far the storage's clock is from ours: requests' ages are judged on the
        # storage's clock, never by comparing the requester's clock with ours
        self.savepoint_requests.storage_offset_s = self.history.stored_ts(started) - started.ts
        target = self.restore_target
        while True:
            restored = restore(self.storage, self.job, target, self.workdir, self.history,
                               self._digests, by={"run_id": self.run_id, "attempt": self.attempt},
                               floor=self._run_floor if target == "latest" else None)
            self._keep_restored(restored)
            rescaled = target == self.restore_target and self._rescale(restored)
            self._unchecked_restore = restored if restored.manifest is not None else None
            coordinator = self._start_coordinator(restored, initial=rescaled)
            try:
                result = self._run_once(build, coordinator)
            except FinalError:
                raise
            except LeaseExpiredError as exc:
                if not self._lapsed_in_outage():
                    raise  # not in an outage: only a new driver may continue
                failure: BaseException | None = None if not self.outage.spent else exc
            except OutcomeUnknownError:
                if coordinator.fatal is None:
                    raise  # a storage fault in the query itself: no marker involved
                raise coordinator.fatal from None  # only a new epoch settles the marker
            except Exception as exc:  # the query failed (StreamingQueryException, ...)
                if (decided := self._decided_to_stop(coordinator)) is not None:
                    raise decided from exc
                if self.unit is not None and (lost := self.unit.lost()) is not None:
                    # No query failure: the driver died with its JVM. The supervisor
                    # counts that once; a restart here would have nothing to run on.
                    raise self.unit.end(lost) from exc
                if self.sinks.refused is not None:
                    raise self.sinks.refused from exc  # final: replaying cannot change it
                if restored.path and _INCOMPATIBLE.search(str(exc)):
                    # Restarting cannot help: the restored state does not fit this query.
                    raise IncompatibleStateError(
                        f"the state restored from {restored.path} does not fit this query "
                        f"(was it written by a different query?): {root_cause(exc)}"
                    ) from exc
                failure = exc
            else:
                return result
            finally:
                coordinator.shutdown()
            lapsed = self._lapsed_in_outage()
            if not lapsed and not self.outage.spent:  # a spent outage is the failure
                # A driver deposed meanwhile (its host suspended past a takeover, its
                # marker landing uncounted) stops here, before it records a restart or
                # restores anything: what counts is its successor's decision.
                self.outage.call("confirm the lease", self.lease.confirm)
            if failure is not None and (not lapsed or self.outage.spent):
                self._record_failure(failure)  # counted once; returns to restart
            if lapsed:
                # The storage was unreachable long enough for the lease to lapse. Within
                # the budget that is no failure of the job: take the lease again (a new
                # epoch, adopting what completed) and resume from the latest checkpoint.
                self._retake_lease()
            target = "latest"

    def _decided_to_stop(self, coordinator: CheckpointCoordinator) -> AirflowCkptError | None:
        """What stops this driver though its query failed for another reason first (the
        order :meth:`_run_once` judges them in): the coordinator's fatal decision that
        no restart in this process can settle (a marker of unknown outcome: only a new
        epoch settles it; another driver), or the lease taken by another driver. Job
        seed 423723 (session 18): a deposed driver whose marker was abandoned met a
        spent outage in its query, skipped the lease's confirmation (the outage was the
        failure) and restarted in process, restoring as if it still held the job."""
        fatal = coordinator.fatal
        if isinstance(fatal, (FinalError, OutcomeUnknownError)):
            return fatal
        if isinstance(self.lease.failure, ConcurrentDriverError):
            return self.lease.failure
        return None

    def _note_renewal(self) -> None:
        self._outages_at_renewal = self.outage.outages

    def _lapsed_in_outage(self) -> bool:
        """Whether the lease lapsed because the storage was unreachable: an outage began
        after its last successful renewal (an order of events, counted, not timed; the
        lapse may come after the outage ended and after an in-process restart)."""
        return isinstance(self.lease.failure, LeaseExpiredError) and (
            self.outage.in_outage or self.outage.outages != self._outages_at_renewal)

    def _retake_lease(self) -> None:
        """Take the lease again after it lapsed in a storage outage.

        The old epoch stopped writing when it lapsed (its gate), so a new claim is a
        takeover like any other: create-only, then adopt what completed (a successor
        may have claimed meanwhile: then that driver runs the job and this one stops
        with the lapse). Waiting for the storage counts against the outage budget."""
        lapse = self.lease.failure
        log.warning("the lease lapsed during a storage outage (%s); taking it again and "
                    "resuming from the latest checkpoint", lapse)
        self.lease.release()
        try:
            self.outage.call("take the lease again",
                             lambda: self.lease.acquire(adopt=self._adopt))
        except ConcurrentDriverError as exc:
            raise (lapse or exc) from exc

    def _record_failure(self, failure: BaseException) -> None:
        """Count a failed attempt once with the restart strategy; return to restart
        (after the strategy's delay) or raise ``RestartsExhaustedError``.

        An outage that outlasted the budget is the failure's cause (its first error),
        whatever error the query met last. Recording it gets a budget of its own: the
        storage may only now be coming back; if it does not, the outage is raised."""
        spent = self.outage.take_spent()
        cause = spent or root_cause(failure)
        try:
            decision = self.restart_log.record_failure("query", cause, attempt=self.attempt)
            if not decision.restart:
                self.history.append(ev.JOB_FAILED, run_id=self.run_id, cause=cause)
        except StorageError as exc:
            if spent is None:
                raise
            raise StorageOutageError(f"{spent}; the failure could not be recorded either "
                                     f"({exc})") from failure
        if not decision.restart:
            raise RestartsExhaustedError(
                f"job {self.job}: the restart strategy declined to restart after: {cause}"
            ) from failure
        log.warning("restarting the query in %.3f s after: %s", decision.delay_s, cause)
        self.sleep(decision.delay_s)

    def _adopt(self, previous: LeaseRecord | None) -> tuple[tuple[int, ...], int]:
        """What this driver takes over from ``previous`` holder: the completed
        checkpoints (judged by ``previous``'s record), and its first id (past every id
        ever used, also by a job whose checkpoints were discarded)."""
        return CheckpointCatalog(self.lease.storage, self.job).adopt(previous)

    def _keep_restored(self, restored: RestoreResult) -> None:
        """A savepoint this run restored from is never disposed of by a savepoint
        history: marked, durable before the query starts (another job's too: its
        history reads the mark)."""
        if restored.manifest is not None and restored.manifest.is_savepoint:
            mark_restored(self.storage, restored.manifest)

    def _rescale(self, restored: RestoreResult) -> bool:
        """Repartition the restored state to ``state_partitions`` (Flink's rescaling).

        Uses Spark's offline state repartitioning (4.2+, RocksDB state only), which
        appends a repartition batch to the working directory. Returns True if it ran.
        """
        wanted = self.state_partitions
        if wanted is None:
            return False
        if restored.manifest is None:
            log.warning("%s=%d does not apply: there is no checkpoint or savepoint to "
                        "restore (the query starts with its own number of state "
                        "partitions); remove it, or a later restore will rescale",
                        RESCALE_PARTITIONS, wanted)
            return False
        current = {op.num_partitions for op in restored.manifest.operators}
        if not current or current == {wanted}:
            log.info("state already has %s partitions; no rescale needed", wanted)
            return False
        self.spark.streams.active  # noqa: B018 - starts Spark's StateStoreCoordinator
        manager = require_offline_repartition(self.spark)  # SparkSetupError: final
        try:
            manager.repartition(location(self.workdir), wanted)
        except Exception as exc:
            raise IncompatibleStateError(
                f"cannot rescale the state restored from {restored.path} from "
                f"{sorted(current)} to {wanted} partitions: {root_cause(exc)}"
            ) from exc
        log.info("rescaled state from %s to %d partitions", sorted(current), wanted)
        return True

    def _start_coordinator(
        self, restored: RestoreResult, *, initial: bool = False
    ) -> CheckpointCoordinator:
        record = self.lease.record
        store = CompletedCheckpointStore(self.storage, self.job, self.config.num_retained,
                                         epoch=record.epoch if record else None,
                                         confirm=self.lease.confirm)
        own = restored.manifest if restored.manifest and restored.manifest.job == self.job \
            and not restored.manifest.is_savepoint else None
        self.ending.restored_id = own.checkpoint_id if own else None
        self._restored_sources = (restored.path,
                                  restored.manifest.sources if restored.manifest else None)
        # Past every checkpoint directory, the lease's first id and what this driver's
        # earlier attempts took (their savepoints have no checkpoint directory).
        next_id = max(store.recover(pinned=own,
                                    distrust=restored.damaged_keys),
                      record.first_id or 1 if record else 1,
                      self.coordinator.next_checkpoint_id if self.coordinator else 1)
        self.sinks.recover(restored)
        coordinator = CheckpointCoordinator(
            storage=self.storage, job=self.job, workdir=self.workdir, config=self.config,
            store=store, history=self.history, next_checkpoint_id=next_id,
            spark_version=self.spark.version, last_checkpointed_batch=restored.batch_id,
            restored_from=restored.path,
            lease=LeaseView(record.epoch if record else None, self.lease.confirm,
                            self.lease.reserve_ids),
            transactions=self.sinks.pending_transactions, listeners=self._listeners,
            threaded=self.threaded, digests=self._digests, trigger_clock=self.clock,
            sources=self._restored_sources[1],
        )
        coordinator.start()
        self.coordinator = coordinator
        if initial or not restored.from_latest:
            # Record the starting point, so a restart with restore=latest resumes this
            # run and never an older run's checkpoint (nor falls back past it).
            self._run_floor = self._await(coordinator.trigger("initial"),
                                          coordinator).checkpoint_id
        elif restored.manifest is None and self._run_floor is None:
            self._floor_at_first = True  # a from-scratch run: no initial checkpoint
        return coordinator

    def _note_run_floor(self, manifest: Manifest) -> None:
        """The first checkpoint a run that found nothing to restore completes is its
        floor: were its marker deleted, a restart refuses to start from scratch again
        over the output it published (``restore``'s ``floor``)."""
        if self._floor_at_first and not manifest.is_savepoint:
            self._run_floor = manifest.checkpoint_id
            self._floor_at_first = False

    def _await(self, pending: PendingCheckpoint, coordinator: CheckpointCoordinator) -> Manifest:
        coordinator.wait(pending)
        if pending.manifest is None:
            raise coordinator.fatal or AirflowCkptError(
                f"checkpoint {pending.checkpoint_id} failed: {pending.failure}"
            )
        return pending.manifest

    def _run_once(
        self, build: Callable[[], DataStreamWriter], coordinator: CheckpointCoordinator
    ) -> JobResult:
        query = self._start_query(build, coordinator)
        requests: dict[str, PendingCheckpoint] = {}
        looked = False  # a restarted query looks at once: its requests died with the last
        try:
            while query.isActive:
                if coordinator.fatal is not None:
                    raise coordinator.fatal
                if self.lease.failure is not None:
                    raise self.lease.failure
                if self._cancel.is_set():
                    return self.ending.cancelled(query, coordinator)
                stop = None
                now = self.clock()
                if not looked or self.control.due(now, CONTROL_POLL_S):
                    looked, stop = True, self.savepoint_requests.poll(coordinator, requests, now)
                if not coordinator.threaded:
                    coordinator.tick()
                self.savepoint_requests.answer_finished(requests)
                if stop is not None:
                    result = self.ending.stop_with_savepoint(query, coordinator, stop, requests)
                    if result is not None:
                        return result
                    query = self._start_query(build, coordinator)  # the stop was refused: run on
                    continue
                # Block in the JVM until the next look: two Py4J round trips a second
                # instead of twenty (each costs driver CPU on cores the batches use). A
                # failure, a lost lease, a cancel or a doorbell is seen within a second.
                wake = min(now + CONTROL_WAKE_S, self.control.next_due(CONTROL_POLL_S))
                wait = max(wake - self.clock(), 0.05)
                if query.awaitTermination(wait):  # type: ignore[arg-type]  # float s is fine
                    break
            error = query.exception()
            if error is not None:
                raise error
        except BaseException:
            self.ending.stop_quietly(query)
            raise
        self.ending.drain(coordinator, requests)
        final = self.ending.final_checkpoint(coordinator)
        self.history.append(ev.JOB_FINISHED, run_id=self.run_id, checkpoint_id=final.checkpoint_id,
                            batch_id=final.batch_id)
        return JobResult("finished", final)

    def _start_query(self, build: Callable[[], DataStreamWriter],
                     coordinator: CheckpointCoordinator) -> StreamingQuery:
        """Build the query and start it, after comparing its sources' settings with the
        restored checkpoint's (``SourceSettingsChangedError``, final, before it starts);
        the checkpoints taken from here on record them."""
        self.sinks.building = True
        try:
            writer = build().option("checkpointLocation", location(self.workdir))
        finally:
            self.sinks.building = False
        sources = read_sources(writer)
        restored_from, restored_sources = self._restored_sources
        check_sources(restored_sources, sources, restored_from=restored_from,
                      allow_changes=self.settings.allow_source_changes)
        restored, self._unchecked_restore = self._unchecked_restore, None
        if restored is not None:
            self._check_retention(writer, restored)
        coordinator.record_sources(sources)
        return writer.start()

    def _check_retention(self, writer: DataStreamWriter, restored: RestoreResult) -> None:
        """Before the query re-reads the restored checkpoint's source positions: ask the
        Kafka brokers whether those records still exist (runtime/sources/kafka.py).
        Gone with ``failOnDataLoss`` true: ``SourceDataLostError`` (final); with false:
        a ``source_data_lost`` event naming the ranges, then the query starts."""
        assert restored.manifest is not None
        if not kafka.kafka_positions(restored.manifest.source_offsets):
            return
        lost = kafka.lost_records(self.spark._jvm, kafka.kafka_sources(writer),
                                  restored.manifest.source_offsets)
        refused = [r.describe() for source, gone in lost if source.fail_on_data_loss
                   for r in gone]
        if refused:
            raise SourceDataLostError(restored.path, refused)
        for _source, gone in lost:
            log.warning("restoring %s: source records are gone (failOnDataLoss=false, the "
                        "query goes on from the earliest offsets): %s", restored.path,
                        "; ".join(r.describe() for r in gone))
            self.history.append(ev.SOURCE_DATA_LOST, run_id=self.run_id,
                                restored=restored.path, ranges=[r.to_dict() for r in gone])
