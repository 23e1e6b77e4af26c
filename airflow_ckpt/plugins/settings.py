"""The plugin's settings (``airflow.cfg`` or ``AIRFLOW__AIRFLOW_CKPT__<OPTION>``), read per request:

* ``[airflow_ckpt] storage_uri``: ``s3://bucket/prefix`` or ``file:///path``; falls back
  to ``$AIRFLOW_CKPT_STORAGE``;
* ``[airflow_ckpt] storage_conn_id``: the ``aws``-type connection (default
  ``aws_default``; a missing connection falls back to the AWS environment);
* ``[airflow_ckpt] history_limit``: newest history events read per job (default 1000);
* ``[airflow_ckpt] stale_checkpoint_multiple``: a running job's checkpoints are "stale"
  after this many checkpoint intervals without a completion (default 3).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from airflow_ckpt.health import DEFAULT_MULTIPLE
from airflow_ckpt.hooks import DEFAULT_CONN_ID

CONFIG_SECTION = "airflow_ckpt"
STORAGE_ENV = "AIRFLOW_CKPT_STORAGE"
DEFAULT_HISTORY_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class PluginSettings:
    """Where the plugin reads checkpoints from."""

    storage_uri: str | None
    conn_id: str | None = DEFAULT_CONN_ID
    history_limit: int = DEFAULT_HISTORY_LIMIT
    stale_multiple: float = DEFAULT_MULTIPLE


def load_settings() -> PluginSettings:
    """Read ``[airflow_ckpt]`` from Airflow's configuration (``$AIRFLOW_CKPT_STORAGE`` too)."""
    from airflow.configuration import conf

    uri = conf.get(CONFIG_SECTION, "storage_uri", fallback="") or os.environ.get(STORAGE_ENV, "")
    conn_id = conf.get(CONFIG_SECTION, "storage_conn_id", fallback=DEFAULT_CONN_ID)
    limit = conf.getint(CONFIG_SECTION, "history_limit", fallback=DEFAULT_HISTORY_LIMIT)
    multiple = conf.getfloat(CONFIG_SECTION, "stale_checkpoint_multiple",
                             fallback=DEFAULT_MULTIPLE)
    return PluginSettings(uri.strip() or None, conn_id.strip() or None, max(1, limit),
                          multiple if multiple > 0 else DEFAULT_MULTIPLE)
