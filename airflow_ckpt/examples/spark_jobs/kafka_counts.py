"""Kafka example: a topic, running count and sum per record key in Spark state, exactly once.

The source is a Kafka topic (Spark's ``kafka`` source, the connector
``spark-sql-kafka-0-10_2.13`` of the same Spark version on the class path: docs/install.md).
Each record's key is a string, its value an integer as text. State is the running
``count`` and ``sum`` of the values per key (Spark's state store); every micro-batch
writes the keys it updated, exactly once, to a Parquet table (``ParquetSink``, the
executors write; plain Parquet readers see every committed row once), or with
``--sink jsonl`` as JSON lines written by the driver. The Kafka offsets are the
checkpoint's source positions: a restore, of the latest checkpoint, an older one or a
savepoint, re-reads the topic from exactly those offsets. Records the topic's retention
deleted since are refused before the query starts (docs/sinks.md, "Kafka").

By default it streams until stopped (a processing-time trigger: stop it with a
savepoint); ``--available-now`` reads what the topic holds and finishes.

    python kafka_counts.py --job clicks --storage file:///tmp/ckpt \\
        --bootstrap-servers 127.0.0.1:9092 --topic clicks --output file:///tmp/clicks-table

Settings may also come from the Spark confs ``spark.airflow_ckpt.demo.bootstrap_servers``,
``...topic`` and ``...output`` (how the example DAG ``kafka_counts`` passes them).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from airflow_ckpt.runtime import sparkconf
from airflow_ckpt.runtime.job import CheckpointedJob
from airflow_ckpt.runtime.sinks import JsonLinesSink, ParquetSink, TwoPhaseCommitSink
from airflow_ckpt.runtime.storage import open_storage

DEMO = sparkconf.CONF_PREFIX + "demo."
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--job", help="job name (default: spark.airflow_ckpt.job)")
    p.add_argument("--storage", help="checkpoint storage URI (default: spark conf)")
    p.add_argument("--bootstrap-servers", help=f"default: {DEMO}bootstrap_servers")
    p.add_argument("--topic", help=f"default: {DEMO}topic")
    p.add_argument("--output", help=f"the Parquet table directory (default: {DEMO}output); "
                                    "with --sink jsonl: <storage>/_output/<job>")
    p.add_argument("--sink", choices=("parquet", "jsonl"), default="parquet")
    p.add_argument("--starting-offsets", default="earliest",
                   help="where a first run (nothing restored) starts: earliest or latest")
    p.add_argument("--max-offsets-per-trigger", type=int, default=1000)
    p.add_argument("--fail-on-data-loss", choices=("true", "false"), default="true",
                   help="Spark's failOnDataLoss: false makes a restore past retention go on "
                        "(the lost ranges are recorded in the job's history)")
    p.add_argument("--available-now", action="store_true",
                   help="read what the topic holds, then finish (default: until stopped)")
    p.add_argument("--trigger-interval", default="2 seconds")
    p.add_argument("--state-store", choices=("hdfs", "rocksdb"), default="hdfs")
    p.add_argument("--master", help="Spark master when run with python (default local[2])")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    builder = SparkSession.builder.appName("kafka_counts")
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # run with python, not spark-submit
        builder = builder.master(args.master or "local[2]")
    spark = (
        builder.config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if args.state_store == "rocksdb":
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    conf = spark.conf
    servers = args.bootstrap_servers or conf.get(DEMO + "bootstrap_servers", None)
    topic = args.topic or conf.get(DEMO + "topic", None)
    if not servers or not topic:
        raise SystemExit("pass --bootstrap-servers and --topic (or set "
                         f"{DEMO}bootstrap_servers and {DEMO}topic)")
    job = CheckpointedJob(spark, job=args.job, storage=args.storage)
    output = args.output or conf.get(DEMO + "output", None)
    sink: TwoPhaseCommitSink
    if args.sink == "parquet":
        if not output:
            raise SystemExit("the Parquet sink needs --output (the table directory)")
        sink = ParquetSink(output)
    else:
        sink = JsonLinesSink(open_storage(output) if output else job.storage,
                             "" if output else f"_output/{job.job}")
    write = job.exactly_once(sink)

    def each_batch(df: Any, batch_id: int) -> None:
        # the batch id orders a key's rows for plain readers: its last row is its total
        write(df.withColumn("batch", F.lit(batch_id)), batch_id)

    def build() -> Any:
        records = (spark.readStream.format("kafka")
                   .option("kafka.bootstrap.servers", servers)
                   .option("subscribe", topic)
                   .option("startingOffsets", args.starting_offsets)
                   .option("maxOffsetsPerTrigger", args.max_offsets_per_trigger)
                   .option("failOnDataLoss", args.fail_on_data_loss)
                   .load())
        counts = (records.select(F.col("key").cast("string").alias("key"),
                                 F.col("value").cast("string").cast("long").alias("n"))
                  .groupBy("key")
                  .agg(F.count("*").alias("count"), F.sum("n").alias("sum")))
        writer = counts.writeStream.outputMode("update").foreachBatch(each_batch)
        if args.available_now:
            return writer.trigger(availableNow=True)
        return writer.trigger(processingTime=args.trigger_interval)

    log = logging.getLogger("kafka_counts")
    log.info("job %s: topic %s at %s", job.job, topic, servers)
    result = job.run(build)
    log.info("job %s %s; last checkpoint %s; savepoint %s", job.job, result.outcome,
             result.last_checkpoint.checkpoint_id if result.last_checkpoint else None,
             result.savepoint_path)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
