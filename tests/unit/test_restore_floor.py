"""A run that did not resume the job's latest checkpoint (restore=none, or an explicit
checkpoint or savepoint) takes an initial checkpoint; its in-process restarts restore
``latest`` with that checkpoint as their floor, so a fallback never resumes an older
run's state (found by the simulation's sink world: a batch the new start had aborted
was resumed from the older run and never published)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.job import checkpointed_job as job_module
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import open_storage
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.testing import crashpoints as cp


def _life(storage: CheckpointStorage, workdir: Path, restore: str,
          fail_at: int | None = None) -> CheckpointedJob:
    failed: list[int] = []

    def on_batch(batch: int) -> None:
        if batch == fail_at and not failed:
            failed.append(batch)
            raise RuntimeError("the query fails once")

    spark = cp.SimulatedSpark(cp.Script(batches=4), on_batch)
    job = CheckpointedJob(
        spark,  # type: ignore[arg-type]
        job=cp.JOB, storage=storage, restart_strategy=cp.RESTART, checkpoint_config=cp.CONFIG,
        workdir=workdir, run_id=f"run-{restore}", threaded=False, restore=restore,
    )
    job.lease.heartbeat_s, job.lease.ttl_s = 3600.0, 7200.0
    job.clock = itertools.count(step=3600.0).__next__
    sink = JsonLinesSink(job.storage, cp.SINK_PREFIX)

    def build() -> Any:
        return spark.writer(job.exactly_once(sink))

    job.run(build)
    return job


def test_an_in_process_restart_of_a_new_start_restores_with_the_run_as_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    storage = open_storage((tmp_path / "store").as_uri())
    _life(storage, tmp_path / "w1", "latest")  # an older run with checkpoints
    calls: list[tuple[str, int | None]] = []
    real = job_module.restore

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append((args[2], kwargs.get("floor")))
        return real(*args, **kwargs)

    monkeypatch.setattr(job_module, "restore", spy)
    job = _life(storage, tmp_path / "w2", "none", fail_at=1)
    assert job._run_floor is not None
    assert calls[0] == ("none", None)
    assert calls[1] == ("latest", job._run_floor), calls
