"""What one checkpoint of small state costs in S3 requests, counted at the S3 client
(moto endpoint, real HTTP): issue 26's goal is at most 15 in all.

The real coordinator, completed-checkpoint store, lease (confirmations) and history
run on one S3 storage whose every request is counted
(:class:`~airflow_ckpt.testing.request_count.RequestCounter`). A checkpoint is counted
from its trigger until it completed (upload, marker, lease confirmation, retention and
collection, the history event), after two warm-up checkpoints (the lease's id block and
the first subsumption are once per run, not per checkpoint). The same run with
``state.storage.fs.memory-threshold: 0`` (every file an object, as before inline files)
shows what inlining saves.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.checkpoint.coordinator import CheckpointCoordinator
from airflow_ckpt.runtime.checkpoint.lease_view import LeaseView
from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.testing import S3Endpoint
from airflow_ckpt.testing.request_count import RequestCounter
from tests.unit.test_snapshot_capture import make_workdir

pytestmark = pytest.mark.integration

JOB = "small"
#: issue 26: a checkpoint of small state costs at most this many requests in all
GOAL = 15


def _requests_per_checkpoint(endpoint: S3Endpoint, uri: str, options: dict[str, Any],
                             workdir: Path, threshold: int) -> Counter[tuple[str, str]]:
    storage = endpoint.storage(uri, **options)
    counter = RequestCounter()
    counter.attach(storage)
    lease = JobLease(storage, JOB, owner="driver", ttl_s=1e6, heartbeat_s=1e5,
                     max_write_s=10.0)
    record = lease.acquire()
    config = CheckpointConfig.from_dict({
        "execution.checkpointing.interval": "1 h",  # nothing periodic: the test triggers
        "state.storage.fs.memory-threshold": threshold,
    })
    store = CompletedCheckpointStore(storage, JOB, config.num_retained, epoch=record.epoch,
                                     confirm=lease.confirm)
    coordinator = CheckpointCoordinator(
        storage=storage, job=JOB, workdir=workdir, config=config, store=store,
        history=JobHistory(storage, JOB), next_checkpoint_id=store.recover(),
        spark_version="4.2.0", lease=LeaseView(record.epoch, lease.confirm, lease.reserve_ids),
        threaded=False)
    try:
        for _ in range(2):  # warm-up: the id block, the first subsumption
            coordinator.wait(coordinator.trigger("manual"))
        before = counter.callers()
        p = coordinator.trigger("manual")
        coordinator.wait(p)
        assert p.manifest is not None, p.failure
        counted = counter.callers()
        counted.subtract(before)
        return +counted
    finally:
        coordinator.shutdown()
        lease.release()
        storage.close()


def test_a_small_state_checkpoint_costs_at_most_15_requests(
        s3_endpoint: S3Endpoint, s3_uri: str, storage_options: dict[str, Any],
        tmp_path: Path) -> None:
    workdir = make_workdir(tmp_path, batches=4, running=False)
    after = _requests_per_checkpoint(s3_endpoint, s3_uri + "/after", storage_options,
                                     workdir, 20 << 10)
    before = _requests_per_checkpoint(s3_endpoint, s3_uri + "/before", storage_options,
                                      workdir, 0)
    print(f"requests per checkpoint: threshold 0: {sum(before.values())} {dict(before)}; "
          f"20 kb: {sum(after.values())} {dict(after)}")
    assert sum(after.values()) <= GOAL, dict(after)
    assert sum(after.values()) < sum(before.values())
    uploads = sum(n for (caller, kind), n in after.items()
                  if kind == "PUT" and caller.startswith("upload."))
    assert uploads == 0, "a small file was uploaded as an object of its own"
