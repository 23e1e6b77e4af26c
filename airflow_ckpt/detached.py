"""A driver started detached (deferrable supervision), seen from the Airflow side.

:meth:`~airflow_ckpt.hooks.spark_submit.CheckpointedSparkSubmitHook.submit_detached` starts
``python -m airflow_ckpt.launch`` (:mod:`airflow_ckpt.launch`) in its own session; the
launcher writes the driver's exit code to ``<log>.exit`` (:func:`exit_path_of`). This
module is what the operator, the hook and the supervision trigger know of such a driver:
its handle, where its log goes, its exit code, its last log lines, and how to stop it.
No Airflow import.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from airflow_ckpt.runtime.driver.process import pid_alive

#: lines of a driver's output kept for the task log and failure reports
OUTPUT_TAIL_LINES = 400


@dataclass(frozen=True, slots=True)
class DetachedDriver:
    """A spark-submit started in its own session: pid (= its process group), log, exit file."""

    pid: int
    log_path: str
    exit_path: str


def detached_log_path(log_dir: str | None, job: str, run_id: str, attempt: int) -> Path:
    """Where a detached driver's output goes: ``<log_dir>/<job>-<run id>-<attempt>.log``
    (default directory ``$TMPDIR/airflow-ckpt-drivers``; the run id made file-safe)."""
    base = Path(log_dir) if log_dir else Path(tempfile.gettempdir()) / "airflow-ckpt-drivers"
    safe_run = re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)
    return base / f"{job}-{safe_run}-{attempt}.log"


def exit_path_of(log_path: str | Path) -> str:
    """The exit-code file of the detached driver logging to ``log_path``: ``<log>.exit``.

    The launcher writes it (:meth:`~airflow_ckpt.hooks.spark_submit.
    CheckpointedSparkSubmitHook.submit_detached`), the supervisor records it in the
    submission's ``job_submitted`` event (``driver_exit``), and the trigger that watches
    that submission reads it from there."""
    return f"{log_path}.exit"


def read_exit_code(exit_path: str | None) -> int | None:
    """The exit code a detached launcher wrote, or None (still running / other host)."""
    if not exit_path:
        return None
    try:
        return int(Path(exit_path).read_text().strip())
    except (OSError, ValueError):
        return None


def signal_detached(pid: int, sig: int = signal.SIGTERM) -> bool:
    """Send ``sig`` to a detached driver's whole process group; False if it is gone."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def log_tail(path: str | None, lines: int = OUTPUT_TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of a detached driver's log (empty if unreadable here)."""
    if not path:
        return []
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 256 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def kill_detached(pid: int | None, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``, to a detached driver's process group."""
    if pid is None:
        return
    if not signal_detached(pid, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not signal_detached(pid, 0):
            return
        time.sleep(0.2)
    signal_detached(pid, signal.SIGKILL)


class HostProcesses:
    """The detached drivers as the process that watches them sees them: its host name,
    a driver's exit code and last log lines (readable on the driver's host only),
    whether its launcher lives, how to stop it.

    The supervisor and the supervision trigger take one through their constructors
    (this host's processes by default); the simulation passes its simulated drivers.
    """

    def hostname(self) -> str:
        return socket.gethostname()

    def exit_code(self, exit_path: str | None) -> int | None:
        return read_exit_code(exit_path)

    def alive(self, pid: int) -> bool:
        return pid_alive(pid)

    def kill(self, pid: int | None, grace_s: float = 10.0) -> None:
        kill_detached(pid, grace_s)

    def log_tail(self, path: str | None) -> list[str]:
        return log_tail(path)


#: the processes of this host
LOCAL_PROCESSES = HostProcesses()
