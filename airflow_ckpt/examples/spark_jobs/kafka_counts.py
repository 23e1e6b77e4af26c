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
import sys
from typing import Any

from airflow_ckpt.examples.job_setup import (
    DEMO,
    exactly_once_sink,
    job_arguments,
    log_result,
    start_session,
)
from airflow_ckpt.runtime.job import CheckpointedJob


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = job_arguments(__doc__, state_store=True,
                      output_help=f"the Parquet table directory (default: {DEMO}output); "
                                  "with --sink jsonl: <storage>/_output/<job>")
    p.add_argument("--bootstrap-servers", help=f"default: {DEMO}bootstrap_servers")
    p.add_argument("--topic", help=f"default: {DEMO}topic")
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
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    spark = start_session("kafka_counts", args)
    from pyspark.sql import functions as F

    conf = spark.conf
    servers = args.bootstrap_servers or conf.get(DEMO + "bootstrap_servers", None)
    topic = args.topic or conf.get(DEMO + "topic", None)
    if not servers or not topic:
        raise SystemExit("pass --bootstrap-servers and --topic (or set "
                         f"{DEMO}bootstrap_servers and {DEMO}topic)")
    job = CheckpointedJob(spark, job=args.job, storage=args.storage)
    write = job.exactly_once(
        exactly_once_sink(args.sink, args.output or conf.get(DEMO + "output", None), job))

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

    logging.getLogger("kafka_counts").info("job %s: topic %s at %s", job.job, topic, servers)
    log_result("kafka_counts", job, job.run(build))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
