"""The overtaking checkpoint: with ``max-concurrent-checkpoints`` 2, the next checkpoint's
whole async phase runs while the previous one still uploads (issue 25, the window of
``marker-out-of-order``).

With ``max-concurrent-checkpoints`` 1 the completion overlap
(:mod:`~airflow_ckpt.testing.sim.overlap`) is the only concurrency the threaded
coordinator has: checkpoint ``N+1`` starts after ``N``'s marker. With 2, the coordinator
thread's ``_tick`` triggers ``N+1`` while ``N`` is pending (one pending, fewer than
two), runs its sync phase and hands its async phase to a second thread of the phase
pool while ``N``'s thread uploads: nothing orders the two uploads, so ``N+1`` may
upload, build its manifest, write and confirm its marker and complete (store, history,
sink commits) before ``N``'s thread uploads its next file. ``N`` then reaches its marker
after a higher id's: it fails as ``SUBSUMED`` (Flink's ``CHECKPOINT_SUBSUMED``), since its
marker would lie below the retention floor ``N+1``'s manifest recorded without it
(with nothing retained before, that floor is ``N+1``), counted by this driver and
ignored by every reader.

:class:`Overtaking`, on a generator of its own (``max-concurrent-checkpoints`` is drawn
there too, so the seeds it leaves at 1 keep their schedules), makes that schedule happen
with the coordinator's own methods: at a driver's ``upload.before_file`` for the first
unit of checkpoint ``N`` (its async phase on the driver's thread, as the unthreaded
coordinator runs it; at its next units again until ``N+1`` is due), the coordinator's
``_tick`` with the phase executor swapped for
one that runs an async phase on a scheduler actor of the driver's process (a pool
thread); ``N``'s thread waits until that phase ended. With the seed's chance the
driver's process then crashes where ``N`` settles (its ``coordinator.before_store_add``
or its next history append, completed or failed): a successor takes over and judges
what counts while ``N+1`` is the newest checkpoint (``job-uncounted``: a marker below
its floor is never adopted).

On a share of the seeds that overtake (``lost``, drawn on a generator of its own, so the
draws above keep their order and a seed without a window keeps its schedule), every PUT
of the overtaking checkpoint's marker loses its answer (:meth:`Overtaking.hold`, asked
by the driver's storage view): its first copy lands within seconds, the outage wrapper
repeats it until ``tolerable-storage-outage`` is spent, and ``N+1`` is *abandoned* (its
marker may count: a successor adopts it, with retention floor ``N+1`` when nothing was
retained). ``N`` must then fail as ``SUBSUMED``, as after a written marker
(``abandoned-marker-not-subsuming``: job seed 383105's schedule, made common). While
such a phase runs the driver's heartbeat neither stalls nor starves and the driver's
thread waits for it in :data:`LOSING_WAIT_S` steps: the story is a healthy lease whose
one marker's answers are lost, and a minute of 0.05 s polls drew a process pause, a
crash or a lapsed lease on nearly every such seed.

The locks the phase actor may meet are made actor-aware by the completion overlap
(``CompletionOverlap._actor_aware``); no completion-overlap window is open while the
phase lives (the driver's thread waits in ``N``'s upload, before any completion).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

from airflow_ckpt.runtime.checkpoint.coordinator import CheckpointCoordinator
from airflow_ckpt.testing.sim.overlap import CompletionOverlap
from airflow_ckpt.testing.sim.scheduler import Actor, Scheduler

#: how long (virtual seconds) the driver's thread sleeps between looks at a phase whose
#: marker loses its answers (it lasts ``tolerable-storage-outage``)
LOSING_WAIT_S = 5.0


class Overtaking:
    """The overtaking checkpoint of a job world (see the module doc). ``on``: the seed
    runs ``max-concurrent-checkpoints`` 2; ``p``: the chance, per checkpoint a driver
    starts to upload, that the next one overtakes it; ``crash_p``: the chance that the
    driver crashes once the overtaken one settled. ``allowed``: False keeps the seed at
    1 whatever the draw (a story whose schedule a test pins)."""

    def __init__(self, seed: int, scheduler: Scheduler, overlap: CompletionOverlap,
                 coordinator_of: Callable[[Actor], CheckpointCoordinator | None],
                 coverage: Counter[str], allowed: bool = True) -> None:
        self.rng = random.Random(seed ^ 0xCC82)
        self.on = self.rng.random() < 0.5 and allowed
        self.p = self.rng.choice((0.5, 1.0))
        self.crash_p = self.rng.choice((0.0, 0.5, 1.0))
        #: the overtaking marker's lost answers, on a generator of their own (the draws
        #: above keep their order: a seed that does not lose them keeps its schedule)
        self.lost_rng = random.Random(seed ^ 0x3E7E)
        self.lost = self.on and self.lost_rng.random() < 0.5
        self.scheduler = scheduler
        self.overlap = overlap
        self.coordinator_of = coordinator_of
        self.coverage = coverage
        #: a coordinator -> the highest checkpoint id whose upload was an opportunity
        self._seen: dict[CheckpointCoordinator, int] = {}
        #: a coordinator -> the checkpoint drawn to be overtaken, until the next one is
        #: due (tried again at each of its upload units)
        self._armed: dict[CheckpointCoordinator, int] = {}
        #: driver actors that crash where their overtaken checkpoint settles
        self._crashing: set[Actor] = set()
        #: overtaking phases whose marker PUTs lose their answers (``lost``) -> the
        #: markers they sent so far
        self._losing: dict[Actor, set[str]] = {}

    @property
    def max_concurrent(self) -> int:
        return 2 if self.on else 1

    def describe(self) -> str:
        if not self.on:
            return "max-concurrent 1"
        return (f"max-concurrent 2, overtaking p={self.p:g} crash_p={self.crash_p:g}"
                + (", its marker's answers lost" if self.lost else ""))

    def before_upload(self) -> None:
        """At ``upload.before_file`` on a driver's thread: drawn at the first unit of the
        checkpoint it uploads (with the seed's chance), the next checkpoint's async phase
        runs to its end first, at this unit or the first later one where it is due."""
        if not self.on:
            return
        actor = self.scheduler.current()
        coordinator = self.coordinator_of(actor) if actor is not None else None
        if actor is None or coordinator is None or coordinator._stop.is_set():
            return
        uploading = [p.checkpoint_id for p in list(coordinator._pending)
                     if p.captured and not p.done.is_set() and not p.is_savepoint]
        if not uploading:
            return
        number = min(uploading)
        if number > self._seen.get(coordinator, 0):  # its first unit: drawn once
            self._seen[coordinator] = number
            if self.rng.random() < self.p:
                self._armed[coordinator] = number
        if self._armed.get(coordinator) == number and self._open(actor, coordinator):
            del self._armed[coordinator]

    def settled(self) -> None:
        """At ``coordinator.before_store_add`` and ``history.before_create``: a driver
        whose checkpoint was overtaken crashes here, with the seed's chance."""
        actor = self.scheduler.current()
        if actor is None or actor not in self._crashing:
            return
        self._crashing.discard(actor)
        self.coverage["overtaken-then-crash"] += 1
        self.scheduler.log("crashes where the overtaken checkpoint settles")
        actor.killed = True
        self.scheduler.yield_point("crashed after an overtaken checkpoint")

    def losing(self, driver: Actor | None) -> bool:
        """Whether a phase of ``driver``'s process whose marker loses its answers is
        still running (its heartbeat then neither stalls nor starves: the story is a
        healthy lease whose one marker's answers are lost)."""
        return any(phase.alive and phase.parent is driver for phase in self._losing)

    def hold(self, key: str) -> float | None:
        """How long the network holds a completion marker's PUT that an overtaking phase
        sends with ``lost`` drawn (None: not such a PUT): every answer is lost, so the
        outage wrapper repeats it until its budget is spent and the checkpoint is
        abandoned; its first copy lands within seconds (a successor adopts it), the
        repeats later (create-only: they find it there)."""
        actor = self.scheduler.current()
        sent = self._losing.get(actor) if actor is not None else None
        if sent is None:
            return None
        first = key not in sent
        sent.add(key)
        if first:
            self.coverage["overtaking-marker-lost"] += 1
        return self.lost_rng.uniform(0.5, 3.0) if first else self.lost_rng.uniform(1.0, 10.0)

    def _open(self, actor: Actor, coordinator: CheckpointCoordinator) -> bool:
        """The coordinator thread's step; True if the next checkpoint's phase ran."""
        def spawned(phase: Actor) -> None:
            if self.lost:
                self._losing[phase] = set()
        phase = self.overlap.tick_on_actors(actor, coordinator, "ckpt-async-2", spawned)
        if phase is None:
            self.coverage["overtaking-not-due"] += 1
            return False
        self.coverage["overtaking-checkpoint"] += 1
        self.scheduler.log(f"{phase.name}: the next checkpoint's async phase runs while "
                           "this one uploads")
        # a phase whose marker loses its answers lasts the outage budget: the driver's
        # thread waits for it in long steps (each yield point is a chance for the
        # process to pause or crash, and a pause also stops the heartbeat)
        step = LOSING_WAIT_S if phase in self._losing else 0.05
        while phase.alive:
            self.scheduler.sleep(step)
        if self.crash_p and self.rng.random() < self.crash_p:
            self._crashing.add(actor)
        return True
