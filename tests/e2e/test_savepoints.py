"""E2E: savepoints of a real running Spark job, taken by Airflow tasks.

Real parts only: the example numbers job runs as its own driver process (local Spark)
and checkpoints to the session's moto S3 endpoint; Airflow (``airflow dags test``,
SQLite, tests/fixtures/airflow_env.py) runs the example DAGs of dags/savepoint_examples.py.

1. ``savepoint_manual`` takes a savepoint of the running job: the task returns the
   savepoint's URI and the job keeps running (it processes input added afterwards);
2. ``airflow-ckpt state`` summarises that savepoint's state with Spark's state reader;
3. ``savepoint_manual`` with ``stop=true``: stop-with-savepoint ends the driver with
   exit code 0 and ``job_stopped`` in its history;
4. ``savepoint_restore`` starts a new job from the first savepoint (spark-submit through
   the supervisor operator); over the whole input its final result equals the ground
   truth, which holds only if the state and source offsets at the savepoint were
   restored exactly (the restored job reads only the input after the savepoint).
"""

from __future__ import annotations

import io
import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from airflow_ckpt.cli import main as cli_main
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.testing import S3Endpoint
from airflow_ckpt.testing.numbers import JobSpec, kill_hard, start_job, write_numbers
from tests.fixtures.airflow_env import AirflowEnv

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "dags" / "savepoint_examples.py"


def wait_until(predicate: object, timeout_s: float, what: str,
               proc: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():  # type: ignore[operator]
            return
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-4000:] if log else ""
            raise AssertionError(f"driver exited ({proc.returncode}) while waiting for {what}:"
                                 f"\n{tail}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def append_numbers(directory: Path, start: int, files: int, per_file: int) -> None:
    """More input, named apart from write_numbers' f*.txt, written atomically."""
    n = start
    for i in range(files):
        tmp = directory / f".g{i:05d}.tmp"
        tmp.write_text("".join(f"{v}\n" for v in range(n, n + per_file)))
        tmp.rename(directory / f"g{i:05d}.txt")
        n += per_file


def totals(first: int, last: int) -> dict[str, tuple[int, int]]:
    odd = [v for v in range(first, last + 1) if v % 2]
    even = [v for v in range(first, last + 1) if not v % 2]
    return {"odd": (len(odd), sum(odd)), "even": (len(even), sum(even))}


@pytest.fixture(scope="module")
def conn_env(s3_endpoint: S3Endpoint) -> dict[str, str]:
    return {"AIRFLOW_CONN_AWS_DEFAULT": s3_endpoint.airflow_connection()}


@pytest.mark.timeout(1800)  # three DAG runs, two Spark drivers: slow on a loaded 2-core box
def test_savepoints_of_a_running_spark_job(
    airflow_env: AirflowEnv, s3_endpoint: S3Endpoint, module_bucket: str, conn_env: dict[str, str],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in s3_endpoint.env().items():  # for the CLI run in this process
        monkeypatch.setenv(name, value)
    uri = f"s3://{module_bucket}/ckpt"
    storage: CheckpointStorage = s3_endpoint.storage(uri)
    job = f"numbers-{uuid.uuid4().hex[:6]}"
    catalog = CheckpointCatalog(storage, job)
    history = JobHistory(storage, job)
    inputs = tmp_path / "in"
    write_numbers(inputs, files=4, per_file=25)  # 1..100
    spec = JobSpec(
        job=job, storage_uri=uri, input_dir=inputs, output_uri=f"{uri}/_output/{job}",
        checkpoint_config={"execution.checkpointing.interval": "1 s",
                           "execution.checkpointing.num-retained": 2},
        extra_args=["--continuous"], workdir=tmp_path / "driver",
    )
    log = tmp_path / "driver.log"
    proc = start_job(spec, s3_endpoint.env(), log, restore="none")
    try:
        # the job is up and has processed the first input
        wait_until(lambda: history.last(ev.JOB_STARTED) is not None and catalog.checkpoint_ids(),
                   180, "the job's first checkpoint", proc, log)
        wait_until(lambda: (m := catalog.latest_checkpoint()) is not None and m.batch_id >= 3,
                   120, "the first 4 files to be processed", proc, log)

        # 1. a savepoint as an Airflow task; the job keeps running
        first = airflow_env.dags_test(
            EXAMPLES, "savepoint_manual",
            {"job_name": job, "storage": uri, "stop": False, "savepoint_id": "before-more"},
            extra_env=conn_env)
        assert first.state == "success", first.explain()
        sp1 = f"{uri}/{job}/savepoints/sp-before-more"
        assert first.xcom["savepoint"] == sp1
        assert first.xcom["report"] == sp1
        manifest = catalog.savepoint("before-more")
        assert (manifest.kind, manifest.trigger) == ("savepoint", "manual")
        assert not any(f.shared for f in manifest.files)  # self-contained
        assert all(f.key.startswith("savepoints/sp-before-more/") for f in manifest.files
                   if not f.is_inline)  # small files travel inside _metadata (issue 26)
        assert proc.poll() is None, "the job stopped after a plain savepoint"
        completed = history.events([ev.SAVEPOINT_COMPLETED])
        assert completed, "no savepoint_completed event"

        append_numbers(inputs, start=101, files=4, per_file=25)  # 101..200
        wait_until(lambda: (m := catalog.latest_checkpoint()) is not None
                   and m.batch_id > manifest.batch_id + 3,
                   120, "the job to process input added after the savepoint", proc, log)

        # 2. the admin CLI reads the savepoint's state with Spark's state data source
        out = io.StringIO()
        assert cli_main(["--storage", uri, "--endpoint-url", s3_endpoint.url,
                         "state", sp1, "--json"], out=out) == 0
        state = json.loads(out.getvalue())
        assert state["batch_id"] == manifest.batch_id
        [store] = state["stores"]
        assert "error" not in store, store
        assert store["rows"] == 2  # the keys "odd" and "even"
        assert store["partitions"] == len(store["rows_per_partition"]) == 4

        # 3. stop-with-savepoint: the driver ends cleanly
        second = airflow_env.dags_test(
            EXAMPLES, "savepoint_manual",
            {"job_name": job, "storage": uri, "stop": True, "savepoint_id": "final"},
            extra_env=conn_env)
        assert second.state == "success", second.explain()
        assert second.xcom["savepoint"] == f"{uri}/{job}/savepoints/sp-final"
        assert proc.wait(timeout=120) == 0, log.read_text()[-4000:]
        stopped = history.last(ev.JOB_STOPPED)
        assert stopped is not None and stopped.data.get("savepoint") == second.xcom["savepoint"]
        assert catalog.savepoint("final").trigger == "stop"

        # a savepoint of a stopped job fails clearly, without writing a request
        late = airflow_env.dags_test(
            EXAMPLES, "savepoint_manual", {"job_name": job, "storage": uri, "stop": False},
            extra_env=conn_env)
        assert late.task_states["savepoint"] == "failed"
        assert f"job '{job}' is not running (last event: job_stopped at" in late.log
    finally:
        if proc.poll() is None:
            kill_hard(proc)

    # 4. restore a new job from the first savepoint (supervisor operator, spark-submit)
    restored = f"{job}-restored"
    run = airflow_env.dags_test(
        EXAMPLES, "savepoint_restore",
        {"savepoint": sp1, "job_name": restored, "storage": uri, "input_dir": str(inputs),
         "master": "local[2]"},
        extra_env=conn_env)
    assert run.state == "success", run.explain()
    [restore_event] = JobHistory(storage, restored).events([ev.RESTORED])
    assert restore_event.data["path"] == sp1 and restore_event.data["from_job"] == job
    final: dict[str, tuple[int, int]] = {}
    for row in JsonLinesSink(storage, f"_output/{restored}").committed_rows():
        final[str(row["key"])] = (int(row["count"]), int(row["sum"]))
    assert final == totals(1, 200)
    storage.close()
