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
* The collector decides and deletes as one step against a consistent view: it reads
  the retained manifests and the reservations under the store's lock, and
  :meth:`CompletedCheckpointStore.add` appends a manifest *before* releasing its
  reservations, so at every instant a file of a pending or completed checkpoint is
  pinned by one or the other. Collections run one at a time.
* A key judged garbage is *tombstoned* until its delete has returned: a checkpoint
  that reserves it meanwhile waits for the delete and then uploads it again, so a
  delete never removes a file uploaded after the decision.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from airflow_ckpt.errors import MetadataError
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.metadata import FileEntry, Manifest
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout

log = logging.getLogger(__name__)


class SharedFileRegistry:
    """Which ``shared/`` keys are stored, which pending checkpoints use which, and which
    are being deleted."""

    def __init__(self, present: Iterable[str] = ()) -> None:
        self._cond = threading.Condition()
        self._present: set[str] = set(present)
        self._reserved: dict[int, set[str]] = {}
        self._deleting: set[str] = set()

    def reserve(self, checkpoint_id: int, key: str) -> bool:
        """Pin ``key`` for a pending checkpoint; True if it still has to be uploaded.

        If the collector is deleting ``key`` right now, wait until the delete returned
        (then it must be uploaded again).
        """
        with self._cond:
            self._reserved.setdefault(checkpoint_id, set()).add(key)
            self._cond.wait_for(lambda: key not in self._deleting)
            return key not in self._present

    def uploaded(self, key: str) -> None:
        with self._cond:
            self._present.add(key)

    def release(self, checkpoint_id: int) -> None:
        """The checkpoint completed (its manifest now pins its keys) or was declined."""
        with self._cond:
            self._reserved.pop(checkpoint_id, None)

    def collectable(self, stored: Iterable[str], referenced: set[str]) -> list[str]:
        """Of the ``stored`` shared keys, those no manifest and no pending checkpoint uses.

        The returned keys are tombstoned: forgotten as present and reserved by nobody
        until :meth:`deleted` is called, so a checkpoint that wants one meanwhile waits
        and then uploads it again instead of referencing a file about to be deleted.
        """
        with self._cond:
            pinned = referenced.union(*self._reserved.values())
            garbage = [key for key in stored if key not in pinned]
            self._present.difference_update(garbage)
            self._deleting.update(garbage)
            return garbage

    def deleted(self, keys: Iterable[str]) -> None:
        """The delete of tombstoned ``keys`` returned (or failed): release the waiters."""
        with self._cond:
            self._deleting.difference_update(keys)
            self._cond.notify_all()


class CompletedCheckpointStore:
    """Keeps the newest ``num_retained`` completed checkpoints of one job."""

    def __init__(self, storage: CheckpointStorage, job: str, num_retained: int, *,
                 epoch: int | None = None,
                 confirm: Callable[[], None] = lambda: None) -> None:
        self.storage = storage
        self.layout = JobLayout(job)
        #: the lease epoch of this driver; shared keys of newer epochs are never deleted
        self.epoch = epoch
        #: raises if another driver claimed the job (``JobLease.confirm``): called after
        #: the listing a collection deletes from and before its first delete
        self.confirm = confirm
        self.catalog = CheckpointCatalog(storage, job)
        self.num_retained = num_retained
        self._lock = threading.Lock()
        self._collecting = threading.Lock()  # one collection at a time
        self.shared = SharedFileRegistry()
        self._retained: list[Manifest] = []
        self._pinned: int | None = None  # never subsumed: the checkpoint restored from

    @property
    def retained(self) -> list[Manifest]:
        """Completed checkpoints kept, oldest first."""
        with self._lock:
            return list(self._retained)

    def shared_index(self) -> dict[str, FileEntry]:
        """The files of the retained checkpoints in ``shared/`` (whole, or segments of
        merged objects), by SHA-256: a new checkpoint references such a file instead of
        uploading the bytes again (after reserving its object, which may have been
        collected meanwhile), also across lease epochs, whose new uploads get keys of
        their own."""
        with self._lock:
            return {f.sha256: f for m in self._retained for f in m.files if f.shared}

    def recover(self, pinned: int | None = None, distrust: Iterable[str] = ()) -> int:
        """Load what storage holds; remove abandoned (marker-less) checkpoint directories.

        Must run before any checkpoint of this driver starts (the runtime holds the
        job exclusively then). ``pinned``: the checkpoint the run restored from; it is
        never subsumed until a checkpoint of this run completes (after a fallback past
        damaged newer ones it may not be among the newest ``num_retained``).
        ``distrust``: shared keys found damaged; they are uploaded again when next
        needed (content addressing would otherwise reuse the bad bytes). Returns
        the next free checkpoint id: one more than any id ever used, completed or not,
        so ids never repeat.
        """
        self._pinned = pinned
        aborted = self.storage.abort_incomplete_uploads(self.layout.root)
        if aborted:
            log.info("aborted %d incomplete multipart uploads of a previous driver", aborted)
        completed = self.catalog.checkpoint_ids()
        every = self.catalog.checkpoint_ids(completed_only=False)
        for n in sorted(set(every) - set(completed)):
            log.info("removing abandoned checkpoint chk-%d (no _metadata)", n)
            self.storage.delete_prefix(self.layout.checkpoint_dir(n))
        readable = [m for n in completed if (m := self._readable(n)) is not None]
        with self._lock:
            self._retained = readable
        stored = self.storage.list(self.layout.shared_prefix)
        bad = set(distrust)
        self.shared = SharedFileRegistry(i.key for i in stored if i.key not in bad)
        self.subsume_and_collect()
        savepoint_ids = [m.checkpoint_id for m in self.catalog.savepoints()]
        return max([0, *every, *savepoint_ids]) + 1

    def _readable(self, checkpoint_id: int) -> Manifest | None:
        """The manifest of a completed checkpoint, or None when its ``_metadata`` is
        damaged: such a checkpoint cannot be restored (``restore`` falls back past it)
        and pins nothing; one damaged marker must not fail every later driver."""
        try:
            return self.catalog.checkpoint(checkpoint_id)
        except MetadataError as exc:
            log.warning("checkpoint chk-%d is not retained: its _metadata is damaged (%s)",
                        checkpoint_id, exc)
            return None

    def add(self, manifest: Manifest) -> list[int]:
        """Register a completed checkpoint (its ``_metadata`` is durable); subsume old ones.

        Returns the ids of the checkpoints that were subsumed and deleted.
        """
        with self._lock:
            # Appended before the reservations are released: see the module doc.
            self._retained.append(manifest)
            self._retained.sort(key=lambda m: m.checkpoint_id)
            if self._pinned is not None and manifest.checkpoint_id > self._pinned:
                self._pinned = None  # this run has a checkpoint of its own now
        self.shared.release(manifest.checkpoint_id)
        return self.subsume_and_collect()

    def subsume_and_collect(self) -> list[int]:
        """Delete checkpoints beyond ``num_retained`` and unreferenced shared files."""
        with self._collecting:
            return self._subsume_and_collect()

    def _subsume_and_collect(self) -> list[int]:
        with self._lock:
            keep = [m for m in self._retained if m.checkpoint_id != self._pinned]
            excess = max(len(keep) - self.num_retained, 0)
            subsumed = keep[:excess]
            self._retained = [m for m in self._retained if m not in subsumed]
        for manifest in subsumed:
            # _metadata first: from here on the checkpoint is no longer restorable.
            self.storage.delete_many([self.layout.checkpoint_metadata(manifest.checkpoint_id)])
        # Listed before the view is taken: a file uploaded after the listing is not a
        # candidate at all; one uploaded before it is pinned by its reservation or, once
        # its checkpoint completed, by the retained manifest (the view below).
        stored = [i.key for i in self.storage.list(self.layout.shared_prefix)
                  if (self.layout.shared_key_epoch(i.key) or 0) <= (self.epoch or 0)]
        with self._lock:
            referenced = {
                self.layout.root + f.key for m in self._retained for f in m.files if f.shared
            }
            garbage = self.shared.collectable(stored, referenced)
        try:
            if garbage or any(not all(f.shared for f in m.files) for m in subsumed):
                # Confirmed after the markers above are gone and the listing was taken:
                # a successor claims later, so it adopts none of the subsumed checkpoints
                # and reuses none of these files; deletes that land late harm nobody.
                self.confirm()
            for manifest in subsumed:
                if not all(f.shared for f in manifest.files):
                    # An incremental checkpoint's directory holds its _metadata alone:
                    # only its async phase writes there, and it writes all to shared/.
                    self.storage.delete_prefix(
                        self.layout.checkpoint_dir(manifest.checkpoint_id))
            interleave.point(interleave.GC_BEFORE_DELETE)
            if garbage:
                self.storage.delete_many(garbage)
        finally:
            self.shared.deleted(garbage)
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
