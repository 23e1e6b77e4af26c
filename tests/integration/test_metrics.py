"""Checkpoint metrics under Flink's names, through Airflow's own metrics, end to end.

The deferrable supervisor's trigger watches a job whose history the runtime's own
writers (``JobHistory``, ``RestartLog``, ``Manifest.history_entry``) put into a real S3
endpoint (moto on 127.0.0.1). Its metrics go through Airflow's ``Stats`` to a real StatsD
listener (a UDP socket, Airflow configured by ``AIRFLOW__METRICS__*``) and to the
OpenTelemetry SDK's in-memory reader (Airflow's OTel logger). A restarted triggerer
watching the same history counts nothing twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from airflow_ckpt.hooks.checkpoint_store import CheckpointStoreHook
from airflow_ckpt.runtime.checkpoint.metadata import Manifest
from airflow_ckpt.runtime.history.events import (
    CHECKPOINT_COMPLETED,
    CHECKPOINT_FAILED,
    JOB_FINISHED,
    JOB_SUBMITTED,
    RESTORED,
    SAVEPOINT_COMPLETED,
    HistoryEvent,
)
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.history.restart_log import RestartLog
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.supervision import Verdict
from airflow_ckpt.testing import S3Endpoint
from airflow_ckpt.triggers.supervision import DriverSupervisionTrigger
from tests.fixtures.metrics import StatsdListener, otel_points
from tests.fixtures.snapshots import make_manifest

pytestmark = pytest.mark.integration

JOB = "orders.eu"  # a dot: per-job StatsD names spell it "orders__eu", as Airflow does
RUN = "stream/manual__1/run"
T0 = 1_700_000_000.0
FIXED_DELAY = {"type": "fixed-delay", "fixed-delay.attempts": 3, "fixed-delay.delay": "1 s"}


class TriggererDied(BaseException):
    """Raised from a scripted poll: the triggerer process ends mid-watch."""


@pytest.fixture
def aws_env(s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trigger opens the storage with ``conn_id=None``: the AWS environment."""
    for name, value in s3_endpoint.env().items():
        monkeypatch.setenv(name, value)


def manifest(n: int, *, savepoint_id: str | None = None) -> Manifest:
    return dataclasses.replace(
        make_manifest(JOB, n, savepoint_id=savepoint_id, completed_ts=T0 + n),
        state_size=1000 * n, checkpointed_size=100 * n)


def completed(history: JobHistory, m: Manifest) -> None:
    """As the coordinator records a completion."""
    kind = SAVEPOINT_COMPLETED if m.savepoint_id else CHECKPOINT_COMPLETED
    history.append(kind, path=f"s3://x/{JOB}/chk-{m.checkpoint_id}", **m.history_entry())


def restored(history: JobHistory) -> HistoryEvent:
    return history.append(RESTORED, path=f"s3://x/{JOB}/chk-1", kind="checkpoint",
                          checkpoint_id=1, savepoint_id=None, batch_id=2, from_job=JOB)


def checkpoints_and_a_restart(history: JobHistory) -> None:
    """Checkpoints 2 and 3 complete, 4 fails, the query dies and restarts in-process."""
    completed(history, manifest(2))
    completed(history, manifest(3))
    history.append(CHECKPOINT_FAILED, id=4, status="FAILED", is_savepoint=False,
                   trigger="periodic", trigger_timestamp=0, failure_message="upload timed out",
                   request_id=None)
    RestartLog(history, FIXED_DELAY, RUN).record_failure("query",
                                                        "StreamingQueryException: boom")


def savepoint_and_finish(history: JobHistory, n: int) -> None:
    completed(history, manifest(n, savepoint_id=f"sp-{n}"))
    history.append(JOB_FINISHED, run_id=RUN)


def last_checkpoint(n: int) -> list[tuple[str, int]]:
    """The gauges of checkpoint (or savepoint) ``n`` of :func:`manifest`."""
    return [("lastCheckpointDuration", 1500), ("lastCheckpointSize", 100 * n),
            ("lastCheckpointFullSize", 1000 * n), ("lastCompletedCheckpointId", n),
            ("lastCheckpointCompletedTimestamp", int((T0 + n) * 1000))]


def watch(storage_uri: str, submitted: HistoryEvent,
          script: list[Callable[[], object]]) -> Verdict | None:
    """Run the supervision trigger until it fires (its verdict) or its triggerer dies
    (None). ``script[i]`` runs right before poll ``i + 2``: a scripted driver, the test's
    pause points (no sleeping); a script step may raise :class:`TriggererDied`."""
    trigger = DriverSupervisionTrigger(
        storage_uri=storage_uri, job=JOB, run_id=RUN, submitted_key=submitted.key,
        lease_epoch_before=0, conn_id=None, driver_host="another-host", poll_interval=0.01)
    build = trigger._probe
    steps = iter(script)

    def scripted(hook: CheckpointStoreHook) -> Any:
        probe = build(hook)
        poll = probe.poll
        first = [True]

        def step_then_poll() -> Verdict | None:
            if not first[0]:
                next(steps, lambda: None)()
            first[0] = False
            return poll()

        probe.poll = step_then_poll  # type: ignore[method-assign]
        return probe

    trigger._probe = scripted  # type: ignore[method-assign]

    async def first_event() -> dict[str, Any] | None:
        agen = trigger.run()
        try:
            event = await asyncio.wait_for(agen.__anext__(), 60)
        except TriggererDied:
            return None
        await agen.aclose()  # type: ignore[attr-defined]
        return event.payload

    payload = asyncio.run(first_event())
    return None if payload is None else Verdict.from_payload(payload)


def die() -> None:
    raise TriggererDied


def history_before_the_trigger(storage: CheckpointStorage) -> tuple[JobHistory, HistoryEvent]:
    """The run's submission and checkpoint 1, written before the trigger starts."""
    history = JobHistory(storage, JOB)
    submitted = history.append(JOB_SUBMITTED, run_id=RUN, attempt=1)
    completed(history, manifest(1))
    return history, submitted


def sent(metric: str, value: int, kind: str) -> list[str]:
    """One value as StatsD receives it: the tagged name (plain StatsD drops the tag) and
    the per-job name."""
    return [f"airflow.airflow_ckpt.{metric}:{value}|{kind}",
            f"airflow.airflow_ckpt.orders__eu.{metric}:{value}|{kind}"]


def gauges(*pairs: tuple[str, int]) -> list[str]:
    return [line for metric, value in pairs for line in sent(metric, value, "g")]


def counted(*metrics: str) -> list[str]:
    return [line for metric in metrics for line in sent(metric, 1, "c")]


def test_supervision_trigger_sends_flink_metrics_to_a_real_statsd(
    statsd: StatsdListener, s3_endpoint: S3Endpoint, s3_storage: CheckpointStorage,
    aws_env: None,
) -> None:
    history, submitted = history_before_the_trigger(s3_storage)
    restore: list[HistoryEvent] = []
    verdict = watch(s3_storage.uri, submitted, [
        lambda: (restore.append(restored(history)), checkpoints_and_a_restart(history)),
        die,
    ])
    assert verdict is None
    restore_ms = round(restore[0].ts * 1000)
    assert statsd.received() == [
        # chk-1 was in the history before the trigger started: gauges, not counted
        *gauges(*last_checkpoint(1)),
        *gauges(("lastCheckpointRestoreTimestamp", restore_ms)),
        *gauges(*last_checkpoint(2)),
        *counted("numberOfCompletedCheckpoints", "totalNumberOfCheckpoints"),
        *gauges(*last_checkpoint(3)),
        *counted("numberOfCompletedCheckpoints", "totalNumberOfCheckpoints"),
        *counted("numberOfFailedCheckpoints", "totalNumberOfCheckpoints"),
        *counted("numRestarts"),
    ]

    # chk-5 completes while no triggerer runs; then a new one watches the submission
    # again: what it finds sets the gauges (newest last) and is not counted a second
    # time; the savepoint after its start is counted once
    completed(history, manifest(5))
    verdict = watch(s3_storage.uri, submitted, [lambda: savepoint_and_finish(history, 6)])
    assert verdict is not None and verdict.kind == "finished"
    assert statsd.received() == [
        *gauges(*last_checkpoint(1)),
        *gauges(("lastCheckpointRestoreTimestamp", restore_ms)),
        *gauges(*last_checkpoint(2)), *gauges(*last_checkpoint(3)),
        *gauges(*last_checkpoint(5)),
        *gauges(*last_checkpoint(6)),  # a savepoint: Flink counts it as a checkpoint too
        *counted("numberOfCompletedCheckpoints", "totalNumberOfCheckpoints",
                 "numberOfCompletedSavepoints"),
    ]


def test_the_same_metrics_reach_the_otel_in_memory_reader(
    otel_reader: Any, s3_endpoint: S3Endpoint, s3_storage: CheckpointStorage, aws_env: None,
) -> None:
    history, submitted = history_before_the_trigger(s3_storage)
    restore: list[HistoryEvent] = []
    verdict = watch(s3_storage.uri, submitted, [lambda: (
        restore.append(restored(history)), checkpoints_and_a_restart(history),
        savepoint_and_finish(history, 5))])
    assert verdict is not None and verdict.kind == "finished"
    points = otel_points(otel_reader)
    tagged = {name.removeprefix("airflow.airflow_ckpt."): value
              for (name, attrs), value in points.items() if attrs == (("job_name", JOB),)}
    per_job = {name.removeprefix("airflow.airflow_ckpt.orders__eu."): value
               for (name, attrs), value in points.items()
               if name.startswith("airflow.airflow_ckpt.orders__eu.")}
    expected = {
        **dict(last_checkpoint(5)),
        "lastCheckpointRestoreTimestamp": round(restore[0].ts * 1000),
        "numberOfCompletedCheckpoints": 3,  # 2, 3 and savepoint 5 (not 1: it was there)
        "numberOfFailedCheckpoints": 1,
        "totalNumberOfCheckpoints": 4,
        "numberOfCompletedSavepoints": 1,
        "numRestarts": 1,
    }
    # the OTel SDK lowercases instrument names (they are case-insensitive in OTel)
    expected = {name.lower(): value for name, value in expected.items()}
    assert tagged == expected
    assert per_job == expected  # the per-job names carry no attributes
