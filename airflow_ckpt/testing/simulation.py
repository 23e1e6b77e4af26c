"""Deterministic whole-system simulation (as FoundationDB and TigerBeetle test
themselves): one seed, one schedule, replayed exactly, in every *world*.

The real classes run as actors (:mod:`airflow_ckpt.testing.sim.scheduler`) over a
simulated storage that enforces the storage contract and injects faults
(:mod:`airflow_ckpt.testing.sim.storage`), on hosts whose clocks disagree. The worlds:

* **history** (:mod:`airflow_ckpt.testing.sim.history`): one supervised run, the real
  operator, ``Supervisor`` and supervision trigger (blocking and deferred, worker and
  triggerer restarts) over drivers, compactors and late writes sharing the history;
* **sinks** (:mod:`airflow_ckpt.testing.sim.sinks`): exactly-once output under deposed
  drivers and older restores;
* **savepoints** (:mod:`airflow_ckpt.testing.sim.savepoints`): a savepoint request
  answered by drivers deposed mid-way.

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

from airflow_ckpt.testing.sim import history, savepoints, sinks
from airflow_ckpt.testing.sim.outcome import Outcome

#: the worlds of the simulation: name -> (its planted defects, its invariants, one run)
WORLDS: dict[str, tuple[tuple[str, ...], tuple[str, ...],
                        Callable[[int, Iterable[str]], Outcome]]] = {
    "history": (history.PLANTS, history.INVARIANTS, history.run_seed),
    "sinks": (sinks.PLANTS, sinks.INVARIANTS, sinks.run_sink_seed),
    "savepoints": (savepoints.PLANTS, savepoints.INVARIANTS, savepoints.run_savepoint_seed),
}
PLANTS = tuple(p for plants, _, _ in WORLDS.values() for p in plants)
INVARIANTS = tuple(i for _, invariants, _ in WORLDS.values() for i in invariants)


def worlds_for(plants: Iterable[str]) -> list[str]:
    """The worlds a run explores: all of them, or with ``plants`` those they belong to."""
    wanted = set(plants)
    if not wanted:
        return list(WORLDS)
    return [name for name, (own, _, _) in WORLDS.items() if wanted & set(own)]


@dataclass
class Exploration:
    """What :func:`explore` found: seeds and schedules run (one per seed and world),
    failing schedules, the first failing schedule of each invariant."""

    seeds: int = 0
    schedules: int = 0
    violations: int = 0
    first: dict[str, Outcome] = field(default_factory=dict)
    first_unskewed: dict[str, Outcome] = field(default_factory=dict)  # all clocks agree
    failing_seeds: list[int] = field(default_factory=list)
    cut_off: int = 0  # schedules the step limit ended (reported, never silently)
    #: per world: the coverage counters summed over its schedules, and in how many
    #: schedules each was non-zero
    coverage: dict[str, Counter[str]] = field(default_factory=dict)
    reached: dict[str, Counter[str]] = field(default_factory=dict)


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
            result.cut_off += int(outcome.cut_off)
            result.coverage.setdefault(name, Counter()).update(outcome.coverage)
            result.reached.setdefault(name, Counter()).update(
                {k for k, v in outcome.coverage.items() if v})
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
    if outcome.coverage:
        lines.append("  coverage: " + ", ".join(
            f"{k} {v}" for k, v in sorted(outcome.coverage.items()) if v))
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
    for name, counters in sorted(result.coverage.items()):
        reached = result.reached[name]
        print(f"coverage [{name}]: " + ", ".join(
            f"{k} {v} ({reached[k]} schedules)" for k, v in sorted(counters.items())))
    print(f"{result.cut_off} schedules cut off at the step limit")
    print(f"{result.schedules} simulated schedules explored ({result.seeds} seeds x "
          f"{len(worlds)} worlds: {', '.join(worlds)}), {result.violations} violations "
          f"({real_time.monotonic() - started:.0f} s)")
    if result.failing_seeds:
        print(f"failing seeds: {result.failing_seeds[:50]}")
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
