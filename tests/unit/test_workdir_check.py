"""check_state_visible(): a checkpoint missing the executors' state files is refused."""

from __future__ import annotations

import pytest

from airflow_ckpt.runtime.metadata import OperatorInfo
from airflow_ckpt.runtime.workdir_check import WorkdirNotSharedError, check_state_visible

OPS = (OperatorInfo(0, 2),)


def test_every_partition_with_state_data_passes() -> None:
    check_state_visible("/w", ["metadata", "state/0/_metadata/metadata", "state/0/0/3.delta",
                               "state/0/1/left-keyToNumValues/3.changelog"], OPS)
    check_state_visible("/w", ["offsets/0"], ())  # stateless query


def test_only_driver_written_files_is_the_other_host_case() -> None:
    # what a completed checkpoint listed on a real two-host cluster
    with pytest.raises(WorkdirNotSharedError, match=r"state/0/0, state/0/1.*NFS"):
        check_state_visible("/w", ["state/0/_metadata/metadata",
                                   "state/0/0/_metadata/schema"], OPS)


def test_one_partition_on_another_host() -> None:
    with pytest.raises(WorkdirNotSharedError, match=r"for state/0/1:"):
        check_state_visible("/w", ["state/0/0/2.zip", "state/0/0/SSTs/1-a.sst"], OPS)
