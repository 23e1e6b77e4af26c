"""E2E: the deferrable CheckpointSensor under real Airflow (``airflow dags test``, SQLite)
against the session's real S3 endpoint (moto on 127.0.0.1).

What is shown: the sensor task really defers (Airflow's execution API stores the task
instance as ``deferred`` with a ``CheckpointTrigger``), the task process returns while
the trigger waits, a checkpoint marker written by another thread *after* the deferral
resumes it, and the time from the marker's write to detection is measured.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.testing import S3Endpoint
from tests.fixtures.airflow_env import AirflowEnv
from tests.fixtures.snapshots import write_snapshot

pytestmark = pytest.mark.e2e

E2E = Path(__file__).resolve().parent
OBSERVE = E2E / "observe"
TRIGGER = "airflow_ckpt.triggers.checkpoint.CheckpointTrigger"


def observed_env(endpoint: S3Endpoint, observations: Path) -> dict[str, str]:
    """Connections for the DAG run, plus the observation hooks (tests/e2e/observe)."""
    connection = endpoint.airflow_connection()
    return {
        "AIRFLOW_CONN_CKPT_S3": connection,
        "AIRFLOW_CONN_AWS_DEFAULT": connection,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(OBSERVE),
                                                    os.environ.get("PYTHONPATH")])),
        "AIRFLOW_CKPT_OBSERVE": str(observations),
    }


def read_observations(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class DeferralWatcher(threading.Thread):
    """From outside Airflow: waits until the metadata DB shows the task deferred to our
    trigger, then (after ``delay``) calls ``action`` and records when."""

    def __init__(self, db: Path, dag_id: str, task_id: str, delay: float,
                 action: Any) -> None:
        super().__init__(daemon=True)
        self.db, self.dag_id, self.task_id = db, dag_id, task_id
        self.delay, self.action = delay, action
        self.deferred_seen: float | None = None
        self.acted: float | None = None
        self.stop = threading.Event()
        with sqlite3.connect(db, timeout=30) as conn:
            self.after_run = conn.execute(
                "SELECT coalesce(max(id), 0) FROM dag_run WHERE dag_id = ?", (dag_id,)
            ).fetchone()[0]

    def deferred_to_trigger(self) -> bool:
        query = """
            SELECT t.classpath FROM task_instance ti
            JOIN dag_run dr ON dr.dag_id = ti.dag_id AND dr.run_id = ti.run_id
            JOIN trigger t ON t.id = ti.trigger_id
            WHERE ti.dag_id = ? AND ti.task_id = ? AND dr.id > ?"""
        try:
            with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=1) as conn:
                rows = conn.execute(query, (self.dag_id, self.task_id, self.after_run)).fetchall()
        except sqlite3.OperationalError:  # locked by the writer: look again
            return False
        return any(classpath == TRIGGER for (classpath,) in rows)

    def run(self) -> None:
        while not self.stop.is_set():
            if self.deferred_to_trigger():
                self.deferred_seen = time.time()
                time.sleep(self.delay)
                self.acted = time.time()
                self.action()
                return
            time.sleep(0.05)


@pytest.fixture
def ckpt_storage(s3_endpoint: S3Endpoint) -> Iterator[CheckpointStorage]:
    bucket = f"e2e-wait-{uuid.uuid4().hex[:10]}"
    s3_endpoint.create_bucket(bucket)
    storage = s3_endpoint.storage(f"s3://{bucket}/ckpt")
    yield storage
    storage.close()
    s3_endpoint.delete_bucket(bucket)


def test_deferred_sensor_resumes_when_the_marker_appears(
    airflow_env: AirflowEnv, s3_endpoint: S3Endpoint, ckpt_storage: CheckpointStorage,
    tmp_path: Path,
) -> None:
    job = f"sensed-{uuid.uuid4().hex[:6]}"
    write_snapshot(ckpt_storage, job, 1)  # exists before the sensor starts: not "new"
    observations = tmp_path / "observations.jsonl"
    watcher = DeferralWatcher(airflow_env.db, "checkpoint_sensor_e2e", "wait", delay=2.0,
                              action=lambda: write_snapshot(ckpt_storage, job, 2))
    watcher.start()
    try:
        result = airflow_env.dags_test(
            E2E / "dags" / "checkpoint_waits_e2e.py", "checkpoint_sensor_e2e",
            {"storage": ckpt_storage.uri, "job": job},
            extra_env=observed_env(s3_endpoint, observations), timeout_s=300)
    finally:
        watcher.stop.set()
        watcher.join(10)

    assert result.state == "success", result.explain()
    assert result.task_states == {"wait": "success", "downstream": "success"}
    summary_text = result.xcom["downstream"]
    assert summary_text == f"checkpoint 2 at {ckpt_storage.uri}/{job}/chk-2"
    assert result.xcom["wait"]["id"] == 2 and result.xcom["wait"]["batch_id"] == 4

    seen = read_observations(observations)
    returned = [o for o in seen if o["event"] == "task_returned" and o["task_id"] == "wait"]
    # first try: the task process returned with the task DEFERRED to our trigger
    assert returned[0]["state"] == "deferred", seen
    assert returned[0]["trigger"] == TRIGGER and returned[0]["next_method"] == "execute_complete"
    # ...then resumed once, after the trigger fired, and succeeded
    assert [o["state"] for o in returned] == ["deferred", "success"], seen
    [fired] = [o for o in seen if o["event"] == "trigger_fired" and o["task_id"] == "wait"]
    assert fired["payload"]["status"] == "matched"

    # the worker was free while waiting: the task returned before the marker existed,
    # the DB showed the deferral from outside, and the trigger fired only after the write
    assert watcher.deferred_seen is not None and watcher.acted is not None
    assert returned[0]["ts"] < watcher.acted
    assert fired["ts"] > watcher.acted
    detection = fired["payload"]["checked_ts"] - watcher.acted
    resumed = returned[1]["ts"] - watcher.acted
    print(f"\ncheckpoint sensor (deferred, poke_interval 0.25 s, S3 on 127.0.0.1): "
          f"detection latency {detection * 1000:.0f} ms, task resumed and finished "
          f"{resumed * 1000:.0f} ms after the marker was written")
    assert 0 <= detection < 5.0  # generous: a 0.25 s poll on a loaded 2-core machine
