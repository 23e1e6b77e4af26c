"""LeaseObserver: whether a job's lease is held, released, expired or its holder dead.

Liveness is judged without comparing clocks: a holder is called expired only after the
observer saw the same ``(epoch, seq)`` for ``ttl_s + max_write_s`` of *its own*
monotonic clock (see :mod:`airflow_ckpt.runtime.lease.holder`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from airflow_ckpt.runtime.lease.record import Clock, LeaseRecord, newest_lease
from airflow_ckpt.runtime.storage.base import CheckpointStorage

LeaseStatus = Literal["none", "held", "released", "expired", "dead"]


@dataclass(frozen=True, slots=True)
class LeaseState:
    """What an observer concluded about a job's lease at one poll.

    ``unchanged_for_s``: how long (the observer's clock) the holder's heartbeat has not
    moved; ``status`` is ``expired`` once that reaches ``ttl_s + max_write_s``, ``dead``
    if the holder's process is provably gone on this machine.
    """

    status: LeaseStatus
    record: LeaseRecord | None
    unchanged_for_s: float = 0.0
    #: the newest epoch listed at this poll (0: none), the one judged: a claim after
    #: it is ``epoch + 1``, never past an epoch nobody judged
    epoch: int = 0

    @property
    def free(self) -> bool:
        return self.status != "held"


class LeaseObserver:
    """Watches a job's lease across polls and says when its holder is alive or gone.

    Keep one observer across polls: liveness is "the heartbeat moved recently", which
    needs two looks. A new observer (a restarted triggerer) waits one full expiry before
    it calls a silent holder expired.
    """

    def __init__(self, storage: CheckpointStorage, job: str, clock: Clock = time.monotonic):
        self.storage = storage
        self.job = job
        self.clock = clock
        self._seen: tuple[int, int] | None = None
        self._since = 0.0

    def poll(self) -> LeaseState:
        epoch, record = newest_lease(self.storage, self.job)
        now = self.clock()
        if record is None:
            self._seen = None
            return LeaseState("none", None, epoch=epoch)
        version = (record.epoch, record.seq)
        if version != self._seen:
            self._seen, self._since = version, now
        unchanged = now - self._since
        if record.released:
            return LeaseState("released", record, unchanged, epoch)
        if record.identity.is_dead_here():
            return LeaseState("dead", record, unchanged, epoch)
        if unchanged >= record.ttl_s + record.max_write_s:
            return LeaseState("expired", record, unchanged, epoch)
        return LeaseState("held", record, unchanged, epoch)
