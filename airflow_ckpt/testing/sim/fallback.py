"""The fallback under a deposed collection: a successor restoring the checkpoint a
deposed holder's collection is subsuming (issue 25, ``collect-unconfirmed``).

A collection deletes the markers it subsumes at once and only *stashes* their files;
they are deleted by a later collection, after a lease confirmation that started after
the stash was taken (``CompletedCheckpointStore.confirmed``).
So a successor that read a subsumed marker before its delete (it claimed after the
holder's last confirmation) finds the files the marker names: the holder's next
confirmation fails. A successor reads a marker being subsumed only when it falls back
to it, past the newer markers, which the vandal damaged or deleted (otherwise the
newest readable marker's retention floor is above it). With the completion overlap
(:mod:`~airflow_ckpt.testing.sim.overlap`, window *b*) the confirmation that precedes a
collection's stash may be the overlapping checkpoint's, which started before that stash
was taken: it must not clear it.

:class:`SubsumedFallback`, on a per-seed draw of a generator of its own, plays it once:

1. at ``store.gc.before_delete`` of a holder completing ``N`` while window *b* is open
   (``N+1``'s marker confirmed, its completion waiting), when a marker ``m`` below the
   retained ones is still stored (about to be deleted: subsumed), the vandal deletes
   every marker above ``m`` (``N+1``'s and ``N``'s among them), and the holder's host is
   suspended (its heartbeat thread with it: its monotonic clock stands still, so its
   gate passes when it wakes) until a successor's restore read ``m``'s marker;
2. the successor's next reads wait (slow GETs) while the holder wakes and completes: its
   collection deletes ``m``'s marker and stashes ``m``'s files; then (the holder's thread
   descheduled before its history append, its heartbeat thread starved) ``N+1``'s
   completion runs its collection; only then the successor reads ``m``'s files.

``job-gc-damage`` (ground truth: the objects and the vandal's record): every file of
``m`` is still stored when the successor reads it, unless the vandal touched it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.storage.layout import METADATA_NAME, JobLayout, parse_checkpoint_dir
from airflow_ckpt.testing.sim.overlap import _Window
from airflow_ckpt.testing.sim.scheduler import Actor

if TYPE_CHECKING:
    from airflow_ckpt.testing.sim.job import JobWorld, SimJob

#: how long (virtual seconds) the successor's read waits for the holder's collections
#: at most (liveness only: the holder may die or lose its lease first)
WAIT_S = 120.0


class SubsumedFallback:
    """The story of one seed (see the module doc); ``drawn`` with a chance of its own."""

    def __init__(self, seed: int, world: JobWorld, invariant: str,
                 allowed: bool = True) -> None:
        self.world, self.invariant = world, invariant
        self.drawn = random.Random(seed ^ 0x0E7C).random() < 0.5 and allowed
        self.layout = JobLayout(world.job)
        self.window: _Window | None = None  # the window b it struck in
        self.host: str | None = None  # the holder's host
        self.number: int | None = None  # m: the checkpoint the successor falls back to
        self.files: frozenset[str] = frozenset()  # m's objects
        self.restorer: Actor | None = None  # the successor whose restore is watched
        self.reading = False  # its restore read m's marker
        self.read = False  # ... and went on to m's files
        self.deciding = False  # N+1's collection decided (reached its delete)
        self.collected = False  # N+1's completion is past its collection
        self.lease: JobLease | None = None  # the holder's lease
        self.store: CompletedCheckpointStore | None = None  # the holder's store
        #: a holder's thread -> the ids its store retained before its completion's add
        self._retained: dict[Actor, set[int]] = {}

    def describe(self) -> str:
        return f"subsumed fallback {self.drawn}"

    @property
    def active(self) -> bool:
        """Struck, and the successor has not read ``m``'s files yet."""
        return self.window is not None and not self.read

    def before_add(self, actor: Actor) -> None:
        """At ``coordinator.before_store_add`` on a holder's thread: what its store
        retains before the add (its collection subsumes some of them)."""
        job = self._job_of(actor)
        if self.drawn and self.window is None and job is not None \
                and job.coordinator is not None:
            self._retained[actor] = {m.checkpoint_id for m in job.coordinator.store.retained}

    def before_delete(self, actor: Actor, window: _Window | None) -> None:
        """At ``store.gc.before_delete`` on a holder's thread, after the completion
        overlap's wait: step 1 (see the module doc)."""
        world, sched = self.world, self.world.scheduler
        if window is not None and window is self.window and actor is window.phase:
            self.deciding = True  # N+1's collection: its delete is next
            return
        job = self._job_of(actor)
        record = job.lease.record if job is not None else None
        if not self.drawn or self.window is not None or world.recovering \
                or window is None or window.completing is not actor or not window.confirmed \
                or window.phase is None \
                or not window.phase.alive or record is None or job is None \
                or job.coordinator is None \
                or record.epoch != max(world._epochs_seen, default=0) \
                or job.lease.failure is not None or job.lease._in_flight \
                or job.lease.clock() >= job.lease._valid_until \
                or not any(a.host is not actor.host for a in world._other_drivers(actor)):
            return
        retained = {m.checkpoint_id for m in job.coordinator.store.retained}
        stored = sorted(n for key in world.objects.objects
                        if (n := self._marker_of(key)) is not None)
        # subsumed by this collection, its marker still stored (and intact)
        subsumed = [n for n in stored if n in self._retained.pop(actor, set()) - retained
                    and n in world.counted()]
        manifest = world.manifest(self.layout.checkpoint_metadata(subsumed[-1])) \
            if subsumed else None
        files = frozenset(self.layout.root + f.key for f in manifest.files
                          if not f.is_inline) if manifest is not None else frozenset()
        if not files:
            return
        self.window, self.host, self.number = window, actor.host.name, subsumed[-1]
        self.files, self.lease = files, job.lease
        self.store = job.coordinator.store
        if job.sink is not None and hasattr(job.sink, "_lock"):
            # N's and N+1's completions commit the sink at once now (step 2): its lock
            # made actor-aware, as the overlap does with the others
            job.sink._lock = world.overlap.lock()
        world.coverage["subsumed-fallback"] += 1
        sched.log(f"the vandal deletes every marker above chk-{self.number}, which this "
                  "collection subsumes")
        for n in stored:
            if n > self.number:
                world._damage(self.layout.checkpoint_metadata(n), delete=True)
        deadline = sched.now + 15 * world.ttl_s
        while not self.reading and sched.now < deadline:
            sched.suspend(world.heartbeat_s, "a collection (until a successor falls back)")

    def before_history(self, actor: Actor) -> None:
        """At ``history.before_create``: on the holder's thread, its collection over, it
        is descheduled until ``N+1``'s collection ran (the overlap lets ``N+1``'s
        completion go on now); on ``N+1``'s, that collection is over."""
        window = self.window
        if window is None or window.phase is None:
            return
        if actor is window.phase:
            self.collected = True
        elif actor is window.completing and not window.left:
            window.left = True
            self._wait_for(window.phase, self._collected)

    def before_beat(self, actor: Actor) -> bool:
        """At ``lease.before_beat``: the holder's heartbeat thread starved while the
        story plays. Returns whether it was."""
        window = self.window
        if window is None or window.phase is None or not window.phase.alive \
                or actor.host.name != self.host or not self.active:
            return False
        self.world.coverage["subsumed-fallback-beat-starved"] += 1
        self._wait_for(window.phase, lambda: not self.active)
        return True

    def before_run(self, actor: Actor) -> None:
        """A holder's run starts (its takeover over, its restore next): once struck, the
        first such successor on another host is the one whose restore is watched."""
        job = self.world._running.get(actor)
        if self.window is not None and self.restorer is None and job is not None \
                and job.restore_target == "latest" and actor.host.name != self.host \
                and not self.world.recovering:
            self.restorer = actor

    def after_get(self, key: str) -> None:
        """A driver's GET returned: the watched successor's restore read ``m``'s marker;
        it reads ``m``'s files only after the holder's collections (step 2), then
        ``job-gc-damage``."""
        world, sched = self.world, self.world.scheduler
        window, actor = self.window, sched.current()
        if window is None or window.phase is None or self.reading or actor is None \
                or actor is not self.restorer \
                or key != self.layout.checkpoint_metadata(self.number or 0):
            return
        self.reading = True
        world.coverage["subsumed-fallback-read"] += 1
        self._wait_for(window.phase, self._collected)
        gone = sorted(k for k in self.files
                      if k not in world.objects.objects and k not in world.vandalized)
        self.read = True
        if gone:
            world.violate(self.invariant, f"{actor.name}'s restore read the marker of "
                          f"chk-{self.number} before a deposed holder's collection deleted "
                          f"it, but {gone[0]} it references was deleted by a collection "
                          "before the restore read it")

    def _collected(self) -> bool:
        """``N+1``'s collection is over (it decided, and the store's collection lock, an
        actor-aware one, is free again), or the holder writes no more (its lease lost)."""
        store = self.store
        return self.collected or (self.lease is not None and self.lease.failure is not None) \
            or (self.deciding and store is not None
                and not getattr(store._collecting, "held", False))

    def _job_of(self, actor: Actor) -> SimJob | None:
        """The driver life whose coordinator ``actor`` (its thread, or a phase actor of
        its pool) runs."""
        running = self.world._running
        return running.get(actor) or (running.get(actor.parent) if actor.parent else None)

    def _marker_of(self, key: str) -> int | None:
        """The checkpoint id of a ``chk-<n>/_metadata`` key of the job (else None)."""
        head, _, tail = key[len(self.layout.root):].partition("/")
        return parse_checkpoint_dir(head) if key.startswith(self.layout.root) \
            and tail == METADATA_NAME else None

    def _wait_for(self, phase: Actor, done: Callable[[], bool] = lambda: False) -> None:
        sched = self.world.scheduler
        deadline = sched.now + WAIT_S
        while phase.alive and sched.now < deadline and not done():
            sched.sleep(0.05)
