"""Why a checkpoint failed, and what the job makes of it (Flink's
``CheckpointFailureReason`` and ``CheckpointFailureManager``).

Each :class:`CheckpointFailureReason` says whether it counts toward
``tolerable-failed-checkpoints`` and whether it is fatal (the driver stops: no later
checkpoint can succeed, or only a new lease epoch can settle this one). The
:class:`CheckpointFailureManager` switches on the reason; it is the one place that
decides the job's fatal error.
"""

from __future__ import annotations

import enum

from airflow_ckpt.errors import AirflowCkptError, CheckpointFailureLimitError


class CheckpointFailureReason(enum.Enum):
    """Why a pending checkpoint failed or was abandoned."""

    #: another request is taking a savepoint under the same id
    SAVEPOINT_ID_IN_USE = ("savepoint id in use", False, False)
    #: the savepoint id names a completed savepoint of another request
    SAVEPOINT_EXISTS = ("savepoint exists", False, False)
    #: a higher checkpoint id wrote its marker first (it subsumes this one)
    SUBSUMED = ("subsumed", False, False)
    #: the timeout passed (or the checkpoint was cancelled) before its marker write
    EXPIRED = ("expired", True, False)
    #: the snapshot of the working directory could not be taken
    DECLINED = ("declined", True, False)
    #: uploading the snapshot or writing its marker failed (a storage error)
    ASYNC_EXCEPTION = ("async exception", True, False)
    #: the executors' state is not on the driver's disk: no checkpoint can see it
    WORKDIR_NOT_SHARED = ("workdir not shared", False, True)
    #: the lease's gate refused the marker write: another driver, or a lapsed lease
    LEASE_LOST = ("lease lost", False, True)
    #: the marker existed already: another driver completed this checkpoint id
    CONCURRENT_DRIVER = ("concurrent driver", False, True)
    #: abandoned: the marker may or may not have been written
    MARKER_OUTCOME_UNKNOWN = ("marker outcome unknown", False, True)
    #: abandoned: the marker is written, but a successor may have claimed the job first
    MARKER_NOT_CONFIRMED = ("marker not confirmed", False, True)

    def __init__(self, label: str, counts: bool, fatal: bool) -> None:
        self.label = label
        #: counts toward ``tolerable-failed-checkpoints`` (for a checkpoint of a
        #: running query; savepoints never count)
        self.counts = counts
        #: the driver stops with this failure's error
        self.fatal = fatal

    @property
    def abandons(self) -> bool:
        """Not a failure: the checkpoint's marker may count (``PendingState.ABANDONED``)."""
        return self in (CheckpointFailureReason.MARKER_OUTCOME_UNKNOWN,
                        CheckpointFailureReason.MARKER_NOT_CONFIRMED)


class CheckpointFailureManager:
    """Counts consecutive failed checkpoints; more than ``tolerable`` is fatal; a fatal
    reason is fatal at once (Flink's ``CheckpointFailureManager``)."""

    def __init__(self, tolerable: int) -> None:
        self.tolerable = tolerable
        self.consecutive = 0
        #: the error the job fails with; set here only
        self.fatal: AirflowCkptError | None = None

    def on_success(self) -> None:
        self.consecutive = 0

    def on_failure(self, reason: CheckpointFailureReason, checkpoint_id: int, message: str,
                   *, error: AirflowCkptError | None = None, countable: bool = True) -> None:
        """Checkpoint ``checkpoint_id`` failed (or was abandoned) for ``reason``.

        A fatal reason makes ``error`` (required then) the job's fatal error, replacing
        an earlier one (the latest says what the driver must do now: a marker of unknown
        outcome outranks a failure limit). A counting reason with ``countable`` (a
        checkpoint, not a savepoint, of a running query) counts one more consecutive
        failure; past ``tolerable`` that is fatal unless something else is already.
        """
        if reason.fatal:
            if error is None:
                raise ValueError(f"a fatal failure ({reason.name}) needs its error")
            self.fatal = error
        if reason.counts and countable:
            self.consecutive += 1
            if self.consecutive > self.tolerable and self.fatal is None:
                self.fatal = CheckpointFailureLimitError(
                    f"{self.consecutive} consecutive checkpoints failed (tolerable: "
                    f"{self.tolerable}); last: chk-{checkpoint_id}: {message}"
                )
