"""A checkpoint that commits several batches confirms the lease once (issue 26): every
batch's ``_txn/`` record is read, the lease confirmed (one LIST of ``lease/``), then each
batch's outcome and decision written, so the order read -> confirm -> write holds for
every batch (docs/architecture.md, "What a batch's transaction costs"). A batch costs 9
requests alone; N batches committed by one completion cost 7N + 2 (one confirm, and one
delete cleaning up all of them).

Real leases and a real ``file://`` storage; the storage below counts the requests (a
fake: every call one request); the lease's heartbeat is driven by hand."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.errors import ConcurrentDriverError
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.interleave import Pause
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.delegating import DelegatingStorage
from airflow_ckpt.runtime.storage.fenced import FencedStorage
from airflow_ckpt.testing.published import published_numbers
from tests.unit.test_lease import FakeClock
from tests.unit.test_sink_fencing import rows

JOB = "job"


class CountingStorage(DelegatingStorage):
    """Counts the requests sent through it by (kind, area): ``lease`` for the job's
    lease, the key's first directory under the sink (``_txn``, ``_outcome``, ...)
    otherwise."""

    def __init__(self, inner: CheckpointStorage) -> None:
        super().__init__(inner)
        self.calls: Counter[tuple[str, str]] = Counter()
        #: the keys of every delete request, in the order sent
        self.deletes: list[list[str]] = []

    def _count(self, kind: str, key: str) -> None:
        parts = key.split("/")
        area = "lease" if "lease" in parts else next(
            (p for p in parts if p.startswith("_") and p != "_out"), "part")
        self.calls[kind, area] += 1

    def total(self) -> int:
        return sum(self.calls.values())

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        self._count("put", key)
        return super().put_bytes(key, data, create_only=create_only, if_match=if_match)

    def get_bytes(self, key: str) -> bytes:
        self._count("get", key)
        return super().get_bytes(key)

    def get_versioned(self, key: str) -> Any:
        self._count("get", key)
        return super().get_versioned(key)

    def exists(self, key: str) -> bool:
        self._count("head", key)
        return super().exists(key)

    def list(self, prefix: str = "") -> Any:
        self._count("list", prefix)
        return super().list(prefix)

    def list_dirs(self, prefix: str = "") -> Any:
        self._count("list", prefix)
        return super().list_dirs(prefix)

    def copy(self, src_key: str, dst_key: str) -> None:
        self._count("copy", dst_key)
        super().copy(src_key, dst_key)

    def delete_many(self, keys: Any) -> None:
        keys = list(keys)
        self._count("delete", keys[0] if keys else "")
        self.deletes.append(keys)
        super().delete_many(keys)


class ManualLease(JobLease):
    """The real lease without its heartbeat thread (no request but the test's)."""

    def _start_heartbeat(self) -> None:
        return None


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[CountingStorage]:
    store = open_storage((tmp_path / "store").as_uri())
    yield CountingStorage(store)
    store.close()


def holder(storage: CheckpointStorage, owner: str) -> JobLease:
    """A driver's lease, acquired on a clock of its own (a suspended host's stops)."""
    clock = FakeClock()
    lease = ManualLease(storage, JOB, owner, ttl_s=30, heartbeat_s=5, max_write_s=10,
                        clock=clock, sleep=clock.sleep)
    lease.acquire()
    return lease


def driver(storage: CheckpointStorage, owner: str) -> tuple[JobLease, JsonLinesSink]:
    """A driver holding the lease, with a recovered sink (the listing of its records
    done before anything is counted)."""
    lease = holder(storage, owner)
    sink = JsonLinesSink(FencedStorage(storage, lease.gate), "_out")
    sink.fence(lease.gate, confirm=lease.confirm)
    sink.recover(commit=[])
    return lease, sink


def stage_and_complete(storage: CountingStorage, sink: JsonLinesSink,
                       batches: int) -> Counter[tuple[str, str]]:
    """Stage ``batches`` batches, then commit them as one checkpoint's completion does
    (its pending transactions, known without a request); the requests counted."""
    storage.calls.clear()
    storage.deletes.clear()
    for batch in range(batches):
        sink.pre_commit(batch, rows(3, 10 * batch))
    sink.commit_batches(sink.tracked_pending())
    return Counter(storage.calls)


def test_a_three_batch_completion_lists_the_lease_once(storage: CountingStorage) -> None:
    """Three batches committed by one completion: one LIST of ``lease/`` (three before
    the shared confirm), each batch's record read, outcome, decision and copy as before,
    one delete for the three clean-ups (three before): 3 x 7 + 2 = 23 requests, every
    batch published."""
    _, sink = driver(storage, "only")
    calls = stage_and_complete(storage, sink, 3)
    assert calls["list", "lease"] == 1
    assert calls["get", "_txn"] == 3 and calls["put", "_outcome"] == 3
    assert calls["put", "_committed"] == 3 and calls["copy", "part"] == 3
    assert sum(calls["delete", area] for area in ("_pending", "_txn", "_outcome")) == 1
    assert sum(calls.values()) == 7 * 3 + 2, calls
    assert published_numbers(sink) == [n for b in range(3) for n in range(10 * b, 10 * b + 3)]
    assert sink.pending() == []


def test_one_delete_cleans_up_every_batch_a_completion_commits_kind_by_kind(
        storage: CountingStorage) -> None:
    """The clean-up of a three-batch completion is one delete holding every batch's
    staged object, then every record, then every outcome, and nothing else: afterwards
    only the decisions and the published parts are left."""
    _, sink = driver(storage, "only")
    stage_and_complete(storage, sink, 3)
    assert len(storage.deletes) == 1
    areas = [key.split("/")[1] for key in storage.deletes[0]]
    assert areas == ["_pending"] * 3 + ["_txn"] * 3 + ["_outcome"] * 3
    left = sorted({info.key.split("/")[1] for info in storage.list("_out/")})
    assert left == ["_committed", "part-000000000000.jsonl", "part-000000000001.jsonl",
                    "part-000000000002.jsonl"]


def test_a_publication_that_raises_leaves_the_earlier_batches_to_the_next_commit(
        storage: CountingStorage) -> None:
    """The clean-up comes after every publication: when the second batch's copy fails,
    the first is published and not cleaned up (its decision stands); the next commit
    of the pending batches publishes each exactly once and leaves no record, outcome or
    staging."""
    _, sink = driver(storage, "only")
    for batch in range(3):
        sink.pre_commit(batch, rows(3, 10 * batch))
    failing = [sink.part_key(1)]
    real_copy = storage.copy

    def copy_failing_once(src_key: str, dst_key: str) -> None:
        if dst_key in failing:
            failing.remove(dst_key)
            raise OSError("copy lost")
        real_copy(src_key, dst_key)

    storage.copy = copy_failing_once  # type: ignore[method-assign]
    storage.deletes.clear()
    with pytest.raises(OSError, match="copy lost"):
        sink.commit_batches(sink.tracked_pending())
    assert storage.deletes == []  # nothing cleaned up: batch 0 is published, still pending
    assert published_numbers(sink) == [0, 1, 2]
    assert sink.tracked_pending() == [0, 1, 2]

    sink.commit_batches(sink.tracked_pending())
    assert len(storage.deletes) == 1
    assert published_numbers(sink) == [n for b in range(3) for n in range(10 * b, 10 * b + 3)]
    left = sorted({info.key.split("/")[1] for info in storage.list("_out/")})
    assert left == ["_committed", "part-000000000000.jsonl", "part-000000000001.jsonl",
                    "part-000000000002.jsonl"]
    assert sink.pending() == [] and sink.tracked_pending() == []


def test_a_single_batch_still_costs_nine_requests(storage: CountingStorage) -> None:
    """One batch: staging PUT, decision GET, record PUT; record GET, confirm LIST,
    outcome PUT, decision PUT, copy, one DELETE."""
    _, sink = driver(storage, "only")
    calls = stage_and_complete(storage, sink, 1)
    assert calls["list", "lease"] == 1
    assert sum(calls.values()) == 9, calls


def test_a_driver_deposed_between_the_record_reads_and_the_confirm_decides_nothing(
    storage: CountingStorage
) -> None:
    """The deposed driver read all three records, then its host stopped (its monotonic
    clock too: its gate still passes) before the shared confirm; a successor claimed
    the job meanwhile. The confirm raises: no outcome and no decision is written for
    any of the three batches, nothing is published."""
    old_lease, old = driver(storage, "old")
    for batch in range(3):
        old.pre_commit(batch, rows(3, 10 * batch))
    pause = Pause()
    failures: list[BaseException] = []

    def complete() -> None:
        try:
            old.commit_batches([0, 1, 2])
        except ConcurrentDriverError as exc:
            failures.append(exc)

    with interleave.installed(interleave.SINK_DECIDE_BEFORE_CONFIRM, pause):
        thread = threading.Thread(target=complete)
        thread.start()
        pause.wait_reached()
        assert storage.calls["get", "_txn"] >= 3  # every record read before the confirm
        new_lease = holder(storage, "new")  # waits out the silent holder on its clock
        assert new_lease.record is not None and old_lease.record is not None
        assert new_lease.record.epoch > old_lease.record.epoch
        old_lease.gate()  # the deposed driver's gate still passes: only the confirm stops it
        storage.calls.clear()
        pause.resume()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert len(failures) == 1
    assert storage.calls["put", "_outcome"] == storage.calls["put", "_committed"] == 0
    assert not storage.inner.list("_out/_outcome/")
    assert not storage.inner.list("_out/_committed/")
    assert published_numbers(old) == []
