"""An exactly-once Parquet file sink whose executors write the data.

Layout under the table directory ``uri`` (``file://...`` or ``s3://bucket/prefix``)::

    part-<batch>-<n>.parquet          published files: what every plain reader reads
    _staging/<batch>/<attempt>/...    files the executors wrote for one attempt of a batch
    _txn/<batch>.json                 pre-commit record: the attempt and its staged files
    _committed/<batch>.json           commit decision (create-only): attempt + final names

Spark (``spark.read.parquet``), pyarrow datasets and pandas skip every path segment that
starts with ``_`` or ``.``, so staged, pending and aborted files are never read by them.
The two records are owned by :class:`~airflow_ckpt.runtime.sinks.transactions.SinkTransactions`
(compare-and-swap and create-only writes: a deposed driver's write that lands late never
changes a decision, see there).

* ``stage``: a fresh attempt id; the executors write the batch into
  ``_staging/<batch>/<attempt>/``. On S3 (no Hadoop s3a in the ``pyspark`` wheel)
  ``df.mapInArrow`` makes each task write its partition into a local Parquet file with
  pyarrow and upload it with boto3; the tasks return one row per file (name, bytes,
  rows), which is all the driver collects, and only the files of *successful* task
  attempts are listed. On ``file://`` Spark's own Parquet writer writes the staging
  directory (no JVM -> Python hop; Hadoop's commit protocol keeps only successful task
  attempts' files) and the driver reads the footers for the row counts. Either way a
  retried or speculative task never adds a second copy. The driver then records the
  attempt in ``_txn/<batch>.json`` (``pre_commit``), superseding an earlier attempt.
* ``commit``: writes ``_committed/<batch>.json`` create-only (the atomic decision: the
  first attempt recorded there is the one published, ever), copies its staged files to
  ``part-<batch>-<n>.parquet`` (names fixed by the record, so re-running a commit
  rewrites the same objects with the same bytes), then deletes the attempt's staging,
  the ``_txn`` record and the attempt's outcome in one request (other attempts of the
  batch are left to the next recovery's sweep; ``runtime/sinks/staged.py``). A
  replayed batch whose decision exists is never published again: it is skipped if it
  read the source offsets the decision recorded (exactly once). One that
  read others is refused with ``SinkReplayMismatchError`` under EXACTLY_ONCE (its staging
  is deleted, the published files are kept); under AT_LEAST_ONCE it is published as extra
  output, a transaction of its own (``_txn/<batch>.<tag>.json``,
  ``_committed/<batch>.<tag>.json``, files ``part-<batch>.<tag>-<n>.parquet``).
* ``abort``: marks the record aborted and deletes ``_staging/<batch>/``. If a decision
  exists the batch is already (partly) visible, so abort rolls the commit forward.

A plain reader sees the files of a batch appear one by one while ``commit`` copies them
(and, after a crash mid-commit, the rest when recovery commits again). Readers that
need whole batches atomically read :meth:`ParquetSink.committed_files`.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_ckpt.errors import CorruptCheckpointError, ObjectNotFoundError
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.sinks.staged import StagedSink
from airflow_ckpt.runtime.sinks.transactions import SinkTransactions, Transaction
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.factory import open_storage
from airflow_ckpt.runtime.storage.fenced import FencedStorage
from airflow_ckpt.runtime.storage.local import LocalStorage, fsync_dir

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger("airflow_ckpt.sinks")

#: schema of the rows each task returns to the driver (one per file it wrote)
FILE_LIST_SCHEMA = "name string, size long, rows long"

# One storage per (uri, options) in each Python worker process: a boto3 client is
# expensive to build and Spark reuses its Python workers across tasks.
_EXECUTOR_STORAGES: dict[str, CheckpointStorage] = {}
_EXECUTOR_LOCK = threading.Lock()


def _executor_storage(uri: str, options: dict[str, Any]) -> CheckpointStorage:
    cache_key = json.dumps([uri, options], sort_keys=True, default=str)
    with _EXECUTOR_LOCK:
        storage = _EXECUTOR_STORAGES.get(cache_key)
        if storage is None:
            storage = _EXECUTOR_STORAGES[cache_key] = open_storage(uri, **options)
        return storage


#: rows buffered per Parquet row group (row groups of Spark's 10k-row Arrow batches
#: would make writing and reading slow)
ROW_GROUP_ROWS = 1 << 20

#: rows per Arrow batch handed to the writing tasks (Spark's default is 10,000: at a
#: million rows per batch the per-batch JVM -> Python overhead costs 10-20 % of the sink's
#: wall time); the buffer of one row group bounds a task's memory either way
ARROW_BATCH_ROWS = 1 << 18
_ARROW_BATCH_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"


def _write_parquet(batches: Iterator[pa.RecordBatch], path: str, compression: str) -> int:
    """Write the batches into one Parquet file at ``path``; return the row count (0 and
    no file when there was no row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    rows = 0
    buffered: list[pa.RecordBatch] = []
    pending = 0

    def flush() -> None:
        nonlocal writer, pending
        if not buffered:
            return
        table = pa.Table.from_batches(buffered)
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema, compression=compression)
        writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        buffered.clear()
        pending = 0

    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            buffered.append(batch)
            pending += batch.num_rows
            rows += batch.num_rows
            if pending >= ROW_GROUP_ROWS:
                flush()
        flush()
    finally:
        if writer is not None:
            writer.close()
    return rows


def _local_path(storage: CheckpointStorage, key: str) -> Path | None:
    """Where ``key`` lives if ``storage`` is a local directory (None for S3)."""
    base = storage.inner if isinstance(storage, FencedStorage) else storage
    if isinstance(base, LocalStorage):
        return base.root.joinpath(*key.split("/"))
    return None


def _partition_writer(uri: str, options: dict[str, Any], prefix: str, compression: str) -> Any:
    """S3: the ``mapInArrow`` function run by every task (pickled: only plain values
    captured): pyarrow writes the partition into a local file that boto3 uploads."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx is not None else 0
        task = ctx.taskAttemptId() if ctx is not None else 0
        name = f"part-{part:05d}-{task}.parquet"
        storage = _executor_storage(uri, options)
        fd, tmp = tempfile.mkstemp(prefix="airflow-ckpt-", suffix=".parquet")
        os.close(fd)
        try:
            rows = _write_parquet(batches, tmp, compression)
            if rows == 0:
                return
            size = os.path.getsize(tmp)
            storage.upload_file(Path(tmp), prefix + name)
        finally:
            os.unlink(tmp)
        yield pa.RecordBatch.from_pydict(
            {"name": [name], "size": [size], "rows": [rows]},
            schema=pa.schema([("name", pa.string()), ("size", pa.int64()), ("rows", pa.int64())]),
        )

    return write


def _write_with_spark(df: DataFrame, directory: Path,
                      compression: str) -> tuple[list[dict[str, Any]], float]:
    """``file://``: the batch written by Spark's own Parquet writer on the executors (no
    JVM -> Python hop) into the fresh staging ``directory``. Hadoop's commit protocol
    moves only the files of successful task attempts there; a retried or speculative
    task never adds a second copy. The driver then reads each file's footer for its row
    count (file lists, never rows), drops empty files and makes the rest durable.
    Returns the files and the seconds Spark's write took."""
    import pyarrow.parquet as pq

    started = time.perf_counter()
    df.write.option("compression", compression).parquet(directory.as_uri())
    write_s = time.perf_counter() - started
    files: list[dict[str, Any]] = []
    for path in sorted(directory.glob("part-*.parquet")):
        rows = pq.read_metadata(path).num_rows
        if rows == 0:  # Spark writes a schema-only file for an empty batch
            path.unlink()
            continue
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
        files.append({"name": path.name, "size": path.stat().st_size, "rows": rows})
    fsync_dir(directory)
    return files, write_s


def _collect_with_arrow_batches(df: DataFrame, rows: int) -> list[Any]:
    """``df.collect()`` with Spark's Arrow batch size set to ``rows`` on ``df``'s
    session for the duration (the physical plan reads it when ``collect`` plans)."""
    conf = df.sparkSession.conf
    previous = conf.get(_ARROW_BATCH_CONF, None)
    conf.set(_ARROW_BATCH_CONF, str(rows))
    try:
        return df.collect()
    finally:
        if previous is None:
            conf.unset(_ARROW_BATCH_CONF)
        else:
            conf.set(_ARROW_BATCH_CONF, previous)


@dataclass(frozen=True, slots=True)
class StagedBatch:
    """What :meth:`ParquetSink.stage` did for one batch (``ParquetSink.last_stage``)."""

    batch_id: int
    files: int
    rows: int
    bytes: int
    #: seconds the driver waited for the executors' write (Spark's job, planning included)
    write_s: float
    #: seconds of the driver's own work after it: row counts, fsync, the pre-commit record
    record_s: float


class ParquetSink(StagedSink):
    """Exactly-once Parquet output written by the executors (see the module docstring).

    :param uri: the table directory, ``file:///abs/path`` or ``s3://bucket/prefix``
    :param compression: Parquet codec (pyarrow's names: ``snappy``, ``zstd``, ``none``...)
    :param max_workers: parallel copies on the driver during ``commit``
    :param arrow_batch_rows: rows per Arrow batch the writing tasks receive, set on
        the micro-batch's session while the batch is staged (a streaming query runs on
        its own clone of the session, so other queries are not affected)
    :param s3_options: :class:`~airflow_ckpt.runtime.storage.options.S3Options` fields;
        they are shipped to the executors, which otherwise resolve endpoint and
        credentials from their environment (``AWS_*`` variables...) as the runtime does
    """

    def __init__(self, uri: str, *, compression: str = "snappy", max_workers: int = 8,
                 arrow_batch_rows: int = ARROW_BATCH_ROWS, **s3_options: Any) -> None:
        self.uri = uri.rstrip("/")
        self.staging_root = "_staging/"
        self.attempt_suffix = "/"
        self.compression = compression
        self.arrow_batch_rows = max(1, arrow_batch_rows)
        self.max_workers = max(1, max_workers)
        self._options = dict(s3_options)
        self.storage = open_storage(self.uri, **self._options)
        self.transactions = SinkTransactions(self.storage, name=repr(self))
        self._lock = threading.Lock()
        #: the last batch :meth:`stage` recorded, for monitoring (None before the first)
        self.last_stage: StagedBatch | None = None

    def __repr__(self) -> str:
        return f"ParquetSink({self.uri!r})"

    def fence(self, gate: Callable[[], None],
              confirm: Callable[[], None] = lambda: None) -> None:
        """Gate the driver's commit decisions, publishing and clean-up with the job's
        lease, and confirm the lease before each decision (executors only write staging
        files, which nothing publishes unfenced)."""
        if not isinstance(self.storage, FencedStorage):
            self.storage = FencedStorage(self.storage, gate)
        self.transactions = SinkTransactions(self.storage, "", confirm, repr(self))

    # ------------------------------------------------------------------ keys

    @staticmethod
    def part_key(batch_id: int, n: int, replay: str = "") -> str:
        """File ``n`` published for the batch (``replay``: for its extra publication)."""
        tag = f".{replay}" if replay else ""
        return f"part-{batch_id:012d}{tag}-{n:05d}.parquet"

    # ------------------------------------------------------------------ protocol

    def stage(self, df: DataFrame, batch_id: int) -> None:
        """Executors write the batch into a fresh staging attempt; the driver records
        the file list (never rows)."""
        started = time.perf_counter()
        attempt = uuid.uuid4().hex[:16]
        prefix = self._staging(batch_id, attempt)
        directory = _local_path(self.storage, prefix)
        if directory is not None:
            files, write_s = _write_with_spark(df, directory, self.compression)
        else:
            writer = _partition_writer(self.uri, self._options, prefix, self.compression)
            files = [r.asDict() for r in _collect_with_arrow_batches(
                df.mapInArrow(writer, FILE_LIST_SCHEMA), self.arrow_batch_rows)]
            write_s = time.perf_counter() - started
        interleave.point(interleave.SINK_STAGED_BEFORE_RECORD)
        self._record_files(batch_id, attempt, files)
        self.last_stage = StagedBatch(
            batch_id, len(files), sum(f["rows"] for f in files), sum(f["size"] for f in files),
            write_s, time.perf_counter() - started - write_s)
        log.debug("batch %d staged: %s", batch_id, self.last_stage)

    def pre_commit(self, batch_id: int, rows: Sequence[dict[str, Any]]) -> None:
        """Driver-side staging of a small batch of rows (one Parquet file)."""
        import pyarrow as pa

        attempt = uuid.uuid4().hex[:16]
        files: list[dict[str, Any]] = []
        if rows:
            table = pa.Table.from_pylist(list(rows))
            fd, tmp = tempfile.mkstemp(prefix="airflow-ckpt-", suffix=".parquet")
            os.close(fd)
            try:
                _write_parquet(iter(table.to_batches()), tmp, self.compression)
                name = "part-00000-0.parquet"
                self.storage.upload_file(Path(tmp), self._staging(batch_id, attempt) + name)
                files.append({"name": name, "size": os.path.getsize(tmp), "rows": len(rows)})
            finally:
                os.unlink(tmp)
        self._record_files(batch_id, attempt, files)

    def _record_files(self, batch_id: int, attempt: str, files: list[dict[str, Any]]) -> None:
        files.sort(key=lambda f: f["name"])
        self._record(Transaction(batch_id, attempt, "staged", {"files": files},
                                 self.batch_offsets(batch_id)))
        log.debug("batch %d staged: attempt %s, %d files", batch_id, attempt, len(files))

    def _describe(self, txn: Transaction) -> dict[str, Any]:
        """The commit decision for a staged transaction (a pure function of it)."""
        staging = self._staging(txn.batch, txn.attempt)
        return {
            "batch": txn.batch,
            "attempt": txn.attempt,
            "files": [
                {"staged": staging + f["name"], "final": self.part_key(txn.batch, n, txn.replay),
                 "size": f["size"], "rows": f["rows"]}
                for n, f in enumerate(txn.payload["files"])
            ],
        }

    def _publish(self, batch_id: int, replay: str, decision: dict[str, Any]) -> None:
        def one(entry: dict[str, Any]) -> None:
            interleave.point(interleave.SINK_BEFORE_PUBLISH_FILE)
            staged = _local_path(self.storage, entry["staged"])
            final = _local_path(self.storage, entry["final"])
            try:
                if staged is not None and final is not None:
                    # file://: an atomic rename, no second write of the data
                    if isinstance(self.storage, FencedStorage):
                        self.storage.gate()
                    try:
                        os.replace(staged, final)
                    except FileNotFoundError:
                        raise ObjectNotFoundError(entry["staged"]) from None
                else:
                    self.storage.copy(entry["staged"], entry["final"])
            except ObjectNotFoundError:
                # Published by an earlier commit whose clean-up removed the staging.
                if not self.storage.exists(entry["final"]):
                    raise CorruptCheckpointError(
                        f"{self.uri}: batch {decision['batch']} was committed but neither "
                        f"its staged file {entry['staged']} nor its published file "
                        f"{entry['final']} exists; the table directory was modified "
                        "outside the sink"
                    ) from None

        files = decision["files"]
        if not files:
            return
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(files))) as pool:
            for future in [pool.submit(one, e) for e in files]:
                future.result()
        published = _local_path(self.storage, files[0]["final"])
        if published is not None:  # make the renames durable
            fsync_dir(published.parent)

    # ------------------------------------------------------------------ readers

    def committed_batches(self) -> list[int]:
        """Batch ids with a commit decision, ascending."""
        return self.transactions.committed_batches()

    def committed_files(self) -> list[str]:
        """Keys (relative to :attr:`uri`) of every published file, batch by batch (a
        batch's extra publications after it): what a reader that wants whole batches
        only reads."""
        keys: list[str] = []
        for batch_id, replay in self.transactions.decisions():
            decision = self.transactions.decision(batch_id, replay)
            if decision is not None:
                keys.extend(f["final"] for f in decision["files"])
        return keys
