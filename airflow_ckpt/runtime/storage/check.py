"""``airflow-ckpt check-storage``: probe what a storage guarantees, property by property.

The runtime's safety rests on a few properties of the storage (docs/storage.md): a
create-only write never replaces an object, a compare-and-swap replaces only the version
it read, a listing reflects a delete that has returned, an object's ETag is the one its
write returned, and a ranged read returns that range. :func:`check_storage` writes probe
objects under a scratch prefix (``.airflow-ckpt-check-<random>/``, never a job's name),
tries each property once and deletes the prefix again, whatever happened.

Each property gets a :class:`CheckVerdict`: ``ok``; ``warn`` where the runtime copes at a cost
(an emptied "directory" still listed by the server); ``missing`` where a guarantee cannot
hold on this storage (an endpoint that ignores ``If-None-Match``); ``n/a`` where the
property does not apply to the backend (multipart on ``file://``). A probe that cannot
be run at all (no access, no bucket) raises the storage's error.
"""

from __future__ import annotations

import contextlib
import enum
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from airflow_ckpt.errors import (
    ObjectAlreadyExistsError,
    PreconditionFailedError,
    StorageError,
)
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.delegating import DelegatingStorage
from airflow_ckpt.runtime.storage.s3 import S3Storage
from airflow_ckpt.runtime.storage.s3_listing import LIST_DIRS_FIRST_KEYS

#: probes live under this prefix plus a random suffix; removed when the check ends
SCRATCH_PREFIX = ".airflow-ckpt-check-"


class CheckVerdict(enum.Enum):
    """What a probe found out about one property."""

    OK = "ok"
    #: the runtime copes, at a cost (requests, time); nothing unsafe
    WARN = "warn"
    #: a guarantee of the runtime cannot hold on this storage
    MISSING = "missing"
    #: the property does not apply to this backend
    NOT_APPLICABLE = "n/a"


class Property(enum.Enum):
    """The properties probed, in the order they are reported."""

    CREATE_ONLY = "create-only write"
    COMPARE_AND_SWAP = "compare-and-swap"
    MULTIPART_CREATE_ONLY = "create-only multipart completion"
    LIST_AFTER_DELETE = "listing just after a delete"
    ETAG_STABILITY = "ETag stability"
    RANGE_READ = "range reads"


@dataclass(frozen=True)
class Finding:
    """One property's verdict and what was seen."""

    prop: Property
    verdict: CheckVerdict
    detail: str


@dataclass(frozen=True)
class StorageCheck:
    """Every finding for one storage, in :class:`Property` order."""

    uri: str
    findings: tuple[Finding, ...]

    @property
    def missing(self) -> list[Finding]:
        """The findings whose guarantee cannot hold (the check fails on any)."""
        return [f for f in self.findings if f.verdict is CheckVerdict.MISSING]

    @property
    def ok(self) -> bool:
        """True unless a property is missing (warnings pass)."""
        return not self.missing

    def lines(self) -> list[str]:
        """One line per property: verdict, property, what was seen."""
        width = max(len(p.value) for p in Property)
        return [f"{f.verdict.value:<7}  {f.prop.value:<{width}}  {f.detail}"
                for f in self.findings]


def _s3_of(storage: CheckpointStorage) -> S3Storage | None:
    """The S3 backend beneath wrappers, or None for another backend."""
    inner = storage
    while isinstance(inner, DelegatingStorage):
        inner = inner.inner
    return inner if isinstance(inner, S3Storage) else None


def check_storage(storage: CheckpointStorage) -> StorageCheck:
    """Probe ``storage`` in a scratch prefix, which is deleted again before returning.

    Writes a few small objects. Raises ``StorageError`` only when the scratch prefix
    cannot be written at all.
    """
    scratch = f"{SCRATCH_PREFIX}{uuid.uuid4().hex[:12]}/"
    probes: list[tuple[Property, Callable[[CheckpointStorage, str], Finding]]] = [
        (Property.CREATE_ONLY, _create_only),
        (Property.COMPARE_AND_SWAP, _compare_and_swap),
        (Property.MULTIPART_CREATE_ONLY, _multipart_create_only),
        (Property.LIST_AFTER_DELETE, _list_after_delete),
        (Property.ETAG_STABILITY, _etag_stability),
        (Property.RANGE_READ, _range_read),
    ]
    findings = []
    try:
        storage.put_bytes(scratch + "hello", b"airflow-ckpt check-storage")
        for prop, probe in probes:
            try:
                findings.append(probe(storage, scratch))
            except StorageError as exc:
                findings.append(Finding(prop, CheckVerdict.MISSING, f"probe failed: {exc}"))
    finally:
        with contextlib.suppress(StorageError):
            storage.delete_prefix(scratch)
        s3 = _s3_of(storage)
        if s3 is not None:
            with contextlib.suppress(StorageError):
                s3.abort_incomplete_uploads(scratch)
    return StorageCheck(storage.uri, tuple(findings))


def _create_only(storage: CheckpointStorage, scratch: str) -> Finding:
    key = scratch + "create-only"
    try:
        storage.put_bytes(key, b"first", create_only=True)
    except StorageError as exc:  # S3: the runtime's own If-None-Match check refused
        return Finding(Property.CREATE_ONLY, CheckVerdict.MISSING, str(exc))
    try:
        storage.put_bytes(key, b"second", create_only=True)
    except ObjectAlreadyExistsError:
        if storage.get_bytes(key) == b"first":
            return Finding(Property.CREATE_ONLY, CheckVerdict.OK,
                           "a second create-only write of a key is refused")
        return Finding(Property.CREATE_ONLY, CheckVerdict.MISSING,
                       "a refused create-only write changed the object")
    return Finding(Property.CREATE_ONLY, CheckVerdict.MISSING,
                   "a second create-only write replaced the object (If-None-Match "
                   "ignored): completion markers and control requests could be "
                   "overwritten")


def _compare_and_swap(storage: CheckpointStorage, scratch: str) -> Finding:
    key = scratch + "swap"
    first = storage.put_bytes(key, b"v1")
    second = storage.put_bytes(key, b"v2", if_match=first)
    try:
        storage.put_bytes(key, b"v3", if_match=first)
    except PreconditionFailedError:
        pass
    else:
        return Finding(Property.COMPARE_AND_SWAP, CheckVerdict.MISSING,
                       "a write conditioned on a replaced version succeeded (If-Match "
                       "ignored): lease and history records could lose updates")
    try:
        storage.put_bytes(scratch + "swap-missing", b"v1", if_match=second)
    except PreconditionFailedError:
        pass
    else:
        return Finding(Property.COMPARE_AND_SWAP, CheckVerdict.MISSING,
                       "a write conditioned on a version of a missing key created it")
    if storage.get_bytes(key) != b"v2":
        return Finding(Property.COMPARE_AND_SWAP, CheckVerdict.MISSING,
                       "a refused conditional write changed the object")
    return Finding(Property.COMPARE_AND_SWAP, CheckVerdict.OK,
                   "replaces only the version read; a stale or missing version is refused")


def _multipart_create_only(storage: CheckpointStorage, scratch: str) -> Finding:
    s3 = _s3_of(storage)
    if s3 is None:
        return Finding(Property.MULTIPART_CREATE_ONLY, CheckVerdict.NOT_APPLICABLE,
                       "no multipart uploads on this backend")
    try:
        refused = s3.probe_create_only_multipart(scratch + "multipart")
    except StorageError as exc:
        return Finding(Property.MULTIPART_CREATE_ONLY, CheckVerdict.WARN,
                       f"not supported ({exc}); the runtime writes create-only objects "
                       "in one request, so only objects over 5 GiB could not be created "
                       "create-only")
    if refused:
        return Finding(Property.MULTIPART_CREATE_ONLY, CheckVerdict.OK,
                       "completing an upload onto an existing key with If-None-Match "
                       "is refused")
    return Finding(Property.MULTIPART_CREATE_ONLY, CheckVerdict.WARN,
                   "completing an upload onto an existing key with If-None-Match "
                   "replaced it; the runtime writes create-only objects in one request, "
                   "so only objects over 5 GiB could not be created create-only")


def _list_after_delete(storage: CheckpointStorage, scratch: str) -> Finding:
    base = scratch + "listing/"
    for key in ("gone/a", "gone/b/c", "kept/a"):
        storage.put_bytes(base + key, b"x")
    storage.delete_prefix(base + "gone/")
    keys = [info.key[len(base):] for info in storage.list(base)]
    if keys != ["kept/a"]:
        return Finding(Property.LIST_AFTER_DELETE, CheckVerdict.MISSING,
                       f"a listing right after a delete returned {keys}, expected "
                       "['kept/a']: deleted checkpoints could be taken for live ones")
    dirs = storage.list_dirs(base)
    if dirs != ["kept"]:
        return Finding(Property.LIST_AFTER_DELETE, CheckVerdict.MISSING,
                       f"directories right after a delete: {dirs}, expected ['kept']")
    s3 = _s3_of(storage)
    if s3 is not None and "gone" in s3.common_prefixes(base):
        return Finding(Property.LIST_AFTER_DELETE, CheckVerdict.WARN,
                       "deleted keys are gone, but the server still lists their emptied "
                       "\"directory\" as a common prefix; airflow-ckpt checks such "
                       "prefixes (one request each in listings of over "
                       f"{LIST_DIRS_FIRST_KEYS} keys)")
    return Finding(Property.LIST_AFTER_DELETE, CheckVerdict.OK,
                   "deleted keys and their emptied directories are gone at once")


def _etag_stability(storage: CheckpointStorage, scratch: str) -> Finding:
    key = scratch + "etag"
    written = storage.put_bytes(key, b"etag probe")
    reads = {storage.get_versioned(key).etag for _ in range(2)}
    if reads != {written}:
        return Finding(Property.ETAG_STABILITY, CheckVerdict.MISSING,
                       f"the write returned ETag {written!r}, reads returned "
                       f"{sorted(reads)}: compare-and-swap could never succeed")
    return Finding(Property.ETAG_STABILITY, CheckVerdict.OK,
                   "reads return the ETag the write returned")


def _range_read(storage: CheckpointStorage, scratch: str) -> Finding:
    key = scratch + "range"
    data = os.urandom(4096)
    storage.put_bytes(key, data)
    with storage.open_stream(key, 1000, 96) as stream:
        got = stream.read(200)
    with storage.open_stream(key, 4000) as stream:
        tail = stream.read()
    if got[:96] != data[1000:1096] or tail != data[4000:]:
        return Finding(Property.RANGE_READ, CheckVerdict.MISSING,
                       "a ranged read did not return that range: restoring a checkpoint "
                       "whose small files are packed into one object would fail")
    return Finding(Property.RANGE_READ, CheckVerdict.OK, "ranged reads return exactly the range")

