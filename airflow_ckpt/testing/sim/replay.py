"""The replayed overlap: a checkpoint's files left behind by a lost executor, met again by
content by the next checkpoint but one while the one between completes (issue 25, the
GC window of ``gc-ignores-reservations``).

A shared file is pinned for a pending checkpoint from the moment it reserves the file
(:meth:`~airflow_ckpt.runtime.checkpoint.store.SharedFileRegistry.reserve`) until its
manifest is retained: the collector deletes only keys no retained manifest *and* no
reservation names. The reservation alone decides only when the pending checkpoint reuses
by content a key that is stored, no retained manifest names, and a confirmation already
cleared for deletion, while another checkpoint's collection decides. The threaded
coordinator runs exactly that schedule after an executor is lost:

1. checkpoint ``D`` (barrier ``d``) uploads all its files; an executor is lost before
   its marker (the query fails; the restart cancels ``D``);
2. the restarted query resumes the newest retained checkpoint ``L`` (batch ``l``,
   ``d >= l + 2``) with a new store, whose recovery stashes ``D``'s keys as
   unreferenced; the replay writes content-equal files;
3. the restarted run's first checkpoint ``C1`` (barrier ``l + 1``, below ``d``) confirms
   its marker (clearing the stash) and completes; its collection decides ``D``'s keys
   of the batches past ``l + 1`` are garbage, unless reserved;
4. meanwhile (the completion overlap, :mod:`~airflow_ckpt.testing.sim.overlap`) ``C2``
   (barrier ``l + 2``) uploads: its files of batch ``l + 2`` have ``D``'s bytes, so it
   reserves ``D``'s keys and references them without uploading.

:class:`ReplayedOverlap`, on a per-seed draw of a generator of its own, makes the loss
strike ``D`` at its last upload unit (every file durable) when ``d`` is two batches past
the newest retained checkpoint, and the restarted run's next completions overlap.
"""

from __future__ import annotations

import random

from airflow_ckpt.runtime.checkpoint.coordinator import CheckpointCoordinator

#: completions of the restarted run whose next checkpoint overlaps them
OVERLAPPED = 2


class ReplayedOverlap:
    """The story of one seed (see the module doc): ``on`` with a chance of its own."""

    def __init__(self, seed: int, allowed: bool = True) -> None:
        self.rng = random.Random(seed ^ 0x0E7B)
        self.on = self.rng.random() < 0.3 and allowed
        #: the checkpoint interval of the seed's drivers
        self.interval = self.rng.choice(("2 s", "3 s"))
        #: checkpoint id -> upload units started (of the coordinator it struck last)
        self._units: dict[int, int] = {}
        self.struck = 0

    def describe(self) -> str:
        return f"replayed overlap {self.on}"

    def strikes(self, coordinator: CheckpointCoordinator) -> bool:
        """At ``upload.before_file`` of a driver's checkpoint: True when the executor is
        lost now, at the last unit of a checkpoint two batches past the newest retained
        one (its files all durable, its marker never written)."""
        if not self.on:
            return False
        pending = [p for p in coordinator._pending
                   if p.captured and not p.done.is_set() and not p.is_savepoint]
        if len(pending) != 1:
            return False
        p = pending[0]
        retained = coordinator.store.retained
        newest = retained[-1].batch_id if retained else -1
        if p.barrier_batch is None or p.barrier_batch < newest + 2:
            return False
        started = self._units.get(p.checkpoint_id, 0) + 1
        self._units[p.checkpoint_id] = started
        staged = [f for d in coordinator.staging_root.glob(f"chk-{p.checkpoint_id}-*")
                  for f in d.rglob("*") if f.is_file() and not f.name.startswith(".")]
        if started < len(staged):
            return False
        self.struck += 1
        return True
