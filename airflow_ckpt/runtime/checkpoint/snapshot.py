"""Sync phase of a checkpoint: capture the immutable files of batch ``b`` by hard link.

A Spark working directory after batch ``b`` committed holds everything needed to
resume at ``b + 1``:

* ``metadata`` (the query id), ``offsets/<i>``, ``commits/<i>`` and the source logs
  ``sources/<s>/<i>[.compact]`` for ``i <= b``;
* state store files of versions ``v <= b + 1`` (Spark's state version is batch id + 1):
  ``state/<op>/<part>/<v>.delta|.snapshot|.changelog|.zip``, RocksDB ``SSTs/*.sst``,
  and the schema / operator metadata under ``_metadata`` and ``_stateSchema``.

Spark writes each of those files once (temp file + rename) and never changes it, so
a hard link taken now is a stable snapshot even while later batches run and Spark's
maintenance deletes old versions. No bytes are copied here; the async phase reads
the links. Files of later batches (``offsets/b+1``, ``v > b+1``) are excluded: they
belong to batches the checkpoint does not cover.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_ckpt.errors import CheckpointDeclinedError
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.checkpoint.metadata import OperatorInfo
from airflow_ckpt.runtime.workdir import Workdir, names, read_text

_LOG_DIRS = ("offsets", "commits")
_BATCH_FILE = re.compile(r"^(\d+)(?:\.compact)?$")
_STATE_VERSION = re.compile(r"^(\d+)(?:_[^.]*)?\.(delta|snapshot|changelog|zip)$")
# Subtask name for the query-level files (logs, metadata): Flink's "source" subtask.
LOG_SUBTASK = "logs"


@dataclass(frozen=True, slots=True)
class CapturedFile:
    """A file of the working directory, hard-linked into the staging directory."""

    path: str  # relative to the working directory
    staged: Path  # the hard link
    size: int
    subtask: str  # "logs" or "<operator>/<partition>"
    is_state: bool


@dataclass(frozen=True, slots=True)
class CapturedSnapshot:
    """What the sync phase captured for batch ``batch_id``."""

    batch_id: int
    files: tuple[CapturedFile, ...]
    operators: tuple[OperatorInfo, ...]
    source_offsets: list[Any]
    subtasks: tuple[str, ...]
    staging_dir: Path

    def discard(self) -> None:
        """Remove the staging links (the working directory is untouched)."""
        shutil.rmtree(self.staging_dir, ignore_errors=True)


def latest_batch(workdir: Workdir, log: str) -> int | None:
    """The highest batch id in ``offsets`` or ``commits`` (None if empty)."""
    try:
        listed = names(workdir, log)
    except FileNotFoundError:
        return None
    ids = [int(n) for n in listed if n.isdigit()]
    return max(ids) if ids else None


def barrier_batch(workdir: Workdir, *, running: bool) -> int:
    """The batch whose end is the barrier of a checkpoint triggered now; -1 for the
    empty state before batch 0. ``running``: the query runs (a periodic or manual
    trigger): a batch that is running (its offsets written, its commit not) is the
    barrier; otherwise (not yet, or no longer running) the last committed batch."""
    committed = latest_batch(workdir, "commits")
    if not running:
        return -1 if committed is None else committed
    offered = latest_batch(workdir, "offsets")
    if offered is not None and (committed is None or offered > committed):
        return offered  # batch `offered` is running: barrier at its end
    if committed is None:
        return 0  # nothing ran yet: the first batch
    return committed


def query_id(workdir: Workdir) -> str:
    """The streaming query's id (Spark's ``metadata`` file), or "" if unreadable."""
    try:
        return str(json.loads(read_text(workdir, "metadata"))["id"])
    except (OSError, ValueError, KeyError):
        return ""


def hidden(name: str) -> bool:
    return name.startswith(".") or name.endswith((".tmp", ".crc"))


def wanted(parts: tuple[str, ...], batch_id: int) -> tuple[bool, str, bool]:
    """(include?, subtask, is_state) for a working-directory relative path, split into
    its ``parts``: whether the snapshot of batch ``batch_id`` holds the file."""
    if parts == ("metadata",):
        return True, LOG_SUBTASK, False
    if parts[0] in _LOG_DIRS and len(parts) == 2:
        return parts[1].isdigit() and int(parts[1]) <= batch_id, LOG_SUBTASK, False
    if parts[0] == "sources" and len(parts) == 3:
        match = _BATCH_FILE.match(parts[2])
        return match is not None and int(match.group(1)) <= batch_id, LOG_SUBTASK, False
    if parts[0] == "state" and len(parts) >= 3:
        op = parts[1]
        if parts[2] in ("_metadata", "_stateSchema"):  # operator-level metadata
            # v2 operator metadata and state schema files are per batch: "<b>[_<uuid>]"
            match = re.match(r"^(\d+)(?:_|$)", parts[-1]) if len(parts) > 4 else None
            return not match or int(match.group(1)) <= batch_id, f"{op}/_metadata", True
        if len(parts) == 4:
            match = _STATE_VERSION.match(parts[3])
            if match:
                return int(match.group(1)) <= batch_id + 1, f"{op}/{parts[2]}", True
            return False, "", True
        # state/<op>/<part>/_metadata/schema, state/<op>/<part>/SSTs/x.sst, ...
        return True, f"{op}/{parts[2]}", True
    return False, "", False


def _offset_log(workdir: Path, batch_id: int) -> list[str]:
    path = workdir / "offsets" / str(batch_id)
    try:
        return path.read_text().splitlines()
    except FileNotFoundError as exc:
        raise CheckpointDeclinedError(f"offset log entry for batch {batch_id} is missing") from exc


def _operators(workdir: Path, offset_log: list[str]) -> tuple[OperatorInfo, ...]:
    """Stateful operators and their partition counts as of the snapshot's batch.

    The count comes from the batch's offset log (``spark.sql.shuffle.partitions``, which
    Spark pins per checkpoint and a state repartition rewrites); the operator metadata
    file keeps the count of the first batch and is only the fallback.
    """
    try:
        pinned = int(json.loads(offset_log[1])["conf"]["spark.sql.shuffle.partitions"])
    except (IndexError, ValueError, KeyError, TypeError):
        pinned = 0
    out = []
    state = workdir / "state"
    if not state.is_dir():
        return ()
    for op_dir in sorted(state.iterdir(), key=lambda p: p.name):
        if not op_dir.name.isdigit():
            continue
        names: tuple[str, ...] = ("default",)
        declared = 0
        try:
            info = json.loads((op_dir / "_metadata" / "metadata").read_text().splitlines()[1])
            stores = info.get("stateStoreInfo", [])
            names = tuple(s["storeName"] for s in stores) or names
            declared = max((int(s.get("numPartitions", 0)) for s in stores), default=0)
        except (OSError, ValueError, IndexError, KeyError, TypeError):
            pass  # no (readable) operator metadata: count partition directories
        count = pinned or declared or sum(1 for p in op_dir.iterdir() if p.name.isdigit())
        out.append(OperatorInfo(int(op_dir.name), count, names))
    return tuple(out)


def _source_offsets(lines: list[str]) -> list[Any]:
    """The end offsets of a batch: one JSON value per source (Spark's offset log)."""
    out: list[Any] = []
    for line in lines[2:]:  # "v1", the batch metadata, then one line per source
        try:
            out.append(json.loads(line) if line != "-" else None)
        except ValueError:
            out.append(line)
    return out


def capture(workdir: Workdir, batch_id: int, staging_dir: Path) -> CapturedSnapshot:
    """Hard-link every file of the snapshot at batch ``batch_id`` into ``staging_dir``
    (a remote working directory copies them there instead, see its ``capture``).

    Requires ``commits/<batch_id>`` to exist (the batch is durable in the working
    directory). ``staging_dir`` must be on the same filesystem and not exist yet.

    A file that vanishes between the directory walk and its link was purged by
    Spark's maintenance (old ``offsets/``/``commits/`` entries past
    ``minBatchesToRetain``, state versions superseded by a newer snapshot). Spark
    purges only what it no longer needs to resume at the *latest* batches, and the
    snapshot's batch is one of those, so such a file is skipped. What the snapshot
    cannot do without (``metadata``, ``offsets/<b>``, ``commits/<b>``) is checked
    after linking: if one is gone the checkpoint is declined, the job goes on. On any
    error the staging directory is removed.
    """
    if not isinstance(workdir, Path):
        return workdir.capture(batch_id, staging_dir)
    if not (workdir / "commits" / str(batch_id)).exists():
        raise CheckpointDeclinedError(f"batch {batch_id} is not committed")
    staging_dir.mkdir(parents=True)
    try:
        snapshot = _capture(workdir, batch_id, staging_dir)
    except BaseException:
        shutil.rmtree(staging_dir, ignore_errors=True)
        raise
    return snapshot


def _capture(workdir: Path, batch_id: int, staging_dir: Path) -> CapturedSnapshot:
    files: list[CapturedFile] = []
    for dirpath, dirnames, filenames in os.walk(workdir):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if hidden(name):
                continue
            src = Path(dirpath, name)
            rel = src.relative_to(workdir)
            include, subtask, is_state = wanted(rel.parts, batch_id)
            if not include:
                continue
            dst = staging_dir / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            interleave.point(interleave.CAPTURE_BEFORE_LINK)
            try:
                os.link(src, dst)
            except FileNotFoundError:
                continue  # purged by Spark's maintenance since the walk listed it
            files.append(CapturedFile(rel.as_posix(), dst, dst.stat().st_size,
                                      subtask, is_state))
    return captured_snapshot(workdir, batch_id, files, staging_dir)


def captured_snapshot(workdir: Path, batch_id: int, files: list[CapturedFile],
                      staging_dir: Path) -> CapturedSnapshot:
    """The snapshot of batch ``batch_id`` made of ``files`` (staged in ``staging_dir``),
    its operators and source offsets read from the local directory ``workdir`` (the
    working directory, or a staged copy of it). Declines it if a file it cannot do
    without vanished before it was staged."""
    subtasks = {LOG_SUBTASK} | {f.subtask for f in files}
    paths = {f.path for f in files}
    missing = [p for p in ("metadata", f"offsets/{batch_id}", f"commits/{batch_id}")
               if p not in paths]
    if missing:
        raise CheckpointDeclinedError(
            f"the snapshot of batch {batch_id} lacks {', '.join(missing)}: the files "
            "vanished from the working directory during the sync phase")
    files.sort(key=lambda f: f.path)
    offset_log = _offset_log(workdir, batch_id)
    return CapturedSnapshot(
        batch_id=batch_id,
        files=tuple(files),
        operators=_operators(workdir, offset_log),
        source_offsets=_source_offsets(offset_log),
        subtasks=tuple(sorted(subtasks)),
        staging_dir=staging_dir,
    )
