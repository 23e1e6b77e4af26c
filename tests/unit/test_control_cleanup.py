"""Answered control requests are deleted by the driver (issue 26): ``control/`` stays
bounded at any age; a request goes before its answer; nothing pending or unexpired goes."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from airflow_ckpt.errors import ControlAnswerLostError, ObjectAlreadyExistsError
from airflow_ckpt.runtime.control.channel import (
    ANSWER_RETENTION_S,
    FORGET_PER_LOOK,
    ControlChannel,
    ControlResult,
)
from airflow_ckpt.runtime.control.savepoints import expire_request
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.runtime.storage.delegating import DelegatingStorage

JOB = "orders"
#: the storage's now, one retention and a minute past every request stored in the test
LATER = ANSWER_RETENTION_S + 60.0


class RecordingDeletes(DelegatingStorage):
    def __init__(self, inner: CheckpointStorage) -> None:
        super().__init__(inner)
        self.deleted: list[list[str]] = []

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if keys:
            self.deleted.append(keys)
        super().delete_many(keys)


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    return open_storage((tmp_path / "s").as_uri())


def control_keys(storage: CheckpointStorage) -> list[str]:
    return [i.key for i in storage.list(f"{JOB}/control/")]


def answered(channel: ControlChannel, timeout_s: float = 1.0) -> str:
    request = channel.request_savepoint(timeout_s=timeout_s)
    channel.answer(ControlResult(request.request_id, "completed", time.time()))
    return request.request_id


def test_control_stays_bounded_after_thousands_of_requests(storage: CheckpointStorage) -> None:
    requester = ControlChannel(storage, JOB)
    driver = ControlChannel(storage, JOB)
    most = 0
    for hour in range(20):  # 2,000 requests, the driver looking once per 100
        for _ in range(100):
            answered(requester)
        most = max(most, len(control_keys(storage)))
        driver.look(float(hour), storage_now=time.time() + LATER)
    assert most == 200  # one look's worth of requests and answers, never more
    assert control_keys(storage) == []


def test_only_answered_requests_past_their_timeout_and_the_retention_go(
    storage: CheckpointStorage,
) -> None:
    requester = ControlChannel(storage, JOB)
    done = answered(requester)
    waiting = answered(requester, timeout_s=2 * LATER)  # its requester may still read it
    pending = requester.request_savepoint(timeout_s=1.0)  # never answered
    driver = ControlChannel(storage, JOB)
    kept = driver.look(0.0, storage_now=time.time() + 60.0)  # inside the retention
    assert [r.request_id for r in kept] == [pending.request_id]
    assert requester.result(done) is not None
    assert [r.request_id for r in driver.look(1.0, storage_now=time.time() + LATER)] == [
        pending.request_id]
    assert requester.result(done) is None
    assert requester.result(waiting) is not None
    assert f"{JOB}/control/{pending.request_id}.json" in control_keys(storage)


def test_a_request_goes_before_its_answer_and_orphan_answers_go(
    storage: CheckpointStorage,
) -> None:
    requester = ControlChannel(storage, JOB)
    first, second = answered(requester), answered(requester)
    storage.delete_many([f"{JOB}/control/{second}.json"])  # a crash between the deletes
    recording = RecordingDeletes(storage)
    ControlChannel(recording, JOB).look(0.0, storage_now=time.time() + LATER)
    assert recording.deleted == [[f"{JOB}/control/{first}.json"],
                                 [f"{JOB}/control/{first}.result.json",
                                  f"{JOB}/control/{second}.result.json"]]
    assert control_keys(storage) == []


def test_without_the_storages_now_nothing_is_deleted(storage: CheckpointStorage) -> None:
    answered(ControlChannel(storage, JOB))
    ControlChannel(storage, JOB).look(0.0)
    assert len(control_keys(storage)) == 2


def test_a_backlog_drains_a_bounded_number_per_look(storage: CheckpointStorage) -> None:
    requester = ControlChannel(storage, JOB)
    for _ in range(FORGET_PER_LOOK + 50):
        answered(requester)
    driver = ControlChannel(storage, JOB)
    driver.look(0.0, storage_now=time.time() + LATER)
    assert len(control_keys(storage)) == 2 * 50
    driver.look(1.0, storage_now=time.time() + LATER)
    assert control_keys(storage) == []


def test_a_request_the_driver_still_acts_on_keeps_its_expired_answer(
    storage: CheckpointStorage,
) -> None:
    """The job world, seed 100984: the requester gave up and answered "expired"; the
    driver, whose savepoint for the request was still in flight, deleted the request and
    that answer at its next look, then its own create-only "completed" answer landed as
    a second one. A request the driver acts on is kept until it answered."""
    requester = ControlChannel(storage, JOB)
    request = requester.request_savepoint(timeout_s=1.0)
    driver = ControlChannel(storage, JOB)
    assert [r.request_id for r in driver.look(0.0)] == [request.request_id]  # acted on
    requester.answer(ControlResult(request.request_id, "failed", time.time(),
                                   failure_message="expired"))  # the requester gave up
    driver.look(1.0, storage_now=time.time() + LATER, busy={request.request_id})
    with pytest.raises(ObjectAlreadyExistsError):  # its savepoint completed: answered once
        driver.answer(ControlResult(request.request_id, "completed", time.time()))
    answer = requester.result(request.request_id)
    assert answer is not None and answer.status == "failed"
    driver.look(2.0, storage_now=time.time() + LATER)  # answered: now it goes
    assert control_keys(storage) == []


def test_a_requester_that_gives_up_after_the_clean_up_never_takes_its_answer_for_the_only_one(
    storage: CheckpointStorage,
) -> None:
    """The job world (seed 390, found with a lease mutant): the job answered, and its
    clean-up (the retention measured on the storage's clock) deleted the request and
    the answer while the requester, whose reads failed, still waited; it then answered
    "expired" create-only, which succeeded: a second answer, taken for the only one.
    No clock can rule this out; the request's presence after our answer can: the job
    deletes only answered requests, the request first."""
    requester = ControlChannel(storage, JOB)
    request_id = answered(requester)
    ControlChannel(storage, JOB).look(0.0, storage_now=time.time() + LATER)
    assert control_keys(storage) == []
    with pytest.raises(ControlAnswerLostError, match="outcome is unknown"):
        expire_request(storage, JOB, request_id, "expired")
    with pytest.raises(ControlAnswerLostError):  # tried again: the same verdict
        expire_request(storage, JOB, request_id, "expired")
    ControlChannel(storage, JOB).look(1.0, storage_now=time.time() + LATER)  # the orphan goes
    assert control_keys(storage) == []


def test_a_requester_that_gives_up_first_cancels_the_request(storage: CheckpointStorage) -> None:
    requester = ControlChannel(storage, JOB)
    request = requester.request_savepoint(timeout_s=1.0)
    assert expire_request(storage, JOB, request.request_id, "expired") is None
    assert expire_request(storage, JOB, request.request_id, "expired") is None  # a retry
    with pytest.raises(ObjectAlreadyExistsError):
        ControlChannel(storage, JOB).answer(
            ControlResult(request.request_id, "completed", time.time()))
