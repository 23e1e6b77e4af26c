"""The driver is one unit: its Python process ends with its JVM, at once and uncounted.

A PySpark driver is two processes. Submitted with spark-submit (client mode, as the
operator does), the JVM (``SparkSubmit``) starts the Python driver as its child
(``PythonRunner``), waits for it and exits with its exit code: a dead Python process
takes its JVM along. Started with plain ``python``, the Python process starts the JVM,
which exits when its stdin, a pipe from the Python process, closes. The other direction
is this module's: when the JVM dies (the OOM killer picks the biggest process), the
Python process would live on - re-parented, heartbeating the job's lease, restarting
its query in-process with no JVM to run it - while the supervisor resubmits the driver.

:meth:`DriverUnit.install` (called by :meth:`CheckpointedJob.run
<airflow_ckpt.runtime.job.checkpointed_job.CheckpointedJob.run>`) makes the two one unit:

* **SIGTERM ends the driver.** It is a process signal (a node drain, a preemption, an
  operator's kill, the JVM's death below), not a job cancellation: the handler raises
  :class:`DriverExit` in the main thread, wherever it is (a restart delay, a restore, a
  Py4J call). ``run`` unwinds - the query stops, the coordinator shuts down, the lease is
  released, so the next driver need not wait - and the process ends with exit code 143
  without a terminal history event. The supervisor sees the driver's non-zero exit and
  counts its one failure. A process still alive :data:`GRACE_S` after the signal exits
  hard (``os._exit``); later signals are ignored while it ends.
* **The JVM's death ends the Python process.** When the JVM is the parent (spark-submit),
  Linux sends SIGTERM at its death (``PR_SET_PDEATHSIG``); everywhere, a watcher thread
  waits on the JVM's pid (a pidfd on Linux, else a look once a second) and sends this
  process SIGTERM when it is gone.
* **A dead JVM is no query failure.** :meth:`DriverUnit.lost` says whether the JVM still
  serves this driver (a Py4J round trip to a SparkContext that is not stopped: a JVM
  shutting down after SIGTERM stops its SparkContext before it fails the queries). The
  in-process restart loop asks it before it counts a failed query, and ends the driver
  with :class:`DriverExit` instead: the supervisor counts the death once.

Signals can be handled in the main thread only: run from another thread (a test running
the job in-process), the unit installs nothing and only :meth:`DriverUnit.lost` works.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from airflow_ckpt.errors import DriverExit
from airflow_ckpt.runtime.driver.process import pid_alive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("airflow_ckpt.driver")

#: the exit code of a driver ended by SIGTERM or by its JVM's death (128 + SIGTERM)
EXIT_CODE = DriverExit.CODE
#: how long an ending driver may take to unwind (stop the query, release the lease)
#: before it exits hard; liveness only, nothing is counted on it
GRACE_S = 10.0
#: fallback watcher (no pidfd): how often it looks at the JVM's pid
POLL_S = 1.0
_PR_SET_PDEATHSIG = 1


class DriverUnit:
    """The Python side of one driver; see the module docstring."""

    def __init__(self, spark: SparkSession, job: str) -> None:
        self.spark = spark
        self.job = job
        self.jvm_pid: int | None = None
        self._ending: DriverExit | None = None
        self._installed = False
        self._previous: Any = None
        self._wake_r, self._wake_w = -1, -1
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()

    @classmethod
    def install(cls, spark: SparkSession, job: str) -> DriverUnit:
        """Install the SIGTERM handler, the parent-death signal and the JVM watcher."""
        unit = cls(spark, job)
        if threading.current_thread() is threading.main_thread():
            unit._install()
        return unit

    def _install(self) -> None:
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True
        jvm = self._py4j("_jvm")
        if jvm is None:
            return
        try:
            self.jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
        except Exception:  # the job's first Py4J call will say why
            log.warning("cannot learn the JVM's pid: its death is noticed on the next "
                        "Py4J call only", exc_info=True)
            return
        if self.jvm_pid == os.getppid():
            _set_parent_death_signal(signal.SIGTERM)
        self._start_watcher(self.jvm_pid)

    def _start_watcher(self, pid: int) -> None:
        fd = None
        if hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):  # ESRCH (gone already), or no pidfd
                fd = os.pidfd_open(pid)
        # The pid was the JVM's when it answered; if it answers again now, no other
        # process can have taken the pid in between, so the pidfd (or the pid) is its.
        if self.lost() is not None:
            if fd is not None:
                os.close(fd)
            self._jvm_gone()
            return
        self._wake_r, self._wake_w = os.pipe()
        self._watcher = threading.Thread(target=self._watch, args=(pid, fd),
                                         name="ckpt-driver-unit", daemon=True)
        self._watcher.start()

    def _watch(self, pid: int, fd: int | None) -> None:
        try:
            if fd is not None:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                poller.register(self._wake_r, select.POLLIN)
                ready = {ready_fd for ready_fd, _ in poller.poll()}
                gone = fd in ready
            else:
                while not self._stop.wait(POLL_S) and pid_alive(pid):
                    pass
                gone = not self._stop.is_set()
        finally:
            if fd is not None:
                os.close(fd)
        if gone and not self._stop.is_set():
            self._jvm_gone()

    def _jvm_gone(self) -> None:
        log.error("job %s: the driver's JVM (pid %s) is gone: this Python driver ends too",
                  self.job, self.jvm_pid)
        os.kill(os.getpid(), signal.SIGTERM)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._ending is not None:
            return  # already ending (a second signal, or the JVM's death after ours)
        jvm_gone = self.jvm_pid is not None and not pid_alive(self.jvm_pid)
        raise self.end(f"its JVM (pid {self.jvm_pid}) is gone" if jvm_gone else "SIGTERM")

    def end(self, reason: str) -> DriverExit:
        """The :class:`DriverExit` to raise to end the driver for ``reason``: logged once,
        with a hard exit :data:`GRACE_S` later if the process has not ended by then."""
        if self._ending is None:
            self._ending = DriverExit(reason)
            log.error("job %s: %s; the driver process ends (exit code %d) without "
                      "restarting in-process: its supervisor counts the failure",
                      self.job, reason, EXIT_CODE)
            sys.stdout.flush()
            timer = threading.Timer(GRACE_S, _exit_hard, args=(reason,))
            timer.daemon = True
            timer.start()
        return self._ending

    def lost(self) -> str | None:
        """Why the JVM no longer serves this driver (unreachable, or its SparkContext
        stopped), or None while it does (or when the session has no JVM of its own to
        lose, e.g. a simulated one). One Py4J round trip."""
        jsc = self._py4j("_jsc")
        if jsc is None:
            return None
        try:
            stopped = jsc.sc().isStopped()
        except Exception as exc:
            return f"its JVM is unreachable ({type(exc).__name__})"
        return "its SparkContext was stopped (the JVM is shutting down)" if stopped else None

    def _py4j(self, name: str) -> Any:
        """The SparkContext's Py4J handle ``name`` (``_jvm``, ``_jsc``); None for a
        session without one (no Py4J call is made)."""
        try:
            return getattr(self.spark.sparkContext, name)
        except Exception:  # Spark Connect, or a stand-in for tests
            return None

    def close(self) -> None:
        """The job's run ended: stop watching, give SIGTERM its previous handler."""
        self._stop.set()
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r, self._wake_w = -1, -1
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False


def _set_parent_death_signal(sig: int) -> None:
    """Linux: have the kernel send ``sig`` when the parent (the JVM) dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    except (OSError, AttributeError):
        log.warning("cannot set the parent-death signal; the JVM watcher remains",
                    exc_info=True)


def _exit_hard(reason: str) -> None:
    log.error("the driver did not end within %.0f s of %s: exiting hard", GRACE_S, reason)
    logging.shutdown()
    os._exit(EXIT_CODE)
