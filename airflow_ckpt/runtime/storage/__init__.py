"""Checkpoint storage: one interface, an S3-compatible and a local filesystem backend."""

from airflow_ckpt.runtime.storage.base import CheckpointStorage, ObjectInfo
from airflow_ckpt.runtime.storage.factory import open_storage

__all__ = ["CheckpointStorage", "ObjectInfo", "open_storage"]
