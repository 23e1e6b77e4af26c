"""The driver's last error from its output: a kill is named, INFO lines are never errors."""

from __future__ import annotations

import signal

import pytest

from airflow_ckpt.driver_output import killed_by, log_level, summarize_driver_output

# What a driver printed before `kill -9`: progress only, as Spark and the job log it.
PROGRESS = [
    "25/01/01 10:00:00 INFO SparkContext: Running Spark version 4.2.0",
    "2025-01-01 10:00:01,123 INFO airflow_ckpt.coordinator: checkpoint 411 completed",
    "25/01/01 10:00:02 INFO MicroBatchExecution: Streaming query made progress",
]


@pytest.mark.parametrize("exit_code", [137, -9])
def test_a_kill_is_named_and_info_lines_are_not_error_lines(exit_code: int) -> None:
    cause, lines = summarize_driver_output(PROGRESS, exit_code)
    assert cause == f"driver killed by SIGKILL (exit code {exit_code})"
    assert lines == []


def test_a_kill_keeps_the_warnings_and_errors_before_it() -> None:
    output = [
        PROGRESS[0],
        "25/01/01 10:00:01 WARN TaskSetManager: Lost task 0.0 in stage 3.0",
        "job output: batch 7 done",  # the job's own print: not an error line
        "2025-01-01 10:00:02,5 ERROR airflow_ckpt.sinks: commit of batch 7 is slow",
        PROGRESS[2],
    ]
    cause, lines = summarize_driver_output(output, 137)
    assert cause == "driver killed by SIGKILL (exit code 137)"
    assert lines == [output[1], output[3]]


def test_a_vanished_driver_shows_only_its_warnings_and_errors() -> None:
    """Exit code unknown (the launcher died with it): its prints explain nothing."""
    output = [*PROGRESS, "job output: batch 7 done",
              "25/01/01 10:00:03 ERROR Executor: task 3 failed"]
    cause, lines = summarize_driver_output(output, None)
    assert cause == "driver failed"
    assert lines == [output[-1]]


def test_an_exit_without_traceback_shows_its_unformatted_lines_only() -> None:
    output = [*PROGRESS, "fatal: the input directory is gone"]  # sys.exit("fatal: ...")
    cause, lines = summarize_driver_output(output, 1)
    assert cause == "driver exited with code 1"
    assert lines == ["fatal: the input directory is gone"]


def test_a_traceback_wins_over_the_signal() -> None:
    output = [*PROGRESS, "Traceback (most recent call last):", '  File "job.py", line 1',
              "MemoryError: out of memory"]
    cause, lines = summarize_driver_output(output, 137)
    assert cause == "MemoryError: out of memory (exit code 137)"
    assert lines[0].startswith("Traceback") and lines[-1] == "MemoryError: out of memory"


@pytest.mark.parametrize(("code", "expected"), [
    (137, signal.SIGKILL), (-9, signal.SIGKILL), (143, signal.SIGTERM), (-15, signal.SIGTERM),
    (0, None), (1, None), (17, None), (128, None), (255, None), (None, None),
])
def test_killed_by(code: int | None, expected: signal.Signals | None) -> None:
    assert killed_by(code) == expected


@pytest.mark.parametrize(("line", "level"), [
    ("25/01/01 10:00:00 INFO SparkContext: x", "INFO"),
    ("2025-01-01 10:00:01,123 WARNING a.b: x", "WARN"),
    ("2025-01-01T10:00:01.123Z ERROR a.b: x", "ERROR"),
    ("[2025-01-01 10:00:01,123] {task.py:10} INFO - x", None),  # Airflow's: not the driver's
    ("ValueError: INFO", None),
    ("INFO without a timestamp", None),
])
def test_log_level(line: str, level: str | None) -> None:
    assert log_level(line) == level
