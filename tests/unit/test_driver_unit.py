"""The driver's Python process and its JVM are one unit (runtime/driver/unit.py), fast.

A plain child process (``sleep``) stands in for the JVM; the real spark-submit kills are
in tests/integration/test_kill_driver_unit.py. The simulated Spark of the crash-point
enumeration runs the real ``CheckpointedJob`` for the restart-loop cases.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_ckpt import launch
from airflow_ckpt.errors import DriverExit
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.driver import unit as driver_unit
from airflow_ckpt.runtime.driver.process import pid_alive
from airflow_ckpt.runtime.driver.unit import EXIT_CODE, DriverUnit
from airflow_ckpt.runtime.history.events import (
    CHECKPOINT_COMPLETED,
    FAILURE,
    JOB_FAILED,
    JOB_STOPPED,
    RESTART,
    RESTORED,
)
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import open_storage
from airflow_ckpt.testing.crashpoints import CONFIG, Script, SimulatedSpark
from airflow_ckpt.testing.crashpoints import RESTART as FIXED

#: liveness only: how long a test waits for what should take milliseconds
WAIT_S = 20.0


class FakeJvm:
    """A Py4J-ish view of a stand-in JVM process: its pid; the SparkContext's state."""

    def __init__(self, process: subprocess.Popen[bytes] | None = None) -> None:
        self.process = process
        self.stopped = False
        self.reachable = True

    def sc(self) -> Any:
        if not self.reachable:
            raise ConnectionRefusedError("the gateway is gone")
        return SimpleNamespace(isStopped=lambda: self.stopped)

    def context(self) -> SimpleNamespace:
        pid = self.process.pid if self.process else os.getpid()
        handle = SimpleNamespace(current=lambda: SimpleNamespace(pid=lambda: pid))
        jvm = SimpleNamespace(java=SimpleNamespace(lang=SimpleNamespace(ProcessHandle=handle)))
        return SimpleNamespace(_jvm=jvm, _jsc=self)


@pytest.fixture
def hard_exits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The grace timer's hard exit, recorded instead of ending the test process."""
    calls: list[str] = []
    monkeypatch.setattr(driver_unit, "_exit_hard", calls.append)
    return calls


def _wait_for_exit() -> None:
    """Block the main thread the way a driver blocks (the handler raises out of it)."""
    threading.Event().wait(WAIT_S)
    raise AssertionError(f"no DriverExit within {WAIT_S} s")


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "poll"])
def test_the_python_driver_ends_when_its_jvm_dies(
    pidfd: bool, hard_exits: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    elif not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfd on this platform")
    jvm = subprocess.Popen(["sleep", "300"])
    fake = FakeJvm(jvm)
    unit = DriverUnit.install(SimpleNamespace(sparkContext=fake.context()), "j")  # type: ignore[arg-type]
    try:
        assert unit.jvm_pid == jvm.pid and unit.lost() is None
        with pytest.raises(DriverExit) as raised:
            jvm.kill()
            jvm.wait()
            fake.reachable = False
            _wait_for_exit()
        assert raised.value.code == EXIT_CODE == 143
        assert f"JVM (pid {jvm.pid}) is gone" in raised.value.reason
    finally:
        unit.close()
        jvm.kill()
    assert signal.getsignal(signal.SIGTERM) is not unit._on_sigterm  # handler given back


def test_sigterm_ends_the_driver_once_and_a_second_one_is_ignored(
    hard_exits: list[str],
) -> None:
    fake = FakeJvm()  # the "JVM" is this process: alive throughout
    unit = DriverUnit.install(SimpleNamespace(sparkContext=fake.context()), "j")  # type: ignore[arg-type]
    try:
        with pytest.raises(DriverExit) as raised:
            os.kill(os.getpid(), signal.SIGTERM)
            _wait_for_exit()
        assert raised.value.reason == "SIGTERM"
        os.kill(os.getpid(), signal.SIGTERM)  # ignored while the driver ends
        time.sleep(0.05)  # let the handler run (it must not raise)
    finally:
        unit.close()
    assert hard_exits == []  # the grace timer has not fired (10 s)


def test_lost_says_why_the_jvm_no_longer_serves_the_driver() -> None:
    fake = FakeJvm()
    unit = DriverUnit(SimpleNamespace(sparkContext=fake.context()), "j")  # type: ignore[arg-type]
    assert unit.lost() is None
    fake.stopped = True
    assert "SparkContext was stopped" in (unit.lost() or "")
    fake.reachable = False
    assert "unreachable (ConnectionRefusedError)" in (unit.lost() or "")
    # a session with no JVM of its own (Spark Connect, a simulation) has nothing to lose
    assert DriverUnit(SimpleNamespace(), "j").lost() is None  # type: ignore[arg-type]


class JvmSpark(SimulatedSpark):
    """The simulated query, with a SparkContext whose JVM a test can take away."""

    def __init__(self, script: Script, jvm: FakeJvm, jvm_dies_at: int | None) -> None:
        def on_batch(b: int) -> None:
            if b == jvm_dies_at:  # the query fails in this batch: the JVM died under it
                jvm.reachable = False

        super().__init__(script, on_batch)
        self.sparkContext = jvm.context()


@pytest.mark.parametrize("jvm_gone", [False, True], ids=["query-failure", "jvm-gone"])
def test_a_failed_query_is_restarted_in_process_only_while_the_jvm_lives(
    jvm_gone: bool, tmp_path: Path, hard_exits: list[str],
) -> None:
    """The same query failure: with the JVM alive it is one query-level failure and an
    in-process restart; with the JVM gone the driver ends (DriverExit) and writes no
    failure, no restart decision, no job_failed and no second restore."""
    storage = open_storage((tmp_path / "ckpt").as_uri())
    script = Script(batches=6, fail_at=2)
    spark = JvmSpark(script, FakeJvm(), script.fail_at if jvm_gone else None)
    job = CheckpointedJob(spark, job="unit", storage=storage,  # type: ignore[arg-type]
                          checkpoint_config=CONFIG, restart_strategy=FIXED,
                          workdir=tmp_path / "work", run_id="r", threaded=False)
    sink = JsonLinesSink(job.storage, "out")
    history = JobHistory(storage, "unit")
    build = lambda: spark.writer(job.exactly_once(sink))  # noqa: E731
    if jvm_gone:
        with pytest.raises(DriverExit, match="JVM is unreachable"):
            job.run(build)  # type: ignore[arg-type]
        assert history.events([FAILURE, RESTART, JOB_FAILED]) == []
        assert history.events([RESTORED]) == []  # the first life started fresh
    else:
        assert job.run(build).outcome == "finished"  # type: ignore[arg-type]
        assert [e.data["level"] for e in history.events([FAILURE])] == ["query"]
        assert [e.data["attempt"] for e in history.events([RESTORED])] == [1]
        assert [e.data["run_id"] for e in history.events([RESTORED])] == ["r"]
    assert hard_exits == []


def test_the_launcher_writes_the_exit_file_only_after_the_orphans_ended(tmp_path: Path) -> None:
    """A detached driver whose first process exits leaves a process behind (as a Python
    driver whose JVM died would): the launcher, a subreaper, ends it, then writes the
    exit file with the command's code."""
    if not sys.platform.startswith("linux"):
        pytest.skip("child subreaper: Linux only")
    exit_file = tmp_path / "driver.exit"
    code = ("import sys, airflow_ckpt.launch as l; l.FOLLOW_S = 1.0; "
            "sys.exit(l.main(sys.argv[1:]))")
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", code, str(exit_file), "--", "bash", "-c",
         "sleep 300 & echo $!; exit 3"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 3, result.stderr
    assert exit_file.read_text().strip() == "3"
    orphan = int(result.stdout.split()[0])
    assert not pid_alive(orphan), "the orphan outlived the launcher"
    assert "outlived the driver process that ended first" in result.stdout
    assert time.monotonic() - started < launch.FOLLOW_S  # not the default wait


def test_cancel_stops_the_job_as_cancelled(tmp_path: Path) -> None:
    """Cancelling is an API call, no longer SIGTERM: the query stops, the job ends as
    cancelled (``job_stopped`` with ``cancelled``), DELETE_ON_CANCELLATION applies."""
    storage = open_storage((tmp_path / "ckpt").as_uri())
    script = Script(batches=50)
    jobs: list[CheckpointedJob] = []
    spark = SimulatedSpark(script, lambda b: jobs[0].cancel() if b == 3 else None)
    job = CheckpointedJob(spark, job="unit", storage=storage,  # type: ignore[arg-type]
                          checkpoint_config={**CONFIG, "execution.checkpointing."
                                             "externalized-checkpoint-retention":
                                             "DELETE_ON_CANCELLATION"},
                          restart_strategy=FIXED, workdir=tmp_path / "work", run_id="r",
                          threaded=False)
    jobs.append(job)
    sink = JsonLinesSink(job.storage, "out")
    result = job.run(lambda: spark.writer(job.exactly_once(sink)))  # type: ignore[arg-type,return-value]
    assert result.outcome == "cancelled"
    stopped = JobHistory(storage, "unit").events([JOB_STOPPED])
    assert [e.data.get("cancelled") for e in stopped] == [True]
    assert JobHistory(storage, "unit").events([CHECKPOINT_COMPLETED])  # there were some
    assert CheckpointCatalog(storage, "unit").checkpoint_ids() == []  # discarded
