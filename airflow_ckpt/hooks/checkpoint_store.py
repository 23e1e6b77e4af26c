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
from airflow_ckpt.runtime.savepoints import DisposedSavepoint, dispose_savepoint
from airflow_ckpt.runtime.sparkconf import ENDPOINT_URL, REGION_NAME
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

    @cached_property
    def _settings(self) -> dict[str, str]:
        """Non-empty S3 settings of the connection (empty for ``file://`` or no connection)."""
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
        return {key: str(value) for key, value in options.items() if value}

    def storage_options(self) -> dict[str, Any]:
        """Keyword arguments for :func:`open_storage` from the connection (may be empty)."""
        return dict(self._settings)

    def job_env(self) -> dict[str, str]:
        """The connection's credentials as the standard ``AWS_*`` environment variables.

        This is how a Spark driver gets them: secrets never travel as Spark conf (the
        Spark UI shows conf). Empty when the connection has no credentials, in which
        case the driver uses its own AWS environment / instance profile.
        """
        names = {
            "aws_access_key_id": "AWS_ACCESS_KEY_ID",
            "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
            "aws_session_token": "AWS_SESSION_TOKEN",
        }
        return {env: self._settings[key] for key, env in names.items() if key in self._settings}

    def job_conf(self) -> dict[str, str]:
        """The connection's non-secret settings as ``spark.airflow_ckpt.*`` confs."""
        confs = {"endpoint_url": ENDPOINT_URL, "region_name": REGION_NAME}
        return {conf: self._settings[key] for key, conf in confs.items() if key in self._settings}

    def get_conn(self) -> CheckpointStorage:
        """The opened storage (Airflow's generic hook entry point)."""
        return self.storage

    @cached_property
    def storage(self) -> CheckpointStorage:
        """The storage at ``storage_uri``, opened once per hook with the connection's options."""
        return open_storage(self.storage_uri, **self.storage_options())

    def catalog(self, job: str) -> CheckpointCatalog:
        """Completed checkpoints and savepoints of ``job``."""
        return CheckpointCatalog(self.storage, job)

    def history(self, job: str) -> JobHistory:
        """The append-only event history of ``job``."""
        return JobHistory(self.storage, job)

    def control(self, job: str) -> ControlChannel:
        """Savepoint / stop requests to the running ``job``."""
        return ControlChannel(self.storage, job)

    def list_jobs(self) -> list[str]:
        """Names of the jobs stored under ``storage_uri``."""
        return CheckpointCatalog.jobs(self.storage)

    def dispose_savepoint(
        self, job: str, savepoint_id_or_path: str, *, force: bool = False
    ) -> DisposedSavepoint:
        """Delete one savepoint of ``job`` on purpose (retention never deletes savepoints).

        Accepts the savepoint id, ``sp-<id>`` or its path/URI; refuses checkpoints. See
        :func:`airflow_ckpt.runtime.savepoints.dispose_savepoint`.
        """
        return dispose_savepoint(self.storage, savepoint_id_or_path, job=job, force=force)

    def close(self) -> None:
        """Release the storage's clients if it was opened."""
        if "storage" in self.__dict__:
            self.storage.close()
            del self.__dict__["storage"]
