"""The savepoint history: the savepoints a job took itself, kept to a count and an age.

The Flink Kubernetes operator keeps a history of the savepoints it triggered and
disposes the oldest beyond ``savepoint.history.max.count`` and those older than
``savepoint.history.max.age`` (never the newest: "due to lazy clean-up, the most recent
savepoint may live longer than the max age"). The same here, per job, for
exactly the savepoints the job took *for itself*:

* periodic savepoints (``periodic-savepoint.interval``), and
* savepoints requested without a name (the job named them after the request),

both marked in their manifest (``extra.savepoint_history: true``, :data:`IN_HISTORY`,
written with ``_metadata``, never changed). Never a candidate: a savepoint its requester
named (``savepoint_id``: named to keep), an imported one, one written before the field
existed, one a run restored from (:func:`mark_restored`), and the newest history
savepoint. ``airflow-ckpt dispose`` still deletes any savepoint on purpose.

Which is older is decided by checkpoint id (ids never repeat and grow across drivers),
never by clocks. Only ``max.age`` compares a savepoint's recorded completion time (the
clock of the driver that took it) with this driver's clock: skew moves *when* an old
savepoint goes, and no guarantee rests on it (the newest, the named and the restored
ones are never candidates, whatever the clocks say).

Record kinds (one writer, one reader each):

* ``savepoints/sp-<id>/_restored``: written create-only by the driver that restored from
  the savepoint (:func:`mark_restored`), read by this retention only;
* the savepoint itself: written by the driver that took it, deleted by this retention
  (history savepoints of its own job, under its lease) or by ``dispose`` (a person).

Retention runs after a history savepoint completed (a completion listener on the
driver), never at start-up: starting a job reads no savepoint.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from airflow_ckpt.errors import ObjectAlreadyExistsError
from airflow_ckpt.runtime.checkpoint.metadata import Manifest, parse_manifest
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout

log = logging.getLogger("airflow_ckpt.savepoints")

#: the manifest's ``extra`` key that puts a savepoint in its job's savepoint history
IN_HISTORY = "savepoint_history"
#: the name, inside a savepoint's directory, of the mark a restore leaves
RESTORED_NAME = "_restored"


def mark_restored(storage: CheckpointStorage, manifest: Manifest) -> None:
    """Record that a run restored from the savepoint ``manifest`` (create-only; a mark in
    place already says the same): no retention disposes of it from then on. Durable on
    return."""
    assert manifest.savepoint_id is not None
    key = JobLayout(manifest.job).savepoint_file(manifest.savepoint_id, RESTORED_NAME)
    with contextlib.suppress(ObjectAlreadyExistsError):  # restored from before: marked
        storage.put_bytes(key, b"", create_only=True)


def delete_savepoint(storage: CheckpointStorage, metadata_key: str, keys: list[str]) -> None:
    """Delete a savepoint: ``_metadata`` first (it stops being restorable at once; a
    crash part-way leaves an incomplete directory, never restored), then ``keys``, the
    rest of its directory."""
    storage.delete_many([metadata_key])
    storage.delete_many(k for k in keys if k != metadata_key)


@dataclass(frozen=True, slots=True)
class _Entry:
    """What retention needs of one completed savepoint (read once per driver)."""

    savepoint_id: str
    checkpoint_id: int
    completed_ts: float
    in_history: bool


class SavepointHistory:
    """Disposes of the job's history savepoints beyond ``max_count`` or older than
    ``max_age_s`` (0: no age limit), never the newest, a kept or a restored one.

    :param storage: the driver's view (gated by its lease: a deposed driver deletes
        nothing once its gate closed)
    :param clock: the wall clock ``max_age_s`` is measured on (see the module doc)
    """

    def __init__(self, storage: CheckpointStorage, job: str, *, max_count: int,
                 max_age_s: float, clock: Callable[[], float] = time.time) -> None:
        self.storage = storage
        self.layout = JobLayout(job)
        self.max_count = max_count
        self.max_age_s = max_age_s
        self.clock = clock
        self._read: dict[str, _Entry] = {}

    def on_completed(self, manifest: Manifest) -> None:
        """A completion listener: after a history savepoint of this job completed,
        apply the retention."""
        if manifest.is_savepoint and manifest.extra.get(IN_HISTORY) is True \
                and manifest.job == self.layout.job:
            self.collect()

    def collect(self) -> list[str]:
        """Dispose of the history savepoints retention no longer keeps; return their ids.

        One LIST of ``savepoints/``, a GET per completed savepoint not read by this
        driver before, and the deletes: with retention in place, bounded by
        ``max_count`` plus the savepoints kept on purpose.
        """
        listing: dict[str, list[str]] = {}
        prefix = self.layout.savepoints_prefix
        for info in self.storage.list(prefix):
            head, _, _ = info.key[len(prefix):].partition("/")
            if head.startswith("sp-"):
                listing.setdefault(head[3:], []).append(info.key)
        candidates = []
        for savepoint_id, keys in listing.items():
            metadata = self.layout.savepoint_metadata(savepoint_id)
            if metadata not in keys:
                continue  # being written, or its writer failed: not completed
            entry = self._entry(savepoint_id, metadata)
            if self._disposable(entry, keys):
                candidates.append(entry)
        disposed = [e.savepoint_id for e in self._expired(candidates)]
        for savepoint_id in disposed:
            delete_savepoint(self.storage, self.layout.savepoint_metadata(savepoint_id),
                             listing[savepoint_id])
            del self._read[savepoint_id]
        if disposed:
            log.info("savepoint history: disposed of %s (max.count %d, max.age %g s)",
                     disposed, self.max_count, self.max_age_s)
        return disposed

    def _entry(self, savepoint_id: str, metadata_key: str) -> _Entry:
        entry = self._read.get(savepoint_id)
        if entry is None:
            manifest = parse_manifest(self.storage.get_bytes(metadata_key), where=metadata_key)
            entry = _Entry(savepoint_id, manifest.checkpoint_id, manifest.timings.completed_ts,
                           manifest.is_savepoint and manifest.extra.get(IN_HISTORY) is True)
            self._read[savepoint_id] = entry
        return entry

    def _disposable(self, entry: _Entry, keys: list[str]) -> bool:
        """Whether retention may ever dispose of ``entry``: a history savepoint that no
        run restored from."""
        restored = self.layout.savepoint_file(entry.savepoint_id, RESTORED_NAME)
        return entry.in_history and restored not in keys

    def _expired(self, candidates: list[_Entry]) -> list[_Entry]:
        """Of the disposable ``candidates``, those beyond ``max_count`` (oldest first, by
        checkpoint id) or older than ``max_age_s``; never the newest."""
        ordered = sorted(candidates, key=lambda e: e.checkpoint_id)[:-1]
        excess = max(len(ordered) + 1 - self.max_count, 0)
        now = self.clock()
        return [e for i, e in enumerate(ordered)
                if i < excess or (self.max_age_s > 0 and e.completed_ts < now - self.max_age_s)]
