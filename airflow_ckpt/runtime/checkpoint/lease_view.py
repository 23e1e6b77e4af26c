"""What the checkpoint path needs of the job's lease, passed once through the
coordinator's constructor (``JobLease`` provides each part)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def _no_confirmation() -> None:
    return None


def _no_reservation(_checkpoint_id: int) -> None:
    return None


@dataclass(frozen=True, slots=True)
class LeaseView:
    """The lease as the coordinator sees it. The default is no lease (a test's
    coordinator alone on its storage).

    The lease's *gate* is not here: it is the storage's
    (:class:`~airflow_ckpt.runtime.storage.fenced.FencedStorage`), so every write of the
    checkpoint path (uploads, the marker, the store's deletes) passes it exactly once.
    """

    #: the holder's lease epoch: new shared keys and manifests carry it
    epoch: int | None = None
    #: raises ``ConcurrentDriverError`` if a successor claimed the job (a listing of
    #: ``lease/``; ``JobLease.confirm``): called after a completion marker is durable,
    #: before anything acts on it
    confirm: Callable[[], None] = _no_confirmation
    #: called with a checkpoint id before it is used: ``JobLease.reserve_ids`` reserves
    #: ids in blocks in the lease record, so a successor never reuses one
    reserve_ids: Callable[[int], None] = _no_reservation
