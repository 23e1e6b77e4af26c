"""CompletedCheckpointStore: retention, subsumption and shared-file garbage collection.

Safety argument (why a crash anywhere in here leaves nothing restorable broken):

* A checkpoint is restorable only if its ``_metadata`` exists, and ``_metadata`` is
  written after every file it lists is durable.
* Subsuming checkpoint ``k`` deletes ``chk-k/_metadata`` *first*, then the rest of
  ``chk-k/``. A crash in between leaves a directory without ``_metadata``: never
  restored, removed by the next :meth:`CompletedCheckpointStore.recover`.
* A shared file is deleted only when no retained checkpoint's manifest and no
  in-flight (pending) checkpoint references it. Savepoints never reference
  ``shared/``. So every file a restorable manifest lists stays.
* Pending checkpoints reserve their shared keys *before* deciding whether to upload
  (:class:`SharedFileRegistry`), so the collector never deletes a file that a
  checkpoint still being written has decided to reuse.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from airflow_ckpt.runtime.catalog import CheckpointCatalog
from airflow_ckpt.runtime.layout import JobLayout
from airflow_ckpt.runtime.metadata import Manifest
from airflow_ckpt.runtime.storage.base import CheckpointStorage

log = logging.getLogger(__name__)


class SharedFileRegistry:
    """Which ``shared/`` keys are stored, and which in-flight checkpoints use which."""

    def __init__(self, present: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._present: set[str] = set(present)
        self._reserved: dict[int, set[str]] = {}

    def reserve(self, checkpoint_id: int, key: str) -> bool:
        """Pin ``key`` for a pending checkpoint; True if it still has to be uploaded."""
        with self._lock:
            self._reserved.setdefault(checkpoint_id, set()).add(key)
            return key not in self._present

    def uploaded(self, key: str) -> None:
        with self._lock:
            self._present.add(key)

    def release(self, checkpoint_id: int) -> None:
        """The checkpoint completed (its manifest now pins its keys) or was declined."""
        with self._lock:
            self._reserved.pop(checkpoint_id, None)

    def collectable(self, stored: Iterable[str], referenced: set[str]) -> list[str]:
        """Of the ``stored`` shared keys, those no manifest and no pending checkpoint uses.

        The returned keys are forgotten as present, so a later checkpoint uploads them
        again instead of referencing a file that is about to be deleted.
        """
        with self._lock:
            pinned = referenced.union(*self._reserved.values())
            garbage = [key for key in stored if key not in pinned]
            self._present.difference_update(garbage)
            return garbage


class CompletedCheckpointStore:
    """Keeps the newest ``num_retained`` completed checkpoints of one job."""

    def __init__(self, storage: CheckpointStorage, job: str, num_retained: int) -> None:
        self.storage = storage
        self.layout = JobLayout(job)
        self.catalog = CheckpointCatalog(storage, job)
        self.num_retained = num_retained
        self._lock = threading.Lock()
        self.shared = SharedFileRegistry()
        self._retained: list[Manifest] = []

    @property
    def retained(self) -> list[Manifest]:
        """Completed checkpoints kept, oldest first."""
        with self._lock:
            return list(self._retained)

    def recover(self) -> int:
        """Load what storage holds; remove abandoned (marker-less) checkpoint directories.

        Must run before any checkpoint of this driver starts (the runtime holds the
        job exclusively then). Returns the next free checkpoint id: one more than any
        id ever used, completed or not, so ids never repeat.
        """
        completed = self.catalog.checkpoint_ids()
        every = self.catalog.checkpoint_ids(completed_only=False)
        for n in sorted(set(every) - set(completed)):
            log.info("removing abandoned checkpoint chk-%d (no _metadata)", n)
            self.storage.delete_prefix(self.layout.checkpoint_dir(n))
        with self._lock:
            self._retained = [self.catalog.checkpoint(n) for n in completed]
        stored = self.storage.list(self.layout.shared_prefix)
        self.shared = SharedFileRegistry(i.key for i in stored)
        self.subsume_and_collect()
        savepoint_ids = [m.checkpoint_id for m in self.catalog.savepoints()]
        return max([0, *every, *savepoint_ids]) + 1

    def add(self, manifest: Manifest) -> list[int]:
        """Register a completed checkpoint (its ``_metadata`` is durable); subsume old ones.

        Returns the ids of the checkpoints that were subsumed and deleted.
        """
        with self._lock:
            self._retained.append(manifest)
            self._retained.sort(key=lambda m: m.checkpoint_id)
        self.shared.release(manifest.checkpoint_id)
        return self.subsume_and_collect()

    def subsume_and_collect(self) -> list[int]:
        """Delete checkpoints beyond ``num_retained`` and unreferenced shared files."""
        with self._lock:
            excess = len(self._retained) - self.num_retained
            subsumed = self._retained[:max(excess, 0)]
            self._retained = self._retained[max(excess, 0):]
            referenced = {
                self.layout.root + f.key for m in self._retained for f in m.files if f.shared
            }
        for manifest in subsumed:
            # _metadata first: from here on the checkpoint is no longer restorable.
            self.storage.delete_many([self.layout.checkpoint_metadata(manifest.checkpoint_id)])
            self.storage.delete_prefix(self.layout.checkpoint_dir(manifest.checkpoint_id))
        stored = [i.key for i in self.storage.list(self.layout.shared_prefix)]
        garbage = self.shared.collectable(stored, referenced)
        if garbage:
            self.storage.delete_many(garbage)
        if subsumed or garbage:
            log.info(
                "subsumed checkpoints %s, deleted %d unreferenced shared files",
                [m.checkpoint_id for m in subsumed], len(garbage),
            )
        return [m.checkpoint_id for m in subsumed]

    def discard_all(self) -> None:
        """DELETE_ON_CANCELLATION: remove every retained checkpoint and shared file."""
        with self._lock:
            self.num_retained, keep = 0, self.num_retained
        try:
            self.subsume_and_collect()
        finally:
            with self._lock:
                self.num_retained = keep
