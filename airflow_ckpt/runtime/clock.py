"""The clock and the id source the checkpoint path takes through its constructors
(Flink injects a ``Clock`` into its ``CheckpointCoordinator``), so that a simulation
passes its virtual clock and seeded ids instead of patching module names.

No guarantee rests on this clock: it times checkpoints out, schedules periodic ones and
stamps what is reported; safety comes from create-only and compare-and-swap writes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    """Time as the checkpoint path reads it (the ``time`` module's two functions)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: intervals, timeouts, durations."""
        ...

    def time(self) -> float:
        """Wall-clock epoch seconds: reported timestamps only."""
        ...


class SystemClock:
    """The process's clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


SYSTEM_CLOCK: Clock = SystemClock()

#: a source of fresh random hex ids (names of staging directories and the like)
IdSource = Callable[[], str]


def random_id() -> str:
    """A fresh random hex id (uuid4)."""
    return uuid.uuid4().hex
