"""E2E: operating the main example in a running Airflow, every run triggered through the
REST API (issue 27's "done when").

Real Airflow (tests/fixtures/airflow_cluster.py: api-server, scheduler with the
LocalExecutor, triggerer; SQLite) running the example DAGs of ``dags/`` as shipped; real
Spark (``local[1]``) running ``spark_jobs/rate_counts.py`` under the operator;
checkpoints on ``file://`` storage, which the plugin's pages read too. The story:

1. ``streaming_rate_counts`` is triggered twice at once (two concurrent ``POST
   /api/v2/dags/{dag}/dagRuns``): one run runs the job, the other stays ``queued``
   (``max_active_runs=1``) while the job checkpoints;
2. another DAG (``checkpointed_streaming_job``) started for the same job name is refused
   before spark-submit (``RunningJobGuard``): its task fails with ``JobHeldError``
   naming the DAG run that holds the job, and nothing of it reaches the job's history;
3. the job's page (the plugin, through the api-server) says ``RUNNING``;
4. ten ``savepoint_manual`` runs triggered at once all succeed, each with its savepoint;
5. the queued run is set failed through the REST API (else it would start the job again
   after the stop); ``savepoint_manual`` with ``stop=true`` succeeds, the job records
   ``job_stopped`` with the savepoint, and the running streaming run succeeds.

Every wait observes the metadata DB, the REST API or the storage (no sleep orders
anything); a timed-out wait says what it saw. The phases' durations are printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history.events import JOB_FAILED, JOB_STOPPED, JOB_SUBMITTED
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.lease.record import read_lease
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from tests.fixtures.airflow_cluster import AirflowCluster, airflow_cluster

pytestmark = pytest.mark.e2e

DAGS = Path(__file__).resolve().parents[2] / "dags"
STREAMING = "streaming_rate_counts"
SAVEPOINT = "savepoint_manual"
OTHER = "checkpointed_streaming_job"
WAIT_S = 240  # per step, on a loaded 2-core machine
SAVEPOINTS = 10


@dataclass
class Scenario:
    cluster: AirflowCluster
    storage: CheckpointStorage
    job: str
    tmp: Path
    phases: list[tuple[str, float]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    # ------------------------------------------------------------------ REST
    def rest(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            f"{self.cluster.api_url}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
        return json.loads(text) if text.startswith(("{", "[")) else text

    def trigger(self, dag_id: str, run_id: str, conf: dict[str, Any]) -> None:
        self.rest("POST", f"/api/v2/dags/{dag_id}/dagRuns",
                  {"dag_run_id": run_id, "logical_date": None, "conf": conf})

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.rest("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"])

    # ------------------------------------------------------------------ observing
    def history(self, *types: str) -> list[Any]:
        return JobHistory(self.storage, self.job).events(types or None)

    def explain(self, dag_id: str = STREAMING, run_id: str = "", task_id: str = "run_job"
                ) -> Any:
        def text() -> str:
            events = [f"  {e.type} {json.dumps(e.data, default=str)[:300]}"
                      for e in self.history()]
            drivers = []
            for submitted in self.history(JOB_SUBMITTED):
                path = submitted.data.get("driver_log")
                if path and Path(path).exists():
                    drivers.append(f"driver log {path}:\n{Path(path).read_text()[-2500:]}")
            runs = self.cluster.query("SELECT dag_id, run_id, state FROM dag_run")
            return self.cluster.explain(dag_id, run_id, task_id, f"DAG runs: {runs}",
                                        "job history:\n" + "\n".join(events[-40:]), *drivers)
        return text

    def wait(self, what: str, predicate: Any, explain: Any = None) -> Any:
        return self.cluster.wait_for(predicate, WAIT_S, what, explain or self.explain())

    def phase(self, name: str) -> None:
        self.phases.append((name, time.monotonic() - self.started))

    def report(self) -> str:
        last, parts = 0.0, []
        for name, at in self.phases:
            parts.append(f"{name} {at - last:.0f} s")
            last = at
        return f"total {last:.0f} s: " + ", ".join(parts)


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[Scenario]:
    storage = open_storage((tmp_path / "checkpoints").as_uri())
    job = f"rates-{uuid.uuid4().hex[:6]}"
    env = {"AIRFLOW_CKPT_STORAGE": storage.uri,
           "AIRFLOW__AIRFLOW_CKPT__STORAGE_URI": storage.uri}
    with airflow_cluster(tmp_path / "airflow", DAGS, env,
                         unpause=(STREAMING, SAVEPOINT, OTHER)) as cluster:
        found = Scenario(cluster, storage, job, tmp_path)
        found.phase("airflow up")
        try:
            yield found
        finally:
            print(f"one run per job e2e: {found.report()}")
            # never leave a driver behind: kill whatever still holds the job's lease here
            lease = read_lease(storage, job)
            if lease is not None and not lease.released and lease.host == socket.gethostname():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(os.getpgid(lease.pid), signal.SIGKILL)
    storage.close()


@pytest.mark.timeout(1800)
def test_two_runs_at_once_one_runs_savepoints_stay_green_and_the_stop_succeeds(
    scenario: Scenario,
) -> None:
    s = scenario
    conf = {"job_name": s.job, "storage": s.storage.uri, "rows_per_second": 5,
            "trigger_interval": "1 second", "checkpoint_interval": "2 s",
            "master": "local[1]"}
    runs = [f"twin-{i}-{uuid.uuid4().hex[:6]}" for i in (1, 2)]

    # 1. two REST triggers at once: one runs, the other queues
    barrier = threading.Barrier(2)

    def post(run_id: str) -> None:
        barrier.wait()
        s.trigger(STREAMING, run_id, conf)

    posts = [threading.Thread(target=post, args=(r,)) for r in runs]
    for t in posts:
        t.start()
    for t in posts:
        t.join(60)
    catalog = CheckpointCatalog(s.storage, s.job)

    def one_runs_and_checkpoints() -> tuple[str, str] | None:
        states = {r: s.run_state(STREAMING, r) for r in runs}
        running = [r for r, state in states.items() if state == "running"]
        queued = [r for r, state in states.items() if state == "queued"]
        latest = catalog.latest_checkpoint()
        if len(running) == 1 and len(queued) == 1 and latest is not None \
                and latest.batch_id >= 1:
            return running[0], queued[0]
        return None

    winner, queued = s.wait("one streaming run running with a completed checkpoint, the "
                            "other queued", one_runs_and_checkpoints)
    s.phase("two triggers: one running with a checkpoint, one queued")
    lease = read_lease(s.storage, s.job)
    assert lease is not None and winner in lease.owner, (lease, winner)
    assert len(s.history(JOB_SUBMITTED)) == 1  # the queued run submitted nothing

    # 2. another DAG for the same job is refused before spark-submit, naming the holder
    other = f"other-{uuid.uuid4().hex[:6]}"
    s.trigger(OTHER, other, {"job_name": s.job, "storage": s.storage.uri,
                             "input_dir": str(s.tmp / "input"), "master": "local[1]"})
    s.wait("the other DAG's run to fail", lambda: s.run_state(OTHER, other) == "failed",
           s.explain(OTHER, other, "run_job"))
    refusal = s.cluster.task_logs(OTHER, other, "run_job", chars=60_000)
    assert "JobHeldError" in refusal, refusal[-3000:]
    assert f"job {s.job!r} is running in another supervision" in refusal
    assert winner in refusal  # names the DAG run that holds the job
    assert len(s.history(JOB_SUBMITTED)) == 1 and not s.history(JOB_FAILED)
    s.phase("another DAG refused")

    # 3. the job's page says RUNNING
    page = s.rest("GET", f"/airflow-ckpt/view/{s.job}")
    status = re.search(r'id="job-status">([A-Z]+)<', page)
    assert status is not None and status.group(1) == "RUNNING", page[:2000]
    [row] = [j for j in s.rest("GET", "/airflow-ckpt/jobs")["jobs"] if j["id"] == s.job]
    assert row["health"]["status"] == "running", row

    # 4. ten savepoints triggered at once: all green
    savepoint_runs = [f"sp-{i}-{uuid.uuid4().hex[:6]}" for i in range(SAVEPOINTS)]
    for run_id in savepoint_runs:
        s.trigger(SAVEPOINT, run_id, {"job_name": s.job, "storage": s.storage.uri})

    def all_ended() -> dict[str, str] | None:
        states = {r: s.run_state(SAVEPOINT, r) for r in savepoint_runs}
        return states if all(v in ("success", "failed") for v in states.values()) else None

    ended = s.wait(f"{SAVEPOINTS} savepoint runs to end", all_ended,
                   s.explain(SAVEPOINT, savepoint_runs[0], "savepoint"))
    failed = [r for r, state in ended.items() if state != "success"]
    assert not failed, s.explain(SAVEPOINT, failed[0], "savepoint")()
    assert len(catalog.savepoints()) == SAVEPOINTS
    assert s.run_state(STREAMING, winner) == "running"
    s.phase(f"{SAVEPOINTS} savepoints")

    # 5. the queued run is dropped; stop-with-savepoint ends the job and its run succeeds
    s.rest("PATCH", f"/api/v2/dags/{STREAMING}/dagRuns/{queued}", {"state": "failed"})
    stop = f"stop-{uuid.uuid4().hex[:6]}"
    s.trigger(SAVEPOINT, stop, {"job_name": s.job, "storage": s.storage.uri, "stop": True,
                                "savepoint_id": "final"})
    s.wait("the stop-with-savepoint run and the streaming run to succeed",
           lambda: s.run_state(SAVEPOINT, stop) == "success"
           and s.run_state(STREAMING, winner) == "success",
           s.explain(SAVEPOINT, stop, "savepoint"))
    [stopped] = s.history(JOB_STOPPED)
    assert str(stopped.data.get("savepoint")).rstrip("/").endswith("/savepoints/sp-final"), stopped
    assert not s.history(JOB_FAILED)
    assert len(s.history(JOB_SUBMITTED)) == 1  # the queued run never started a driver
    s.phase("stop-with-savepoint")
