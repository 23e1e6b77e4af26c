"""Example checkpointed job: increasing numbers split into odd and even running sums.

The seeds' example. The source is Spark's file source over a directory of text files
(one integer per line): replayable, so a restore resets it to the checkpoint's
offsets. State is the running (count, sum) per parity, in Spark's state store
(HDFS-backed by default, ``--state-store rocksdb`` for RocksDB with changelog
checkpointing). ``--keyed`` switches to a keyed aggregation: counts and sums per
``n % 10``. ``--distinct`` instead writes every distinct input number once, with its
batch id (a ``dropDuplicates`` on ``n``: keyed state, and one output row per input row).
Output goes through an exactly-once two-phase-commit sink: JSON lines written by the
driver, or ``--sink parquet`` (``ParquetSink``: the executors write Parquet).

Run it under the Airflow operator, with spark-submit, or plainly with python:

    python spark_jobs/odd_even_sums.py --job demo --storage file:///tmp/ckpt \\
        --input /tmp/numbers --output file:///tmp/out

Fault injection for tests and the demo (Spark confs):
  spark.airflow_ckpt.demo.crash_after_batch=K  + crash_attempts=N : the driver
      kills itself (os._exit(17)) while processing batch K, on attempts <= N
  spark.airflow_ckpt.demo.fail_query_at_batch=K + fail_query_times=M : the query
      raises while processing batch K, the first M times in this driver
  spark.airflow_ckpt.demo.batch_delay_s=S : sleep S seconds in every batch
  spark.airflow_ckpt.demo.pause_at=<point>:<n> + paused_file=<path> : the n-th thread
      reaching the interleaving point (airflow_ckpt.runtime.interleave) writes <path>
      and blocks, for a test to kill the driver exactly there
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from pyspark.sql import functions as F

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
                      output_help="sink storage URI (default: <storage>/_output/<job>)")
    p.add_argument("--input", help="directory of input text files (default: spark conf)")
    p.add_argument("--files-per-batch", type=int, default=1)
    p.add_argument("--keyed", action="store_true", help="count and sum per n %% 10")
    p.add_argument("--distinct", action="store_true",
                   help="write every distinct input number once (n, batch) instead of sums")
    p.add_argument("--sink", choices=("jsonl", "parquet"), default="jsonl",
                   help="jsonl: JsonLinesSink (driver); parquet: ParquetSink (executors) "
                        "into the --output table directory")
    p.add_argument("--continuous", action="store_true",
                   help="keep running (processing-time trigger) instead of stopping when "
                        "the input is exhausted")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    spark = start_session("odd_even_sums", args)
    conf = spark.conf
    job = CheckpointedJob(spark, job=args.job, storage=args.storage)
    input_dir = args.input or conf.get(DEMO + "input")
    if not input_dir:
        raise SystemExit("no input directory: pass --input or set " + DEMO + "input")
    sink = exactly_once_sink(args.sink, args.output or conf.get(DEMO + "output", None), job)
    pause_at = conf.get(DEMO + "pause_at", None)
    if pause_at:  # tests only
        from pathlib import Path

        from airflow_ckpt.testing.numbers import install_pause

        paused_file = conf.get(DEMO + "paused_file", None)
        if not paused_file:
            raise SystemExit(f"{DEMO}pause_at needs {DEMO}paused_file")
        point, nth = pause_at.rsplit(":", 1)
        install_pause(point, int(nth), Path(paused_file))

    crash_after = int(conf.get(DEMO + "crash_after_batch", "-1"))
    crash_attempts = int(conf.get(DEMO + "crash_attempts", "0"))
    fail_at = int(conf.get(DEMO + "fail_query_at_batch", "-1"))
    fail_times = [int(conf.get(DEMO + "fail_query_times", "0"))]
    delay = float(conf.get(DEMO + "batch_delay_s", "0"))
    write = job.exactly_once(sink)

    def each_batch(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        if delay:
            time.sleep(delay)
        if args.distinct:
            df = df.withColumn("batch", F.lit(batch_id))
        write(df, batch_id)
        if batch_id == crash_after and job.attempt <= crash_attempts:
            logging.getLogger("demo").warning("fault injection: driver dies in batch %d", batch_id)
            os._exit(17)
        if batch_id == fail_at and fail_times[0] > 0:
            fail_times[0] -= 1
            raise RuntimeError(f"fault injection: query fails in batch {batch_id}")

    def build():  # type: ignore[no-untyped-def]
        numbers = (
            spark.readStream.option("maxFilesPerTrigger", args.files_per_batch)
            .text(input_dir)
            .select(F.col("value").cast("long").alias("n"))
            .where(F.col("n").isNotNull())
        )
        if args.distinct:
            writer = numbers.dropDuplicates(["n"]).writeStream.outputMode("append")
        else:
            parity = F.when(F.col("n") % 2 == 0, "even").otherwise("odd")
            key = (F.col("n") % 10).cast("string") if args.keyed else parity
            agg = numbers.groupBy(key.alias("key")).agg(
                F.count("*").alias("count"), F.sum("n").alias("sum")
            )
            writer = agg.writeStream.outputMode("update")
        writer = writer.foreachBatch(each_batch)
        if args.continuous:
            return writer.trigger(processingTime="1 second")
        return writer.trigger(availableNow=True)

    log_result("demo", job, job.run(build))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
