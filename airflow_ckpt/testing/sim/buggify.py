"""Rare made common: BUGGIFY-style fault sites and swarm testing (as FoundationDB does).

A *fault site* is a named place in the simulation where something rare may happen (a
503, a write landing after its caller gave up, a process pausing mid-operation, a clock
jumping, drivers started together). Each seed draws a :class:`Swarm`: every site is
switched on or off for the whole schedule (``ON_P``), and an enabled site fires with a
per-seed probability (its base chance times a seeded boost). A disabled site never
fires. So one schedule meets a few kinds of trouble often, instead of every kind
rarely (swarm testing: Groce et al., "Swarm Testing", ISSTA 2012), and across the seeds
every combination comes up.

:data:`SITES` is the registry (name -> what it does); the swarm counts how often each
site fired, which the coverage report sums per world (``--coverage``).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable

# storage (sim/storage.py): what a caller's request meets
STORAGE_503 = "storage.503"
STORAGE_LOST_ANSWER = "storage.lost-answer"
STORAGE_LATE = "storage.late-landing"
STORAGE_HANG = "storage.hang"
STORAGE_DAMAGED = "storage.damaged-object"
STORAGE_MISSING = "storage.missing-object"
# the scheduler (sim/scheduler.py): what happens to a process
SCHED_PAUSE = "scheduler.pause"
SCHED_CRASH = "scheduler.crash"
SCHED_CLOCK_JUMP = "scheduler.clock-jump"
SCHED_SUSPEND = "scheduler.suspend"
SCHED_POINT_PAUSE = "scheduler.point-pause"
# actors (the worlds): how many drivers and when they start
ACTORS_MORE = "actors.more-drivers"
ACTORS_TOGETHER = "actors.started-together"

#: every fault site, with what it does
SITES: dict[str, str] = {
    STORAGE_503: "a call gets a 503 / timeout after the backend's retries (nothing applied)",
    STORAGE_LOST_ANSWER: "a write is applied, its answer lost (OutcomeUnknownError)",
    STORAGE_LATE: "a write times out and lands later, after its caller gave up",
    STORAGE_HANG: "a write that passed its gate hangs in the network, then applies",
    STORAGE_DAMAGED: "a restore finds the newest checkpoint damaged (falls back)",
    STORAGE_MISSING: "a restore finds a checkpoint's object missing (falls back)",
    SCHED_PAUSE: "a process pauses mid-operation (a stop-the-world pause)",
    SCHED_CRASH: "a process dies at a yield point",
    SCHED_CLOCK_JUMP: "a host's wall clock jumps (NTP step, VM resume)",
    SCHED_SUSPEND: "a host is suspended mid-operation; its monotonic clock does not count "
                   "the suspension (Linux CLOCK_MONOTONIC), so its lease still looks valid",
    SCHED_POINT_PAUSE: "a process pauses at a named interleaving point of the runtime "
                       "(runtime/interleave.py): between a guard and the write it guards",
    ACTORS_MORE: "3-4 drivers of one job instead of 2",
    ACTORS_TOGETHER: "drivers started together (a double trigger), not one after another",
}

#: chance that a site is enabled for a seed
ON_P = 0.5
#: sites enabled more often: a process pausing past its lease is what makes a second
#: lease holder (the subject of the sink and savepoint worlds), so most seeds have it
ON_P_OF = {SCHED_PAUSE: 0.85}
#: the per-seed boosts of an enabled site's base chance
BOOSTS = (1.0, 2.0, 4.0)


class Swarm:
    """One seed's fault sites: which are on, how likely, and how often each fired.

    :param rng: the seed's generator (the draw is part of the schedule)
    :param sites: the sites this world has (others never fire)
    """

    def __init__(self, rng: random.Random, sites: Iterable[str] = SITES) -> None:
        self.rng = rng
        self.sites = tuple(sites)
        self.boost: dict[str, float] = {}
        for site in self.sites:
            if rng.random() < ON_P_OF.get(site, ON_P):
                self.boost[site] = rng.choice(BOOSTS)
        self.fired: Counter[str] = Counter()

    def on(self, site: str) -> bool:
        """Whether ``site`` is enabled for this seed (a choice made once per seed)."""
        return site in self.boost

    def fire(self, site: str, p: float) -> bool:
        """Whether ``site`` fires now: never when it is off, else with chance ``p`` times
        the seed's boost (one draw from the seed's generator only when enabled and
        ``p`` > 0)."""
        boost = self.boost.get(site)
        if boost is None or p <= 0.0:
            return False
        if self.rng.random() < min(p * boost, 1.0):
            self.fired[site] += 1
            return True
        return False

    def note(self, site: str) -> None:
        """Count a site that fired by a choice made elsewhere (e.g. an actor count)."""
        self.fired[site] += 1

    def describe(self) -> str:
        return ", ".join(f"{s} x{b:g}" for s, b in sorted(self.boost.items())) or "no sites"


def driver_count(rng: random.Random, swarm: Swarm | None) -> int:
    """How many drivers of one job a world starts: 2, or 3-4 when the seed enables
    ``actors.more-drivers`` (without a swarm: 2-4)."""
    if swarm is None:
        return rng.randint(2, 4)
    if swarm.on(ACTORS_MORE):
        swarm.note(ACTORS_MORE)
        return rng.randint(3, 4)
    return 2
