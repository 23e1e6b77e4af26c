"""JobLease: at most one driver writes a job's checkpoints at a time.

Two drivers of one job would subsume each other's checkpoints and sweep each other's
in-flight files. The lease is an epoch-numbered object per holder,
``<job>/lease/<epoch>.json``, created with a create-only put, so of two drivers
taking over the same expired lease exactly one wins. The holder refreshes its
object every ``heartbeat_s``; a lease is free when its holder released it, when its
heartbeat is older than ``ttl_s``, or when its holder ran on this host and its
process is gone (so a driver restarted after ``kill -9`` does not wait out the TTL).
A holder that sees a newer epoch has lost the lease and must stop writing.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass

from airflow_ckpt.errors import ConcurrentDriverError, ObjectAlreadyExistsError, ObjectNotFoundError
from airflow_ckpt.runtime.layout import JobLayout
from airflow_ckpt.runtime.storage.base import CheckpointStorage

log = logging.getLogger("airflow_ckpt.lease")


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    epoch: int
    owner: str
    host: str
    pid: int
    acquired_ts: float
    heartbeat_ts: float
    released: bool = False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class JobLease:
    """The exclusive right to write one job's checkpoints. Use ``with lease: ...``."""

    def __init__(
        self,
        storage: CheckpointStorage,
        job: str,
        owner: str,
        *,
        ttl_s: float = 30.0,
        heartbeat_s: float = 5.0,
    ) -> None:
        self.storage = storage
        self.prefix = JobLayout(job).lease_prefix
        self.job = job
        self.owner = owner
        self.ttl_s = ttl_s
        self.heartbeat_s = heartbeat_s
        self.record: LeaseRecord | None = None
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _key(self, epoch: int) -> str:
        return f"{self.prefix}{epoch:010d}.json"

    def _epochs(self) -> list[int]:
        out = []
        for info in self.storage.list(self.prefix):
            name = info.key[len(self.prefix):]
            if name.endswith(".json") and name[:-5].isdigit():
                out.append(int(name[:-5]))
        return sorted(out)

    def _read(self, epoch: int) -> LeaseRecord | None:
        try:
            return LeaseRecord(**json.loads(self.storage.get_bytes(self._key(epoch))))
        except ObjectNotFoundError:
            return None
        except (ValueError, TypeError):
            return None  # unreadable: treat as free (it protects nothing)

    def _free(self, record: LeaseRecord | None, now: float) -> bool:
        if record is None or record.released or now - record.heartbeat_ts > self.ttl_s:
            return True
        return record.host == socket.gethostname() and not _pid_alive(record.pid)

    def acquire(self, wait_s: float | None = None) -> LeaseRecord:
        """Take the lease, waiting up to ``wait_s`` (default: the TTL) for a live holder.

        Raises ``ConcurrentDriverError`` naming the holder if it stays alive.
        """
        deadline = time.time() + (self.ttl_s + self.heartbeat_s if wait_s is None else wait_s)
        while True:
            epochs = self._epochs()
            newest = epochs[-1] if epochs else 0
            holder = self._read(newest) if newest else None
            now = time.time()
            if self._free(holder, now):
                record = LeaseRecord(newest + 1, self.owner, socket.gethostname(), os.getpid(),
                                     now, now)
                try:
                    self.storage.put_bytes(self._key(record.epoch),
                                           json.dumps(asdict(record)).encode(), create_only=True)
                except ObjectAlreadyExistsError:
                    continue  # another driver took it first: look again
                self.record = record
                self.storage.delete_many(self._key(e) for e in epochs)
                self._start_heartbeat()
                log.info("acquired the lease of job %s (epoch %d)", self.job, record.epoch)
                return record
            assert holder is not None
            if now >= deadline:
                raise ConcurrentDriverError(
                    f"job {self.job!r} is being run by another driver ({holder.owner} on "
                    f"{holder.host}, pid {holder.pid}, last heartbeat "
                    f"{now - holder.heartbeat_ts:.0f} s ago). Stop that driver, or wait: a dead "
                    f"driver's lease expires {self.ttl_s:g} s after its last heartbeat."
                )
            time.sleep(min(1.0, max(deadline - now, 0.05)))

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self.lost.clear()
        self._thread = threading.Thread(target=self._beat, name="ckpt-lease", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.check()
                self._write(released=False)
            except ConcurrentDriverError:
                log.error("lost the lease of job %s to another driver", self.job)
                self.lost.set()
                return
            except Exception:  # a storage hiccup: try again next beat; TTL gives slack
                log.warning("lease heartbeat failed", exc_info=True)

    def _write(self, *, released: bool) -> None:
        assert self.record is not None
        self.record = LeaseRecord(**{**asdict(self.record), "heartbeat_ts": time.time(),
                                     "released": released})
        body = json.dumps(asdict(self.record)).encode()
        self.storage.put_bytes(self._key(self.record.epoch), body)

    def check(self) -> None:
        """Raise ``ConcurrentDriverError`` if another driver took the lease over."""
        if self.record is None:
            raise ConcurrentDriverError(f"job {self.job!r}: the lease is not held")
        epochs = self._epochs()
        if not epochs or epochs[-1] != self.record.epoch:
            self.lost.set()
            raise ConcurrentDriverError(
                f"job {self.job!r}: another driver took over the lease (epochs {epochs[-3:]}, "
                f"ours {self.record.epoch}); this driver must stop"
            )

    def release(self) -> None:
        """Stop heartbeating and mark the lease released (the next driver need not wait)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.record is not None and not self.lost.is_set():
            try:
                self.check()
                self._write(released=True)
            except Exception:  # best effort: the TTL frees it anyway
                log.warning("could not release the lease of job %s", self.job, exc_info=True)
        self.record = None

    def __enter__(self) -> JobLease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
