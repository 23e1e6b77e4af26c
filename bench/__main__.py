"""``python -m bench [--quick]``: run every benchmark, print a table, write JSON.

``python -m bench history [--events N]``: the history suite alone (see :mod:`bench.history`).

One local SparkSession and one local S3 endpoint (moto, in its own process, so that its
CPU is not the driver's) serve every run. Per repeat, four runs
of the example query over the same input, in alternating order (so that neither variant
always runs on a warmer JVM): plain Spark on S3, checkpointed incremental on S3,
checkpointed full on S3, checkpointed incremental on the file backend. Unmeasured
warm-up runs (plain and checkpointed) come first. Results: ``bench/results/latest.json``.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.testing.numbers import GroundTruth, write_numbers
from airflow_ckpt.testing.s3_server import S3Endpoint, s3_server_process
from bench import suites
from bench.harness import RunResult, run_checkpointed, run_plain, spark_session

BUCKET = "airflow-ckpt-bench"
RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"
#: batches of each unmeasured warm-up run. The first streaming queries of a JVM are slow
#: (class loading, code generation, JIT): measured on 2 cores, runs of 10 batches took
#: 31, 12, 10, 8, 7, 9, 7, 7 s (plain and checkpointed alternating), so the warm-up runs
#: about 40 batches (2 rounds; 1 with --quick) before anything is measured.
WARM_UP_FILES = 10


def checkpoint_config(incremental: bool) -> dict[str, Any]:
    """1 s interval, 3 retained (so retention and shared-file GC run as in production)."""
    return {
        "execution.checkpointing.interval": "1 s",
        "execution.checkpointing.num-retained": 3,
        "execution.checkpointing.incremental": incremental,
    }


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="fewer input files and one repeat (about a minute)")
    p.add_argument("--files", type=int, help="input files = batches per run (default 30, "
                                                 "--quick 10)")
    p.add_argument("--per-file", type=int, default=1000, help="numbers per input file")
    p.add_argument("--repeats", type=int, help="repeats of each run (default 2, --quick 1)")
    p.add_argument("--warm-up", type=int, help="unmeasured warm-up rounds (plain + "
                                                 "checkpointed; default 2, --quick 1)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    args = p.parse_args(argv)
    args.files = args.files or (10 if args.quick else 30)
    args.repeats = args.repeats or (1 if args.quick else 2)
    args.warm_up = (1 if args.quick else 2) if args.warm_up is None else args.warm_up
    if args.files < 2 or args.repeats < 1 or args.per_file < 1 or args.warm_up < 0:
        p.error("--files must be >= 2, --repeats and --per-file >= 1, --warm-up >= 0")
    return args


def _java_version() -> str | None:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (out.stderr or out.stdout).splitlines()
    return lines[0].strip() if lines else None


def machine(spark_version: str) -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "spark": spark_version,
        "java": _java_version(),
    }


class Bench:
    """Runs of the example query against fresh storage locations of one invocation."""

    def __init__(self, spark: Any, endpoint: S3Endpoint, root: Path) -> None:
        self.spark = spark
        self.endpoint = endpoint
        self.root = root
        self._count = 0

    def _storage(self, backend: str, tag: str) -> CheckpointStorage:
        if backend == "s3":
            return self.endpoint.storage(f"s3://{BUCKET}/{tag}")
        return open_storage((self.root / "store" / tag).as_uri())

    def run(self, variant: str, backend: str, input_dir: Path, truth: GroundTruth,
            repeat: int) -> RunResult:
        """One run on a fresh storage prefix and working directory."""
        self._count += 1
        tag = f"r{self._count:03d}-{variant}-{backend}"
        storage = self._storage(backend, tag)
        workdir = self.root / "work" / tag
        try:
            if variant == "plain":
                return run_plain(self.spark, storage, input_dir, truth, workdir,
                                 backend=backend, repeat=repeat)
            return run_checkpointed(
                self.spark, storage, input_dir, truth, workdir,
                checkpoint_config(variant == "incremental"), backend=backend, repeat=repeat,
            )
        finally:
            storage.close()


PLAN: tuple[tuple[str, str], ...] = (
    ("plain", "s3"), ("incremental", "s3"), ("full", "s3"), ("incremental", "file"),
)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_all(args: argparse.Namespace) -> tuple[list[RunResult], dict[str, Any]]:
    """Warm up, then every (variant, backend) of :data:`PLAN` ``args.repeats`` times."""
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="airflow-ckpt-bench-") as tmp, \
            s3_server_process() as server:
        endpoint = server.endpoint
        root = Path(tmp)
        endpoint.create_bucket(BUCKET)
        truth = write_numbers(root / "in", files=args.files, per_file=args.per_file)
        warm_truth = write_numbers(root / "warm", files=WARM_UP_FILES, per_file=args.per_file)
        started = time.perf_counter()
        spark = spark_session()
        _log(f"SparkSession {spark.version} up in {time.perf_counter() - started:.1f} s")
        try:
            bench = Bench(spark, endpoint, root)
            for _ in range(args.warm_up):
                for variant, backend in (("plain", "s3"), ("incremental", "s3")):
                    warm = bench.run(variant, backend, root / "warm", warm_truth, -1)
                    _log(f"warm-up {warm.label}: {warm.wall_s:.1f} s")
            total = len(PLAN) * args.repeats
            for repeat in range(args.repeats):
                plan = PLAN if repeat % 2 == 0 else tuple(reversed(PLAN))
                for variant, backend in plan:
                    r = bench.run(variant, backend, root / "in", truth, repeat)
                    results.append(r)
                    _log(f"[{len(results)}/{total}] {r.label:<17} repeat {repeat}: "
                         f"{r.wall_s:6.2f} s, {r.batches} batches, "
                         f"{len(r.checkpoints)} checkpoints, "
                         f"{'correct' if r.correct else 'WRONG OUTPUT'}")
            info = machine(spark.version)
        finally:
            spark.stop()
    return results, info


SUITES: tuple[tuple[str, Callable[[Sequence[RunResult]], list[suites.Row]]], ...] = (
    ("throughput_overhead", suites.throughput_overhead),
    ("incremental_vs_full", suites.incremental_vs_full),
    ("phase_costs", suites.phase_costs),
)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["history"]:  # the history suite runs alone: no Spark
        from bench import history

        return history.main(argv[1:])
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.ERROR)
    started = time.perf_counter()
    load_before = os.getloadavg()
    results, info = run_all(args)
    info["loadavg_1m"] = {"before": round(load_before[0], 2),
                          "after": round(os.getloadavg()[0], 2)}
    rows: list[suites.Row] = []
    report: dict[str, Any] = {}
    for name, suite in SUITES:
        suite_rows = suite(results)
        rows.extend(suite_rows)
        report[name] = {"description": inspect.cleandoc(suite.__doc__ or ""),
                        "rows": [r.to_dict() for r in suite_rows]}
    report["throughput_overhead"]["paired_wall_ratios"] = suites.paired_wall_ratios(results)
    elapsed = time.perf_counter() - started
    print(f"\nairflow-ckpt benchmarks: {info['cpus']} CPUs, Spark {info['spark']}, "
          f"{args.files} batches/run x {args.per_file} numbers, {args.repeats} repeat(s), "
          f"{elapsed:.0f} s total, load average {info['loadavg_1m']['before']:.1f} "
          f"before / {info['loadavg_1m']['after']:.1f} after")
    print(suites.table(rows))
    wrong = [r.label for r in results if not r.correct]
    document = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": round(elapsed, 1),
        "machine": info,
        "settings": {"files": args.files, "per_file": args.per_file,
                     "repeats": args.repeats, "warm_up_rounds": args.warm_up,
                     "quick": args.quick,
                     "checkpoint_config": checkpoint_config(True)},
        "benchmarks": report,
        "runs": [r.summary() for r in results],
        "wrong_output": wrong,
    }
    return suites.write_report(args.out, document, wrong)


if __name__ == "__main__":
    sys.exit(main())
