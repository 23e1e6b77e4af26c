"""Benchmarks of the checkpoint runtime: ``python -m bench`` (or ``make bench``).

Every benchmark compares against a baseline measured in the same run, on the same
machine and the same input, and reports ratios (absolute times depend on the machine):

1. throughput overhead: the example query as a plain Spark query (its own
   ``checkpointLocation``, a plain ``foreachBatch``) vs. under ``CheckpointedJob``
   (1 s interval, incremental), on the local S3 endpoint;
2. incremental vs. full checkpoints: bytes uploaded and upload time;
3. sync-phase vs. async-phase cost and end-to-end duration per checkpoint, S3 vs. file.

Real local Spark (one SparkSession for every run) and a real S3 HTTP endpoint (moto on
127.0.0.1 in its own process, :func:`airflow_ckpt.testing.s3_server.s3_server_process`).

``python -m bench.scale`` is the realistic-scale suite (RocksDB state of millions of
keys, restore, the exactly-once Parquet sink); ``python -m bench history`` the history
suite.
"""
