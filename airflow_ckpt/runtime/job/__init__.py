"""The checkpointed streaming job: the public entry point of the runtime."""

from airflow_ckpt.runtime.job.checkpointed_job import CheckpointedJob

__all__ = ["CheckpointedJob"]
