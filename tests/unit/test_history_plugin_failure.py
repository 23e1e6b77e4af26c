"""The job page's "Latest failure" card: the newest failure of any kind, error first.

Issue 27: the card counted failed checkpoints only ("Latest failure: none" beside a
driver crash and a ``job_failed``), and showed "exit code 17" and py4j frames instead of
the Python exception's message.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_ckpt.driver_output import python_error
from airflow_ckpt.plugins.app import create_app
from airflow_ckpt.plugins.settings import PluginSettings
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from tests.fixtures.checkpoint_history import EVIL_CAUSE, JOB, parse_page, write_story

with warnings.catch_warnings():  # starlette suggests httpx2; TestClient works with httpx
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

#: what spark-submit's output holds when a foreachBatch raised in a PySpark driver
PY4J_LINES = [
    "Traceback (most recent call last):",
    '  File "/opt/jobs/rate_counts.py", line 90, in <module>',
    "    query.awaitTermination()",
    "pyspark.errors.exceptions.captured.StreamingQueryException: [STREAM_FAILED] Query "
    "[id = 1, runId = 2] terminated with exception: An exception was raised by the "
    "Python Proxy. Return Message: Traceback (most recent call last):",
    '  File "/opt/jobs/rate_counts.py", line 51, in write_batch',
    '    raise RuntimeError("bad row in batch 3")',
    "RuntimeError: bad row in batch 3",
    "org.apache.spark.SparkException: Job aborted.",
    "\tat org.apache.spark.sql.execution.streaming.MicroBatchExecution.run(Foo.scala:1)",
]
PY4J_CAUSE = ("py4j.protocol.Py4JJavaError: An error occurred while calling "
              "o54.awaitTermination. (exit code 17)")


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[CheckpointStorage]:
    store = open_storage(f"file://{tmp_path / 'ckpt'}")
    yield store
    store.close()


def card(storage: CheckpointStorage, limit: int | None = None) -> dict[str, str]:
    app = create_app(PluginSettings(storage.uri), authenticate=False)
    with TestClient(app) as client:
        response = client.get(f"/view/{JOB}" + (f"?limit={limit}" if limit else ""))
    assert response.status_code == 200, response.text
    _, texts = parse_page(response.text)
    return {k: " ".join(v.split()) for k, v in texts.items() if k.startswith("latest-failed")}


def started(storage: CheckpointStorage) -> JobHistory:
    history = JobHistory(storage, JOB)
    history.append(ev.JOB_SUBMITTED, run_id="r1", attempt=1, restore="latest")
    history.append(ev.JOB_STARTED, run_id="r1", attempt=1)
    return history


def test_a_driver_crash_newer_than_a_failed_checkpoint_is_the_latest_failure(
        storage: CheckpointStorage) -> None:
    write_story(storage)  # checkpoint 4 failed, then the driver was killed (exit 137)
    shown = card(storage)
    assert shown["latest-failed-message"] == EVIL_CAUSE  # markup shown as text
    assert shown["latest-failed-what"] == "driver crash"
    assert shown["latest-failed-details"] == "attempt 1, exit code 137, run r1"


def test_the_python_exception_comes_first_not_py4j_or_the_exit_code(
        storage: CheckpointStorage) -> None:
    history = started(storage)
    history.append(ev.FAILURE, level="driver", run_id="r1", attempt=1, exit_code=17,
                   cause=PY4J_CAUSE, error_lines=PY4J_LINES)
    shown = card(storage)
    assert shown["latest-failed-message"] == "RuntimeError: bad row in batch 3"
    assert shown["latest-failed-what"] == "driver crash"
    assert shown["latest-failed-cause"] == PY4J_CAUSE  # the raw cause follows


@pytest.mark.parametrize(("event", "data", "what"), [
    (ev.JOB_FAILED, {"cause": "ValueError: no such column: amount (exit code 1)"},
     "job failed"),
    (ev.RESTART, {"level": "driver", "strategy": "fixed-delay", "restart": False,
                  "cause": "ValueError: no such column: amount (exit code 1)"},
     "restart declined (fixed-delay)"),
    (ev.FAILURE, {"level": "query", "cause": "ValueError: no such column: amount"},
     "query failure"),
])
def test_every_kind_of_failure_is_shown(storage: CheckpointStorage, event: str,
                                        data: dict[str, object], what: str) -> None:
    history = started(storage)
    history.append(ev.CHECKPOINT_FAILED, id=2, status="FAILED", is_savepoint=False,
                   trigger="periodic", failure_message="older checkpoint failure")
    history.append(event, run_id="r1", **data)
    shown = card(storage)
    assert shown["latest-failed-message"].startswith("ValueError: no such column: amount")
    assert shown["latest-failed-what"] == what


def test_a_restart_that_was_taken_is_no_failure(storage: CheckpointStorage) -> None:
    history = started(storage)
    history.append(ev.RESTART, level="query", strategy="fixed-delay", restart=True,
                   cause="ValueError: x")
    assert card(storage)["latest-failed"] == "Latest failure none"


def test_a_failed_checkpoint_still_shows_when_it_is_the_newest(
        storage: CheckpointStorage) -> None:
    history = started(storage)
    history.append(ev.CHECKPOINT_FAILED, id=9, status="FAILED", is_savepoint=False,
                   trigger="periodic", failure_message="upload timed out")
    shown = card(storage)
    assert shown["latest-failed-message"] == "upload timed out"
    assert shown["latest-failed-what"] == "checkpoint 9 failed"


def test_a_driver_crash_older_than_the_history_window_is_still_found(
        storage: CheckpointStorage) -> None:
    history = started(storage)
    history.append(ev.FAILURE, level="driver", run_id="r1", attempt=1, exit_code=17,
                   cause=PY4J_CAUSE, error_lines=PY4J_LINES)
    history.append(ev.JOB_STARTED, run_id="r1", attempt=2)
    for n in range(1, 30):
        history.append(ev.CHECKPOINT_COMPLETED, id=n, status="COMPLETED",
                       is_savepoint=False, trigger="periodic")
    assert card(storage, limit=10)["latest-failed-message"] == \
        "RuntimeError: bad row in batch 3"


def test_python_error() -> None:
    assert python_error(PY4J_LINES) == "RuntimeError: bad row in batch 3"
    assert python_error([PY4J_CAUSE]) is None  # py4j's wrapper is not the Python error
    assert python_error(["java.lang.OutOfMemoryError: Java heap space"]) is None
    assert python_error(["25/01/01 10:00:00 ERROR Foo: x", "KeyError: 'amount'"]) == \
        "KeyError: 'amount'"
    assert python_error([]) is None
