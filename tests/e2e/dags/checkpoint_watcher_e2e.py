"""E2E DAG for the AssetWatcher trigger (tests/e2e/test_checkpoint_watcher.py).

The watched job and storage come from the environment because an asset watcher's
trigger is built when the DAG is parsed. Unset (other e2e tests parse this folder
too), they point nowhere and nothing is read at parse time.
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_ckpt.triggers.checkpoint import CheckpointEventTrigger

STORAGE = os.environ.get("AIRFLOW_CKPT_E2E_WATCH_STORAGE", "file:///tmp/airflow-ckpt-e2e-unset")
JOB = os.environ.get("AIRFLOW_CKPT_E2E_WATCH_JOB", "unset")

SNAPSHOTS = Asset(
    name="airflow-ckpt-e2e/watched-snapshots",
    uri="airflow-ckpt-e2e://watched-snapshots",
    watchers=[AssetWatcher(
        name="e2e-new-snapshots",
        trigger=CheckpointEventTrigger(storage_uri=STORAGE, job=JOB, kind="any",
                                       conn_id="ckpt_s3", poll_interval=0.5),
    )],
)

with DAG(dag_id="checkpoint_watcher_e2e", schedule=[SNAPSHOTS], catchup=False,
         tags=["airflow-ckpt", "e2e"]):

    @task
    def consume() -> None:
        """Never run by the test: only the asset events are checked."""

    consume()
