"""TriggerSavepointOperator and CheckpointSensor outside a DAG run (fake task context).

The job is played by a thread writing what the runtime writes (history, savepoint,
control answer); end-to-end runs under Airflow are in tests/e2e/.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout, TaskDeferred

from airflow_ckpt.errors import SavepointError
from airflow_ckpt.operators.savepoint import TriggerSavepointOperator, as_bool
from airflow_ckpt.runtime.control.channel import ControlChannel, ControlRequest
from airflow_ckpt.runtime.history.events import JOB_STARTED, JOB_STOPPED
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.sensors.checkpoint import CheckpointSensor
from airflow_ckpt.triggers.checkpoint import CheckpointTrigger
from tests.fixtures.snapshots import answer_savepoint_requests, write_snapshot

JOB = "orders"


class FakeTI:
    dag_id, run_id, task_id = "dag", "run-1", "task"

    def __init__(self) -> None:
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value

    def xcom_pull(self, task_ids: str | None = None, key: str = "return_value") -> Any:
        return self.xcom.get(key)


@pytest.fixture
def ti() -> FakeTI:
    return FakeTI()


@pytest.fixture
def running(file_storage: CheckpointStorage) -> CheckpointStorage:
    JobHistory(file_storage, JOB).append(JOB_STARTED)
    return file_storage


class JobThread:
    """A thread answering savepoint requests like the runtime does."""

    def __init__(self, storage: CheckpointStorage, **kwargs: Any) -> None:
        self.stop = threading.Event()
        self.answered: list[ControlRequest] = []
        self.thread = threading.Thread(target=lambda: self.answered.extend(
            answer_savepoint_requests(storage, JOB, stop_event=self.stop, **kwargs)),
            daemon=True)

    def __enter__(self) -> JobThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def operator(storage: CheckpointStorage, **kwargs: Any) -> TriggerSavepointOperator:
    kwargs.setdefault("deferrable", False)
    return TriggerSavepointOperator(task_id="savepoint", job_name=JOB,
                                    checkpoint_storage=storage.uri, storage_conn_id=None,
                                    poll_interval=0.05, **kwargs)


# ------------------------------------------------------------------ savepoint operator


def test_not_running_job_fails_without_a_request(file_storage: CheckpointStorage,
                                                 ti: FakeTI) -> None:
    history = JobHistory(file_storage, JOB)
    history.append(JOB_STARTED)
    time.sleep(0.002)
    history.append(JOB_STOPPED)
    with pytest.raises(SavepointError, match=r"job 'orders' is not running \(last event: "
                                             r"job_stopped at "):
        operator(file_storage).execute({"ti": ti})  # type: ignore[arg-type]
    assert file_storage.list("orders/control/") == []


def test_a_misspelled_job_gets_did_you_mean(running: CheckpointStorage, ti: FakeTI) -> None:
    op = TriggerSavepointOperator(task_id="savepoint", job_name="order",
                                  checkpoint_storage=running.uri, storage_conn_id=None)
    with pytest.raises(SavepointError, match=r"job 'order' is not running .*; nothing is "
                                             r"stored for job 'order' in .*; did you mean "
                                             r"'orders'\?"):
        op.execute({"ti": ti})  # type: ignore[arg-type]


def test_polling_savepoint_returns_the_path(running: CheckpointStorage, ti: FakeTI) -> None:
    with JobThread(running) as job:
        path = operator(running, savepoint_id="before-upgrade").execute(
            {"ti": ti})  # type: ignore[arg-type]
    assert path == running.uri + "/orders/savepoints/sp-before-upgrade"
    assert ti.xcom["request_id"] == job.answered[0].request_id
    assert ti.xcom["savepoint"]["savepoint_id"] == "before-upgrade"
    assert job.answered[0].stop is False
    assert job.answered[0].requested_by == "airflow:dag/run-1/task"


def test_stop_flag_from_a_rendered_template(running: CheckpointStorage, ti: FakeTI) -> None:
    with JobThread(running) as job:
        operator(running, stop="True").execute({"ti": ti})  # type: ignore[arg-type]
    assert job.answered[0].stop is True
    assert [as_bool(v) for v in (True, "false", "1", "off", "")] == [
        True, False, True, False, False]
    with pytest.raises(SavepointError, match="stop must be a boolean"):
        as_bool("maybe")


def test_failed_savepoint_fails_with_the_jobs_reason(running: CheckpointStorage,
                                                     ti: FakeTI) -> None:
    with JobThread(running, failure="state upload failed: disk full"), pytest.raises(
            SavepointError, match="state upload failed: disk full"):
        operator(running).execute({"ti": ti})  # type: ignore[arg-type]


def test_timeout_cancels_the_request(running: CheckpointStorage, ti: FakeTI) -> None:
    started = time.monotonic()
    with pytest.raises(SavepointError, match=r"timed out after 0\.5 s.*request was cancelled"):
        operator(running, timeout=0.5).execute({"ti": ti})  # type: ignore[arg-type]
    assert time.monotonic() - started < 5
    channel = ControlChannel(running, JOB)
    assert channel.pending() == []  # a late job no longer sees it
    result = channel.result(ti.xcom["request_id"])
    assert result is not None and result.status == "failed"
    assert result.failure_message is not None and "expired" in result.failure_message


def test_wait_for_completion_false_returns_the_request_id(running: CheckpointStorage,
                                                          ti: FakeTI) -> None:
    request_id = operator(running, wait_for_completion=False).execute(
        {"ti": ti})  # type: ignore[arg-type]
    assert [r.request_id for r in ControlChannel(running, JOB).pending()] == [request_id]


def test_deferrable_savepoint(running: CheckpointStorage, ti: FakeTI) -> None:
    op = operator(running, deferrable=True, timeout="2 min", defer_after=0)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})  # type: ignore[arg-type]
    trigger = deferred.value.trigger
    assert isinstance(trigger, CheckpointTrigger)
    assert trigger.condition.request_id == ti.xcom["request_id"]
    assert trigger.deadline_ts is not None and 110 < trigger.deadline_ts - time.time() <= 120
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.kwargs == {"request_id": ti.xcom["request_id"]}
    with JobThread(running):
        event = asyncio.run(asyncio.wait_for(anext(trigger.run()), 10))
    path = op.execute_complete({"ti": ti}, event.payload,  # type: ignore[arg-type]
                               **deferred.value.kwargs)
    assert path.startswith(running.uri + "/orders/savepoints/sp-auto-")
    # dag.test() resumes with the event only: the request id then comes from XCom
    assert op.execute_complete({"ti": ti}, event.payload) == path  # type: ignore[arg-type]


def test_job_answering_as_the_wait_times_out_wins(running: CheckpointStorage,
                                                  ti: FakeTI) -> None:
    op = operator(running, deferrable=True, defer_after=0)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})  # type: ignore[arg-type]
    answer_savepoint_requests(running, JOB)  # answered just before the task resumes
    timeout_event = {"status": "timeout", "message": "deadline", "checked_ts": time.time()}
    path = op.execute_complete({"ti": ti}, timeout_event,  # type: ignore[arg-type]
                               **deferred.value.kwargs)
    assert "/savepoints/sp-auto-" in path


def test_a_quick_answer_never_defers(running: CheckpointStorage, ti: FakeTI) -> None:
    """Airflow's short-deferral race (apache/airflow#72716) fails a task whose trigger
    fires within seconds of the deferral: an answer within ``defer_after`` is taken in
    the worker, so that task never defers."""
    for stop in (False, True):
        with JobThread(running) as job:
            path = operator(running, deferrable=True, stop=stop,
                            worker_poll_interval=0.05).execute(
                {"ti": ti})  # type: ignore[arg-type]  # raises TaskDeferred if it deferred
        assert path.startswith(running.uri + "/orders/savepoints/sp-auto-")
        assert [r.stop for r in job.answered] == [stop]


def test_a_quick_failure_fails_without_deferring(running: CheckpointStorage,
                                                 ti: FakeTI) -> None:
    with JobThread(running, failure="state upload failed: disk full"), pytest.raises(
            SavepointError, match="disk full"):
        operator(running, deferrable=True, worker_poll_interval=0.05).execute(
            {"ti": ti})  # type: ignore[arg-type]


def test_no_answer_within_defer_after_defers(running: CheckpointStorage, ti: FakeTI) -> None:
    op = operator(running, deferrable=True, timeout="2 min", defer_after="0.3 s",
                  worker_poll_interval=0.05)
    started = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})  # type: ignore[arg-type]
    assert time.time() - started >= 0.3
    trigger = deferred.value.trigger
    assert isinstance(trigger, CheckpointTrigger)
    # the trigger waits for the same request, up to the request's own deadline
    assert trigger.condition.request_id == ti.xcom["request_id"]
    assert trigger.deadline_ts is not None and trigger.deadline_ts - started <= 121
    assert ControlChannel(running, JOB).result(ti.xcom["request_id"]) is None


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="duration must be >= 0"):
        TriggerSavepointOperator(task_id="t", job_name=JOB, checkpoint_storage="s3://b/c",
                                 defer_after=-1)
    with pytest.raises(ValueError, match="worker_poll_interval"):
        TriggerSavepointOperator(task_id="t", job_name=JOB, checkpoint_storage="s3://b/c",
                                 worker_poll_interval=0)
    with pytest.raises(ValueError, match="timeout"):
        TriggerSavepointOperator(task_id="t", job_name=JOB, checkpoint_storage="s3://b/c",
                                 timeout=0)
    with pytest.raises(ValueError, match="expected a duration"):
        TriggerSavepointOperator(task_id="t", job_name=JOB, checkpoint_storage="s3://b/c",
                                 timeout="soon")


# ------------------------------------------------------------------ sensor


def sensor(storage: CheckpointStorage, **kwargs: Any) -> CheckpointSensor:
    kwargs.setdefault("deferrable", False)
    kwargs.setdefault("timeout", 10)
    return CheckpointSensor(task_id="wait", job_name=JOB, checkpoint_storage=storage.uri,
                            storage_conn_id=None, poke_interval=0.05, **kwargs)


@pytest.fixture
def writer(file_storage: CheckpointStorage) -> Iterator[list[float]]:
    """Writes chk-5 after 0.4 s; yields [time it was written]."""
    when: list[float] = []

    def write() -> None:
        time.sleep(0.4)
        when.append(time.time())
        write_snapshot(file_storage, JOB, 5)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    yield when
    thread.join(5)


def test_poke_mode_waits_for_a_new_checkpoint(file_storage: CheckpointStorage,
                                              writer: list[float]) -> None:
    write_snapshot(file_storage, JOB, 4)  # already there: not "new"
    summary = sensor(file_storage).execute({})  # type: ignore[arg-type]
    assert summary["id"] == 5 and summary["kind"] == "checkpoint"
    assert summary["path"] == file_storage.uri + "/orders/chk-5"


def test_deferrable_sensor_records_the_baseline_then_defers(
        file_storage: CheckpointStorage) -> None:
    write_snapshot(file_storage, JOB, 4)
    s = sensor(file_storage, deferrable=True, timeout=300)
    with pytest.raises(TaskDeferred) as deferred:
        s.execute({})  # type: ignore[arg-type]
    trigger = deferred.value.trigger
    assert isinstance(trigger, CheckpointTrigger)
    assert trigger.condition.after_checkpoint_id == 4
    assert deferred.value.timeout is not None and deferred.value.timeout.total_seconds() == 300
    write_snapshot(file_storage, JOB, 5)
    event = asyncio.run(asyncio.wait_for(anext(trigger.run()), 10))
    assert s.execute_complete({}, event.payload)["id"] == 5  # type: ignore[arg-type]


def test_already_matching_does_not_defer(file_storage: CheckpointStorage) -> None:
    write_snapshot(file_storage, JOB, 9)
    summary = sensor(file_storage, deferrable=True, min_checkpoint_id=8).execute(
        {})  # type: ignore[arg-type]
    assert summary["id"] == 9


def test_templated_min_checkpoint_id(file_storage: CheckpointStorage) -> None:
    write_snapshot(file_storage, JOB, 3)
    s = sensor(file_storage, min_checkpoint_id="{{ params.n }}")
    s.min_checkpoint_id = "3"  # as rendered
    assert s.execute({})["id"] == 3  # type: ignore[arg-type]


def test_sensor_event_failures_map_to_airflow_errors(file_storage: CheckpointStorage) -> None:
    s = sensor(file_storage, deferrable=True)
    with pytest.raises(AirflowFailException, match="stale"):
        s.execute_complete({}, {"status": "failed", "message": "stale"})  # type: ignore[arg-type]
    with pytest.raises(AirflowSensorTimeout, match="late"):
        s.execute_complete({}, {"status": "timeout", "message": "late"})  # type: ignore[arg-type]


def test_freshness_check_fails_the_sensor(file_storage: CheckpointStorage) -> None:
    write_snapshot(file_storage, JOB, 2, completed_ts=time.time() - 3600)
    with pytest.raises(AirflowFailException, match=r"no checkpoint within 600 s.*chk-2"):
        sensor(file_storage, max_checkpoint_age="10 min").execute({})  # type: ignore[arg-type]


def test_sensor_for_a_savepoint_request(running: CheckpointStorage, ti: FakeTI) -> None:
    request_id = operator(running, wait_for_completion=False).execute(
        {"ti": ti})  # type: ignore[arg-type]
    with JobThread(running):
        summary = sensor(running, request_id=request_id, kind="savepoint").execute(
            {})  # type: ignore[arg-type]
    assert summary["kind"] == "savepoint"


def test_poke_timeout(file_storage: CheckpointStorage) -> None:
    with pytest.raises(AirflowSensorTimeout):
        sensor(file_storage, timeout=0.3).execute({})  # type: ignore[arg-type]


def test_reschedule_mode_cannot_keep_a_baseline(file_storage: CheckpointStorage) -> None:
    with pytest.raises(ValueError, match="reschedule"):
        sensor(file_storage, mode="reschedule")
    sensor(file_storage, mode="reschedule", min_checkpoint_id=3)  # no baseline: fine


def test_bad_condition_fails_at_parse_time(file_storage: CheckpointStorage) -> None:
    with pytest.raises(ValueError, match="kind"):
        sensor(file_storage, kind="everything")


# ------------------------------------------------- [operators] default_deferrable (issue 11)


@pytest.mark.parametrize("setting", ["True", "False"])
def test_deferrable_default_follows_operators_default_deferrable(setting: str) -> None:
    """Like Airflow's own operators: the default comes from the config when the module is
    imported (a fresh interpreter, as a worker or the dag-processor would be)."""
    import os
    import subprocess
    import sys

    code = (
        "from airflow_ckpt.sensors.checkpoint import CheckpointSensor as S\n"
        "from airflow_ckpt.operators.savepoint import TriggerSavepointOperator as O\n"
        "s = S(task_id='s', job_name='j', checkpoint_storage='file:///tmp/x')\n"
        "o = O(task_id='o', job_name='j', checkpoint_storage='file:///tmp/x')\n"
        "print(s.deferrable, o.deferrable)\n"
    )
    env = {**os.environ, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": setting}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == [setting, setting]
