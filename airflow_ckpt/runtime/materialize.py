"""Materialise a checkpoint or savepoint: download its files into a local directory.

Restore (the working directory a query restarts on) and the CLI's ``state`` command
(Spark's state data source reads a local checkpoint directory) both need the files of a
manifest laid out as Spark wrote them. :func:`materialize` downloads every
:class:`~airflow_ckpt.runtime.metadata.FileEntry` that loading the restored state
version reads to ``dest_dir / entry.path`` (one streamed GET per file in a bounded pool,
hashed while written) and verifies its size and SHA-256; a missing or damaged file raises
:class:`~airflow_ckpt.errors.CorruptCheckpointError` naming the file, so nothing is ever
restored from a partial copy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

from airflow_ckpt.errors import CorruptCheckpointError, ObjectNotFoundError
from airflow_ckpt.runtime.metadata import FileEntry, Manifest
from airflow_ckpt.runtime.state_files import needed_state_files
from airflow_ckpt.runtime.storage.base import CheckpointStorage

_CHUNK = 1 << 20

#: called with each downloaded file's local path and its verified SHA-256
OnVerified = Callable[[Path, str], None]


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a local file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _local_path(dest_dir: Path, entry: FileEntry, where: str) -> Path:
    """``dest_dir / entry.path``, refusing paths that would escape ``dest_dir``."""
    rel = PurePosixPath(entry.path)
    if rel.is_absolute() or not rel.parts or any(p in ("", ".", "..") for p in rel.parts):
        raise CorruptCheckpointError(
            f"{where}: file entry path {entry.path!r} is not a relative path inside the "
            "checkpoint directory; the manifest is damaged or was not written by airflow-ckpt"
        )
    return dest_dir.joinpath(*rel.parts)


def _fetch(storage: CheckpointStorage, key: str, target: Path, entry: FileEntry,
           where: str, on_verified: OnVerified | None) -> None:
    """One GET streamed into ``target``, hashed as it is written (no HEAD, no re-read)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    try:
        with storage.open_stream(key) as src, target.open("wb") as out:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
    except ObjectNotFoundError as exc:
        raise CorruptCheckpointError(
            f"{where}: file {entry.path!r} (stored at {key}) is missing", key
        ) from exc
    if size != entry.size:
        raise CorruptCheckpointError(
            f"{where}: file {entry.path!r} (stored at {key}) has {size} bytes, "
            f"the manifest records {entry.size}", key
        )
    if digest.hexdigest() != entry.sha256:
        raise CorruptCheckpointError(
            f"{where}: file {entry.path!r} (stored at {key}) has SHA-256 "
            f"{digest.hexdigest()}, the manifest records {entry.sha256}", key
        )
    if on_verified is not None:
        on_verified(target, entry.sha256)


def materialize(
    storage: CheckpointStorage,
    manifest: Manifest,
    job_root_key: str,
    dest_dir: Path,
    *,
    max_workers: int = 16,
    only_needed: bool = True,
    on_verified: OnVerified | None = None,
) -> Path:
    """Download every file of ``manifest`` into ``dest_dir`` and verify it.

    :param storage: the storage holding the checkpoint/savepoint
    :param manifest: its parsed ``_metadata``
    :param job_root_key: the job's root key (``"<job>/"``); each
        ``FileEntry.key`` is relative to it
    :param dest_dir: where the files go (``dest_dir / entry.path``); created if absent.
        Files already there with the same names are replaced.
    :param max_workers: parallel downloads (one streamed GET each: no HEAD, since the
        manifest records every size and hash; the hash is computed while writing)
    :param only_needed: skip state files that loading the restored version cannot read
        (older than the newest snapshot, see :mod:`airflow_ckpt.runtime.state_files`)
    :param on_verified: called (from a pool thread) for each file once its size and
        SHA-256 matched the manifest, with its path and that digest
    :returns: ``dest_dir``
    :raises CorruptCheckpointError: a file is missing, has the wrong size or checksum, or
        its path would escape ``dest_dir``. The message names the file. Files already
        downloaded are left in place (the caller owns ``dest_dir`` and discards it).
    """
    root = job_root_key if not job_root_key or job_root_key.endswith("/") else job_root_key + "/"
    where = (f"{root}savepoints/sp-{manifest.savepoint_id}" if manifest.savepoint_id
             else f"{root}chk-{manifest.checkpoint_id}")
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    files = (needed_state_files(manifest.files, manifest.batch_id + 1) if only_needed
             else list(manifest.files))
    jobs = [(root + e.key, _local_path(dest_dir, e, where), e) for e in files]
    seen: set[Path] = set()
    for _, target, entry in jobs:
        if target in seen:
            raise CorruptCheckpointError(f"{where}: file {entry.path!r} is listed twice")
        seen.add(target)
    if not jobs:
        return dest_dir
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(jobs)))) as pool:
        futures = [pool.submit(_fetch, storage, key, target, entry, where, on_verified)
                   for key, target, entry in jobs]
        # .result() re-raises the first failure (in manifest order) after all finish.
        for future in futures:
            future.result()
    return dest_dir
