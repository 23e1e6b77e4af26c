"""Materialise a checkpoint or savepoint: download its files into a local directory.

Restore (the working directory a query restarts on) and the CLI's ``state`` command
(Spark's state data source reads a local checkpoint directory) both need the files of a
manifest laid out as Spark wrote them. :func:`materialize` downloads every
:class:`~airflow_ckpt.runtime.checkpoint.metadata.FileEntry` that loading the restored state
version reads to ``dest_dir / entry.path`` (one streamed GET per file, or per merged
object, in a bounded pool, hashed while written; an inline file is written from the
manifest, no request at all) and verifies its size and SHA-256; a
missing or damaged file raises :class:`~airflow_ckpt.errors.CorruptCheckpointError`
naming the file, so nothing is ever restored from a partial copy.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from airflow_ckpt.errors import CorruptCheckpointError, MetadataError, ObjectNotFoundError
from airflow_ckpt.runtime.checkpoint.digests import CHUNK, copy_hashed
from airflow_ckpt.runtime.checkpoint.metadata import FileEntry, Manifest
from airflow_ckpt.runtime.restore.state_files import needed_state_files
from airflow_ckpt.runtime.storage.base import CheckpointStorage

#: called with each downloaded file's local path and its verified SHA-256
OnVerified = Callable[[Path, str], None]


def _local_path(dest_dir: Path, entry: FileEntry, where: str) -> Path:
    """``dest_dir / entry.path``, refusing paths that would escape ``dest_dir``."""
    rel = PurePosixPath(entry.path)
    if rel.is_absolute() or not rel.parts or any(p in ("", ".", "..") for p in rel.parts):
        raise CorruptCheckpointError(
            f"{where}: file entry path {entry.path!r} is not a relative path inside the "
            "checkpoint directory; the manifest is damaged or was not written by airflow-ckpt"
        )
    return dest_dir.joinpath(*rel.parts)


def _fetch(storage: CheckpointStorage, key: str, targets: list[tuple[Path, FileEntry]],
           where: str, on_verified: OnVerified | None) -> None:
    """One GET of ``key`` streamed into every target, hashed as it is written (no HEAD,
    no re-read). A file of its own is the whole object; merged files (segments, see
    :mod:`airflow_ckpt.runtime.checkpoint.upload`) are read with one ranged GET over the span of
    the segments needed, the bytes between them skipped."""
    targets = sorted(targets, key=lambda t: (t[1].offset or 0, t[1].size))
    segments: list[tuple[int, int, list[Path], FileEntry]] = []
    for path, entry in targets:
        offset = entry.offset or 0
        if segments and (offset, entry.size) == segments[-1][:2]:
            segments[-1][2].append(path)  # the same bytes twice: one segment, two files
            continue
        if segments and offset < segments[-1][0] + segments[-1][1]:
            raise CorruptCheckpointError(
                f"{where}: file {entry.path!r} overlaps another file in {key}; the "
                "manifest is damaged", key)
        segments.append((offset, entry.size, [path], entry))
    start = segments[0][0]
    span = segments[-1][0] + segments[-1][1] - start
    merged = targets[0][1].merged
    try:
        with storage.open_stream(key, start, span if merged else None) as src:
            position = start
            for offset, size, paths, entry in segments:
                _skip(src, offset - position)
                got, digest = _copy(src, paths[0], size if merged else None)
                position = offset + got
                _verify(entry, key, got, digest, where)
                for extra in paths[1:]:  # e.g. empty deltas of several partitions
                    extra.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(paths[0], extra)
                if on_verified is not None:
                    for path in paths:
                        on_verified(path, entry.sha256)
    except ObjectNotFoundError as exc:
        raise CorruptCheckpointError(
            f"{where}: file {targets[0][1].path!r} (stored at {key}) is missing", key
        ) from exc


def _write_inline(target: Path, entry: FileEntry, where: str,
                  on_verified: OnVerified | None) -> None:
    """Write an inline file (its bytes are in the manifest) to ``target``, verified like
    a downloaded one."""
    try:
        data = entry.data
    except MetadataError as exc:
        raise CorruptCheckpointError(f"{where}: {exc}; the manifest is damaged") from exc
    _verify(entry, f"{where}/_metadata", len(data), hashlib.sha256(data).hexdigest(), where)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    if on_verified is not None:
        on_verified(target, entry.sha256)


def _skip(src: BinaryIO, count: int) -> None:
    while count > 0:
        chunk = src.read(min(count, CHUNK))
        if not chunk:
            return  # short object: the next segment's size check reports it
        count -= len(chunk)


def _copy(src: BinaryIO, target: Path, limit: int | None) -> tuple[int, str]:
    """Copy ``limit`` bytes of ``src`` (all of it if None) to ``target``; returns the
    bytes copied and their SHA-256."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with target.open("wb") as out:
        size = copy_hashed(src, out, digest.update, limit)
    return size, digest.hexdigest()


def _verify(entry: FileEntry, key: str, size: int, sha256: str, where: str) -> None:
    if size != entry.size:
        raise CorruptCheckpointError(
            f"{where}: file {entry.path!r} (stored at {key}) has {size} bytes, "
            f"the manifest records {entry.size}", key
        )
    if sha256 != entry.sha256:
        raise CorruptCheckpointError(
            f"{where}: file {entry.path!r} (stored at {key}) has SHA-256 "
            f"{sha256}, the manifest records {entry.sha256}", key
        )


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
        (older than the newest snapshot, see :mod:`airflow_ckpt.runtime.restore.state_files`)
    :param on_verified: called (from a pool thread) for each file once its size and
        SHA-256 matched the manifest, with its path and that digest
    :returns: ``dest_dir``
    :raises CorruptCheckpointError: a file is missing, has the wrong size or checksum, or
        its path would escape ``dest_dir``. The message names the first such file (in
        manifest order); every file is still read, and ``keys`` names every damaged
        object (a fallback distrusts them all, not just the first). Files already
        downloaded are left in place (the caller owns ``dest_dir`` and discards it).
    """
    root = job_root_key if not job_root_key or job_root_key.endswith("/") else job_root_key + "/"
    where = (f"{root}savepoints/sp-{manifest.savepoint_id}" if manifest.savepoint_id
             else f"{root}chk-{manifest.checkpoint_id}")
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    files = (needed_state_files(manifest.files, manifest.batch_id + 1) if only_needed
             else list(manifest.files))
    jobs: dict[tuple[str, str], list[tuple[Path, FileEntry]]] = {}
    seen: set[Path] = set()
    for entry in files:
        target = _local_path(dest_dir, entry, where)
        if target in seen:
            raise CorruptCheckpointError(f"{where}: file {entry.path!r} is listed twice")
        seen.add(target)
        if entry.is_inline:
            _write_inline(target, entry, where, on_verified)
            continue
        # one GET per object: a file of its own, or every needed segment of a merged one
        group = (root + entry.key, "" if entry.merged else entry.path)
        jobs.setdefault(group, []).append((target, entry))
    if not jobs:
        return dest_dir
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(jobs)))) as pool:
        futures = [pool.submit(_fetch, storage, key, targets, where, on_verified)
                   for (key, _), targets in jobs.items()]
        failures = [exc for exc in (f.exception() for f in futures) if exc is not None]
    if not failures:
        return dest_dir
    damaged = [exc for exc in failures if isinstance(exc, CorruptCheckpointError)]
    first = failures[0]  # in manifest order
    if not isinstance(first, CorruptCheckpointError):
        raise first
    keys = frozenset().union(*(exc.keys for exc in damaged))
    more = f" (damaged objects in all: {len(keys)})" if len(keys) > 1 else ""
    raise CorruptCheckpointError(f"{first}{more}", first.key, keys=keys) from first
