"""The savepoint history (savepoint.history.max.count / max.age) and periodic savepoints.

Retention disposes of the savepoints the job took itself only, oldest (by checkpoint id)
first; never one named to keep, one a run restored from, or the newest.
"""

from __future__ import annotations

import builtins
from collections import Counter
from pathlib import Path

import pytest

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.config import CheckpointConfig
from airflow_ckpt.runtime.checkpoint.coordinator import CheckpointCoordinator
from airflow_ckpt.runtime.checkpoint.savepoint_history import (
    IN_HISTORY,
    SavepointHistory,
    mark_restored,
)
from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
from airflow_ckpt.runtime.checkpoint.triggering import PeriodicSavepointTrigger
from airflow_ckpt.runtime.control.channel import ControlChannel
from airflow_ckpt.runtime.control.savepoints import dispose_savepoint
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.job.requests import SavepointRequests
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.base import ObjectInfo
from airflow_ckpt.runtime.storage.delegating import DelegatingStorage
from tests.fixtures.snapshots import write_snapshot
from tests.unit.test_lease import FakeClock
from tests.unit.test_snapshot_capture import make_workdir

JOB = "orders"
DAY = 86400.0
NOW = 1_000_000.0


class CountingStorage(DelegatingStorage):
    """The storage, with GETs and LISTs counted."""

    def __init__(self, inner: CheckpointStorage) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()

    def get_bytes(self, key: str) -> bytes:
        self.calls["GET"] += 1
        return super().get_bytes(key)

    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        self.calls["LIST"] += 1
        return super().list(prefix)


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    return open_storage((tmp_path / "s").as_uri())


def history_savepoint(storage: CheckpointStorage, n: int, *, age_s: float = 60.0,
                      in_history: bool = True, name: str | None = None) -> str:
    savepoint_id = name or f"periodic-{n}"
    write_snapshot(storage, JOB, n, savepoint_id=savepoint_id, completed_ts=NOW - age_s,
                   extra={IN_HISTORY: True} if in_history else None)
    return savepoint_id


def kept(storage: CheckpointStorage) -> list[str]:
    return CheckpointCatalog(storage, JOB).savepoint_ids()


def history(storage: CheckpointStorage, *, count: int = 3,
            age_s: float = DAY) -> SavepointHistory:
    return SavepointHistory(storage, JOB, max_count=count, max_age_s=age_s, clock=lambda: NOW)


# ------------------------------------------------------------------ options


def test_the_options_have_the_flink_operators_names_and_defaults() -> None:
    default = CheckpointConfig()
    assert (default.savepoint_history_max_count, default.savepoint_history_max_age_s,
            default.periodic_savepoint_interval_s) == (10, DAY, 0.0)
    config = CheckpointConfig.from_dict({"savepoint.history.max.count": "3",
                                         "savepoint.history.max.age": "7 d",
                                         "periodic-savepoint.interval": "1 h"})
    assert (config.savepoint_history_max_count, config.savepoint_history_max_age_s,
            config.periodic_savepoint_interval_s) == (3, 7 * DAY, 3600.0)
    assert CheckpointConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError) as bad:
        CheckpointConfig.from_dict({"savepoint.history.max.count": 0,
                                    "periodic-savepoint.interval": "often"})
    assert set(bad.value.problems) == {"savepoint.history.max.count",
                                       "periodic-savepoint.interval"}


# ------------------------------------------------------------------ retention


def test_max_count_disposes_of_the_oldest_by_checkpoint_id(storage: CheckpointStorage) -> None:
    # ids, not completion times, say which is older (times from other hosts' clocks)
    for n, age in ((5, 10.0), (6, 500.0), (7, 20.0), (8, 30.0), (9, 40.0)):
        history_savepoint(storage, n, age_s=age)
    assert history(storage).collect() == ["periodic-5", "periodic-6"]
    assert kept(storage) == ["periodic-7", "periodic-8", "periodic-9"]
    assert not storage.list("orders/savepoints/sp-periodic-5/"), "files left behind"


def test_named_imported_and_restored_savepoints_are_never_disposed(
    storage: CheckpointStorage,
) -> None:
    history_savepoint(storage, 1, name="before-upgrade", in_history=False, age_s=30 * DAY)
    restored = history_savepoint(storage, 2, age_s=30 * DAY)
    mark_restored(storage, CheckpointCatalog(storage, JOB).savepoint(restored))
    mark_restored(storage, CheckpointCatalog(storage, JOB).savepoint(restored))  # twice: fine
    for n in range(3, 9):
        history_savepoint(storage, n)
    disposed = history(storage, count=1).collect()
    assert disposed == [f"periodic-{n}" for n in range(3, 8)]
    assert kept(storage) == ["before-upgrade", "periodic-2", "periodic-8"]


def test_max_age_disposes_of_old_ones_but_never_the_newest(storage: CheckpointStorage) -> None:
    for n in (1, 2, 3):
        history_savepoint(storage, n, age_s=2 * DAY)
    history_savepoint(storage, 4, age_s=60)
    assert history(storage, count=10).collect() == ["periodic-1", "periodic-2", "periodic-3"]
    assert history(storage, count=10, age_s=60).collect() == []  # the newest stays
    assert kept(storage) == ["periodic-4"]
    history_savepoint(storage, 5, age_s=2 * DAY)  # a skewed clock: id 5 is still newest
    assert history(storage, count=10, age_s=0).collect() == []  # 0: no age limit
    assert history(storage, count=10, age_s=30).collect() == ["periodic-4"]
    assert kept(storage) == ["periodic-5"]


def test_an_incomplete_savepoint_is_left_alone(storage: CheckpointStorage) -> None:
    write_snapshot(storage, JOB, 1, savepoint_id="periodic-1", completed=False,
                   extra={IN_HISTORY: True})
    for n in (2, 3):
        history_savepoint(storage, n)
    assert history(storage, count=1).collect() == ["periodic-2"]
    assert storage.list("orders/savepoints/sp-periodic-1/")


def test_each_manifest_is_read_once_per_driver(storage: CheckpointStorage) -> None:
    counting = CountingStorage(storage)
    retention = history(counting, count=2)
    for n in range(1, 5):
        history_savepoint(storage, n)
    retention.collect()
    assert counting.calls == Counter(LIST=1, GET=4)
    history_savepoint(storage, 5)
    counting.calls.clear()
    assert retention.collect() == ["periodic-3"]
    assert counting.calls == Counter(LIST=1, GET=1), "only the new savepoint is read"


def test_dispose_still_deletes_any_savepoint(storage: CheckpointStorage) -> None:
    restored = history_savepoint(storage, 1, name="keep-me", in_history=False)
    mark_restored(storage, CheckpointCatalog(storage, JOB).savepoint(restored))
    disposed = dispose_savepoint(storage, "keep-me", job=JOB)
    assert disposed.num_objects == 3  # a file, _metadata, _restored
    assert kept(storage) == [] and not storage.list("orders/savepoints/")


# ------------------------------------------------------------------ the job's side


def start(storage: CheckpointStorage, workdir: Path, clock: FakeClock,
          options: dict[str, object]) -> CheckpointCoordinator:
    config = CheckpointConfig.from_dict({"execution.checkpointing.interval": "1 h", **options})
    store = CompletedCheckpointStore(storage, JOB, config.num_retained)
    retention = SavepointHistory(storage, JOB, max_count=config.savepoint_history_max_count,
                                 max_age_s=config.savepoint_history_max_age_s)
    coordinator = CheckpointCoordinator(
        storage=storage, job=JOB, workdir=workdir, config=config, store=store,
        history=JobHistory(storage, JOB), next_checkpoint_id=store.recover(),
        spark_version="4.2.0", threaded=False, trigger_clock=clock,
        listeners=[retention.on_completed],
    )
    coordinator.start()
    return coordinator


def test_periodic_savepoints_on_the_drivers_clock_kept_to_the_count(
    storage: CheckpointStorage, tmp_path: Path,
) -> None:
    clock = FakeClock()
    coordinator = start(storage, make_workdir(tmp_path, batches=4, running=False), clock,
                        {"periodic-savepoint.interval": "10 min",
                         "savepoint.history.max.count": 2})
    try:
        coordinator.tick()
        clock.sleep(599)
        coordinator.tick()
        assert coordinator.pending_count == 0 and kept(storage) == []
        for _ in range(4):
            clock.sleep(600)
            coordinator.tick()  # triggers one
            coordinator.tick()  # takes it
        assert kept(storage) == ["periodic-3", "periodic-4"]
        manifest = CheckpointCatalog(storage, JOB).savepoint("periodic-4")
        assert manifest.trigger == "periodic" and manifest.extra[IN_HISTORY] is True
    finally:
        coordinator.shutdown()


def test_off_by_default() -> None:
    clock = FakeClock()
    trigger = PeriodicSavepointTrigger(CheckpointConfig().periodic_savepoint_interval_s, clock)
    clock.sleep(10 * DAY)
    assert not trigger.fire()


def test_a_request_without_a_name_joins_the_history_a_named_one_is_kept(
    storage: CheckpointStorage, tmp_path: Path,
) -> None:
    coordinator = start(storage, make_workdir(tmp_path, batches=4, running=False), FakeClock(),
                        {"savepoint.history.max.count": 1})
    channel = ControlChannel(storage, JOB)
    requests = SavepointRequests(channel)
    try:
        named = channel.request_savepoint(savepoint_id="before-upgrade")
        unnamed = [channel.request_savepoint() for _ in range(3)]
        in_flight: dict = {}
        requests.poll(coordinator, in_flight, now=0.0)
        for pending in list(in_flight.values()):
            coordinator.wait(pending)
        requests.answer_finished(in_flight)
        for request in (named, *unnamed):
            answer = channel.result(request.request_id)
            assert answer is not None and answer.status == "completed"
    finally:
        coordinator.shutdown()
    # the newest is the one acted on last: requests are acted on in id order, and ids
    # made within one millisecond order by their random part, not by creation
    newest = max(r.request_id for r in unnamed)
    assert sorted(kept(storage)) == sorted(["before-upgrade", newest])
    assert IN_HISTORY not in CheckpointCatalog(storage, JOB).savepoint("before-upgrade").extra
