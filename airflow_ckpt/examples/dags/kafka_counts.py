"""Kafka example: a topic into running counts per key, exactly once into Parquet, until stopped.

The job is ``spark_jobs/kafka_counts.py``: Spark's Kafka source on ``topic`` (records:
key text, value an integer as text), running ``count`` and ``sum`` per key in Spark's
state store, written exactly once to the Parquet table ``output`` (``ParquetSink``), a
micro-batch every ``trigger_interval``. The task supervises the driver until a
stop-with-savepoint (``savepoint_manual`` with ``job_name=kafka-counts`` and
``stop=true``) ends it. The checkpoints' source positions are the topic's offsets per
partition (``airflow-ckpt checkpoint kafka-counts <id>`` shows them); a restore re-reads
from exactly there, and refuses when the topic's retention deleted records it needs
(docs/sinks.md, "Kafka").

The Spark Kafka connector is handed to spark-submit with ``packages`` (Spark resolves it
from Maven Central into ``~/.ivy2`` on first use); a cluster without Maven access passes
the jars instead (``jars=``, docs/install.md). ``make kafka`` starts a broker on
127.0.0.1:9092 to try it; the compose file has one as ``kafka:9092``.

Settings as for the other examples (``airflow-ckpt examples`` prints them), plus
``$AIRFLOW_CKPT_KAFKA`` (default ``127.0.0.1:9092``). The module does no I/O at import.
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Param
from pyspark import __version__ as installed_spark

from airflow_ckpt.examples.dag_params import (
    DEMO,
    SPARK_CONF,
    checkpoint_params,
    job_params,
    jobs_dir,
    restart_param,
    submit_args,
)
from airflow_ckpt.operators import CheckpointedSparkSubmitOperator

KAFKA = os.environ.get("AIRFLOW_CKPT_KAFKA", "127.0.0.1:9092")
#: the connector must be of the Spark version the driver runs (Scala 2.13): the installed
#: pyspark's (the Spark provider installs pyspark-client, of the same version)
SPARK_VERSION = os.environ.get("AIRFLOW_CKPT_SPARK_VERSION") or installed_spark

with DAG(
    dag_id="kafka_counts",
    description="Streams a Kafka topic with checkpoints into Parquet until stopped",
    schedule=None,
    catchup=False,
    max_active_runs=1,  # one run per job: a second trigger queues until the first ends
    tags=["airflow-ckpt", "example", "kafka"],
    render_template_as_native_obj=True,
    params={
        **job_params("kafka-counts"),
        "bootstrap_servers": Param(KAFKA, type="string", minLength=1),
        "topic": Param("numbers", type="string", minLength=1),
        "output": Param("file:///tmp/airflow-ckpt/tables/kafka-counts", type="string",
                        pattern=r"^(s3a?|file)://", description="the Parquet table directory"),
        "trigger_interval": Param("2 seconds", type="string", minLength=1),
        **checkpoint_params("5 s"),
        "restart_strategy": restart_param("5 s"),
    },
):
    CheckpointedSparkSubmitOperator(
        task_id="run_job",
        application=str(jobs_dir(__file__) / "kafka_counts.py"),
        application_args=["--trigger-interval", "{{ params.trigger_interval }}"],
        packages=f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",
        conf={
            DEMO + "bootstrap_servers": "{{ params.bootstrap_servers }}",
            DEMO + "topic": "{{ params.topic }}",
            DEMO + "output": "{{ params.output }}",
            **SPARK_CONF,
        },
        **submit_args(),
    )
