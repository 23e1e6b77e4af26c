"""E2E, the README's "Use it from Airflow" against the installed wheel (issue 18's acceptance).

Nothing of the repository is used but the wheel built from it (tests/fixtures/wheel.py):
``pip wheel`` of a copy of the sources, installed with ``pip install --no-deps`` into a
fresh virtualenv whose dependencies (Airflow, pyspark, boto3) come from this
interpreter's site-packages through a ``.pth`` file, so nothing is downloaded. Every
command runs from an empty directory with that virtualenv's interpreter and without
``PYTHONPATH``; Airflow is real (SQLite, ``airflow dags test``), Spark is real
(``spark-submit`` of pyspark, local mode) and the storage is the session's moto S3
server, reached only through what the walkthrough sets.

The walkthrough, step by step, each outcome checked in the storage:

1. ``airflow-ckpt examples <dags>`` with a bucket that does not exist fails clearly and
   copies nothing; with ``--create-bucket`` it creates the bucket, copies the DAGs and the
   Spark jobs and prints the settings, which become the Airflow environment (plus the
   AWS credentials a user has in theirs);
2. ``airflow db migrate``; ``airflow dags test streaming_rate_counts`` starts the
   streaming job (it runs until stopped): checkpoints complete;
3. ``airflow dags test savepoint_manual``: a savepoint; the job keeps running;
4. ``... savepoint_manual -c '{"stop": true}'``: stop-with-savepoint; the streaming run
   ends successfully;
5. ``airflow dags test streaming_rate_counts -c '{"restore": <savepoint>}'``: the job
   restarts from the savepoint, continues the source where it stopped and carries its
   state on (every output row, before and after, counts each value exactly once); a last
   stop-with-savepoint ends it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_ckpt.examples.spark_jobs.rate_counts import expected_row
from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.sinks import JsonLinesSink
from airflow_ckpt.runtime.storage import CheckpointStorage
from airflow_ckpt.testing import S3Endpoint
from tests.fixtures.wheel import (
    Deployment,
    apply_exports,
    ended_at_exit,
    stopped,
    wait_until,
)

pytestmark = pytest.mark.e2e

JOB = "rate-counts"  # the main example's default job name
#: rows a second, the same before and after the restore: Spark's rate source numbers its
#: rows by elapsed seconds x rate (another rate would repeat or skip values; the
#: restore assertions fail then)
RATE = 20


def rows_by_batch(storage: CheckpointStorage) -> dict[int, list[dict[str, Any]]]:
    """The example's committed output rows, per micro-batch."""
    sink = JsonLinesSink(storage, f"_output/{JOB}")
    return {batch: [json.loads(line) for line in
                    storage.get_bytes(sink.part_key(batch)).decode().splitlines() if line]
            for batch in sink.committed_batches()}


@pytest.mark.timeout(1500)  # two Spark drivers, five Airflow runs: slow on a loaded 2-core box
def test_readme_walkthrough_from_the_wheel(
    deployment: Deployment, s3_endpoint: S3Endpoint, tmp_path: Path,
) -> None:
    d = deployment
    # the wheel's package, not the repository's
    probe = d.run(d.python, "-c", "import airflow_ckpt; print(airflow_ckpt.__file__)")
    assert probe.stdout.strip().startswith(str(d.venv)), probe.stdout + probe.stderr
    # the user's own AWS credentials; the endpoint only through what `examples` prints
    d.env.update({"AWS_ACCESS_KEY_ID": s3_endpoint.access_key_id,
                  "AWS_SECRET_ACCESS_KEY": s3_endpoint.secret_access_key})
    bucket = f"examples-{uuid.uuid4().hex[:8]}"
    uri = f"s3://{bucket}/checkpoints"
    dags = Path(d.env["AIRFLOW_HOME"]) / "dags"
    examples = [str(d.venv / "bin" / "airflow-ckpt"), "--storage", uri,
                "--endpoint-url", s3_endpoint.url, "examples", str(dags)]

    # 1. the bucket does not exist: a clear error, nothing copied
    refused = d.run(*examples)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"bucket {bucket!r} does not exist" in refused.stderr
    assert "pass --create-bucket to create it" in refused.stderr
    assert not dags.exists()
    made = d.run(*examples, "--create-bucket")
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"created bucket {bucket!r}" in made.stdout
    [shipped] = d.venv.glob("lib/python*/site-packages/airflow_ckpt/examples")
    for name in ("streaming_rate_counts.py", "savepoint_examples.py"):
        assert (dags / name).read_bytes() == (shipped / "dags" / name).read_bytes()
    assert (dags.parent / "spark_jobs" / "rate_counts.py").is_file()
    exports = apply_exports(d, made.stdout)
    assert set(exports) == {"AIRFLOW_CKPT_STORAGE", "AIRFLOW_CKPT_JOBS_DIR",
                            "AIRFLOW_CONN_AWS_DEFAULT"}, made.stdout
    assert d.env["AIRFLOW_CKPT_STORAGE"] == uri
    again = d.run(*examples)  # the same files again: nothing to replace, the bucket exists
    assert again.returncode == 0 and "unchanged" in again.stdout, again.stdout + again.stderr

    storage = s3_endpoint.storage(uri)
    catalog = CheckpointCatalog(storage, JOB)
    history = JobHistory(storage, JOB)
    migrate = d.airflow("db", "migrate")
    assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]

    # 2. the streaming job starts and checkpoints
    log = tmp_path / "stream.log"
    stream = d.start_airflow(log, "dags", "test", "streaming_rate_counts",
                             "-c", json.dumps({"rows_per_second": RATE}))
    restored_log = tmp_path / "restored.log"
    with ended_at_exit(stream):
        wait_until(lambda: catalog.checkpoint_ids(), 300, "a completed checkpoint", stream, log)
        listing = d.run(str(d.venv / "bin" / "airflow-ckpt"), "--conn-id", "aws_default",
                        "checkpoints", JOB, "--json")
        assert listing.returncode == 0, listing.stderr
        assert json.loads(listing.stdout), listing.stdout

        # 3. a savepoint; the job keeps running
        first = d.airflow("dags", "test", "savepoint_manual",
                          "-c", json.dumps({"savepoint_id": "first"}))
        assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
        manifest = catalog.savepoint("first")
        assert (manifest.kind, manifest.trigger) == ("savepoint", "manual")
        wait_until(lambda: (m := catalog.latest_checkpoint()) is not None
                   and m.batch_id > manifest.batch_id, 120,
                   "a checkpoint after the savepoint", stream, log)

        # 4. stop-with-savepoint: the streaming run ends successfully
        stop = d.airflow("dags", "test", "savepoint_manual",
                         "-c", json.dumps({"stop": True, "savepoint_id": "final"}))
        assert stop.returncode == 0, stop.stdout[-4000:] + stop.stderr[-4000:]
        assert stopped(stream, log) == 0, log.read_text(errors="replace")[-6000:]
    final = catalog.savepoint("final")
    final_uri = f"{uri}/{JOB}/savepoints/sp-final"
    assert final.trigger == "stop"
    event = history.last(ev.JOB_STOPPED)
    assert event is not None and event.data.get("savepoint") == final_uri
    before = rows_by_batch(storage)
    assert before and max(before) == final.batch_id  # the final savepoint committed all
    last_before = {row["key"]: row["max"] for rows in before.values() for row in rows}
    assert sorted(last_before) == list(range(10))

    # 5. restore from the savepoint: state and source position carry on
    restored = d.start_airflow(restored_log, "dags", "test", "streaming_rate_counts",
                               "-c", json.dumps({"restore": final_uri,
                                                 "rows_per_second": RATE}))
    with ended_at_exit(restored):
        wait_until(lambda: (m := catalog.latest_checkpoint()) is not None
                   and m.batch_id > final.batch_id, 300,
                   "checkpoints of the restored job", restored, restored_log)
        stop = d.airflow("dags", "test", "savepoint_manual",
                         "-c", json.dumps({"stop": True, "savepoint_id": "after-restore"}))
        assert stop.returncode == 0, stop.stdout[-4000:] + stop.stderr[-4000:]
        assert stopped(restored, restored_log) == 0
    [restore] = history.events([ev.RESTORED])
    assert restore.data["path"] == final_uri
    after = {b: rows for b, rows in rows_by_batch(storage).items() if b > final.batch_id}
    assert after, "the restored job committed no output"
    # the source went on where it stopped: every value after the savepoint is newer
    assert all(row["max"] > last_before[row["key"]] for rows in after.values() for row in rows)
    # ... and every row, before and after, counts each value 0..max exactly once: the
    # state came back whole (a fresh state with a restored source fails this)
    for rows in (*before.values(), *after.values()):
        for row in rows:
            assert row == expected_row(row["key"], row["max"]), row
    storage.close()
