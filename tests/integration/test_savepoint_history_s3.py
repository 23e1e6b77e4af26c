"""The savepoint history against the real S3 endpoint: periodic savepoints taken by the
real coordinator, disposed of by the retention with S3's LIST and DeleteObjects; named
and restored-from savepoints stay."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.savepoint_history import mark_restored
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from tests.unit.test_lease import FakeClock
from tests.unit.test_savepoint_history import JOB, start
from tests.unit.test_snapshot_capture import make_workdir

pytestmark = pytest.mark.integration


def test_periodic_savepoints_are_kept_to_the_count_on_s3(
    s3_storage: CheckpointStorage, tmp_path: Path,
) -> None:
    clock = FakeClock()
    coordinator = start(s3_storage, make_workdir(tmp_path, batches=4, running=False), clock,
                        {"periodic-savepoint.interval": "1 h",
                         "savepoint.history.max.count": 2})
    catalog = CheckpointCatalog(s3_storage, JOB)
    taken: list[str] = []
    try:
        named = coordinator.trigger("manual", savepoint_id="before-upgrade")
        coordinator.wait(named)
        for n in range(5):
            clock.sleep(3600)
            coordinator.tick()  # triggers a periodic savepoint
            coordinator.tick()  # takes it, then the retention runs
            taken += [sp for sp in catalog.savepoint_ids()
                      if sp.startswith("periodic-") and sp not in taken]
            if n == 1:  # a run restored from the second one
                mark_restored(s3_storage, catalog.savepoint(taken[1]))
    finally:
        coordinator.shutdown()
    assert len(taken) == 5
    assert sorted(catalog.savepoint_ids()) == sorted(
        ["before-upgrade", taken[1], taken[3], taken[4]])
    for gone in (taken[0], taken[2]):
        assert not s3_storage.list(f"orders/savepoints/sp-{gone}/"), f"{gone} left files"
