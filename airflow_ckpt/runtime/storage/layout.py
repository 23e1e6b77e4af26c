"""The storage layout: every key the runtime writes and Airflow reads, in one place.

This layout is a public contract (see docs/storage-layout.md)::

    <root>/<job>/
      chk-<n>/_metadata            completion marker + manifest, written last
      chk-<n>/...                  files exclusive to checkpoint n (merged: _merged/<sha256>)
      shared/<aa>/<sha256>.e<epoch>  immutable files (or merged small files) shared by
                                   incremental checkpoints
      savepoints/sp-<id>/_metadata self-contained savepoint (+ its files)
      control/<request-id>.json    requests to the running job
      control/<request-id>.result.json  the job's answer to a request
      history/<seq>.json           append-only events, numbered 1, 2, ... (create-only)
      history/segments/<stream>/   compacted events (see history/segments.py)
      lease/<epoch>.json           which driver may write checkpoints (see lease/record.py)
      lease/doorbell-<request-id>  "a request is waiting": a hint the lease heartbeat's
                                   listing carries to the driver (see control.py)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_ckpt.errors import ConfigError

METADATA_NAME = "_metadata"
#: a full checkpoint's merged small files: ``chk-<n>/_merged/<sha256>`` (Spark's working
#: directory has no top-level ``_merged``)
MERGED_DIR = "_merged/"
_JOB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SAVEPOINT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CHK_RE = re.compile(r"^chk-(\d+)$")
_SP_RE = re.compile(r"^sp-(.+)$")


def is_job_name(name: str) -> bool:
    """Whether ``name`` is a valid job name."""
    return isinstance(name, str) and bool(_JOB_RE.match(name))


def validate_job_name(job: str) -> str:
    """Return ``job`` if it is a valid job name, else raise ``ConfigError``."""
    if not is_job_name(job):
        raise ConfigError(
            "job name",
            {"job": f"{job!r} must be 1-128 characters of letters, digits, '.', '_', '-' "
                    "and start with a letter or digit"},
        )
    return job


def validate_savepoint_id(savepoint_id: str) -> str:
    """Return ``savepoint_id`` if usable in a key, else raise ``ConfigError``."""
    if not isinstance(savepoint_id, str) or not _SAVEPOINT_ID_RE.match(savepoint_id):
        raise ConfigError("savepoint id", {"savepoint_id": f"{savepoint_id!r} is not valid"})
    return savepoint_id


def parse_checkpoint_dir(name: str) -> int | None:
    """``"chk-12"`` -> 12; anything else -> None."""
    match = _CHK_RE.match(name.rstrip("/"))
    return int(match.group(1)) if match else None


def parse_savepoint_dir(name: str) -> str | None:
    """``"sp-abc"`` -> ``"abc"``; anything else -> None."""
    match = _SP_RE.match(name.rstrip("/"))
    return match.group(1) if match else None


@dataclass(frozen=True, slots=True)
class JobLayout:
    """Keys of one job's objects, relative to the storage root."""

    job: str

    def __post_init__(self) -> None:
        validate_job_name(self.job)

    @property
    def root(self) -> str:
        return f"{self.job}/"

    # checkpoints ---------------------------------------------------------------
    @property
    def checkpoints_prefix(self) -> str:
        """The prefix of every ``chk-<n>/`` key (and of no other kind)."""
        return f"{self.root}chk-"

    def checkpoint_dir(self, checkpoint_id: int) -> str:
        return f"{self.job}/chk-{checkpoint_id}/"

    def checkpoint_metadata(self, checkpoint_id: int) -> str:
        return f"{self.checkpoint_dir(checkpoint_id)}{METADATA_NAME}"

    def checkpoint_file(self, checkpoint_id: int, relpath: str) -> str:
        return f"{self.checkpoint_dir(checkpoint_id)}{relpath}"

    def merged_file(self, checkpoint_id: int, sha256: str) -> str:
        """Merged small files of a full (non-incremental) checkpoint, keyed by content."""
        return self.checkpoint_file(checkpoint_id, f"{MERGED_DIR}{sha256}")

    # incremental shared files ----------------------------------------------------
    @property
    def shared_prefix(self) -> str:
        return f"{self.job}/shared/"

    def shared_file(self, sha256: str, epoch: int | None = None) -> str:
        """Content-addressed within one lease epoch: the same bytes uploaded by the
        holder of ``epoch`` always land at the same key. The epoch keeps a successor
        from ever uploading to a key a deposed holder may still delete (its collector's
        delete can land late; it never deletes a key of a newer epoch)."""
        suffix = "" if epoch is None else f".e{epoch}"
        return f"{self.shared_prefix}{sha256[:2]}/{sha256}{suffix}"

    @staticmethod
    def shared_key_epoch(key: str) -> int | None:
        """The lease epoch a shared key was uploaded under (None: before epochs)."""
        _, dot, tail = key.rpartition(".e")
        return int(tail) if dot and tail.isdigit() else None

    # savepoints ------------------------------------------------------------------
    @property
    def savepoints_prefix(self) -> str:
        return f"{self.job}/savepoints/"

    def savepoint_dir(self, savepoint_id: str) -> str:
        return f"{self.savepoints_prefix}sp-{validate_savepoint_id(savepoint_id)}/"

    def savepoint_metadata(self, savepoint_id: str) -> str:
        return f"{self.savepoint_dir(savepoint_id)}{METADATA_NAME}"

    def savepoint_file(self, savepoint_id: str, relpath: str) -> str:
        return f"{self.savepoint_dir(savepoint_id)}{relpath}"

    # control requests --------------------------------------------------------------
    @property
    def control_prefix(self) -> str:
        return f"{self.job}/control/"

    def control_request(self, request_id: str) -> str:
        return f"{self.control_prefix}{request_id}.json"

    def control_result(self, request_id: str) -> str:
        return f"{self.control_prefix}{request_id}.result.json"

    @property
    def doorbell_prefix(self) -> str:
        """Doorbells live beside the lease records, whose listing the heartbeat makes."""
        return f"{self.lease_prefix}doorbell-"

    def doorbell(self, request_id: str) -> str:
        return f"{self.doorbell_prefix}{request_id}"

    # driver lease ------------------------------------------------------------------
    @property
    def lease_prefix(self) -> str:
        return f"{self.job}/lease/"

    # history -----------------------------------------------------------------------
    @property
    def history_prefix(self) -> str:
        return f"{self.job}/history/"

    def history_event(self, seq: int) -> str:
        """The key of event number ``seq`` (16 digits, so keys sort in append order)."""
        return f"{self.history_prefix}{seq:016d}.json"
