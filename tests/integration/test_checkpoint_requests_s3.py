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

from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.testing import S3Endpoint
from bench.requests import CHECKPOINT_GOAL, checkpoint_requests
from tests.unit.test_snapshot_capture import make_workdir

pytestmark = pytest.mark.integration


def test_a_small_state_checkpoint_costs_at_most_15_requests(
        s3_endpoint: S3Endpoint, s3_uri: str, storage_options: dict[str, Any],
        tmp_path: Path) -> None:
    workdir = make_workdir(tmp_path, batches=4, running=False)
    after = checkpoint_requests(s3_endpoint, s3_uri + "/after", workdir, 20 << 10,
                                storage_options)
    before = checkpoint_requests(s3_endpoint, s3_uri + "/before", workdir, 0, storage_options)
    print(f"requests per checkpoint: threshold 0: {sum(before.values())} {dict(before)}; "
          f"20 kb: {sum(after.values())} {dict(after)}")
    assert sum(after.values()) <= CHECKPOINT_GOAL, dict(after)
    assert sum(after.values()) < sum(before.values())
    uploads = sum(n for (caller, kind), n in after.items()
                  if kind == "PUT" and caller.startswith("upload."))
    assert uploads == 0, "a small file was uploaded as an object of its own"
