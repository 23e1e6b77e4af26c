"""Drive the example numbers job as a real driver process: inputs, kills, verification.

Shared by ``make demo`` and the kill-at-random-points integration tests. The ground
truth is computed from the input files alone, independently of Spark and of the
runtime.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_ckpt.runtime import sparkconf
from airflow_ckpt.runtime.catalog import CheckpointCatalog
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage.base import CheckpointStorage

JOB_SCRIPT = Path(__file__).resolve().parents[2] / "spark_jobs" / "odd_even_sums.py"


@dataclass(frozen=True, slots=True)
class GroundTruth:
    """Expected final (count, sum) per key, computed from the input numbers."""

    totals: dict[str, tuple[int, int]]
    numbers: int

    def plus(self, other: GroundTruth) -> GroundTruth:
        """The ground truth of both inputs together (disjoint numbers)."""
        totals = dict(self.totals)
        for key, (count, total) in other.totals.items():
            before = totals.get(key, (0, 0))
            totals[key] = (before[0] + count, before[1] + total)
        return GroundTruth(totals, self.numbers + other.numbers)


def write_numbers(directory: Path, files: int, per_file: int, *, start: int = 1,
                  keyed: bool = False, first_file: int = 0) -> GroundTruth:
    """Write ``files`` text files of consecutive integers; return the ground truth.

    Files are named ``f<index>.txt`` from ``first_file`` on, so a second call with
    ``first_file`` and ``start`` past the first call's adds input (see :meth:`GroundTruth.plus`).
    """
    directory.mkdir(parents=True, exist_ok=True)
    totals: dict[str, list[int]] = {}
    n = start
    for i in range(first_file, first_file + files):
        values = list(range(n, n + per_file))
        n += per_file
        tmp = directory / f".f{i:05d}.tmp"
        tmp.write_text("".join(f"{v}\n" for v in values))
        tmp.rename(directory / f"f{i:05d}.txt")  # the file source must never see half a file
        for v in values:
            key = str(v % 10) if keyed else ("even" if v % 2 == 0 else "odd")
            count_sum = totals.setdefault(key, [0, 0])
            count_sum[0] += 1
            count_sum[1] += v
    return GroundTruth({k: (c, s) for k, (c, s) in totals.items()}, n - start)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """How to run the example job as a plain ``python`` driver (local Spark)."""

    job: str
    storage_uri: str
    input_dir: Path
    output_uri: str
    checkpoint_config: Mapping[str, Any] = field(default_factory=dict)
    confs: Mapping[str, Any] = field(default_factory=dict)
    extra_args: Sequence[str] = ()
    workdir: Path | None = None

    def spark_confs(self, restore: str) -> dict[str, str]:
        settings: dict[str, Any] = {
            sparkconf.JOB: self.job,
            sparkconf.STORAGE: self.storage_uri,
            sparkconf.RESTORE: restore,
            sparkconf.CHECKPOINT_CONFIG: json.dumps(dict(self.checkpoint_config)),
            **dict(self.confs),
        }
        if self.workdir is not None:
            settings[sparkconf.WORKDIR] = str(self.workdir)
        return {k: str(v) for k, v in settings.items()}


def start_job(spec: JobSpec, env: Mapping[str, str], log_path: Path, *,
              restore: str = "latest") -> subprocess.Popen[bytes]:
    """Start the driver in its own process group (so a kill takes its JVM along)."""
    argv = [sys.executable, str(JOB_SCRIPT), "--input", str(spec.input_dir),
            "--output", spec.output_uri, *spec.extra_args]
    submit = " ".join(
        f"--conf {shlex.quote(f'{k}={v}')}" for k, v in spec.spark_confs(restore).items()
    )
    # PySpark reads PYSPARK_SUBMIT_ARGS when it launches its JVM itself.
    full_env = {**os.environ, **env, "PYSPARK_SUBMIT_ARGS": f"{submit} pyspark-shell"}
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def kill_hard(proc: subprocess.Popen[bytes]) -> None:
    """kill -9 the driver and its JVM (the whole process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_for_checkpoints(storage: CheckpointStorage, job: str, count: int,
                         proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    """Wait until ``count`` checkpoints completed since the call (or the job exited)."""
    catalog = CheckpointCatalog(storage, job)
    before = set(catalog.checkpoint_ids())
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        now = set(catalog.checkpoint_ids())
        if len(now - before) >= count:
            return len(now - before)
        time.sleep(0.1)
    return len(set(catalog.checkpoint_ids()) - before)


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    problems: list[str]
    final: dict[str, tuple[int, int]]


def verify_output(sink: JsonLinesSink, truth: GroundTruth, *, finished: bool) -> Verdict:
    """Check the committed output against the ground truth.

    * batches committed form one gap-free, duplicate-free run 0..k;
    * per key, the running count never goes back (no replayed or lost input folded
      twice into state along the committed timeline);
    * when ``finished``: the last (count, sum) per key equals the ground truth and
      nothing is left pending.
    """
    problems: list[str] = []
    batches = sink.committed_batches()
    if batches != list(range(len(batches))):
        problems.append(f"committed batches are not 0..{len(batches) - 1}: {batches}")
    final: dict[str, tuple[int, int]] = {}
    for row in sink.committed_rows():
        key, count, total = str(row["key"]), int(row["count"]), int(row["sum"])
        if key in final and count <= final[key][0]:
            problems.append(f"count of {key!r} went from {final[key][0]} to {count}")
        final[key] = (count, total)
    if finished:
        if final != truth.totals:
            problems.append(f"final {final} != ground truth {truth.totals}")
        if sink.pending():
            problems.append(f"transactions still pending after finish: {sink.pending()}")
    return Verdict(not problems, problems, final)
