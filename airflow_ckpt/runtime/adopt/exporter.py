"""``airflow-ckpt export``: a checkpoint or savepoint as a plain Spark checkpoint directory.

The files of a manifest are Spark's own, captured from its working directory (logs up
to batch ``b``, state up to version ``b + 1``), so materialising them is the whole
export: plain Spark started with the directory as its ``checkpointLocation`` resumes at
batch ``b + 1`` with the same state and source offsets, no airflow-ckpt involved. The
files are downloaded and verified into a hidden directory beside the target (for an
``hdfs://`` target: a local one, then copied beside the target on HDFS) and renamed into
place: the target either is the whole checkpoint or stays as it was.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from airflow_ckpt.errors import SparkCheckpointError
from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.runtime.restore.materialize import materialize
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout
from airflow_ckpt.runtime.workdir import Workdir, location, names, restore_dir


@dataclass(frozen=True, slots=True)
class ExportedCheckpoint:
    """Where an export went (the target's location) and what it holds."""

    location: str
    batch_id: int
    num_files: int


def export_checkpoint(storage: CheckpointStorage, manifest: Manifest,
                      target: Workdir) -> ExportedCheckpoint:
    """Write ``manifest``'s checkpoint as a plain Spark checkpoint directory at ``target``
    (a local directory, or one on HDFS: see :func:`..spark_dir.open_location`).

    Durable on return: every file Spark reads to resume at batch
    ``manifest.batch_id + 1``, verified (size and SHA-256) against the manifest. The
    files are materialised locally first (beside a local target; under an HDFS target's
    local staging root, then copied beside the target on HDFS) and renamed into place.

    :raises SparkCheckpointError: ``target`` exists and is not an empty directory, or the
        manifest covers no batch (an initial checkpoint of a query that never ran one)
    :raises CorruptCheckpointError: a stored file is missing or damaged (nothing is
        left at ``target``)
    """
    if isinstance(target, Path):
        target = target.absolute()
    where = location(target)
    try:
        occupied = bool(names(target, ""))
    except FileNotFoundError:
        occupied = False
    except NotADirectoryError:
        occupied = True
    if occupied:
        raise SparkCheckpointError(
            f"{where} exists and is not an empty directory: export writes a new Spark "
            "checkpoint directory and never mixes its files with others; give a new path")
    if manifest.batch_id < 0:
        raise SparkCheckpointError(
            f"{manifest.kind} {manifest.savepoint_id or manifest.checkpoint_id} of job "
            f"{manifest.job!r} covers no batch (its query had not run one): there is no "
            "checkpoint to export; plain Spark starts from an empty directory")
    staging = restore_dir(target)
    try:
        materialize(storage, manifest, JobLayout(manifest.job).root, staging)
        count = sum(1 for p in staging.rglob("*") if p.is_file())
        if isinstance(target, Path):
            if target.exists():
                target.rmdir()  # empty (checked above); fails if something arrived meanwhile
            staging.rename(target)
        else:
            target.replace_with(staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportedCheckpoint(where, manifest.batch_id, count)
