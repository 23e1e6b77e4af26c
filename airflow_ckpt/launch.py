"""``python -m airflow_ckpt.launch <exit-file> -- <command...>``: run a detached driver.

Started by :meth:`~airflow_ckpt.hooks.spark_submit.CheckpointedSparkSubmitHook.submit_detached`
in its own session (so restarting the Airflow worker does not kill the driver). Runs the
command, then writes its exit code to ``<exit-file>`` (atomically), so a supervisor on
the same host learns how the submission ended. SIGTERM is forwarded to the command.

A driver is one unit (:mod:`airflow_ckpt.runtime.driver.unit`): the exit file is written
only once every process the command started has ended too. On Linux the launcher is a
child subreaper (``PR_SET_CHILD_SUBREAPER``), so a Python driver whose JVM died is
re-parented to it; the launcher waits :data:`FOLLOW_S` for such processes, then kills
them (:func:`end_processes`). No Airflow import.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

#: how long the rest of a driver may outlive the process that ended first (its own
#: watcher ends it within a second or two) before the launcher / hook kills it
FOLLOW_S = 30.0
_PR_SET_CHILD_SUBREAPER = 36


def end_processes(processes: Sequence[Any], grace_s: float = FOLLOW_S,
                  warn: Callable[[str], object] | None = None) -> list[int]:
    """Wait up to ``grace_s`` for ``processes`` (``psutil.Process``) to end; SIGKILL the
    rest. Returns the pids killed. ``warn`` is told which processes outlived the one that
    ended first (the driver's own last words went to its dead JVM's pipe) and each kill."""
    try:
        import psutil
    except ImportError:  # nothing to wait with
        return []
    alive = [p for p in processes if _running(p)]
    if alive and warn is not None:
        warn(f"driver process(es) {sorted(p.pid for p in alive)} outlived the one that ended "
             f"first: waiting up to {grace_s:.0f} s for them to end (a driver is one unit)")
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    killed = []
    for process in alive:
        with contextlib.suppress(psutil.Error):  # ended meanwhile
            if warn is not None:
                warn(f"pid {process.pid} ({' '.join(process.cmdline())[:200]}) outlived the "
                     f"driver process that ended first by {grace_s:.0f} s: killing it")
            process.kill()
            killed.append(process.pid)
    psutil.wait_procs(alive, timeout=5)
    return killed


def _running(process: Any) -> bool:
    """A ``psutil.Process`` that still runs (a zombie waiting to be reaped does not)."""
    import psutil

    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _become_subreaper() -> bool:
    """Linux: orphaned descendants are re-parented to this process (not to init)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _orphans() -> list[Any]:
    """This process's children left after the command ended (re-parented to us)."""
    try:
        import psutil

        return list(psutil.Process().children(recursive=True))
    except Exception:  # psutil missing
        return []


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m airflow_ckpt.launch <exit-file> -- <command...>",
              file=sys.stderr)
        return 2
    exit_path, command = argv[0], argv[2:]
    subreaper = _become_subreaper()
    child = subprocess.Popen(command)
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    code = child.wait()
    if subreaper:
        end_processes(_orphans(), FOLLOW_S, warn=lambda message: print(
            f"{time.strftime('%y/%m/%d %H:%M:%S')} WARN airflow_ckpt.launch: {message}",
            flush=True))
    tmp = f"{exit_path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="ascii") as fh:
        fh.write(f"{code}\n")
    os.replace(tmp, exit_path)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
