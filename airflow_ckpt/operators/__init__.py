"""Airflow operators: the checkpointed streaming job supervisor."""

from airflow_ckpt.operators.checkpointed_spark_submit import (
    CheckpointedJobConfigError,
    CheckpointedJobFailedError,
    CheckpointedSparkSubmitOperator,
)

__all__ = [
    "CheckpointedJobConfigError",
    "CheckpointedJobFailedError",
    "CheckpointedSparkSubmitOperator",
]
