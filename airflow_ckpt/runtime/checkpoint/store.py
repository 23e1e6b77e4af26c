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
* *A file is deleted one lease confirmation after the markers that named it.* A
  collection deletes the markers it subsumes at once (it runs after the new marker was
  confirmed), but the files they named, and any other unreferenced key, only wait in
  the *stash*: they become deletable when a lease confirmation that started after the
  stash was taken succeeded (:meth:`CompletedCheckpointStore.confirmed`, the next
  checkpoint's marker confirmation), and are deleted by the next collection, decided
  again then against the reservations and the retained manifests. So a successor,
  whose claim comes after that confirmation, adopts none of the subsumed checkpoints
  and reuses none of the deleted files: what a confirmation of its own between the
  marker deletes and the file deletes gave, without a LIST of ``lease/`` per
  collection. Where a key may be stored is known without listing ``shared/`` either:
  the listing at :meth:`CompletedCheckpointStore.recover` plus every upload this driver
  started (:meth:`SharedFileRegistry.attempted`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from airflow_ckpt.errors import MetadataError, RestoreError
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
        #: uploads started and not known to have succeeded: maybe stored
        self._attempted: set[str] = set()
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

    def attempted(self, key: str) -> None:
        """An upload of ``key`` starts: from now on it may be stored (a collection
        candidate), but it is not reusable until :meth:`uploaded`."""
        with self._cond:
            self._attempted.add(key)

    def uploaded(self, key: str) -> None:
        with self._cond:
            self._attempted.discard(key)
            self._present.add(key)

    def stored(self) -> set[str]:
        """Every key that may be stored: known present, or its upload was started."""
        with self._cond:
            return self._present | self._attempted

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
            self._attempted.difference_update(garbage)
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
        #: checkpoints whose marker is durable and confirmed, not added yet (see marked)
        self._marked: set[int] = set()
        self._pinned: int | None = None  # never subsumed: the checkpoint restored from
        #: the pinned checkpoint when it is not retained (below the retention floor: an
        #: operator's explicit target): its files stay until its marker is deleted
        self._base: Manifest | None = None
        #: keys to delete after a confirmation, by stash number (see the module doc)
        self._stash: list[tuple[int, list[str]]] = []
        self._stashes = 0
        #: stashed keys a confirmation has cleared for deletion
        self._cleared: list[str] = []

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

    def recover(self, pinned: Manifest | None = None, distrust: Iterable[str] = ()) -> int:
        """Load what storage holds; remove abandoned (marker-less) checkpoint directories.

        Must run before any checkpoint of this driver starts (the runtime holds the
        job exclusively then). ``pinned``: the manifest of the checkpoint the run
        restored from (as the restore read it); it is never subsumed until a checkpoint
        of this run completes (after a fallback past damaged newer ones it may not be
        among the newest ``num_retained``).
        ``distrust``: shared keys found damaged; they are uploaded again when next
        needed (content addressing would otherwise reuse the bad bytes). Returns
        one more than every checkpoint directory's id, completed or not; the driver
        starts at the larger of that and its lease record's ``first_id``, which is past
        every id a holder reserved, its savepoints' too (so no savepoint is read here:
        the start-up reads are bounded by the retained checkpoints, whatever the job's
        age).
        """
        self._pinned = pinned.checkpoint_id if pinned is not None else None
        aborted = self.storage.abort_incomplete_uploads(self.layout.root)
        if aborted:
            log.info("aborted %d incomplete multipart uploads of a previous driver", aborted)
        completed = self.catalog.checkpoint_ids()
        every = self.catalog.checkpoint_ids(completed_only=False)
        # The run's own base is never swept, also when it does not count (an operator's
        # explicit target below the retention floor of markers that count since: job
        # seed 108, session 14): a restart before the run's first checkpoint needs it.
        uncounted = set(every) - set(completed)  # marker-less, or below the floor
        abandoned = sorted(uncounted - {self._pinned})
        if abandoned:
            # A successor's marker may land between the two listings (this driver deposed,
            # its gate passing on a drifting clock): confirm before sweeping. A successor
            # claiming after this starts past every directory listed here.
            self.confirm()
        for n in abandoned:
            log.info("removing abandoned checkpoint chk-%d (no _metadata)", n)
            self.storage.delete_prefix(self.layout.checkpoint_dir(n))
        readable = [m for n in completed if (m := self._readable(n)) is not None]
        # The run's base below the retention floor is no retained checkpoint (it adds
        # nothing to a floor), but its files are kept like one's while its marker is
        # stored: then subsumed, marker first, once the run has a checkpoint of its own
        # (job seed 413159, session 18: its files were collected, its marker left).
        base = pinned if self._pinned in uncounted else None
        with self._lock:
            self._retained = readable
            self._base = base
        stored = self.storage.list(self.layout.shared_prefix)
        bad = set(distrust)
        self.shared = SharedFileRegistry(i.key for i in stored if i.key not in bad
                                         and self._own_epoch_or_older(i.key))
        self.subsume_and_collect()
        return max([0, *every]) + 1

    def _readable(self, checkpoint_id: int) -> Manifest | None:
        """The manifest of a completed checkpoint, or None when its ``_metadata`` is
        damaged or gone since the listing (a deposed driver's late retention, a person):
        such a checkpoint cannot be restored (``restore`` falls back past it) and pins
        nothing; one damaged or vanished marker must not fail every later driver."""
        try:
            return self.catalog.checkpoint(checkpoint_id)
        except (MetadataError, RestoreError) as exc:
            log.warning("checkpoint chk-%d is not retained: its _metadata is damaged or "
                        "gone (%s)", checkpoint_id, exc)
            return None

    def retention_floor(self, checkpoint_id: int) -> int:
        """The lowest checkpoint id still retained once ``checkpoint_id`` completed (its
        manifest records it): the newest ``num_retained`` of the retained ones and it
        (the pinned one is no longer pinned then), counting the :meth:`marked` ones as
        retained. Every marker below it is subsumed, or is about to be, so readers
        ignore it (a late copy of a deleted marker)."""
        with self._lock:
            ids = sorted({m.checkpoint_id for m in self._retained} | self._marked
                         | {checkpoint_id})
        return ids[-max(self.num_retained, 1):][0]

    def marked(self, checkpoint_id: int) -> None:
        """The marker of ``checkpoint_id`` is durable and the lease was confirmed after
        it: it counts from now on, and :meth:`add` follows. Until then the retention
        floor of a later checkpoint counts it as retained: the threaded coordinator
        may run the next checkpoint's whole async phase, its manifest included,
        between this marker and its :meth:`add` (job seeds 12 and 30, session 15)."""
        with self._lock:
            self._marked.add(checkpoint_id)

    def add(self, manifest: Manifest) -> list[int]:
        """Register a completed checkpoint (its ``_metadata`` is durable); subsume old ones.

        Returns the ids of the checkpoints that were subsumed and deleted.
        """
        with self._lock:
            # Appended before the reservations are released: see the module doc.
            self._retained.append(manifest)
            self._retained.sort(key=lambda m: m.checkpoint_id)
            self._marked.discard(manifest.checkpoint_id)
            if self._pinned is not None and manifest.checkpoint_id > self._pinned:
                self._pinned = None  # this run has a checkpoint of its own now
        self.shared.release(manifest.checkpoint_id)
        return self.subsume_and_collect()

    def subsume_and_collect(self) -> list[int]:
        """Delete checkpoints beyond ``num_retained`` (their markers now, their files
        after the next confirmation) and unreferenced shared files, in one batched
        delete (see the module doc)."""
        with self._collecting:
            return self._subsume_and_collect()

    def stashed(self) -> int:
        """How many stashes were taken so far: pass it to :meth:`confirmed` after a
        lease confirmation that started after this call."""
        with self._lock:
            return self._stashes

    def confirmed(self, stashed: int) -> None:
        """A lease confirmation that started after :meth:`stashed` returned ``stashed``
        succeeded: the keys of those stashes may be deleted by the next collection."""
        with self._lock:
            self._cleared.extend(k for n, keys in self._stash if n <= stashed for k in keys)
            self._stash = [(n, keys) for n, keys in self._stash if n > stashed]

    def _own_epoch_or_older(self, key: str) -> bool:
        return (self.layout.shared_key_epoch(key) or 0) <= (self.epoch or 0)

    def _subsume_and_collect(self) -> list[int]:
        with self._lock:
            keep = [m for m in self._retained if m.checkpoint_id != self._pinned]
            excess = max(len(keep) - self.num_retained, 0)
            subsumed = keep[:excess]
            self._retained = [m for m in self._retained if m not in subsumed]
            if self._base is not None and self._pinned is None:
                subsumed.insert(0, self._base)  # the run has a checkpoint of its own
                self._base = None
            cleared, self._cleared = self._cleared, []
            referenced = self._referenced()
        maybe_stored = self.shared.stored()
        shared = sorted({k for k in cleared if k in maybe_stored})
        own = sorted({k for k in cleared if not k.startswith(self.layout.shared_prefix)})
        # decided again now: a stashed key reserved or referenced since stays
        garbage = self.shared.collectable(shared, referenced)
        # _metadata first: the files of these markers are only stashed below; the files
        # deleted now were named by markers deleted before the confirmation that
        # cleared them.
        markers = [self.layout.checkpoint_metadata(m.checkpoint_id) for m in subsumed]
        try:
            interleave.point(interleave.GC_BEFORE_DELETE)
            if markers or garbage or own:
                self.storage.delete_many([*markers, *own, *garbage])
        finally:
            self.shared.deleted(garbage)
        self._stash_unreferenced(subsumed)
        if subsumed or garbage or own:
            log.info(
                "subsumed checkpoints %s, deleted %d files of earlier ones and %d "
                "unreferenced shared files",
                [m.checkpoint_id for m in subsumed], len(own), len(garbage),
            )
        return [m.checkpoint_id for m in subsumed]

    def _referenced(self) -> set[str]:
        """The shared keys the retained checkpoints name, and the run's base while it
        is pinned (under ``_lock``)."""
        kept = [*self._retained, *([self._base] if self._base is not None else [])]
        return {self.layout.root + f.key for m in kept for f in m.files if f.shared}

    def _stash_unreferenced(self, subsumed: list[Manifest]) -> None:
        """Stash, for deletion after the next confirmation, the own objects of the
        ``subsumed`` checkpoints (their markers are deleted) and every shared key that
        may be stored and no retained manifest names now."""
        own = [self.layout.root + f.key for m in subsumed for f in m.files
               if not f.shared and not f.is_inline]
        with self._lock:
            referenced = self._referenced()
            waiting = set(self._cleared).union(*(keys for _, keys in self._stash))
            stored = [k for k in self.shared.stored() if k not in referenced
                      and k not in waiting and self._own_epoch_or_older(k)]
            keys = sorted(set(own)) + sorted(stored)
            if keys:
                self._stashes += 1
                self._stash.append((self._stashes, keys))

    def discard_all(self) -> None:
        """DELETE_ON_CANCELLATION: remove every retained checkpoint and shared file."""
        with self._lock:
            self.num_retained, keep = 0, self.num_retained
        try:
            self.subsume_and_collect()
            stashed = self.stashed()
            self.confirm()
            self.confirmed(stashed)
            self.subsume_and_collect()
        finally:
            with self._lock:
                self.num_retained = keep
