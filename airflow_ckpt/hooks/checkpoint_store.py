"""CheckpointStoreHook: an Airflow connection (``aws`` style) -> checkpoint storage.

The connection is the one users already have for S3: login = access key id,
password = secret access key, extra ``endpoint_url`` and ``region_name``. A missing
connection falls back to the standard AWS environment (so ``aws_default`` need not
exist on a machine with ``AWS_*`` variables or an instance profile).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from airflow_ckpt.runtime.catalog import CheckpointCatalog
from airflow_ckpt.runtime.control import ControlChannel
from airflow_ckpt.runtime.history import JobHistory
from airflow_ckpt.runtime.storage import CheckpointStorage, open_storage


class CheckpointStoreHook(BaseHook):
    """Reads (and, for control requests and savepoint disposal, writes) the storage contract.

    :param storage_uri: ``s3://bucket/prefix`` or ``file:///path``
    :param conn_id: an ``aws``-type connection; ``aws_default`` by default
    """

    conn_name_attr = "conn_id"
    default_conn_name = "aws_default"
    conn_type = "aws"
    hook_name = "Checkpoint store (S3-compatible)"

    def __init__(self, storage_uri: str, conn_id: str | None = default_conn_name) -> None:
        super().__init__()
        self.storage_uri = storage_uri
        self.conn_id = conn_id

    def storage_options(self) -> dict[str, Any]:
        """Keyword arguments for :func:`open_storage` from the connection (may be empty)."""
        if not self.storage_uri.startswith(("s3://", "s3a://")) or not self.conn_id:
            return {}
        try:
            conn = self.get_connection(self.conn_id)
        except Exception:  # Airflow raises different types per version when absent
            self.log.info("connection %r not found; using the AWS environment", self.conn_id)
            return {}
        extra = conn.extra_dejson or {}
        options = {
            "aws_access_key_id": conn.login or None,
            "aws_secret_access_key": conn.password or None,
            "aws_session_token": extra.get("aws_session_token"),
            "endpoint_url": extra.get("endpoint_url") or conn.host or None,
            "region_name": extra.get("region_name"),
        }
        return {key: value for key, value in options.items() if value}

    def get_conn(self) -> CheckpointStorage:
        return self.storage

    @cached_property
    def storage(self) -> CheckpointStorage:
        return open_storage(self.storage_uri, **self.storage_options())

    def catalog(self, job: str) -> CheckpointCatalog:
        return CheckpointCatalog(self.storage, job)

    def history(self, job: str) -> JobHistory:
        return JobHistory(self.storage, job)

    def control(self, job: str) -> ControlChannel:
        return ControlChannel(self.storage, job)

    def list_jobs(self) -> list[str]:
        return CheckpointCatalog.jobs(self.storage)
