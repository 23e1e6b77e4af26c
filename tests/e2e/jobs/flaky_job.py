"""A tiny real PySpark job that fails on its first N submissions (for supervisor tests).

It reads the supervisor's ``spark.airflow_ckpt.attempt`` conf and fails (an uncaught
Python exception, so a non-zero exit with a traceback) while the attempt is <=
``spark.test.fail_attempts``. Later attempts exit 0, after a small Spark computation
when ``spark.test.compute=true`` (the standalone-cluster test: it must reach an
executor). Reading the conf connects to spark-submit's JVM but starts no SparkContext,
so an attempt without the computation costs seconds.
"""

from __future__ import annotations

import sys

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession


def main() -> int:
    SparkContext._ensure_initialized()  # connect to spark-submit's gateway, no context yet
    conf = SparkConf()
    attempt = int(conf.get("spark.airflow_ckpt.attempt", "1"))
    fail_attempts = int(conf.get("spark.test.fail_attempts", "0"))
    print(f"flaky job: attempt {attempt}, failing attempts <= {fail_attempts}", flush=True)
    if attempt <= fail_attempts:
        raise RuntimeError(f"flaky job: injected failure on attempt {attempt}")
    if conf.get("spark.test.compute", "false") != "true":
        print("flaky job: done", flush=True)
        return 0
    spark = SparkSession.builder.getOrCreate()
    total = spark.range(1, 101).groupBy().sum("id").collect()[0][0]
    spark.stop()
    if total != 5050:
        raise AssertionError(f"sum of 1..100 is {total}")
    print("flaky job: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
