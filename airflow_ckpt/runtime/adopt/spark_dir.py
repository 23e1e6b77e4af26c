"""A plain Spark checkpoint directory (a query's own ``checkpointLocation``), as import
reads it.

:class:`SparkCheckpointDir` is what import needs of one: its logs (the last committed
and the last planned batch, the query id) and a capture of one committed batch as local
files (:class:`~airflow_ckpt.runtime.checkpoint.snapshot.CapturedSnapshot`, the same
snapshot a checkpoint's sync phase takes, so the same upload writes it).
:func:`open_spark_checkpoint` reads one by the location's scheme: a local path (or
``file://``), or ``hdfs://`` through the runtime's Hadoop ``FileSystem`` capture of a
working directory (which needs a Spark session: its JVM holds the Hadoop client).

What a directory tells about its query: Spark writes ``offsets/<b>`` when it plans
batch ``b`` and ``commits/<b>`` when the batch is done; a running query keeps no lock
or heartbeat file in the directory. So an ``offsets`` entry newer than the last commit
means the query is inside that batch *or* was killed inside it: the files alone cannot
tell the two apart, and import refuses unless told the query is stopped.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
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
from airflow_ckpt.runtime.workdir import Workdir, location, modified_time, names
from airflow_ckpt.runtime.workdir.hadoop import HadoopWorkdir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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


class SparkCheckpoint:
    """A Spark checkpoint in a local directory (or a POSIX mount) or on HDFS, read and
    captured as the runtime reads and captures its own working directory
    (:mod:`airflow_ckpt.runtime.workdir`): a local one by hard links into a hidden
    staging directory beside it (same filesystem); an ``hdfs://`` one through the
    driver JVM's ``FileSystem``, pinned by an HDFS snapshot when the directory or an
    ancestor is snapshottable, else listed and copied, into a local staging directory."""

    def __init__(self, workdir: Workdir, clock: Clock = SYSTEM_CLOCK) -> None:
        self.workdir = workdir.absolute() if isinstance(workdir, Path) else workdir
        self.clock = clock  # only for the age of an uncommitted batch (shown)

    @property
    def uri(self) -> str:
        if isinstance(self.workdir, Path):
            return self.workdir.as_uri()
        return location(self.workdir)

    def logs(self) -> SparkLogs:
        where = location(self.workdir)
        try:
            entries = names(self.workdir, "")
        except (FileNotFoundError, NotADirectoryError):
            raise NotASparkCheckpointError(f"{where} is not a directory") from None
        qid = query_id(self.workdir)
        if not qid or "offsets" not in entries:
            raise NotASparkCheckpointError(
                f"{where} is not a Spark checkpoint directory: it has no "
                f"{'metadata file with a query id' if not qid else 'offsets/ log'} (give "
                "the query's checkpointLocation)")
        planned = latest_batch(self.workdir, "offsets")
        age = None
        if planned is not None:
            try:
                written = modified_time(self.workdir, f"offsets/{planned}")
                age = max(self.clock.time() - written, 0.0)
            except OSError:
                age = None
        return SparkLogs(qid, latest_batch(self.workdir, "commits"), planned, age)

    def _staging(self) -> Path:
        token = uuid.uuid4().hex[:8]
        if isinstance(self.workdir, Path):
            return self.workdir.parent / f".{self.workdir.name}.import-{token}"
        return self.workdir.local_root / f"import-{token}"

    def capture(self, batch_id: int) -> CapturedSnapshot:
        where = location(self.workdir)
        staging = self._staging()
        try:
            snap = capture(self.workdir, batch_id, staging)
        except CheckpointDeclinedError as exc:
            raise SparkCheckpointError(f"cannot capture batch {batch_id} of {where}: "
                                       f"{exc}") from exc
        except OSError as exc:
            raise SparkCheckpointError(
                f"cannot capture batch {batch_id} of {where} into {staging.parent} "
                f"({exc}); for a local checkpoint, the directory beside it must be "
                "writable and on the same filesystem (hard links)") from exc
        try:
            check_captured(where, snap)  # state written on other hosts' disks
        except CheckpointDeclinedError as exc:
            raise SparkCheckpointError(str(exc)) from exc
        return snap


#: the schemes of a Spark checkpoint import and export reach through Hadoop's
#: ``FileSystem`` in a driver JVM (the runtime's capture of a remote working directory)
HADOOP_SCHEMES = frozenset({"hdfs", "viewfs"})


def open_location(location: str, what: str,
                  spark: Callable[[], SparkSession]) -> Workdir:
    """``location`` as a working directory: a path or ``file://`` URI as a local path;
    an ``hdfs://`` (or ``viewfs://``) URI on the Hadoop ``FileSystem`` of the JVM of
    ``spark()`` (called only then: its Hadoop configuration, e.g. ``HADOOP_CONF_DIR``,
    resolves the name service), staging under the local temporary directory.

    :raises SparkCheckpointError: another scheme (``what`` says what failed)
    """
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(os.path.expanduser(unquote(parsed.path) if parsed.scheme else location))
    if parsed.scheme.lower() in HADOOP_SCHEMES:
        return HadoopWorkdir.of(spark(), location,
                                Path(tempfile.gettempdir()) / "airflow-ckpt-adopt")
    raise SparkCheckpointError(
        f"cannot {what} {location!r}: {parsed.scheme}:// is not a filesystem import and "
        "export reach (a local path, file://, hdfs:// or viewfs://). Go through one of "
        "those instead (e.g. copy the directory to a local disk)")


def open_spark_checkpoint(location: str,
                          spark: Callable[[], SparkSession]) -> SparkCheckpointDir:
    """The Spark checkpoint at ``location`` (see :func:`open_location`).

    :raises SparkCheckpointError: a scheme import cannot read
    """
    return SparkCheckpoint(open_location(location, "import from", spark))
