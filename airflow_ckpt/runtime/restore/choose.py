"""Choose, verify and materialise the checkpoint or savepoint a run starts from.

Restore only reads storage: the checkpoint it restores from is never modified.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_ckpt.errors import (
    CorruptCheckpointError,
    MetadataError,
    RestoreError,
    RestoreRefusal,
    RestoreRefusedError,
)
from airflow_ckpt.runtime import workdir as wd
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.digests import DigestCache
from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.restore.materialize import materialize
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout
from airflow_ckpt.runtime.workdir import Workdir

log = logging.getLogger("airflow_ckpt.restore")

LATEST = "latest"
NONE = "none"


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """What a run starts from. ``manifest`` is None for a fresh start."""

    manifest: Manifest | None
    path: str | None  # URI of the restored checkpoint/savepoint directory
    from_latest: bool  # resumed the job's own latest checkpoint
    #: storage keys found damaged while falling back: a shared file there must be
    #: uploaded again, never referenced as it is
    damaged_keys: frozenset[str] = frozenset()

    @property
    def batch_id(self) -> int | None:
        return self.manifest.batch_id if self.manifest else None


def _materialize_into(storage: CheckpointStorage, manifest: Manifest, workdir: Workdir,
                      digests: DigestCache | None) -> None:
    """Materialise and verify locally, then make it the working directory (a rename
    beside a local one; on a remote one a copy beside it renamed into place)."""
    tmp = wd.restore_dir(workdir)
    verified: list[tuple[Path, str]] = []
    try:
        materialize(storage, manifest, JobLayout(manifest.job).root, tmp,
                    on_verified=lambda path, sha: verified.append((path.relative_to(tmp), sha)))
        wd.replace_with(workdir, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # Only a restore that succeeded as a whole (rename keeps the inodes) seeds the cache;
    # a remote working directory's captures are fresh local copies, never in it.
    if digests is not None and isinstance(workdir, Path):
        for rel, sha in verified:
            digests.remember(workdir / rel, sha)


def restore(
    storage: CheckpointStorage,
    job: str,
    target: str,
    workdir: Workdir,
    history: JobHistory,
    digests: DigestCache | None = None,
    by: Mapping[str, Any] | None = None,
    floor: int | None = None,
) -> RestoreResult:
    """Make ``workdir`` the Spark checkpoint location to start ``job`` from.

    ``target``: ``latest`` (newest completed checkpoint whose files verify; if it is
    damaged, fall back to the previous retained one and record why; no completed
    checkpoint at all means a fresh start, but completed checkpoints of which none
    verifies raise ``RestoreError`` naming each: starting from scratch then would
    replay from the sources' start over published output), ``none`` (fresh start),
    or a checkpoint/savepoint path (``chk-7``, ``7``, ``savepoints/sp-x``,
    ``<job>/chk-7`` or a full URI; another job's savepoint may be restored into this
    job). A damaged explicit target
    raises ``RestoreError``. When this returns, ``workdir`` holds logs up to batch
    ``b`` and state up to version ``b + 1`` of the chosen checkpoint; with ``digests``,
    the verified SHA-256 of every file restored is recorded there (the first checkpoint
    after the restore then hashes only what Spark writes new). ``by`` (the driver's
    ``run_id`` and ``attempt``) goes into the ``restored`` event: who restored.
    ``floor`` (``latest`` only): the run's own first checkpoint id (its initial
    checkpoint); a fallback never goes below it, so a run that started from an explicit
    target or from scratch never resumes an older run's state: if none of its own
    checkpoints verifies, or none is left (their markers deleted), ``RestoreError``.
    """
    catalog = CheckpointCatalog(storage, job)
    wd.reset(workdir)
    target = (target or LATEST).strip()
    if target.lower() == NONE:
        log.info("restore=none: starting %s from scratch", job)
        return RestoreResult(None, None, False)
    if target.lower() == LATEST:
        unusable: list[str] = []
        damaged: set[str] = set()
        counted = catalog.counted()
        own = [i for i in counted.ids if floor is None or i >= floor]
        for checkpoint_id in reversed(own):
            ref = catalog.resolve(f"chk-{checkpoint_id}")
            path = catalog.uri_of(ref)
            try:
                manifest = counted.read.get(checkpoint_id) or catalog.read(ref)
                _materialize_into(storage, manifest, workdir, digests)
            except (CorruptCheckpointError, MetadataError, RestoreError) as exc:
                log.warning("checkpoint %s is not restorable, trying an older one: %s", path, exc)
                history.append(ev.RESTORE_FALLBACK, path=path, reason=str(exc))
                unusable.append(f"  - {path}: {exc}")
                if isinstance(exc, CorruptCheckpointError):
                    damaged |= exc.keys
                continue
            return _restored(history, manifest, path, from_latest=True,
                             damaged=frozenset(damaged), by=by)
        if floor is not None and unusable:
            raise RestoreRefusedError(
                f"restore=latest: none of the {len(unusable)} checkpoints this run of job "
                f"{job!r} completed (ids from {floor} on) can be restored, and falling back "
                "further would resume an older run's state:\n" + "\n".join(unusable)
                + "\nRestore one explicitly (restore=<checkpoint or savepoint path>).",
                RestoreRefusal.RUN_UNRESTORABLE)
        if floor is not None:  # its initial checkpoint completed: its marker was deleted
            raise RestoreRefusedError(
                f"restore=latest: the checkpoints this run of job {job!r} completed (ids "
                f"from {floor} on) are gone from {storage.uri.rstrip('/')}/{job}/ "
                "(their _metadata was deleted), and falling back further would resume an "
                "older run's state. Restore one explicitly (restore=<checkpoint or "
                "savepoint path>).", RestoreRefusal.RUN_CHECKPOINTS_GONE)
        if unusable:
            raise RestoreRefusedError(
                f"restore=latest: none of the {len(unusable)} completed checkpoints of job "
                f"{job!r} can be restored, and starting from scratch would replay the "
                "sources from their start over output already published:\n"
                + "\n".join(unusable)
                + "\nRepair or restore one explicitly (restore=<checkpoint or savepoint "
                "path>), or start from scratch on purpose with restore=none.",
                RestoreRefusal.NONE_RESTORABLE,
            )
        log.info("restore=latest: %s has no completed checkpoint; starting from scratch", job)
        return RestoreResult(None, None, True)
    ref = catalog.resolve(target)
    source = CheckpointCatalog(storage, ref.job) if ref.job != job else catalog
    path = source.uri_of(ref)
    try:
        manifest = source.read(ref)
        _materialize_into(storage, manifest, workdir, digests)
    except (CorruptCheckpointError, MetadataError) as exc:
        raise RestoreError(f"cannot restore from {path}: {exc}") from exc
    return _restored(history, manifest, path, from_latest=False, by=by)


def _restored(
    history: JobHistory, manifest: Manifest, path: str, *, from_latest: bool,
    damaged: frozenset[str] = frozenset(), by: Mapping[str, Any] | None = None,
) -> RestoreResult:
    log.info(
        "restored %s from %s %s (batch %d, %d files)",
        manifest.job,
        manifest.kind,
        path,
        manifest.batch_id,
        len(manifest.files),
    )
    history.append(
        ev.RESTORED,
        path=path,
        kind=manifest.kind,
        checkpoint_id=manifest.checkpoint_id,
        savepoint_id=manifest.savepoint_id,
        batch_id=manifest.batch_id,
        from_job=manifest.job,
        **(by or {}),
    )
    return RestoreResult(manifest, path, from_latest, damaged)
