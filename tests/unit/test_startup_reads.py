"""Start-up independent of the job's age (issue 26): taking the lease over (adoption),
``restore(latest)`` and the store's recovery make the same requests whatever the number
of savepoints, answered control requests and history events."""

from __future__ import annotations

import builtins
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.checkpoint.store import CompletedCheckpointStore
from airflow_ckpt.runtime.control.channel import ControlChannel, ControlResult
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.lease.record import LeaseRecord
from airflow_ckpt.runtime.restore.choose import restore
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.base import ObjectInfo
from airflow_ckpt.runtime.storage.delegating import DelegatingStorage
from tests.fixtures.snapshots import write_snapshot
from tests.unit.test_lease import FakeClock

JOB = "orders"


class CountingStorage(DelegatingStorage):
    """The storage, with every request counted by kind."""

    def __init__(self, inner: CheckpointStorage) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()
        self.got: Counter[str] = Counter()  # GETs by key

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        self.calls["PUT"] += 1
        return super().put_bytes(key, data, create_only=create_only, if_match=if_match)

    def get_bytes(self, key: str) -> bytes:
        self.calls["GET"] += 1
        self.got[key] += 1
        return super().get_bytes(key)

    def exists(self, key: str) -> bool:
        self.calls["HEAD"] += 1
        return super().exists(key)

    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        self.calls["LIST"] += 1
        return super().list(prefix)

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        self.calls["LIST"] += 1
        return super().list_dirs(prefix)

    def delete_many(self, keys: Iterable[str]) -> None:
        self.calls["DELETE"] += 1
        super().delete_many(keys)

    def download_file(self, key: str, path: Path) -> None:
        self.calls["GET"] += 1
        super().download_file(key, path)


def aged_job(storage: CheckpointStorage, savepoints: int, requests: int,
             events: int) -> CheckpointStorage:
    """A job root as months of running leave it: a released lease record, two retained
    checkpoints, and ``savepoints``, answered control requests and history events."""
    first = 10 * savepoints + 1000  # every savepoint's id below the record's range
    for n in range(savepoints):
        write_snapshot(storage, JOB, 10 * n + 1, savepoint_id=f"periodic-{10 * n + 1}")
    channel = ControlChannel(storage, JOB)
    for _ in range(requests):
        request = channel.request_savepoint()
        channel.answer(ControlResult(request.request_id, "failed", 0.0, failure_message="x"))
        storage.delete_many([channel.layout.doorbell(request.request_id)])  # the driver's
    history = JobHistory(storage, JOB, compaction=None)
    for n in range(events):
        history.append(ev.CHECKPOINT_COMPLETED, id=n)
    history.compact()  # as the running job's appends did
    for n in (first + 1, first + 2):
        write_snapshot(storage, JOB, n)
    record = LeaseRecord(7, "run-old", "host", 1, 0.0, 0.0, released=True,
                         adopted=(), first_id=first, id_limit=first + 100)
    storage.put_bytes(f"{JOB}/lease/{7:010d}.json", record.to_json())
    return storage


def start_up(storage: CheckpointStorage, workdir: Path) -> tuple[Counter[str], int, int]:
    """What a driver does before its first checkpoint: take the lease over (adopting),
    restore latest, recover the store. Returns the requests (as the storage API sees
    them), the restored id and the first id."""
    counting = CountingStorage(storage)
    clock = FakeClock()
    lease = JobLease(counting, JOB, "run-new", clock=clock, sleep=clock.sleep)
    catalog = CheckpointCatalog(counting, JOB)
    record = lease.acquire(adopt=catalog.adopt)
    lease.release()
    restored = restore(counting, JOB, "latest", workdir, JobHistory(counting, JOB))
    store = CompletedCheckpointStore(counting, JOB, num_retained=2, epoch=record.epoch)
    next_id = max(store.recover(), record.first_id or 1)
    assert restored.manifest is not None
    return counting.calls, restored.manifest.checkpoint_id, next_id


@pytest.mark.parametrize(("savepoints", "requests", "events"), [(200, 300, 300)])
def test_start_up_reads_as_much_for_a_year_old_job_as_for_a_fresh_one(
    tmp_path: Path, savepoints: int, requests: int, events: int,
) -> None:
    def opened(name: str) -> CheckpointStorage:
        return open_storage((tmp_path / name).as_uri())

    fresh = start_up(aged_job(opened("fresh"), 0, 0, 0), tmp_path / "w1")
    old = start_up(aged_job(opened("old"), savepoints, requests, events), tmp_path / "w2")
    assert fresh[0] == old[0], f"fresh {dict(fresh[0])} vs aged {dict(old[0])}"
    assert old[1] == 10 * savepoints + 1002  # the newest checkpoint
    assert old[2] == 10 * savepoints + 1100  # past the predecessor's reserved range


def test_without_a_reserving_record_every_savepoint_id_is_read_once(tmp_path: Path) -> None:
    """A job's first driver (or a record from before ``id_limit``) reads the savepoints'
    ids: ids never repeat, also across versions."""
    storage = open_storage((tmp_path / "s").as_uri())
    write_snapshot(storage, JOB, 41, savepoint_id="imported")
    catalog = CheckpointCatalog(storage, JOB)
    assert catalog.adopt(None) == ((), 42)
    legacy = LeaseRecord(3, "old", "h", 1, 0.0, 0.0, released=True, adopted=(), first_id=5)
    assert catalog.first_free_id(legacy) == 42


def test_the_newest_marker_is_read_once(tmp_path: Path) -> None:
    """The catalog reads the newest marker for its retention floor and hands it back:
    ``latest_checkpoint``, ``completed_checkpoints`` and ``restore(latest)`` never GET
    it a second time."""
    storage = open_storage((tmp_path / "s").as_uri())
    for n in (4, 5):
        write_snapshot(storage, JOB, n)
    newest = f"{JOB}/chk-5/_metadata"
    catalog = CheckpointCatalog(counting := CountingStorage(storage), JOB)
    latest = catalog.latest_checkpoint()
    assert latest is not None and latest.checkpoint_id == 5
    assert counting.got[newest] == 1
    assert [m.checkpoint_id for m in catalog.completed_checkpoints()] == [4, 5]
    assert counting.got[newest] == 2 and counting.got[f"{JOB}/chk-4/_metadata"] == 1
    counting = CountingStorage(storage)
    restored = restore(counting, JOB, "latest", tmp_path / "w", JobHistory(counting, JOB))
    assert restored.manifest is not None and restored.manifest.checkpoint_id == 5
    assert counting.got[newest] == 1, dict(counting.got)
