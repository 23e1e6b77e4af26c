"""Drive the example numbers job as a real driver process: inputs, kills, verification.

Shared by ``make demo`` and the kill-at-random-points integration tests. The ground
truth is computed from the input files alone, independently of Spark and of the
runtime.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_ckpt.examples import JOBS_DIR
from airflow_ckpt.runtime import sparkconf
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage.base import CheckpointStorage

JOB_SCRIPT = JOBS_DIR / "odd_even_sums.py"


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
    #: the file source's directory (``--input``); None for a job with another source
    input_dir: Path | None
    output_uri: str
    checkpoint_config: Mapping[str, Any] = field(default_factory=dict)
    confs: Mapping[str, Any] = field(default_factory=dict)
    extra_args: Sequence[str] = ()
    workdir: Path | str | None = None  # a local path or a URI (hdfs://...)
    #: Spark master (default: the job's own ``local[2]``), e.g. ``spark://host:port``
    master: str | None = None
    #: the driver's script (an example job taking ``--output`` and, with ``input_dir``,
    #: ``--input``)
    script: Path = JOB_SCRIPT

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
    argv = [sys.executable, str(spec.script), "--output", spec.output_uri, *spec.extra_args]
    if spec.input_dir is not None:
        argv += ["--input", str(spec.input_dir)]
    if spec.master:
        argv += ["--master", spec.master]
    submit = " ".join(
        f"--conf {shlex.quote(f'{k}={v}')}" for k, v in spec.spark_confs(restore).items()
    )
    # PySpark reads PYSPARK_SUBMIT_ARGS when it launches its JVM itself.
    # Python workers (ParquetSink's mapInArrow) need this interpreter's packages.
    full_env = {"PYSPARK_PYTHON": sys.executable, **os.environ, **env,
                "PYSPARK_SUBMIT_ARGS": f"{submit} pyspark-shell"}
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def kill_hard(proc: subprocess.Popen[bytes]) -> None:
    """kill -9 the driver and its JVM (the whole process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


#: ``moment(proc, round)`` waits until driver life ``round`` (0-based) is to be killed and
#: returns True, or returns False when the driver exited first
KillMoment = Callable[["subprocess.Popen[bytes]", int], bool]


def run_with_kills(spec: JobSpec | Callable[[int], JobSpec], env: Mapping[str, str],
                   log_path: Path, *, kills: int, moment: KillMoment,
                   after_kill: Callable[[int], None] | None = None,
                   timeout_s: float = 300) -> int:
    """Start the driver up to ``kills`` times with ``restore=latest``, ``kill -9`` each
    life at ``moment``, call ``after_kill(round)`` (the test's invariants on what the
    dead driver left behind), then run one last driver to the end. A driver that
    finishes before its kill moment is a valid, shorter story. ``spec`` may depend on
    the round (``kills`` is the last run's). Returns the kills that landed."""

    def spec_of(round_: int) -> JobSpec:
        return spec(round_) if callable(spec) else spec

    landed = 0
    for round_ in range(kills):
        proc = start_job(spec_of(round_), env, log_path)
        try:
            due = moment(proc, round_)
        except BaseException:
            kill_hard(proc)
            raise
        if not due:
            proc.wait()
            assert proc.returncode == 0, _tail(log_path)
            return landed
        kill_hard(proc)
        landed += 1
        if after_kill is not None:
            after_kill(round_)
    proc = start_job(spec_of(kills), env, log_path)
    try:
        code = proc.wait(timeout=timeout_s)
    finally:
        kill_hard(proc)
    assert code == 0, _tail(log_path)
    return landed


def _tail(log_path: Path, chars: int = 3000) -> str:
    return log_path.read_text(errors="replace")[-chars:]


def after_seconds(low: float, high: float, rng: random.Random) -> KillMoment:
    """Kill at a random moment ``low..high`` s after the driver process started."""

    def moment(proc: subprocess.Popen[bytes], round_: int) -> bool:
        return _alive_after(proc, rng.uniform(low, high))

    return moment


def after_checkpoint(storage: CheckpointStorage, job: str, rng: random.Random, *,
                     within_s: float, timeout_s: float = 300) -> KillMoment:
    """Kill at a random moment ``0..within_s`` s after this life's first completed
    checkpoint (an event, so the kill lands in the running query on a loaded machine
    too, never in a JVM that is still starting)."""

    def moment(proc: subprocess.Popen[bytes], round_: int) -> bool:
        if wait_for_checkpoints(storage, job, 1, proc, timeout_s) < 1:
            if proc.poll() is not None:
                return False
            raise AssertionError(f"no checkpoint completed in {timeout_s} s")
        return _alive_after(proc, rng.uniform(0, within_s))

    return moment


def _alive_after(proc: subprocess.Popen[bytes], delay_s: float) -> bool:
    """Wait ``delay_s`` for the driver to exit; True if it is still running."""
    try:
        proc.wait(timeout=delay_s)
    except subprocess.TimeoutExpired:
        return True
    return False


# ------------------------------------------------------------------ pause points

#: Spark confs of the example job: pause its driver at an interleaving point
PAUSE_AT = sparkconf.CONF_PREFIX + "demo.pause_at"  # "<point>:<n>": the n-th arrival
PAUSED_FILE = sparkconf.CONF_PREFIX + "demo.paused_file"  # written when it pauses there


def install_pause(point: str, nth: int, paused_file: Path) -> None:
    """In a driver: block the thread that reaches ``point`` for the ``nth`` time, after
    writing ``paused_file`` (the point's name), so that a test kills the driver exactly
    there. Later arrivals and other points pass on. Not a context manager: it stays for
    the process's life (the process is killed while paused)."""
    from airflow_ckpt.runtime import interleave

    arrivals = [0]
    lock = threading.Lock()
    released = threading.Event()  # never set: the process dies while paused

    def hook() -> None:
        with lock:
            arrivals[0] += 1
            if arrivals[0] != nth:
                return
        tmp = paused_file.with_name(paused_file.name + ".tmp")
        tmp.write_text(point)
        tmp.rename(paused_file)
        if not released.wait(600):
            raise TimeoutError(f"paused at {point} for 600 s and never killed")

    installed = interleave.installed(point, hook)
    installed.__enter__()
    _INSTALLED.append(installed)  # a dropped context manager would uninstall on GC


_INSTALLED: list[Any] = []


def wait_for_file(path: Path, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait until ``path`` exists (True) or the driver exited (False)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            return path.exists()
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear in {timeout_s} s")
        time.sleep(0.02)
    return True


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
class OutputCheck:
    ok: bool
    problems: list[str]
    final: dict[str, tuple[int, int]]


def verify_output(sink: JsonLinesSink, truth: GroundTruth, *, finished: bool) -> OutputCheck:
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
    return OutputCheck(not problems, problems, final)


def killed_run_problems(storage: CheckpointStorage, job: str, sink: JsonLinesSink,
                        truth: GroundTruth) -> list[str]:
    """What a ``kill -9`` must never leave behind: committed output newer than the latest
    completed checkpoint (two-phase commit), or output that is not a prefix of a
    correct run (:func:`verify_output` with ``finished=False``)."""
    problems: list[str] = []
    latest = CheckpointCatalog(storage, job).latest_checkpoint()
    committed = sink.committed_batches()
    if committed and (latest is None or max(committed) > latest.batch_id):
        problems.append(f"batch {max(committed)} visible, latest checkpoint covers "
                        f"{latest.batch_id if latest else None}")
    return problems + verify_output(sink, truth, finished=False).problems


def finished_job_problems(storage: CheckpointStorage, job: str, *,
                          num_retained: int) -> list[str]:
    """After the last driver finished: a ``job_finished`` event, every restore from a
    completed checkpoint, only ``num_retained`` checkpoints left and all of them
    complete, none missing a file or a state partition's data."""
    from airflow_ckpt.runtime.history import events as ev
    from airflow_ckpt.runtime.history.journal import JobHistory

    problems: list[str] = []
    events = JobHistory(storage, job).events()
    if not [e for e in events if e.type == ev.JOB_FINISHED]:
        problems.append("no job_finished event")
    for restored in (e for e in events if e.type == ev.RESTORED):
        if not restored.data["path"].endswith(f"chk-{restored.data['checkpoint_id']}"):
            problems.append(f"restored from {restored.data['path']}, not a checkpoint")
    catalog = CheckpointCatalog(storage, job)
    if len(catalog.checkpoint_ids()) > num_retained:
        problems.append(f"{catalog.checkpoint_ids()} retained, more than {num_retained}")
    if catalog.checkpoint_ids() != catalog.checkpoint_ids(completed_only=False):
        problems.append(f"incomplete checkpoint directories left: "
                        f"{catalog.checkpoint_ids(completed_only=False)}")
    return problems + checkpoint_state_problems(storage, job)


def checkpoint_state_problems(storage: CheckpointStorage, job: str) -> list[str]:
    """Every completed checkpoint's files exist in storage, and every state partition of
    every stateful operator has a versioned state file in it (a checkpoint of executors'
    state the driver could not see would have none)."""
    from airflow_ckpt.errors import WorkdirNotSharedError
    from airflow_ckpt.runtime.checkpoint.workdir_check import check_state_visible
    from airflow_ckpt.runtime.storage.layout import JobLayout

    problems: list[str] = []
    root = JobLayout(job).root
    for manifest in CheckpointCatalog(storage, job).completed_checkpoints():
        where = f"chk-{manifest.checkpoint_id} (batch {manifest.batch_id})"
        try:
            check_state_visible(where, (f.path for f in manifest.files), manifest.operators)
        except WorkdirNotSharedError as exc:
            problems.append(f"{where} lacks state: {exc}")
        missing = [f.key for f in manifest.files
                   if not f.is_inline and not storage.exists(root + f.key)]
        if missing:
            problems.append(f"{where}: {len(missing)} files missing, e.g. {missing[:3]}")
    return problems
