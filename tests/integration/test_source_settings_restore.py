"""The rate example restored with another ``rowsPerSecond``: refused before its query
starts, the option and both values named; accepted with
``spark.airflow_ckpt.restore.allow-source-changes=true``.

Each run is the example's own driver (``rate_counts.py`` under ``python``, its own JVM),
on ``file://`` storage; a run is ended with SIGTERM once a checkpoint recording its rate
completed (how a driver is killed; its checkpoints stay).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from airflow_ckpt.examples.spark_jobs import rate_counts
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.metadata import Manifest, SourceSettings
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.reader import HistoryReader
from airflow_ckpt.runtime.storage import open_storage

pytestmark = pytest.mark.integration

#: how long one driver may take to start its JVM and complete a checkpoint (liveness)
DRIVER_BUDGET_S = 180.0


def _driver(job: str, storage: str, rate: int, tmp: Path, *confs: str) -> subprocess.Popen[str]:
    submit = ["--conf", "spark.airflow_ckpt.checkpoint_config="
              "{\"execution.checkpointing.interval\":\"1s\"}", *confs]
    env = {**os.environ, "TMPDIR": str(tmp),
           "PYSPARK_SUBMIT_ARGS": " ".join(f"'{a}'" for a in submit) + " pyspark-shell"}
    return subprocess.Popen(
        [sys.executable, rate_counts.__file__, "--job", job, "--storage", storage,
         "--rows-per-second", str(rate), "--trigger-interval", "1 second"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _checkpoint_with(catalog: CheckpointCatalog, rate: int, proc: subprocess.Popen[str]
                     ) -> Manifest:
    """Wait for a completed checkpoint recording ``rate``, then end the driver."""
    wanted = (SourceSettings("rate", {"rowsPerSecond": str(rate)}),)
    deadline = time.monotonic() + DRIVER_BUDGET_S
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            latest = catalog.latest_checkpoint()
            if latest is not None and latest.sources == wanted:
                return latest
            time.sleep(0.5)
        raise AssertionError(f"no checkpoint recorded {wanted}; driver output:\n"
                             f"{proc.communicate(timeout=5)[0] if proc.poll() else ''}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _last_batch(workdir: Path) -> int:
    return max(int(p.name) for p in (workdir / "offsets").iterdir() if p.name.isdigit())


def test_restore_with_another_rate_is_refused_before_the_query_starts(tmp_path: Path) -> None:
    job = f"rates-{uuid.uuid4().hex[:6]}"
    uri = (tmp_path / "ckpt").as_uri()
    storage = open_storage(uri)
    catalog = CheckpointCatalog(storage, job)
    workdir = tmp_path / "airflow_ckpt" / job / "work"

    first = _checkpoint_with(catalog, 20, _driver(job, uri, 20, tmp_path))

    refused = _driver(job, uri, 10, tmp_path)
    out, _ = refused.communicate(timeout=DRIVER_BUDGET_S)
    assert refused.returncode != 0, out
    assert "SourceSettingsChangedError" in out
    assert "source 0 (rate): rowsPerSecond was '20', now '10'" in out
    [failed] = HistoryReader(storage, job).events([ev.JOB_FAILED])
    assert failed.data["error"] == "SourceSettingsChangedError"
    assert "rowsPerSecond was '20', now '10'" in failed.data["cause"]
    assert "restore.allow-source-changes" in failed.data["cause"]
    # The query never started: the restored working directory plans no batch after the
    # checkpoint's (a started query writes offsets/<next> first), no checkpoint was added.
    latest = catalog.latest_checkpoint()
    assert latest is not None
    assert _last_batch(workdir) <= latest.batch_id
    assert catalog.checkpoint_ids() and latest.sources == first.sources

    accepted = _checkpoint_with(catalog, 10, _driver(
        job, uri, 10, tmp_path, "--conf", "spark.airflow_ckpt.restore.allow-source-changes=true"))
    assert accepted.checkpoint_id > latest.checkpoint_id
    assert accepted.batch_id > latest.batch_id  # it ran on from the restored batch
