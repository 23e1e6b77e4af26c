"""The completion marker: ``_metadata``, the one write that completes a checkpoint.

Contract of :func:`write_marker`: the marker is written last (every file it names is
durable before), create-only (it never replaces another marker) and through the lease's
gate (no write starts once this driver's lease could have expired). When it returns
None the marker is durable *and* counts: the lease was confirmed after it (no successor
claimed the job before the marker landed; a successor's claim-then-adopt counts it).
Otherwise it returns why not, as a :class:`MarkerFailure`:

* ``LEASE_LOST``: the gate refused the write (nothing was written);
* ``CONCURRENT_DRIVER``: a marker is there already (another driver wrote this key);
* ``MARKER_OUTCOME_UNKNOWN``: the write's answer was lost: it may land, now or later;
* ``MARKER_NOT_CONFIRMED``: the marker is durable, but a successor may have claimed the
  job before it (or the confirmation could not be made).

The last two are neither failed nor completed: only a new lease epoch settles them.
Any other storage error propagates (nothing was written: a definite failure).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from airflow_ckpt.errors import (
    AirflowCkptError,
    ConcurrentDriverError,
    LeaseExpiredError,
    ObjectAlreadyExistsError,
    OutcomeUnknownError,
)
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.checkpoint.failures import CheckpointFailureReason
from airflow_ckpt.runtime.storage.base import CheckpointStorage


@dataclass(frozen=True, slots=True)
class MarkerFailure:
    """Why a marker write did not complete its checkpoint (see the module doc)."""

    reason: CheckpointFailureReason
    message: str
    #: the job's fatal error (every marker failure is fatal for a checkpoint)
    error: AirflowCkptError


def write_marker(storage: CheckpointStorage, key: str, data: bytes, *, job: str,
                 confirm: Callable[[], None]) -> MarkerFailure | None:
    """Write the completion marker ``data`` at ``key``, then confirm the lease (see the
    module doc). ``storage``: gated by the lease (the gate raises
    ``LeaseExpiredError`` / ``ConcurrentDriverError`` before the put starts);
    ``confirm``: raises ``ConcurrentDriverError`` if a successor claimed the job."""
    reason = CheckpointFailureReason
    interleave.point(interleave.COMPLETE_BEFORE_METADATA)
    try:
        storage.put_bytes(key, data, create_only=True)
    except (ConcurrentDriverError, LeaseExpiredError) as exc:
        return MarkerFailure(reason.LEASE_LOST, str(exc), exc)
    except ObjectAlreadyExistsError as exc:
        return MarkerFailure(reason.CONCURRENT_DRIVER, str(exc), ConcurrentDriverError(
            f"{key} was written by someone else: another driver is running job {job!r}; "
            "stop one of them"))
    except OutcomeUnknownError as exc:
        return MarkerFailure(reason.MARKER_OUTCOME_UNKNOWN, f"the completion marker {key} "
                             f"may or may not have been written ({exc})", exc)
    try:
        confirm()  # the marker counts only if no successor claimed before it
    except ConcurrentDriverError as exc:
        return MarkerFailure(reason.MARKER_NOT_CONFIRMED, f"{exc}; whether its marker "
                             "counts is the successor's decision", exc)
    except Exception as exc:
        # The marker is durable but the confirmation could not be made (the listing of
        # lease/ failed): as for a marker of unknown outcome, only a new epoch settles it.
        unknown = OutcomeUnknownError(
            f"{key} is written, but the lease could not be confirmed after it "
            f"({type(exc).__name__}: {exc})")
        return MarkerFailure(reason.MARKER_NOT_CONFIRMED, str(unknown), unknown)
    return None
