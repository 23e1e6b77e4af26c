"""PendingCheckpoint: a triggered checkpoint or savepoint on its way to ``_metadata``,
and :class:`PendingState`, the states it moves through (Flink's ``PendingCheckpoint``).

::

    PENDING --(the async phase claims completion)--> COMPLETING --> COMPLETED
       |                                                 |    \\
       +--> FAILED  <------------------------------------+     +--> ABANDONED

The timeout tick may fail only a ``PENDING`` checkpoint: once the async phase claimed
completion, the marker write decides (it is bounded by the lease's write time).
``ABANDONED``: the marker write's outcome is unknown, or a successor may have claimed
the job before it: the checkpoint is neither failed nor completed, nothing acts on it
(no commit, no answer, no history event) and the driver stops; a new lease epoch
decides whether its marker counts.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field

from airflow_ckpt.runtime.checkpoint.metadata import Kind, Manifest, Trigger


class PendingState(enum.Enum):
    """Where a :class:`PendingCheckpoint` is (see the module doc)."""

    PENDING = "pending"
    COMPLETING = "completing"  # its _metadata is being written
    COMPLETED = "completed"
    FAILED = "failed"
    ABANDONED = "abandoned"  # marker outcome unknown: a successor decides; no answer


@dataclass
class PendingCheckpoint:
    """A triggered checkpoint or savepoint that has not settled yet (``done`` is set
    when it is ``COMPLETED``, ``FAILED`` or ``ABANDONED``)."""

    checkpoint_id: int
    trigger: Trigger
    trigger_ts: float  # wall clock (reported); intervals and timeouts use monotonic time
    deadline: float  # monotonic time after which the checkpoint expires
    savepoint_id: str | None = None
    request_id: str | None = None
    #: a savepoint the job took itself (periodic, or requested without a name): the
    #: savepoint history's retention may dispose of it (savepoint_history.py)
    in_history: bool = False
    barrier_batch: int | None = None
    captured: bool = False
    acked: set[str] = field(default_factory=set)
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    manifest: Manifest | None = None
    path: str | None = None  # URI of the completed checkpoint/savepoint directory
    failure: str | None = None
    state: PendingState = PendingState.PENDING
    _state_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def is_savepoint(self) -> bool:
        return self.savepoint_id is not None

    @property
    def kind(self) -> Kind:
        """``"savepoint"`` or ``"checkpoint"`` (as in logs and manifests)."""
        return "savepoint" if self.is_savepoint else "checkpoint"

    def move(self, to: PendingState, *, allowed: tuple[PendingState, ...]) -> bool:
        """Atomically move to state ``to`` if the current state is in ``allowed``."""
        with self._state_lock:
            if self.state not in allowed:
                return False
            self.state = to
            return True
