"""A Spark working directory on a Hadoop ``FileSystem`` (``hdfs://``), through the
driver's JVM (py4j), the same client Spark's ``CheckpointFileManager`` writes with.

On a multi-host cluster without a shared POSIX mount the executors write their state
store files to HDFS, where the driver reads them. The sync phase of a checkpoint
captures batch ``b`` as follows:

* **snapshottable** (the working directory or an ancestor, ``hdfs dfsadmin
  -allowSnapshot``): ``createSnapshot`` pins the whole tree in O(1) on the NameNode, the
  exact analogue of the local hard links: nothing Spark's maintenance deletes afterwards
  is lost to the capture. The files of batch ``b`` are copied from
  ``<root>/.snapshot/<name>/...`` into the local staging directory, then the snapshot is
  deleted. A missing file there is an error (the snapshot cannot lose one). A driver
  killed between the two leaves its snapshot behind (it pins the blocks of every file
  Spark deletes afterwards); the names carry a tag of the working directory, and a
  driver's first capture deletes every snapshot of its working directory left by
  another (captures run only in the lease holder, so those belong to dead or deposed
  drivers; a deposed one's capture then fails, which costs it nothing it could keep);
* **otherwise** the live directory is listed and each file of batch ``b`` copied; a file
  Spark's maintenance deleted between the listing and its copy is skipped, like a
  vanished hard link (Spark purges only versions older than those needed to resume the
  newest batches), and what the snapshot cannot do without is checked afterwards
  (:func:`~airflow_ckpt.runtime.checkpoint.snapshot.captured_snapshot`).

Either way the staged copy is local and immutable, so hashing and upload (the async
phase) and the state check (``workdir_check``) are the local path's, unchanged. Restore
materialises locally, copies the tree next to the working directory on HDFS and renames
it into place (HDFS renames are atomic).
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_ckpt.errors import CheckpointDeclinedError
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.checkpoint.snapshot import (
    CapturedFile,
    CapturedSnapshot,
    captured_snapshot,
    hidden,
    wanted,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_NOT_FOUND = ("java.io.FileNotFoundException",
              "org.apache.hadoop.fs.PathNotFoundException")
#: prefix of the snapshots the capture takes (deleted once copied)
SNAPSHOT_PREFIX = "airflow-ckpt-"
#: files one capture copies at once: each copy is a few round trips (NameNode, DataNode,
#: py4j) and little work, so they overlap well (py4j gives each thread its connection)
COPY_THREADS = 8


def _not_found(exc: BaseException) -> bool:
    java = getattr(exc, "java_exception", None)
    return java is not None and java.getClass().getName() in _NOT_FOUND


class HadoopWorkdir:
    """The working directory ``location`` (a URI, e.g. ``hdfs://nn:8020/jobs/j/work``)
    on the Hadoop ``FileSystem`` of the driver JVM ``jvm`` configured by
    ``hadoop_conf``; captures and restores are staged under the local ``local_root``.
    A capture copies up to ``copy_threads`` files at once."""

    def __init__(self, location: str, local_root: Path, jvm: Any, hadoop_conf: Any,
                 copy_threads: int = COPY_THREADS) -> None:
        if copy_threads < 1:
            raise ValueError(f"copy_threads must be at least 1, not {copy_threads}")
        self.location = location.rstrip("/")
        self.copy_threads = copy_threads
        self.local_root = local_root
        self._jvm = jvm
        self._path = jvm.org.apache.hadoop.fs.Path
        self._fs = self._path(self.location).getFileSystem(hadoop_conf)
        #: the qualified URI of ``location`` (how the FileSystem names what it lists)
        self._qualified = self._fs.makeQualified(self._path(self.location)).toString()
        #: how this working directory's snapshots are named (others may share the root)
        self.snapshot_prefix = (
            SNAPSHOT_PREFIX + hashlib.sha256(self._qualified.encode()).hexdigest()[:8] + "-")
        #: False until this driver's first snapshot: the leftovers are deleted then
        self._swept = False

    @classmethod
    def of(cls, spark: SparkSession, location: str, local_root: Path,
           copy_threads: int = COPY_THREADS) -> HadoopWorkdir:
        """On ``spark``'s JVM and Hadoop configuration (what its queries use)."""
        return cls(location, local_root, spark._jvm,
                   spark._jsc.hadoopConfiguration(), copy_threads)

    def _local(self, path: Path) -> Any:
        """The Hadoop ``Path`` of a local file. Never from ``Path.as_uri()``: Hadoop's
        ``Path(String)`` does not decode, so a space there (``%20``) named another file."""
        return self._path(f"file://{path.resolve()}")

    def _at(self, rel: str) -> Any:
        return self._path(f"{self.location}/{rel}" if rel else self.location)

    def names(self, rel: str) -> list[str]:
        try:
            statuses = self._fs.listStatus(self._at(rel))
        except Exception as exc:
            if _not_found(exc):
                raise FileNotFoundError(f"{self.location}/{rel}") from exc
            raise
        return [s.getPath().getName() for s in statuses]

    def read_bytes(self, rel: str) -> bytes:
        try:
            stream = self._fs.open(self._at(rel))
        except Exception as exc:
            if _not_found(exc):
                raise FileNotFoundError(f"{self.location}/{rel}") from exc
            raise
        try:
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def modified_time(self, rel: str) -> float:
        try:
            return int(self._fs.getFileStatus(self._at(rel)).getModificationTime()) / 1000
        except Exception as exc:
            if _not_found(exc):
                raise FileNotFoundError(f"{self.location}/{rel}") from exc
            raise

    def exists(self, rel: str) -> bool:
        return bool(self._fs.exists(self._at(rel)))

    def snapshot_root(self) -> Any | None:
        """The snapshottable directory holding the working directory (itself or its
        nearest snapshottable ancestor), as a Hadoop ``Path``; None if there is none.
        The filesystem root does not count: HDFS marks it snapshottable with a quota of
        0 snapshots."""
        path = self._fs.makeQualified(self._path(self.location))
        while path is not None and not path.isRoot():
            try:
                if self._fs.getFileStatus(path).isSnapshotEnabled():
                    return path
            except Exception as exc:
                if not _not_found(exc):
                    raise
            path = path.getParent()
        return None

    def capture(self, batch_id: int, staging_dir: Path) -> CapturedSnapshot:
        """Copy the files of the snapshot at batch ``batch_id`` into the local
        ``staging_dir`` (which must not exist), pinned by an HDFS snapshot when the
        directory is snapshottable (see the module docstring). Declines
        (``CheckpointDeclinedError``) if ``commits/<batch_id>`` is missing or a file the
        snapshot cannot do without vanished; on any error ``staging_dir`` is removed."""
        if not self.exists(f"commits/{batch_id}"):
            raise CheckpointDeclinedError(f"batch {batch_id} is not committed")
        staging_dir.mkdir(parents=True)
        try:
            root = self.snapshot_root()
            if root is None:
                files = self._copy(self._qualified, batch_id, staging_dir, pinned=False)
            else:
                if not self._swept:
                    self.delete_leftover_snapshots(root)
                name = f"{self.snapshot_prefix}{staging_dir.name}-{uuid.uuid4().hex[:6]}"
                pinned = self._fs.createSnapshot(root, name)
                try:
                    below = self._qualified[len(root.toString().rstrip("/")):]
                    source = self._fs.makeQualified(pinned).toString() + below
                    files = self._copy(source, batch_id, staging_dir, pinned=True)
                finally:
                    self._fs.deleteSnapshot(root, name)
            return captured_snapshot(staging_dir, batch_id, files, staging_dir)
        except BaseException:
            shutil.rmtree(staging_dir, ignore_errors=True)
            raise

    def delete_leftover_snapshots(self, root: Any) -> list[str]:
        """Delete the snapshots of this working directory under the snapshottable
        ``root`` that a killed driver left (see the module docstring); returns their
        names. Call it only while holding the job's lease."""
        try:
            statuses = self._fs.listStatus(self._path(f"{root.toString()}/.snapshot"))
        except Exception as exc:
            if not _not_found(exc):
                raise
            statuses = []
        names = [s.getPath().getName() for s in statuses]
        left = sorted(n for n in names if n.startswith(self.snapshot_prefix))
        for name in left:
            try:
                self._fs.deleteSnapshot(root, name)
            except Exception:
                if self._fs.exists(self._path(f"{root.toString()}/.snapshot/{name}")):
                    raise  # not deleted meanwhile by its own (deposed) capture
        self._swept = True
        return left

    def _copy(self, source: str, batch_id: int, staging_dir: Path,
              *, pinned: bool) -> list[CapturedFile]:
        """List ``source`` recursively and copy each file of the snapshot of
        ``batch_id`` to ``staging_dir`` (:attr:`copy_threads` at once); unless
        ``pinned``, a file deleted since the listing is skipped."""
        try:
            wanted_files: list[tuple[Any, str, tuple[str, ...], str, bool]] = []
            listing = self._fs.listFiles(self._path(source), True)
            while listing.hasNext():
                src = listing.next().getPath()
                rel = src.toString()[len(source) + 1:]
                parts = tuple(rel.split("/"))
                if any(p.startswith(".") for p in parts[:-1]) or hidden(parts[-1]):
                    continue
                include, subtask, is_state = wanted(parts, batch_id)
                if include:
                    wanted_files.append((src, rel, parts, subtask, is_state))

            def copy_one(item: tuple[Any, str, tuple[str, ...], str, bool]
                         ) -> CapturedFile | None:
                src, rel, parts, subtask, is_state = item
                dst = staging_dir.joinpath(*parts)
                dst.parent.mkdir(parents=True, exist_ok=True)
                interleave.point(interleave.CAPTURE_BEFORE_LINK)
                try:
                    self._fs.copyToLocalFile(False, src, self._local(dst), True)
                except Exception as exc:
                    if pinned or not _not_found(exc):
                        raise
                    return None  # purged by Spark's maintenance since it was listed
                return CapturedFile(rel, dst, dst.stat().st_size, subtask, is_state)

            workers = max(1, min(self.copy_threads, len(wanted_files)))
            with ThreadPoolExecutor(workers, thread_name_prefix="hdfs-capture") as pool:
                return [f for f in pool.map(copy_one, wanted_files) if f is not None]
        except Exception as exc:
            if not pinned and _not_found(exc):  # a listed directory was purged
                raise CheckpointDeclinedError(
                    f"the working directory changed under the capture of batch {batch_id} "
                    f"({exc}); allow HDFS snapshots on it to pin it") from exc
            raise

    def reset(self) -> None:
        self._fs.delete(self._path(self.location), True)

    def replace_with(self, local_dir: Path) -> None:
        """Copy ``local_dir`` beside the working directory (:attr:`copy_threads` files at
        once), then rename it into place; ``local_dir`` is removed."""
        name = f"{self.location}.restore-{uuid.uuid4().hex[:6]}"
        beside = self._path(name)
        found = sorted(local_dir.rglob("*"))
        files = [p for p in found if p.is_file()]

        def copy_one(file: Path) -> None:
            rel = file.relative_to(local_dir).as_posix()
            self._fs.copyFromLocalFile(False, True, self._local(file), self._path(f"{name}/{rel}"))

        try:
            self._fs.mkdirs(beside)
            for directory in (p for p in found if p.is_dir() and not any(p.iterdir())):
                self._fs.mkdirs(self._path(f"{name}/{directory.relative_to(local_dir).as_posix()}"))
            workers = max(1, min(self.copy_threads, len(files)))
            with ThreadPoolExecutor(workers, thread_name_prefix="hdfs-restore") as pool:
                list(pool.map(copy_one, files))
            self.reset()
            if not self._fs.rename(beside, self._path(self.location)):
                raise OSError(f"could not rename {beside.toString()} to {self.location}")
        finally:
            self._fs.delete(beside, True)
            shutil.rmtree(local_dir, ignore_errors=True)
