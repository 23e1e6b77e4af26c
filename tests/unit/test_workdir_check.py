"""check_state_visible(): a checkpoint missing the executors' state files is refused."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from airflow_ckpt.errors import WorkdirNotSharedError
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.metadata import OperatorInfo
from airflow_ckpt.runtime.checkpoint.workdir_check import check_state_visible
from airflow_ckpt.runtime.storage import open_storage
from tests.unit.test_coordinator_races import JOB, start
from tests.unit.test_snapshot_capture import make_workdir

OPS = (OperatorInfo(0, 2),)


def test_every_partition_with_state_data_passes() -> None:
    check_state_visible("/w", ["metadata", "state/0/_metadata/metadata", "state/0/0/3.delta",
                               "state/0/1/left-keyToNumValues/3.changelog"], OPS)
    check_state_visible("/w", ["offsets/0"], ())  # stateless query


def test_only_driver_written_files_is_the_other_host_case() -> None:
    # what a completed checkpoint listed on a real two-host cluster
    with pytest.raises(WorkdirNotSharedError, match=r"state/0/0, state/0/1.*NFS") as err:
        check_state_visible("/w", ["state/0/_metadata/metadata",
                                   "state/0/0/_metadata/schema"], OPS)
    # the way out is HDFS; S3A's status is said, not implied (docs/architecture.md,
    # "S3A as Spark's working directory (measured)")
    assert "hdfs://" in str(err.value)
    assert "s3a:// working directory is not supported" in str(err.value)


def test_one_partition_on_another_host() -> None:
    with pytest.raises(WorkdirNotSharedError, match=r"for state/0/1:"):
        check_state_visible("/w", ["state/0/0/2.zip", "state/0/0/SSTs/1-a.sst"], OPS)


def test_the_coordinator_fails_fatally_uploads_nothing_and_triggers_no_more(
    tmp_path: Path,
) -> None:
    """Wiring: the sync phase refuses the checkpoint before any upload, records the error
    as fatal (the job loop raises it; ``CheckpointedJob`` treats it as final), and no
    periodic checkpoint is triggered after it."""
    workdir = make_workdir(tmp_path, batches=3, running=False)
    for delta in workdir.glob("state/0/1/*.delta"):  # partition 1 ran on another host
        delta.unlink()
    storage = open_storage((tmp_path / "s").as_uri())
    coordinator = start(storage, workdir)
    try:
        p = coordinator.trigger("manual")
        assert p.done.wait(10) and p.manifest is None
        assert isinstance(coordinator.fatal, WorkdirNotSharedError)
        assert "state/0/1" in str(coordinator.fatal) and "state/0/0" not in str(
            coordinator.fatal)
        coordinator.periodic.clock = lambda: time.monotonic() + 3600
        assert not coordinator._periodic_due()
    finally:
        coordinator.shutdown()
    assert CheckpointCatalog(storage, JOB).checkpoint_ids(completed_only=False) == []
    assert storage.list(f"{JOB}/shared/") == []
    assert not list(coordinator.staging_root.glob("*"))  # staging links discarded
