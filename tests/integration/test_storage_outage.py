"""A real driver of the example job through a storage outage (issue 20 item 5 / B).

The driver (local Spark, its own process) talks to the moto server through
:class:`~airflow_ckpt.testing.faultproxy.FaultProxy`, which refuses every request while
an outage lasts. What the tests check is read from the moto server directly.

* An outage shorter than ``execution.checkpointing.tolerable-storage-outage``: batches
  and checkpoints wait, the job runs to the end, the output is exact, and the history
  holds no failure. Before, the sink's first refused PUT failed the query and the
  restart bookkeeping's history read ended the driver (exit 1, no event written).
* A longer one: the job fails once, recorded when the storage is back, with the
  outage's first error as the cause; the restart strategy restarts it and the output
  is exact.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.testing import S3Endpoint
from airflow_ckpt.testing.faultproxy import FaultProxy
from airflow_ckpt.testing.numbers import (
    JobSpec,
    kill_hard,
    start_job,
    verify_output,
    wait_for_checkpoints,
    write_numbers,
)

pytestmark = pytest.mark.integration

#: the history events the job page shows as failures
FAILURES = [ev.FAILURE, ev.RESTART, ev.JOB_FAILED]



def _story(s3_endpoint: S3Endpoint, s3_uri: str, proxy: FaultProxy, tmp_path: Path,
           outage_s: float, budget: str) -> tuple[int, JobHistory, list[str], Path]:
    """One driver: one checkpoint, an outage of ``outage_s``, then to the end of its
    input. Returns its exit code, its history, the output's problems and its log."""
    job = "outage"
    truth = write_numbers(tmp_path / "input", files=4, per_file=100)
    spec = JobSpec(job=job, storage_uri=s3_uri, input_dir=tmp_path / "input",
                   output_uri=s3_uri + "-output", workdir=tmp_path / "driver",
                   checkpoint_config={
                       "execution.checkpointing.interval": "1 s",
                       "execution.checkpointing.tolerable-storage-outage": budget},
                   confs={"spark.airflow_ckpt.demo.batch_delay_s": "0.5",
                          "spark.airflow_ckpt.restart_strategy":
                              '{"type": "fixed-delay", "fixed-delay.delay": "1 s"}'})
    env = {**s3_endpoint.env(), "AWS_ENDPOINT_URL": proxy.url}
    log = tmp_path / "driver.log"
    direct = s3_endpoint.storage(s3_uri)
    proc = start_job(spec, env, log)
    try:
        assert wait_for_checkpoints(direct, job, 1, proc, 300) >= 1, log.read_text()[-3000:]
        with proxy.outage():
            time.sleep(outage_s)  # the outage itself: how long the endpoint is down
        code = proc.wait(timeout=300)
    finally:
        kill_hard(proc)
    out = s3_endpoint.storage(s3_uri + "-output")
    problems = verify_output(JsonLinesSink(out, ""), truth, finished=True).problems
    return code, JobHistory(direct, job), problems, log


def test_an_outage_shorter_than_the_budget_fails_nothing(
        s3_endpoint: S3Endpoint, s3_uri: str, proxy: FaultProxy, tmp_path: Path) -> None:
    code, history, problems, log = _story(s3_endpoint, s3_uri, proxy, tmp_path,
                                          outage_s=10, budget="2 min")

    assert code == 0, log.read_text()[-3000:]
    assert problems == []
    assert history.events(FAILURES) == []
    assert history.last(ev.JOB_FINISHED) is not None


def test_an_outage_longer_than_the_budget_fails_once_with_its_first_error(
        s3_endpoint: S3Endpoint, s3_uri: str, proxy: FaultProxy, tmp_path: Path) -> None:
    code, history, problems, log = _story(s3_endpoint, s3_uri, proxy, tmp_path,
                                          outage_s=12, budget="8 s")

    assert code == 0, log.read_text()[-3000:]  # restarted in-process, then finished
    failures = history.events([ev.FAILURE])
    assert len(failures) == 1, failures  # counted once, written when storage was back
    cause = str(failures[0].data["cause"])
    assert "tolerable-storage-outage (8 s)" in cause and "first error: " in cause, cause
    assert len(history.events([ev.RESTART])) == 1
    assert history.events([ev.JOB_FAILED]) == []
    assert problems == []
