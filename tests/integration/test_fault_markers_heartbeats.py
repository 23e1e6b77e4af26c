"""A real driver through the fault-injecting proxy: issue 20 items 3 and 4.

The driver (:class:`CheckpointedJob` in a real local SparkSession, its real lease,
coordinator and S3 storage client) talks to the moto server through :class:`FaultProxy`;
every check reads the moto server directly (no proxy), so "stored" means stored.

* Item 3: a completion marker that landed while every attempt of its PUT was answered
  with an error (the first reset after it was applied, the retries 500 after theirs met
  412) is a completed checkpoint: never also failed, its files kept, listed by the
  catalog and the CLI, and a restore from it is exact.
* Item 4: every PUT of the lease record delayed to 0.8 of ``max_write_s`` (the issue's
  8 s of 10 s), so that heartbeats run back to back and the lease's validity runs out
  while one is in flight: slow heartbeats that succeed never depose the holder. The
  lease's bounds are scaled down (``ttl_s`` 16 s instead of 30 s) to keep the test short;
  the old code's window without validity is 2 * put + heartbeat - (ttl - max_write)
  = 0.6 s of every 5.8 s here (1 s of every 13 s in the issue). The fixed code's margin
  (ttl - max_write, 10 s, against a beat every 5.8 s) outlasts a heartbeat thread
  starved of CPU on a loaded machine (at ``ttl_s`` 8 s, 5 s against 3.4 s, it did not
  once beside a mutation run, load ~12 on 2 cores).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.cli import main as cli_main
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.control.channel import ControlChannel
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.job import checkpointed_job as job_module
from airflow_ckpt.runtime.job.checkpointed_job import CheckpointedJob, JobResult
from airflow_ckpt.runtime.lease.holder import JobLease
from airflow_ckpt.runtime.lease.record import read_lease
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage.base import CheckpointStorage
from airflow_ckpt.runtime.storage.layout import JobLayout
from airflow_ckpt.testing import S3Endpoint
from airflow_ckpt.testing.faultproxy import Fault, FaultKind, FaultProxy, FaultSchedule
from airflow_ckpt.testing.numbers import (
    GroundTruth,
    checkpoint_state_problems,
    verify_output,
    write_numbers,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

K = FaultKind
JOB = "faulty"
OUT = "_out"
FILES = 4  # one batch per file




@pytest.fixture
def numbers(tmp_path: Path) -> tuple[Path, GroundTruth]:
    return tmp_path / "in", write_numbers(tmp_path / "in", files=FILES, per_file=40)


def _run(spark: Any, storage: CheckpointStorage, input_dir: Path, workdir: Path, *,
         config: dict[str, Any], restore: str = "latest", batch_pause_s: float = 0.0,
         trigger: dict[str, Any] | None = None) -> JobResult:
    """The odd/even sums job over ``input_dir`` (one file per batch), exactly once into
    the JSON-lines sink ``OUT``; returns how ``run`` ended."""
    from pyspark.sql import functions as F

    job = CheckpointedJob(spark, job=JOB, storage=storage, checkpoint_config=config,
                          restart_strategy={"type": "none"}, restore=restore,
                          workdir=workdir)
    write = job.exactly_once(JsonLinesSink(storage, OUT))

    def each_batch(df: Any, batch_id: int) -> None:
        write(df, batch_id)
        time.sleep(batch_pause_s)  # periodic checkpoints fall between the batches

    def build() -> Any:
        numbers = spark.readStream.option("maxFilesPerTrigger", 1).text(str(input_dir))
        n = F.col("value").cast("long")
        key = F.when(n % 2 == 0, "even").otherwise("odd")
        agg = numbers.groupBy(key.alias("key")).agg(F.count("*").alias("count"),
                                                    F.sum(n).alias("sum"))
        return (agg.writeStream.outputMode("update").foreachBatch(each_batch)
                .trigger(**(trigger or {"availableNow": True})))

    return job.run(build)


def _ids(direct: CheckpointStorage, kind: str) -> list[int]:
    return [int(e.data["id"]) for e in JobHistory(direct, JOB).events([kind])]


def _file_problems(direct: CheckpointStorage, checkpoint_id: int) -> list[str]:
    """Each file of the checkpoint's manifest read back from storage: its size and
    SHA-256 as the manifest records them."""
    manifest = CheckpointCatalog(direct, JOB).checkpoint(checkpoint_id)
    root = JobLayout(JOB).root
    problems = []
    for entry in manifest.files:  # an inline entry's bytes are in the manifest (issue 26)
        data = entry.data if entry.is_inline else direct.get_bytes(root + entry.key)
        if entry.offset is not None:
            data = data[entry.offset:entry.offset + entry.size]
        if (len(data), hashlib.sha256(data).hexdigest()) != (entry.size, entry.sha256):
            problems.append(entry.key)
    return problems


# ------------------------------------------------------------------ item 3

MARKER = r"/chk-2/_metadata$"
MARKER_ATTEMPTS = 3  # botocore's attempts per request, the first included


def test_a_marker_that_landed_under_errors_is_completed_and_restorable(
    spark: Any, proxy: FaultProxy, direct: CheckpointStorage, s3_uri: str,
    s3_endpoint: S3Endpoint, numbers: tuple[Path, GroundTruth], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Item 3: chk-2's ``_metadata`` PUT is applied and its answer lost (reset), and
    each retry is answered 500 after it met 412: every attempt ends in an error, yet
    the marker is stored. The checkpoint is completed and never failed; its files are
    all there (with tolerable-failed-checkpoints 1, 70007bc recorded it failed,
    released its shared files and left its ``_metadata``); the catalog and the CLI list
    it, and a second driver restoring it produces the exact output."""
    input_dir, truth = numbers
    config = {"execution.checkpointing.interval": "200 ms",
              "execution.checkpointing.incremental": True,
              "execution.checkpointing.num-retained": 100,  # chk-2 stays retained
              "execution.checkpointing.tolerable-failed-checkpoints": 1}
    proxy.script(Fault(K.RESET_AFTER, "PUT", MARKER),
                 Fault(K.ERROR_AFTER, "PUT", MARKER, count=MARKER_ATTEMPTS - 1))
    faulty = S3Endpoint(url=proxy.url).storage(s3_uri, max_attempts=MARKER_ATTEMPTS)
    try:
        result = _run(spark, faulty, input_dir, tmp_path / "w1", config=config,
                      batch_pause_s=0.15)
    finally:
        faulty.close()

    # every attempt of the marker's PUT met its fault, and the marker is stored
    assert proxy.pending_scripted() == []
    assert [i.kind for i in proxy.injected] == [K.RESET_AFTER, K.ERROR_AFTER, K.ERROR_AFTER]
    assert direct.exists(JobLayout(JOB).checkpoint_metadata(2))
    # completed, never also failed
    assert result.outcome == "finished"
    assert 2 in _ids(direct, ev.CHECKPOINT_COMPLETED)
    assert _ids(direct, ev.CHECKPOINT_FAILED) == []
    assert verify_output(JsonLinesSink(direct, OUT), truth, finished=True).problems == []
    # retained with every file (garbage collection kept them), listed and verified
    assert 2 in CheckpointCatalog(direct, JOB).checkpoint_ids()
    assert checkpoint_state_problems(direct, JOB) == []
    assert _file_problems(direct, 2) == []
    for name, value in s3_endpoint.env().items():
        monkeypatch.setenv(name, value)
    out = io.StringIO()
    assert cli_main(["--storage", s3_uri, "checkpoints", JOB, "--json"], out=out) == 0
    assert 2 in [row["id"] for row in json.loads(out.getvalue())]

    # a second driver restores chk-2: the batches after it are replayed and skipped
    result = _run(spark, direct, input_dir, tmp_path / "w2", config=config, restore="chk-2")
    assert result.outcome == "finished"
    restored = JobHistory(direct, JOB).events([ev.RESTORED])
    assert restored[-1].data["checkpoint_id"] == 2
    assert verify_output(JsonLinesSink(direct, OUT), truth, finished=True).problems == []


# ------------------------------------------------------------------ item 4

LEASE = {"ttl_s": 16.0, "heartbeat_s": 1.0, "max_write_s": 6.0}
#: every PUT of the lease record takes this long: 0.8 of max_write_s
LEASE_PUT_S = 4.8
#: slow heartbeats that must have succeeded before the job is stopped
BEATS = 3


def _when(condition: Callable[[], bool], then: Callable[[], object], done: threading.Event,
          timeout_s: float) -> threading.Thread:
    """A thread that calls ``then`` once ``condition`` holds (looked at every 0.2 s),
    or when ``timeout_s`` passed (liveness only: the test's assertions then fail);
    nothing if ``done`` is set first."""

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while not done.wait(0.2):
            if condition() or time.monotonic() > deadline:
                then()
                return

    thread = threading.Thread(target=watch, name="stop-when", daemon=True)
    thread.start()
    return thread


def test_slow_heartbeats_that_succeed_never_depose_the_holder(
    spark: Any, proxy: FaultProxy, direct: CheckpointStorage, s3_uri: str,
    numbers: tuple[Path, GroundTruth], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Item 4: every PUT of the lease record takes 4.8 s (max_write_s 6 s) while the
    driver checkpoints every 200 ms. Once ``BEATS`` slow heartbeats succeeded and the
    output is committed, the job is stopped with a savepoint: it stops as asked, never
    deposed (7ad662f^ raised LeaseExpiredError "no successful lease heartbeat")."""
    input_dir, truth = numbers
    monkeypatch.setattr(job_module, "JobLease", functools.partial(JobLease, **LEASE))
    proxy.set_schedule(FaultSchedule({K.LATENCY: 1.0}, method="PUT",
                                     target=r"/lease/\d+\.json$",
                                     latency_s=(LEASE_PUT_S, LEASE_PUT_S)))
    sink = JsonLinesSink(direct, OUT)
    requests: list[str] = []

    def beaten_and_committed() -> bool:
        record = read_lease(direct, JOB)
        return (record is not None and record.seq >= BEATS
                and sink.committed_batches() == list(range(FILES)))

    def stop() -> None:
        requests.append(ControlChannel(direct, JOB).request_savepoint(
            stop=True, timeout_s=120).request_id)

    done = threading.Event()
    watcher = _when(beaten_and_committed, stop, done, timeout_s=120)
    faulty = S3Endpoint(url=proxy.url).storage(s3_uri)
    try:
        result = _run(spark, faulty, input_dir, tmp_path / "w", config={
            "execution.checkpointing.interval": "200 ms",
            "execution.checkpointing.incremental": True,
        }, trigger={"processingTime": "100 milliseconds"})
    finally:
        done.set()
        watcher.join()
        faulty.close()

    assert result.outcome == "stopped"
    (request_id,) = requests
    answer = ControlChannel(direct, JOB).result(request_id)
    assert answer is not None and answer.status == "completed"
    assert JobHistory(direct, JOB).events([ev.JOB_FAILED]) == []
    record = read_lease(direct, JOB)
    assert record is not None and record.seq > BEATS and record.released
    slow = proxy.counts()[K.LATENCY]
    assert slow >= BEATS + 1  # the claim and every heartbeat were slow
    assert verify_output(sink, truth, finished=True).problems == []
