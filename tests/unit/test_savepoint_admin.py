"""Savepoint administration: liveness from history, request expiry, disposal."""

from __future__ import annotations

import time

import pytest

from airflow_ckpt.errors import MetadataError, RestoreError, SavepointError
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.control.channel import ControlChannel, ControlResult
from airflow_ckpt.runtime.control.savepoints import (
    dispose_savepoint,
    ensure_job_running,
    expire_request,
    last_lifecycle_event,
    resolve_savepoint,
    resolve_snapshot,
)
from airflow_ckpt.runtime.history.events import (
    CHECKPOINT_COMPLETED,
    JOB_FAILED,
    JOB_STARTED,
    JOB_STOPPED,
    JOB_SUBMITTED,
)
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from tests.fixtures.snapshots import write_snapshot

JOB = "orders"


# ------------------------------------------------------------------ liveness


def test_a_job_without_history_is_not_running(file_storage: CheckpointStorage) -> None:
    assert last_lifecycle_event(file_storage, JOB) is None
    with pytest.raises(SavepointError, match=r"job 'orders' is not running \(last event: none"):
        ensure_job_running(file_storage, JOB)


def test_newest_lifecycle_event_decides(file_storage: CheckpointStorage) -> None:
    history = JobHistory(file_storage, JOB)
    history.append(JOB_STARTED)
    history.append(JOB_STOPPED, savepoint="s")
    history.append(JOB_SUBMITTED)  # not a lifecycle event: the driver is not up yet
    with pytest.raises(SavepointError, match="last event: job_stopped at 20"):
        ensure_job_running(file_storage, JOB)
    time.sleep(0.002)
    history.append(JOB_STARTED)
    for n in range(5):
        history.append(CHECKPOINT_COMPLETED, id=n)
    assert ensure_job_running(file_storage, JOB).type == JOB_STARTED
    time.sleep(0.002)
    history.append(JOB_FAILED, cause="boom")
    with pytest.raises(SavepointError, match="job_failed"):
        ensure_job_running(file_storage, JOB)


def test_unreadable_history_event_is_named(file_storage: CheckpointStorage) -> None:
    file_storage.put_bytes("orders/history/9999999999999999.json", b"garbage")
    with pytest.raises(MetadataError, match=r"9999999999999999\.json"):
        last_lifecycle_event(file_storage, JOB)


# ------------------------------------------------------------------ request expiry


def test_expiry_answers_a_pending_request(file_storage: CheckpointStorage) -> None:
    channel = ControlChannel(file_storage, JOB)
    request = channel.request_savepoint(timeout_s=1)
    assert expire_request(file_storage, JOB, request.request_id, "expired: test") is None
    result = channel.result(request.request_id)
    assert result is not None and result.status == "failed"
    assert result.failure_message == "expired: test"
    assert channel.pending() == []  # the job will not see it any more


def test_the_jobs_answer_wins_the_race(file_storage: CheckpointStorage) -> None:
    channel = ControlChannel(file_storage, JOB)
    request = channel.request_savepoint(timeout_s=1)
    theirs = ControlResult(request.request_id, "completed", time.time(), savepoint_id="s1",
                           savepoint_path="file:///x/orders/savepoints/sp-s1")
    channel.answer(theirs)
    assert expire_request(file_storage, JOB, request.request_id, "expired") == theirs


# ------------------------------------------------------------------ resolving


def test_resolve_forms(file_storage: CheckpointStorage) -> None:
    uri = file_storage.uri
    for path, job in [(f"{uri}/orders/savepoints/sp-a", None), ("orders/savepoints/sp-a", None),
                      ("orders/sp-a", None), ("sp-a", JOB), ("savepoints/sp-a", JOB),
                      ("a", JOB)]:
        ref = resolve_savepoint(file_storage, path, job)
        assert (ref.job, ref.savepoint_id, ref.dir_key) == (JOB, "a", "orders/savepoints/sp-a/")
    assert resolve_snapshot(file_storage, "7", JOB).checkpoint_id == 7
    assert resolve_savepoint(file_storage, "7", JOB).savepoint_id == "7"  # a bare id


@pytest.mark.parametrize("path,job,message", [
    ("sp-a", None, "does not say which job"),
    ("savepoints/sp-a", None, "does not say which job"),
    ("s3://elsewhere/orders/savepoints/sp-a", None, "not in this storage"),
    ("orders/savepoints/sp-a", "payments", "belongs to job 'orders', not to 'payments'"),
    ("orders/chk-3", None, "is a checkpoint, not a savepoint"),
    ("chk-3", JOB, "is a checkpoint"),
])
def test_resolve_refusals(file_storage: CheckpointStorage, path: str, job: str | None,
                          message: str) -> None:
    with pytest.raises((SavepointError, RestoreError), match=message):
        resolve_savepoint(file_storage, path, job)


# ------------------------------------------------------------------ disposal


def test_dispose_deletes_only_that_savepoint(file_storage: CheckpointStorage) -> None:
    write_snapshot(file_storage, JOB, 3)
    write_snapshot(file_storage, JOB, 3, savepoint_id="keep")
    write_snapshot(file_storage, JOB, 4, savepoint_id="drop",
                   contents={"offsets/4": b"o", "state/0/0/5.delta": b"x" * 100})
    done = dispose_savepoint(file_storage, "orders/savepoints/sp-drop")
    assert (done.savepoint_id, done.num_objects) == ("drop", 3)
    assert done.uri == file_storage.uri + "/orders/savepoints/sp-drop"
    catalog = CheckpointCatalog(file_storage, JOB)
    assert catalog.savepoint_ids() == ["keep"]
    assert catalog.checkpoint_ids() == [3]
    assert file_storage.list("orders/savepoints/sp-drop/") == []


def test_dispose_refuses_checkpoints(file_storage: CheckpointStorage) -> None:
    write_snapshot(file_storage, JOB, 3)
    with pytest.raises(SavepointError, match="is a checkpoint, not a savepoint"):
        dispose_savepoint(file_storage, f"{file_storage.uri}/orders/chk-3")
    with pytest.raises(SavepointError, match="checkpoint"):
        dispose_savepoint(file_storage, "chk-3", job=JOB)
    assert CheckpointCatalog(file_storage, JOB).checkpoint_ids() == [3]


def test_dispose_refuses_a_checkpoint_manifest_in_savepoints(
        file_storage: CheckpointStorage) -> None:
    checkpoint = write_snapshot(file_storage, JOB, 3)
    file_storage.put_bytes("orders/savepoints/sp-odd/_metadata", checkpoint.to_json())
    with pytest.raises(SavepointError, match="describes a checkpoint"):
        dispose_savepoint(file_storage, "odd", job=JOB)
    assert file_storage.exists("orders/savepoints/sp-odd/_metadata")


def test_incomplete_savepoint_needs_force(file_storage: CheckpointStorage) -> None:
    write_snapshot(file_storage, JOB, 4, savepoint_id="half", completed=False)
    with pytest.raises(SavepointError, match="incomplete"):
        dispose_savepoint(file_storage, "half", job=JOB)
    assert file_storage.list("orders/savepoints/sp-half/")
    dispose_savepoint(file_storage, "half", job=JOB, force=True)
    assert file_storage.list("orders/savepoints/sp-half/") == []


def test_corrupt_metadata_needs_force(file_storage: CheckpointStorage) -> None:
    write_snapshot(file_storage, JOB, 4, savepoint_id="bad")
    file_storage.put_bytes("orders/savepoints/sp-bad/_metadata", b"{")
    with pytest.raises(MetadataError):
        dispose_savepoint(file_storage, "bad", job=JOB)
    dispose_savepoint(file_storage, "bad", job=JOB, force=True)
    assert file_storage.list("orders/savepoints/") == []


def test_missing_savepoint(file_storage: CheckpointStorage) -> None:
    with pytest.raises(SavepointError, match="there is no savepoint"):
        dispose_savepoint(file_storage, "nothing", job=JOB)
