"""History compaction: no event is lost or seen twice, whatever crashes or races.

The invariant (docs/architecture.md, "History compaction"): a raw event object is deleted
only after a segment holding it is durable, and readers deduplicate by event key.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.runtime.control.savepoints import last_lifecycle_event
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import CompactionPolicy, CompactionResult, JobHistory
from airflow_ckpt.runtime.history.reader import EventCache
from airflow_ckpt.runtime.history.restart_log import RestartLog
from airflow_ckpt.runtime.storage import open_storage
from airflow_ckpt.runtime.storage.base import CheckpointStorage

SMALL = CompactionPolicy(every=0, segment_events=10, retain_checkpoint_events=None)
FIXED = {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 5,
         "restart-strategy.fixed-delay.delay": "1 s"}


class Counting:
    """Wraps a storage; counts GETs and can fail deletes (a crash before cleanup)."""

    def __init__(self, inner: CheckpointStorage) -> None:
        self.inner = inner
        self.gets = 0
        self.fail_deletes = False
        self.on_get: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get_bytes(self, key: str) -> bytes:
        self.gets += 1
        if self.on_get is not None:
            hook, self.on_get = self.on_get, None
            hook()
        return self.inner.get_bytes(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        if self.fail_deletes:
            raise RuntimeError("crash before the originals were deleted")
        self.inner.delete_many(keys)


@pytest.fixture
def storage(tmp_path: Path) -> Counting:
    return Counting(open_storage((tmp_path / "s").as_uri()))


def _fill(history: JobHistory, n: int) -> None:
    history.append(ev.JOB_SUBMITTED, run_id="r", attempt=1, airflow={"dag_id": "d"})
    history.append(ev.JOB_STARTED, run_id="r", attempt=1)
    for i in range(n):
        history.append(ev.CHECKPOINT_COMPLETED if i % 7 else ev.CHECKPOINT_FAILED, id=i)


def _raw_keys(storage: Any) -> list[str]:
    """What a reader of the old layout sees: ``history/*.json``."""
    return [i.key for i in storage.list("job/history/") if i.key.endswith(".json")]


def test_compaction_keeps_every_event_once_and_in_order(storage: Counting) -> None:
    history = JobHistory(storage, "job", compaction=None)  # type: ignore[arg-type]
    _fill(history, 45)
    before = history.events()
    result = history.compact(SMALL)
    assert result.compacted == 47 and not result.unreadable
    assert _raw_keys(storage) == []
    after = history.events()
    assert [(e.key, e.type, e.data) for e in after] == [(e.key, e.type, e.data) for e in before]
    listing = history.listing()
    assert {s.stream for s in listing.segments} == {"checkpoints", "events"}
    assert all(s.count <= 10 for s in listing.segments)
    # appended later: raw again; readers merge both, oldest first
    history.append(ev.RESTART, run_id="r", restart=True)
    assert [e.type for e in history.events()][-1] == ev.RESTART
    assert history.events([ev.JOB_STARTED])[0].key == before[1].key


def test_crash_between_segment_and_delete_shows_no_duplicates(storage: Counting) -> None:
    history = JobHistory(storage, "job", compaction=None)  # type: ignore[arg-type]
    _fill(history, 25)
    before = [e.key for e in history.events()]
    storage.fail_deletes = True
    with pytest.raises(RuntimeError):
        history.compact(SMALL)
    assert len(_raw_keys(storage)) == 27 and history.listing().segments  # both copies
    assert [e.key for e in history.events()] == before
    assert len(history.newest(1000)[0]) == 27
    storage.fail_deletes = False
    history.compact(SMALL)  # the next compaction finishes the job
    assert _raw_keys(storage) == []
    assert [e.key for e in history.events()] == before


def test_concurrent_compactions_and_writers_lose_nothing(storage: Counting) -> None:
    history = JobHistory(storage, "job", compaction=None)  # type: ignore[arg-type]
    _fill(history, 60)
    errors: list[BaseException] = []

    def compact() -> None:
        try:
            JobHistory(storage, "job", compaction=None).compact(SMALL)  # type: ignore[arg-type]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=compact) for _ in range(4)]
    for t in threads:
        t.start()
    for i in range(20):
        history.append(ev.FAILURE, run_id="r", level="query", cause=f"c{i}")
    for t in threads:
        t.join()
    assert not errors
    history.compact(SMALL)
    events = history.events()
    keys = [e.key for e in events]
    assert len(keys) == len(set(keys)) == 82
    assert keys == sorted(keys)
    assert [e.data["cause"] for e in events if e.type == ev.FAILURE] == [f"c{i}" for i in range(20)]


def test_retention_drops_old_checkpoint_statistics_only(storage: Counting) -> None:
    history = JobHistory(storage, "job", compaction=None)  # type: ignore[arg-type]
    _fill(history, 100)
    history.append(ev.JOB_FINISHED, run_id="r")
    policy = CompactionPolicy(segment_events=10, retain_checkpoint_events=30)
    result = history.compact(policy)
    assert result.events_dropped == 70
    stats = history.events([ev.CHECKPOINT_COMPLETED, ev.CHECKPOINT_FAILED])
    assert [e.data["id"] for e in stats] == list(range(70, 100))
    assert [e.type for e in history.events([ev.JOB_SUBMITTED, ev.JOB_STARTED,
                                            ev.JOB_FINISHED])] == \
        [ev.JOB_SUBMITTED, ev.JOB_STARTED, ev.JOB_FINISHED]


def test_open_segment_is_topped_up_not_multiplied(storage: Counting) -> None:
    history = JobHistory(storage, "job", compaction=None)  # type: ignore[arg-type]
    for round_ in range(6):
        for i in range(3):
            history.append(ev.CHECKPOINT_COMPLETED, id=round_ * 3 + i)
        history.compact(SMALL)
    segments = history.listing().segments
    # 18 events, not 6 segments of 3; and one (empty) events segment that seals them
    assert [s.count for s in segments if s.stream == "checkpoints"] == [10, 8]
    assert [s.count for s in segments if s.stream == "events"] == [0]
    assert [e.data["id"] for e in history.events()] == list(range(18))


def test_restart_log_state_survives_compaction(storage: Counting) -> None:
    history = JobHistory(storage, "job", compaction=None)  # type: ignore[arg-type]
    log = RestartLog(history, FIXED, "dag/run/task")
    history.append(ev.JOB_SUBMITTED, run_id="dag/run/task", attempt=1)
    log.record_failure("driver", "boom 1", now=1000.0)
    for i in range(30):
        history.append(ev.CHECKPOINT_COMPLETED, id=i)
    assert len(log.restarts()) == 1  # the cursor is now at the newest event
    log.record_failure("query", "boom 2", now=1010.0)
    history.compact(SMALL)  # both failures leave the raw tail before we refresh
    assert [e.data["cause"] for e in log.failures()] == ["boom 1", "boom 2"]
    assert log.strategy().state_dict() == log.restarts()[-1].data["strategy_state"]
    fresh = RestartLog(history, FIXED, "dag/run/task")  # e.g. a worker restarted
    assert [e.data["attempt"] for e in fresh.restarts()] == [1, 2]
    assert fresh.last_submit_attempt() == 1
    # the backward scan never opens the checkpoint statistics
    storage.gets = 0
    reader = JobHistory(storage, "job", compaction=None)  # type: ignore[arg-type]
    RestartLog(reader, FIXED, "dag/run/task").refresh()
    assert storage.gets == 1  # the one "events" segment


def test_lifecycle_check_after_compaction(storage: Counting) -> None:
    history = JobHistory(storage, "job", compaction=None)  # type: ignore[arg-type]
    _fill(history, 40)
    history.compact(SMALL)
    found = last_lifecycle_event(storage, "job")  # type: ignore[arg-type]
    assert found is not None and found.type == ev.JOB_STARTED


def test_reader_lists_again_when_compaction_moves_what_it_listed(storage: Counting) -> None:
    history = JobHistory(storage, "job", compaction=None)  # type: ignore[arg-type]
    _fill(history, 20)
    expected = [e.key for e in history.events()]
    storage.on_get = lambda: JobHistory(storage.inner, "job", compaction=None).compact(
        SMALL)
    assert [e.key for e in history.events()] == expected


def test_newest_reads_only_what_it_returns(storage: Counting) -> None:
    history = JobHistory(storage, "job", compaction=None)  # type: ignore[arg-type]
    _fill(history, 200)
    history.compact(SMALL)
    for i in range(5):
        history.append(ev.CHECKPOINT_COMPLETED, id=1000 + i)
    storage.gets = 0
    events, listing = JobHistory(storage, "job", compaction=None).newest(12)  # type: ignore[arg-type]
    assert [e.data.get("id") for e in events][-5:] == [1000, 1001, 1002, 1003, 1004]
    assert len(events) == 12 and listing.total == 207
    assert storage.gets == 5 + 1  # the raw tail and the newest checkpoint segment
    cache = EventCache()
    cached = JobHistory(storage, "job", compaction=None, cache=cache)  # type: ignore[arg-type]
    cached.newest(12)
    storage.gets = 0
    assert cached.newest(12)[0] == events
    assert storage.gets == 0  # immutable objects: a second page view only lists


def test_events_after_sees_events_compacted_since(storage: Counting) -> None:
    history = JobHistory(storage, "job", compaction=None)  # type: ignore[arg-type]
    _fill(history, 3)
    seen, cursor = history.events_after(None)
    assert len(seen) == 5
    for i in range(12):
        history.append(ev.CHECKPOINT_COMPLETED, id=100 + i)
    history.compact(SMALL)
    history.append(ev.JOB_FINISHED, run_id="r")
    new, cursor2 = history.events_after(cursor)
    assert [e.data.get("id") for e in new] == [*range(100, 112), None]
    assert history.events_after(cursor2)[0] == []


def test_a_writer_compacts_what_it_wrote_without_reading_it_back(storage: Counting) -> None:
    history = JobHistory(storage, "job",  # type: ignore[arg-type]
                         compaction=CompactionPolicy(every=0))
    for i in range(20):
        history.append(ev.CHECKPOINT_COMPLETED, id=i)
    history.compact()
    for i in range(20, 40):
        history.append(ev.CHECKPOINT_COMPLETED, id=i)
    storage.gets = 0
    assert history.compact().compacted == 20
    assert storage.gets == 0  # its own events and its own open segment: from memory
    reader = JobHistory(storage, "job", compaction=None)  # type: ignore[arg-type]
    assert [e.data["id"] for e in reader.events()] == list(range(40))


def test_append_compacts_in_the_background(storage: Counting) -> None:
    policy = CompactionPolicy(every=5, segment_events=100)
    history = JobHistory(storage, "job", compaction=policy)  # type: ignore[arg-type]
    for i in range(10):
        history.append(ev.CHECKPOINT_COMPLETED, id=i)
    deadline = time.time() + 10
    while not history.listing().segments and time.time() < deadline:
        time.sleep(0.05)
    assert history.listing().segments
    assert [e.data["id"] for e in history.events()] == list(range(10))


def test_append_compacts_inline_without_background(
        storage: Counting, monkeypatch: pytest.MonkeyPatch) -> None:
    """``background=False`` (a driver without threads): the append that triggers the
    compaction runs it on the appending thread and returns with the segment written, so
    the order of storage requests is one (the crash-point enumeration replays it)."""
    policy = CompactionPolicy(every=5, segment_events=100, background=False)
    history = JobHistory(storage, "job", compaction=policy)  # type: ignore[arg-type]
    compacting_threads: list[threading.Thread] = []
    real_compact = history.compact

    def compact(policy: CompactionPolicy | None = None) -> CompactionResult:
        compacting_threads.append(threading.current_thread())
        return real_compact(policy)

    monkeypatch.setattr(history, "compact", compact)
    for i in range(4):
        history.append(ev.CHECKPOINT_COMPLETED, id=i)
    assert compacting_threads == []
    history.append(ev.CHECKPOINT_COMPLETED, id=4)
    assert compacting_threads == [threading.current_thread()]
    assert history.listing().segments
    assert _raw_keys(storage) == []
    assert [e.data["id"] for e in history.events()] == list(range(5))


def test_a_landed_event_is_found_when_its_segment_is_merged_while_read(
        storage: Counting) -> None:
    """Issue 25 item 6: an appender asks whether a compaction took its event into a
    segment (its number was then its own); the segment vanished between the listing and
    the read (another compaction merged it with newer events), and the event was judged
    void: a restart decision made twice, one failure counted twice. Now the history is
    listed again, and the merged segment holds the event."""
    appender = JobHistory(storage, "job", compaction=None)  # type: ignore[arg-type]
    _fill(appender, 3)
    mine = appender.append(ev.FAILURE, run_id="r", attempt=1, message="boom")
    first, second = (JobHistory(storage.inner, "job", compaction=None) for _ in range(2))
    first.compact(SMALL)  # another process: the open segment holds the event now
    second.append(ev.RESTART, run_id="r", attempt=2)
    storage.on_get = lambda: second.compact(SMALL)  # merges (and deletes) the open one
    assert appender._in_segment(mine)
