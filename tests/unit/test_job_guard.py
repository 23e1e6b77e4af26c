"""One run per job: the guard before spark-submit, and a killed task's event.

The other supervision is played by lease records and history events written the way
its driver and supervisor write them; the guard's looks run on a fake clock whose
``sleep`` is where the other side acts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_ckpt.errors import JobHeldError
from airflow_ckpt.guard import (
    RunningJobGuard,
    record_killed,
    recording_kill,
    validate_on_running_job,
)
from airflow_ckpt.runtime.history.events import JOB_STARTED, JOB_STOPPED, JOB_SUBMITTED
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.lease.record import LeaseRecord
from airflow_ckpt.runtime.storage.base import CheckpointStorage

JOB = "rate-counts"
ME = "streaming/manual__2/run"
OTHER = "streaming/scheduled__1/run"
log = logging.getLogger("test_job_guard")


class World:
    """The fake clock; ``sleep`` advances it and then runs the other side's next act."""

    def __init__(self, storage: CheckpointStorage) -> None:
        self.storage = storage
        self.now = 0.0
        self.acts: list[Callable[[], None]] = []
        self.sleeps = 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        if self.acts:
            self.acts.pop(0)()

    def lease(self, record: LeaseRecord) -> LeaseRecord:
        self.storage.put_bytes(f"{JOB}/lease/{record.epoch:010d}.json", record.to_json())
        return record

    def guard(self) -> RunningJobGuard:
        return RunningJobGuard(self.storage, JOB, ME, log, clock=self.clock,
                               sleep=self.sleep)


def holder(owner: str = OTHER, epoch: int = 3, seq: int = 1) -> LeaseRecord:
    return LeaseRecord(epoch=epoch, owner=owner, host="worker-2", pid=4242, acquired_ts=0.0,
                       heartbeat_ts=0.0, seq=seq)


def submitted(storage: CheckpointStorage, run_id: str = OTHER, attempt: int = 2) -> None:
    JobHistory(storage, JOB).append(JOB_SUBMITTED, run_id=run_id, attempt=attempt, airflow={
        "dag_id": "streaming", "run_id": run_id.split("/")[1], "task_id": "run",
        "try_number": 1})


@pytest.fixture
def world(file_storage: CheckpointStorage) -> World:
    return World(file_storage)


def test_a_free_job_passes_at_once(world: World) -> None:
    world.guard().ensure_free("fail")
    assert world.sleeps == 0
    record = world.lease(replace(holder(), released=True))
    submitted(world.storage)
    JobHistory(world.storage, JOB).append(JOB_STARTED, run_id=OTHER, attempt=2)
    world.guard().ensure_free("fail")  # released lease; the other run's driver started
    assert world.sleeps == 0 and record.released


def test_this_supervisions_own_lease_is_no_other_holder(world: World) -> None:
    """A retried task: the supervisor re-attaches to its own driver."""
    world.lease(holder(owner=ME))
    world.guard().ensure_free("fail")
    assert world.sleeps == 0


def test_a_live_holder_is_refused_by_name(world: World) -> None:
    submitted(world.storage)
    record = world.lease(holder())
    world.acts = [lambda: world.lease(replace(record, seq=2))]  # its heartbeat moves
    with pytest.raises(JobHeldError) as refused:
        world.guard().ensure_free("fail")
    message = str(refused.value)
    assert "DAG run 'scheduled__1' of DAG 'streaming' (task 'run', try 1)" in message
    assert "submission attempt 2" in message
    assert "its driver (pid 4242 on worker-2) holds lease epoch 3" in message
    assert "Nothing was submitted" in message and "on_running_job='wait'" in message
    assert world.sleeps == 1


def test_wait_returns_once_the_holder_lets_go(world: World) -> None:
    record = world.lease(holder())
    world.acts = [lambda: world.lease(replace(record, seq=2)),
                  lambda: world.lease(replace(record, seq=3)),
                  lambda: world.lease(replace(record, seq=4, released=True))]
    world.guard().ensure_free("wait")
    assert world.sleeps == 3 and world.acts == []


def test_a_silent_holder_is_not_refused_and_passes_after_one_expiry(world: World) -> None:
    """Never refuse on a guess: a holder whose heartbeat never moved may be dead on
    another host; after one full expiry (ttl_s + max_write_s) the job counts as free."""
    record = world.lease(holder())
    world.guard().ensure_free("fail")
    assert world.now >= record.ttl_s + record.max_write_s


def test_a_submission_without_a_lease_is_named_not_waited_for(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    """A driver still starting and a worker that died right after spark-submit leave
    the same trace (``job_submitted``, no lease): the guard warns and the lease decides."""
    submitted(world.storage)
    with caplog.at_level(logging.WARNING, logger=log.name):
        world.guard().ensure_free("fail")
    assert world.sleeps == 0
    assert "DAG run 'scheduled__1' of DAG 'streaming'" in caplog.text
    assert "has not started yet" in caplog.text


def test_on_running_job_values() -> None:
    assert [validate_on_running_job(v) for v in ("fail", "wait")] == ["fail", "wait"]
    with pytest.raises(ValueError, match="on_running_job must be one of"):
        validate_on_running_job("queue")


# ------------------------------------------------------------------ a killed task


def test_a_kill_is_recorded_as_the_runs_stop(file_storage: CheckpointStorage) -> None:
    history = JobHistory(file_storage, JOB)
    history.append(JOB_STARTED, run_id=ME, attempt=1)
    killed = threading.Event()
    with pytest.raises(RuntimeError), recording_kill(history, ME, killed, lambda: 1, log):
        killed.set()
        raise RuntimeError("killed while attempt 1 ran")
    event = history.last(JOB_STOPPED)
    assert event is not None and event.data["killed"] is True
    assert event.data["run_id"] == ME and event.data["attempt"] == 1
    # an error without a kill records nothing
    with pytest.raises(RuntimeError), recording_kill(history, ME, threading.Event(),
                                                     lambda: 1, log):
        raise RuntimeError("spark-submit not found")
    assert len(history.events([JOB_STOPPED])) == 1


def test_a_killed_loser_does_not_end_the_winners_job(file_storage: CheckpointStorage) -> None:
    file_storage.put_bytes(f"{JOB}/lease/0000000003.json", holder().to_json())
    history = JobHistory(file_storage, JOB)
    assert record_killed(history, ME, attempt=1, by="on_kill", log=log) is None
    assert history.events([JOB_STOPPED]) == []


# ------------------------------------------------------------------ the operator


def test_the_operator_refuses_before_submitting(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ckpt.operators import CheckpointedSparkSubmitOperator
    from airflow_ckpt.operators import checkpointed_spark_submit as module
    from airflow_ckpt.runtime.storage import open_storage

    storage = open_storage((tmp_path / "ckpt").as_uri())
    world = World(storage)
    record = world.lease(holder())
    world.acts = [lambda: world.lease(replace(record, seq=2))]

    def guard(*args: Any, **kwargs: Any) -> RunningJobGuard:
        return RunningJobGuard(*args, clock=world.clock, sleep=world.sleep, **kwargs)

    monkeypatch.setattr(module, "RunningJobGuard", guard)
    op = CheckpointedSparkSubmitOperator(
        task_id="run", application="job.py", job_name=JOB, checkpoint_storage=storage.uri,
        ship_runtime=False, storage_conn_id=None)
    ti = SimpleNamespace(dag_id="streaming", run_id="manual__2", task_id="run",
                         map_index=-1, try_number=1)
    with pytest.raises(JobHeldError, match="supervision 'streaming/scheduled__1/run'"):
        op.execute({"ti": ti})  # type: ignore[arg-type]
    assert JobHistory(storage, JOB).events([JOB_SUBMITTED]) == []
    with pytest.raises(ValueError, match="on_running_job"):
        CheckpointedSparkSubmitOperator(task_id="x", application="job.py", job_name=JOB,
                                        checkpoint_storage=storage.uri, on_running_job="no")
