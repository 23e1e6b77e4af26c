"""E2E: a deferred supervision survives a driver SIGKILL and a triggerer restart, with
exact output - under a real scheduler and triggerer (issue 10's "done when"), with the
driver's wall clock an hour ahead of the Airflow processes' (issue 19's "done when").

Real Airflow (tests/fixtures/airflow_cluster.py: api-server, scheduler with the
LocalExecutor, triggerer; SQLite), real Spark (``local[1]``, client mode, the driver
started detached by the operator), checkpoints and output on the session's moto S3
server (its own process). The DAG (tests/e2e/dags/real_supervision_e2e.py) streams the
example odd/even job continuously over a directory of number files. The story:

1. the task submits the driver and defers: the task instance is ``deferred`` (it holds
   no worker slot) while the job completes checkpoints;
2. the triggerer is SIGKILLed, then the driver (the lease holder's process group:
   launcher, spark-submit JVM, Python driver) is SIGKILLed - nobody watches it die;
3. more input arrives; the triggerer starts again, picks the trigger up from the DB,
   sees from storage alone that the driver is dead, and fires;
4. the task resumes, records the driver failure, the fixed-delay strategy restarts it
   (no delay: see the DAG for the Airflow bug a short deferred delay trips), the new
   driver restores the latest checkpoint and the task defers again;
5. once the output holds every input number, a stop request (stop-with-savepoint
   through the control channel) ends the job; the trigger sees ``job_stopped`` and the
   task succeeds.

Every wait observes the metadata DB or the storage (never a sleep as synchronisation)
and, when it times out, says what it saw: task instance, trigger and triggerer rows,
history events, and the logs of the task, the driver and every Airflow component.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.control.channel import ControlChannel
from airflow_ckpt.runtime.history.events import (
    FAILURE,
    JOB_STOPPED,
    JOB_SUBMITTED,
    RESTART,
    RESTORED,
    HistoryEvent,
)
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.lease.record import read_lease
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.testing import S3Endpoint
from airflow_ckpt.testing.numbers import GroundTruth, verify_output, write_numbers
from tests.fixtures.airflow_cluster import AirflowCluster, airflow_cluster

pytestmark = pytest.mark.e2e

E2E_DAGS = Path(__file__).resolve().parent / "dags"
DAG_ID = "real_supervision_e2e"
TASK_ID = "supervised"
SUPERVISION = "airflow_ckpt.triggers.supervision.DriverSupervisionTrigger"
WAIT_S = 240  # per step; the whole test takes 2-3 minutes on a loaded 2-core machine


@dataclass
class Scenario:
    cluster: AirflowCluster
    storage: CheckpointStorage
    job: str
    run_id: str
    input_dir: Path

    def history(self, *types: str) -> list[HistoryEvent]:
        return JobHistory(self.storage, self.job).events(types or None)

    def ti(self) -> dict[str, Any]:
        return self.cluster.task_instance(DAG_ID, self.run_id, TASK_ID) or {}

    def explain(self) -> str:
        skip = ("type", "ts", "airflow", "error_lines")
        events = []
        for event in self.history():
            fields = {k: v for k, v in event.data.items() if k not in skip}
            events.append(f"  {event.type} {json.dumps(fields, default=str)[:300]}")
        drivers = []
        for submitted in self.history(JOB_SUBMITTED):
            path = submitted.data.get("driver_log")
            text = Path(path).read_text(errors="replace")[-2500:] if path and \
                Path(path).exists() else "(no log)"
            drivers.append(f"driver log of attempt {submitted.data.get('attempt')} "
                           f"({path}):\n{text}")
        return self.cluster.explain(
            DAG_ID, self.run_id, TASK_ID,
            "job history:\n" + "\n".join(events[-60:]), *drivers)

    def wait(self, what: str, predicate: Any, timeout_s: float = WAIT_S) -> Any:
        return self.cluster.wait_for(predicate, timeout_s, what, self.explain)


class StateLog(threading.Thread):
    """Records the task instance's state transitions (for the report, not for sync)."""

    def __init__(self, scenario: Scenario) -> None:
        super().__init__(daemon=True)
        self.scenario = scenario
        self.started = time.monotonic()
        self.transitions: list[tuple[float, str]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            try:
                state = self.scenario.ti().get("state") or "none"
            except Exception:  # a locked DB: look again
                continue
            if not self.transitions or self.transitions[-1][1] != state:
                self.transitions.append((time.monotonic() - self.started, state))

    def report(self) -> str:
        return " -> ".join(f"{state}@{t:.0f}s" for t, state in self.transitions)


def pid_gone(pid: int) -> bool:
    """True once ``pid`` is no process (or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


@pytest.fixture
def scenario(s3_endpoint: S3Endpoint, tmp_path: Path) -> Iterator[Scenario]:
    bucket = f"e2e-real-{uuid.uuid4().hex[:10]}"
    s3_endpoint.create_bucket(bucket)
    storage = s3_endpoint.storage(f"s3://{bucket}/ckpt")
    job = f"real-{uuid.uuid4().hex[:8]}"
    env = {"AIRFLOW_CONN_AWS_DEFAULT": s3_endpoint.airflow_connection()}
    with airflow_cluster(tmp_path / "airflow", E2E_DAGS, env, unpause=(DAG_ID,)) as cluster:
        found = Scenario(cluster, storage, job, f"e2e-{uuid.uuid4().hex[:8]}",
                         tmp_path / "input")
        try:
            yield found
        finally:
            # never leave a driver behind: kill whatever still holds the job's lease here
            lease = read_lease(storage, job)
            if lease is not None and not lease.released and lease.host == socket.gethostname():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(os.getpgid(lease.pid), signal.SIGKILL)
    storage.close()
    s3_endpoint.delete_bucket(bucket)


def test_deferred_supervision_survives_driver_sigkill_and_triggerer_restart(
    scenario: Scenario,
) -> None:
    s, cluster = scenario, scenario.cluster
    started = time.monotonic()
    truth: GroundTruth = write_numbers(s.input_dir, files=5, per_file=20)
    cluster.airflow("dags", "trigger", DAG_ID, "-r", s.run_id, "-c", json.dumps({
        "storage": s.storage.uri, "job": s.job, "input_dir": str(s.input_dir)}))
    states = StateLog(s)
    states.start()
    catalog = CheckpointCatalog(s.storage, s.job)

    # 1. deferred on the supervision trigger, and the job has a checkpoint covering a batch
    def deferred_with_checkpoint() -> dict[str, Any] | None:
        ti = s.ti()
        latest = catalog.latest_checkpoint()
        if ti.get("state") == "deferred" and ti.get("trigger") == SUPERVISION \
                and ti.get("triggerer_id") and latest is not None and latest.batch_id >= 1:
            return ti
        return None

    first = s.wait("the task deferred on the supervision trigger and a completed checkpoint "
                   "covering batch 1", deferred_with_checkpoint)
    assert first["next_method"] == "execute_complete"
    assert first["try_number"] == 1
    deferred_at = time.monotonic() - started

    # 2. the triggerer dies; then the driver dies while nobody watches it
    cluster.components["triggerer"].kill(signal.SIGKILL)
    lease = read_lease(s.storage, s.job)
    assert lease is not None and not lease.released, s.explain()
    assert lease.host == socket.gethostname()
    driver_group = os.getpgid(lease.pid)
    # the detached driver runs in its own session: not the test's, not Airflow's
    assert driver_group == os.getsid(lease.pid) != os.getsid(0)
    assert driver_group not in {c.proc.pid for c in cluster.components.values() if c.proc}
    os.killpg(driver_group, signal.SIGKILL)
    s.wait(f"the driver (pid {lease.pid}) to be gone", lambda: pid_gone(lease.pid), 60)
    killed_ts = time.time()
    restorable = catalog.latest_checkpoint()
    assert restorable is not None
    # nobody noticed: the task is still deferred, and no task runs or waits for a slot
    assert s.ti()["state"] == "deferred", s.explain()
    assert cluster.query("SELECT count(*) FROM task_instance WHERE state IN "
                         "('running', 'queued', 'scheduled')") == [(0,)], s.explain()

    # 3. more input while the job is down; the triggerer comes back
    truth = truth.plus(write_numbers(s.input_dir, files=2, per_file=20, start=101,
                                     first_file=5))
    cluster.components["triggerer"].start()
    restarted_ts = time.time()

    # 4. resumed, failure recorded, restarted from the latest checkpoint, deferred again
    def redeferred() -> dict[str, Any] | None:
        ti = s.ti()
        submits = s.history(JOB_SUBMITTED)
        restored = [e for e in s.history(RESTORED) if len(submits) >= 2
                    and e.seq > submits[1].seq]
        if len(submits) >= 2 and restored and ti.get("state") == "deferred" \
                and ti.get("trigger") == SUPERVISION:
            return ti
        return None

    second = s.wait("the restarted triggerer to notice the dead driver, the task to resume, "
                    "resubmit with a restore, and defer again", redeferred)
    assert second["triggerer_id"] != first["triggerer_id"]  # the new triggerer watches

    # 5. the output catches up with every input number; then stop-with-savepoint
    sink = JsonLinesSink(s.storage, f"_output/{s.job}")
    s.wait("the output to reach the ground truth",
           lambda: verify_output(sink, truth, finished=False).final == truth.totals)
    ControlChannel(s.storage, s.job).request_savepoint(stop=True, timeout_s=300,
                                                       requested_by="e2e test")
    s.wait("the DAG run to end", lambda: cluster.dag_run_state(DAG_ID, s.run_id)
           in ("success", "failed"))
    states.done.set()
    states.join(5)
    seconds = time.monotonic() - started

    assert cluster.dag_run_state(DAG_ID, s.run_id) == "success", s.explain()
    ti = s.ti()
    assert (ti["state"], ti["try_number"]) == ("success", 1), s.explain()  # no Airflow retry
    submits = s.history(JOB_SUBMITTED)
    assert [e.data["attempt"] for e in submits] == [1, 2]
    assert [e.data["restore"] for e in submits] == ["latest", "latest"]
    assert [e.data["detached"] for e in submits] == [True, True]
    assert len({e.data["run_id"] for e in submits}) == 1
    [failure] = s.history(FAILURE)
    assert failure.data["level"] == "driver"
    assert failure.ts > restarted_ts  # decided after the triggerer came back
    [restart] = s.history(RESTART)
    assert restart.data["restart"] is True and restart.data["strategy"] == "fixed-delay"
    assert restart.data["attempt"] == 1  # one failure, counted once, on skewed clocks
    assert submits[1].seq > restart.seq
    [restored] = [e for e in s.history(RESTORED) if e.seq > submits[1].seq]
    # the driver's clock ran an hour ahead (the DAG's sitecustomize); the supervisor's not
    assert restored.ts > killed_ts + 3000 and failure.ts < killed_ts + 3000
    assert restored.data["checkpoint_id"] == restorable.checkpoint_id
    [stopped] = s.history(JOB_STOPPED)
    assert stopped.data.get("savepoint")
    # exactly once: every number folded in once, batches gap-free, nothing pending
    verdict = verify_output(sink, truth, finished=True)
    assert verdict.ok, verdict.problems
    [(xcom,)] = cluster.query(
        "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = ? AND key = ?",
        DAG_ID, s.run_id, TASK_ID, "return_value")
    result = json.loads(xcom)
    assert (result["job"], result["outcome"], result["attempts"]) == (s.job, "stopped", 2)
    assert result["savepoint_path"] == stopped.data["savepoint"]
    triggerers = cluster.triggerer_jobs()
    assert len(triggerers) == 2, triggerers
    print(f"\nreal scheduler + triggerer: deferred with a checkpoint after {deferred_at:.0f} s; "
          f"driver SIGKILLed (restored chk-{restorable.checkpoint_id}); "
          f"failure: {failure.data['cause']!r}; run success after {seconds:.0f} s\n"
          f"task instance states: {states.report()}")
