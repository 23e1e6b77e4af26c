"""RestartLog: the restart strategy's state lives in the job history (file backend)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.runtime import interleave
from airflow_ckpt.runtime.history.events import (
    CHECKPOINT_COMPLETED,
    FAILURE,
    JOB_FAILED,
    JOB_FINISHED,
    JOB_STARTED,
    JOB_SUBMITTED,
    RESTART,
    RESTORED,
)
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.history.restart_log import RestartLog, format_restart_history
from airflow_ckpt.runtime.storage import open_storage

FIXED = {"type": "fixed-delay", "fixed-delay.attempts": 2, "fixed-delay.delay": "100 ms"}
RATE = {
    "type": "failure-rate",
    "failure-rate.max-failures-per-interval": 2,
    "failure-rate.failure-rate-interval": "10 s",
    "failure-rate.delay": "100 ms",
}
EXPO = {
    "type": "exponential-delay",
    "exponential-delay.initial-backoff": "100 ms",
    "exponential-delay.max-backoff": "1 s",
    "exponential-delay.backoff-multiplier": 2.0,
    "exponential-delay.jitter-factor": 0.0,
    "exponential-delay.reset-backoff-threshold": "1 h",
}


@pytest.fixture
def history(tmp_path: Path) -> JobHistory:
    return JobHistory(open_storage(tmp_path.as_uri()), "job-a")


def test_bad_params_name_every_bad_key(history: JobHistory) -> None:
    with pytest.raises(ConfigError) as err:
        RestartLog(
            history,
            {"type": "fixed-delay", "fixed-delay.attempts": -1, "fixed-delay.bogus": 1},
            "run",
        )
    assert "fixed-delay.attempts" in str(err.value)
    assert "fixed-delay.bogus" in str(err.value)


def test_fixed_delay_events_and_payload(history: JobHistory) -> None:
    log = RestartLog(history, FIXED, "run-1")
    decisions = [
        log.record_failure("driver", f"boom {i}", now=1000.0 + i, exit_code=17) for i in range(3)
    ]
    assert [d.restart for d in decisions] == [True, True, False]
    assert [d.delay_s for d in decisions[:2]] == [0.1, 0.1]
    failures = history.events([FAILURE])
    restarts = history.events([RESTART])
    assert len(failures) == len(restarts) == 3
    assert failures[0].data["exit_code"] == 17
    assert failures[0].data["level"] == "driver"
    last = restarts[-1].data
    assert last["run_id"] == "run-1"
    assert last["strategy"] == "fixed-delay"
    assert last["restart"] is False and last["attempt"] == 3
    assert last["options"]["fixed-delay.attempts"] == 2
    assert isinstance(last["strategy_state"], dict)
    assert last["cause"] == "boom 2"
    assert "attempt 3: no restart" in format_restart_history(restarts)


def test_state_spans_levels_and_new_instances(history: JobHistory) -> None:
    """A query-level failure in the driver and a driver-level one share the strategy."""
    runtime_log = RestartLog(history, FIXED, "run-1")
    assert runtime_log.record_failure("query", "query died", now=1.0).restart
    # the supervisor is another process: a fresh RestartLog reads the state back
    supervisor_log = RestartLog(history, FIXED, "run-1")
    assert supervisor_log.record_failure("driver", "driver died", now=2.0).restart
    # a restarted Airflow worker (third instance) continues the same count
    third = RestartLog(history, FIXED, "run-1")
    decision = third.record_failure("driver", "driver died again", now=3.0)
    assert not decision.restart and decision.attempt == 3
    assert [e.data["level"] for e in third.restarts()] == ["query", "driver", "driver"]


def test_long_lived_instance_sees_events_appended_by_others(history: JobHistory) -> None:
    supervisor = RestartLog(history, FIXED, "run-1")
    assert supervisor.record_failure("driver", "d1", now=1.0).attempt == 1
    RestartLog(history, FIXED, "run-1").record_failure("query", "q1", now=2.0)  # the driver
    assert supervisor.record_failure("driver", "d2", now=3.0).attempt == 3


def test_failure_rate_window_spans_levels(history: JobHistory) -> None:
    RestartLog(history, RATE, "r").record_failure("query", "q", now=100.0)
    RestartLog(history, RATE, "r").record_failure("query", "q", now=101.0)
    # third failure within 10 s: rate exceeded
    assert not RestartLog(history, RATE, "r").record_failure("driver", "d", now=102.0).restart
    # a new run with a later window is independent (another run id)
    assert RestartLog(history, RATE, "other").record_failure("driver", "d", now=103.0).restart


def test_failure_rate_window_slides(history: JobHistory) -> None:
    log = RestartLog(history, RATE, "r")
    assert log.record_failure("driver", "d", now=100.0).restart
    assert log.record_failure("driver", "d", now=101.0).restart
    assert RestartLog(history, RATE, "r").record_failure("driver", "d", now=120.0).restart


def test_exponential_backoff_continues_across_instances(history: JobHistory) -> None:
    delays = [
        RestartLog(history, EXPO, "r").record_failure("driver", "d", now=t).delay_s
        for t in (10.0, 20.0, 30.0, 40.0, 50.0)
    ]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0]
    assert [e.data["delay_s"] for e in history.events([RESTART])] == delays


def test_finished_job_starts_a_fresh_supervision(history: JobHistory) -> None:
    history.append(JOB_SUBMITTED, run_id="r", attempt=1)
    RestartLog(history, FIXED, "r").record_failure("driver", "d", now=1.0)
    history.append(JOB_SUBMITTED, run_id="r", attempt=2)
    RestartLog(history, FIXED, "r").record_failure("driver", "d", now=2.0)
    history.append(JOB_SUBMITTED, run_id="r", attempt=3)
    history.append(JOB_FINISHED, run_id="r")
    # the same run id again (a cleared task): it starts at attempt 1 ...
    log = RestartLog(history, FIXED, "r")
    assert log.next_attempt() == 1
    history.append(JOB_SUBMITTED, run_id="r", attempt=1)
    # ... and its first submission starts a fresh strategy, read forward or backward
    assert log.next_attempt() == 2 and log.refresh().last_restart is None
    decision = RestartLog(history, FIXED, "r").record_failure("driver", "d", now=3.0)
    assert decision.restart and decision.attempt == 1
    assert log.refresh().last_restart is not None and log.next_attempt() == 2


def test_a_late_terminal_event_of_the_run_ends_its_submission_not_the_supervision(
    history: JobHistory,
) -> None:
    """Simulation seed 100948 (deferrable world): the driver's ``job_finished`` lands after
    the probe's last look (the driver gave up on the answer and died). A rebuilt restart
    log must see that the newest submission ended with it, and must neither reset the
    attempt counter nor the strategy's window: it is no boundary of the supervision."""
    history.append(JOB_SUBMITTED, run_id="r", attempt=1)
    RestartLog(history, FIXED, "r").record_failure("driver", "d", now=1.0)
    history.append(JOB_SUBMITTED, run_id="r", attempt=2)
    history.append(CHECKPOINT_COMPLETED, id=1)
    finished = history.append(JOB_FINISHED, run_id="r")  # landed late
    state = RestartLog(history, FIXED, "r").refresh()
    assert state.attempt_end is not None and state.attempt_end.key == finished.key
    assert state.last_submit_attempt == 2 and len(state.restarts) == 1
    # a FAILURE that raced the late write sits above it: the strategy continues
    decision = RestartLog(history, FIXED, "r").record_failure("driver", "d", now=2.0)
    assert (decision.restart, decision.attempt) == (True, 2)
    end = RestartLog(history, FIXED, "r").refresh().attempt_end
    assert end is not None and end.key == finished.key  # still how attempt 2 ended


def test_foreign_run_ends_the_old_supervision(history: JobHistory) -> None:
    RestartLog(history, FIXED, "old").record_failure("driver", "d", now=1.0)
    history.append(JOB_SUBMITTED, run_id="new", attempt=1)
    history.append(JOB_SUBMITTED, run_id="old", attempt=3)
    decision = RestartLog(history, FIXED, "old").record_failure("driver", "d", now=2.0)
    assert decision.attempt == 1


def test_changed_strategy_starts_fresh(history: JobHistory) -> None:
    RestartLog(history, FIXED, "r").record_failure("driver", "d", now=1.0)
    RestartLog(history, FIXED, "r").record_failure("driver", "d", now=2.0)
    more = {**FIXED, "fixed-delay.attempts": 5}
    decision = RestartLog(history, more, "r").record_failure("driver", "d", now=3.0)
    assert decision.restart and decision.attempt == 1


def test_submit_attempts_and_forward_only_events(history: JobHistory) -> None:
    log = RestartLog(history, FIXED, "r")
    assert log.last_submit_attempt() == 0
    history.append(JOB_SUBMITTED, run_id="r", attempt=1)
    history.append(JOB_STARTED, run_id="r", attempt=1)
    history.append(RESTORED, path="file:///x/job-a/chk-3")
    for _ in range(5):
        history.append(CHECKPOINT_COMPLETED, id=1)
    history.append(JOB_SUBMITTED, run_id="r", attempt=2)
    state = log.refresh()
    assert state.last_submit_attempt == 2
    assert [e.data["path"] for e in state.restored] == ["file:///x/job-a/chk-3"]
    finished = history.append(JOB_FINISHED, run_id="r")
    end = log.refresh().attempt_end
    assert end is not None and end.key == finished.key
    # a new instance scanning backwards reads past the run's own terminal event
    fresh = RestartLog(history, FIXED, "r")
    assert fresh.last_submit_attempt() == 2 and fresh.next_attempt() == 1  # the run ended


def test_backward_scan_stops_at_first_submit(
    history: JobHistory, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(20):
        history.append(CHECKPOINT_COMPLETED, id=0)
    history.append(JOB_SUBMITTED, run_id="r", attempt=1)
    history.append(CHECKPOINT_COMPLETED, id=1)
    reads: list[str] = []
    original = history.storage.get_bytes

    def counting(key: str) -> bytes:
        reads.append(key)
        return original(key)

    monkeypatch.setattr(history.storage, "get_bytes", counting)
    # a reader of its own (the writer remembers what it wrote and would read nothing)
    log = RestartLog(JobHistory(history.storage, "job-a", compaction=None), FIXED, "r")
    assert log.last_submit_attempt() == 1
    assert len(reads) == 2  # not the 20 older events
    reads.clear()
    history.append(CHECKPOINT_COMPLETED, id=2)
    log.refresh()
    assert len(reads) == 1  # only the new event


def test_bad_level_rejected(history: JobHistory) -> None:
    with pytest.raises(ValueError, match="level"):
        RestartLog(history, FIXED, "r").record_failure("cluster", "x")  # type: ignore[arg-type]


def test_typed_predicates_of_the_run_state(history: JobHistory) -> None:
    """The supervisor asks these instead of reading raw event dicts (STYLE.md point 3)."""
    log = RestartLog(history, FIXED, "r")
    history.append(JOB_SUBMITTED, run_id="r", attempt=1)
    state = log.refresh()
    assert state.in_process_gave_up is None
    assert state.attempt_end is None
    # the runtime's in-process strategy declined: final, and already counted
    history.append(RESTART, run_id="r", level="query", restart=False, cause="boom",
                   strategy="fixed-delay", options=FIXED)
    assert log.refresh().in_process_gave_up == "boom"
    # a JOB_FAILED of another run, then of ours
    history.append(JOB_FAILED, run_id="other", cause="not ours")
    assert log.refresh().attempt_end is None
    failed = history.append(JOB_FAILED, run_id="r", cause="state does not fit")
    end = log.refresh().attempt_end
    assert end is not None and end.key == failed.key
    history.append(JOB_SUBMITTED, run_id="r", attempt=2)
    assert log.refresh().attempt_end is None  # ended the submission before, not this one


def test_a_decision_another_decider_overtook_is_decided_again(history: JobHistory) -> None:
    """The driver's query-level decision and the supervisor's driver-level one race: the
    supervisor records its decision between the driver's read and its append (the named
    point ``restart_log.before_decision``). The driver's ``append_if_head`` meets the
    moved history and decides again on top of it: two decisions, two attempts, in
    history order (the CAS the ``restart-decision-not-at-head`` mutant removes)."""
    driver = RestartLog(history, FIXED, "run-1")
    supervisor = RestartLog(JobHistory(history.storage, "job-a"), FIXED, "run-1")
    raced: list[int] = []
    arrivals: list[str] = []

    def overtake() -> None:
        arrivals.append("arrived")
        if len(arrivals) == 1:  # the driver's first look only (not the supervisor's)
            raced.append(supervisor.record_failure("driver", "declared dead",
                                                   now=1001.0).attempt)

    with interleave.installed(interleave.RESTART_BEFORE_DECISION, overtake):
        decision = driver.record_failure("query", "query died", now=1000.0)
    assert raced == [1]
    assert decision.attempt == 2
    restarts = RestartLog(history, FIXED, "run-1").restarts()
    assert [(e.data["level"], e.data["attempt"]) for e in restarts] == [
        ("driver", 1), ("query", 2)]
