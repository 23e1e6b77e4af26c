"""What the example Spark jobs (``spark_jobs/``) share: their common arguments, their
Spark session, their exactly-once sink and their last log line.

A job imports it from the installed package (as the DAGs import
:mod:`airflow_ckpt.examples.dag_params`), so a job file copied by ``airflow-ckpt
examples`` or handed to ``spark-submit`` needs nothing beside it.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING

from airflow_ckpt.runtime import sparkconf
from airflow_ckpt.runtime.sinks import JsonLinesSink, ParquetSink, TwoPhaseCommitSink
from airflow_ckpt.runtime.storage import open_storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_ckpt.runtime.job import CheckpointedJob
    from airflow_ckpt.runtime.job.ending import JobResult

#: the prefix of the examples' own Spark confs (``spark.airflow_ckpt.demo.*``)
DEMO = sparkconf.CONF_PREFIX + "demo."
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def job_arguments(doc: str | None, *, output_help: str,
                  state_store: bool = False) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first line with the arguments every example
    takes: ``--job``, ``--storage``, ``--output`` (``output_help``), ``--master`` and,
    with ``state_store``, ``--state-store hdfs|rocksdb``. The job adds its own."""
    p = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    p.add_argument("--job", help="job name (default: spark.airflow_ckpt.job)")
    p.add_argument("--storage", help="checkpoint storage URI (default: spark conf)")
    p.add_argument("--output", help=output_help)
    p.add_argument("--master", help="Spark master when run with python (default local[2])")
    if state_store:
        p.add_argument("--state-store", choices=("hdfs", "rocksdb"), default="hdfs")
    return p


def start_session(app: str, args: argparse.Namespace) -> SparkSession:
    """Logging to stderr at INFO, and the job's Spark session: under ``spark-submit``
    the one it configured; run with ``python``, a local one (``--master``, default
    ``local[2]``). Four shuffle partitions, no UI; ``--state-store rocksdb``: RocksDB
    with changelog checkpointing."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # run with python, not spark-submit
        builder = builder.master(args.master or "local[2]")
    spark = (
        builder.config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if getattr(args, "state_store", "hdfs") == "rocksdb":
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        spark.conf.set(
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true"
        )
    return spark


def exactly_once_sink(kind: str, output: str | None, job: CheckpointedJob
                      ) -> TwoPhaseCommitSink:
    """``parquet``: a ``ParquetSink`` into the table directory ``output`` (required);
    ``jsonl``: a ``JsonLinesSink`` into the storage ``output``, by default
    ``<storage>/_output/<job>``."""
    if kind == "parquet":
        if not output:
            raise SystemExit("--sink parquet needs --output (the table directory)")
        return ParquetSink(output)
    return JsonLinesSink(open_storage(output) if output else job.storage,
                         "" if output else f"_output/{job.job}")


def log_result(app: str, job: CheckpointedJob, result: JobResult) -> None:
    """The job's last log line: how it ended, its last checkpoint and savepoint."""
    logging.getLogger(app).info(
        "job %s %s; last checkpoint %s; savepoint %s", job.job, result.outcome,
        result.last_checkpoint.checkpoint_id if result.last_checkpoint else None,
        result.savepoint_path)
