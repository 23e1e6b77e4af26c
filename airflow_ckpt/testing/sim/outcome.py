"""What one simulated seed produced: its violations, trace and setup (shared by the worlds
of :mod:`airflow_ckpt.testing.simulation`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from airflow_ckpt.testing.sim.scheduler import Host, Scheduler


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
    #: what the schedule exercised (e.g. ``triggerer restarts``: 2), summed per world
    coverage: dict[str, int] = field(default_factory=dict)
