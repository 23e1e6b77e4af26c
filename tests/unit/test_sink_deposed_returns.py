"""A deposed driver's sink call never returns as if its batch were published once a
successor aborted it (simulation seeds 248 and 334 of the sinks world, found by the
record race): its commit finding the successor's own decision of the batch id, and its
recovery finding the restored batch aborted between judging it and listing the
records."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_ckpt.errors import ConcurrentDriverError, SinkTransactionAbortedError
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.base import ObjectInfo
from airflow_ckpt.runtime.storage.fenced import FencedStorage
from airflow_ckpt.testing.published import published_numbers
from tests.unit.test_lease import FakeClock
from tests.unit.test_sink_fencing import lease, rows


class BeforeTxnListing(FencedStorage):
    """Runs ``hook`` once, right before the first listing of ``_txn/``."""

    def __init__(self, inner: CheckpointStorage, gate: Callable[[], None]) -> None:
        super().__init__(inner, gate)
        self.hook: Callable[[], None] | None = None

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        if prefix.endswith("_txn/") and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return super().list(prefix)


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[CheckpointStorage]:
    store = open_storage((tmp_path / "store").as_uri())
    yield store
    store.close()


def driver(storage: CheckpointStorage, clock: FakeClock, owner: str
           ) -> tuple[JobLease, JsonLinesSink, BeforeTxnListing]:
    held = lease(storage, clock, owner)
    held.acquire()
    fenced = BeforeTxnListing(storage, held.gate)
    sink = JsonLinesSink(fenced, "_out")
    sink.fence(held.gate, confirm=held.confirm)
    return held, sink, fenced


def test_a_deposed_drivers_commit_never_returns_on_its_successors_decision(
    storage: CheckpointStorage
) -> None:
    """The deposed driver staged batch 0 (rows 0..9) and its checkpoint completed; a
    successor started anew (restore=none) aborted it, staged batch 0 from other input
    (rows 100..104) and committed it. The deposed driver's commit of batch 0 then read
    no staged record and found the successor's decision: it returned as if its rows
    were published (seed 248). Its confirm now raises."""
    clock = FakeClock()
    _, old, _ = driver(storage, clock, "old")
    old.pre_commit(0, rows(10, 0))

    _, new, _ = driver(storage, clock, "new")
    new.recover(commit=[])
    new.pre_commit(0, rows(5, 100))
    new.commit(0)

    with pytest.raises(ConcurrentDriverError):
        old.commit(0)
    assert published_numbers(new) == list(range(100, 105))


def test_a_deposed_drivers_recovery_never_returns_with_its_restored_batch_aborted(
    storage: CheckpointStorage
) -> None:
    """The deposed driver restores a checkpoint listing batch 0 (staged, undecided); a
    successor that went back further aborts batch 0 right before the deposed driver
    lists the records: the batch was judged committable, then missing from the
    listing, so it was neither committed nor refused and the recovery returned with
    nothing published (seed 334). The records are now listed first."""
    clock = FakeClock()
    _, first, _ = driver(storage, clock, "first")
    first.pre_commit(0, rows(10, 0))

    _, old, fenced = driver(storage, clock, "old")  # restores the checkpoint of batch 0

    def successor() -> None:
        _, new, _ = driver(storage, clock, "new")
        new.recover(commit=[])  # went back past batch 0: aborts it

    fenced.hook = successor
    with pytest.raises((ConcurrentDriverError, SinkTransactionAbortedError)):
        old.recover([0])
    assert old.committed_batches() == []
