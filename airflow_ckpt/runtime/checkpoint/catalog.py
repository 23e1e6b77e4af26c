"""Read-side view of the storage contract: jobs, completed checkpoints, savepoints.

Used by restore, the CLI, the Airflow hook, sensors and triggers. Only objects with a
``_metadata`` manifest are completed; a directory without one is an in-flight or
abandoned checkpoint and is never offered for restore.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from airflow_ckpt.errors import (
    InvalidStorageUriError,
    MetadataError,
    ObjectNotFoundError,
    RestoreError,
)
from airflow_ckpt.runtime.checkpoint.metadata import Manifest, parse_manifest
from airflow_ckpt.runtime.lease.record import LeaseRecord, read_lease, valid_checkpoint_ids
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.factory import key_in_storage
from airflow_ckpt.runtime.storage.layout import (
    METADATA_NAME,
    JobLayout,
    is_job_name,
    parse_checkpoint_dir,
    parse_savepoint_dir,
)


@dataclass(frozen=True, slots=True)
class CompletedRef:
    """Where a completed checkpoint or savepoint lives (its directory key)."""

    job: str
    kind: str  # "checkpoint" | "savepoint"
    dir_key: str  # e.g. "job/chk-7/" or "job/savepoints/sp-x/"
    checkpoint_id: int | None
    savepoint_id: str | None

    @property
    def metadata_key(self) -> str:
        return self.dir_key + METADATA_NAME


@dataclass(frozen=True, slots=True)
class CountedCheckpoints:
    """What :meth:`CheckpointCatalog.counted` found: the ids of the completed checkpoints
    that count (ascending) and the manifests it read to decide that (by id; the marker
    whose retention floor applied), which a caller takes from here instead of a second
    GET. Valid for the one call: a later one lists again."""

    ids: tuple[int, ...]
    read: Mapping[int, Manifest]


class CheckpointCatalog:
    """Lists and reads what is stored for one job (or, with :meth:`jobs`, all jobs)."""

    def __init__(self, storage: CheckpointStorage, job: str) -> None:
        self.storage = storage
        self.layout = JobLayout(job)

    @staticmethod
    def jobs(storage: CheckpointStorage) -> list[str]:
        """Names of the jobs under the storage root (other folders, such as a sink's
        ``_output/``, are not jobs: job names never start with ``_`` or ``.``)."""
        return [name for name in storage.list_dirs("") if is_job_name(name)]

    def checkpoint_ids(self, completed_only: bool = True,
                       lease: LeaseRecord | Literal["current"] | None = "current") -> list[int]:
        """Checkpoint ids, ascending; with ``completed_only`` only the completed ones
        that count (:meth:`counted`)."""
        if completed_only:
            return list(self.counted(lease).ids)
        return sorted(self._checkpoint_dirs(completed_only=False))

    def counted(self, lease: LeaseRecord | Literal["current"] | None = "current"
                ) -> CountedCheckpoints:
        """The completed checkpoints that count, and the manifests read to decide it.

        Completed: with a ``_metadata``. Counting: under the current lease (a marker a
        deposed driver wrote after another driver took over never counts, see
        :func:`~airflow_ckpt.runtime.lease.record.valid_checkpoint_ids`), or under the
        given ``lease`` record (a driver taking over judges by its predecessor's), and at
        or above the retention floor (:meth:`_above_floor`). The one rule every reader of
        markers counts by: restore, adoption, ``recover``, the CLI, the sensors and
        triggers. Costs one listing of the ``chk-*`` keys, the lease record and the
        newest readable marker (more only past damaged ones).
        """
        ids = sorted(self._checkpoint_dirs(completed_only=True))
        if not ids:
            return CountedCheckpoints((), {})
        record = read_lease(self.storage, self.layout.job) if lease == "current" else lease
        return self._above_floor(valid_checkpoint_ids(ids, record))

    def _checkpoint_dirs(self, completed_only: bool) -> set[int]:
        """Ids of the ``chk-*`` directories (with ``completed_only``: with a
        ``_metadata``), from one listing."""
        # Only ``chk-*`` keys are listed: savepoints, history events and control
        # requests never are (the listing is bounded by the checkpoints on storage,
        # retained or abandoned, whatever the job's age).
        ids = set()
        for info in self.storage.list(self.layout.checkpoints_prefix):
            head, _, tail = info.key[len(self.layout.root):].partition("/")
            n = parse_checkpoint_dir(head)
            if n is not None and (tail == METADATA_NAME or not completed_only):
                ids.add(n)
        return ids

    def _above_floor(self, counting: list[int]) -> CountedCheckpoints:
        """Of the ``counting`` ids (ascending), those at or above the retention floor
        recorded by the newest of their markers that can be read (one GET; an older one
        when the newest is damaged or gone). Retention deleted every marker below it, so
        one there is a late copy of a subsumed marker (a PUT whose answer was lost,
        repeated, and landing after the delete): it names deleted files and never counts
        again. Floors only rise, and a deposed driver's marker never counts, so it never
        raises the floor."""
        for n in reversed(counting):
            try:
                newest = self.checkpoint(n)
            except (MetadataError, RestoreError):
                continue
            floor = newest.retention_floor
            return CountedCheckpoints(
                tuple(i for i in counting if floor is None or i >= floor), {n: newest})
        return CountedCheckpoints(tuple(counting), {})

    def first_free_id(self, holder: LeaseRecord | None) -> int:
        """The first checkpoint id past every id ever used: every checkpoint directory,
        and the ids lease holder ``holder`` took or reserved (a job whose checkpoints
        were all discarded never repeats one).

        A driver's savepoints take their ids from the same reserved range (reserved in
        the record before use, and every holder starts past its predecessor's range),
        so with a record that reserves (``id_limit``) no savepoint is read: one listing
        of the job root's directories, whatever the job's age. Only without one (a job's
        first driver, a record of a version before ``id_limit``) is every completed
        savepoint's id read, once. An imported savepoint's id is not reserved
        (``airflow-ckpt import`` holds no lease): a driver may use it again, which its
        ``import-<token>/`` directory makes harmless (see docs/architecture.md).
        """
        used = self.checkpoint_ids(completed_only=False)
        if holder is None or holder.id_limit is None:
            used += [m.checkpoint_id for m in self.savepoints()]
        floor = max(holder.first_id or 1, holder.id_limit or 1) if holder else 1
        return max([floor - 1, *used]) + 1

    def adopt(self, previous: LeaseRecord | None) -> tuple[tuple[int, ...], int]:
        """What a driver taking the lease over from ``previous`` holder adopts: the
        completed checkpoints (judged by ``previous``'s record) and its first id
        (:meth:`first_free_id`). Reads the ``chk-*`` keys and the root's directories,
        never a savepoint, a control request or a history event (with a reserving
        ``previous``): bounded whatever the job's age, so a lease's validity is never
        spent on reading."""
        return tuple(self.checkpoint_ids(lease=previous)), self.first_free_id(previous)

    def savepoint_dirs(self) -> list[str]:
        """Ids of every ``savepoints/sp-<id>`` directory (completed or not), sorted."""
        return [sp for name in self.storage.list_dirs(self.layout.savepoints_prefix)
                if (sp := parse_savepoint_dir(name)) is not None]

    def completed_savepoints_among(self, ids: Iterable[str]) -> list[str]:
        """Of the savepoint ``ids``, those completed (with ``_metadata``), in order."""
        return [sp for sp in ids if self.storage.exists(self.layout.savepoint_metadata(sp))]

    def savepoint_ids(self) -> list[str]:
        """Ids of completed savepoints (those with ``_metadata``), oldest key first."""
        return self.completed_savepoints_among(self.savepoint_dirs())

    def checkpoint(self, checkpoint_id: int) -> Manifest:
        """The manifest of a completed checkpoint (``RestoreError`` if not completed)."""
        return self._read(self.layout.checkpoint_metadata(checkpoint_id))

    def savepoint(self, savepoint_id: str) -> Manifest:
        """The manifest of a completed savepoint (``RestoreError`` if absent)."""
        return self._read(self.layout.savepoint_metadata(savepoint_id))

    def completed_checkpoints(self) -> list[Manifest]:
        """Manifests of every completed checkpoint that counts, oldest first (the one
        :meth:`counted` read is not read again)."""
        counted = self.counted()
        return [counted.read.get(n) or self.checkpoint(n) for n in counted.ids]

    def savepoints(self) -> list[Manifest]:
        """Manifests of every completed savepoint, oldest first (by completion time)."""
        found = [self.savepoint(sp) for sp in self.savepoint_ids()]
        return sorted(found, key=lambda m: m.timings.completed_ts)

    def latest_checkpoint(self) -> Manifest | None:
        """The newest completed checkpoint that counts, or None (one listing, the lease
        record and one GET when its marker is intact: :meth:`counted` read it)."""
        counted = self.counted()
        if not counted.ids:
            return None
        return counted.read.get(counted.ids[-1]) or self.checkpoint(counted.ids[-1])

    def resolve(self, path: str) -> CompletedRef:
        """Resolve ``chk-7``, ``7``, ``sp-x``, ``<job>/chk-7`` or a full URI to a reference.

        A full URI must be in this storage, in any spelling of its URI (``s3a://``,
        ``file://localhost/``, encoded or not). Raises ``RestoreError`` when the path
        does not name a checkpoint or savepoint directory of this storage.
        """
        text = path.strip().rstrip("/")
        if text.endswith("/" + METADATA_NAME):
            text = text[: -len(METADATA_NAME) - 1]
        try:
            key = key_in_storage(self.storage.uri, text)
        except InvalidStorageUriError as exc:
            raise RestoreError(str(exc)) from exc
        if key is not None:
            text = key
        parts = text.split("/")
        if text.isdigit():
            parts = [self.layout.job, f"chk-{text}"]
        elif len(parts) == 1 or (len(parts) == 2 and parts[0] == "savepoints"):
            parts = [self.layout.job, *parts]
        if len(parts) == 2 and (n := parse_checkpoint_dir(parts[1])) is not None:
            return CompletedRef(parts[0], "checkpoint", f"{parts[0]}/{parts[1]}/", n, None)
        if len(parts) == 2 and (sp := parse_savepoint_dir(parts[1])) is not None:
            parts = [parts[0], "savepoints", parts[1]]
        if len(parts) == 3 and parts[1] == "savepoints":
            sp = parse_savepoint_dir(parts[2])
            if sp is not None:
                return CompletedRef(parts[0], "savepoint", "/".join(parts) + "/", None, sp)
        raise RestoreError(
            f"{path!r} does not name a checkpoint (chk-<n>) or savepoint (savepoints/sp-<id>)"
        )

    def read(self, ref: CompletedRef) -> Manifest:
        """The manifest at ``ref`` (``RestoreError`` if not completed)."""
        return self._read(ref.metadata_key)

    def uri_of(self, ref: CompletedRef) -> str:
        """The full URI of a checkpoint/savepoint directory (what users pass to restore)."""
        return self.storage.uri.rstrip("/") + "/" + ref.dir_key.rstrip("/")

    def _read(self, key: str) -> Manifest:
        try:
            raw = self.storage.get_bytes(key)
        except ObjectNotFoundError as exc:
            raise RestoreError(
                f"{key} does not exist: the checkpoint/savepoint is not completed or was "
                "deleted"
            ) from exc
        return parse_manifest(raw, where=key)
