"""Savepoint administration on the storage contract: liveness, request expiry, disposal.

Used by the Airflow side (``TriggerSavepointOperator``, ``CheckpointStoreHook``) and by
the ``airflow-ckpt`` CLI; nothing here imports Airflow.

* :func:`last_lifecycle_event` / :func:`ensure_job_running`: is the job running, judged
  from its history (the newest of ``job_started``/``job_finished``/``job_stopped``/
  ``job_failed`` is ``job_started``)?
* :func:`expire_request`: a requester that stops waiting answers its own request
  "failed", create-only, so a job that comes late never acts on it. If the job answered
  first, its answer wins and is returned.
* :func:`dispose_savepoint`: delete one savepoint on purpose (the savepoint history's
  retention disposes of the job's own only: runtime/checkpoint/savepoint_history.py).
  Checkpoints are refused: retention owns them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

from airflow_ckpt.errors import (
    ControlAnswerLostError,
    InvalidStorageUriError,
    MetadataError,
    ObjectAlreadyExistsError,
    SavepointError,
)
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog, CompletedRef
from airflow_ckpt.runtime.checkpoint.savepoint_history import delete_savepoint
from airflow_ckpt.runtime.control.channel import ControlChannel, ControlResult
from airflow_ckpt.runtime.history.events import JOB_STARTED, LIFECYCLE_EVENTS, HistoryEvent
from airflow_ckpt.runtime.history.reader import HistoryReader
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.factory import key_in_storage
from airflow_ckpt.runtime.storage.layout import parse_checkpoint_dir, validate_job_name


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")


def describe_event(event: HistoryEvent | None) -> str:
    """``"job_stopped at 2026-01-02T03:04:05+00:00"``, or a note that there is none."""
    if event is None:
        return "none: the job has no lifecycle event in this storage"
    return f"{event.type} at {_iso(event.ts)}"


def last_lifecycle_event(storage: CheckpointStorage, job: str) -> HistoryEvent | None:
    """The newest lifecycle event of ``job``, or None (``LIFECYCLE_EVENTS``: the newest
    one decides whether the job runs).

    Reads the history newest first (raw tail and ``events`` segments, never the
    compacted checkpoint statistics) and stops at the first lifecycle event. An
    unreadable event raises ``MetadataError`` naming its key.
    """
    return HistoryReader(storage, job).last_of(LIFECYCLE_EVENTS)


def ensure_job_running(storage: CheckpointStorage, job: str) -> HistoryEvent:
    """Return the ``job_started`` event of the running ``job``.

    :raises SavepointError: the newest lifecycle event is not ``job_started`` (the job
        finished, stopped, failed, or never started with this storage).
    """
    event = last_lifecycle_event(storage, job)
    if event is None or event.type != JOB_STARTED:
        raise SavepointError(
            f"job {job!r} is not running (last event: {describe_event(event)}); a savepoint "
            f"can only be taken by a running job. Storage: {storage.uri}"
        )
    return event


def expire_request(
    storage: CheckpointStorage, job: str, request_id: str, reason: str
) -> ControlResult | None:
    """Answer ``request_id`` as failed with ``reason`` unless the job answered already.

    The answer is written create-only, so exactly one of the job and the requester
    answers a request. Returns None when this cancellation was recorded (a job that
    later tries to answer gets ``ObjectAlreadyExistsError`` and must not act), or the
    job's answer when it was written first.

    Why an answer written here is the first, without any clock: the job deletes only
    answered requests, the request before its answer
    (:class:`~airflow_ckpt.runtime.control.channel.ControlChannel`). So once ours is
    stored, the request still being there proves no answer of the job existed before
    ours; the request gone proves the job answered and cleaned up before this requester
    read its answer (its reads failed, or it outlived its timeout plus the answer
    retention): ours is then an orphan (the job deletes it) and
    :class:`~airflow_ckpt.errors.ControlAnswerLostError` is raised, never a false
    "nobody answered".
    """
    channel = ControlChannel(storage, job)
    ours = ControlResult(
        request_id=request_id, status="failed", completed_ts=time.time(), failure_message=reason
    )
    try:
        channel.answer(ours)
    except ObjectAlreadyExistsError:
        theirs = channel.result(request_id)
        if theirs is None:
            raise
        if (theirs.status, theirs.failure_message) != ("failed", reason):
            return theirs
        # ours, from an earlier call whose answer was lost: judged like a fresh one
    if not storage.exists(channel.layout.control_request(request_id)):
        raise ControlAnswerLostError(
            f"job {job!r} answered request {request_id} and deleted it with its answer "
            "before this requester read the answer (its reads failed, or it waited past "
            "the request's timeout plus the job's control answer retention): its outcome "
            "is unknown here; a savepoint it took is listed by `airflow-ckpt savepoints`")
    return None


# --------------------------------------------------------------------------- disposal


@dataclass(frozen=True, slots=True)
class DisposedSavepoint:
    """What :func:`dispose_savepoint` deleted."""

    job: str
    savepoint_id: str
    uri: str
    num_objects: int
    num_bytes: int


def resolve_snapshot(
    storage: CheckpointStorage, path: str, job: str | None = None
) -> CompletedRef:
    """Resolve a checkpoint or savepoint reference to its directory.

    ``path`` is a full URI in ``storage`` or ``<job>/chk-<n>``, ``<job>/savepoints/sp-<id>``,
    ``<job>/sp-<id>``; when ``job`` is given also ``<n>``, ``chk-<n>``, ``sp-<id>`` or
    ``savepoints/sp-<id>``.

    :raises SavepointError: ``path`` belongs to another job than ``job``, or does not
        say which job it belongs to
    :raises RestoreError: ``path`` is not a checkpoint/savepoint path of ``storage``
    """
    text = path.strip().rstrip("/")
    try:
        key = key_in_storage(storage.uri, text)
    except InvalidStorageUriError as exc:
        raise SavepointError(str(exc)) from exc
    relative = text if key is None else key
    owner = job
    if owner is None:
        parts = relative.split("/")
        if len(parts) < 2 or parts[0] == "savepoints":
            raise SavepointError(
                f"{path!r} does not say which job it belongs to; give the job, or write "
                "<job>/chk-<n>, <job>/savepoints/sp-<id> or a full URI"
            )
        owner = parts[0]
    validate_job_name(owner)
    ref = CheckpointCatalog(storage, owner).resolve(path)
    if job is not None and ref.job != job:
        raise SavepointError(f"{path!r} belongs to job {ref.job!r}, not to {job!r}")
    return ref


def resolve_savepoint(
    storage: CheckpointStorage, path: str, job: str | None = None
) -> CompletedRef:
    """:func:`resolve_snapshot`, refusing checkpoints.

    With ``job``, a bare ``<id>`` (anything but ``chk-<n>``) means the savepoint
    ``sp-<id>``.

    :raises SavepointError: ``path`` names a checkpoint (retention owns those), or see
        :func:`resolve_snapshot`
    """
    text = path.strip()
    if (job is not None and "/" not in text and not text.startswith("sp-")
            and parse_checkpoint_dir(text) is None):
        text = f"sp-{text}"  # a bare savepoint id
    ref = resolve_snapshot(storage, text, job)
    if ref.kind != "savepoint":
        raise SavepointError(
            f"{path!r} is a checkpoint, not a savepoint: checkpoints are deleted by "
            "retention (num-retained), never disposed by hand"
        )
    return ref


def dispose_savepoint(
    storage: CheckpointStorage, path: str, *, job: str | None = None, force: bool = False
) -> DisposedSavepoint:
    """Delete one savepoint (``savepoints/sp-<id>/`` and everything under it), any
    savepoint: one named to keep or restored from too.

    ``_metadata`` is deleted first, so the savepoint stops being restorable atomically
    and a crash part-way leaves only an incomplete directory (which restore ignores and
    a second ``dispose`` with ``force`` removes). Savepoints are self-contained: nothing
    outside their directory is touched.

    :param path: see :func:`resolve_savepoint`
    :param job: the owning job, when ``path`` is short
    :param force: also delete an incomplete savepoint (no ``_metadata``, e.g. one whose
        writer failed) or one whose ``_metadata`` is unreadable
    :raises SavepointError: a checkpoint, a missing savepoint, a directory whose
        ``_metadata`` is not a savepoint manifest, or an incomplete savepoint without
        ``force``
    """
    ref = resolve_savepoint(storage, path, job)
    assert ref.savepoint_id is not None
    catalog = CheckpointCatalog(storage, ref.job)
    uri = catalog.uri_of(ref)
    objects = storage.list(ref.dir_key)
    if not objects:
        raise SavepointError(f"there is no savepoint at {uri}")
    if not any(o.key == ref.metadata_key for o in objects):
        if not force:
            raise SavepointError(
                f"{uri} has no _metadata: the savepoint is incomplete (still being written, "
                "or its writer failed). Dispose it with force once no job is writing it"
            )
    else:
        try:
            manifest = catalog.read(ref)
        except MetadataError:
            if not force:
                raise
        else:
            if manifest.kind != "savepoint":
                raise SavepointError(
                    f"{uri}/_metadata describes a {manifest.kind}, not a savepoint; refusing "
                    "to delete it"
                )
    delete_savepoint(storage, ref.metadata_key, [o.key for o in objects])
    return DisposedSavepoint(
        job=ref.job,
        savepoint_id=ref.savepoint_id,
        uri=uri,
        num_objects=len(objects),
        num_bytes=sum(o.size for o in objects),
    )
