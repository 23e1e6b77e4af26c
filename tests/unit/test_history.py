"""History events list in the order one writer appended them, even within a millisecond."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from airflow_ckpt.errors import MetadataError
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.history.reader import HistoryReader
from airflow_ckpt.runtime.storage import open_storage


def test_order_is_append_order_for_one_writer(tmp_path: Path) -> None:
    history = JobHistory(open_storage((tmp_path / "s").as_uri()), "job")
    for i in range(300):  # far more than one per millisecond
        history.append(ev.CHECKPOINT_COMPLETED if i % 2 else ev.JOB_SUBMITTED, seq=i)
    assert [e.data["seq"] for e in history.events()] == list(range(300))
    assert history.last(ev.JOB_SUBMITTED).data["seq"] == 298  # type: ignore[union-attr]


def test_unknown_type_and_corrupt_event_are_errors(tmp_path: Path) -> None:
    storage = open_storage((tmp_path / "s").as_uri())
    history = JobHistory(storage, "job")
    with pytest.raises(ValueError, match="unknown history event type"):
        history.append("made_up")
    storage.put_bytes("job/history/0000000000000001.json", b"{broken")
    with pytest.raises(MetadataError, match=r"0000000000000001\.json"):
        history.events()


def test_timestamps_and_uids_come_from_the_injected_clock_and_ids(tmp_path: Path) -> None:
    """An event's display ``ts`` and its ``uid`` come from the clock and the id source the
    history was given (the simulation passes its own), never the module-level ones."""
    ids = iter([uuid.UUID(int=1), uuid.UUID(int=2)])
    history = JobHistory(open_storage(tmp_path.as_uri()), "j", compaction=None,
                         clock=lambda: 42.5, ids=lambda: next(ids))
    first = history.append(ev.JOB_STARTED)
    second = history.append(ev.JOB_FINISHED)
    read = HistoryReader(open_storage(tmp_path.as_uri()), "j").events()
    assert [(e.ts, e.data["uid"]) for e in read] == [
        (42.5, uuid.UUID(int=1).hex[:16]), (42.5, uuid.UUID(int=2).hex[:16])]
    assert [e.key for e in read] == [first.key, second.key]


def test_stored_ts_of_a_compacted_event_is_the_storages_time_not_its_writers(
        tmp_path: Path) -> None:
    """Found by the simulation (history world, seed 300254 of 300000..): a driver whose
    clock is 1 h ahead records a query failure; a compaction moves it into a segment
    before ``record_failure`` reads its storage time, and ``stored_ts`` fell back to the
    writer's own clock. Exponential-delay then compared that time with storage times
    and the supervisor waited an hour before the next restart. A compacted event's time
    is now the storage's time of an object written after it (a later event or the
    segment holding it): one clock for every writer."""
    import time

    from airflow_ckpt.runtime.history.journal import CompactionPolicy

    storage = open_storage(tmp_path.as_uri())
    ahead = JobHistory(storage, "j", compaction=None, clock=lambda: time.time() + 3600)
    failure = ahead.append(ev.FAILURE, level="query", run_id="r", cause="boom")
    JobHistory(storage, "j", compaction=None).compact(
        CompactionPolicy(every=0, segment_events=1, retain_checkpoint_events=None))
    assert not (tmp_path / failure.key).exists()  # compacted: no raw object any more
    assert abs(ahead.stored_ts(failure) - time.time()) < 60
