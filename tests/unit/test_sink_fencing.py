"""A deposed driver's sink writes that land late never change a committed decision
(issue 19, item 1): the two drivers hold real leases on one storage, and the deposed
driver's request is held "in the network" (a paused thread) until the successor has
taken over, aborted, re-staged and (for some cases) committed the same batch."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.errors import ConcurrentDriverError, StorageError
from airflow_ckpt.runtime.interleave import Pause
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.sinks import JsonLinesSink, ParquetSink, TwoPhaseCommitSink
from airflow_ckpt.runtime.sinks.offsets import BatchOffsets, ReplayPolicy
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.fenced import FencedStorage
from airflow_ckpt.testing.published import published_numbers
from tests.unit.test_lease import FakeClock

JOB = "job"


class HeldStorage(FencedStorage):
    """Holds the first write whose key contains ``hold`` after the gate passed: a
    request stuck in the network, landing when the test releases it."""

    def __init__(self, inner: CheckpointStorage, gate: Callable[[], None], hold: str) -> None:
        super().__init__(inner, gate)
        self.hold, self.held = hold, Pause()

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False,
                  if_match: str | None = None) -> str:
        self.gate()
        if self.hold in key:
            self.held()
        return self.inner.put_bytes(key, data, create_only=create_only, if_match=if_match)


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[CheckpointStorage]:
    store = open_storage((tmp_path / "store").as_uri())
    yield store
    store.close()


def lease(storage: CheckpointStorage, clock: FakeClock, owner: str) -> JobLease:
    return JobLease(storage, JOB, owner, ttl_s=30, heartbeat_s=5, max_write_s=10,
                    clock=clock, sleep=clock.sleep)


def rows(n: int, start: int) -> list[dict[str, Any]]:
    return [{"n": i} for i in range(start, start + n)]


def make_sink(kind: str, storage: CheckpointStorage, lease_: JobLease,
              hold: str | None = None) -> TwoPhaseCommitSink:
    if kind == "jsonl":
        base = HeldStorage(storage, lease_.gate, hold) if hold else FencedStorage(
            storage, lease_.gate)
        sink: TwoPhaseCommitSink = JsonLinesSink(base, "_out")
    else:
        sink = ParquetSink(storage.uri.rstrip("/") + "/table")
        if hold:
            sink.storage = HeldStorage(sink.storage, lease_.gate, hold)
    sink.fence(lease_.gate, confirm=lease_.confirm)
    return sink


@dataclass
class Late:
    """A deposed driver's call running in a thread, its held write not landed yet."""

    thread: threading.Thread
    held: Pause
    failures: list[BaseException]

    def land(self) -> None:
        """Let the held write land and the call end."""
        self.held.resume()
        self.thread.join(timeout=30)


def held_call(sink: TwoPhaseCommitSink, call: Callable[[], None]) -> Late:
    """Run ``call`` (through ``sink``, made with ``hold``) until its held write."""
    assert isinstance(sink, (JsonLinesSink, ParquetSink))
    assert isinstance(sink.storage, HeldStorage)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except (ConcurrentDriverError, StorageError) as exc:
            failures.append(exc)

    late = Late(threading.Thread(target=run), sink.storage.held, failures)
    late.thread.start()
    late.held.wait_reached()
    return late


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_deposed_drivers_late_pre_commit_record_never_replaces_the_successors(
    storage: CheckpointStorage, kind: str
) -> None:
    clock = FakeClock()
    old_lease = lease(storage, clock, "old")
    old_lease.acquire()
    old = make_sink(kind, storage, old_lease, hold="_txn/")
    late = held_call(old, lambda: old.pre_commit(7, rows(10, 0)))  # the record's PUT

    # The successor takes over (the old holder is silent), aborts batch 7's staging
    # (it has no record yet) and stages its own replay of batch 7: other rows.
    new_lease = lease(storage, clock, "new")
    new_lease.acquire()  # waits out ttl + max write on the fake clock
    new = make_sink(kind, storage, new_lease)
    new.recover(commit=[])
    new.pre_commit(7, rows(40, 0))

    late.land()  # the deposed driver's record lands now
    new.commit(7)

    assert published_numbers(new) == list(range(40))
    assert new.pending() == []
    # whatever the deposed driver's write met, it changed nothing it was not allowed to
    assert all(isinstance(f, (ConcurrentDriverError, StorageError)) for f in late.failures)


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_deposed_drivers_late_extra_publication_record_never_changes_a_decision(
    storage: CheckpointStorage, kind: str
) -> None:
    """AT_LEAST_ONCE: the deposed driver stages a replay of committed batch 7 that read
    other offsets (an extra publication) and its ``_txn/<7>.<tag>`` PUT is held; the
    successor publishes the same replay and finishes it; then the old PUT lands. The
    batch's decision and the extra one keep their bytes, the output holds the batch and
    the extra publication once each, and nothing stays pending."""
    offsets = {"end": 10}
    policy = ReplayPolicy(publish_other=True)

    def reader(batch_id: int) -> BatchOffsets:
        return BatchOffsets((json.dumps(offsets),))

    tag = BatchOffsets((json.dumps({"end": 40}),)).tag
    clock = FakeClock()
    old_lease = lease(storage, clock, "old")
    old_lease.acquire()
    old = make_sink(kind, storage, old_lease, hold=tag)
    old.track_offsets(reader, policy)
    old.pre_commit(7, rows(10, 0))
    old.commit(7)
    offsets["end"] = 40
    late = held_call(old, lambda: old.pre_commit(7, rows(40, 0)))  # the extra record

    new_lease = lease(storage, clock, "new")
    new_lease.acquire()
    new = make_sink(kind, storage, new_lease)
    new.track_offsets(reader, policy)
    new.recover(commit=[])
    new.pre_commit(7, rows(40, 0))
    new.commit(7)
    assert isinstance(new, (JsonLinesSink, ParquetSink))
    decisions = [new.storage.get_bytes(new.transactions.decision_key(7, r)) for r in ("", tag)]

    late.land()
    # It landed: a stale record of the finished extra one. The holder's pending
    # transactions are the ones it staged (it never commits a record it did not
    # write); a new life lists the records and finds it.
    assert new.tracked_pending() == []
    assert new.pending() == [7]  # what storage holds, as any reader lists it
    new.recover(commit=[])  # the next life rolls the decision forward and forgets it
    assert [new.storage.get_bytes(new.transactions.decision_key(7, r))
            for r in ("", tag)] == decisions
    assert published_numbers(new) == sorted([*range(10), *range(40)])
    assert new.pending() == []
    assert all(isinstance(f, (ConcurrentDriverError, StorageError)) for f in late.failures)


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_deposed_drivers_late_commit_decision_never_names_an_aborted_attempt(
    storage: CheckpointStorage, kind: str
) -> None:
    """Issue 25 item 4: the deposed driver confirmed its lease and sent the create-only
    PUT of batch 7's commit decision; held past the takeover, it landed after the
    successor had aborted the attempt (record aborted, staging deleted) on the absent
    key, and named deleted data: the successor's commit raised CorruptCheckpointError
    and every later run failed in recover. Now the attempt's outcome object was
    ``commit`` before the takeover, so the successor's abort rolls that commit forward
    instead, and the late decision carries the same bytes."""
    clock = FakeClock()
    old_lease = lease(storage, clock, "old")
    old_lease.acquire()
    old = make_sink(kind, storage, old_lease, hold="_committed/")
    old.pre_commit(7, rows(10, 0))
    late = held_call(old, lambda: old.commit(7))  # the decision's PUT

    new_lease = lease(storage, clock, "new")
    new_lease.acquire()
    new = make_sink(kind, storage, new_lease)
    new.recover(commit=[])  # batch 7 is not in the restored checkpoint: abort it
    new.pre_commit(7, rows(40, 0))
    late.land()
    new.commit(7)

    assert published_numbers(new) == list(range(10))  # the attempt whose commit won
    assert new.pending() == []
    new.recover(commit=[])  # and the next life finds nothing wrong


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_deposed_drivers_late_commit_outcome_loses_to_the_successors_abort(
    storage: CheckpointStorage, kind: str
) -> None:
    """The same race one write earlier: the deposed driver's ``commit`` outcome is
    held; the successor's ``abort`` lands first and wins, so the late one decides
    nothing and the successor's own attempt is published."""
    clock = FakeClock()
    old_lease = lease(storage, clock, "old")
    old_lease.acquire()
    old = make_sink(kind, storage, old_lease, hold="_outcome/")
    old.pre_commit(7, rows(10, 0))
    late = held_call(old, lambda: old.commit(7))

    new_lease = lease(storage, clock, "new")
    new_lease.acquire()
    new = make_sink(kind, storage, new_lease)
    new.recover(commit=[])
    new.pre_commit(7, rows(40, 0))
    late.land()
    new.commit(7)

    assert published_numbers(new) == list(range(40))
    assert new.pending() == []


def test_a_json_lines_attempt_key_comes_from_the_injected_ids(tmp_path: Path) -> None:
    """Each pre-commit stages under a fresh attempt id from the sink's id source (the
    simulation passes its seeded ids), never the module-level ``uuid``."""
    storage = open_storage(tmp_path.as_uri())
    attempt = uuid.UUID(int=0xABC)
    sink = JsonLinesSink(storage, "out", ids=lambda: attempt)
    sink.pre_commit(7, [{"n": 1}])
    staged = [info.key for info in storage.list("out/_pending/")]
    assert staged == [f"out/_pending/{7:012d}/{attempt.hex[:16]}.jsonl"]
