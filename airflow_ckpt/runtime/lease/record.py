"""The lease record ``<job>/lease/<epoch>.json`` and its readers.

What a record holds and which completed checkpoints it makes count
(:func:`valid_checkpoint_ids`); the safety argument is in
:mod:`airflow_ckpt.runtime.lease.holder`. Every reader of the lease layout reads through
:func:`read_lease` or :func:`lease_epochs`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

from airflow_ckpt.errors import ObjectNotFoundError
from airflow_ckpt.runtime.driver.process import HolderIdentity
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout

DEFAULT_TTL_S = 30.0
DEFAULT_HEARTBEAT_S = 5.0
DEFAULT_MAX_WRITE_S = 10.0
ID_BLOCK = 100  # checkpoint ids reserved per lease write


class Clock(Protocol):
    """A clock in seconds: ``time.monotonic`` for liveness, ``time.time`` for the record's
    display timestamps (the simulation passes its own)."""

    def __call__(self) -> float: ...


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The content of ``<job>/lease/<epoch>.json``.

    ``adopted``: the completed checkpoints the holder found valid when it took over;
    ``first_id``: the first checkpoint id it uses. Together they decide which
    ``_metadata`` objects count (see :func:`valid_checkpoint_ids`). ``adoption_final``:
    the holder finished its takeover's second look (False from its claim until then: a
    holder that died in between adopted only what it listed before its claim, and its
    successor also judges by the older records still stored, see
    :meth:`~airflow_ckpt.runtime.lease.holder.JobLease.acquire`; a record of a version
    before the field counts as final). ``heartbeat_ts`` is informational (shown in the
    UI); liveness is judged from ``seq`` alone.
    """

    epoch: int
    owner: str
    host: str
    pid: int
    acquired_ts: float
    heartbeat_ts: float
    released: bool = False
    seq: int = 0
    ttl_s: float = DEFAULT_TTL_S
    max_write_s: float = DEFAULT_MAX_WRITE_S
    boot_id: str = ""
    pid_ns: str = ""
    start_ticks: int = 0
    adopted: tuple[int, ...] | None = None
    first_id: int | None = None
    #: checkpoint ids below this are reserved by this holder (see :meth:`JobLease.reserve_ids`)
    id_limit: int | None = None
    adoption_final: bool = True

    @property
    def identity(self) -> HolderIdentity:
        return HolderIdentity(self.host, self.boot_id, self.pid_ns, self.pid, self.start_ticks)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> LeaseRecord | None:
        """The record, or None if unreadable (an unreadable lease protects nothing)."""
        try:
            obj = json.loads(raw)
            known = {f.name for f in fields(cls)}
            values: dict[str, Any] = {k: v for k, v in obj.items() if k in known}
            if values.get("adopted") is not None:
                values["adopted"] = tuple(int(n) for n in values["adopted"])
            return cls(**values)
        except (ValueError, TypeError, AttributeError):
            return None


def lease_key(prefix: str, epoch: int) -> str:
    return f"{prefix}{epoch:010d}.json"


def lease_epochs(storage: CheckpointStorage, job: str) -> list[int]:
    """Epochs of the lease objects stored for ``job``, ascending."""
    prefix = JobLayout(job).lease_prefix
    out = []
    for info in storage.list(prefix):
        name = info.key[len(prefix):]
        if name.endswith(".json") and name[:-5].isdigit():
            out.append(int(name[:-5]))
    return sorted(out)


def read_epoch(storage: CheckpointStorage, job: str, epoch: int) -> LeaseRecord | None:
    """The record of lease ``epoch`` (None if it is gone or unreadable)."""
    try:
        return LeaseRecord.from_json(
            storage.get_bytes(lease_key(JobLayout(job).lease_prefix, epoch)))
    except ObjectNotFoundError:
        return None


def newest_lease(storage: CheckpointStorage, job: str) -> tuple[int, LeaseRecord | None]:
    """The newest lease epoch listed for ``job`` (0: none) and its record (None if
    there is none, or it was gone when read)."""
    epochs = lease_epochs(storage, job)
    if not epochs:
        return 0, None
    return epochs[-1], read_epoch(storage, job, epochs[-1])


def read_lease(storage: CheckpointStorage, job: str) -> LeaseRecord | None:
    """The newest lease record of ``job`` (None if there is none or it is unreadable)."""
    return newest_lease(storage, job)[1]


def valid_checkpoint_ids(ids: list[int], lease: LeaseRecord | None) -> list[int]:
    """Of the checkpoint ids that have a ``_metadata``, those that count as completed.

    A checkpoint counts if the current holder adopted it at takeover or it is one of
    the holder's own (id >= ``first_id``). Anything else is a completion marker that a
    deposed driver wrote after the takeover: it never counts.
    """
    if lease is None or lease.adopted is None or lease.first_id is None:
        return ids
    adopted = set(lease.adopted)
    return [n for n in ids if n in adopted or n >= lease.first_id]
