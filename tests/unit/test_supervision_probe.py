"""SupervisionProbe and DriverSupervisionTrigger against local storage and a fake clock.

The probe is the deferrable supervisor's eyes: terminal events of this run, the lease
heartbeat judged on the probe's own clock, the detached launcher's exit code and the
checkpoint-progress health rule (issue 10 parts 1 and 2).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_ckpt.runtime.history.events import (
    CHECKPOINT_COMPLETED,
    JOB_FAILED,
    JOB_FINISHED,
    JOB_STOPPED,
    JOB_SUBMITTED,
)
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.lease.record import LeaseRecord
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage
from airflow_ckpt.supervision import HealthRule, RunCheckpoints, SupervisionProbe, Verdict
from airflow_ckpt.triggers.supervision import DriverSupervisionTrigger, kill_plan

RUN = "d/r/t"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    return open_storage((tmp_path / "ckpt").as_uri())


def put_lease(storage: CheckpointStorage, epoch: int, seq: int, released: bool = False) -> None:
    record = LeaseRecord(epoch=epoch, owner=RUN, host="another-host", pid=1, acquired_ts=0.0,
                         heartbeat_ts=0.0, released=released, seq=seq, ttl_s=30.0,
                         max_write_s=10.0)
    storage.put_bytes(f"job/lease/{epoch:010d}.json", record.to_json())


def probe(storage: CheckpointStorage, clock: FakeClock, **kwargs: Any) -> SupervisionProbe:
    history = JobHistory(storage, "job")
    submitted = history.append(JOB_SUBMITTED, run_id=RUN, attempt=1)
    return SupervisionProbe(history, RUN, submitted_key=submitted.key, clock=clock,
                            lease_epoch_before=kwargs.pop("lease_epoch_before", 1), **kwargs)


def test_silent_heartbeat_is_a_dead_driver_after_ttl_plus_max_write(
    storage: CheckpointStorage,
) -> None:
    clock = FakeClock()
    put_lease(storage, 1, 50, released=True)  # the previous driver's
    p = probe(storage, clock)
    assert p.poll() is None  # the old epoch is not ours: still starting
    put_lease(storage, 2, 1)
    assert p.poll() is None
    clock.now += 20
    put_lease(storage, 2, 2)  # beats
    assert p.poll() is None
    clock.now += 39.9
    assert p.poll() is None
    clock.now += 0.2
    verdict = p.poll()
    assert verdict is not None and verdict.kind == "driver_died"
    assert verdict.needs_restart_decision and "expired" in verdict.cause


def test_terminal_events_of_this_run_win(storage: CheckpointStorage) -> None:
    clock = FakeClock()
    p = probe(storage, clock)
    history = JobHistory(storage, "job")
    history.append(JOB_FINISHED, run_id="another/run/t")  # not ours
    assert p.poll() is None
    history.append(JOB_STOPPED, run_id=RUN, savepoint="s3://x")
    verdict = p.poll()
    assert verdict == Verdict("finished", "the job stopped", None, "stopped")
    p2 = probe(storage, clock)
    history.append(JOB_FAILED, run_id=RUN, cause="state does not fit")
    verdict = p2.poll()
    assert verdict is not None and verdict.kind == "failed" and not verdict.needs_restart_decision


def test_exit_code_of_the_detached_submission(storage: CheckpointStorage) -> None:
    codes: list[int | None] = [None]
    p = probe(storage, FakeClock(), exit_code=lambda: codes[0])
    assert p.poll() is None
    codes[0] = 137
    verdict = p.poll()
    assert verdict is not None and verdict.kind == "driver_died" and verdict.exit_code == 137


def test_a_dead_driver_whose_launcher_lives_is_reported_with_its_exit_code(
    storage: CheckpointStorage,
) -> None:
    """A driver that exited non-zero leaves the lease before spark-submit has exited:
    while the local launcher lives, the exit code (and so the last error) is awaited."""
    clock = FakeClock()
    codes: list[int | None] = [None]
    launcher = [True]
    p = probe(storage, clock, exit_code=lambda: codes[0], exit_pending=lambda: launcher[0],
              exit_grace_s=30)
    put_lease(storage, 2, 1)
    assert p.poll() is None
    clock.now += 41  # the heartbeat expired: the driver is gone, the launcher is not
    assert p.poll() is None
    codes[0] = 17
    verdict = p.poll()
    assert verdict is not None and (verdict.kind, verdict.exit_code) == ("driver_died", 17)
    # a launcher killed with the driver writes nothing: reported at once
    launcher[0], codes[0] = False, None
    p = probe(storage, clock, exit_code=lambda: codes[0], exit_pending=lambda: launcher[0])
    assert p.poll() is None
    clock.now += 41
    verdict = p.poll()
    assert verdict is not None and verdict.exit_code is None and "expired" in verdict.cause
    # a launcher that never writes: reported after the grace period
    launcher[0] = True
    p = probe(storage, clock, exit_code=lambda: None, exit_pending=lambda: True,
              exit_grace_s=30)
    assert p.poll() is None
    clock.now += 41
    assert p.poll() is None
    clock.now += 30
    verdict = p.poll()
    assert verdict is not None and verdict.kind == "driver_died"


def test_startup_timeout_without_a_lease(storage: CheckpointStorage) -> None:
    clock = FakeClock()
    p = probe(storage, clock, startup_timeout_s=60)
    assert p.poll() is None
    clock.now += 61
    verdict = p.poll()
    assert verdict is not None and verdict.kind == "driver_died" and "no lease" in verdict.cause


class FakeCatalog:
    def __init__(self, completed_ts: float | None) -> None:
        self.completed_ts = completed_ts
        self.checkpoint_id = 7

    def latest_checkpoint(self) -> Any:
        if self.completed_ts is None:
            return None
        return SimpleNamespace(checkpoint_id=self.checkpoint_id,
                               timings=SimpleNamespace(completed_ts=self.completed_ts))


@pytest.mark.parametrize("driver_clock_offset_s", [0.0, -3600.0, 3600.0])
def test_stale_checkpoints_while_the_heartbeat_lives(
    storage: CheckpointStorage, driver_clock_offset_s: float
) -> None:
    """Issue 10 part 2: the newest checkpoint unchanged for multiple x interval of the
    probe's clock, heartbeat alive. The checkpoint's timestamps (the driver's clock, an
    hour off here) play no part: a healthy job is never called stale by a skewed clock."""
    clock = FakeClock()
    catalog = FakeCatalog(completed_ts=clock.now + driver_clock_offset_s)
    p = probe(storage, clock, health=HealthRule(10.0, 3.0, restart=True), catalog=catalog)
    put_lease(storage, 2, 1)
    assert p.poll() is None  # chk-7 is new to this probe
    clock.now += 25
    put_lease(storage, 2, 2)
    assert p.poll() is None  # 25 s < 30 s
    clock.now += 6
    put_lease(storage, 2, 3)
    verdict = p.poll()
    assert verdict is not None and verdict.kind == "stale" and "chk-7" in verdict.cause
    assert verdict.needs_restart_decision
    catalog.completed_ts = None  # no checkpoint yet: unknown, never stale
    clock.now += 100
    put_lease(storage, 2, 4)
    assert p.poll() is None


def test_a_new_checkpoint_restarts_the_stale_window(storage: CheckpointStorage) -> None:
    clock = FakeClock()
    catalog = FakeCatalog(completed_ts=0.0)
    p = probe(storage, clock, health=HealthRule(10.0, 3.0, restart=True), catalog=catalog)
    put_lease(storage, 2, 1)
    assert p.poll() is None
    for seq in range(2, 8):  # a checkpoint every 20 s: never stale
        clock.now += 20
        put_lease(storage, 2, seq)
        catalog.checkpoint_id += 1
        assert p.poll() is None


def test_run_checkpoints_only_counts_checkpoints_after_the_runs_first_submit(
    storage: CheckpointStorage,
) -> None:
    history = JobHistory(storage, "job")
    history.append(JOB_SUBMITTED, run_id="older", attempt=1)
    history.append(CHECKPOINT_COMPLETED, id=3)
    watch = RunCheckpoints(history, RUN)
    assert not watch.progress().own_checkpoint
    history.append(JOB_SUBMITTED, run_id=RUN, attempt=1)
    assert watch.progress() == watch.progress()
    assert not watch.progress().own_checkpoint
    history.append(CHECKPOINT_COMPLETED, id=4, trigger="initial")
    assert watch.progress().own_checkpoint
    # a fresh reader (a retried task) finds the same
    assert RunCheckpoints(history, RUN).progress().own_checkpoint


def test_trigger_round_trips_and_fires_from_storage(tmp_path: Path,
                                                    storage: CheckpointStorage) -> None:
    history = JobHistory(storage, "job")
    submitted = history.append(JOB_SUBMITTED, run_id=RUN, attempt=1)
    trigger = DriverSupervisionTrigger(
        storage_uri=(tmp_path / "ckpt").as_uri(), job="job", run_id=RUN,
        submitted_key=submitted.key, lease_epoch_before=0, conn_id=None, driver_pid=None,
        driver_host="h", exit_path=None, health={"interval_s": 10, "multiple": 3},
        poll_interval=0.05,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_ckpt.triggers.supervision.DriverSupervisionTrigger"
    json.dumps(kwargs)  # plain JSON
    again = DriverSupervisionTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)

    async def first_event() -> Any:
        agen = again.run()
        history.append(JOB_FINISHED, run_id=RUN)
        event = await asyncio.wait_for(agen.__anext__(), 10)
        await agen.aclose()  # type: ignore[attr-defined]
        return event.payload

    payload = asyncio.run(first_event())
    assert Verdict.from_payload(payload) == Verdict("finished", "the job finished", None,
                                                    "finished")


def test_trigger_on_kill_asks_for_a_graceful_stop_then_kills(
    tmp_path: Path, storage: CheckpointStorage
) -> None:
    """A user killing the deferred task: stop-with-savepoint request first; a driver that
    does not stop within ``stop_timeout_s`` is killed (its whole process group)."""
    import socket
    import subprocess
    import sys

    from airflow_ckpt.runtime.control.channel import ControlChannel

    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              start_new_session=True)
    history = JobHistory(storage, "job")
    submitted = history.append(JOB_SUBMITTED, run_id=RUN, attempt=1)
    trigger = DriverSupervisionTrigger(
        storage_uri=(tmp_path / "ckpt").as_uri(), job="job", run_id=RUN,
        submitted_key=submitted.key, lease_epoch_before=0, conn_id=None,
        driver_pid=driver.pid, driver_host=socket.gethostname(), poll_interval=0.05,
        stop_timeout_s=0.5,
    )
    import threading

    reaper = threading.Thread(target=driver.wait)  # reap it as its parent would be gone
    reaper.start()
    asyncio.run(trigger.on_kill())
    (request,) = ControlChannel(storage, "job").pending()
    assert request.stop and "on_kill" in request.requested_by
    reaper.join(15)
    assert driver.returncode is not None and driver.returncode != 0  # killed


def test_kill_plan_fits_the_triggerers_on_kill_bound() -> None:
    # the default bound (30 s): a 120 s stop_timeout_s is cut so the kill still runs
    assert kill_plan(30.0, 120.0) == (15.0, 10.0)
    assert kill_plan(30.0, 5.0) == (5.0, 10.0)  # a short graceful stop is kept
    graceful, grace = kill_plan(6.0, 120.0)  # a short bound: the kill keeps half of it
    assert (graceful, grace) == (3.0, 2.0)


def test_a_forced_kill_completes_within_the_triggerers_on_kill_bound(
    tmp_path: Path, storage: CheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The triggerer runs ``on_kill`` under ``asyncio.wait_for(..., on_kill_timeout)``
    (``TriggerRunner.run_trigger``). With the default ``stop_timeout_s`` (120 s) and a
    driver that ignores both the stop request and SIGTERM, the driver is still killed
    and the kill recorded before that bound cancels ``on_kill`` (before the plan, the
    graceful wait alone outlasted the bound: no kill, no record)."""
    import signal
    import socket
    import subprocess
    import sys
    import threading
    import time

    from airflow_ckpt.runtime.history.events import JOB_STOPPED

    bound = 6
    monkeypatch.setenv("AIRFLOW__TRIGGERER__ON_KILL_TIMEOUT", str(bound))
    driver = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys, time\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
         "time.sleep(120)"], start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert driver.stdout is not None and driver.stdout.readline() == "ready\n"
    history = JobHistory(storage, "job")
    submitted = history.append(JOB_SUBMITTED, run_id=RUN, attempt=1)
    trigger = DriverSupervisionTrigger(
        storage_uri=(tmp_path / "ckpt").as_uri(), job="job", run_id=RUN,
        submitted_key=submitted.key, lease_epoch_before=0, conn_id=None,
        driver_pid=driver.pid, driver_host=socket.gethostname(), poll_interval=0.05,
        attempt=1)
    assert trigger.stop_timeout_s == 120.0  # the operator's default
    reaper = threading.Thread(target=driver.wait)
    reaper.start()
    started = time.monotonic()
    asyncio.run(asyncio.wait_for(trigger.on_kill(), bound))  # as the triggerer runs it
    took = time.monotonic() - started
    reaper.join(5)
    assert driver.returncode == -signal.SIGKILL  # SIGTERM was ignored: killed
    [stopped] = history.events([JOB_STOPPED])
    assert stopped.data["killed"] and stopped.data["attempt"] == 1
    assert took < bound


def test_a_terminal_event_written_just_before_the_exit_is_never_a_silent_death(
    storage: CheckpointStorage,
) -> None:
    """The driver appends job_failed and exits between two reads of the probe: the
    verdict is its own final failure, not a death to restart (found by the simulation)."""
    clock = FakeClock()
    history = JobHistory(storage, "job")

    def driver_fails_and_exits() -> int:
        history.append(JOB_FAILED, run_id=RUN, cause="the strategy gave up")
        return 1

    p = probe(storage, clock, exit_code=driver_fails_and_exits)
    verdict = p.poll()
    assert verdict is not None and verdict.kind == "failed", verdict
    assert verdict.cause == "the strategy gave up"
