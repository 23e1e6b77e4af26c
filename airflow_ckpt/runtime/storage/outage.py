"""The outage budget: storage requests wait for an unreachable storage, for a while.

An S3 endpoint that is down for a minute must not fail a streaming job whose every
batch and checkpoint writes to it. Every storage request of a driver goes through one
:class:`OutageBudget` (via :class:`OutageRidingStorage`): a request that fails with
:class:`~airflow_ckpt.errors.EndpointUnreachableError` (the endpoint unreachable, or an
answer lost: ``OutcomeUnknownError``) is repeated with capped exponential backoff. The
first such failure opens an *outage*; any request that succeeds closes it. Once an
outage has lasted ``tolerable-storage-outage`` (Flink-style option of
:class:`~airflow_ckpt.runtime.checkpoint.config.CheckpointConfig`, default 5 min), every request
of the outage fails with :class:`~airflow_ckpt.errors.StorageOutageError`, whose
message names the outage's *first* error (its real cause, e.g. ``SlowDown`` on a sink's
PUT), not the last one met by whichever request gave up.

One request's own failures are bounded by the same budget, whatever other requests do:
a key whose every answer is lost while the heartbeat's requests succeed (each success
closes the outage) would otherwise be repeated forever, the driver stuck on it with a
healthy lease (simulation, job seeds 200062 and 200178: every DELETE of one control
request held in the network).

**Why repeating is safe.** Every write here is idempotent at its key with the same
bytes: a plain put replaces with equal bytes, a create-only or compare-and-swap put
that finds its own bytes in place succeeds (storage/base.py, "three outcomes"), a
delete of a deleted key is done. So a write whose outcome was unknown is *resolved* by
repeating it when the storage is back: done (our bytes), or a real conflict on evidence
(``ObjectAlreadyExistsError``, ``PreconditionFailedError``). It is never declared
failed without evidence; if the budget runs out first, it stays unknown
(:class:`~airflow_ckpt.errors.OutageOutcomeUnknownError`, also when the last attempt
was a plain unreachable error after an earlier lost answer). Nor does a repetition
that is *refused* without being sent or judged on the key (the lease's gate:
``LeaseExpiredError``, ``ConcurrentDriverError``; any error but a conflict) say the
first copy did not land: the write's outcome stays unknown
(``OutcomeUnknownError``, chained from the refusal). Otherwise a completion marker
whose answer was lost, then refused by a lease that lapsed in the outage, was
recorded ``FAILED`` while its first copy counted for the successor's adoption. Only
for writes: a read's later answer is the truth.

**No guarantee rests on the budget.** It is a timeout, so it is for liveness only:
how long a job waits before it fails. Safety against a second driver stays with the
lease's fencing, which this view must sit *outside* of (each repetition passes the
lease's gate again, so a driver whose lease lapsed during the outage starts no write).
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

from airflow_ckpt.errors import (
    EndpointUnreachableError,
    OutageOutcomeUnknownError,
    OutcomeUnknownError,
    PreconditionFailedError,
    StorageOutageError,
)
from airflow_ckpt.runtime.storage.base import CheckpointStorage, ObjectInfo, Versioned
from airflow_ckpt.runtime.storage.delegating import DelegatingStorage

log = logging.getLogger("airflow_ckpt.outage")

T = TypeVar("T")

#: the first wait after a failed request; doubled up to :data:`MAX_BACKOFF_S`
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 5.0


class OutageBudget:
    """One driver's view of storage outages: when the current one began, what began it.

    :param budget_s: how long an outage may last before requests give up (0: at once)
    :param clock: monotonic seconds (injected by tests)
    :param sleep: how to wait between repetitions (injected by tests)
    """

    def __init__(self, budget_s: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.budget_s = budget_s
        self.clock = clock
        self.sleep = sleep
        self._lock = threading.Lock()
        self._since: float | None = None  # clock() at the outage's first failure
        self._first: str | None = None  # the outage's first error, as text
        #: outages this driver has met (begun), and ridden out (ended within the budget)
        self.outages = 0
        self.ridden_out = 0
        #: the message of the last outage that outlasted the budget, until taken
        self._spent_message: str | None = None

    @property
    def in_outage(self) -> bool:
        return self._since is not None

    @property
    def spent(self) -> bool:
        """Whether an outage outlasted the budget and its message was not taken yet."""
        return self._spent_message is not None

    @property
    def first_cause(self) -> str | None:
        """The current outage's first error (None outside an outage)."""
        return self._first

    def call(self, what: str, fn: Callable[[], T], *, write: bool = False) -> T:
        """``fn()``, repeated while it fails with ``EndpointUnreachableError`` and the
        outage is within the budget; then ``StorageOutageError`` naming the first cause
        (``OutageOutcomeUnknownError`` if an attempt's outcome was unknown: the last
        one, or for a ``write`` any one). A ``write`` whose outcome was unknown once
        stays unknown when a repetition is refused with anything but a conflict
        (``PreconditionFailedError``): ``OutcomeUnknownError``, chained from the
        refusal (see the module doc). A budget of 0 waits for nothing: ``fn``'s error
        is raised as it is."""
        if self.budget_s <= 0:
            return fn()
        backoff = FIRST_BACKOFF_S
        own_since: float | None = None  # clock() at this request's first failure
        unknown: OutcomeUnknownError | None = None  # a write's first lost answer
        while True:
            try:
                result = fn()
            except EndpointUnreachableError as exc:
                if isinstance(exc, StorageOutageError):
                    # an inner call gave up already: this outage is spent
                    if unknown is not None and not isinstance(exc, OutcomeUnknownError):
                        raise OutageOutcomeUnknownError(str(exc)) from exc
                    raise
                if write and unknown is None and isinstance(exc, OutcomeUnknownError):
                    unknown = exc
                lasted = self._failed(what, exc)
                now = self.clock()
                own_since = now if own_since is None else own_since
                lasted = max(lasted, now - own_since)
                if lasted >= self.budget_s:
                    raise self._spent(what, exc, lasted, unknown) from exc
                self.sleep(min(backoff, max(self.budget_s - lasted, 0.0)))
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            except Exception as exc:
                if unknown is None or isinstance(exc, PreconditionFailedError):
                    raise  # no lost answer before, or evidence about the key
                raise OutcomeUnknownError(
                    f"{what}: the first attempt's answer was lost ({unknown}) and the "
                    f"repetition was refused: {type(exc).__name__}: {exc}") from exc
            self._succeeded()
            return result

    def take_spent(self) -> str | None:
        """The message of the outage that outlasted the budget (None if none did since
        the last call), and start the next failure's outage afresh: after the job failed
        for this outage, recording that failure gets a budget of its own."""
        with self._lock:
            message, self._spent_message = self._spent_message, None
            if message is not None:
                self._since = self._first = None
            return message

    def _failed(self, what: str, exc: EndpointUnreachableError) -> float:
        with self._lock:
            now = self.clock()
            if self._since is None:
                self._since, self._first = now, f"{what}: {type(exc).__name__}: {exc}"
                self.outages += 1
                log.warning("storage unreachable (%s); requests wait up to %g s for it",
                            self._first, self.budget_s)
            return now - self._since

    def _succeeded(self) -> None:
        if self._since is None:  # the common case: no lock
            return
        with self._lock:
            if self._since is None:
                return
            lasted = self.clock() - self._since
            self._since = self._first = None
            self.ridden_out += 1
        log.warning("storage reachable again after an outage of %.1f s", lasted)

    def _spent(self, what: str, exc: EndpointUnreachableError, lasted: float,
               unknown: OutcomeUnknownError | None) -> StorageOutageError:
        message = (f"the storage stayed unreachable for {lasted:.0f} s, longer than "
                   f"execution.checkpointing.tolerable-storage-outage ({self.budget_s:g} s); "
                   f"first error: {self._first}; last: {what}: {exc}")
        if unknown is not None and unknown is not exc:
            message += f"; an earlier attempt's answer was lost: {unknown}"
        with self._lock:
            self._spent_message = message
        if unknown is not None or isinstance(exc, OutcomeUnknownError):
            return OutageOutcomeUnknownError(message)
        return StorageOutageError(message)


class OutageRidingStorage(DelegatingStorage):
    """``inner`` with every request waiting through outages within ``budget``.

    Place it outside a :class:`~airflow_ckpt.runtime.storage.fenced.FencedStorage`: each
    repetition of a write is gated again. A stream is repeated only while opening;
    once its bytes flow, a broken body is the backend's to resume.

    ``writes=False``: only reads wait, writes fail as they fail. The lease's view: its
    heartbeat must fail (and the lease lapse) on time, while the listings it confirms
    and adopts from wait like every other read.
    """

    def __init__(self, inner: CheckpointStorage, budget: OutageBudget, *,
                 writes: bool = True) -> None:
        super().__init__(inner)
        self.budget = budget
        self.writes = writes

    def _write(self, what: str, fn: Callable[[], T]) -> T:
        return self.budget.call(what, fn, write=True) if self.writes else fn()

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        return self._write(f"PUT {key}", lambda: self.inner.put_bytes(
            key, data, create_only=create_only, if_match=if_match))

    def get_bytes(self, key: str) -> bytes:
        return self.budget.call(f"GET {key}", lambda: self.inner.get_bytes(key))

    def get_versioned(self, key: str) -> Versioned:
        return self.budget.call(f"GET {key}", lambda: self.inner.get_versioned(key))

    @contextlib.contextmanager
    def open_stream(self, key: str, start: int = 0,
                    length: int | None = None) -> Iterator[BinaryIO]:
        with contextlib.ExitStack() as stack:
            stream = self.budget.call(f"GET {key}", lambda: stack.enter_context(
                self.inner.open_stream(key, start, length)))
            yield stream

    def exists(self, key: str) -> bool:
        return self.budget.call(f"HEAD {key}", lambda: self.inner.exists(key))

    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        return self.budget.call(f"LIST {prefix}", lambda: self.inner.list(prefix))

    def list_after(self, prefix: str, start_after: str) -> builtins.list[ObjectInfo]:
        return self.budget.call(f"LIST {prefix}",
                                lambda: self.inner.list_after(prefix, start_after))

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        return self.budget.call(f"LIST {prefix}", lambda: self.inner.list_dirs(prefix))

    def upload_file(self, path: Path, key: str) -> None:
        self._write(f"PUT {key}", lambda: self.inner.upload_file(path, key))

    def upload_file_hashed(self, path: Path, key: str) -> str:
        return self._write(f"PUT {key}", lambda: self.inner.upload_file_hashed(path, key))

    def download_file(self, key: str, path: Path) -> None:
        self.budget.call(f"GET {key}", lambda: self.inner.download_file(key, path))

    def copy(self, src_key: str, dst_key: str) -> None:
        self._write(f"COPY {dst_key}", lambda: self.inner.copy(src_key, dst_key))

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = builtins.list(keys)
        self._write(f"DELETE {len(keys)} keys", lambda: self.inner.delete_many(keys))
