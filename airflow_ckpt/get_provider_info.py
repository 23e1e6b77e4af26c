"""Provider metadata for Airflow's ProvidersManager (entry point ``apache_airflow_provider``).

List only what exists; each part adds its own entry here when it lands.

No ``connection-types`` entry on purpose: the hook uses the ``aws`` connection type users
already have (the Amazon provider registers it, with its UI form). Registering ``aws`` here
too would make the two providers fight over that type's form.
"""

from __future__ import annotations

from typing import Any

from airflow_ckpt import __version__

INTEGRATION = "Checkpointed Spark Structured Streaming"

#: The ``[airflow_ckpt]`` section (read by the UI plugin). Declared here so that
#: ``airflow config list`` / ``airflow config get-value`` know the options and defaults.
CONFIG: dict[str, Any] = {
    "airflow_ckpt": {
        "description": "airflow-ckpt: where the checkpoint history pages read from.",
        "options": {
            "storage_uri": {
                "description": (
                    "Checkpoint storage root the UI plugin reads, s3://bucket/prefix or "
                    "file:///path. Empty: $AIRFLOW_CKPT_STORAGE."
                ),
                "version_added": "0.1.0",
                "type": "string",
                "example": "s3://my-bucket/checkpoints",
                "default": "",
            },
            "storage_conn_id": {
                "description": (
                    "aws-type connection for the storage (Amazon provider semantics when it "
                    "is installed). Empty: the api-server's own AWS environment."
                ),
                "version_added": "0.1.0",
                "type": "string",
                "example": "aws_default",
                "default": "aws_default",
            },
            "history_limit": {
                "description": "Newest history events read per job page or JSON request.",
                "version_added": "0.1.0",
                "type": "integer",
                "example": "1000",
                "default": "1000",
            },
            "stale_checkpoint_multiple": {
                "description": "A running job's checkpoints are shown as stale after this "
                               "many checkpoint intervals without a completed checkpoint.",
                "version_added": "0.1.0",
                "type": "float",
                "example": "3",
                "default": "3",
            },
        },
    },
}


def get_provider_info() -> dict[str, Any]:
    """The provider-info dict (schema: ``airflow/provider_info.schema.json``)."""
    return {
        "package-name": "airflow-ckpt",
        "name": "Checkpointed Spark (airflow-ckpt)",
        "description": (
            "Flink-style checkpoints, savepoints and restart strategies for PySpark "
            "Structured Streaming jobs, supervised from Airflow."
        ),
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://spark.apache.org/docs/latest/streaming/index.html",
                "tags": ["apache", "spark", "streaming"],
            }
        ],
        "hooks": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_ckpt.hooks.checkpoint_store",
                                   "airflow_ckpt.hooks.spark_submit"],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_ckpt.operators.checkpointed_spark_submit",
                    "airflow_ckpt.operators.savepoint",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_ckpt.sensors.checkpoint"],
            }
        ],
        "config": CONFIG,
        "triggers": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_ckpt.triggers.checkpoint",
                                   "airflow_ckpt.triggers.supervision"],
            }
        ],
    }
