"""What one simulated seed produced: its violations, trace and setup (shared by the worlds
of :mod:`airflow_ckpt.testing.simulation`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from airflow_ckpt.errors import ConcurrentDriverError, EndpointUnreachableError
from airflow_ckpt.testing.sim.buggify import ACTORS_TOGETHER

#: invariant of the worlds whose drivers write through a FencedStorage: every write a
#: driver starts (but the lease's own) passed the lease's gate first
UNGATED_WRITE = "ungated-write"

#: how often a driver tries to take the lease before it gives up (the retries of its
#: Airflow task): a successor waits out a holder that stalls, and a storage hiccup
#: while it takes the lease does not end it
ACQUIRE_TRIES = 20

if TYPE_CHECKING:
    from airflow_ckpt.runtime.lease.holder import Adopt, JobLease
    from airflow_ckpt.runtime.lease.record import LeaseRecord
    from airflow_ckpt.testing.sim.scheduler import Actor, Host, Scheduler
    from airflow_ckpt.testing.sim.storage import SimObjects, SimStorage


class Described(Protocol):
    """A seed's drawn setup, as the report shows it."""

    @property
    def skewed(self) -> bool:
        """Whether any two hosts' clocks disagree."""

    def describe(self) -> str:
        """One line for a person."""


@dataclass(frozen=True, slots=True)
class Violation:
    """An invariant broken at a step."""

    invariant: str
    step: int
    message: str

    def __str__(self) -> str:
        return f"[{self.invariant}] step {self.step}: {self.message}"


class Judged:
    """A world's record of broken invariants: the first violation of each, traced."""

    scheduler: Scheduler
    violations: list[Violation]

    def violate(self, invariant: str, message: str) -> None:
        if any(v.invariant == invariant for v in self.violations):
            return
        violation = Violation(invariant, self.scheduler.step, message)
        self.violations.append(violation)
        self.scheduler.log(f"VIOLATION {violation}")

    def start_drivers(self, count: int, spawn: Callable[[int], Actor]) -> None:
        """Start drivers 1..``count`` (``spawn(number)``; a supervisor's program): all at
        once (a double trigger) when the seed enables ``actors.started-together``, else
        each when the last ended or a seeded patience of 5-150 s ran out."""
        sched = self.scheduler
        if sched.swarm is not None and sched.swarm.on(ACTORS_TOGETHER):
            sched.swarm.note(ACTORS_TOGETHER)
            for number in range(1, count + 1):
                spawn(number)
            return
        for number in range(1, count + 1):
            actor = spawn(number)
            patience = sched.rng.uniform(5.0, 150.0)
            while actor.alive and patience > 0:
                sched.sleep(2.0)
                patience -= 2.0

    def fence(self, view: SimStorage, gate: Callable[[], None],
              driver: str) -> tuple[SimStorage, Callable[[], None]]:
        """The storage view and the gate for a driver's ``FencedStorage(view, gate)``:
        a write that starts through the view without a pass of the gate by the same
        actor (thread) since that actor's previous write breaks ``ungated-write`` (the
        gate is what stops a driver whose lease may have expired from starting writes;
        a driver's threads pass it each for its own writes: job seed 351449, session
        16, where the completion overlap's phase actor wrote between the main thread's
        pass and its copy)."""
        passed: set[Actor | None] = set()

        def checked_gate() -> None:
            gate()
            passed.add(self.scheduler.current())

        def check(op: str, key: str) -> None:
            actor = self.scheduler.current()
            if actor not in passed:
                self.violate(UNGATED_WRITE, f"{driver} started {op} {key} without passing "
                             "its lease gate")
            passed.discard(actor)

        return view.checked_view(check), checked_gate

    def acquire(self, lease: JobLease, adopt: Adopt | None = None) -> LeaseRecord:
        """``lease.acquire(adopt=adopt)``, tried again after a seeded wait while another
        driver holds the job or the storage failed (up to :data:`ACQUIRE_TRIES` times)."""
        for attempt in range(1, ACQUIRE_TRIES + 1):
            try:
                return lease.acquire(adopt=adopt)
            except (ConcurrentDriverError, EndpointUnreachableError) as exc:
                if attempt == ACQUIRE_TRIES:
                    raise
                self.scheduler.log(f"no lease ({type(exc).__name__}): tries again later")
                self.scheduler.sleep(self.scheduler.rng.uniform(1.0, 5.0))
        raise AssertionError("unreachable")

    def supervise(self, host: Host, program: Callable[[], None], died: str) -> None:
        """Run the world from its supervisor (``program`` on ``host``) to the end; the
        supervisor dying of an error breaks invariant ``died``."""
        sched = self.scheduler
        supervisor = sched.spawn("supervisor", host, program)
        try:
            sched.run()
        finally:
            sched.shutdown()
        if supervisor.error is not None:
            self.violate(died, f"the supervisor died of {supervisor.error!r}")


@dataclass(frozen=True, slots=True)
class Coverage:
    """What one schedule reached: the fault sites of its world (``sites``) and how often
    each fired, how many drivers held the lease, the lease claims made while the
    previous holder still ran (taken from a live, deposed driver), and the kinds of
    writes applied for a driver a newer epoch had deposed."""

    sites: tuple[str, ...] = ()
    fired: dict[str, int] = field(default_factory=dict)
    holders: int = 0
    contended: int = 0
    deposed: dict[str, int] = field(default_factory=dict)
    #: the world's own counters: component or case -> how often it ran (e.g. the job
    #: world's "gc-shared-files", "restore-fallback", "control-answered")
    components: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, scheduler: Scheduler, objects: SimObjects,
           components: dict[str, int] | None = None) -> Coverage:
        swarm = scheduler.swarm
        return cls(tuple(swarm.sites) if swarm else (), dict(swarm.fired) if swarm else {},
                   len(objects.holders), objects.contended, dict(objects.deposed),
                   dict(components or {}))


@dataclass
class Outcome:
    """One seed's run of one world: its setup, violations (first of each invariant) and
    trace."""

    seed: int
    setup: Described
    violations: list[Violation]
    trace: list[str]
    steps: int
    cut_off: bool
    world: str = "history"  # which world of the simulation ran
    coverage: Coverage = field(default_factory=Coverage)
