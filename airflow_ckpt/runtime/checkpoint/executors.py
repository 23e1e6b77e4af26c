"""The executors of a checkpoint's background work: a thread pool at a lowered CPU
priority (:func:`background_priority`), or :class:`InlineExecutor` when the
coordinator runs unthreaded (one deterministic order of storage mutations)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from functools import partial

log = logging.getLogger("airflow_ckpt.checkpoint")

#: niceness added to the upload and async-phase threads (see background_priority)
BACKGROUND_NICENESS = 5


class InlineExecutor(Executor):
    """Runs each submitted call in the caller's thread: at once, or with ``deferred``
    when :meth:`run_deferred` is called. An ``Exception`` is kept in the future as a
    pool would; anything else (the process is going down) propagates to the caller, as
    it would end a pool's worker and the process."""

    def __init__(self, deferred: bool = False) -> None:
        self.deferred = deferred
        self._queue: list[tuple[Future[object], Callable[[], object]]] = []

    def submit(self, fn: Callable[..., object], /, *args: object,  # type: ignore[override]
               **kwargs: object) -> Future[object]:
        future: Future[object] = Future()
        self._queue.append((future, partial(fn, *args, **kwargs)))
        if not self.deferred:
            self.run_deferred()
        return future

    def run_deferred(self) -> None:
        queue, self._queue = self._queue, []
        for future, call in queue:
            try:
                future.set_result(call())
            except Exception as exc:
                future.set_exception(exc)


def background_priority() -> None:
    """Lower the calling thread's CPU priority by :data:`BACKGROUND_NICENESS`.

    Why: in local mode (and on any driver that also computes) the batches and the
    checkpoint uploads share the driver's cores. Hashing and uploading are background
    work whose only deadline is the checkpoint timeout, while every CPU second they take
    from a running batch shows up as batch latency. On Linux ``setpriority`` on a thread
    id changes that thread alone; lowering is always permitted. The lease heartbeat
    keeps the normal priority: its timeliness is what fencing relies on.
    """
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid)
                       + BACKGROUND_NICENESS)
    except (AttributeError, OSError):  # not Linux, or not permitted: keep the priority
        log.debug("could not lower the priority of %s", threading.current_thread().name)


def checkpoint_executors(threaded: bool, upload_threads: int,
                         max_concurrent: int) -> tuple[Executor, Executor]:
    """The coordinator's executors: ``(files, phases)``, for the file uploads and the
    async phases. Threaded: pools at :func:`background_priority`. Not threaded: inline,
    so every storage mutation happens in one deterministic order (what crash-point
    enumeration needs), and an async phase runs at the coordinator's *next* tick:
    batches run in between, as they do while a real async phase uploads."""
    if not threaded:
        return InlineExecutor(), InlineExecutor(deferred=True)
    return (ThreadPoolExecutor(upload_threads, thread_name_prefix="ckpt-upload",
                               initializer=background_priority),
            ThreadPoolExecutor(max(max_concurrent, 1) + 1, thread_name_prefix="ckpt-async",
                               initializer=background_priority))
