"""A driver is one unit: kill its JVM alone, its Python alone, or both; the rest follows.

The driver is launched as the operator launches it: ``CheckpointedSparkSubmitOperator``
(blocking supervision, ``master="local[2]"``, client mode) runs the real ``spark-submit``
of the example job, whose JVM (``SparkSubmit``) starts the Python driver as its child
(``PythonRunner``). Checkpoints and output go to the session's moto S3 server.

Each driver life is killed after its first checkpoint: the JVM alone (what the OOM
killer does: it picks the biggest process), the Python process alone, or both at once.
After each kill, every process of that life is gone within seconds (the survivor
follows), nothing visible is newer than the latest checkpoint, and the next life takes
the job over (the lease is released, or its holder provably dead). At the end the
output equals the ground truth and the history holds exactly one driver-level failure
per kill: no query-level failure, no in-process restart, no restore by a driver that
was not the running attempt, no ``job_failed``.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from airflow_ckpt.operators import CheckpointedSparkSubmitOperator
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history.events import (
    FAILURE,
    JOB_FAILED,
    JOB_FINISHED,
    JOB_SUBMITTED,
    RESTART,
    RESTORED,
)
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.testing.numbers import (
    JOB_SCRIPT,
    finished_job_problems,
    killed_run_problems,
    verify_output,
    write_numbers,
)
from airflow_ckpt.testing.s3_server import S3Endpoint

pytestmark = pytest.mark.integration

JOB = "unit-kill"
#: how long the rest of a killed driver may live on (liveness only: a healthy unit
#: follows within a second or two; the old code's orphan lived on for minutes)
FOLLOW_S = 30.0
WAIT_S = 300.0


@dataclass(frozen=True, slots=True)
class Life:
    """One driver life: the spark-submit JVM and the Python driver it started."""

    jvm: psutil.Process
    python: psutil.Process

    def targets(self, which: str) -> list[psutil.Process]:
        return {"jvm": [self.jvm], "python": [self.python],
                "both": [self.jvm, self.python]}[which]


class Supervision:
    """The operator's blocking ``execute`` in a thread, as an Airflow worker runs it."""

    def __init__(self, op: CheckpointedSparkSubmitOperator) -> None:
        self.op = op
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        ti = SimpleNamespace(dag_id="unit", run_id="manual__1", task_id="t", map_index=-1,
                             try_number=1)
        self.thread = threading.Thread(target=self._run, args=({"ti": ti},), daemon=True)

    def _run(self, context: dict[str, Any]) -> None:
        try:
            self.result = self.op.execute(context)  # type: ignore[arg-type]
        except BaseException as exc:  # reported by the test
            self.error = exc

    def running(self) -> bool:
        return self.thread.is_alive()

    def life(self, previous_jvm: int | None, timeout_s: float = WAIT_S) -> Life | None:
        """The next driver life's processes once both exist (None: supervision ended)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.running():
            hook = self.op._hook
            pid = getattr(hook, "pid", None) if hook is not None else None
            if pid is not None and pid != previous_jvm:
                try:  # spark-submit is a shell script that execs the JVM
                    jvm = psutil.Process(pid)
                    pythons = [c for c in jvm.children() if jvm.name() == "java"
                               and c.name().startswith("python")
                               and str(JOB_SCRIPT) in c.cmdline()]
                except psutil.NoSuchProcess:
                    pythons = []
                if pythons:
                    return Life(jvm, pythons[0])
            time.sleep(0.1)
        assert not self.running(), f"no driver life appeared within {timeout_s} s"
        return None


def _wait_checkpoint(storage: CheckpointStorage, before: set[int], sup: Supervision,
                     life: Life) -> bool:
    """Wait for a checkpoint newer than ``before``; False if the supervision ended."""
    catalog = CheckpointCatalog(storage, JOB)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if set(catalog.checkpoint_ids()) - before:
            return True
        if not sup.running():
            return False
        assert _running(life.jvm) and _running(life.python), (
            f"the driver died before its first checkpoint: {sup.op._hook.output_tail[-30:]}")
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint completed within {WAIT_S} s")


def _left_behind(processes: list[psutil.Process], timeout_s: float) -> list[str]:
    """The processes still running (not zombies) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    alive = processes
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.1)
    return [f"pid {p.pid} ({' '.join(p.cmdline())[:120]})" for p in alive if _running(p)]


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_kills(
    s3_endpoint: S3Endpoint, s3_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str], kills: list[tuple[str, signal.Signals]],
    restart_strategy: dict[str, Any],
) -> None:
    """Kill one driver life per entry of ``kills`` (which process, which signal), then let
    the last life finish; check exactness and the one-failure-per-kill count."""
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", s3_endpoint.airflow_connection())
    truth = write_numbers(tmp_path / "in", files=6 * (len(kills) + 1), per_file=20)
    output_uri = s3_uri + "-out"
    op = CheckpointedSparkSubmitOperator(
        task_id="t", application=str(JOB_SCRIPT), job_name=JOB, checkpoint_storage=s3_uri,
        master="local[2]", restart_strategy=restart_strategy,
        checkpoint_config={"execution.checkpointing.interval": "300 ms",
                           "execution.checkpointing.num-retained": 2},
        conf={"spark.airflow_ckpt.demo.batch_delay_s": "0.3",
              "spark.ui.enabled": "false"},
        application_args=["--input", str(tmp_path / "in"), "--output", output_uri],
        workdir=str(tmp_path / "work"), env_vars=s3_endpoint.env(),
    )
    storage = s3_endpoint.storage(s3_uri)
    sink = JsonLinesSink(s3_endpoint.storage(output_uri), "")
    sup = Supervision(op)
    sup.thread.start()
    landed: list[str] = []
    followed: list[str] = []  # how long the rest of each killed driver lived on
    seen: list[psutil.Process] = []
    previous: int | None = None
    try:
        for which, sig in kills:
            life = sup.life(previous)
            if life is None:
                break
            previous = life.jvm.pid
            seen.extend((life.jvm, life.python))
            before = set(CheckpointCatalog(storage, JOB).checkpoint_ids())
            if not _wait_checkpoint(storage, before, sup, life):
                break
            for process in life.targets(which):
                process.send_signal(sig)
            killed_at = time.monotonic()
            left = _left_behind([life.jvm, life.python], FOLLOW_S)
            assert not left, (f"kill of the {which} ({sig.name}): still running after "
                              f"{FOLLOW_S:.0f} s: {left}")
            landed.append(f"{which}/{sig.name}")
            followed.append(f"{which}/{sig.name}: {time.monotonic() - killed_at:.1f} s")
            problems = killed_run_problems(storage, JOB, sink, truth)
            assert not problems, f"after {landed}: {problems}"
        sup.thread.join(WAIT_S)
    finally:
        if sup.running():
            op.on_kill()
            sup.thread.join(60)
        for process in seen:  # a failed test leaves nothing running either
            if _running(process):
                process.kill()
    log = capfd.readouterr().out
    with capfd.disabled():
        print(f"\nkills and how long the rest of the driver lived on: {followed}")
    assert sup.error is None, f"kills {landed}: the supervision failed: {sup.error!r}"
    assert sup.result is not None and sup.result["outcome"] == "finished", sup.result
    assert len(landed) == len(kills), f"only {landed} landed before the job finished"

    verdict = verify_output(sink, truth, finished=True)
    assert verdict.ok, f"kills {landed}: {verdict.problems}"
    problems = finished_job_problems(storage, JOB, num_retained=2)
    assert not problems, f"kills {landed}: {problems}"

    history = JobHistory(storage, JOB)

    def data(kind: str, field: str) -> list[Any]:
        return [e.data.get(field) for e in history.events([kind])]

    # exactly one failure per kill, counted by the supervisor; none by a surviving half
    assert data(FAILURE, "level") == ["driver"] * len(kills), history.events([FAILURE])
    assert data(RESTART, "restart") == [True] * len(kills)
    assert history.events([JOB_FAILED]) == []
    assert data(JOB_SUBMITTED, "attempt") == list(range(1, len(kills) + 2))
    assert len(history.events([JOB_FINISHED])) == 1
    # only the running attempts restored: one restore per resubmission, each reported once
    restored = history.events([RESTORED])
    assert [e.data.get("attempt") for e in restored] == list(range(2, len(kills) + 2))
    for attempt in range(1, len(kills) + 2):
        lines = log.count(f"attempt {attempt} restored from checkpoint")
        assert lines == (attempt > 1), f"attempt {attempt}: {lines} restore lines in the log"


#: restarts at once, many allowed: the strategy under which one JVM kill used to count
#: as three failures
FAILURE_RATE = {"type": "failure-rate", "failure-rate.max-failures-per-interval": 20,
                "failure-rate.failure-rate-interval": "10 min",
                "failure-rate.delay": "100 ms"}


#: the strategy under which the orphan restarted in-process forever
EXPONENTIAL = {"type": "exponential-delay",
               "exponential-delay.initial-backoff": "100 ms",
               "exponential-delay.max-backoff": "1 s"}


@pytest.mark.timeout(1200)  # four driver lives: ~3 min idle, far more on a loaded 2-core CI
@pytest.mark.parametrize("sig, strategy", [
    pytest.param(signal.SIGKILL, FAILURE_RATE, id="sigkill-failure-rate"),
    pytest.param(signal.SIGTERM, EXPONENTIAL, id="sigterm-exponential-delay",
                 marks=pytest.mark.soak),
])
def test_killing_the_jvm_or_the_python_or_both_counts_one_failure_each(
    sig: signal.Signals, strategy: dict[str, Any], s3_endpoint: S3Endpoint, s3_uri: str,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
) -> None:
    run_kills(s3_endpoint, s3_uri, tmp_path, monkeypatch, capfd,
              [("jvm", sig), ("python", sig), ("both", sig)], strategy)
