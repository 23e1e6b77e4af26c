"""Deterministic whole-system simulation (as FoundationDB and TigerBeetle test
themselves): one seed, one schedule, replayed exactly, in every *world*.

The real classes run as actors (:mod:`airflow_ckpt.testing.sim.scheduler`) over a
simulated storage that enforces the storage contract and injects faults
(:mod:`airflow_ckpt.testing.sim.storage`), on hosts whose clocks disagree. The worlds:

* **history** (:mod:`airflow_ckpt.testing.sim.history`): one supervised run, the real
  operator, ``Supervisor`` and supervision trigger (blocking and deferred, worker and
  triggerer restarts) over drivers, compactors and late writes sharing the history;
* **sinks** (:mod:`airflow_ckpt.testing.sim.sinks`): exactly-once output under deposed
  drivers and older restores; **sinks-late**: the same world telling, on every seed,
  one story of a record held in the network until its staging was swept (or of a
  deposed driver's sweep, or of an abort's record swap landing after a later run
  judged the batch), its other draws as the sinks world's;
* **savepoints** (:mod:`airflow_ckpt.testing.sim.savepoints`): a savepoint request
  answered by drivers deposed mid-way;
* **job** (:mod:`airflow_ckpt.testing.sim.job`): 2-4 real ``CheckpointedJob`` drivers of
  one job (lease, adoption, coordinator, retention and GC, restore with fallback, the
  control channel, the outage wrapper, both sinks) against a ground truth.

Every world draws its faults through the seed's swarm (:mod:`airflow_ckpt.testing.sim.buggify`).

:data:`WORLDS` lists them with their plants and invariants.
``python -m airflow_ckpt.testing.simulation --seeds N`` explores N seeds in every world
and prints ``M simulated schedules explored, K violations``, the schedules cut off at
the step limit, what each world exercised (summed coverage counters) and, for the first
failing seed of each invariant, the seed and its trace (``--seed S [--world W] --trace``
replays one).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time as real_time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from airflow_ckpt.testing.sim import history, job, savepoints, sinks
from airflow_ckpt.testing.sim.outcome import Outcome

#: the worlds of the simulation: name -> (its planted defects, its invariants, one run)
WORLDS: dict[str, tuple[tuple[str, ...], tuple[str, ...],
                        Callable[[int, Iterable[str]], Outcome]]] = {
    "history": (history.PLANTS, history.INVARIANTS, history.run_seed),
    "sinks": (sinks.PLANTS, sinks.INVARIANTS, sinks.run_sink_seed),
    # the sink world telling one late-record story per seed (its plants are the sinks')
    "sinks-late": ((), sinks.INVARIANTS, sinks.run_late_sink_seed),
    "savepoints": (savepoints.PLANTS, savepoints.INVARIANTS, savepoints.run_savepoint_seed),
    "job": (job.PLANTS, job.INVARIANTS, job.run_job_seed),
}
PLANTS = tuple(p for plants, _, _ in WORLDS.values() for p in plants)
INVARIANTS = tuple(dict.fromkeys(i for _, invariants, _ in WORLDS.values() for i in invariants))


def worlds_for(plants: Iterable[str]) -> list[str]:
    """The worlds a run explores: all of them, or with ``plants`` those they belong to."""
    wanted = set(plants)
    if not wanted:
        return list(WORLDS)
    return [name for name, (own, _, _) in WORLDS.items() if wanted & set(own)]


@dataclass
class WorldCoverage:
    """What one world's schedules reached (``--coverage``): per fault site, per kind of
    write applied for a deposed driver, the schedules in which it happened; the
    schedules with contention (a second driver held the lease), those where the lease
    was taken from a live holder, those cut off at the step limit, and the world's own
    counters (``components``: summed; ``reached``: schedules where non-zero)."""

    schedules: int = 0
    sites: tuple[str, ...] = ()
    fired: Counter[str] = field(default_factory=Counter)
    deposed: Counter[str] = field(default_factory=Counter)
    contended: int = 0
    taken_live: int = 0
    cut_off: int = 0
    components: Counter[str] = field(default_factory=Counter)
    reached: Counter[str] = field(default_factory=Counter)

    def add(self, outcome: Outcome) -> None:
        covered = outcome.coverage
        self.schedules += 1
        self.sites = tuple(dict.fromkeys((*self.sites, *covered.sites)))
        self.fired.update(covered.fired.keys())
        self.deposed.update(covered.deposed.keys())
        self.contended += covered.holders > 1
        self.taken_live += covered.contended > 0
        self.cut_off += outcome.cut_off
        self.components.update(covered.components)
        self.reached.update(k for k, v in covered.components.items() if v)

    def describe(self, world: str) -> str:
        def share(n: int) -> str:
            return f"{n} ({n / self.schedules:.0%})" if self.schedules else "0"

        never = [s for s in self.sites if not self.fired[s]]
        lines = [f"  {world}: {self.schedules} schedules; contention (a second lease holder) "
                 f"in {share(self.contended)}, taken from a live holder in "
                 f"{share(self.taken_live)}; {self.cut_off} cut off at the step limit",
                 "    fault sites fired (schedules): " + (", ".join(
                     f"{s} {self.fired[s]}" for s in self.sites if self.fired[s]) or "none")]
        if never:
            lines.append("    fault sites NEVER fired: " + ", ".join(never))
        if self.deposed:
            lines.append("    writes applied for a deposed driver (schedules): " + ", ".join(
                f"{kind} {n}" for kind, n in sorted(self.deposed.items())))
        if self.components:
            lines.append("    reached (total, schedules): " + ", ".join(
                f"{k} {v} ({self.reached[k]})" for k, v in sorted(self.components.items())))
        return "\n".join(lines)


@dataclass
class Exploration:
    """What :func:`explore` found: seeds and schedules run (one per seed and world),
    failing schedules, the first failing schedule of each invariant, and each world's
    coverage."""

    seeds: int = 0
    schedules: int = 0
    violations: int = 0
    first: dict[str, Outcome] = field(default_factory=dict)
    first_unskewed: dict[str, Outcome] = field(default_factory=dict)  # all clocks agree
    failing_seeds: list[int] = field(default_factory=list)
    cut_off_schedules: list[tuple[str, int]] = field(default_factory=list)  # (world, seed)
    coverage: dict[str, WorldCoverage] = field(default_factory=dict)

    @property
    def cut_off(self) -> int:
        """Schedules the step limit ended (reported, never silently)."""
        return sum(c.cut_off for c in self.coverage.values())


def explore(seeds: Iterable[int], plants: Iterable[str] = (),
            stop_when_found: Iterable[str] = (), stop_on_violation: bool = False,
            worlds: Iterable[str] | None = None, stop_when_any: Iterable[str] = ()
            ) -> Exploration:
    """Run ``seeds`` in each of ``worlds`` (default: :func:`worlds_for` the plants);
    stop early once every invariant of ``stop_when_found`` broke, or one of
    ``stop_when_any`` (or, with ``stop_on_violation``, at the first violation)."""
    wanted, some = set(stop_when_found), set(stop_when_any)
    plants = list(plants)
    chosen = list(worlds) if worlds is not None else worlds_for(plants)
    result = Exploration()
    for seed in seeds:
        result.seeds += 1
        for name in chosen:
            own, _, run = WORLDS[name]
            outcome = run(seed, [p for p in plants if p in own])
            result.schedules += 1
            result.coverage.setdefault(name, WorldCoverage()).add(outcome)
            if outcome.cut_off:
                result.cut_off_schedules.append((name, seed))
            if outcome.violations:
                result.violations += 1
                if seed not in result.failing_seeds:
                    result.failing_seeds.append(seed)
            for violation in outcome.violations:
                result.first.setdefault(violation.invariant, outcome)
                if not outcome.setup.skewed:
                    result.first_unskewed.setdefault(violation.invariant, outcome)
        if (wanted and wanted <= set(result.first)) or (some & set(result.first)) \
                or (stop_on_violation and result.first):
            break
    return result


def format_outcome(outcome: Outcome, tail: int = 120) -> str:
    """A failing seed, readably: setup, violations and the end of its trace."""
    lines = [f"seed {outcome.seed}: {outcome.setup.describe()}"]
    lines += [f"  {v}" for v in outcome.violations]
    if outcome.coverage.components:
        lines.append("  coverage: " + ", ".join(
            f"{k} {v}" for k, v in sorted(outcome.coverage.components.items()) if v))
    lines.append(f"  trace (last {tail} of {len(outcome.trace)} lines):")
    lines += [f"    {line}" for line in outcome.trace[-tail:]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m airflow_ckpt.testing.simulation [--seeds N] [--start S] [--seed S
    --trace] [--plant NAME] [--world NAME]``: explore seeds, report, exit 1 on any
    violation."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200, help="how many seeds to explore")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, help="replay one seed and print its trace")
    parser.add_argument("--trace", action="store_true", help="print the whole trace")
    parser.add_argument("--plant", action="append", choices=PLANTS, default=[],
                        help="plant a defect (the simulation must find it)")
    parser.add_argument("--world", action="append", choices=list(WORLDS),
                        help="explore only this world (default: every world, or with "
                             "--plant the worlds of the planted defects)")
    parser.add_argument("--coverage", action="store_true",
                        help="print what the schedules reached: fault sites fired, "
                             "contention, writes of deposed drivers, the worlds' counters")
    args = parser.parse_args(argv)
    worlds = args.world or worlds_for(args.plant)
    logging.disable(logging.CRITICAL)  # the runtime's warnings about injected faults
    if args.seed is not None:
        failed = False
        for name in worlds:
            own, _, run = WORLDS[name]
            outcome = run(args.seed, [p for p in args.plant if p in own])
            print(f"[{name}] " + format_outcome(
                outcome, len(outcome.trace) if args.trace else 120))
            failed = failed or bool(outcome.violations)
        return 1 if failed else 0
    started = real_time.monotonic()
    result = explore(range(args.start, args.start + args.seeds), args.plant, worlds=worlds)
    for invariant in INVARIANTS:
        first = result.first.get(invariant)
        if first is not None:
            print(f"FIRST {invariant}: seed {first.seed} "
                  f"({first.seed - args.start + 1} seeds, world {first.world})\n"
                  + format_outcome(first, 60))
    for invariant in INVARIANTS:
        unskewed = result.first_unskewed.get(invariant)
        if unskewed is not None:
            print(f"first {invariant} with every clock right: seed {unskewed.seed} "
                  f"({unskewed.seed - args.start + 1} seeds)")
    if args.coverage:
        print(f"coverage of seeds {args.start}-{args.start + result.seeds - 1}:")
        for name, covered in result.coverage.items():
            print(covered.describe(name))
    print(f"{result.cut_off} schedules cut off at the step limit" + "".join(
        f"; {world} seed {seed}" for world, seed in result.cut_off_schedules[:50]))
    print(f"{result.schedules} simulated schedules explored ({result.seeds} seeds x "
          f"{len(worlds)} worlds: {', '.join(worlds)}), {result.violations} violations "
          f"({real_time.monotonic() - started:.0f} s)")
    if result.failing_seeds:
        print(f"failing seeds: {result.failing_seeds[:50]}")
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
