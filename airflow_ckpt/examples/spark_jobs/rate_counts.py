"""Streaming example: Spark's rate source, running counts per key, until it is stopped.

The main example (``airflow-ckpt examples``, DAG ``streaming_rate_counts``). The source
is Spark's ``rate`` source: ``rowsPerSecond`` rows a second, ``value`` counting up from 0
without gaps. It is replayable: its start time is in the checkpoint, so a restore resumes
at the checkpoint's offsets and the first batch after it catches up on the rows of the
time the job was down. Its values are elapsed seconds times the rate: restore with the
rate the job had, or values repeat (a lower rate) or are skipped (a higher one). State is
the running ``count``, ``sum`` and ``max`` of ``value`` per key ``value % 10`` (Spark's
state store); every micro-batch writes the keys it updated through the exactly-once
JSON-lines sink to ``<storage>/_output/<job>`` (or ``--output``). The trigger is a
processing-time trigger: the job runs until a stop-with-savepoint request
(``savepoint_manual`` with ``stop=true``) or a kill ends it.

Because the values have no gaps, every output row can be checked on its own: with no
row lost or counted twice, key ``k`` with maximum ``m`` has ``count = (m - k) // 10 + 1``
and ``sum = k + (k + 10) + ... + m`` (:func:`expected_row`).

Run it under the Airflow operator (its rate and trigger interval are the Spark confs
``spark.airflow_ckpt.demo.rows_per_second`` and ``...trigger_interval``), with
spark-submit, or plainly with python:

    python rate_counts.py --job rates --storage file:///tmp/ckpt --rows-per-second 20
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

KEYS = 10


def expected_row(key: int, last: int) -> dict[str, int]:
    """The row of key ``key`` once every value ``0..last`` was counted exactly once
    (``last % KEYS == key``)."""
    count = (last - key) // KEYS + 1
    return {"key": key, "count": count, "sum": count * (key + last) // 2, "max": last}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = job_arguments(__doc__,
                      output_help="sink storage URI (default: <storage>/_output/<job>)")
    p.add_argument("--rows-per-second", type=int,
                   help=f"rate of the source (default: {DEMO}rows_per_second, else 10)")
    p.add_argument("--trigger-interval",
                   help=f"processing-time trigger (default: {DEMO}trigger_interval, "
                        "else '2 seconds')")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    spark = start_session("rate_counts", args)
    from pyspark.sql import functions as F

    conf = spark.conf
    rows_per_second = args.rows_per_second or int(conf.get(DEMO + "rows_per_second", None) or 10)
    if rows_per_second < 1:
        raise SystemExit(f"the rate must be at least 1 row per second, not {rows_per_second}")
    interval = str(args.trigger_interval or conf.get(DEMO + "trigger_interval", None)
                   or "2 seconds")
    job = CheckpointedJob(spark, job=args.job, storage=args.storage)
    write = job.exactly_once(
        exactly_once_sink("jsonl", args.output or conf.get(DEMO + "output", None), job))

    def build() -> Any:
        values = (spark.readStream.format("rate")
                  .option("rowsPerSecond", rows_per_second).load()
                  .select("value"))
        counts = values.groupBy((F.col("value") % KEYS).cast("int").alias("key")).agg(
            F.count("*").alias("count"), F.sum("value").alias("sum"),
            F.max("value").alias("max"),
        )
        return (counts.writeStream.outputMode("update").foreachBatch(write)
                .trigger(processingTime=interval))

    logging.getLogger("rate_counts").info(
        "job %s: %d rows/s, trigger every %s, until stopped", job.job, rows_per_second, interval)
    log_result("rate_counts", job, job.run(build))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
