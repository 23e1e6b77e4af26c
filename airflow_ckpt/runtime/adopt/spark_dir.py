"""A plain Spark checkpoint directory (a query's own ``checkpointLocation``), as import
reads it.

:class:`SparkCheckpointDir` is what import needs of one: its logs (the last committed
and the last planned batch, the query id) and a capture of one committed batch as local
files (:class:`~airflow_ckpt.runtime.checkpoint.snapshot.CapturedSnapshot`, the same
snapshot a checkpoint's sync phase takes, so the same upload writes it).
:func:`open_spark_checkpoint` picks the implementation by the location's scheme: a local
path (or ``file://``) today; an ``hdfs://`` implementation plugs in beside it, capturing
through the runtime's Hadoop ``FileSystem`` capture of the working directory.

What a directory tells about its query: Spark writes ``offsets/<b>`` when it plans
batch ``b`` and ``commits/<b>`` when the batch is done; a running query keeps no lock
or heartbeat file in the directory. So an ``offsets`` entry newer than the last commit
means the query is inside that batch *or* was killed inside it: the files alone cannot
tell the two apart, and import refuses unless told the query is stopped.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

from airflow_ckpt.errors import (
    CheckpointDeclinedError,
    NotASparkCheckpointError,
    SparkCheckpointError,
)
from airflow_ckpt.runtime.checkpoint.snapshot import (
    CapturedSnapshot,
    capture,
    latest_batch,
    query_id,
)
from airflow_ckpt.runtime.checkpoint.workdir_check import check_captured
from airflow_ckpt.runtime.clock import SYSTEM_CLOCK, Clock
from airflow_ckpt.runtime.workdir import location


@dataclass(frozen=True, slots=True)
class SparkLogs:
    """What a Spark checkpoint's logs say about its query."""

    query_id: str
    #: the newest batch in ``commits/`` (None: no batch ever completed)
    committed: int | None
    #: the newest batch in ``offsets/`` (planned; committed or not)
    planned: int | None
    #: seconds since ``offsets/<planned>`` was written (shown, never decides)
    planned_age_s: float | None = None

    @property
    def uncommitted(self) -> int | None:
        """The batch planned and not committed, if any."""
        if self.planned is not None and (self.committed is None or self.planned > self.committed):
            return self.planned
        return None


class SparkCheckpointDir(Protocol):
    """A Spark checkpoint directory import reads (one implementation per filesystem)."""

    @property
    def uri(self) -> str:
        """Where it is, as the history records it."""
        ...

    def logs(self) -> SparkLogs:
        """Its logs; raises ``NotASparkCheckpointError`` when it is no Spark checkpoint
        (no query ``metadata`` with an id, no ``offsets`` log)."""
        ...

    def capture(self, batch_id: int) -> CapturedSnapshot:
        """The files of committed batch ``batch_id`` as a local, stable snapshot (the
        caller discards it); raises ``SparkCheckpointError`` if it cannot be taken."""
        ...


class LocalSparkCheckpoint:
    """A Spark checkpoint on a local (or POSIX-mounted) filesystem. Captured by hard
    links into a hidden staging directory beside it (same filesystem), exactly as the
    checkpoint path captures the runtime's working directory."""

    def __init__(self, path: Path, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = path.absolute()
        self.clock = clock  # only for the age of an uncommitted batch (shown)

    @property
    def uri(self) -> str:
        return self.path.as_uri()

    def logs(self) -> SparkLogs:
        if not self.path.is_dir():
            raise NotASparkCheckpointError(f"{self.path} is not a directory")
        qid = query_id(self.path)
        if not qid or not (self.path / "offsets").is_dir():
            raise NotASparkCheckpointError(
                f"{self.path} is not a Spark checkpoint directory: it has no "
                f"{'metadata file with a query id' if not qid else 'offsets/ log'} (give "
                "the query's checkpointLocation)")
        planned = latest_batch(self.path, "offsets")
        age = None
        if planned is not None:
            try:
                written = (self.path / "offsets" / str(planned)).stat().st_mtime
                age = max(self.clock.time() - written, 0.0)
            except OSError:
                age = None
        return SparkLogs(qid, latest_batch(self.path, "commits"), planned, age)

    def capture(self, batch_id: int) -> CapturedSnapshot:
        staging = self.path.parent / f".{self.path.name}.import-{uuid.uuid4().hex[:8]}"
        try:
            snap = capture(self.path, batch_id, staging)
        except CheckpointDeclinedError as exc:
            raise SparkCheckpointError(f"cannot capture batch {batch_id} of {self.path}: "
                                       f"{exc}") from exc
        except OSError as exc:
            raise SparkCheckpointError(
                f"cannot capture batch {batch_id} of {self.path} by hard links in "
                f"{staging.parent} ({exc}); the directory beside the checkpoint must be "
                "writable and on the same filesystem") from exc
        try:
            check_captured(location(self.path), snap)  # state written on other hosts' disks
        except CheckpointDeclinedError as exc:
            raise SparkCheckpointError(str(exc)) from exc
        return snap


def local_path(location: str, what: str) -> Path:
    """``location`` (a path or ``file://`` URI) as a local path.

    :raises SparkCheckpointError: another scheme (``hdfs://`` needs the runtime's capture
        of that filesystem, which this build does not have; ``what`` says what failed)
    """
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(os.path.expanduser(unquote(parsed.path) if parsed.scheme else location))
    raise SparkCheckpointError(
        f"cannot {what} {location!r}: {parsed.scheme}:// needs the runtime's capture of "
        "that filesystem, which this build does not have. Go through a local disk "
        "(hdfs dfs -get / -put) instead")


def open_spark_checkpoint(location: str) -> SparkCheckpointDir:
    """The Spark checkpoint at ``location``: a local path or ``file://`` URI (the place
    where an ``hdfs://`` implementation plugs in).

    :raises SparkCheckpointError: another scheme (see :func:`local_path`)
    """
    return LocalSparkCheckpoint(local_path(location, "import from"))
