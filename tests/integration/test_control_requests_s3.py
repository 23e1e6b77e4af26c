"""The request bill of an idle job, counted at the S3 client (moto endpoint, real HTTP).

1. An idle driver's control channel and its real lease over an hour of a fake clock:
   the control channel's requests, counted per HTTP request sent, extrapolate to at
   most 2,000 a day (was 86,400); a rung doorbell is heard within one heartbeat; a
   request whose doorbell never rang is still found by the periodic listing.
2. A real idle Spark job under ``CheckpointedJob``: over two heartbeats it sends no
   control request, it answers a savepoint request within a few seconds, and it stops
   on a stop-with-savepoint request.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.runtime.control.channel import ControlChannel, ControlRequest, Doorbell
from airflow_ckpt.runtime.job import checkpointed_job as job_module
from airflow_ckpt.runtime.job.checkpointed_job import CheckpointedJob, JobResult
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.lease.record import DEFAULT_HEARTBEAT_S
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout
from airflow_ckpt.testing import S3Endpoint
from airflow_ckpt.testing.request_count import RequestCounter

pytestmark = pytest.mark.integration

JOB = "idle"
DAY_S = 86_400
#: the goal of issue 18 item 8 for the control channel of an idle job
REQUESTS_PER_DAY_GOAL = 2_000


def test_an_idle_drivers_control_requests_per_day_on_a_fake_clock(
        s3_endpoint: S3Endpoint, s3_uri: str, storage_options: dict[str, Any]) -> None:
    driver = s3_endpoint.storage(s3_uri, **storage_options)
    requester = ControlChannel(s3_endpoint.storage(s3_uri, **storage_options), JOB)
    counter = RequestCounter()
    counter.attach(driver)
    bell = Doorbell(JOB)
    # The real lease, beaten by hand on the fake clock (its own thread never beats).
    lease = JobLease(bell.listen(driver), JOB, owner="idle-driver", ttl_s=1e6,
                     heartbeat_s=1e5, max_write_s=10.0)
    lease.acquire()
    channel = ControlChannel(driver, JOB, doorbell=bell)
    layout = JobLayout(JOB)
    rung_at, silent_at = 1000.5, 2000.5
    found: dict[str, float] = {}
    rung = silent = ""
    try:
        for t in range(3600):
            if t == int(rung_at) + 1:  # a requester asks between two ticks, and rings
                rung = requester.request_savepoint().request_id
            if t == int(silent_at) + 1:  # a request whose doorbell never rang
                silent = "0000000000001-silent"
                body = asdict(ControlRequest(silent, "savepoint", 0.0, expires_ts=9e9))
                driver.put_bytes(layout.control_request(silent), json.dumps(body).encode())
            if t % int(DEFAULT_HEARTBEAT_S) == 0:
                lease.beat()
            if channel.due(float(t), job_module.CONTROL_POLL_S):
                for request in channel.look(float(t)):
                    found.setdefault(request.request_id, float(t))
    finally:
        lease.release()
    assert found[rung] - rung_at <= DEFAULT_HEARTBEAT_S + 1
    assert found[silent] - silent_at <= job_module.CONTROL_POLL_S + 1
    per_day = counter.total("control") * DAY_S / 3600
    print(f"control requests of an idle driver: {per_day:.0f}/day "
          f"(lease: {counter.total('lease') * DAY_S / 3600:.0f}/day)")
    assert per_day <= REQUESTS_PER_DAY_GOAL


# ----------------------------------------------------------------- a real idle job


def _wait_for(what: str, predicate: Callable[[], bool], timeout_s: float,
              failed: Callable[[], BaseException | None]) -> float:
    """Poll ``predicate`` (liveness bound ``timeout_s``); the seconds it took."""
    started = time.monotonic()
    while not predicate():
        error = failed()
        if error is not None:
            raise AssertionError(f"the job failed while waiting for {what}") from error
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"no {what} within {timeout_s} s")
        time.sleep(0.05)
    return time.monotonic() - started


def test_an_idle_job_makes_no_control_request_and_answers_within_seconds(
        spark: Any, s3_endpoint: S3Endpoint, s3_uri: str, storage_options: dict[str, Any],
        tmp_path: Path) -> None:
    driver: CheckpointStorage = s3_endpoint.storage(s3_uri, **storage_options)
    counter = RequestCounter()
    counter.attach(driver)
    requester = ControlChannel(s3_endpoint.storage(s3_uri, **storage_options), JOB)
    source = tmp_path / "in"
    source.mkdir()
    (source / "f0.txt").write_text("1\n2\n3\n")  # one batch, then nothing: idle
    job = CheckpointedJob(spark, job=JOB, storage=driver, workdir=tmp_path / "work",
                          restart_strategy={"type": "none"})
    sink = JsonLinesSink(job.storage, "_out")

    def build() -> Any:
        return (spark.readStream.text(str(source)).writeStream
                .foreachBatch(job.exactly_once(sink)).trigger(processingTime="1 second"))

    outcome: list[JobResult | BaseException] = []

    def run() -> None:
        try:
            outcome.append(job.run(build))
        except BaseException as exc:  # reported by the waits below
            outcome.append(exc)

    def failed() -> BaseException | None:
        return next((o for o in outcome if isinstance(o, BaseException)), None)

    thread = threading.Thread(target=run, name="idle-job")
    thread.start()
    try:
        def checkpointed() -> bool:  # batch 0 ran and a checkpoint covers it
            coordinator = getattr(job, "coordinator", None)
            return coordinator is not None and any(
                m.batch_id == 0 for m in coordinator.store.retained)

        _wait_for("first checkpoint", checkpointed, 120, failed)
        before = counter.total("control")
        beats = counter.total("lease")
        # two heartbeats (PUT + LIST each) of an idle job: ~10 s
        _wait_for("two heartbeats", lambda: counter.total("lease") >= beats + 4, 30, failed)
        assert counter.total("control") == before  # the old polling: ~10 LISTs here

        request = requester.request_savepoint(savepoint_id="idle")
        took = _wait_for("savepoint answer", lambda: requester.result(request.request_id)
                         is not None, 60, failed)
        answer = requester.result(request.request_id)
        assert answer is not None and answer.status == "completed", answer
        print(f"savepoint of an idle job answered after {took:.1f} s")
        assert took <= DEFAULT_HEARTBEAT_S + 5  # heard at the next heartbeat, then taken

        requester.request_savepoint(savepoint_id="bye", stop=True)
        thread.join(timeout=120)
        assert not thread.is_alive()
    finally:
        job._cancel.set()  # a failed assertion must not leave the query running
        thread.join(timeout=60)
    assert len(outcome) == 1 and isinstance(outcome[0], JobResult), outcome
    assert outcome[0].outcome == "stopped"
