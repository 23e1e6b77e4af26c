"""Run the sink or savepoint world against an older commit's code (issue 19: "the
simulation must find each item from random seeds" on the code before its fix).

Only the module under test is taken from ``COMMIT`` (``git show``, in the current
checkout): the sink world's drivers get that commit's ``JsonLinesSink`` (with its
``SinkTransactions`` when it has one); the savepoint world's drivers get its
``CheckpointCoordinator`` and ``upload`` module (keyword arguments it does not know yet,
such as ``confirm``, are dropped and listed). Everything else, the harness's faultless
reader included, is today's::

    python -m airflow_ckpt.testing.sim.against sinks 9796485 --seeds 2000
    python -m airflow_ckpt.testing.sim.against savepoints 9827418 --seeds 2000

prints the failing seeds per invariant and the first of each (with "at a late write's
landing" when the violation showed at the step a held write landed). A scratch tool:
``make simulate`` and the tests never use it.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import logging
import subprocess
import sys
import time
import types
from typing import Any

from airflow_ckpt.testing.sim import savepoints, sinks
from airflow_ckpt.testing.sim.outcome import Outcome


def _load(commit: str, path: str, name: str) -> types.ModuleType:
    """``path`` as of ``commit``, executed as module ``name`` (left in ``sys.modules``)."""
    text = subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True,
                          text=True, check=True).stdout
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(text, f"{commit}:{path}", "exec"), module.__dict__)
    return module


def _exists(commit: str, path: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{commit}:{path}"],
                          capture_output=True).returncode == 0


def old_sinks(commit: str) -> type[sinks.SinkWorld]:
    """The sink world whose drivers run ``commit``'s ``JsonLinesSink``."""
    saved = dict(sys.modules)
    if _exists(commit, "airflow_ckpt/runtime/sinks/transactions.py"):
        _load(commit, "airflow_ckpt/runtime/sinks/transactions.py",
              "airflow_ckpt.runtime.sinks.transactions")
    jsonl = _load(commit, "airflow_ckpt/runtime/sinks/jsonl.py", "airflow_ckpt.runtime.sinks.jsonl")
    sys.modules.update({k: v for k, v in saved.items() if k.startswith("airflow_ckpt.runtime.")})
    sinks.jsonl_module = jsonl  # its uuid is seeded too
    today = sinks.JsonLinesSink

    class World(sinks.SinkWorld):
        def __init__(self, seed: int) -> None:
            super().__init__(seed)
            self.truth = today(self.base, sinks.SINK)

    sinks.JsonLinesSink = jsonl.JsonLinesSink  # type: ignore[misc]
    return World


def old_savepoints(commit: str) -> type[savepoints.SavepointWorld]:
    """The savepoint world whose drivers run ``commit``'s coordinator and uploads."""
    today_upload = sys.modules["airflow_ckpt.runtime.upload"]
    upload = _load(commit, "airflow_ckpt/runtime/upload.py", "airflow_ckpt.runtime.upload")
    coordinator = _load(commit, "airflow_ckpt/runtime/coordinator.py", "old_coordinator")
    sys.modules["airflow_ckpt.runtime.upload"] = today_upload
    old = coordinator.CheckpointCoordinator
    accepted = set(inspect.signature(old.__init__).parameters)
    known = set(inspect.signature(savepoints.CheckpointCoordinator.__init__).parameters)
    print(f"{commit}'s coordinator does not take: {sorted(known - accepted)}")

    def build(**kwargs: Any) -> Any:
        return old(**{k: v for k, v in kwargs.items() if k in accepted})

    savepoints.CheckpointCoordinator = build  # type: ignore[assignment,misc]
    savepoints.SIMULATED_MODULES = [
        m for m in savepoints.SIMULATED_MODULES
        if m.__name__ not in ("airflow_ckpt.runtime.coordinator", "airflow_ckpt.runtime.upload")
    ] + [coordinator, upload]
    return savepoints.SavepointWorld


def _late(outcome: Outcome, step: int) -> bool:
    return any(line.startswith(f"{step:5d} ") and "sim: deliver late" in line
               for line in outcome.trace)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("world", choices=("sinks", "savepoints"))
    parser.add_argument("commit")
    parser.add_argument("--seeds", type=int, default=2000)
    args = parser.parse_args(argv)
    logging.disable(logging.CRITICAL)
    world = old_sinks(args.commit) if args.world == "sinks" else old_savepoints(args.commit)
    started = time.monotonic()
    count: collections.Counter[str] = collections.Counter()
    first: dict[str, tuple[int, str]] = {}
    failing = 0
    for seed in range(args.seeds):
        outcome = world(seed).run()
        failing += bool(outcome.violations)
        for v in outcome.violations:
            name = v.invariant + (" (at a late write's landing)" if _late(outcome, v.step)
                                  else "")
            count[name] += 1
            first.setdefault(name, (seed, str(v)))
    print(f"{args.world} world on {args.commit}: {args.seeds} seeds, {failing} failing, "
          f"{dict(count)} ({time.monotonic() - started:.0f} s)")
    for name, (seed, violation) in sorted(first.items(), key=lambda item: item[1][0]):
        print(f"  first {name}: seed {seed} ({seed + 1} seeds): {violation[:300]}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
