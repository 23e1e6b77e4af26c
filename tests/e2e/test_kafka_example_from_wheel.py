"""E2E, the Kafka example from the installed wheel in a real Airflow (issue 29's acceptance).

The same deployment as test_examples_from_wheel.py (tests/fixtures/wheel.py: the wheel in
a fresh virtualenv, nothing of the repository), a real KRaft broker
(tests/fixtures/kafka.py) and the session's S3 server. The DAG ``kafka_counts`` hands
the connector to ``spark-submit`` with ``packages=`` as it ships; Spark resolves it
through Ivy from the local Maven repository that ``make jars`` filled (and Maven
Central for what is not there), its Ivy cache under
``~/.cache/airflow-ckpt/ivy/<pyspark version>`` (``spark.jars.ivy`` in a
``spark-defaults.conf`` of ``SPARK_CONF_DIR``, as a cluster sets it).

1. ``airflow-ckpt examples`` (creating the bucket), its settings and
   ``$AIRFLOW_CKPT_KAFKA`` in the environment; ``airflow db migrate``;
2. ``airflow dags test kafka_counts`` streams a 3-partition topic into a Parquet table:
   a checkpoint reaches the end of all 400 records produced;
3. ``savepoint_manual`` takes a savepoint (the job goes on), 400 more records are read
   and checkpointed, then stop-with-savepoint ends the run successfully;
4. 400 more records are produced while it is down; the DAG restores the final
   savepoint, reads exactly from its offsets to the end, and a last stop-with-savepoint
   ends it.

The ground truth is what was produced: per key, the last committed row's (count, sum)
equals it, every batch id is committed once, and each key's count only grows.

Marked ``soak`` (a wheel build, two Spark drivers resolving the connector, five
Airflow runs: 801 s on 2 cores at load average ~20): ``make kafka-e2e`` runs it.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark import __version__ as spark_version

from airflow_ckpt.runtime.checkpoint.catalog import CheckpointCatalog
from airflow_ckpt.runtime.history import events as ev
from airflow_ckpt.runtime.history.journal import JobHistory
from airflow_ckpt.runtime.sinks import ParquetSink
from airflow_ckpt.testing import S3Endpoint
from airflow_ckpt.testing.jars import cache_root
from airflow_ckpt.testing.kafka_broker import KafkaBroker, end_offsets, produce_numbers
from tests.fixtures.wheel import Deployment, apply_exports, ended_at_exit, stopped, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.soak]

JOB = "kafka-counts"  # the DAG's default job name
PARTITIONS = 3


def final_rows(table: Path) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """Per key, the (count, sum) of its row in the newest batch; and what contradicts a
    run that counted each record once (a key's count not growing from batch to batch)."""
    rows = sorted(pq.read_table(table).to_pylist(), key=lambda r: (r["key"], r["batch"]))
    final: dict[str, tuple[int, int]] = {}
    problems = []
    for row in rows:
        before = final.get(row["key"])
        if before is not None and row["count"] <= before[0]:
            problems.append(f"count of {row['key']!r} went from {before[0]} to {row['count']}")
        final[row["key"]] = (int(row["count"]), int(row["sum"]))
    return final, problems


@pytest.mark.timeout(2400)
def test_kafka_example_from_the_wheel_savepoint_stop_and_restore(
    deployment: Deployment, kafka_broker: KafkaBroker, kafka_topic: Callable[..., str],
    s3_endpoint: S3Endpoint, tmp_path: Path,
) -> None:
    d = deployment
    d.env.update({"AWS_ACCESS_KEY_ID": s3_endpoint.access_key_id,
                  "AWS_SECRET_ACCESS_KEY": s3_endpoint.secret_access_key,
                  "AIRFLOW_CKPT_KAFKA": kafka_broker.bootstrap})
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    ivy = cache_root().parent / "ivy" / str(spark_version)
    (conf_dir / "spark-defaults.conf").write_text(f"spark.jars.ivy {ivy}\n")
    d.env["SPARK_CONF_DIR"] = str(conf_dir)
    uri = f"s3://kafka-{uuid.uuid4().hex[:8]}/checkpoints"
    dags = Path(d.env["AIRFLOW_HOME"]) / "dags"
    made = d.run(str(d.venv / "bin" / "airflow-ckpt"), "--storage", uri, "--endpoint-url",
                 s3_endpoint.url, "examples", str(dags), "--create-bucket")
    assert made.returncode == 0, made.stdout + made.stderr
    assert (dags / "kafka_counts.py").is_file()
    assert (dags.parent / "spark_jobs" / "kafka_counts.py").is_file()
    apply_exports(d, made.stdout)
    migrate = d.airflow("db", "migrate")
    assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]

    bootstrap = kafka_broker.bootstrap
    topic = kafka_topic(PARTITIONS)
    truth = produce_numbers(bootstrap, topic, 400, partitions=PARTITIONS)
    table = tmp_path / "table"
    params = {"topic": topic, "output": table.as_uri(), "trigger_interval": "1 second",
              "checkpoint_interval": "2 s"}
    storage = s3_endpoint.storage(uri)
    catalog = CheckpointCatalog(storage, JOB)

    def read_to_end(proc: subprocess.Popen[bytes], log: Path) -> None:
        ends = end_offsets(bootstrap, topic)
        wait_until(lambda: (m := catalog.latest_checkpoint()) is not None
                   and m.source_offsets == [{topic: ends}], 900,
                   f"a checkpoint at the topic's end {ends}", proc, log)

    def savepoint(savepoint_id: str, *, stop: bool) -> None:
        done = d.airflow("dags", "test", "savepoint_manual", "-c", json.dumps(
            {"job_name": JOB, "savepoint_id": savepoint_id, "stop": stop}))
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    # 2. the streaming job reads the topic to its end
    log = tmp_path / "stream.log"
    stream = d.start_airflow(log, "dags", "test", "kafka_counts", "-c", json.dumps(params))
    with ended_at_exit(stream):
        read_to_end(stream, log)
        # 3. a savepoint, more records, stop-with-savepoint
        savepoint("first", stop=False)
        assert catalog.savepoint("first").kind == "savepoint"
        truth = truth.plus(produce_numbers(bootstrap, topic, 400, partitions=PARTITIONS,
                                           start=401))
        read_to_end(stream, log)
        savepoint("final", stop=True)
        assert stopped(stream, log) == 0, log.read_text(errors="replace")[-6000:]
    final = catalog.savepoint("final")
    assert final.trigger == "stop"
    final_uri = f"{uri}/{JOB}/savepoints/sp-final"
    sink = ParquetSink(table.as_uri())
    assert sink.committed_batches() == list(range(final.batch_id + 1))
    assert final_rows(table) == (truth.totals, [])

    # 4. records produced while it is down; restore the final savepoint
    truth = truth.plus(produce_numbers(bootstrap, topic, 400, partitions=PARTITIONS,
                                       start=801))
    restored_log = tmp_path / "restored.log"
    restored = d.start_airflow(restored_log, "dags", "test", "kafka_counts", "-c",
                               json.dumps({**params, "restore": final_uri}))
    with ended_at_exit(restored):
        read_to_end(restored, restored_log)
        savepoint("after-restore", stop=True)
        assert stopped(restored, restored_log) == 0
    [restore] = JobHistory(storage, JOB).events([ev.RESTORED])
    assert restore.data["path"] == final_uri
    batches = sink.committed_batches()
    assert batches == list(range(len(batches))) and batches[-1] > final.batch_id
    assert final_rows(table) == (truth.totals, [])
    assert truth.numbers == 1200
    storage.close()
