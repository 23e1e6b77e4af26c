"""End to end: real Airflow (``airflow dags test``, SQLite), real spark-submit, real S3.

The S3 endpoint is the session's moto server on 127.0.0.1; the DAG runs reach it through
the ``aws_default`` connection (an ``AIRFLOW_CONN_AWS_DEFAULT`` environment variable),
which the operator turns into ``AWS_*`` variables for the driver. Assertions about
restart decisions and delays read the job's history in that storage - never wall-clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.runtime.history.events import (
    CHECKPOINT_COMPLETED,
    FAILURE,
    JOB_FAILED,
    JOB_SUBMITTED,
    RESTART,
    RESTORED,
    HistoryEvent,
)
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.testing import S3Endpoint
from airflow_ckpt.testing.numbers import verify_output, write_numbers
from tests.fixtures.airflow_env import AirflowEnv, DagRunResult
from tests.fixtures.spark_standalone import SparkStandalone

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
E2E_DAGS = Path(__file__).resolve().parent / "dags"
EXAMPLE_DAG = ROOT / "dags" / "checkpointed_streaming_job.py"


@pytest.fixture(scope="module")
def s3_env(s3_endpoint: S3Endpoint) -> dict[str, str]:
    """The ``aws_default`` connection of the Airflow under test, pointing at moto."""
    return {"AIRFLOW_CONN_AWS_DEFAULT": s3_endpoint.airflow_connection()}


@pytest.fixture(scope="module")
def storage_uri(module_bucket: str) -> str:
    return f"s3://{module_bucket}/ckpt"


@pytest.fixture(scope="module")
def storage(s3_endpoint: S3Endpoint, storage_uri: str) -> Iterator[CheckpointStorage]:
    opened = s3_endpoint.storage(storage_uri)
    yield opened
    opened.close()


def events(storage: CheckpointStorage, job: str, *types: str) -> list[HistoryEvent]:
    return JobHistory(storage, job).events(types or None)


def data(found: list[HistoryEvent], key: str) -> list[Any]:
    return [event.data.get(key) for event in found]


# ------------------------------------------------------------------ restart strategies


@pytest.fixture(scope="module")
def strategies_run(airflow_env: AirflowEnv, s3_env: dict[str, str], storage_uri: str,
                   ) -> tuple[DagRunResult, str]:
    prefix = f"rs-{uuid.uuid4().hex[:8]}"
    result = airflow_env.dags_test(
        E2E_DAGS / "restart_strategies_e2e.py", "restart_strategies_e2e",
        {"storage": storage_uri, "prefix": prefix, "master": "local[1]"},
        extra_env=s3_env,
    )
    return result, prefix


def test_fixed_delay_stops_after_its_attempts(
    strategies_run: tuple[DagRunResult, str], storage: CheckpointStorage
) -> None:
    result, prefix = strategies_run
    assert result.task_states["fixed_delay"] == "failed", result.explain()
    job = f"{prefix}-fixed"
    submits = events(storage, job, JOB_SUBMITTED)
    assert data(submits, "attempt") == [1, 2]  # 1 + fixed-delay.attempts
    assert data(submits, "master") == ["local[1]"] * 2
    restarts = events(storage, job, RESTART)
    assert data(restarts, "restart") == [True, False]
    assert data(restarts, "delay_s") == [0.1, 0.0]
    assert set(data(restarts, "strategy")) == {"fixed-delay"}
    failures = events(storage, job, FAILURE)
    assert data(failures, "level") == ["driver"] * 2
    assert all(code not in (None, 0) for code in data(failures, "exit_code"))
    assert "injected failure on attempt 2" in failures[-1].data["cause"]
    assert failures[-1].data["error_lines"][0] == "Traceback (most recent call last):"
    (failed,) = events(storage, job, JOB_FAILED)
    assert "injected failure on attempt 2" in failed.data["cause"]
    # the task's log has the last error and the restart history
    assert "RuntimeError: flaky job: injected failure on attempt 2" in result.log
    assert "restart history (fixed-delay(" in result.log


def test_failure_rate_stops_when_the_rate_is_exceeded(
    strategies_run: tuple[DagRunResult, str], storage: CheckpointStorage
) -> None:
    result, prefix = strategies_run
    assert result.task_states["failure_rate"] == "failed", result.explain()
    job = f"{prefix}-rate"
    restarts = events(storage, job, RESTART)
    assert data(restarts, "strategy") == ["failure-rate"] * 3
    assert data(restarts, "restart") == [True, True, False]
    # the third failure is the one over the limit, all within the 30 min window
    assert data(restarts, "attempt") == [1, 2, 3]
    failure_ts = data(restarts, "failure_ts")
    assert failure_ts[-1] - failure_ts[0] < 30 * 60
    assert len(events(storage, job, JOB_SUBMITTED)) == 3


def test_exponential_delay_waits_growing_delays_then_recovers(
    strategies_run: tuple[DagRunResult, str], storage: CheckpointStorage
) -> None:
    result, prefix = strategies_run
    assert result.task_states["exponential_delay"] == "success", result.explain()
    job = f"{prefix}-expo"
    restarts = events(storage, job, RESTART)
    assert data(restarts, "delay_s") == [0.1, 0.2, 0.3]  # x2, capped at max-backoff
    assert data(restarts, "restart") == [True, True, True]
    submits = events(storage, job, JOB_SUBMITTED)
    assert data(submits, "attempt") == [1, 2, 3, 4]
    # each resubmission came after its recorded delay
    for restart, resubmit in zip(restarts, submits[1:], strict=True):
        assert resubmit.ts >= restart.ts + restart.data["delay_s"] - 0.01
    assert result.xcom["exponential_delay"]["attempts"] == 4
    assert result.xcom["exponential_delay"]["job"] == job


# ------------------------------------------------------------------ crash and recover


@pytest.mark.soak  # the deferred twin, test_real_supervision.py, runs in make test
def test_crashing_job_recovers_from_latest_checkpoint_with_exact_result(
    airflow_env: AirflowEnv, s3_env: dict[str, str], storage_uri: str,
    storage: CheckpointStorage, tmp_path: Path,
) -> None:
    job = f"oddeven-{uuid.uuid4().hex[:8]}"
    input_dir = tmp_path / "input"
    truth = write_numbers(input_dir, files=4, per_file=25)
    result = airflow_env.dags_test(
        EXAMPLE_DAG, "checkpointed_streaming_job",
        {
            "job_name": job, "storage": storage_uri, "input_dir": str(input_dir),
            "master": "local[2]", "checkpoint_interval": "1 s", "num_retained": 2,
            "crash_attempts": 2, "crash_after_batch": 1,
            "restart_strategy": {"type": "fixed-delay", "fixed-delay.attempts": 3,
                                 "fixed-delay.delay": "100 ms"},
        },
        extra_env=s3_env,
    )
    assert result.state == "success", result.explain()
    submits = events(storage, job, JOB_SUBMITTED)
    assert data(submits, "attempt") == [1, 2, 3]
    assert data(submits, "restore") == ["latest"] * 3
    failures = events(storage, job, FAILURE)
    assert data(failures, "exit_code") == [17, 17]
    # every resubmission restored the newest checkpoint completed before the crash
    history = events(storage, job)
    for failure in failures:
        completed = [e for e in history
                     if e.type == CHECKPOINT_COMPLETED and e.ts < failure.ts
                     and not e.data.get("is_savepoint")]
        restored = next(e for e in history if e.type == RESTORED and e.ts > failure.ts)
        assert completed, "the job crashed after batch 1: a checkpoint existed"
        assert restored.data["checkpoint_id"] == completed[-1].data["id"]
        assert restored.data["path"] == completed[-1].data["path"]
    # exactly-once output equal to the ground truth
    verdict = verify_output(JsonLinesSink(storage, f"_output/{job}"), truth, finished=True)
    assert verdict.ok, verdict.problems
    xcom = result.xcom["run_job"]
    latest = max(e.data["id"] for e in history if e.type == CHECKPOINT_COMPLETED)
    assert xcom["checkpoint_id"] == latest
    assert xcom["checkpoint_path"] == f"{storage_uri}/{job}/chk-{latest}"
    assert xcom["attempts"] == 3 and xcom["outcome"] == "finished"


# ------------------------------------------------------------------ standalone cluster


def test_submits_to_a_standalone_master_in_client_mode(
    airflow_env: AirflowEnv, s3_env: dict[str, str], storage_uri: str,
    storage: CheckpointStorage, spark_standalone: SparkStandalone,
) -> None:
    job = f"standalone-{uuid.uuid4().hex[:8]}"
    result = airflow_env.dags_test(
        E2E_DAGS / "standalone_e2e.py", "standalone_e2e",
        {"storage": storage_uri, "job_name": job, "master": spark_standalone.master_url},
        extra_env=s3_env,
    )
    assert result.state == "success", result.explain()
    submits = events(storage, job, JOB_SUBMITTED)
    assert data(submits, "master") == [spark_standalone.master_url] * 2
    assert data(submits, "deploy_mode") == ["client"] * 2
    assert data(events(storage, job, RESTART), "restart") == [True]
    # deferred (the e2e Airflow defaults to default_deferrable): the driver's output is
    # in its own log file, named in the job_submitted event
    logs = data(submits, "driver_log")
    assert "flaky job: done" in Path(logs[-1]).read_text()
    assert "flaky job: done" not in Path(logs[0]).read_text()
    assert result.xcom["on_standalone"]["attempts"] == 2


# ------------------------------------------------------------------ deferrable supervision


def test_deferred_supervision_restarts_a_dead_driver(
    airflow_env: AirflowEnv, s3_env: dict[str, str], storage_uri: str,
    storage: CheckpointStorage,
) -> None:
    """Real Airflow (``dags test`` runs the trigger inline) and a real detached driver:
    attempt 1 dies, the trigger reports it, the strategy restarts after a deferred delay,
    attempt 2 succeeds. (A real scheduler and triggerer, a SIGKILLed driver and a
    triggerer restart: tests/e2e/test_real_supervision.py.)"""
    prefix = f"ds-{uuid.uuid4().hex[:8]}"
    result = airflow_env.dags_test(
        E2E_DAGS / "deferred_supervision_e2e.py", "deferred_supervision_e2e",
        {"storage": storage_uri, "prefix": prefix, "master": "local[1]"},
        extra_env=s3_env,
    )
    assert result.task_states["deferred"] == "success", result.explain()
    job = f"{prefix}-deferred"
    submits = events(storage, job, JOB_SUBMITTED)
    assert data(submits, "attempt") == [1, 2]
    assert data(submits, "detached") == [True, True]
    assert all(path and path.endswith(".log") for path in data(submits, "driver_log"))
    failures = events(storage, job, FAILURE)
    assert len(failures) == 1 and failures[0].data["exit_code"] not in (None, 0)
    assert "injected failure on attempt 1" in failures[0].data["cause"]
    assert data(events(storage, job, RESTART), "restart") == [True]
    assert events(storage, job, JOB_FAILED) == []
