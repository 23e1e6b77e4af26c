"""Process facts: whether a pid is alive here, and who holds a lease precisely enough to
tell that it is gone (host, boot, pid namespace, pid, start time).

Read from ``/proc`` and ``os.kill(pid, 0)`` only; no storage, no clock. The lease uses
:class:`HolderIdentity` for its fast takeover after ``kill -9`` on the same machine
(:mod:`airflow_ckpt.runtime.lease.holder`); the driver unit and the supervision trigger
ask :func:`pid_alive` directly.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def _start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot (0 if unknown)."""
    stat = _read_text(f"/proc/{pid}/stat")
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return 0


def pid_alive(pid: int) -> bool:
    """False if no process has ``pid`` here, or only a zombie that nobody reaped yet (a
    SIGKILLed driver whose parent, the detached launcher, died with it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = _read_text(f"/proc/{pid}/stat")
    try:
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except IndexError:
        return True  # no /proc (or it vanished): os.kill said it exists


@dataclass(frozen=True, slots=True)
class HolderIdentity:
    """Which process holds a lease, precisely enough to tell that it is gone."""

    host: str
    boot_id: str
    pid_ns: str
    pid: int
    start_ticks: int

    @classmethod
    def current(cls) -> HolderIdentity:
        pid = os.getpid()
        return cls(socket.gethostname(), _read_text("/proc/sys/kernel/random/boot_id"),
                   _pid_namespace(), pid, _start_ticks(pid))

    def is_dead_here(self) -> bool:
        """True only if this process can *prove* the holder is gone: same host, boot and
        pid namespace, and its pid is free or reused by a later process."""
        me = HolderIdentity.current()
        if not (self.boot_id and self.pid_ns and self.start_ticks):
            return False  # a record without the identity (an old driver): never guess
        if (self.host, self.boot_id, self.pid_ns) != (me.host, me.boot_id, me.pid_ns):
            return False
        return not pid_alive(self.pid) or _start_ticks(self.pid) != self.start_ticks
