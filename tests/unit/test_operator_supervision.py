"""The supervision loop against a fake ``spark-submit`` (fast; the e2e tests use real Spark).

The fake is a Python script put first on PATH. It behaves like a driver: it reads the
``spark.airflow_ckpt.*`` confs it was given and exits non-zero (with a Python traceback
on its output) on the attempts it is told to crash.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_ckpt.operators import CheckpointedJobFailedError, CheckpointedSparkSubmitOperator
from airflow_ckpt.runtime.history.events import (
    CHECKPOINT_COMPLETED,
    FAILURE,
    JOB_FAILED,
    JOB_FINISHED,
    JOB_STOPPED,
    JOB_SUBMITTED,
    RESTART,
    HistoryEvent,
)
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.storage import open_storage
from tests.fixtures.metrics import StatsdListener

FAKE = textwrap.dedent(
    """\
    #!{python}
    import sys, time
    confs = dict(a.split("=", 1) for a in sys.argv if a.startswith("spark.") and "=" in a)
    attempt = int(confs["spark.airflow_ckpt.attempt"])
    print("25/01/01 10:00:00 INFO SparkContext: attempt", attempt, flush=True)
    if confs.get("spark.fake.print_env"):
        import os
        print("RuntimeError: token", os.environ.get(confs["spark.fake.print_env"]), flush=True)
    time.sleep(float(confs.get("spark.fake.sleep_s", "0")))
    if confs.get("spark.fake.runtime_gives_up"):
        from airflow_ckpt.runtime.history.journal import JobHistory
        from airflow_ckpt.runtime.history.restart_log import RestartLog
        from airflow_ckpt.runtime.storage import open_storage
        history = JobHistory(open_storage(confs["spark.airflow_ckpt.storage"]),
                             confs["spark.airflow_ckpt.job"])
        log = RestartLog(history, {{"type": "none"}}, confs["spark.airflow_ckpt.run_id"])
        log.record_failure("query", "StreamingQueryException: query died")
        sys.exit(1)
    if attempt <= int(confs.get("spark.fake.crash_attempts", "0")):
        if confs.get("spark.fake.checkpoint_before_crash"):
            from airflow_ckpt.runtime.history.events import CHECKPOINT_COMPLETED
            from airflow_ckpt.runtime.history.journal import JobHistory
            from airflow_ckpt.runtime.storage import open_storage
            storage = open_storage(confs["spark.airflow_ckpt.storage"])
            n = 10 + attempt
            storage.put_bytes(f"{{confs['spark.airflow_ckpt.job']}}/chk-{{n}}/_metadata", b"{{}}")
            JobHistory(storage, confs["spark.airflow_ckpt.job"]).append(
                CHECKPOINT_COMPLETED, id=n, trigger="initial")
        print("Traceback (most recent call last):")
        print('  File "job.py", line 1, in <module>')
        print(f"RuntimeError: injected crash on attempt {{attempt}}")
        print("25/01/01 10:00:01 INFO ShutdownHookManager: Shutdown hook called", flush=True)
        sys.exit(17)
    """
)


@pytest.fixture(autouse=True)
def fake_spark_submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "spark-submit"
    script.write_text(FAKE.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT",
                       json.dumps({"conn_type": "spark", "host": "local[1]"}))


def run(tmp_path: Path, strategy: dict[str, Any], conf: dict[str, str],
        run_id: str = "manual__1", **kwargs: Any) -> tuple[Any, JobHistory]:
    storage = (tmp_path / "ckpt").as_uri()
    op = CheckpointedSparkSubmitOperator(
        task_id="t", application="job.py", job_name="job-a", checkpoint_storage=storage,
        restart_strategy=strategy, conf=conf, ship_runtime=False, **kwargs,
    )
    ti = SimpleNamespace(dag_id="d", run_id=run_id, task_id="t", map_index=-1, try_number=1)
    history = JobHistory(open_storage(storage), "job-a")
    return (lambda: op.execute({"ti": ti})), history  # type: ignore[arg-type]


FIXED = {"type": "fixed-delay", "fixed-delay.attempts": 2, "fixed-delay.delay": "10 ms"}


def test_recovers_after_crashes(tmp_path: Path) -> None:
    execute, history = run(tmp_path, FIXED, {"spark.fake.crash_attempts": "2"})
    result = execute()
    assert result["attempts"] == 3 and result["outcome"] == "finished"
    submits = history.events([JOB_SUBMITTED])
    assert [e.data["attempt"] for e in submits] == [1, 2, 3]
    assert [e.data["restore"] for e in submits] == ["latest"] * 3
    failures = history.events([FAILURE])
    assert [f.data["exit_code"] for f in failures] == [17, 17]
    assert failures[0].data["cause"] == "RuntimeError: injected crash on attempt 1 (exit code 17)"
    assert failures[0].data["error_lines"][-1] == "RuntimeError: injected crash on attempt 1"
    assert [r.data["restart"] for r in history.events([RESTART])] == [True, True]
    assert history.events([JOB_FAILED]) == []


def test_blocking_supervision_sends_the_jobs_metrics_to_statsd(
    tmp_path: Path, statsd: StatsdListener, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The blocking path: the driver's checkpoints counted by the watch around each
    submission, the restarts by the supervisor that decides them (a real UDP listener)."""
    from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog

    # the fake driver's markers are empty: the final XCom must not read them
    monkeypatch.setattr(CheckpointCatalog, "latest_checkpoint", lambda self: None)
    execute, history = run(tmp_path, FIXED, {"spark.fake.crash_attempts": "2",
                                             "spark.fake.checkpoint_before_crash": "1"})
    assert execute()["attempts"] == 3

    def sent(metric: str, value: int, kind: str) -> list[str]:
        return [f"airflow.airflow_ckpt.{metric}:{value}|{kind}",
                f"airflow.airflow_ckpt.job-a.{metric}:{value}|{kind}"]

    def attempt(event: HistoryEvent) -> list[str]:
        gauges = {"lastCheckpointDuration": 0, "lastCheckpointSize": 0,
                  "lastCheckpointFullSize": 0, "lastCompletedCheckpointId": event.data["id"],
                  "lastCheckpointCompletedTimestamp": round(event.ts * 1000)}
        return [*(line for name, value in gauges.items() for line in sent(name, value, "g")),
                *sent("numberOfCompletedCheckpoints", 1, "c"),
                *sent("totalNumberOfCheckpoints", 1, "c"), *sent("numRestarts", 1, "c")]

    first, second = history.events([CHECKPOINT_COMPLETED])
    assert statsd.received() == [*attempt(first), *attempt(second)]


def _older_runs_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A completed checkpoint left by an earlier run of the job (another supervision).

    Only its marker exists (the catalog lists it); the final XCom does not read it.
    """
    from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog

    monkeypatch.setattr(CheckpointCatalog, "latest_checkpoint", lambda self: None)
    storage = open_storage((tmp_path / "ckpt").as_uri())
    storage.put_bytes("job-a/chk-3/_metadata", b"{}")
    JobHistory(storage, "job-a").append(JOB_SUBMITTED, run_id="d/older/t", attempt=1)


@pytest.mark.parametrize("restore", ["none", "sp-1"])
def test_resubmit_keeps_the_target_until_the_run_has_a_checkpoint(
    tmp_path: Path, restore: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 8 defect 4: a first driver that dies before its initial checkpoint must not
    make the resubmission resume an older run's checkpoint."""
    _older_runs_checkpoint(tmp_path, monkeypatch)
    if restore != "none":  # a savepoint target: accept it without a real manifest
        monkeypatch.setattr(CheckpointedSparkSubmitOperator, "_check_restore_target",
                            lambda self, catalog, target: f"file:///sp/{target}")
    execute, history = run(tmp_path, FIXED, {"spark.fake.crash_attempts": "2"},
                           restore=restore)
    execute()
    target = "none" if restore == "none" else f"file:///sp/{restore}"
    assert [e.data.get("restore") for e in history.events([JOB_SUBMITTED])][2:] == [target] * 2


def test_resubmit_restores_latest_once_the_run_checkpointed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _older_runs_checkpoint(tmp_path, monkeypatch)
    execute, history = run(tmp_path, FIXED, {"spark.fake.crash_attempts": "2",
                                             "spark.fake.checkpoint_before_crash": "1"},
                           restore="none")
    execute()
    assert [e.data.get("restore") for e in history.events([JOB_SUBMITTED])][2:] == \
        ["latest", "latest"]


def test_fixed_delay_gives_up(tmp_path: Path) -> None:
    execute, history = run(tmp_path, FIXED, {"spark.fake.crash_attempts": "9"})
    with pytest.raises(CheckpointedJobFailedError) as err:
        execute()
    message = str(err.value)
    assert "failed after 3 submission(s)" in message
    assert "RuntimeError: injected crash on attempt 3" in message
    assert "restart history" in message and message.count("[driver] attempt") == 3
    assert len(history.events([JOB_SUBMITTED])) == 3
    assert [r.data["restart"] for r in history.events([RESTART])] == [True, True, False]
    (failed,) = history.events([JOB_FAILED])
    assert failed.data["exit_code"] == 17 and failed.data["run_id"] == "d/manual__1/t"


def test_exponential_delays_recorded(tmp_path: Path) -> None:
    strategy = {"type": "exponential-delay", "exponential-delay.initial-backoff": "10 ms",
                "exponential-delay.max-backoff": "40 ms",
                "exponential-delay.backoff-multiplier": 2, "exponential-delay.jitter-factor": 0,
                "exponential-delay.attempts-before-reset-backoff": 4}
    execute, history = run(tmp_path, strategy, {"spark.fake.crash_attempts": "9"})
    with pytest.raises(CheckpointedJobFailedError):
        execute()
    restarts = history.events([RESTART])
    assert [r.data["delay_s"] for r in restarts] == [0.01, 0.02, 0.04, 0.04, 0.0]
    assert [r.data["restart"] for r in restarts] == [True] * 4 + [False]


def test_runtime_decision_is_not_counted_twice(tmp_path: Path) -> None:
    execute, history = run(tmp_path, FIXED, {"spark.fake.runtime_gives_up": "1"})
    with pytest.raises(CheckpointedJobFailedError) as err:
        execute()
    assert "in-process restart declined" in str(err.value)
    assert len(history.events([JOB_SUBMITTED])) == 1  # not resubmitted
    assert [r.data["level"] for r in history.events([RESTART])] == ["query"]


def test_task_retry_continues_the_supervision(tmp_path: Path) -> None:
    """A worker that died mid-supervision: the retried task continues count and attempts."""
    execute, history = run(tmp_path, FIXED, {"spark.fake.crash_attempts": "1"})
    # what the first try managed to record before its worker died
    history.append(JOB_SUBMITTED, run_id="d/manual__1/t", attempt=1)
    history.append(FAILURE, run_id="d/manual__1/t", level="driver", cause="x")
    from airflow_ckpt.runtime.history.restart_log import RestartLog

    RestartLog(history, FIXED, "d/manual__1/t").record_failure("driver", "x", now=time.time())
    history.append(JOB_SUBMITTED, run_id="d/manual__1/t", attempt=2)
    result = execute()
    assert result["attempts"] == 3
    assert [e.data["attempt"] for e in history.events([JOB_SUBMITTED])] == [1, 2, 3]


def test_on_kill_stops_the_driver_and_the_loop(tmp_path: Path) -> None:
    storage = (tmp_path / "ckpt").as_uri()
    op = CheckpointedSparkSubmitOperator(
        task_id="t", application="job.py", job_name="job-a", checkpoint_storage=storage,
        restart_strategy=FIXED, conf={"spark.fake.sleep_s": "60"}, ship_runtime=False,
    )
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1, try_number=1)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            op.execute({"ti": ti})  # type: ignore[arg-type]
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target)
    started = time.monotonic()
    thread.start()
    while op._hook is None or op._hook._submit_sp is None:
        time.sleep(0.05)
        assert time.monotonic() - started < 30
    time.sleep(0.3)
    op.on_kill()
    thread.join(30)
    assert not thread.is_alive()
    assert time.monotonic() - started < 20
    assert errors and "killed" in str(errors[0])
    history = JobHistory(open_storage(storage), "job-a")
    assert history.events([RESTART]) == []  # a kill is not a failure to restart from
    stopped = history.last(JOB_STOPPED)  # but the run recorded that it was killed
    assert stopped is not None and stopped.data["killed"] is True
    assert stopped.data["run_id"] == "d/r/t" and stopped.data["attempt"] == 1


def test_operator_is_deep_copyable(tmp_path: Path) -> None:
    """``partial_subset`` deep-copies tasks; a copy gets its own kill switch."""
    import copy

    op = CheckpointedSparkSubmitOperator(
        task_id="t", application="job.py", job_name="job-a",
        checkpoint_storage=(tmp_path / "ckpt").as_uri(), restart_strategy=FIXED,
    )
    copied = copy.deepcopy(op)
    assert copied is not op and copied.job_name == "job-a"
    assert copied.restart_strategy == FIXED and copied.restart_strategy is not op.restart_strategy
    op._killed.set()
    assert not copied._killed.is_set()


def _wait_for_file(path: str, timeout_s: float = 30.0) -> None:
    started = time.monotonic()
    while not os.path.exists(path):
        assert time.monotonic() - started < timeout_s, f"{path} never appeared"
        time.sleep(0.05)


def _fire(trigger: Any) -> dict[str, Any]:
    import asyncio

    async def first() -> dict[str, Any]:
        agen = trigger.run()
        event = await asyncio.wait_for(agen.__anext__(), 30)
        await agen.aclose()
        return dict(event.payload)

    return asyncio.run(first())


def test_deferrable_supervision_restarts_a_dead_driver(tmp_path: Path) -> None:
    """Issue 10 part 1 with the fake spark-submit: submit detached, defer, the trigger sees
    the driver die (exit file), the strategy restarts it after a deferred delay, the second
    driver finishes, the XCom is the blocking path's."""
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_ckpt.triggers.supervision import DriverSupervisionTrigger

    storage = (tmp_path / "ckpt").as_uri()
    op = CheckpointedSparkSubmitOperator(
        task_id="t", application="job.py", job_name="job-a", checkpoint_storage=storage,
        restart_strategy=FIXED, conf={"spark.fake.crash_attempts": "1"}, ship_runtime=False,
        deferrable=True, poll_interval=0.05, driver_log_dir=str(tmp_path / "logs"),
        storage_conn_id=None,
    )
    ctx: Any = {"ti": SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1,
                                      try_number=1)}
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    trigger = deferred.value.trigger
    assert isinstance(trigger, DriverSupervisionTrigger)
    assert deferred.value.method_name == "execute_complete"
    assert not deferred.value.kwargs  # everything the resume needs is in the event
    trigger = DriverSupervisionTrigger(**trigger.serialize()[1])  # a round trip
    assert trigger.attempt == 1
    history = JobHistory(open_storage(storage), "job-a")
    (submitted,) = history.events([JOB_SUBMITTED])
    assert submitted.data["detached"] and submitted.data["driver_log"] == trigger.driver_log
    assert submitted.data["driver_exit"] == trigger.exit_path == f"{trigger.driver_log}.exit"
    assert op.conf == {"spark.fake.crash_attempts": "1"}  # the user's conf is back
    _wait_for_file(f"{trigger.driver_log}.exit")
    event = _fire(trigger)
    assert event["kind"] == "driver_died" and event["exit_code"] == 17
    assert event["attempt"] == 1 and event["driver_log"] == trigger.driver_log

    with pytest.raises(TaskDeferred) as waiting:  # the restart delay, deferred too
        op.execute_complete(ctx, event)
    assert waiting.value.method_name == "resubmit"
    (failure,) = history.events([FAILURE])
    assert failure.data["cause"] == "RuntimeError: injected crash on attempt 1 (exit code 17)"
    with pytest.raises(TaskDeferred) as deferred:
        op.resubmit(ctx, None)
    trigger = deferred.value.trigger
    assert trigger.attempt == 2
    _wait_for_file(f"{trigger.driver_log}.exit")
    event = _fire(trigger)
    assert event["kind"] == "finished"
    result = op.execute_complete(ctx, event)
    assert result["attempts"] == 2 and result["outcome"] == "finished"
    assert [e.data["attempt"] for e in history.events([JOB_SUBMITTED])] == [1, 2]
    assert [r.data["restart"] for r in history.events([RESTART])] == [True]


def _deferred_once(tmp_path: Path) -> tuple[str, CheckpointedSparkSubmitOperator, Any, Any]:
    """A deferrable operator run up to its first deferral: (storage, operator, context,
    the trigger it deferred on)."""
    from airflow.sdk.exceptions import TaskDeferred

    storage = (tmp_path / "ckpt").as_uri()
    op = CheckpointedSparkSubmitOperator(
        task_id="t", application="job.py", job_name="job-a", checkpoint_storage=storage,
        restart_strategy=FIXED, conf={}, ship_runtime=False, deferrable=True,
        driver_log_dir=str(tmp_path / "logs"), storage_conn_id=None,
    )
    ctx: Any = {"ti": SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1,
                                      try_number=1)}
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    return storage, op, ctx, deferred.value.trigger


def test_deferrable_final_failure_is_not_restarted(tmp_path: Path) -> None:
    storage, op, ctx, trigger = _deferred_once(tmp_path)
    event = {"kind": "failed", "cause": "state does not fit the query", "exit_code": 1}
    with pytest.raises(CheckpointedJobFailedError, match="failed for good"):
        op.execute_complete(ctx, {**event, "attempt": trigger.attempt})
    history = JobHistory(open_storage(storage), "job-a")
    assert history.events([RESTART]) == []  # the driver's own decision is not re-counted


def test_no_secret_value_reaches_history_or_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 11: credentials handed to the driver (here a session token, which the Spark
    provider's own mask misses) never appear in the history or the task log, even when
    the driver prints them."""
    secret = "tok-SECRET-4711"
    execute, history = run(
        tmp_path, {"type": "none"},
        {"spark.fake.print_env": "AWS_SESSION_TOKEN", "spark.fake.crash_attempts": "1"},
        env_vars={"AWS_SESSION_TOKEN": secret},
    )
    with caplog.at_level("DEBUG"), pytest.raises(CheckpointedJobFailedError) as err:
        execute()
    assert secret not in str(err.value)
    for event in history.events():
        assert secret not in json.dumps(event.data)
    out, errout = capfd.readouterr()
    assert "RuntimeError: token ******" in out + errout + caplog.text  # the line was logged
    assert secret not in out + errout + caplog.text


def test_standalone_cluster_mode_is_refused_before_submitting(tmp_path: Path) -> None:
    """Issue 11: Spark refuses Python applications in standalone cluster deploy mode."""
    from airflow_ckpt.operators import CheckpointedJobConfigError

    execute, history = run(tmp_path, FIXED, {}, master="spark://127.0.0.1:7077",
                           deploy_mode="cluster")
    with pytest.raises(CheckpointedJobConfigError, match="standalone cluster"):
        execute()
    assert history.events([JOB_SUBMITTED]) == []


def test_deferrable_retry_reattaches_to_a_driver_that_still_holds_the_lease(
    tmp_path: Path,
) -> None:
    """A retried deferred task must not start a second driver next to a live one."""
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_ckpt.runtime.lease.record import LeaseRecord

    storage_uri = (tmp_path / "ckpt").as_uri()
    storage = open_storage(storage_uri)
    history = JobHistory(storage, "job-a")
    history.append(JOB_SUBMITTED, run_id="d/r/t", attempt=1, driver_log="/x/d.log",
                   driver_exit="/x/d.log.exit", driver_host="h", detached=True)
    record = LeaseRecord(epoch=4, owner="d/r/t", host="h", pid=1, acquired_ts=0.0,
                         heartbeat_ts=0.0, seq=3)
    storage.put_bytes("job-a/lease/0000000004.json", record.to_json())
    op = CheckpointedSparkSubmitOperator(
        task_id="t", application="job.py", job_name="job-a", checkpoint_storage=storage_uri,
        restart_strategy=FIXED, ship_runtime=False, deferrable=True, storage_conn_id=None,
    )
    ctx: Any = {"ti": SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1,
                                      try_number=2)}
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    trigger = deferred.value.trigger
    assert trigger.attempt == 1 and trigger.lease_epoch_before == 3
    assert trigger.exit_path == "/x/d.log.exit"
    assert len(history.events([JOB_SUBMITTED])) == 1  # nothing resubmitted


def test_a_durable_reconnection_that_submits_nothing_records_no_submission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11: on YARN/K8s with ``durable=True`` a task retry reconnects to the driver
    it submitted before (``execute_resumable`` polls the stored id, no spark-submit). It
    must not write a ``job_submitted`` event for a submission that did not happen."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    def reconnect_only(self: Any, context: Any) -> None:
        return None  # the driver found by its stored id finished: nothing submitted

    execute, history = run(tmp_path, FIXED, {})
    with monkeypatch.context() as patch:
        patch.setattr(SparkSubmitOperator, "execute", reconnect_only)
        with contextlib.suppress(Exception):  # the supervisor may then miss a terminal event
            execute()
    assert history.events([JOB_SUBMITTED]) == []
    execute, history = run(tmp_path, FIXED, {}, run_id="manual__2")
    execute()  # a real submission is recorded, once
    assert [e.data["run_id"] for e in history.events([JOB_SUBMITTED])] == ["d/manual__2/t"]


def test_deferred_end_by_stop_with_savepoint_returns_its_savepoint(tmp_path: Path) -> None:
    """The supervisor rebuilt on resume reads the history backwards, and a terminal event
    ends that scan: the result must still see the stop that ended the run."""
    storage, op, ctx, trigger = _deferred_once(tmp_path)
    history = JobHistory(open_storage(storage), "job-a")
    history.append(JOB_STOPPED, run_id="d/r/t", savepoint=f"{storage}/job-a/savepoints/sp-1")
    event = {"kind": "finished", "cause": "the job stopped", "exit_code": None,
             "outcome": "stopped", "attempt": trigger.attempt}
    result = op.execute_complete(ctx, event)
    assert (result["outcome"], result["attempts"]) == ("stopped", 1)
    assert result["savepoint_path"] == f"{storage}/job-a/savepoints/sp-1"


def test_a_late_job_finished_of_the_current_submission_ends_the_supervision(
    tmp_path: Path,
) -> None:
    """Simulation seed 100948: the driver's ``job_finished`` lands after the probe's last
    look, so the trigger reports the driver dead. The resumed task must end with the
    finish (done, nothing recorded against the strategy, never resubmitted): the rebuilt
    restart log took that event for the end of an earlier supervision, reset the attempt
    counter and the window, and resubmitted the finished job from its original target."""
    storage, op, ctx, trigger = _deferred_once(tmp_path)
    history = JobHistory(open_storage(storage), "job-a")
    history.append(CHECKPOINT_COMPLETED, id=1, trigger="initial")
    history.append(JOB_FINISHED, run_id="d/r/t", checkpoint_id=1)  # landed late
    event = {"kind": "driver_died", "cause": "driver heartbeat expired without a terminal "
             "event", "exit_code": None, "attempt": trigger.attempt}
    result = op.execute_complete(ctx, event)
    assert (result["outcome"], result["attempts"]) == ("finished", 1)
    assert history.events([FAILURE]) == [] and history.events([RESTART]) == []
    assert len(history.events([JOB_SUBMITTED])) == 1


def test_a_job_finished_below_the_failure_still_ends_the_supervision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same late ``job_finished``, landing between the supervisor's first look and its
    ``FAILURE`` (so below it in the history): the second look, on top of the decision,
    sees it; the run ends instead of resubmitting."""
    from airflow_ckpt.runtime.history.restart_log import RestartLog

    storage, op, ctx, trigger = _deferred_once(tmp_path)
    history = JobHistory(open_storage(storage), "job-a")
    original = RestartLog.record_failure

    def late_write_first(self: RestartLog, *args: Any, **kwargs: Any) -> Any:
        history.append(JOB_FINISHED, run_id="d/r/t")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(RestartLog, "record_failure", late_write_first)
    event = {"kind": "driver_died", "cause": "driver died", "exit_code": None,
             "attempt": trigger.attempt}
    result = op.execute_complete(ctx, event)
    assert (result["outcome"], result["attempts"]) == ("finished", 1)
    assert len(history.events([JOB_SUBMITTED])) == 1
