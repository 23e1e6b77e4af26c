"""``airflow-ckpt import``: a stopped Spark query's own checkpoint becomes a savepoint.

The last committed batch ``b`` of the query's checkpoint directory is captured, uploaded
and described exactly as a running job's savepoint is (the same capture, upload and
manifest; a savepoint is self-contained, one object per file, never in ``shared/``), so a
``CheckpointedJob`` restores it like any savepoint (``restore=<savepoint>``) and its
query's next batch is ``b + 1``: nothing is processed again.

Order of writes (the contract a savepoint's readers rely on):

1. the files, under ``savepoints/sp-<id>/import-<token>/`` (a random token: the importer
   holds no lease and reserves no ids, see :meth:`UploadTarget.imported`);
2. verification: every file is read back from the storage and checked against the
   manifest (size and SHA-256), before anything names it;
3. the completion marker ``savepoints/sp-<id>/_metadata``, last and create-only: an
   existing savepoint of that id is never replaced (whoever lands first wins; the
   other import fails and removes its files);
4. a ``savepoint_completed`` history event with ``imported_from`` (the UI and
   ``airflow-ckpt history`` show where the savepoint came from).

A failure before step 3 removes what the import uploaded; a crash leaves an incomplete
``sp-<id>/`` (no ``_metadata``: never restored; ``airflow-ckpt dispose --force``).
"""

from __future__ import annotations

import logging
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from airflow_ckpt.errors import (
    NotASparkCheckpointError,
    SavepointError,
    SparkQueryRunningError,
    StorageError,
)
from airflow_ckpt.runtime.adopt.spark_dir import SparkCheckpointDir, SparkLogs
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.checkpoint.digests import DigestCache
from airflow_ckpt.runtime.checkpoint.failures import CheckpointFailureReason
from airflow_ckpt.runtime.checkpoint.marker import write_marker
from airflow_ckpt.runtime.checkpoint.metadata import Manifest, Timings
from airflow_ckpt.runtime.checkpoint.snapshot import CapturedSnapshot
from airflow_ckpt.runtime.checkpoint.store import SharedFileRegistry
from airflow_ckpt.runtime.checkpoint.upload import UploadResult, UploadTarget, upload_snapshot
from airflow_ckpt.runtime.clock import SYSTEM_CLOCK, Clock, IdSource, random_id
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.lease.record import read_lease
from airflow_ckpt.runtime.restore.materialize import materialize
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout, validate_savepoint_id

log = logging.getLogger("airflow_ckpt.import")

#: the Spark version of an imported checkpoint: its logs do not record it
UNKNOWN_SPARK_VERSION = "unknown (imported)"
#: the manifest field ``extra`` key (and history field) naming the imported directory
IMPORTED_FROM = "imported_from"


@dataclass(frozen=True, slots=True)
class ImportedSavepoint:
    """A completed import: the savepoint's manifest and its directory's URI."""

    manifest: Manifest
    uri: str
    source: str


def default_savepoint_id(query_id: str, batch_id: int) -> str:
    """``spark-<first 8 of the query id>-b<batch>``: the same for the same batch of the
    same query, so importing it twice is refused instead of storing it twice."""
    return f"spark-{query_id.replace('-', '')[:8]}-b{batch_id}"


def refuse_running(source: SparkCheckpointDir, logs: SparkLogs) -> None:
    """Raise ``SparkQueryRunningError`` when a batch is planned and not committed (see
    :mod:`airflow_ckpt.runtime.adopt.spark_dir`: the files cannot tell a running query
    from one killed inside the batch)."""
    batch = logs.uncommitted
    if batch is None:
        return
    age = "" if logs.planned_age_s is None else f", written {logs.planned_age_s:.0f} s ago"
    last = "none" if logs.committed is None else f"batch {logs.committed}"
    raise SparkQueryRunningError(
        f"{source.uri}: batch {batch} is planned (offsets/{batch}{age}) but not committed "
        f"(last commit: {last}): its query seems to be running. Stop the query "
        "(query.stop()) and import again. A query killed inside that batch leaves the "
        "same files: if it is stopped for sure, import with --allow-uncommitted-batch "
        f"(batch {logs.committed} is imported; the query plans batch {batch} again)")


def import_spark_checkpoint(
    storage: CheckpointStorage,
    job: str,
    source: SparkCheckpointDir,
    savepoint_id: str | None = None,
    *,
    allow_uncommitted: bool = False,
    history: JobHistory | None = None,
    upload_threads: int = 8,
    timeout_s: float = 3600.0,
    clock: Clock = SYSTEM_CLOCK,
    ids: IdSource = random_id,
) -> ImportedSavepoint:
    """Turn ``source``'s last committed batch into savepoint ``savepoint_id`` of ``job``
    (default: :func:`default_savepoint_id`).

    Durable on return: the savepoint's files, verified against its manifest, its
    ``_metadata`` and the ``savepoint_completed`` event (see the module doc for the
    order).

    :raises NotASparkCheckpointError: ``source`` is no Spark checkpoint, or has no
        committed batch
    :raises SparkQueryRunningError: a batch is planned and not committed (unless
        ``allow_uncommitted``)
    :raises SavepointError: ``job`` has a savepoint ``savepoint_id`` already
    :raises SparkCheckpointError: the batch cannot be captured (state on other hosts,
        files gone)
    """
    layout = JobLayout(job)
    if savepoint_id is not None:
        validate_savepoint_id(savepoint_id)
    logs = source.logs()
    if logs.committed is None:
        raise NotASparkCheckpointError(
            f"{source.uri}: no batch was ever committed (commits/ is empty): there is no "
            "state to import; start the job from scratch instead")
    if not allow_uncommitted:
        refuse_running(source, logs)
    savepoint_id = savepoint_id or default_savepoint_id(logs.query_id, logs.committed)
    marker_key = layout.savepoint_metadata(savepoint_id)
    if storage.exists(marker_key):
        raise SavepointError(_exists(job, savepoint_id))
    catalog = CheckpointCatalog(storage, job)
    checkpoint_id = catalog.first_free_id(read_lease(storage, job))
    target = UploadTarget.imported(checkpoint_id, savepoint_id, ids()[:12])
    uri = storage.uri.rstrip("/") + "/" + layout.savepoint_dir(savepoint_id).rstrip("/")
    trigger_ts, start = clock.time(), clock.monotonic()
    snap = source.capture(logs.committed)
    try:
        sync_ms = int((clock.monotonic() - start) * 1000)
        try:
            manifest = _upload_and_verify(storage, layout, savepoint_id, snap, target, logs,
                                          trigger_ts=trigger_ts, sync_ms=sync_ms,
                                          source=source.uri, threads=upload_threads,
                                          deadline=clock.monotonic() + timeout_s, clock=clock)
            failure = write_marker(storage, marker_key, manifest.to_json(), job=job,
                                   confirm=lambda: None)  # no lease: nothing to confirm
        except BaseException:
            storage.delete_prefix(layout.root + target.dir_key)
            raise
    finally:
        snap.discard()
    if failure is not None:
        if failure.reason is CheckpointFailureReason.CONCURRENT_DRIVER:
            storage.delete_prefix(layout.root + target.dir_key)  # ours alone; never named
            raise SavepointError(_exists(job, savepoint_id))
        raise failure.error
    log.info("imported %s batch %d as %s (%d files, %d bytes)", source.uri, manifest.batch_id,
             uri, len(manifest.files), manifest.state_size)
    try:
        (history or JobHistory(storage, job)).append(
            ev.SAVEPOINT_COMPLETED, path=uri, **{IMPORTED_FROM: source.uri},
            **manifest.history_entry())
    except StorageError as exc:
        raise StorageError(f"the savepoint {uri} is complete and restorable, but its "
                           f"savepoint_completed event could not be recorded: {exc}") from exc
    return ImportedSavepoint(manifest, uri, source.uri)


def _exists(job: str, savepoint_id: str) -> str:
    return (f"job {job!r} has a savepoint {savepoint_id!r} already, and a savepoint is never "
            "replaced: choose another --savepoint-name, or dispose of the old one first "
            "(airflow-ckpt dispose)")


def _upload_and_verify(storage: CheckpointStorage, layout: JobLayout, savepoint_id: str,
                       snap: CapturedSnapshot,
                       target: UploadTarget, logs: SparkLogs, *, trigger_ts: float,
                       sync_ms: int, source: str, threads: int, deadline: float,
                       clock: Clock) -> Manifest:
    """Upload ``snap`` (durable on return), describe it, and read every file back against
    the description (``CorruptCheckpointError`` naming the first that differs)."""
    start = clock.monotonic()
    acked: set[str] = set()
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        result = upload_snapshot(
            storage, layout, snap, target, executor=pool, digests=DigestCache(),
            shared=SharedFileRegistry(), deadline=deadline, on_ack=acked.add,
            cancelled=threading.Event(), clock=clock)
    manifest = _manifest(layout.job, savepoint_id, target, snap, result, logs, len(acked),
                         source,
                         trigger_ts=trigger_ts, sync_ms=sync_ms,
                         async_ms=int((clock.monotonic() - start) * 1000), clock=clock)
    with tempfile.TemporaryDirectory(prefix="airflow-ckpt-import-") as tmp:
        materialize(storage, manifest, layout.root, Path(tmp), only_needed=False)
    return manifest


def _manifest(job: str, savepoint_id: str, target: UploadTarget, snap: CapturedSnapshot,
              result: UploadResult, logs: SparkLogs, acked: int, source: str, *,
              trigger_ts: float, sync_ms: int, async_ms: int, clock: Clock) -> Manifest:
    completed = clock.time()
    return Manifest(
        job=job,
        checkpoint_id=target.checkpoint_id,
        kind="savepoint",
        trigger="manual",
        spark_version=UNKNOWN_SPARK_VERSION,
        query_id=logs.query_id,
        mode=CheckpointConfig().mode,
        num_acknowledged_subtasks=acked,
        timings=Timings.measured(trigger_ts=trigger_ts, barrier_ts=trigger_ts,
                                 completed_ts=completed, sync_ms=sync_ms, async_ms=async_ms),
        **result.manifest_fields(snap),
        savepoint_id=savepoint_id,
        extra={IMPORTED_FROM: source},
    )
