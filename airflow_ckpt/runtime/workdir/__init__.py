"""Spark's working directory (its ``checkpointLocation``): a local path, or a directory
on a Hadoop ``FileSystem`` (``hdfs://``) reached through the driver's JVM.

The runtime reads a handful of Spark's small files there (the offset and commit logs,
``metadata``, a file source's log) and captures, restores and empties the directory.
A local working directory is a :class:`~pathlib.Path` (hard links, ``os`` calls); a
remote one is a :class:`RemoteWorkdir` (``runtime/workdir/hadoop.py``). The functions
here take either, so each reader of Spark's files keeps one body.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from airflow_ckpt.runtime.checkpoint.snapshot import CapturedSnapshot


class RemoteWorkdir(Protocol):
    """A working directory on a filesystem the driver reaches through an API."""

    #: what Spark gets as ``checkpointLocation`` (a URI such as ``hdfs://nn:8020/x/work``)
    location: str
    #: a local directory of the driver for staging captures and restores
    local_root: Path

    def names(self, rel: str) -> list[str]:
        """The entries of directory ``rel``; raises ``FileNotFoundError`` if absent."""

    def read_bytes(self, rel: str) -> bytes:
        """The bytes of file ``rel``; raises ``FileNotFoundError`` if absent."""

    def modified_time(self, rel: str) -> float:
        """When ``rel`` was last written (seconds since the epoch, the filesystem's
        clock); raises ``FileNotFoundError`` if absent."""

    def capture(self, batch_id: int, staging_dir: Path) -> CapturedSnapshot:
        """The sync phase's capture of batch ``batch_id`` into local ``staging_dir``."""

    def reset(self) -> None:
        """Remove the working directory (its parent stays)."""

    def replace_with(self, local_dir: Path) -> None:
        """Make the working directory a copy of ``local_dir`` (restore): what was there
        is gone, the copy appears whole (written beside it, then renamed)."""


#: a local working directory, or a remote one
Workdir = Path | RemoteWorkdir


def names(workdir: Workdir, rel: str) -> list[str]:
    """The entries of directory ``rel`` of ``workdir``; ``FileNotFoundError`` if absent."""
    if isinstance(workdir, Path):
        return os.listdir(workdir / rel)
    return workdir.names(rel)


def read_bytes(workdir: Workdir, rel: str) -> bytes:
    """The bytes of file ``rel`` of ``workdir``; ``FileNotFoundError`` if absent."""
    if isinstance(workdir, Path):
        return (workdir / rel).read_bytes()
    return workdir.read_bytes(rel)


def read_text(workdir: Workdir, rel: str) -> str:
    """The text (UTF-8) of file ``rel`` of ``workdir``; ``FileNotFoundError`` if absent."""
    return read_bytes(workdir, rel).decode()


def modified_time(workdir: Workdir, rel: str) -> float:
    """When ``rel`` of ``workdir`` was last written (the filesystem's clock: shown to
    people, never compared for a decision); ``FileNotFoundError`` if absent."""
    if isinstance(workdir, Path):
        return (workdir / rel).stat().st_mtime
    return workdir.modified_time(rel)


def location(workdir: Workdir) -> str:
    """What Spark gets as ``checkpointLocation``."""
    return str(workdir) if isinstance(workdir, Path) else workdir.location


def staging_root(workdir: Workdir) -> Path:
    """The local directory under which captures are staged: beside a local working
    directory (hard links need the same filesystem), under a remote one's local root."""
    if isinstance(workdir, Path):
        return workdir.parent / f".{workdir.name}.staging"
    return workdir.local_root / "staging"


def reset(workdir: Workdir) -> None:
    """Empty the working directory (the runtime owns it; storage holds the truth)."""
    if isinstance(workdir, Path):
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.parent.mkdir(parents=True, exist_ok=True)
    else:
        workdir.reset()


def restore_dir(workdir: Workdir) -> Path:
    """A fresh local directory path to materialise a restore into before it becomes the
    working directory (beside a local one, so that the move is a rename)."""
    if isinstance(workdir, Path):
        return workdir.parent / f".{workdir.name}.restore-{os.urandom(3).hex()}"
    return workdir.local_root / f"restore-{os.urandom(3).hex()}"


def replace_with(workdir: Workdir, local_dir: Path) -> None:
    """Make the working directory what ``local_dir`` holds (``local_dir`` is consumed
    for a local working directory: renamed, so inodes and digests carry over)."""
    if isinstance(workdir, Path):
        reset(workdir)
        local_dir.rename(workdir)
    else:
        workdir.replace_with(local_dir)


def is_remote(spec: str) -> bool:
    """Whether a ``spark.airflow_ckpt.workdir`` value names a remote filesystem: a URI
    with a scheme other than ``file``."""
    scheme, sep, _ = spec.partition("://")
    return bool(sep) and scheme.lower() != "file" and scheme.isalnum()
