"""The ``_metadata`` manifest: completion marker and table of contents of a checkpoint.

The manifest is versioned JSON (``schema_version``). The reader is strict: corrupt
JSON, a missing or mistyped field, or an unknown schema version raise a typed
:class:`~airflow_ckpt.errors.MetadataError`; it never returns a half-read object.

Versions: 1 (the first), 2 adds merged files (``FileEntry.offset``), 3 adds inline
files (``FileEntry.inline``: a file below ``state.storage.fs.memory-threshold`` travels
in the manifest itself, as Flink's ``ByteStreamStateHandle`` in ``_metadata``). A
manifest is written in the oldest version that holds it (:func:`version_for`), so a
checkpoint without inline files stays readable by a reader of version 2.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from airflow_ckpt.errors import MetadataError, UnsupportedSchemaVersionError

SCHEMA_VERSION = 3
#: versions this reader accepts (1: no merged files; 2 adds ``FileEntry.offset``; 3 adds
#: ``FileEntry.inline``). The optional ``sources`` field needs no new version: a reader
#: that ignores it misreads nothing (it only loses the check on restore).
READABLE_VERSIONS = (1, 2, 3)
#: the version of a manifest without inline files (what readers before 3 accept)
_WITHOUT_INLINE = 2

Kind = Literal["checkpoint", "savepoint"]
# "initial": the starting point of a run that did not resume from the latest checkpoint
# (a fresh start or an explicit restore), recorded so "latest" never goes back past it.
Trigger = Literal["periodic", "manual", "stop", "final", "initial"]
_KINDS = ("checkpoint", "savepoint")
_TRIGGERS = ("periodic", "manual", "stop", "final", "initial")


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of the Spark working directory captured by a checkpoint.

    ``path`` is relative to the working directory (where restore puts it back);
    ``key`` is the storage key relative to the job root (``shared/..``, ``chk-n/..``
    or ``savepoints/sp-x/..``). ``offset`` is None when the object at ``key`` is the
    file; for a file merged with others (file merging) the file is the ``size`` bytes
    of that object starting at ``offset``. ``inline`` holds the file's bytes (base64)
    when it travels in the manifest itself (below ``state.storage.fs.memory-threshold``):
    then ``key`` is empty and no object holds it. Size and SHA-256 are checked on
    restore for every file, inline ones included.
    """

    path: str
    key: str
    size: int
    sha256: str
    shared: bool
    offset: int | None = None
    inline: str | None = None

    @classmethod
    def inlined(cls, path: str, data: bytes, sha256: str) -> FileEntry:
        """The entry of a file stored in the manifest: ``data`` are its bytes."""
        return cls(path, "", len(data), sha256, False, inline=base64.b64encode(data).decode())

    @property
    def merged(self) -> bool:
        return self.offset is not None

    @property
    def is_inline(self) -> bool:
        return self.inline is not None

    @property
    def data(self) -> bytes:
        """The bytes of an inline file (``MetadataError`` if it is not inline or its
        text is not base64)."""
        if self.inline is None:
            raise MetadataError(f"file {self.path!r} is stored at {self.key!r}, not inline")
        try:
            return base64.b64decode(self.inline, validate=True)
        except binascii.Error as exc:
            raise MetadataError(f"file {self.path!r}: its inline bytes are not base64 "
                                f"({exc})") from exc


@dataclass(frozen=True, slots=True)
class OperatorInfo:
    """A stateful operator: its id, state store names and number of partitions."""

    operator_id: int
    num_partitions: int
    store_names: tuple[str, ...] = ("default",)


@dataclass(frozen=True, slots=True)
class SourceSettings:
    """One streaming source of the query, in Spark's order of sources (``sources/<i>``):
    its name (``rate``, ``kafka``, a file format) and the options recorded for it, the
    ones that decide what a batch reads (:mod:`airflow_ckpt.runtime.sources.settings`)."""

    name: str
    options: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Timings:
    """Phase timings (epoch seconds / milliseconds), after Flink's checkpoint stats."""

    trigger_ts: float
    barrier_ts: float
    completed_ts: float
    start_delay_ms: int
    sync_duration_ms: int
    async_duration_ms: int
    end_to_end_duration_ms: int

    @classmethod
    def measured(cls, *, trigger_ts: float, barrier_ts: float, completed_ts: float,
                 sync_ms: int, async_ms: int) -> Timings:
        """The timings of a snapshot triggered, reached by its barrier and completed at
        the given epoch seconds, whose sync and async phases took ``sync_ms`` and
        ``async_ms``."""
        return cls(trigger_ts=trigger_ts, barrier_ts=barrier_ts, completed_ts=completed_ts,
                   start_delay_ms=max(int((barrier_ts - trigger_ts) * 1000), 0),
                   sync_duration_ms=sync_ms, async_duration_ms=async_ms,
                   end_to_end_duration_ms=int((completed_ts - trigger_ts) * 1000))


@dataclass(frozen=True, slots=True)
class Manifest:
    """A completed checkpoint or savepoint. Exists in storage only once complete."""

    job: str
    checkpoint_id: int
    kind: Kind
    trigger: Trigger
    batch_id: int
    spark_version: str
    query_id: str
    mode: str
    source_offsets: list[Any]
    operators: tuple[OperatorInfo, ...]
    files: tuple[FileEntry, ...]
    state_size: int
    checkpointed_size: int
    num_subtasks: int
    num_acknowledged_subtasks: int
    timings: Timings
    savepoint_id: str | None = None
    pending_transactions: tuple[int, ...] = ()
    restored_from: str | None = None
    #: the writer's lease epoch (absent in manifests written before leases had epochs)
    lease_epoch: int | None = None
    #: the query's sources and their recorded options when the checkpoint was taken
    #: (None: not known, e.g. a manifest written before sources were recorded)
    sources: tuple[SourceSettings, ...] | None = None
    #: the version read; 0 for a new manifest: the version it is written in
    #: (:func:`version_for` its files)
    schema_version: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: (checkpoints only) the retention floor: the lowest checkpoint id still retained
    #: once this checkpoint completed; a reader ignores every marker below the floor of
    #: the newest marker it can read (a late copy of a subsumed marker never counts
    #: again; see docs/architecture.md "Retention floor"). None: not recorded
    retention_floor: int | None = None

    def __post_init__(self) -> None:
        if not self.schema_version:
            object.__setattr__(self, "schema_version", version_for(self.files))

    @property
    def is_savepoint(self) -> bool:
        return self.kind == "savepoint"

    def to_json(self) -> bytes:
        """The manifest as written, in the version :func:`version_for` its files; a
        field a version does not know is left out (``inline`` before version 3)."""
        body = asdict(self)
        body["schema_version"] = version_for(self.files)
        for entry in body["files"]:
            if entry["inline"] is None:
                del entry["inline"]
        if body["retention_floor"] is None:
            del body["retention_floor"]
        return json.dumps(body, indent=1, sort_keys=True).encode()

    def history_entry(self) -> dict[str, Any]:
        """The Flink REST ``/jobs/:id/checkpoints`` history entry for this manifest."""
        return {
            "id": self.checkpoint_id,
            "status": "COMPLETED",
            "is_savepoint": self.is_savepoint,
            "savepoint_id": self.savepoint_id,
            "trigger": self.trigger,
            "batch_id": self.batch_id,
            "trigger_timestamp": int(self.timings.trigger_ts * 1000),
            "latest_ack_timestamp": int(self.timings.completed_ts * 1000),
            "state_size": self.state_size,
            "checkpointed_size": self.checkpointed_size,
            "end_to_end_duration": self.timings.end_to_end_duration_ms,
            # Flink reports these per subtask; here one figure per checkpoint.
            "start_delay": self.timings.start_delay_ms,
            "sync_duration": self.timings.sync_duration_ms,
            "async_duration": self.timings.async_duration_ms,
            "num_subtasks": self.num_subtasks,
            "num_acknowledged_subtasks": self.num_acknowledged_subtasks,
            "failure_message": None,
        }


def version_for(files: tuple[FileEntry, ...]) -> int:
    """The oldest manifest version that holds ``files`` (3 only with an inline file)."""
    return SCHEMA_VERSION if any(f.is_inline for f in files) else _WITHOUT_INLINE


def _require(obj: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise MetadataError(f"{where}: missing field {key!r}")
    value = obj[key]
    if isinstance(value, bool) and typ is not bool and bool not in (
        typ if isinstance(typ, tuple) else (typ,)
    ):
        raise MetadataError(f"{where}: field {key!r} has the wrong type (bool)")
    if not isinstance(value, typ):
        raise MetadataError(
            f"{where}: field {key!r} has the wrong type ({type(value).__name__})"
        )
    return value


def _file(obj: Any, where: str, version: int) -> FileEntry:
    if not isinstance(obj, dict):
        raise MetadataError(f"{where}: a file entry is not an object")
    inline = obj.get("inline")
    if inline is not None and (version < SCHEMA_VERSION or not isinstance(inline, str)):
        raise MetadataError(f"{where}: a file entry's 'inline' must be a base64 string "
                            f"(schema version {SCHEMA_VERSION} and later)")
    entry = FileEntry(
        path=_require(obj, "path", str, where),
        key=_require(obj, "key", str, where),
        size=_require(obj, "size", int, where),
        sha256=_require(obj, "sha256", str, where),
        shared=_require(obj, "shared", bool, where),
        offset=_offset(obj.get("offset"), where),
        inline=inline,
    )
    if entry.is_inline and (entry.key or entry.shared or entry.merged):
        raise MetadataError(f"{where}: inline file {entry.path!r} also names a stored "
                            "object")
    return entry


def _offset(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise MetadataError(f"{where}: a file entry's 'offset' must be an integer >= 0")
    return value


def _operator(obj: Any, where: str) -> OperatorInfo:
    if not isinstance(obj, dict):
        raise MetadataError(f"{where}: an operator entry is not an object")
    names = _require(obj, "store_names", list, where)
    return OperatorInfo(
        operator_id=_require(obj, "operator_id", int, where),
        num_partitions=_require(obj, "num_partitions", int, where),
        store_names=tuple(str(n) for n in names),
    )


def _sources(value: Any, where: str) -> tuple[SourceSettings, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise MetadataError(f"{where}: 'sources' must be a list")
    sources = []
    for obj in value:
        if not isinstance(obj, dict):
            raise MetadataError(f"{where}: a source entry is not an object")
        options = _require(obj, "options", dict, where)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in options.items()):
            raise MetadataError(f"{where}: a source's options must map strings to strings")
        sources.append(SourceSettings(name=_require(obj, "name", str, where),
                                      options=dict(options)))
    return tuple(sources)


def _timings(obj: Any, where: str) -> Timings:
    if not isinstance(obj, dict):
        raise MetadataError(f"{where}: 'timings' is not an object")
    num = (int, float)
    return Timings(
        trigger_ts=float(_require(obj, "trigger_ts", num, where)),
        barrier_ts=float(_require(obj, "barrier_ts", num, where)),
        completed_ts=float(_require(obj, "completed_ts", num, where)),
        start_delay_ms=_require(obj, "start_delay_ms", int, where),
        sync_duration_ms=_require(obj, "sync_duration_ms", int, where),
        async_duration_ms=_require(obj, "async_duration_ms", int, where),
        end_to_end_duration_ms=_require(obj, "end_to_end_duration_ms", int, where),
    )


def parse_manifest(data: bytes, where: str = "_metadata") -> Manifest:
    """Parse a manifest strictly. ``where`` names the object in error messages."""
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MetadataError(f"{where}: not valid JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise MetadataError(f"{where}: not a JSON object")
    version = _require(obj, "schema_version", int, where)
    if version not in READABLE_VERSIONS:
        raise UnsupportedSchemaVersionError(
            f"{where}: schema version {version} is not supported (this airflow-ckpt reads "
            f"versions {', '.join(map(str, READABLE_VERSIONS))}); upgrade airflow-ckpt "
            "to read it"
        )
    kind = _require(obj, "kind", str, where)
    if kind not in _KINDS:
        raise MetadataError(f"{where}: kind {kind!r} is not one of {_KINDS}")
    trigger = _require(obj, "trigger", str, where)
    if trigger not in _TRIGGERS:
        raise MetadataError(f"{where}: trigger {trigger!r} is not one of {_TRIGGERS}")
    savepoint_id = obj.get("savepoint_id")
    restored_from = obj.get("restored_from")
    if savepoint_id is not None and not isinstance(savepoint_id, str):
        raise MetadataError(f"{where}: field 'savepoint_id' has the wrong type")
    if restored_from is not None and not isinstance(restored_from, str):
        raise MetadataError(f"{where}: field 'restored_from' has the wrong type")
    lease_epoch = obj.get("lease_epoch")
    if lease_epoch is not None and (not isinstance(lease_epoch, int) or isinstance(
            lease_epoch, bool)):
        raise MetadataError(f"{where}: field 'lease_epoch' has the wrong type")
    retention_floor = obj.get("retention_floor")
    if retention_floor is not None and (not isinstance(retention_floor, int) or isinstance(
            retention_floor, bool)):
        raise MetadataError(f"{where}: field 'retention_floor' has the wrong type")
    pending = obj.get("pending_transactions", [])
    if not isinstance(pending, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) for p in pending
    ):
        raise MetadataError(f"{where}: 'pending_transactions' must be a list of batch ids")
    extra = obj.get("extra", {})
    if not isinstance(extra, dict):
        raise MetadataError(f"{where}: 'extra' must be an object")
    return Manifest(
        schema_version=version,
        job=_require(obj, "job", str, where),
        checkpoint_id=_require(obj, "checkpoint_id", int, where),
        kind=kind,
        trigger=trigger,
        batch_id=_require(obj, "batch_id", int, where),
        spark_version=_require(obj, "spark_version", str, where),
        query_id=_require(obj, "query_id", str, where),
        mode=_require(obj, "mode", str, where),
        source_offsets=_require(obj, "source_offsets", list, where),
        operators=tuple(_operator(o, where) for o in _require(obj, "operators", list, where)),
        files=tuple(_file(f, where, version) for f in _require(obj, "files", list, where)),
        state_size=_require(obj, "state_size", int, where),
        checkpointed_size=_require(obj, "checkpointed_size", int, where),
        num_subtasks=_require(obj, "num_subtasks", int, where),
        num_acknowledged_subtasks=_require(obj, "num_acknowledged_subtasks", int, where),
        timings=_timings(_require(obj, "timings", dict, where), where),
        savepoint_id=savepoint_id,
        pending_transactions=tuple(pending),
        restored_from=restored_from,
        lease_epoch=lease_epoch,
        sources=_sources(obj.get("sources"), where),
        extra=extra,
        retention_floor=retention_floor,
    )
