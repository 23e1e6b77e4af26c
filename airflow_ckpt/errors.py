"""The package's single error hierarchy.

Every error the package raises on purpose derives from :class:`AirflowCkptError`, so
callers can catch one type. Messages are written for the person who has to act on
them: they say what was wrong and what to do. An error no restart can fix derives from
:class:`FinalError` (Flink's ``SuppressRestartsException``): the driver records it as
``job_failed`` and nothing restarts the job. :class:`DriverExit` is the one exception
here that is no error: the driver process ends.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from enum import Enum
from typing import Any


class AirflowCkptError(Exception):
    """Root of every error raised by airflow-ckpt."""


class FinalError(AirflowCkptError):
    """The job fails for good: a restart, in-process or by a new driver, would meet the
    same error (Flink's ``SuppressRestartsException``). ``CheckpointedJob.run`` records
    it in the job's history as ``job_failed`` (the supervisor does not resubmit) and
    raises it; every error that must not restart derives from this one."""


class ConfigError(FinalError, ValueError):
    """Invalid options (checkpoint config, restart strategy, DAG params, storage URI).

    ``problems`` maps each bad key to what is wrong with it, so one error names every
    bad key at once instead of failing on the first.
    """

    def __init__(self, what: str, problems: Mapping[str, str]) -> None:
        self.what = what
        self.problems = dict(problems)
        lines = "\n".join(f"  - {key}: {msg}" for key, msg in sorted(self.problems.items()))
        super().__init__(f"invalid {what}:\n{lines}")


class JobSettingsError(ConfigError):
    """A driver's ``spark.airflow_ckpt.*`` settings are invalid (every bad key named).

    ``settings`` (a :class:`~airflow_ckpt.runtime.sparkconf.JobSettings`, the bad values
    replaced by defaults) is set when the job name and the storage are valid: the driver
    then records the error in that job's history (as final, for the supervisor's
    ``run_id``) before it exits."""

    def __init__(self, problems: Mapping[str, str], *, settings: Any = None) -> None:
        super().__init__("job settings", problems)
        self.settings = settings


# --------------------------------------------------------------------------- storage


class StorageError(AirflowCkptError):
    """A checkpoint storage operation failed."""


class InvalidStorageUriError(StorageError, ValueError):
    """The storage URI has an unknown scheme or a malformed bucket/path."""


class BucketNotFoundError(StorageError):
    """The S3 bucket does not exist (create it, or fix the URI)."""


class StorageAccessDeniedError(StorageError):
    """The credentials were refused or lack permission for the operation."""


class EndpointUnreachableError(StorageError):
    """The S3-compatible endpoint could not be reached, or its response broke off while
    it was read (after retries): transient, the next attempt may succeed."""


class OutcomeUnknownError(EndpointUnreachableError):
    """A write may or may not have been applied: its answer was lost (a reset after the
    request was sent, a body cut short) and reading the object back did not settle it
    within its own retries. Never evidence of another writer nor of failure: repeat the
    same write (every write of this package is idempotent at its key) or read later."""


class StorageOutageError(EndpointUnreachableError):
    """The storage stayed unreachable for longer than the outage budget
    (``execution.checkpointing.tolerable-storage-outage``). The message names the first
    error of the outage: its real cause."""


class OutageOutcomeUnknownError(StorageOutageError, OutcomeUnknownError):
    """The outage budget ran out while a write's outcome was still unknown: it may land
    or have landed (handled as ``OutcomeUnknownError``, never as a failed write)."""


class PreconditionFailedError(StorageError):
    """A conditional write found another version of the object than it was conditioned
    on: someone else wrote it (or deleted it) since the caller read it. The stored object
    is untouched."""


class ObjectAlreadyExistsError(PreconditionFailedError):
    """A create-only write found the object already present (with other bytes than the
    write's: a create-only write that finds its own bytes there succeeded)."""


class ObjectNotFoundError(StorageError):
    """The requested object does not exist."""


# --------------------------------------------------------------------------- metadata


class MetadataError(AirflowCkptError):
    """A ``_metadata`` manifest, history event or control request is unreadable."""


class HistoryMovedError(AirflowCkptError):
    """A conditional history append found events newer than the ones its decision read.

    Raised by ``JobHistory.append_if_head``: the caller reads again and decides again
    (a restart decision is only ever appended on top of the exact history it was
    computed from)."""


class UnsupportedSchemaVersionError(MetadataError):
    """The manifest was written by a newer (or unknown) schema version."""


# --------------------------------------------------------------------------- runtime


class CheckpointError(AirflowCkptError):
    """A checkpoint could not be taken."""


class CheckpointDeclinedError(CheckpointError):
    """One checkpoint was declined (timeout, upload failure, ...). The job goes on."""


class CheckpointFailureLimitError(CheckpointError):
    """More consecutive checkpoint failures than ``tolerable-failed-checkpoints``."""


class WorkdirNotSharedError(CheckpointDeclinedError, FinalError):
    """State store partitions have no data files in the driver's working directory
    (executors on other hosts without a shared filesystem): no later checkpoint could
    see the state either."""


class RestoreError(FinalError):
    """Nothing restorable was found, or the chosen checkpoint/savepoint is damaged."""


class RestoreRefusal(str, Enum):
    """Why ``restore=latest`` refused rather than fall back (docs/architecture.md,
    "Retention floor"): each is a documented outcome, never data loss."""

    #: none of the checkpoints this run completed restores; older ones are another run's
    RUN_UNRESTORABLE = "run-unrestorable"
    #: every checkpoint this run completed lost its marker; older ones are another run's
    RUN_CHECKPOINTS_GONE = "run-checkpoints-gone"
    #: none of the job's completed checkpoints restores; from scratch would replay
    NONE_RESTORABLE = "none-restorable"


class RestoreRefusedError(RestoreError):
    """``restore=latest`` refused to fall back further (``reason``: why)."""

    def __init__(self, message: str, reason: RestoreRefusal) -> None:
        super().__init__(message)
        self.reason = reason


class NoCheckpointError(RestoreError):
    """``restore=latest`` found no completed checkpoint (nothing to restore from)."""


class CorruptCheckpointError(RestoreError):
    """A checkpoint's files are missing or do not match their recorded size/checksum.

    ``key``: the storage key of the damaged file, when one file is to blame;
    ``keys``: every key found damaged (``key`` among them).
    """

    def __init__(self, message: str, key: str | None = None, *,
                 keys: frozenset[str] = frozenset()) -> None:
        super().__init__(message)
        self.key = key
        self.keys = keys | ({key} if key else frozenset())


class SinkReplayMismatchError(RestoreError):
    """A batch id the sink committed already was replayed reading other source data.

    After a restore of a checkpoint older than the sink's output (``restore=latest``
    falling back past a damaged checkpoint, an explicit older checkpoint or savepoint, or
    a new start over an existing output), Spark plans the batches after the restored one
    again from the sources, and a batch id may then cover other offsets than the batch
    the sink committed under that id. Dropping the replay would lose the rows the
    committed batch did not read; publishing it would repeat the rows it did. Under
    ``EXACTLY_ONCE`` the sink does neither: nothing of the replay is published and nothing
    committed is deleted. (Under ``AT_LEAST_ONCE`` the replay is published as extra
    output instead, with a ``sink_replay_published`` event: docs/sinks.md.)
    """

    def __init__(self, batch_id: int, sink: str, committed: str, replay: str,
                 restored: str | None = None) -> None:
        self.batch_id, self.sink, self.committed, self.replay = batch_id, sink, committed, replay
        self.restored = restored
        start = f"restoring {restored}" if restored else "a restore or a new start"
        super().__init__(
            f"{sink}: batch {batch_id} is committed already, from source offsets "
            f"{committed}; its replay after {start} read other source offsets {replay}. "
            f"Publishing it under batch {batch_id} would repeat or lose rows, so the sink "
            "refused it: nothing of the replay was published and nothing committed was "
            "deleted. To go on, restore the newest checkpoint or savepoint of the run that "
            "committed this batch (restore=latest once it is restorable, or "
            "restore=<path>); or run the query with the batch sizing it had then (the same "
            "maxFilesPerTrigger / maxOffsetsPerTrigger), so that its replays read what was "
            "committed; or start from scratch into a new output location (a new sink path, "
            "or a new job name with its own output). See docs/sinks.md."
        )

    def with_restored(self, restored: str | None) -> SinkReplayMismatchError:
        """The same refusal, naming the checkpoint or savepoint the run restored."""
        return SinkReplayMismatchError(self.batch_id, self.sink, self.committed,
                                       self.replay, restored)


class SinkTransactionAbortedError(RestoreError):
    """The restored checkpoint or savepoint lists a sink transaction that was aborted
    since, and never committed, or committed from other source offsets by another
    attempt: a run that did not restore this snapshot recovered the sink (aborting
    every transaction its own restore did not list) and deleted the batch's staged
    output. The restored state counts the batch as processed, so it is never replayed:
    restoring this snapshot would lose the batch's output for good. (``other``: the
    other offsets, committed if ``decided``, else staged by a newer attempt.)"""

    def __init__(self, batch_id: int, sink: str, other: str | None = None, *,
                 decided: bool = True) -> None:
        self.batch_id, self.sink = batch_id, sink
        fate = ("nobody committed" if other is None else
                f"then {'committed' if decided else 'staged'} batch {batch_id} from other "
                f"source offsets ({other})")
        super().__init__(
            f"{sink}: the restored checkpoint or savepoint lists the transaction of batch "
            f"{batch_id}, which a later run aborted (its staged output is deleted) and "
            f"{fate}; restoring it would lose that batch's output. Restore a "
            "newer checkpoint or savepoint (restore=latest), or one that does not list "
            "this batch. See docs/sinks.md.")


class SourceDataLostError(RestoreError):
    """Records a restore must re-read are gone from the source (Kafka retention or a
    delete-records call removed them since the restored checkpoint was taken), and the
    source's ``failOnDataLoss`` is true (Spark's default). The message names each topic,
    partition and missing offset range."""

    def __init__(self, restored: str | None, ranges: list[str]) -> None:
        self.restored, self.ranges = restored, ranges
        super().__init__(
            f"the restored checkpoint {restored} needs source records that no longer "
            f"exist: {'; '.join(ranges)}. The topic's retention (retention.ms / "
            "retention.bytes) or a delete-records call removed them after the checkpoint "
            "was taken, so restoring it cannot reproduce what it covered. Restore a newer "
            "checkpoint or savepoint, or set the source's failOnDataLoss=false to go on "
            "from the earliest offsets the topic still holds (the lost ranges are then "
            "recorded in the job's history as source_data_lost). See docs/sinks.md, "
            "\"Kafka\".")


class IncompatibleStateError(RestoreError):
    """The restored state does not fit the query (Spark's state schema check failed)."""


class SourceSettingsChangedError(RestoreError):
    """The query's sources read with other settings than those the restored checkpoint
    was taken with (a source option that decides what a batch reads, e.g. the rate
    source's ``rowsPerSecond`` or Kafka's ``subscribe``): refused before the query
    starts; ``restore.allow-source-changes`` accepts it. ``changes`` lists each
    difference as ``(source, option, old, new)`` (None: not set)."""

    def __init__(self, message: str,
                 changes: tuple[tuple[str, str, str | None, str | None], ...] = ()) -> None:
        super().__init__(message)
        self.changes = changes


class ConcurrentDriverError(FinalError):
    """Another driver is writing checkpoints for the same job."""


class JobHeldError(ConcurrentDriverError):
    """Another supervision (DAG run) holds the job: nothing was submitted. The message
    names the DAG run, task and attempt that hold it."""


class LeaseExpiredError(AirflowCkptError):
    """This driver could not renew its lease in time and stopped writing (it fenced
    itself so that another driver can take over safely). Not final: a resubmitted
    driver takes the lease again and restores from the latest checkpoint."""


class SavepointError(AirflowCkptError):
    """A savepoint request failed, timed out, or its job is not running."""


class ControlAnswerLostError(SavepointError):
    """The job answered a control request and deleted it with its answer before the
    requester read the answer: the requester cannot tell what the job answered."""


class SparkCheckpointError(AirflowCkptError):
    """A plain Spark checkpoint directory cannot be imported or exported: not a Spark
    checkpoint, a query that seems to be running, or a target that is not empty."""


class NotASparkCheckpointError(SparkCheckpointError):
    """The directory has no Spark query ``metadata`` or no committed batch."""


class SparkQueryRunningError(SparkCheckpointError):
    """The Spark checkpoint has a batch planned and not committed: its query seems to be
    running (or it was killed inside that batch)."""


class RestartsExhaustedError(AirflowCkptError):
    """The restart strategy declined to restart the job again."""


class SparkSetupError(FinalError):
    """The driver's Spark cannot do what was asked (missing feature, broken install)."""


# --------------------------------------------------------------------------- process


class DriverExit(SystemExit):
    """The driver process ends now (SIGTERM, or its JVM is gone): not a job outcome.

    A ``SystemExit`` with code :attr:`CODE`: ``except Exception`` does not catch it
    (nothing counts it as a query failure), and uncaught it ends the interpreter quietly
    with that code.
    """

    #: the exit code of a driver ended by SIGTERM or by its JVM's death (128 + SIGTERM)
    CODE = 128 + signal.SIGTERM

    def __init__(self, reason: str) -> None:
        super().__init__(self.CODE)
        self.reason = reason

    def __str__(self) -> str:
        return f"the driver ends: {self.reason}"


class VanishedError(AirflowCkptError):
    """A listed history object was gone when read: a compaction took it meanwhile. The
    history's reader and writer list again; it never leaves them."""
