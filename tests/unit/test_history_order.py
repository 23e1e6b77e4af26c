"""History order without clocks (issue 19 items 3-5 and 7).

History keys are sequence numbers taken create-only (airflow_ckpt.runtime.history.journal), so:
restart counting and terminal-event detection stay exact when the driver's host runs an
hour ahead of the Airflow worker's; readers see compacted events; a write that lands
after its number was compacted never counts; a restart decision is appended only on top
of the history it was computed from.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import CompactionPolicy, JobHistory
from airflow_ckpt.runtime.history.restart_log import RestartLog
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.supervision import RunCheckpoints, RunProgress, SupervisionProbe

RUN = "dag/run/task"
FIXED3 = {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 3,
          "restart-strategy.fixed-delay.delay": "1 s"}
SMALL = CompactionPolicy(every=0, segment_events=10, retain_checkpoint_events=None)
_real_time = time.time


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    return open_storage((tmp_path / "ckpt").as_uri())


@contextlib.contextmanager
def host_clock(monkeypatch: pytest.MonkeyPatch, offset_s: float) -> Iterator[None]:
    """Run the block as a host whose wall clock is ``offset_s`` off the others'."""
    monkeypatch.setattr(time, "time", lambda: _real_time() + offset_s)
    try:
        yield
    finally:
        monkeypatch.setattr(time, "time", _real_time)


@pytest.mark.parametrize("driver_offset_s", [3600.0, 0.5, -3600.0])
def test_restart_counting_is_exact_with_skewed_clocks(
    storage: CheckpointStorage, monkeypatch: pytest.MonkeyPatch, driver_offset_s: float
) -> None:
    """Item 3: fixed-delay with 3 attempts restarts 3 times, then gives up, when the
    driver's host is ahead (or behind) of the supervisor's; a fresh reader agrees."""
    supervisor = RestartLog(JobHistory(storage, "job", compaction=None), FIXED3, RUN)
    decisions = []
    for attempt in range(1, 5):
        supervisor.history.append(ev.JOB_SUBMITTED, run_id=RUN, attempt=attempt)
        with host_clock(monkeypatch, driver_offset_s):
            driver = JobHistory(storage, "job", compaction=None)
            driver.append(ev.JOB_STARTED, run_id=RUN, attempt=attempt)
            for i in range(3):
                driver.append(ev.CHECKPOINT_COMPLETED, id=attempt * 10 + i)
        decisions.append(supervisor.record_failure("driver", f"driver died {attempt}"))
    assert [(d.restart, d.attempt) for d in decisions] == \
        [(True, 1), (True, 2), (True, 3), (False, 4)]
    fresh = RestartLog(JobHistory(storage, "job", compaction=None), FIXED3, RUN)
    assert [e.data["attempt"] for e in fresh.restarts()] == [1, 2, 3, 4]
    assert fresh.last_submit_attempt() == 4


def test_supervisor_readers_see_compacted_events(storage: CheckpointStorage) -> None:
    """Item 4: the run's own submit and checkpoints, and the driver's terminal event,
    are found after the driver compacted them into segments."""
    history = JobHistory(storage, "job", compaction=None)
    submitted = history.append(ev.JOB_SUBMITTED, run_id=RUN, attempt=1)
    probe = SupervisionProbe(history, RUN, submitted_key=submitted.key, lease_epoch_before=0)
    history.append(ev.JOB_STARTED, run_id=RUN, attempt=1)
    for i in range(30):
        history.append(ev.CHECKPOINT_COMPLETED, id=i)
    history.append(ev.JOB_FINISHED, run_id=RUN)
    assert history.compact(SMALL).compacted == 33
    progress = RunCheckpoints(JobHistory(storage, "job", compaction=None), RUN).progress()
    assert progress.submitted and progress.own_checkpoint
    verdict = probe.poll()
    assert verdict is not None and verdict.kind == "finished" and verdict.outcome == "finished"


def test_run_checkpoints_are_not_taken_from_an_earlier_run(storage: CheckpointStorage) -> None:
    history = JobHistory(storage, "job", compaction=None)
    history.append(ev.JOB_SUBMITTED, run_id="earlier", attempt=1)
    history.append(ev.CHECKPOINT_COMPLETED, id=1)
    history.append(ev.JOB_SUBMITTED, run_id=RUN, attempt=1)
    history.compact(SMALL)
    watcher = RunCheckpoints(history, RUN)
    assert watcher.progress() == RunProgress(True, False)  # no checkpoint of its own
    history.append(ev.CHECKPOINT_COMPLETED, id=2)
    assert watcher.progress() == RunProgress(True, True)


def test_a_write_landing_after_its_number_was_compacted_never_counts(
    storage: CheckpointStorage,
) -> None:
    """A writer whose view is stale (or whose create lands long after it was sent)
    takes a number that was compacted and deleted meanwhile: its write is void, it
    takes it back and appends at a free number; the original event is untouched."""
    late = JobHistory(storage, "job", compaction=None)
    late.append(ev.JOB_STARTED, run_id=RUN, attempt=1)  # late now believes the head is 1
    other = JobHistory(storage, "job", compaction=None)
    for i in range(9):
        other.append(ev.CHECKPOINT_COMPLETED, id=i)
    original = other.events()
    other.compact(SMALL)
    event = late.append(ev.FAILURE, run_id=RUN, level="query", cause="late")
    assert event.seq == 11  # not 2: number 2 was taken, compacted and deleted
    events = JobHistory(storage, "job", compaction=None).events()
    assert [(e.key, e.data) for e in events[:-1]] == [(e.key, e.data) for e in original]
    assert events[-1].key == event.key and events[-1].data["cause"] == "late"
    assert not storage.exists(f"job/history/{2:016d}.json")


def test_a_void_key_is_never_read_and_is_cleaned_up(storage: CheckpointStorage) -> None:
    """A crashed late writer leaves its void key behind: readers ignore it."""
    history = JobHistory(storage, "job", compaction=None)
    for i in range(5):
        history.append(ev.CHECKPOINT_COMPLETED, id=i)
    history.append(ev.JOB_FINISHED, run_id=RUN)
    history.compact(SMALL)
    before = history.events()
    cursor = before[2].key
    storage.put_bytes(f"job/history/{3:016d}.json",
                      b'{"type": "restart", "ts": 0, "run_id": "x", "restart": true}')
    reader = JobHistory(storage, "job", compaction=None)
    assert reader.events() == before
    assert reader.events_after(cursor)[0] == before[3:]
    assert reader.compact(SMALL).void_deleted == 1
    assert reader.events() == before


class _Hook:
    """Wraps a storage and runs ``hook`` once, before the first history write whose
    body contains ``marker``."""

    def __init__(self, inner: CheckpointStorage, marker: bytes, hook: Any) -> None:
        self.inner, self.marker, self.hook = inner, marker, hook

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def put_bytes(self, key: str, data: bytes, **kwargs: Any) -> str:
        if self.hook is not None and self.marker in data:
            hook, self.hook = self.hook, None
            hook()
        return self.inner.put_bytes(key, data, **kwargs)


def test_a_restart_decision_is_appended_only_on_the_history_it_read(
    storage: CheckpointStorage,
) -> None:
    """Two deciders of one run (an orphaned driver and the supervisor): the one that
    decided on a history that moved decides again, so the attempts are 1 then 2."""
    other = RestartLog(JobHistory(storage, "job", compaction=None), FIXED3, RUN)
    wrapped = _Hook(storage, b'"type": "restart"',
                    lambda: other.record_failure("query", "the orphan's failure"))
    mine = RestartLog(JobHistory(wrapped, "job", compaction=None),  # type: ignore[arg-type]
                      FIXED3, RUN)
    mine.history.append(ev.JOB_SUBMITTED, run_id=RUN, attempt=1)
    decision = mine.record_failure("driver", "the driver died")
    assert decision.attempt == 2
    fresh = RestartLog(JobHistory(storage, "job", compaction=None), FIXED3, RUN)
    assert [(e.data["attempt"], e.data["cause"]) for e in fresh.restarts()] == \
        [(1, "the orphan's failure"), (2, "the driver died")]


def test_compactions_that_read_different_events_keep_every_event(
    storage: CheckpointStorage,
) -> None:
    """Item 5: a compaction that read an older listing and one that read a newer one
    never write the same segment name with different events; no event is lost."""
    history = JobHistory(storage, "job", compaction=None)
    history.append(ev.JOB_SUBMITTED, run_id=RUN, attempt=1)
    for i in range(4):
        history.append(ev.RESTART, run_id=RUN, attempt=i + 1, restart=True)

    def meanwhile() -> None:
        history.append(ev.RESTART, run_id=RUN, attempt=5, restart=True)
        JobHistory(storage, "job", compaction=None).compact(SMALL)

    slow = JobHistory(_Hook(storage, b'"type": "restart"', None),  # type: ignore[arg-type]
                      "job", compaction=None)
    listing = slow.listing()
    original_listing = slow.listing
    slow.listing = lambda start_after=None: listing  # type: ignore[method-assign]
    meanwhile()
    slow.compact(SMALL)  # works from the older listing
    slow.listing = original_listing  # type: ignore[method-assign]
    restarts = JobHistory(storage, "job", compaction=None).events([ev.RESTART])
    assert [e.data["attempt"] for e in restarts] == [1, 2, 3, 4, 5]


RATE2 = {"restart-strategy.type": "failure-rate",
         "restart-strategy.failure-rate.max-failures-per-interval": 2,
         "restart-strategy.failure-rate.failure-rate-interval": "10 min",
         "restart-strategy.failure-rate.delay": "0 s"}


@pytest.mark.parametrize(("driver_offset_s", "driver_turn"), [(-3600.0, 0), (3600.0, 2)])
def test_the_failure_rate_window_is_measured_on_one_clock(
    storage: CheckpointStorage, monkeypatch: pytest.MonkeyPatch, driver_offset_s: float,
    driver_turn: int,
) -> None:
    """Three failures within a minute, one of them recorded by a driver whose clock is an
    hour off (the oldest, from a clock behind; the newest, from a clock ahead: where the
    skew would stretch the window): 2 per 10 min allows two restarts and refuses the
    third, as Flink's strategy does on one clock (here: the storage's)."""
    supervisor = RestartLog(JobHistory(storage, "job", compaction=None), RATE2, RUN)
    supervisor.history.append(ev.JOB_SUBMITTED, run_id=RUN, attempt=1)
    decisions = []
    for turn in range(3):
        if turn == driver_turn:
            with host_clock(monkeypatch, driver_offset_s):
                driver = RestartLog(JobHistory(storage, "job", compaction=None), RATE2, RUN)
                decisions.append(driver.record_failure("query", "query failed"))
        else:
            decisions.append(supervisor.record_failure("driver", "driver died"))
    assert [d.restart for d in decisions] == [True, True, False]


class _CrashAfterSegments:
    """Wraps a storage; the process dies right after its ``n``-th segment write."""

    def __init__(self, inner: CheckpointStorage, n: int) -> None:
        self.inner, self.left = inner, n

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def put_bytes(self, key: str, data: bytes, **kwargs: Any) -> str:
        etag = self.inner.put_bytes(key, data, **kwargs)
        if "/segments/" in key:
            self.left -= 1
            if self.left == 0:
                raise SystemExit("crash after a segment write")
        return etag


@pytest.mark.parametrize("crash_after", [1, 2, 3])
def test_a_compaction_that_dies_between_its_segments_hides_nothing(
    storage: CheckpointStorage, crash_after: int
) -> None:
    """The segment that seals the newest number is written last, so a crash after any
    segment leaves every event readable (found by the simulation: sealing first made
    older raw events void and unread)."""
    history = JobHistory(storage, "job", compaction=None)
    for i in range(25):
        history.append(ev.RESTART, run_id=RUN, attempt=i + 1, restart=True)
    expected = history.events()
    crashing = JobHistory(_CrashAfterSegments(storage, crash_after),  # type: ignore[arg-type]
                          "job", compaction=None)
    with pytest.raises(SystemExit):
        crashing.compact(SMALL)
    assert JobHistory(storage, "job", compaction=None).events() == expected
