"""E2E: CheckpointEventTrigger in a real Airflow triggerer, as an AssetWatcher.

A real ``airflow triggerer`` process (SQLite metadata DB of tests/fixtures/airflow_env.py)
runs the watcher of tests/e2e/dags/checkpoint_watcher_e2e.py against the session's S3
endpoint. Shown: one asset event per new snapshot with its summary as payload, none for
snapshots that existed before, and after a triggerer restart the watermark kept in
Airflow's asset state store makes it fire what completed while it was down - and
nothing twice. The triggerer's metrics go to a real StatsD listener: each fired snapshot
sets the job's checkpoint gauges through Airflow's ``Stats`` in the triggerer process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.testing import S3Endpoint
from tests.fixtures.airflow_env import VENV_BIN, AirflowEnv
from tests.fixtures.snapshots import write_snapshot

pytestmark = pytest.mark.e2e

E2E_DAGS = Path(__file__).resolve().parent / "dags"
DAG_ID = "checkpoint_watcher_e2e"
ASSET = "airflow-ckpt-e2e/watched-snapshots"
CLASSPATH = "airflow_ckpt.triggers.checkpoint.CheckpointEventTrigger"


def query(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    for _ in range(50):
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
                return conn.execute(sql, args).fetchall()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
            time.sleep(0.1)  # a writer holds the lock: look again
    raise AssertionError(f"database stayed locked: {sql}")


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str,
             log: Path | None = None) -> Any:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    tail = log.read_text()[-5000:] if log and log.exists() else ""
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{tail}")


def airflow(env: dict[str, str], *args: str) -> None:
    proc = subprocess.run([str(VENV_BIN / "airflow"), *args], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"airflow {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"


class Triggerer:
    """``airflow triggerer`` as a child process group."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([str(VENV_BIN / "airflow"), "triggerer"], env=self.env,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def watched(s3_endpoint: S3Endpoint) -> Iterator[tuple[CheckpointStorage, str]]:
    bucket = f"e2e-watch-{uuid.uuid4().hex[:10]}"
    s3_endpoint.create_bucket(bucket)
    storage = s3_endpoint.storage(f"s3://{bucket}/ckpt")
    yield storage, f"watched-{uuid.uuid4().hex[:6]}"
    storage.close()
    s3_endpoint.delete_bucket(bucket)


def test_asset_watcher_fires_once_per_new_snapshot_across_restarts(
    airflow_env: AirflowEnv, s3_endpoint: S3Endpoint,
    watched: tuple[CheckpointStorage, str], tmp_path: Path,
) -> None:
    storage, job = watched
    connection = json.dumps({
        "conn_type": "aws", "login": s3_endpoint.access_key_id,
        "password": s3_endpoint.secret_access_key,
        "extra": {"endpoint_url": s3_endpoint.url, "region_name": s3_endpoint.region_name},
    })
    statsd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    statsd.bind(("127.0.0.1", 0))
    statsd.settimeout(60)
    env = {**airflow_env.env,
           "AIRFLOW__CORE__DAGS_FOLDER": str(E2E_DAGS),
           "AIRFLOW_CONN_CKPT_S3": connection,
           "AIRFLOW_CKPT_E2E_WATCH_STORAGE": storage.uri,
           "AIRFLOW_CKPT_E2E_WATCH_JOB": job,
           "AIRFLOW__METRICS__STATSD_ON": "True",
           "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
           "AIRFLOW__METRICS__STATSD_PORT": str(statsd.getsockname()[1])}
    db = airflow_env.db
    write_snapshot(storage, job, 1)  # before the watcher: must never fire

    # the DAG must be active and unpaused for Airflow to create its watcher's trigger
    airflow(env, "dags", "reserialize")
    airflow(env, "dags", "unpause", DAG_ID)
    airflow(env, "dags", "reserialize")
    # Airflow created exactly one trigger row for the watcher, of our class
    [(trigger_id,)] = query(
        db, "SELECT t.id FROM trigger t JOIN asset_watcher aw ON aw.trigger_id = t.id "
            "JOIN asset a ON a.id = aw.asset_id WHERE a.name = ? AND t.classpath = ?",
        ASSET, CLASSPATH)

    def events() -> list[dict[str, Any]]:
        rows = query(db, "SELECT ae.extra FROM asset_event ae JOIN asset a "
                         "ON a.id = ae.asset_id WHERE a.name = ? ORDER BY ae.id", ASSET)
        return [json.loads(extra)["payload"] for (extra,) in rows]

    def watermark() -> Any:
        rows = query(db, "SELECT s.value FROM asset_state_store s JOIN asset a "
                         "ON a.id = s.asset_id WHERE a.name = ? AND s.key = ?",
                     ASSET, f"airflow_ckpt.watermark.{job}.any")
        return json.loads(rows[0][0]) if rows else None

    log = tmp_path / "triggerer.log"
    triggerer = Triggerer(env, log)
    try:
        triggerer.start()
        # running: the baseline (chk-1 is old) is in Airflow's asset state store
        assert wait_for(watermark, 120, "the watcher's baseline", log) == {
            "after_checkpoint_id": 1, "known_savepoints": []}
        assert events() == []

        snapshots = [write_snapshot(storage, job, 2),
                     write_snapshot(storage, job, 2, savepoint_id="pre-upgrade")]
        wait_for(lambda: len(events()) >= 2, 60, "two asset events", log)
        # the gauges of each fired snapshot, from the triggerer (its own metrics filtered)
        assert ckpt_datagrams(statsd, job, 20) == [
            line for m in snapshots for line in snapshot_gauges(job, m)]
        time.sleep(2)  # nothing else may fire
        first = events()
        assert [(e["kind"], e["id"], e["savepoint_id"]) for e in first] == [
            ("checkpoint", 2, None), ("savepoint", 2, "pre-upgrade")]
        assert first[0]["path"] == f"{storage.uri}/{job}/chk-2"
        assert first[1]["path"] == f"{storage.uri}/{job}/savepoints/sp-pre-upgrade"

        # the triggerer goes down; a checkpoint completes meanwhile; it comes back
        triggerer.stop()
        write_snapshot(storage, job, 3)
        triggerer.start()
        wait_for(lambda: len(events()) >= 3, 120, "the event for chk-3", log)
        write_snapshot(storage, job, 4)
        wait_for(lambda: len(events()) >= 4, 60, "the event for chk-4", log)
        time.sleep(2)
        assert [e["id"] for e in events()] == [2, 2, 3, 4]  # nothing twice, nothing lost
        assert watermark() == {"after_checkpoint_id": 4, "known_savepoints": ["pre-upgrade"]}
        # still the same trigger row: restarts did not re-register the watcher
        assert query(db, "SELECT trigger_id FROM asset_watcher WHERE name = ?",
                     "e2e-new-snapshots") == [(trigger_id,)]
    finally:
        triggerer.stop()
        statsd.close()
        airflow(env, "dags", "pause", DAG_ID)


def ckpt_datagrams(sock: socket.socket, job: str, n: int) -> list[str]:
    """The next ``n`` metrics of ``job`` the listener receives (others are skipped)."""
    out: list[str] = []
    while len(out) < n:
        lines = sock.recv(65536).decode().split("\n")
        out += [line for line in lines if line.startswith("airflow.airflow_ckpt.")
                and (f".{job}." in line or line.count(".") == 2)]
    return out


def snapshot_gauges(job: str, m: Manifest) -> list[str]:
    values = {"lastCheckpointDuration": m.timings.end_to_end_duration_ms,
              "lastCheckpointSize": m.checkpointed_size, "lastCheckpointFullSize": m.state_size,
              "lastCompletedCheckpointId": m.checkpoint_id,
              "lastCheckpointCompletedTimestamp": round(m.timings.completed_ts * 1000)}
    return [line for name, value in values.items()
            for line in (f"airflow.airflow_ckpt.{name}:{value}|g",
                         f"airflow.airflow_ckpt.{job}.{name}:{value}|g")]
