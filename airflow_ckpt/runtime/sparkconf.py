"""The ``spark.airflow_ckpt.*`` Spark conf keys: how the Airflow operator configures a job.

The supervisor passes these with ``--conf``; a job can also set them itself. Secrets
are never passed as Spark conf (it shows in the Spark UI): S3 credentials travel in
the standard AWS environment variables.
"""

from __future__ import annotations

CONF_PREFIX = "spark.airflow_ckpt."

JOB = CONF_PREFIX + "job"  # job name (storage namespace)
STORAGE = CONF_PREFIX + "storage"  # s3://bucket/prefix or file:///path
ENDPOINT_URL = CONF_PREFIX + "storage.endpoint_url"  # S3-compatible endpoint
REGION_NAME = CONF_PREFIX + "storage.region_name"
CHECKPOINT_CONFIG = CONF_PREFIX + "checkpoint_config"  # JSON object, Flink option names
RESTART_STRATEGY = CONF_PREFIX + "restart_strategy"  # JSON object, Flink option names
RESTORE = CONF_PREFIX + "restore"  # latest | none | <checkpoint or savepoint path>
WORKDIR = CONF_PREFIX + "workdir"  # local working directory (Spark checkpointLocation)
RESCALE_PARTITIONS = CONF_PREFIX + "restore.state_partitions"  # rescale on restore
ATTEMPT = CONF_PREFIX + "attempt"  # supervisor's submission attempt number (for logs)
RUN_ID = CONF_PREFIX + "run_id"  # supervisor run: restart-strategy state is scoped to it
