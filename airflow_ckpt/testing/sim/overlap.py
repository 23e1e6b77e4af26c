"""The completion overlap: the deterministic equivalent of the threaded coordinator's
next checkpoint running while the previous one completes (issue 25).

The job world drives :class:`~airflow_ckpt.runtime.checkpoint.coordinator.CheckpointCoordinator`
unthreaded: its phases run one at a time, so a collection never overlaps another
checkpoint's reservations or stash read. The threaded coordinator does overlap them:
``_complete`` removes checkpoint ``N`` from the pending list (under the coordinator's
lock) *before* ``notify_completed`` tells the store, so from then on, with
``max-concurrent-checkpoints`` 1, ``_tick`` on the coordinator thread may trigger
``N+1`` (nothing is pending; ``min-pause`` 0 in the job world), run its sync phase
and hand its async phase to the second thread of the phase pool (it has
``max-concurrent + 1`` threads), which uploads (reserving shared keys in the
:class:`~airflow_ckpt.runtime.checkpoint.store.SharedFileRegistry`), reads
``store.stashed()`` and writes and confirms ``N+1``'s marker while ``N``'s thread is
still in ``store.add``. No lock forbids it: ``store.add`` holds only the store's locks
(``_lock`` briefly, ``_collecting`` for the collection), which the upload and the
marker write never take.

:class:`CompletionOverlap`, on a per-seed draw of a generator of its own, makes that
schedule happen at the runtime's named points, with the coordinator's own methods:

1. at ``coordinator.before_store_add`` on a driver's thread completing ``N``: the
   coordinator's ``_tick`` (as its thread would) with the phase executor swapped for one
   that runs each async phase on a scheduler actor of the driver's process (a pool
   thread); ``N``'s thread waits until ``N+1``'s phase has uploaded (reached
   ``coordinator.before_metadata``) or ended;
2. ``N+1``'s phase waits at ``coordinator.before_metadata`` until ``N``'s collection has
   decided what is garbage (``store.gc.before_delete``): its reservations were taken
   before the decision (window *a*, ``gc-ignores-reservations``);
3. ``N``'s collection waits at ``store.gc.before_delete`` until ``N+1``'s phase wrote and
   confirmed its marker (it reached ``coordinator.before_store_add``) or ended: ``N+1``
   read ``stashed()`` before ``N``'s collection stashed, so its confirmation does not
   clear what ``N`` stashes next (window *b*, ``collect-unconfirmed``), and its own
   collection, after ``N``'s, must leave those keys alone.

A window opens only while no earlier window's phase actor of the same driver lives:
the driver's thread stands for the pool thread completing ``N``, the phase actor for
the pool's other thread, and a third async phase would queue (job seed 98: two phase
actors met on the history's append lock, which the threaded pool never lets happen).

While a phase actor lives the coordinator's lock, the store's collection lock, the
history's locks and the registry's condition are actor-aware (a thread blocked on a
real lock would keep the scheduler's baton), the driver's ``tick`` and ``shutdown``
wait for the phase actor first (what ``wait``'s ``p.done.wait()`` and the pool's
``shutdown(wait=True)`` do).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor, Future
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from airflow_ckpt.runtime.checkpoint.coordinator import CheckpointCoordinator
from airflow_ckpt.testing.sim.scheduler import Actor, Scheduler

#: how long (virtual seconds) one side of the overlap waits for the other at most: the
#: other may be suspended with its host or stuck on the storage (liveness only)
WAIT_S = 300.0


class ActorCondition:
    """The registry's condition for actors: ``wait_for`` sleeps on the virtual clock until
    the predicate holds (``reserve`` waits for a delete in flight to return)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def __enter__(self) -> ActorCondition:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        while not predicate():
            self.scheduler.sleep(0.01)
        return True

    def notify_all(self) -> None:
        return None


@dataclass(eq=False)
class _Window:
    """One overlap: ``completing`` is in ``N``'s completion, ``phase`` runs ``N+1``'s."""

    completing: Actor
    phase: Actor | None = None
    uploaded: bool = False  # N+1 reached before_metadata
    decided: bool = False  # N's collection reached before_delete
    confirmed: bool = False  # N+1 reached before_store_add (marker confirmed)
    left: bool = False  # the driver's thread left N's completion (its next tick)


class ActorPhase(Executor):
    """The phase pool's free thread as a scheduler actor of the calling driver's process
    (``parent``): the first async phase submitted runs on an actor named
    ``<parent>-<suffix>`` (``spawned`` is told of it at once); any further one queues on
    the coordinator's own executor (its next tick), as the pool would queue it."""

    def __init__(self, scheduler: Scheduler, parent: Actor, pool: Executor, suffix: str,
                 spawned: Callable[[Actor], None] = lambda actor: None) -> None:
        self.scheduler, self.parent, self.pool = scheduler, parent, pool
        self.suffix, self.spawned = suffix, spawned
        self.phase: Actor | None = None

    def submit(self, fn: Callable[..., Any], /, *args: Any,
               **kwargs: Any) -> Future[Any]:
        if self.phase is not None:  # the pool's one free thread is taken: queued
            return self.pool.submit(fn, *args, **kwargs)
        parent = self.parent
        self.phase = self.scheduler.spawn(f"{parent.name}-{self.suffix}", parent.host,
                                          lambda: fn(*args, **kwargs), parent=parent)
        self.spawned(self.phase)
        return Future()


class CompletionOverlap:
    """The completion overlap of a world (see the module doc); ``p``: the chance, per
    completion of a driver's checkpoint, that the next one overlaps it."""

    def __init__(self, seed: int, scheduler: Scheduler,
                 coordinator_of: Callable[[Actor], CheckpointCoordinator | None],
                 lock: Callable[[], AbstractContextManager[Any]],
                 coverage: Counter[str]) -> None:
        self.rng = random.Random(seed ^ 0x0E7A)
        self.p = self.rng.choice((0.0, 0.5, 1.0))
        self.scheduler = scheduler
        self.coordinator_of = coordinator_of
        self.lock = lock
        self.coverage = coverage
        #: the completing actor and the phase actor -> their window
        self.windows: dict[Actor, _Window] = {}
        #: a driver's actor -> how many of its next completions overlap whatever the
        #: draw (a story of the world: :mod:`~airflow_ckpt.testing.sim.replay`)
        self.eager: dict[Actor, int] = {}

    def describe(self) -> str:
        return f"completion overlap p={self.p:g}"

    # ------------------------------------------------------------------ the points
    def before_add(self) -> None:
        """At ``coordinator.before_store_add``: on a driver's thread, open a window (with
        the seed's chance); on a phase actor, its marker is confirmed."""
        actor = self.scheduler.current()
        if actor is None:
            return
        window = self.windows.get(actor)
        if window is not None and window.phase is actor:
            # confirmed; the rest of N+1's completion (its collection after N's stash,
            # its history append and sink commits) once N's completion is over
            window.confirmed = True
            self._wait(lambda: window.left or not window.completing.alive)
            return
        coordinator = self.coordinator_of(actor)
        if coordinator is None or window is not None:
            return
        eager = self.eager.get(actor, 0)
        if eager:
            self.eager[actor] = eager - 1
        elif not self.p or self.rng.random() >= self.p:
            return
        if any(w.completing is actor and w.phase is not None and w.phase.alive
               for w in self.windows.values()):
            # an earlier window's phase still holds the pool's free thread (the
            # driver's thread stands for the one completing N): N+1's phase would queue
            self.coverage["overlap-pool-busy"] += 1
            return
        self._open(actor, coordinator)

    def before_marker(self) -> None:
        """At ``coordinator.before_metadata`` on a phase actor: uploaded (reservations
        taken); wait for the completing collection's decision."""
        window = self._of_phase()
        if window is None:
            return
        window.uploaded = True
        self._wait(lambda: window.decided or not window.completing.alive
                   or self.windows.get(window.completing) is not window)

    def before_history(self) -> None:
        """At ``history.before_create`` on a completing driver's thread that met no
        collection (a savepoint's completion): nothing to decide, the window closes."""
        actor = self.scheduler.current()
        window = self.windows.get(actor) if actor is not None else None
        if window is not None and window.completing is actor and not window.decided:
            window.decided = True
            self.windows.pop(actor, None)

    def before_delete(self) -> None:
        """At ``store.gc.before_delete`` on a completing driver's thread: decided; wait
        until the phase actor's marker is confirmed (or the phase ended)."""
        actor = self.scheduler.current()
        window = self.windows.get(actor) if actor is not None else None
        if window is None or window.completing is not actor or window.decided:
            return
        window.decided = True
        phase = window.phase
        assert phase is not None
        self._wait(lambda: window.confirmed or not phase.alive)
        self.windows.pop(actor, None)

    # ------------------------------------------------------------------ helpers
    def _of_phase(self) -> _Window | None:
        actor = self.scheduler.current()
        window = self.windows.get(actor) if actor is not None else None
        return window if window is not None and window.phase is actor else None

    def _wait(self, done: Callable[[], bool]) -> None:
        deadline = self.scheduler.now + WAIT_S
        while not done() and self.scheduler.now < deadline:
            self.scheduler.sleep(0.05)

    def tick_on_actors(self, actor: Actor, coordinator: CheckpointCoordinator, suffix: str,
                       spawned: Callable[[Actor], None] = lambda phase: None
                       ) -> Actor | None:
        """The coordinator thread's step (``_tick``: the next checkpoint if due, its sync
        phase) run by ``actor``, the async phase it hands the pool on an
        :class:`ActorPhase` named ``suffix``. Returns that phase's actor (None: nothing
        was due)."""
        self._actor_aware(coordinator)
        phases = coordinator._phases
        free = ActorPhase(self.scheduler, actor, phases, suffix, spawned)
        coordinator._phases = free
        try:
            coordinator._tick()
        finally:
            coordinator._phases = phases
        return free.phase

    def _open(self, actor: Actor, coordinator: CheckpointCoordinator) -> None:
        window = _Window(actor)

        def spawned(phase: Actor) -> None:
            window.phase = phase
            self.windows[phase] = window
        phase = self.tick_on_actors(actor, coordinator, "ckpt-async", spawned)
        if phase is None:
            self.coverage["overlap-not-due"] += 1
            return
        self.windows[actor] = window
        self.coverage["completion-overlap"] += 1
        self.scheduler.log(f"{phase.name}: the next checkpoint's async phase overlaps "
                           "this completion")
        self._wait(lambda: window.uploaded or not phase.alive)
        if not phase.alive:
            self.windows.pop(actor, None)

    def _actor_aware(self, coordinator: CheckpointCoordinator) -> None:
        """Once per coordinator: the locks a phase actor may meet made actor-aware, and
        the driver's ``tick`` and ``shutdown`` waiting for its phase actors first (a
        threaded coordinator's ``wait`` blocks on ``p.done``, its pool's shutdown
        joins)."""
        store = coordinator.store
        if isinstance(store.shared._cond, ActorCondition):
            return
        store.shared._cond = ActorCondition(self.scheduler)  # type: ignore[assignment]
        store._collecting = self.lock()  # type: ignore[assignment]
        coordinator._lock = self.lock()  # type: ignore[assignment]
        coordinator._marking = self.lock()  # type: ignore[assignment]
        # the history's locks too: a phase that fails appends while the completing
        # driver appends its completion (job seed 320590: stuck on the append lock)
        coordinator.history._append_lock = self.lock()  # type: ignore[assignment]
        coordinator.history._compacting = self.lock()  # type: ignore[assignment]
        tick, shutdown = coordinator.tick, coordinator.shutdown
        completing = self.scheduler.current()

        def join() -> None:
            for window in list(self.windows.values()):
                if window.completing is completing:
                    window.left = True
            while any(w.phase is not None and w.phase.alive and w.completing is completing
                      for w in self.windows.values()):
                self.scheduler.sleep(0.05)

        def joined_tick() -> None:
            join()
            tick()

        def joined_shutdown(wait: bool = True) -> None:
            shutdown(wait=wait)
            if wait:
                join()
        coordinator.tick = joined_tick  # type: ignore[method-assign]
        coordinator.shutdown = joined_shutdown  # type: ignore[method-assign]
